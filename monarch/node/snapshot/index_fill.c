/* Part of walker.c, one translation unit. Here: an index's files filled in place, whoever made
 * the index (this walk, a kept one, another node's): each described file's route published in
 * its stat's flags (walk_routes), the files a listing-mode walk left undescribed described
 * (walk_describe), and one file described from Python's stat (index_put_stat), while the shim and
 * the front door read the same pages. Its exports are declared in walker.py (the library's
 * contract with Python); it gives walker.c nothing. */

/* The header of index ``x`` (``size`` bytes) if it is one of this version with ``nfiles`` files
 * at least whose tables lie inside it, and its stats slots: all of them (``all_stats``: the whole
 * file, to describe into), else the used ones (a copy may stop there); else -1. */
static int index_header_of(const unsigned char *x, uint64_t size, uint64_t nfiles, struct monarch_index_header *h,
                           int all_stats)
{
    if (size < sizeof *h)
        return -1;
    memcpy(h, x, sizeof *h);
    return nfiles <= h->files && monarch_index_bounded(h, size, all_stats ? h->files : h->stats_used) ? 0 : -1;
}

/* -- each file's route, published in its stat's flags -------------------------------------- */
/* Publish in the stat of each of the first ``nfiles`` files of the index ``x`` (``size`` bytes:
 * this walk's, a kept one, another node's; a copy may stop at its used stats) its route: for root
 * k, ``nsteps[k]`` steps at ``k * ROUTE_STEPS`` of ``smallest`` and ``route`` (monarch/routes.py's
 * size_steps: the route of a regular file of at least that size, up to the next step), in
 * MONARCH_INDEX_ROUTE_MASK; a root without steps publishes none, nor does a file not described
 * yet (its describer does). The same bits as index_writer.py's route_flags. 0, or -1 if ``x`` is
 * no index of this version. */
EXPORT int walk_routes(unsigned char *x, uint64_t size, uint64_t nfiles, const uint64_t *smallest,
                       const uint8_t *route, const int *nsteps, int nroots)
{
    struct monarch_index_header h;
    struct monarch_route_steps t = {smallest, route, nsteps, nroots};
    if (index_header_of(x, size, nfiles, &h, 0) != 0)
        return -1;
    uint64_t room = (size - h.stats_off) / MONARCH_INDEX_ENTRY_SIZE;
    for (uint64_t n = 1; n <= nfiles; n++) {
        const unsigned char *rec = x + h.files_off + (uint64_t)MONARCH_INDEX_FILE_SIZE * (n - 1);
        uint32_t s = __atomic_load_n((const uint32_t *)(rec + offsetof(struct monarch_index_file, stat)), __ATOMIC_ACQUIRE);
        struct monarch_index_entry e;
        if (s && s != MONARCH_INDEX_DESCRIBING && (s <= h.files ? s - 1 >= room : size < h.stats_off))
            return -1;  /* a slot past the copy's end; a short stat in a copy without its shorts */
        if (!monarch_index_read(x, &h, (uint32_t)n, &e))
            continue;
        uint32_t dl;
        const char *dk = monarch_index_dir_key(x, &h, (uint32_t)n, &dl);  /* its root's number starts it */
        if (!dk)
            return -1;
        uint32_t bits = monarch_route_bits(&t, dk, dl, e.size, e.mode);
        if (s > h.files) {  /* the route's 4 bits in its short stat's first word */
            uint64_t *w = (uint64_t *)(x + monarch_index_shorts_off(&h)) + (s - h.files - 1);
            uint64_t was = __atomic_load_n(w, __ATOMIC_RELAXED);
            uint64_t now = (was & ~(0xFull << MONARCH_INDEX_SHORT_ROUTE_AT))
                           | (uint64_t)(bits >> MONARCH_INDEX_ROUTE_SHIFT) << MONARCH_INDEX_SHORT_ROUTE_AT;
            __atomic_store_n(w, now, __ATOMIC_RELAXED);
            continue;
        }
        e.flags = (e.flags & ~(uint32_t)MONARCH_INDEX_ROUTE_MASK) | bits;
        memcpy(x + h.stats_off + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * (s - 1) + offsetof(struct monarch_index_entry, flags),
               &e.flags, sizeof e.flags);
    }
    return 0;
}

/* -- the files a listing-mode walk left undescribed, described in place --------------------- */
#define DESCRIBE_CHUNK 1024  /* files a thread takes at once */

struct describe_pass {
    unsigned char *x;
    struct monarch_index_header h;
    uint64_t nfiles;
    const int *root_fds;
    int nroots;
    struct monarch_route_steps routes;
    uint64_t next;       /* the next chunk's first file, from 0 (atomic) */
    uint64_t described;  /* (atomic) */
};

/* File n's stat (a listed file's) taken now and written in its slot (monarch_index_put_stat). 1 if
 * described; 0 if it is gone, or is no longer a regular file, or is described already. */
static int describe_file(struct describe_pass *p, uint32_t n)
{
    const unsigned char *at = p->x + p->h.files_off + (uint64_t)MONARCH_INDEX_FILE_SIZE * (n - 1);
    if (__atomic_load_n((const uint32_t *)(at + offsetof(struct monarch_index_file, stat)), __ATOMIC_RELAXED))
        return 0;
    char key[MONARCH_INDEX_KEY_MAX];
    uint32_t kl = monarch_index_key(p->x, &p->h, n, key, sizeof key - 1);
    const char *slash = kl ? memchr(key, '/', kl) : NULL;
    long k = 0;
    for (const char *c = key; slash && c < slash; c++)
        k = *c >= '0' && *c <= '9' && k < p->nroots ? 10 * k + (*c - '0') : p->nroots;
    if (!slash || slash == key || k >= p->nroots || slash + 1 == key + kl || key + kl - (slash + 1) >= PATH_MAX)
        return 0;
    key[kl] = 0;  /* the path below the root */
    struct stat st;
    if (fstatat(p->root_fds[k], slash + 1, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
        return 0;
    return monarch_index_put_stat(p->x, &p->h, n, &st, &p->routes) == 1;
}

static void *describer(void *arg)
{
    struct describe_pass *p = arg;
    for (;;) {
        uint64_t lo = __atomic_fetch_add(&p->next, DESCRIBE_CHUNK, __ATOMIC_RELAXED);
        if (lo >= p->nfiles)
            return NULL;
        uint64_t hi = lo + DESCRIBE_CHUNK < p->nfiles ? lo + DESCRIBE_CHUNK : p->nfiles, got = 0;
        for (uint64_t n = lo + 1; n <= hi; n++)
            got += (uint64_t)describe_file(p, (uint32_t)n);
        __atomic_fetch_add(&p->described, got, __ATOMIC_RELAXED);
    }
}

/* Describe every one of the first ``nfiles`` files of the index ``x`` (``size`` bytes, the whole
 * file mapped shared: the shim and the door read it meanwhile) not described yet, ``threads`` at
 * once, each by a fstatat relative to its root's descriptor (``root_fds[k]`` for key "<k>/..."),
 * its route from the tables walk_routes takes. A file gone, or no longer a regular file, stays
 * undescribed (the daemon's own look when it is opened says so). The number described, or -1 if
 * ``x`` is no index of this version. */
EXPORT int64_t walk_describe(unsigned char *x, uint64_t size, uint64_t nfiles, const int *root_fds, int nroots,
                             const uint64_t *smallest, const uint8_t *route, const int *nsteps, int threads)
{
    struct describe_pass p = {.x = x, .nfiles = nfiles, .root_fds = root_fds, .nroots = nroots,
                              .routes = {smallest, route, nsteps, nroots}};
    if (index_header_of(x, size, nfiles, &p.h, 1) != 0)
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

/* File ``n`` (from 1) of the index ``x`` (``size`` bytes, the whole file: the daemon's writable
 * mapping) described from Python's stat: ``fields`` = size, mtime_ns, atime_ns, ctime_ns, ino, dev,
 * mode, uid, gid, nlink, blocks, blksize; its route from the tables walk_routes takes. The same
 * protocol as every describer's (monarch_index_put_fields). 1 described now; 0 described or being
 * described already; -1 no index of this version, no such file, or no room. */
EXPORT int index_put_stat(unsigned char *x, uint64_t size, uint32_t n, const int64_t *fields,
                          const uint64_t *smallest, const uint8_t *route, const int *nsteps, int nroots)
{
    struct monarch_index_header h;
    struct monarch_route_steps t = {smallest, route, nsteps, nroots};
    if (index_header_of(x, size, n, &h, 1) != 0 || !n)
        return -1;
    struct monarch_index_entry f;
    memset(&f, 0, sizeof f);
    f.size = (uint64_t)fields[0];
    f.mtime_ns = fields[1], f.atime_ns = fields[2], f.ctime_ns = fields[3];
    f.ino = (uint64_t)fields[4], f.dev = (uint64_t)fields[5];
    f.mode = (uint32_t)fields[6], f.uid = (uint32_t)fields[7], f.gid = (uint32_t)fields[8];
    f.nlink = (uint32_t)fields[9];
    f.blocks = (uint64_t)fields[10], f.blksize = (uint32_t)fields[11];
    return monarch_index_put_fields(x, &h, n, &f, &t);
}
