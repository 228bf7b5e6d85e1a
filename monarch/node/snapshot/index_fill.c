/* Part of walker.c, one translation unit. Here: an index's files filled in place, whoever made
 * the index (this walk, a kept one, another node's): each file's route published in its flags
 * (walk_routes), and the files a listing-mode walk left undescribed described (walk_describe),
 * while the shim and the front door read the same pages. Its exports are declared in walker.py
 * (the library's contract with Python); it gives walker.c nothing. */

/* -- each file's route, published in its entry's flags ------------------------------------- */
/* The header of index ``x`` (``size`` bytes) if it is one of this version whose first ``nfiles``
 * entries lie inside it; else -1. */
static int index_header_of(const unsigned char *x, uint64_t size, uint64_t nfiles, struct monarch_index_header *h)
{
    if (size < sizeof *h)
        return -1;
    memcpy(h, x, sizeof *h);
    if (h->magic != MONARCH_INDEX_MAGIC || h->version != MONARCH_INDEX_VERSION || nfiles > h->entries ||
        h->entries_off > size || (size - h->entries_off) / MONARCH_INDEX_ENTRY_SIZE < h->entries ||
        h->keys_off > size || h->keys_size > size - h->keys_off)
        return -1;
    return 0;
}

/* Publish in each of the first ``nfiles`` entries of the index ``x`` (``size`` bytes: this walk's,
 * a kept one, another node's) its file's route: for root k, ``nsteps[k]`` steps at ``k *
 * ROUTE_STEPS`` of ``smallest`` and ``route`` (monarch/routes.py's size_steps: the route of a
 * regular file of at least that size, up to the next step), in MONARCH_INDEX_ROUTE_MASK; a root
 * without steps publishes none, nor does a file not described yet (its describer does). The same
 * bits as index_writer.py's route_flags. 0, or -1 if ``x`` is no index of this version. */
EXPORT int walk_routes(unsigned char *x, uint64_t size, uint64_t nfiles, const uint64_t *smallest,
                       const uint8_t *route, const int *nsteps, int nroots)
{
    struct monarch_index_header h;
    struct monarch_route_steps t = {smallest, route, nsteps, nroots};
    if (index_header_of(x, size, nfiles, &h) != 0)
        return -1;
    for (uint64_t n = 0; n < nfiles; n++) {
        unsigned char *at = x + h.entries_off + n * MONARCH_INDEX_ENTRY_SIZE;
        struct monarch_index_entry e;
        memcpy(&e, at, sizeof e);
        if (e.key_off > h.keys_size || e.key_len > h.keys_size - e.key_off)
            return -1;
        uint32_t bits = e.flags & MONARCH_INDEX_FLAG_UNDESCRIBED ? 0 :
                        monarch_route_bits(&t, (const char *)x + h.keys_off + e.key_off, e.key_len, e.size, e.mode);
        e.flags = (e.flags & ~(uint32_t)MONARCH_INDEX_ROUTE_MASK) | bits;
        memcpy(at + offsetof(struct monarch_index_entry, flags), &e.flags, sizeof e.flags);
    }
    return 0;
}

/* -- the files a listing-mode walk left undescribed, described in place --------------------- */
#define DESCRIBE_CHUNK 1024  /* entries a thread takes at once */

struct describe_pass {
    unsigned char *x;
    struct monarch_index_header h;
    uint64_t nfiles;
    const int *root_fds;
    int nroots;
    struct monarch_route_steps routes;
    uint64_t next;       /* the next chunk's first entry (atomic) */
    uint64_t described;  /* (atomic) */
};

/* Entry ``at``'s stat (a listed file's) taken now and written in place (monarch_index_describe). 1
 * if described; 0 if it is gone, or is no longer a regular file, or is described already. */
static int describe_entry(struct describe_pass *p, unsigned char *at)
{
    if (!monarch_index_undescribed(at))
        return 0;
    struct monarch_index_entry e;
    memcpy(&e, at, sizeof e);
    if (e.key_off > p->h.keys_size || e.key_len > p->h.keys_size - e.key_off || e.key_len >= PATH_MAX)
        return 0;
    const char *key = (const char *)p->x + p->h.keys_off + e.key_off;
    const char *slash = memchr(key, '/', e.key_len);
    long k = 0;
    for (const char *c = key; slash && c < slash; c++)
        k = *c >= '0' && *c <= '9' && k < p->nroots ? 10 * k + (*c - '0') : p->nroots;
    if (!slash || slash == key || k >= p->nroots || slash + 1 == key + e.key_len)
        return 0;
    char rel[PATH_MAX];
    size_t rlen = (size_t)(key + e.key_len - (slash + 1));
    memcpy(rel, slash + 1, rlen);
    rel[rlen] = 0;
    struct stat st;
    if (fstatat(p->root_fds[k], rel, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
        return 0;
    monarch_index_describe(at, key, e.key_len, &st, &p->routes);
    return 1;
}

static void *describer(void *arg)
{
    struct describe_pass *p = arg;
    for (;;) {
        uint64_t lo = __atomic_fetch_add(&p->next, DESCRIBE_CHUNK, __ATOMIC_RELAXED);
        if (lo >= p->nfiles)
            return NULL;
        uint64_t hi = lo + DESCRIBE_CHUNK < p->nfiles ? lo + DESCRIBE_CHUNK : p->nfiles, got = 0;
        for (uint64_t n = lo; n < hi; n++)
            got += (uint64_t)describe_entry(p, p->x + p->h.entries_off + n * MONARCH_INDEX_ENTRY_SIZE);
        __atomic_fetch_add(&p->described, got, __ATOMIC_RELAXED);
    }
}

/* Describe every one of the first ``nfiles`` entries of the index ``x`` (``size`` bytes, mapped
 * shared: the shim and the door read it meanwhile) still UNDESCRIBED, ``threads`` at once, each by
 * a fstatat relative to its root's descriptor (``root_fds[k]`` for key "<k>/..."), its route from
 * the tables walk_routes takes. A file gone, or no longer a regular file, stays undescribed (the
 * daemon's own look when it is opened says so). The number described, or -1 if ``x`` is no index
 * of this version. */
EXPORT int64_t walk_describe(unsigned char *x, uint64_t size, uint64_t nfiles, const int *root_fds, int nroots,
                             const uint64_t *smallest, const uint8_t *route, const int *nsteps, int threads)
{
    struct describe_pass p = {.x = x, .nfiles = nfiles, .root_fds = root_fds, .nroots = nroots,
                              .routes = {smallest, route, nsteps, nroots}};
    if (index_header_of(x, size, nfiles, &p.h) != 0)
        return -1;
    if (threads < 1)
        threads = 1;
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    int started = 0;
    for (int i = 1; ids && i < threads; i++)
        if (pthread_create(&ids[i], NULL, describer, &p) == 0)
            started = i;
        else
            break;
    describer(&p);
    for (int i = 1; ids && i <= started; i++)
        pthread_join(ids[i], NULL);
    free(ids);
    return (int64_t)p.described;
}
