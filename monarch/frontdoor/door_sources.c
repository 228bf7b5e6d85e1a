/* Part of front_door.c, one translation unit (what it gives the other parts: door_sources.h). Here:
 * the dataset's source directories, kept open by their number in the index (d->sources).
 *
 * A miss opened by its whole path makes the PFS client look up every directory on the way again
 * (at a PFS whose names are revalidated at each open, a metadata call each); opened in its
 * directory's descriptor it costs only its own name's look-up. A directory is opened O_PATH (the
 * look-up alone: no OPENDIR, no open handle on the metadata server), in its root's kept descriptor
 * (no look-up above the root), by the first miss that falls in it or, from the job's first miss,
 * by two warmers going through the index's directories beside the job. It is used only if it is
 * still the directory inode the snapshot describes, and kept until the door stops (insert-only,
 * bounded: a descriptor handed to a thread is never closed under it). */
#include "door_sources.h"
_Static_assert(SOURCES_ROOTS == MAX_ROOTS, "a kept descriptor for every root");

/* Does an open on ``fd``'s filesystem leave the file's attributes fresh in the client's cache
 * (NFS, FUSE, GPFS: pfsmeta.FRESH_AFTER_OPEN)? Asked once per root (a root is one filesystem):
 * a statfs per source directory was one more PFS call on nearly every miss in random order. */
static int fresh_after_open(struct door *d, long root, int fd)
{
    int known = __atomic_load_n(&d->root_fresh[root], __ATOMIC_RELAXED);
    if (known >= 0)
        return known;
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return 0;
    unsigned long type = (unsigned long)sf.f_type & 0xFFFFFFFFUL;
    known = type == 0x6969UL || type == 0x65735546UL || type == 0x47504653UL;
    __atomic_store_n(&d->root_fresh[root], known, __ATOMIC_RELAXED);
    return known;
}

/* The PFS path of directory ``key`` (its first ``dlen`` bytes, "<k>/<dir>"), then ``name`` in it when
 * given, in ``path``: its root's index, or -1. */
static long source_path(struct door *d, const char *key, uint32_t dlen, const char *name, char *path)
{
    const char *slash = memchr(key, '/', dlen);
    long root = strtol(key, NULL, 10);
    if (root < 0 || root >= d->nroots)
        return -1;
    int rl = slash ? (int)(dlen - (uint32_t)(slash + 1 - key)) : 0;
    if (snprintf(path, PATH_MAX, "%s/%.*s%s%s", d->roots[root], rl, slash ? slash + 1 : "", rl && name ? "/" : "",
                 name ? name : "") >= PATH_MAX)
        return -1;
    return root;
}

static int open_source_dir(struct worker *w, const char *key, uint32_t dlen)  /* dlen: "<k>/<dir>" */
{
    char path[PATH_MAX];
    long root = source_path(w->d, key, dlen, NULL, path);
    if (root < 0)
        return -1;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    w->src_fresh = fd >= 0 && fresh_after_open(w->d, root, fd);
    return fd;
}

/* The just-opened source's stat (``want``: the STATX_ fields needed; the others may be 0). Where
 * its open refreshed them (``fresh``), as that open left them in the client's cache (statx,
 * AT_STATX_DONT_SYNC): no second round trip to the PFS's metadata server per copy, as the stager
 * (pfsmeta.opened_stat); else fstat. */
static int source_stat(int fd, int fresh, unsigned want, struct stat *st)
{
#ifdef SYS_statx
    struct statx_buf sx;
    if (fresh && syscall(SYS_statx, fd, "", AT_EMPTY_PATH | STATX_DONT_SYNC, want, &sx) == 0 &&
        (sx.mask & want) == want) {
        memset(st, 0, sizeof *st);
        st->st_mode = sx.mode;
        st->st_size = (off_t)sx.size;
        st->st_ino = sx.ino;
        st->st_dev = makedev(sx.dev_major, sx.dev_minor);
        st->st_nlink = sx.nlink;
        st->st_uid = sx.uid;
        st->st_gid = sx.gid;
        st->st_blocks = (blkcnt_t)sx.blocks;
        st->st_blksize = (blksize_t)sx.blksize;
        st->st_atim = (struct timespec){sx.atime.sec, sx.atime.nsec};
        st->st_mtim = (struct timespec){sx.mtime.sec, sx.mtime.nsec};
        st->st_ctim = (struct timespec){sx.ctime.sec, sx.ctime.nsec};
        return 0;
    }
#endif
    return fstat(fd, st);
}

/* The table's limit (its memory is made at its first use): half the descriptors the copiers leave
 * under the process's limit, at most SOURCES_MAX; none below 64. */
static void sources_init(struct door *d)
{
    struct door_sources *s = &d->sources;
    pthread_mutex_init(&s->mu, NULL);
    struct rlimit rl;
    long room = getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ? 2L * SOURCES_MAX
                : ((long)rl.rlim_cur - 256 - 4L * d->copiers.cap) / 2;  /* half of what the copiers leave */
    s->limit = room < 64 ? 0 : room > SOURCES_MAX ? SOURCES_MAX : (uint32_t)room;
    for (s->slots = 16; s->slots < 2 * s->limit; s->slots *= 2)
        ;
    for (int k = 0; k < SOURCES_ROOTS; k++)
        s->root[k] = -1;
}

/* Root ``k``'s kept descriptor (opened at its first use), or -1; *fresh: whether an open under it
 * leaves attributes fresh (asked there once, under the lock: one statfs, whoever asks first). */
static int sources_root(struct door *d, long k, int *fresh)
{
    struct door_sources *s = &d->sources;
    pthread_mutex_lock(&s->mu);
    if (s->root[k] < 0 && !s->stop)
        s->root[k] = open(d->roots[k], O_PATH | O_DIRECTORY | O_CLOEXEC);
    int fd = s->root[k];
    *fresh = fd >= 0 && fresh_after_open(d, k, fd);
    pthread_mutex_unlock(&s->mu);
    return fd;
}

/* The table, made at its first use (a door that copies nothing from the PFS makes none): 1, or 0
 * without the memory for it (every miss by path from then on, as before the table). Under s->mu. */
static int sources_table_locked(struct door_sources *s)
{
    if (s->dir)
        return 1;
    s->dir = calloc(s->slots, sizeof *s->dir);
    s->fd = calloc(s->slots, sizeof *s->fd);
    s->fresh = calloc(s->slots, 1);
    if (s->dir && s->fd && s->fresh)
        return 1;
    free(s->dir), free(s->fd), free(s->fresh);
    s->dir = NULL, s->fd = NULL, s->fresh = NULL;
    s->limit = 0;
    return 0;
}

/* The slot of directory ``m``: its own, or the empty one where it would go. Under s->mu. */
static uint32_t sources_slot(const struct door_sources *s, uint32_t m)
{
    uint32_t i = (m * 2654435761u) & (s->slots - 1);
    while (s->dir[i] && s->dir[i] != m)
        i = (i + 1) & (s->slots - 1);
    return i;
}

/* The directory ``key``'s first ``dlen`` bytes name ("<k>/<dir>"; its stat ``at`` in the index),
 * opened in its root's kept descriptor: a descriptor if it is still the directory the snapshot
 * describes, else -1. */
static int sources_open(struct door *d, const unsigned char *at, const char *key, uint32_t dlen, int *fresh)
{
    char rel[PATH_MAX];
    const char *slash = memchr(key, '/', dlen);
    long root = strtol(key, NULL, 10);
    uint32_t rl = slash ? dlen - (uint32_t)(slash + 1 - key) : 0;
    if (root < 0 || root >= d->nroots || rl >= PATH_MAX)
        return -1;
    if (rl) {
        memcpy(rel, slash + 1, rl);
        rel[rl] = 0;
    } else {
        strcpy(rel, ".");              /* the root itself: no look-up */
    }
    int top = sources_root(d, root, fresh);
    int fd = top < 0 ? -1 : openat(top, rel, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    uint64_t ino;
    memcpy(&ino, at + offsetof(struct monarch_index_entry, ino), sizeof ino);
    if (source_stat(fd, *fresh, STATX_WANTED, &st) != 0 || !S_ISDIR(st.st_mode) || (uint64_t)st.st_ino != ino) {
        close(fd);
        return -1;
    }
    return fd;
}

static int sources_dir(struct door *d, uint32_t n, const char *key, uint32_t dlen, int *fresh)
{
    struct door_sources *s = &d->sources;
    if (!s->limit || !d->index.map)
        return -1;
    uint32_t m;
    const unsigned char *at = index_dir_stat(d, n, &m);
    if (!at)
        return -1;                     /* no directory the snapshot describes: by path */
    pthread_mutex_lock(&s->mu);
    if (!sources_table_locked(s)) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    uint32_t i = sources_slot(s, m);
    int known = s->dir[i] == m, full = s->n >= s->limit;
    int fd = known ? s->fd[i] : -1;
    *fresh = known ? s->fresh[i] : 0;
    pthread_mutex_unlock(&s->mu);
    if (known || full)
        return fd;
    int opened = sources_open(d, at, key, dlen, fresh);
    pthread_mutex_lock(&s->mu);
    i = sources_slot(s, m);            /* another thread may have kept it meanwhile */
    if (s->dir[i] == m || s->n >= s->limit) {
        if (opened >= 0)
            close(opened);
        fd = s->dir[i] == m ? s->fd[i] : -1;
        *fresh = s->dir[i] == m ? s->fresh[i] : 0;
    } else {
        s->dir[i] = m;
        s->fd[i] = fd = opened;
        s->fresh[i] = (uint8_t)*fresh;
        __atomic_add_fetch(&s->n, 1, __ATOMIC_RELAXED);  /* read by the warmers without the lock */
    }
    pthread_mutex_unlock(&s->mu);
    return fd;
}

/* A warmer: the index's directories (those with files), in its order, each kept as a miss there
 * would keep it, until every one is or the table is full: the first miss in a directory then
 * costs a call less too. */
static void *sources_warmer(void *arg)
{
    struct door *d = arg;
    struct door_sources *s = &d->sources;
    uint32_t dirs = index_dirs(d);
    for (;;) {
        uint32_t j = __atomic_fetch_add(&s->next_dir, 1, __ATOMIC_RELAXED), first, klen;
        if (j >= dirs || __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE) || __atomic_load_n(&d->never_copy, __ATOMIC_ACQUIRE) ||
            __atomic_load_n(&s->n, __ATOMIC_RELAXED) >= s->limit)
            return NULL;
        const char *dkey = index_dir_key(d, j, &klen, &first);
        int fresh;
        if (dkey && klen < PATH_MAX)   /* a root's key "<k>/" names it as its files' "<k>" does */
            sources_dir(d, first, dkey, klen, &fresh);
    }
}

static void sources_want_warm(struct door *d)
{
    int none = 0;
    __atomic_compare_exchange_n(&d->sources.warm, &none, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* The warmers started, at the first miss (a job that reads nothing from the PFS opens no directory). */
static void sources_warm(struct door *d)
{
    struct door_sources *s = &d->sources;
    pthread_mutex_lock(&s->mu);        /* not while sources_close runs: started here, joined there */
    if (s->limit && d->index.map && !s->nwarmers && !s->stop) {
        sigset_t all, old;             /* no signals: the interpreter's threads take them */
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        while (s->nwarmers < SOURCES_WARMERS && pthread_create(&s->warmers[s->nwarmers], NULL, sources_warmer, d) == 0)
            s->nwarmers++;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    pthread_mutex_unlock(&s->mu);
}

static void sources_close(struct door *d)
{
    struct door_sources *s = &d->sources;
    pthread_mutex_lock(&s->mu);
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nwarmers; i++)
        pthread_join(s->warmers[i], NULL);
    s->nwarmers = 0;
    for (int k = 0; k < SOURCES_ROOTS; k++)
        if (s->root[k] >= 0)
            close(s->root[k]), s->root[k] = -1;
    for (uint32_t i = 0; s->dir && i < s->slots; i++)
        if (s->dir[i] && s->fd[i] >= 0)
            close(s->fd[i]);
    free(s->dir), free(s->fd), free(s->fresh);
    s->dir = NULL, s->fd = NULL, s->fresh = NULL;
    s->n = 0;
}

/* The source of ``key`` (its directory part ``dlen`` bytes, its name ``name``; file ``n`` of the
 * index, 0 if unknown), opened as ``flags``: in its directory's kept descriptor (sources_dir), else
 * in the worker's source directory when the key is its neighbour, that directory opened for the
 * read-ahead's keys (``in_order``) or when a second miss in a row falls in it, else by its whole
 * path, as a direct open. */
static int open_source(struct worker *w, const char *key, uint32_t dlen, const char *name, uint32_t n, int flags,
                       int in_order)
{
    int wanted = 1;
    if (__atomic_load_n(&w->d->sources.warm, __ATOMIC_RELAXED) == 1 &&
        __atomic_compare_exchange_n(&w->d->sources.warm, &wanted, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        sources_warm(w->d);
    int fresh, kept = n ? sources_dir(w->d, n, key, dlen, &fresh) : -1;
    if (kept >= 0) {
        w->src_fresh = fresh;
        return openat(kept, name, flags);
    }
    int near = w->src_dir >= 0 && w->src_dir_len == dlen && !memcmp(w->src_dir_key, key, dlen);
    if (!near && (in_order || (w->last_dir_len == dlen && !memcmp(w->last_dir_key, key, dlen))))
        near = cached_dir(&w->src_dir, w->src_dir_key, &w->src_dir_len, key, dlen, open_source_dir, w) >= 0;
    if (near)
        return openat(w->src_dir, name, flags);
    if (dlen < PATH_MAX) {
        memcpy(w->last_dir_key, key, dlen);
        w->last_dir_len = dlen;
    }
    char path[PATH_MAX];
    long root = source_path(w->d, key, dlen, name, path);
    if (root < 0)
        return -1;
    int fd = open(path, flags);
    w->src_fresh = fd >= 0 && fresh_after_open(w->d, root, fd);
    return fd;
}
