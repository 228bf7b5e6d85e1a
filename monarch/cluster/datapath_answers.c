/* Part of datapath.c, one translation unit: included there after datapath_offers.c. Here: the
 * owner's answers. Its thread takes the requests that came (all of them first, then a fault's
 * pages before any span, whose megabytes would keep a thread stopped on a page waiting), checks
 * each against its length (a peer's bytes are not trusted), and answers from the offers
 * (datapath_offers.c): a batch of whole files, or a span of a large file's staged blocks; or
 * files' stats from the index its node publishes, lent by the daemon (adopt_index, read_described), a file a peer opens
 * that is not described yet wanted first by this node's door (want, dp_take_wanted). */

/* A request's items and keys, checked against its length (a peer's bytes are not trusted):
 * the items, or NULL. */
static const struct request_item *parse_request(const char *msg, int count, struct request_header *rh,
                                                struct request_span *span, uint64_t *total)
{
    if (count < (int)sizeof *rh)
        return NULL;
    memcpy(rh, msg, sizeof *rh);
    int ranged = (rh->flags & REQ_RANGE) != 0;
    size_t head = sizeof *rh + rh->n * sizeof(struct request_item) + (ranged ? sizeof *span : 0);
    if (rh->n == 0 || rh->n > DP_BATCH_FILES_MAX || (ranged && rh->n != 1) || (size_t)count < head)
        return NULL;
    const struct request_item *items = (const struct request_item *)(msg + sizeof *rh);
    uint64_t keys = 0, bytes = 0;
    for (uint32_t i = 0; i < rh->n; i++) {
        if (items[i].len == 0 || items[i].len > DP_KEY_MAX || (!ranged && items[i].size > DP_BATCH_BYTES_MAX))
            return NULL;
        keys += items[i].len;
        bytes += items[i].size;
    }
    if (ranged) {                       /* a span within the file, of one message at most */
        memcpy(span, items + 1, sizeof *span);
        if (span->length == 0 || span->length > DP_RANGE_MAX || span->offset > items[0].size ||
            span->length > items[0].size - span->offset)
            return NULL;
        bytes = span->length;
    }
    if (head + keys != (uint64_t)count || (!ranged && bytes > DP_BATCH_BYTES_MAX))
        return NULL;
    *total = bytes;
    return items;
}

/* The reply ``buf`` (``len`` bytes) sent to ``src`` with ``tag``, freed once MPI is done with
 * it: 0, or -1 (the send failed, ``buf`` freed). */
static int send_reply(struct dp *d, int src, uint32_t tag, char *buf, size_t len)
{
    struct sending *s = malloc(sizeof *s);
    if (!s || MPI_Isend(buf, (int)len, MPI_BYTE, src, (int)tag, d->comm, &s->req) != MPI_SUCCESS) {
        __atomic_add_fetch(&d->mpi_errors, 1, __ATOMIC_RELAXED);
        free(s);
        free(buf);
        return -1;
    }
    s->buf = buf;
    s->next = d->sends;
    d->sends = s;
    return 0;
}

/* Answer a span's request: its bytes, if every block of it is staged here (read_range), else
 * handed back (the requester asks Python's protocol, whose owner reads them from the PFS first). */
static void answer_range(struct dp *d, int src, const struct request_header *rh, const struct request_item *item,
                         const struct request_span *span, const char *key)
{
    size_t head = sizeof(struct reply_header) + sizeof(struct reply_item);
    char *buf = malloc(head + span->length);
    if (!buf)
        return;                         /* the requester's deadline answers */
    int ok = read_range(d, key, item->len, item->size, span, buf + head) == 0;
    struct reply_header h = {.n = 1};
    struct reply_item r = {.status = ok ? ST_OK : ST_HANDED_BACK, .size = ok ? span->length : 0};
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, &r, sizeof r);
    if (send_reply(d, src, rh->tag, buf, head + r.size) != 0)
        return;
    pthread_mutex_lock(&d->mu);
    d->served_requests++;
    d->served_ranges += ok;
    d->served_range_bytes += r.size;
    d->handed_back += !ok;
    pthread_mutex_unlock(&d->mu);
}

/* The index dp_index lent, read from now on (the last one is the caller's, kept until dp_stop). */
static void adopt_index(struct dp *d)
{
    pthread_mutex_lock(&d->mu);
    int lent = d->index_lent;
    const unsigned char *p = d->index_next;
    size_t len = d->index_next_len;
    d->index_lent = 0;
    pthread_mutex_unlock(&d->mu);
    if (!lent)
        return;
    monarch_crc_init();                 /* (the index's buckets are keyed by the keys' CRC) */
    struct monarch_index_header h;
    if (p && len >= sizeof h)
        memcpy(&h, p, sizeof h);
    d->index = p && len >= sizeof h && monarch_index_bounded(&h, len, h.files) ? p : NULL;
    d->index_len = d->index ? len : 0;
}

/* ``key``'s entry as this node's index describes it, into ``dst`` (its 112 bytes): 0, or -1 (no index,
 * no such file, not described here yet: then *listed its entry, from 1, if the index lists it). */
static int read_described(struct dp *d, const char *key, uint32_t len, char *dst, uint32_t *listed)
{
    *listed = 0;
    if (!d->index)
        return -1;
    struct monarch_index_header h;
    memcpy(&h, d->index, sizeof h);
    struct monarch_index_entry e;
    uint32_t n = monarch_index_find_key(d->index, &h, key, len);
    if (!n || n > h.files)
        return -1;
    if (!monarch_index_read(d->index, &h, n, &e)) {
        *listed = n;
        return -1;
    }
    memcpy(dst, &e, sizeof e);
    return 0;
}

/* Listed entry ``n``, opened on a peer now, wanted first by this node's door's lane (which
 * describes it as it copies it): 1 if that lane takes such entries (dp_take_wanted), else 0. */
static int want(struct dp *d, uint32_t n)
{
    pthread_mutex_lock(&d->mu);
    int known = 0;                      /* wanted already, or taken by the lane (its copy under way) */
    for (int i = 0; !known && i < d->nwanted; i++)
        known = d->wanted[i] == n;
    for (int i = 0; !known && i < d->ntaken; i++)
        known = d->taken[i] == n;
    int coming = d->wanted_on && (known || d->nwanted < WANTED_MAX);
    if (coming && !known)
        d->wanted[d->nwanted++] = n;
    pthread_mutex_unlock(&d->mu);
    return coming;
}

/* Answer one request; PACE_WAITED if an application's open waits on it (REQ_WAITED), PACE_PAGES if a
 * fault does (REQ_PAGES). */
static int answer(struct dp *d, int src, const char *msg, int count)
{
    struct request_header rh;
    struct request_span span;
    uint64_t total = 0;
    const struct request_item *items = parse_request(msg, count, &rh, &span, &total);
    if (!items)
        return 0;                       /* not ours to answer: the requester's deadline does */
    int waited = ((rh.flags & REQ_WAITED) ? PACE_WAITED : 0) | ((rh.flags & REQ_PAGES) ? PACE_PAGES : 0);
    if (rh.flags & REQ_RANGE)
        return answer_range(d, src, &rh, items, &span, (const char *)(items + 1) + sizeof span), waited;
    size_t head = sizeof(struct reply_header) + rh.n * sizeof(struct reply_item);
    char *buf = malloc(head + total);
    if (!buf)
        return waited;
    struct reply_header h = {.n = rh.n};
    memcpy(buf, &h, sizeof h);
    struct reply_item *out = (struct reply_item *)(buf + sizeof h);
    const char *key = (const char *)(items + rh.n);
    uint64_t at = 0, ok = 0, bytes = 0;
    for (uint32_t i = 0; i < rh.n; key += items[i].len, i++) {
        uint32_t listed = 0;
        int staged = rh.flags & REQ_DESCRIBE
                     ? items[i].size == sizeof(struct monarch_index_entry) && read_described(d, key, items[i].len, buf + head + at, &listed) == 0
                     : read_staged(d, key, items[i].len, items[i].size, buf + head + at) == 0;
        int coming = !staged && listed && i == 0 && (rh.flags & REQ_WANTED) && want(d, listed);
        struct reply_item r = {.status = staged ? ST_OK : coming ? ST_COMING : ST_HANDED_BACK, .size = staged ? items[i].size : 0};
        memcpy(&out[i], &r, sizeof r);
        at += r.size;
        ok += staged;
        bytes += r.size;
    }
    if (send_reply(d, src, rh.tag, buf, head + at) != 0)
        return waited;
    if (rh.flags & REQ_DESCRIBE)        /* stats, not files: counted as requests only */
        ok = bytes = 0;
    pthread_mutex_lock(&d->mu);
    d->served_requests++;
    d->served_files += ok;
    d->served_bytes += bytes;
    d->handed_back += rh.n - ok;
    pthread_mutex_unlock(&d->mu);
    return waited;
}

/* Answer the requests that came: how many; *waited the PACE_* of those an open or a fault waits on. */
static int take_requests(struct dp *d, int *waited)
{
    /* all that came first, then a fault's pages before the rest: a span's megabytes (a block
     * stager's run) would keep a thread stopped on a page waiting behind them */
    struct { char *msg; int count, src; } got[64];
    int n = 0;
    for (; n < 64; n++) {
        int flag = 0;
        MPI_Message m;
        MPI_Status st;
        if (MPI_Improbe(MPI_ANY_SOURCE, TAG_REQUEST, d->comm, &flag, &m, &st) != MPI_SUCCESS) {
            __atomic_add_fetch(&d->mpi_errors, 1, __ATOMIC_RELAXED);
            break;                      /* ULFM: a peer died; Python finds out who and acknowledges it here too */
        }
        if (!flag)
            break;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        char *msg = malloc(count > 0 ? (size_t)count : 1);
        got[n].msg = NULL;
        if (!msg || MPI_Mrecv(msg, count, MPI_BYTE, &m, &st) != MPI_SUCCESS) {
            __atomic_add_fetch(&d->mpi_errors, 1, __ATOMIC_RELAXED);
            free(msg);
            continue;
        }
        got[n].msg = msg;
        got[n].count = count;
        got[n].src = st.MPI_SOURCE;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            struct request_header rh;
            if (!got[i].msg)
                continue;
            int pages = got[i].count >= (int)sizeof rh && (memcpy(&rh, got[i].msg, sizeof rh), rh.flags & REQ_PAGES);
            if (pass == 0 && !pages)
                continue;
            *waited |= answer(d, got[i].src, got[i].msg, got[i].count);
            free(got[i].msg);
            got[i].msg = NULL;
        }
    return n;
}
