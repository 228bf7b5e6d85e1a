/* Part of datapath.c, one translation unit: included there after ``struct dp``. Here: the keys
 * this node may serve (Python's offers and the door's copies, ``dp_staged``; withdrawn with
 * ``dp_forget`` before a copy is dropped) and the owner's read of one, by a descriptor kept
 * from its first read while the offer stands.
 *
 * An offer is a record with its key in a hash table (``struct staged``: ~85 bytes with a short
 * key) until the records outweigh a byte at each file of the index the daemon lent (dp_index);
 * from then on a file of that index is offered by a byte at its entry, its slot (a node's share
 * of a cluster's files, every one staged, costs a byte a file of the index), and only other
 * keys and the few files whose descriptor is kept have records. When another index is lent,
 * the offers are numbered anew by its entries (renumber_offers_locked).
 *
 * A kept descriptor spares each later read the open (a walk of the tier's path), fstat and
 * close, about half a read's cost for a small file (docs/performance.md). Only the owner's thread reads and closes them: an offer withdrawn
 * or made again leaves its descriptor on ``closing``, which that thread closes at its next
 * turn, so a descriptor is never closed under a read (its number reused by another open). At
 * most an eighth of the descriptor limit is kept (DP_FDS_MAX at most), the first files read:
 * a node's own share is read every epoch in another order, and pinning, not evicting, keeps
 * the most of it (DESIGN.md, pin don't thrash).
 *
 * A kept file in RAM (tmpfs) read again is also mapped, and read by a memcpy from its pages
 * from then on: a pread looks each page up in the page cache again (perf, bench_cluster
 * --hints: a fifth of the owner's thread); a file read once (bench_peer) pays no mapping.
 * Only in RAM: a copy is never written in place, so a page of it never goes while it is
 * offered, and no disk can fail a page's read (a load that faults is SIGBUS where a pread
 * says EIO). */

#define DP_FDS_MAX 16384
#define OFFER_RECORD 64                 /* a record's bytes at the least (its key's beyond): against a byte a file */

struct staged {
    struct staged *next;
    uint32_t hash, len;
    uint8_t slot;
    uint8_t by_entry;                   /* the offer is its entry's byte: this record keeps its file only */
    int fd;                             /* kept from the first read (the owner's thread's), or -1 */
    char *map;                          /* its file mapped (a file in RAM), or NULL */
    uint64_t gen;                       /* which offer: made anew by every dp_staged of the key */
    uint64_t size;                      /* the kept descriptor's file's size (a copy is never written in place) */
    char key[];
};

static uint32_t hash_of(const char *p, size_t n)   /* FNV-1a */
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

static struct staged **find_locked(struct dp *d, const char *key, uint32_t len, uint32_t h)
{
    struct staged **p = &d->buckets[h & (d->nbuckets - 1)];
    while (*p && !((*p)->hash == h && (*p)->len == len && !memcmp((*p)->key, key, len)))
        p = &(*p)->next;
    return p;
}

static void grow_locked(struct dp *d);
static void offers_by_entry_locked(struct dp *d);

/* ``key``'s file entry (from 1) in the index the offers are numbered by, or 0: offered by key.
 * Under the lock. */
static uint32_t offer_entry_locked(const struct dp *d, const char *key, uint32_t len)
{
    if (!d->offer_slot)
        return 0;
    uint32_t n = monarch_index_find_key(d->offer_index, &d->offer_head, key, len);
    return n <= d->offer_head.files ? n : 0;
}

/* A new record of ``key`` at ``p`` (find_locked's), or NULL if there is no memory. Under the lock. */
static struct staged *link_locked(struct dp *d, struct staged **p, const char *key, uint32_t len, uint32_t h,
                                  int slot, int by_entry)
{
    struct staged *s = malloc(sizeof *s + (size_t)len);
    if (!s)
        return NULL;
    s->next = NULL;
    s->hash = h;
    s->len = len;
    s->slot = (uint8_t)slot;
    s->by_entry = (uint8_t)by_entry;
    s->fd = -1;
    s->map = NULL;
    s->gen = ++d->offers;
    s->size = 0;
    memcpy(s->key, key, (size_t)len);
    *p = s;
    if (++d->nlinked > 2 * d->nbuckets)
        grow_locked(d);
    return s;
}

static void let_go_fd_locked(struct dp *d, struct staged *s);

/* The record at ``p`` gone, its kept file handed to the owner's thread to close. Under the lock. */
static void unlink_locked(struct dp *d, struct staged **p)
{
    struct staged *s = *p;
    *p = s->next;
    let_go_fd_locked(d, s);
    free(s);
    d->nlinked--;
}

static void grow_locked(struct dp *d)
{
    uint32_t n = d->nbuckets * 2;
    struct staged **b = calloc(n, sizeof *b);
    if (!b)
        return;                         /* longer chains, still right */
    for (uint32_t i = 0; i < d->nbuckets; i++)
        for (struct staged *s = d->buckets[i], *next; s; s = next) {
            next = s->next;
            s->next = b[s->hash & (n - 1)];
            b[s->hash & (n - 1)] = s;
        }
    free(d->buckets);
    d->buckets = b;
    d->nbuckets = n;
}

static uint32_t fds_allowed(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return DP_FDS_MAX;
    return rl.rlim_cur / 8 < DP_FDS_MAX ? (uint32_t)(rl.rlim_cur / 8) : DP_FDS_MAX;
}

static void let_go_now(struct let_go g)
{
    if (g.map)
        munmap(g.map, g.mapped);
    close(g.fd);
}

/* ``s``'s kept descriptor and mapping (if any) handed to the owner's thread to close. Under the lock. */
static void let_go_fd_locked(struct dp *d, struct staged *s)
{
    if (s->fd < 0)
        return;
    struct let_go g = {s->fd, s->map, s->size};
    s->fd = -1;
    s->map = NULL;
    d->kept_fds--;
    if (d->reads_over) {
        let_go_now(g);
        return;
    }
    if (d->nclosing == d->closing_cap) {
        uint32_t cap = d->closing_cap ? 2 * d->closing_cap : 64;
        struct let_go *more = realloc(d->closing, cap * sizeof *more);
        if (!more)                      /* no memory: the file stays open (its number never reused under a read) */
            return;
        d->closing = more;
        d->closing_cap = cap;
    }
    d->closing[d->nclosing++] = g;
}

/* The descriptors of withdrawn offers closed (the owner's thread, between requests). */
static void close_let_go(struct dp *d)
{
    struct let_go some[64];
    uint32_t n;
    do {
        pthread_mutex_lock(&d->mu);
        n = d->nclosing < 64 ? d->nclosing : 64;
        d->nclosing -= n;
        memcpy(some, d->closing + d->nclosing, n * sizeof *some);
        pthread_mutex_unlock(&d->mu);
        for (uint32_t i = 0; i < n; i++)
            let_go_now(some[i]);
    } while (n == 64);
}

/* Every kept descriptor closed; from now on they are closed as offers go (dp_stop, once its
 * thread has ended). Under the lock. */
static void close_kept_locked(struct dp *d)
{
    d->reads_over = 1;
    for (uint32_t i = 0; i < d->nbuckets; i++)
        for (struct staged *s = d->buckets[i]; s; s = s->next)
            let_go_fd_locked(d, s);
}

static int read_all_from(int fd, char *dst, uint64_t n, uint64_t offset)
{
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, dst + got, n - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (uint64_t)r;
    }
    return 0;
}

/* ``key``'s ``size`` bytes read into ``dst`` if it is offered here, raw, of that size: 0, else
 * -1 (the requester asks Python's protocol). The owner's thread only. */
static int read_staged(struct dp *d, const char *key, uint32_t len, uint64_t size, char *dst)
{
    char path[PATH_MAX];
    uint32_t h = hash_of(key, len);
    pthread_mutex_lock(&d->mu);
    struct staged *s = *find_locked(d, key, len, h);
    uint32_t e = s ? 0 : offer_entry_locked(d, key, len);   /* offered by its entry's byte, no record yet */
    int slot = s ? s->slot : e ? d->offer_slot[e - 1] - 1 : -1;
    int kept = s ? s->fd : -1, n = -1;
    const char *kept_map = s ? s->map : NULL;
    int to_map = s && kept >= 0 && !kept_map && d->in_ram[s->slot] && s->size == size && size > 0;
    uint64_t gen = s ? s->gen : e ? d->offer_gens[e % OFFER_GENS] : 0, kept_size = s ? s->size : 0;
    const char *dir = kept < 0 && slot >= 0 ? d->tiers[slot] : NULL;
    if (dir)
        n = snprintf(path, sizeof path, "%s/%.*s", dir, (int)len, key);
    pthread_mutex_unlock(&d->mu);
    if (to_map) {                       /* read again: mapped from now on, if the same offer stands */
        char *map = mmap(NULL, size, PROT_READ, MAP_SHARED, kept, 0);
        if (map != MAP_FAILED) {
            pthread_mutex_lock(&d->mu);
            s = *find_locked(d, key, len, h);
            int same = s && s->gen == gen && s->fd == kept && !s->map;
            if (same) {
                s->map = map;
                kept_map = map;
            }
            pthread_mutex_unlock(&d->mu);
            if (!same)
                munmap(map, size);
        }
    }
    if (kept >= 0 && kept_map && kept_size == size) {  /* unmapped only by this thread, as the descriptor */
        memcpy(dst, kept_map, size);
        return 0;
    }
    if (kept >= 0)                      /* closed only by this thread: good until it returns */
        return kept_size == size ? read_all_from(kept, dst, size, 0) : -1;
    if (n < 0 || n >= (int)sizeof path)
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && (uint64_t)st.st_size == size && read_all_from(fd, dst, size, 0) == 0;
    pthread_mutex_lock(&d->mu);         /* kept if the same offer stands (not withdrawn or made anew meanwhile) */
    struct staged **p = find_locked(d, key, len, h);
    int room = ok && d->kept_fds < d->fds_allowed, keep;
    if (!e)
        keep = room && (s = *p) && s->gen == gen && s->fd < 0;
    else                                /* the entry's byte unchanged (an index lent anew changes every gen) */
        keep = room && !*p && d->offer_slot && d->offer_slot[e - 1] == slot + 1 &&
               d->offer_gens[e % OFFER_GENS] == gen && (s = link_locked(d, p, key, len, h, slot, 1));
    if (keep) {
        s->fd = fd;
        s->size = (uint64_t)st.st_size;
        d->kept_fds++;
    }
    pthread_mutex_unlock(&d->mu);
    if (!keep)
        close(fd);
    return ok ? 0 : -1;
}

EXPORT void dp_staged(struct dp *d, const char *key, int len, int slot)
{
    if (len <= 0 || len > DP_KEY_MAX || slot < 0 || slot >= MONARCH_MAX_SLOTS)
        return;
    uint32_t h = hash_of(key, (size_t)len);
    pthread_mutex_lock(&d->mu);
    struct staged **p = find_locked(d, key, (uint32_t)len, h);
    uint32_t e = offer_entry_locked(d, key, (uint32_t)len);
    if (e) {                            /* its entry's byte; a record of the offer before goes (read afresh) */
        if (*p) {
            d->nstaged -= !(*p)->by_entry;
            unlink_locked(d, p);
        }
        d->nstaged += !d->offer_slot[e - 1];
        d->offer_slot[e - 1] = (uint8_t)(slot + 1);
        d->offer_gens[e % OFFER_GENS]++;
    } else if (*p) {                    /* offered anew (another copy, another tier): read afresh */
        let_go_fd_locked(d, *p);
        (*p)->slot = (uint8_t)slot;
        (*p)->gen = ++d->offers;
    } else if (link_locked(d, p, key, (uint32_t)len, h, slot, 0)) {
        d->nstaged++;
        offers_by_entry_locked(d);
    }
    pthread_mutex_unlock(&d->mu);
}

EXPORT void dp_forget(struct dp *d, const char *key, int len)
{
    if (len <= 0 || len > DP_KEY_MAX)
        return;
    pthread_mutex_lock(&d->mu);
    struct staged **p = find_locked(d, key, (uint32_t)len, hash_of(key, (size_t)len));
    if (*p) {
        d->nstaged -= !(*p)->by_entry;
        unlink_locked(d, p);
    }
    uint32_t e = offer_entry_locked(d, key, (uint32_t)len);
    if (e && d->offer_slot[e - 1]) {
        d->offer_slot[e - 1] = 0;
        d->offer_gens[e % OFFER_GENS]++;
        d->nstaged--;
    }
    pthread_mutex_unlock(&d->mu);
}

/* The offers by entry from now on, once their records outweigh a byte a file of the index lent:
 * every record of a file of it without a kept descriptor becomes its entry's byte. Under the lock. */
static void offers_by_entry_locked(struct dp *d)
{
    if (d->offer_slot || !d->offer_index || (uint64_t)d->nlinked * OFFER_RECORD < d->offer_head.files ||
        !(d->offer_slot = calloc(d->offer_head.files, 1)))
        return;
    for (uint32_t i = 0; i < d->nbuckets; i++)
        for (struct staged **p = &d->buckets[i]; *p;) {
            struct staged *s = *p;
            uint32_t e = offer_entry_locked(d, s->key, s->len);
            if (!e) {
                p = &s->next;
                continue;
            }
            d->offer_slot[e - 1] = (uint8_t)(s->slot + 1);
            if (s->fd >= 0) {           /* kept: the record stays for its file */
                s->by_entry = 1;
                p = &s->next;
            } else {
                unlink_locked(d, p);
            }
        }
}

/* The offers numbered by the entries of index ``x`` (``len`` bytes, lent by dp_index; NULL:
 * none): those of the index before become records by key, then by entry again where that pays
 * (offers_by_entry_locked). Every gen changes: a descriptor opened under the index before is not
 * kept. Under the lock. */
static void renumber_offers_locked(struct dp *d, const unsigned char *x, size_t len)
{
    char key[DP_KEY_MAX];
    for (uint32_t e = 1; d->offer_slot && e <= d->offer_head.files; e++) {
        int slot = d->offer_slot[e - 1] - 1;
        uint32_t kl = slot < 0 ? 0 : monarch_index_key(d->offer_index, &d->offer_head, e, key, sizeof key);
        uint32_t h = kl ? hash_of(key, kl) : 0;
        struct staged **p = kl ? find_locked(d, key, kl, h) : NULL;
        if (p && *p)                    /* its kept file's record: the offer's own from now on */
            (*p)->by_entry = 0;
        else if (slot >= 0 && !(p && link_locked(d, p, key, kl, h, slot, 0)))
            d->nstaged--;               /* no key, no memory: not offered (a peer asks Python's protocol) */
    }
    free(d->offer_slot);
    d->offer_slot = NULL;
    d->offer_index = NULL;
    for (uint32_t i = 0; i < OFFER_GENS; i++)
        d->offer_gens[i]++;
    struct monarch_index_header hd;
    if (!x || len < sizeof hd)
        return;
    memcpy(&hd, x, sizeof hd);
    if (!hd.files || !hd.buckets || !monarch_index_bounded(&hd, len, hd.files))
        return;                         /* every offer by key */
    d->offer_index = x;
    d->offer_head = hd;
    offers_by_entry_locked(d);
}

/* ---- large files staged by blocks: spans of their STAGED blocks ---- */

/* The block offer of ``key``'s link in the list (NULL at its end). Under the lock. */
static struct block_offer **find_blocks_locked(struct dp *d, const char *key, uint32_t len)
{
    struct block_offer **p = &d->block_offers;
    while (*p && !((*p)->len == len && !memcmp((*p)->key, key, len)))
        p = &(*p)->next;
    return p;
}

EXPORT void dp_blocks(struct dp *d, const char *key, int len, int slot)
{
    if (len <= 0 || len > DP_KEY_MAX || slot < -1 || slot >= MONARCH_MAX_SLOTS)
        return;
    pthread_mutex_lock(&d->mu);
    struct block_offer **p = find_blocks_locked(d, key, (uint32_t)len);
    if (slot < 0 && *p) {
        struct block_offer *b = *p;
        *p = b->next;
        free(b);
    } else if (slot >= 0 && *p) {
        (*p)->slot = (uint8_t)slot;
    } else if (slot >= 0 && (*p = malloc(sizeof **p + (size_t)len))) {
        (*p)->next = NULL;
        (*p)->len = (uint32_t)len;
        (*p)->slot = (uint8_t)slot;
        memcpy((*p)->key, key, (size_t)len);
    }
    pthread_mutex_unlock(&d->mu);
}

/* Are the blocks of [offset, offset + length) all STAGED in the map ``fd``, the map of this
 * version of the file (``size``, ``mtime_ns``)? The daemon changes the states under us: a block
 * is STAGED only once its bytes are all in the copy, and stays so while the copy stands. */
static int blocks_staged(int fd, uint64_t size, int64_t mtime_ns, uint64_t offset, uint64_t length)
{
    struct monarch_blockmap_header h;
    unsigned char states[(DP_RANGE_MAX >> 12) + 1];  /* a span's blocks, of 4 KiB at the least */
    if (read_all_from(fd, (char *)&h, sizeof h, 0) != 0 || h.magic != MONARCH_BLOCKMAP_MAGIC ||
        h.version != MONARCH_BLOCKMAP_VERSION || h.size != size || h.mtime_ns != mtime_ns ||
        h.block_shift < 12 || h.block_shift > 30 || h.blocks != (size + (1ULL << h.block_shift) - 1) >> h.block_shift)
        return 0;
    uint64_t first = offset >> h.block_shift, n = ((offset + length - 1) >> h.block_shift) - first + 1;
    if (n > sizeof states || read_all_from(fd, (char *)states, n, MONARCH_BLOCKMAP_HEADER_SIZE + first) != 0)
        return 0;
    for (uint64_t i = 0; i < n; i++)
        if (states[i] != MONARCH_BLOCK_STAGED)
            return 0;
    return 1;
}

/* A span of large file ``key`` (``size`` bytes, of ``span->mtime_ns``) read into ``dst``: from
 * its whole copy when it is offered so (dp_staged), else from its block copy (dp_blocks) when
 * every block of the span is STAGED there. 0, else -1 (handed back). The owner's thread only. */
static int read_range(struct dp *d, const char *key, uint32_t len, uint64_t size, const struct request_span *span,
                      char *dst)
{
    char path[PATH_MAX], map_path[PATH_MAX];
    int n = -1, m = -1, whole = 0;
    pthread_mutex_lock(&d->mu);
    struct staged *s = *find_locked(d, key, len, hash_of(key, len));
    uint32_t e = s ? 0 : offer_entry_locked(d, key, len);
    int slot = s ? s->slot : e ? d->offer_slot[e - 1] - 1 : -1;
    struct block_offer *b = slot >= 0 ? NULL : *find_blocks_locked(d, key, len);
    const char *dir = slot >= 0 ? d->tiers[slot] : b ? d->tiers[b->slot] : NULL;
    if (dir && slot >= 0) {
        whole = 1;
        n = snprintf(path, sizeof path, "%s/%.*s", dir, (int)len, key);
    } else if (dir) {
        n = snprintf(path, sizeof path, "%s/%s/%.*s", dir, MONARCH_BLOCKS_DIR, (int)len, key);
        m = snprintf(map_path, sizeof map_path, "%s/%s/%.*s", dir, MONARCH_BLOCKMAP_DIR, (int)len, key);
    }
    pthread_mutex_unlock(&d->mu);
    if (n < 0 || n >= (int)sizeof path || (!whole && (m < 0 || m >= (int)sizeof map_path)))
        return -1;
    if (!whole) {                       /* (a whole copy is offered for this snapshot's version) */
        int mfd = open(map_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (mfd < 0)
            return -1;
        int ok = blocks_staged(mfd, size, span->mtime_ns, span->offset, span->length);
        close(mfd);
        if (!ok)
            return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && (uint64_t)st.st_size == size &&
             read_all_from(fd, dst, span->length, span->offset) == 0;
    close(fd);
    return ok ? 0 : -1;
}
