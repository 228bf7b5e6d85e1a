/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_index.h). Here:
 * the snapshot index: fstat of staged copies, metadata and listings answered from it. */
#include "shim_index.h"

/* ---- the snapshot index: the source's stat of a key (slow path only) ---- */
/* The index mapping, or NULL: acquire, so that its header copy is seen with it. */
static inline const unsigned char *monarch_idx(void)
{
    return __atomic_load_n(&monarch_index, __ATOMIC_ACQUIRE);
}

static int monarch_index_settle(void);

/* The index's state for a call that needs it (under a root), waiting for it first if it
 * was not there when this process started: once settled, a single acquire load (a plain
 * load on x86-64). Call it with monarch_guard set (the wait makes calls of its own). */
static inline int monarch_index_ready(void)
{
    int s = __atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE);
    return MONARCH_UNLIKELY(s < MONARCH_IX_MAPPED) ? monarch_index_settle() : s;
}

/* Number n's (from 1) stat into *e, if it is inside the mapping and described: a file a listing
 * walk left undescribed gets its stat from the daemon, its record's slot last (released, loaded
 * acquired); until then nothing is answered from it (-1: the PFS's, the daemon's). */
static int monarch_index_entry(uint32_t n, struct monarch_index_entry *e)
{
    const unsigned char *m = monarch_idx();
    return m && monarch_index_read(m, &monarch_index_hdr, n, e) ? 0 : -1;
}

/* Number of key, or 0: protocol.index_lookup, bounded by the table size. */
static uint32_t monarch_index_lookup(const char *key, size_t kl)
{
    const unsigned char *m = monarch_idx();
    return m ? monarch_index_find_key(m, &monarch_index_hdr, key, kl) : 0;
}

/* Is key a file of the snapshot whose name is not a symlink? (O_NOFOLLOW opens: only
 * then is the copy what the kernel would open; without an index, nobody can say.) A file not
 * described yet is one: its listing's d_type said a regular file (a symlink is described). */
static int monarch_is_plain_file(const char *key, size_t kl)
{
    const unsigned char *m = monarch_idx();
    uint32_t n = monarch_index_lookup(key, kl);
    if (!m || !n)
        return 0;
    struct monarch_index_entry e;
    return !monarch_index_read(m, &monarch_index_hdr, n, &e) || !(e.flags & MONARCH_INDEX_FLAG_SYMLINK);
}

static void monarch_ns(int64_t ns, struct timespec *ts)
{
    int64_t s = ns / 1000000000, r = ns % 1000000000;
    if (r < 0) { /* before 1970: tv_nsec stays in [0, 1e9) */
        s -= 1;
        r += 1000000000;
    }
    ts->tv_sec = (time_t)s;
    ts->tv_nsec = (long)r;
}

/* stat and stat64 have the same field names: one body for both. */
#define MONARCH_FILL_STAT(st, e)                      \
    do {                                              \
        if ((e).blksize) {                            \
            (st)->st_blocks = (blkcnt_t)(e).blocks;   \
            (st)->st_blksize = (blksize_t)(e).blksize; \
        }                                             \
        (st)->st_size = (off_t)(e).size;              \
        (st)->st_mode = (mode_t)(e).mode;             \
        (st)->st_uid = (uid_t)(e).uid;                \
        (st)->st_gid = (gid_t)(e).gid;                \
        (st)->st_nlink = (nlink_t)(e).nlink;          \
        (st)->st_ino = (e).ino;                       \
        (st)->st_dev = (dev_t)(e).dev;                \
        monarch_ns((e).atime_ns, &(st)->st_atim);     \
        monarch_ns((e).mtime_ns, &(st)->st_mtim);     \
        monarch_ns((e).ctime_ns, &(st)->st_ctim);     \
    } while (0)

/* The source's stat for a staged descriptor; anything else is left as the kernel said. */
static inline int monarch_fd_source(int fd, struct monarch_index_entry *e)
{
    if ((unsigned)fd >= MONARCH_MAX_FDS)
        return 0;
    uint32_t n = __atomic_load_n(&monarch_fd_entry[fd], __ATOMIC_RELAXED);
    return n && monarch_index_entry(n, e) == 0;
}

static void monarch_fill_stat(int fd, struct stat *st)
{
    struct monarch_index_entry e;
    if (monarch_fd_source(fd, &e))
        MONARCH_FILL_STAT(st, e);
}

static void monarch_fill_stat64(int fd, struct stat64 *st)
{
    struct monarch_index_entry e;
    if (monarch_fd_source(fd, &e))
        MONARCH_FILL_STAT(st, e);
}

/* A staged descriptor's stat from its source's index entry alone, as stat of its path
 * answers (monarch_meta_stat): the kernel's answer would be overwritten field by field, so
 * the call is not made (Python makes two per open). Not for another struct version, nor
 * when the entry lacks the block figures (a store's file: the kernel's are kept): 0. */
#define MONARCH_STAGED_STAT_FN(type)                                                    \
    static int monarch_staged_##type(int fd, int ver, struct type *st)                 \
    {                                                                                  \
        struct monarch_index_entry e;                                                  \
        if (ver != MONARCH_STAT_VER || !monarch_fd_source(fd, &e) || !e.blksize)       \
            return 0;                                                                  \
        memset(st, 0, sizeof *st);                                                     \
        MONARCH_FILL_STAT(st, e);                                                      \
        return 1;                                                                      \
    }
MONARCH_STAGED_STAT_FN(stat)
MONARCH_STAGED_STAT_FN(stat64)

/* statx carries what the index lacks (birth time, mount id, attributes): always asked. */
static int monarch_staged_statx(int fd, int mask, struct statx *st)
{
    (void)fd, (void)mask, (void)st;
    return 0;
}

static void monarch_put_statx(const struct monarch_index_entry *ep, struct statx *st)
{
    struct monarch_index_entry e = *ep;
    struct timespec ts;
    if (e.blksize) {
        st->stx_blocks = e.blocks;
        st->stx_blksize = e.blksize;
        st->stx_mask |= STATX_BLOCKS;
    }
    st->stx_size = e.size;
    st->stx_mode = (uint16_t)e.mode;
    st->stx_uid = e.uid;
    st->stx_gid = e.gid;
    st->stx_nlink = e.nlink;
    st->stx_ino = e.ino;
    /* Linux's dev_t encoding (gnu_dev_major/minor), without the libc call */
    st->stx_dev_major = (uint32_t)(((e.dev >> 8) & 0xfff) | ((e.dev >> 32) & ~0xfffULL));
    st->stx_dev_minor = (uint32_t)((e.dev & 0xff) | ((e.dev >> 12) & ~0xffULL));
    monarch_ns(e.atime_ns, &ts);
    st->stx_atime.tv_sec = ts.tv_sec;
    st->stx_atime.tv_nsec = (uint32_t)ts.tv_nsec;
    monarch_ns(e.mtime_ns, &ts);
    st->stx_mtime.tv_sec = ts.tv_sec;
    st->stx_mtime.tv_nsec = (uint32_t)ts.tv_nsec;
    monarch_ns(e.ctime_ns, &ts);
    st->stx_ctime.tv_sec = ts.tv_sec;
    st->stx_ctime.tv_nsec = (uint32_t)ts.tv_nsec;
    st->stx_mask |= STATX_TYPE | STATX_MODE | STATX_NLINK | STATX_UID | STATX_GID | STATX_ATIME | STATX_MTIME
                    | STATX_CTIME | STATX_INO | STATX_SIZE;
}

static void monarch_fill_statx(int fd, struct statx *st)
{
    struct monarch_index_entry e;
    if (monarch_fd_source(fd, &e))
        monarch_put_statx(&e, st);
}

/* fstatat-like calls describe the descriptor itself only with AT_EMPTY_PATH and ""
 * (a function, not a test in the wrapper: glibc declares the path nonnull). */
static int monarch_on_fd(const char *path, int flags)
{
    return (flags & AT_EMPTY_PATH) && path && !path[0];
}
#define MONARCH_ON_FD(path, flags) monarch_on_fd(path, flags)


/* ---- metadata answered from the index (stat, access, directory listings) ----
 *
 * A metadata call on a path under a root is answered from the snapshot index when the
 * index describes it: a file or directory it has an entry for (lstat of a symlinked file
 * from its link record), or a name that does not exist (ENOENT) because its parent is a
 * directory listed whole whose listing lacks it. Anything else -- a name the listing has
 * but the index does not describe (a symlink to a directory, a special file), a path
 * below such a name, the root's own lstat, a statx asking for more than the basic stats,
 * flags the answer would have to interpret -- is the PFS's, as is everything once the
 * job has changed something under that root (EXTRA_META_OFF, set by monarch_invalidate
 * for every process of the job on the node: the answers never go stale).
 * The hot path (a path under no root) is the prefix match of monarch_key_abs and out.
 */


static inline uint64_t *monarch_extra(uint64_t *c, unsigned which)
{
    return &c[MONARCH_HEADER_WORDS + MONARCH_SLOT_WORDS * MONARCH_MAX_SLOTS + which];
}

static inline uint64_t monarch_root_bit(unsigned k)
{
    return k < 63 ? 1ULL << k : 1ULL << 63;
}

/* May root k's metadata come from the index? Not without an index or a counters file
 * (the job-wide "changed" bits live there), nor once the job changed something under it, nor
 * while the daemon has not checked the snapshot against the PFS (a manifest's: UNCHECKED). */
static inline int monarch_meta_on(unsigned k)
{
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    return c && monarch_idx()
           && !((__atomic_load_n(monarch_extra(c, MONARCH_EXTRA_META_OFF), __ATOMIC_ACQUIRE)
                 | __atomic_load_n(monarch_extra(c, MONARCH_EXTRA_META_UNCHECKED), __ATOMIC_ACQUIRE))
                & monarch_root_bit(k));
}

/* Count one managed metadata call: answered here (local) or sent to the PFS, and then why,
 * when it is because the index is not there yet (EXTRA_EARLY_META) or the daemon was lost
 * (EXTRA_LOST_META). */
static inline void monarch_meta_count(int how)
{
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && how != MONARCH_META_NOT_OURS)
        __atomic_fetch_add(monarch_extra(c, how == MONARCH_META_PASS ? MONARCH_EXTRA_META_PFS
                                                                     : MONARCH_EXTRA_META_LOCAL),
                           1, __ATOMIC_RELAXED);
    if (c && how == MONARCH_META_PASS) {
        int s = __atomic_load_n(&monarch_index_state, __ATOMIC_RELAXED);
        if (s == MONARCH_IX_EARLY || s == MONARCH_IX_LOST)
            __atomic_fetch_add(monarch_extra(c, s == MONARCH_IX_EARLY ? MONARCH_EXTRA_EARLY_META
                                                                      : MONARCH_EXTRA_LOST_META),
                               1, __ATOMIC_RELAXED);
    }
}

/* Child record i into *c and its name, if both are inside the mapping. */
static int monarch_index_child(uint64_t i, struct monarch_index_child *c, const char **name)
{
    const unsigned char *m = monarch_idx();
    const struct monarch_index_header *h = &monarch_index_hdr;
    if (!m || i >= h->children_count)
        return -1;
    memcpy(c, m + h->children_off + i * MONARCH_INDEX_CHILD_SIZE, sizeof *c);
    if (c->name_off > h->keys_size || c->name_len > h->keys_size - c->name_off)
        return -1;
    *name = (const char *)m + h->keys_off + c->name_off;
    return 0;
}

/* Are listed directory d's child records inside the index's child table ("." and ".."
 * at least)? A directory whose count says otherwise is not answered from the index. */
static int monarch_children_bounded(const struct monarch_index_entry *d)
{
    return d->nchildren >= 2 && d->children <= monarch_index_hdr.children_count
           && d->nchildren <= monarch_index_hdr.children_count - d->children;
}

/* The bytewise order of two names (memcmp, then the shorter first): <0, 0, >0. */
static int monarch_name_cmp(const char *a, size_t al, const char *b, size_t bl)
{
    int cmp = memcmp(a, b, al < bl ? al : bl);
    return cmp ? cmp : (al > bl) - (al < bl);
}

/* Does listed directory d have a child record of `name`? 1 yes (or cannot tell), 0 no: a binary
 * search of its sorted names (after "." and ".."). Its files are not among them: a file's key is
 * found by its look-up. */
static int monarch_child_named(const struct monarch_index_entry *d, const char *name, size_t nl)
{
    if (!monarch_children_bounded(d))
        return 1;
    uint64_t lo = d->children + 2, hi = d->children + d->nchildren;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        struct monarch_index_child c;
        const char *cn;
        if (monarch_index_child(mid, &c, &cn) != 0)
            return 1;
        int cmp = monarch_name_cmp(cn, c.name_len, name, nl);
        if (!cmp)
            return 1;
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* File n of key, one the walk only listed (not described yet), described by the daemon
 * (DESCRIBE: one stat of the PFS, once) so that this call and every later one are answered here:
 * 1 with it in *e; 0 if it is no such entry or could not be described (the call is the PFS's). */
static int monarch_described_now(const char *key, size_t kl, uint32_t n, struct monarch_index_entry *e)
{
    const unsigned char *m = monarch_idx();
    if (!m || !monarch_index_undescribed(m, &monarch_index_hdr, n))
        return 0;
    return monarch_request(MONARCH_VERB_DESCRIBE, key, kl, NULL, 0, NULL, monarch_timeout_ms) == 0
           && monarch_index_entry(n, e) == 0;
}

/* The index's answer for key (of root k): FOUND with the entry in *e (and its number in *number,
 * if not NULL), ABSENT, or PASS. */
static int monarch_meta_answer(const char *key, size_t kl, unsigned k, int nofollow, int wants_dir,
                               struct monarch_index_entry *e, uint32_t *number)
{
    if (!monarch_meta_on(k))
        return MONARCH_META_PASS;
    uint32_t n = monarch_index_lookup(key, kl);
    if (n) {
        if (monarch_index_entry(n, e) != 0 && !monarch_described_now(key, kl, n, e))
            return MONARCH_META_PASS;
        if (e->flags & MONARCH_INDEX_FLAG_SYMLINK) {
            if (wants_dir || (nofollow && (!e->link || monarch_index_entry(e->link, e) != 0)))
                return MONARCH_META_PASS; /* "link/" is ENOTDIR; no link record: the kernel's */
        } else if (nofollow && key[kl - 1] == '/' && !monarch_store_key(key)) {
            return MONARCH_META_PASS; /* the root's own spelling may be a symlink (a store's root is none) */
        } else if (wants_dir && !S_ISDIR(e->mode)) {
            return MONARCH_META_PASS;
        }
        if (number)
            *number = n;
        return MONARCH_META_FOUND;
    }
    /* Not described: absent if its parent was listed whole without this name (a file of it
     * would have been found above: its child records name the rest). */
    size_t p = kl;
    while (p > 0 && key[p - 1] != '/')
        p--;
    const char *slash = memchr(key, '/', kl);
    if (p == kl || !slash || kl - p > NAME_MAX)
        return MONARCH_META_PASS;
    size_t plen = (size_t)(slash - key) + 1 == p ? p : p - 1; /* a root's child: the parent is "<k>/" */
    struct monarch_index_entry d;
    uint32_t pn = monarch_index_lookup(key, plen);
    if (!pn || monarch_index_entry(pn, &d) != 0 || !(d.flags & MONARCH_INDEX_FLAG_LISTED)
        || (d.flags & MONARCH_INDEX_FLAG_SYMLINK) || monarch_child_named(&d, key + p, kl - p))
        return MONARCH_META_PASS;
    return MONARCH_META_ABSENT;
}

/* Look (dirfd, path) up: NOT_OURS (no root's), or the index's answer (monarch_meta_answer's);
 * abs[PATH_MAX] gets the absolute path when abs is not NULL. errno is kept. */
static int monarch_meta_find(int dirfd, const char *path, int nofollow, struct monarch_index_entry *e, char *abs,
                             uint32_t *number)
{
    if (monarch_guard || !path || !path[0] || !monarch_start())
        return MONARCH_META_NOT_OURS;
    char key[MONARCH_KEY_MAX], buf[PATH_MAX];
    size_t kl;
    unsigned k;
    int saved = errno, r = MONARCH_META_NOT_OURS;
    monarch_guard = 1;
    if (monarch_key_abs(dirfd, path, 1, key, &kl, &k, abs ? abs : buf) == 0) {
        monarch_index_ready(); /* started before the daemon's walk ended: the index, once there */
        r = monarch_meta_answer(key, kl, k, nofollow, monarch_wants_dir(path), e, number);
    }
    monarch_guard = 0;
    errno = saved;
    return r;
}


/* stat of a path from the index: 1 when answered (*r the result, errno set on failure),
 * 0 to make the real call. `type` is stat or stat64; ver is __xstat's version. */
#define MONARCH_META_STAT_FN(type)                                                           \
    static int monarch_meta_##type(int dirfd, const char *path, int flags, unsigned ver,     \
                                   struct type *buf, int *r)                                 \
    {                                                                                        \
        struct monarch_index_entry e;                                                        \
        int how = monarch_meta_find(dirfd, path, flags & AT_SYMLINK_NOFOLLOW, &e, NULL, NULL); \
        if (how != MONARCH_META_NOT_OURS && ((int)ver != MONARCH_STAT_VER || (flags & ~MONARCH_STAT_FLAGS))) \
            how = MONARCH_META_PASS;                                                         \
        monarch_meta_count(how);                                                             \
        if (how == MONARCH_META_FOUND) {                                                     \
            memset(buf, 0, sizeof *buf);                                                     \
            MONARCH_FILL_STAT(buf, e);                                                       \
            *r = 0;                                                                          \
            return 1;                                                                        \
        }                                                                                    \
        if (how == MONARCH_META_ABSENT) {                                                    \
            errno = ENOENT;                                                                  \
            *r = -1;                                                                         \
            return 1;                                                                        \
        }                                                                                    \
        return 0;                                                                            \
    }
MONARCH_META_STAT_FN(stat)
MONARCH_META_STAT_FN(stat64)

static int monarch_meta_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *buf, int *r)
{
    struct monarch_index_entry e;
    int ok = !(flags & ~(MONARCH_STAT_FLAGS | AT_STATX_DONT_SYNC)) && !(mask & ~STATX_BASIC_STATS);
    int how = monarch_meta_find(dirfd, path, flags & AT_SYMLINK_NOFOLLOW, &e, NULL, NULL);
    if (!ok && how != MONARCH_META_NOT_OURS)
        how = MONARCH_META_PASS;
    monarch_meta_count(how);
    if (how == MONARCH_META_FOUND) {
        memset(buf, 0, sizeof *buf);
        buf->stx_blksize = 4096;
        monarch_put_statx(&e, buf);
        *r = 0;
        return 1;
    }
    if (how == MONARCH_META_ABSENT) {
        errno = ENOENT;
        *r = -1;
        return 1;
    }
    return 0;
}

/* access/faccessat from the index: existence always; permission bits only for the owner
 * (whose bits the kernel checks first, ACL or not) and not for root or W_OK (a read-only
 * mount, root squash and ACLs are the PFS's to say). */
static int monarch_meta_access(int dirfd, const char *path, int mode, int flags, int *r)
{
    struct monarch_index_entry e;
    int how = monarch_meta_find(dirfd, path, flags & AT_SYMLINK_NOFOLLOW, &e, NULL, NULL);
    if (how == MONARCH_META_FOUND && mode != F_OK) {
        uid_t uid = (flags & AT_EACCESS) ? geteuid() : getuid();
        if ((flags & ~(AT_EACCESS | AT_SYMLINK_NOFOLLOW)) || (mode & ~(R_OK | X_OK)) || uid == 0 || uid != e.uid)
            how = MONARCH_META_PASS;
    }
    monarch_meta_count(how);
    if (how == MONARCH_META_FOUND) {
        unsigned granted = (e.mode >> 6) & 7;
        *r = (mode == F_OK || !((unsigned)mode & ~granted)) ? 0 : -1;
        if (*r)
            errno = EACCES;
        return 1;
    }
    if (how == MONARCH_META_ABSENT) {
        errno = ENOENT;
        *r = -1;
        return 1;
    }
    return 0;
}

/* ---- directory listings from the index ----
 * An emulated DIR: opendir/fdopendir of a directory the index lists whole return one of
 * these; readdir & co. recognise it by its first two words (a magic and its own address:
 * a glibc DIR starts with a descriptor, a lock and a size, never that). */

static inline struct monarch_dir *monarch_dir_of(DIR *dirp)
{
    struct monarch_dir *m = (struct monarch_dir *)(void *)dirp;
    uint64_t magic;
    void *self;
    if (!dirp)
        return NULL;
    memcpy(&magic, m, sizeof magic);
    if (magic != MONARCH_DIR_MAGIC)
        return NULL;
    memcpy(&self, (char *)m + offsetof(struct monarch_dir, self), sizeof self);
    return self == (void *)m ? m : NULL;
}

/*
 * opendir (fd < 0) or fdopendir (fd) of (dirfd, path): 1 when answered from the index
 * (*out a new emulated DIR, or NULL with errno ENOENT), 0 to make the real call.
 */
static int monarch_meta_opendir(int dirfd, const char *path, int fd, DIR **out)
{
    struct monarch_index_entry e;
    char abs[PATH_MAX];
    uint32_t n = 0, file0 = 0, files = 0;
    if (fd >= 0) { /* what fdopendir refuses (O_PATH, write-only) it must refuse itself */
        long fl = syscall(SYS_fcntl, fd, F_GETFL);
        if (fl < 0 || (fl & O_PATH) || (fl & O_ACCMODE) == O_WRONLY)
            return 0;
    }
    int how = monarch_meta_find(dirfd, path, 0, &e, abs, &n);
    if (how == MONARCH_META_FOUND
        && (!S_ISDIR(e.mode) || !(e.flags & MONARCH_INDEX_FLAG_LISTED) || !monarch_children_bounded(&e)
            || n <= monarch_index_hdr.files
            || !monarch_index_dir_files(monarch_idx(), &monarch_index_hdr, n - monarch_index_hdr.files - 1, &file0,
                                        &files)))
        how = MONARCH_META_PASS; /* a count beyond the child table, a range beyond the files: the kernel lists it */
    if (how == MONARCH_META_ABSENT && fd >= 0)
        how = MONARCH_META_PASS; /* an open descriptor exists: the index is out of date */
    struct monarch_dir *m = NULL;
    if (how == MONARCH_META_FOUND && !(m = malloc(sizeof *m)))
        how = MONARCH_META_PASS;
    monarch_meta_count(how);
    if (how == MONARCH_META_ABSENT) {
        errno = ENOENT;
        *out = NULL;
        return 1;
    }
    if (how != MONARCH_META_FOUND)
        return 0;
    m->magic = MONARCH_DIR_MAGIC;
    m->self = m;
    m->fd = fd;
    m->first = e.children;
    m->count = e.nchildren;
    m->file0 = file0;
    m->files = files;
    m->pos = 0;
    strcpy(m->path, abs);
    MONARCH_DEBUG(2, "opendir %s: %u names from the index", abs, e.nchildren + files);
    *out = (DIR *)(void *)m;
    return 1;
}

/* The next name of emulated DIR m: "." and "..", then its other child records and its files
 * merged in bytewise order (both sorted). 1 with its name, d_ino and d_type, m->pos past it; 0 at
 * the end. A record or a name outside the mapping is skipped. A file's d_type is DT_LNK when its
 * name is a symlink (its stat says so), else DT_REG; its d_ino the listing's, else its stat's. */
static int monarch_dir_next(struct monarch_dir *m, const char **name, size_t *nl, uint64_t *ino, unsigned char *type)
{
    const unsigned char *x = monarch_idx();
    const struct monarch_index_header *h = &monarch_index_hdr;
    uint64_t ci = (uint64_t)m->pos >> 32, fi = (uint64_t)m->pos & 0xFFFFFFFFu;
    ci = ci < m->count ? ci : m->count; /* a seekdir past the end */
    fi = fi < m->files ? fi : m->files;
    for (; x; m->pos = (long)(ci << 32 | fi)) {
        struct monarch_index_child c;
        const char *cn = NULL, *fn = NULL;
        uint32_t fl = 0, n = m->file0 + (uint32_t)fi;
        struct monarch_index_name nm;
        if (ci < m->count && monarch_index_child(m->first + ci, &c, &cn) != 0) {
            ci++;
            continue;
        }
        if (ci >= 2 && fi < m->files) {
            if (!monarch_index_name_of(x, h, n, &nm) || (fl = monarch_index_name_len(&nm)) >= sizeof m->name) {
                fi++;
                continue;
            }
            monarch_index_name_copy(&nm, m->name);  /* given until the next call, as a dirent is */
            fn = m->name;
        }
        if (ci < m->count && (ci < 2 || !fn || monarch_name_cmp(cn, c.name_len, fn, fl) <= 0)) {
            *name = ci < 2 ? ".." : cn;
            *nl = ci < 2 ? (size_t)ci + 1 : c.name_len;
            *ino = c.d_ino;
            *type = c.d_type;
            ci++;
        } else if (fn) {
            struct monarch_index_entry st;
            int described = monarch_index_read(x, h, n, &st);
            *ino = h->inos_off ? monarch_index_listed_ino(x, h, n) : described ? st.ino : 0;
            *name = fn;
            *nl = fl;
            *type = described && st.flags & MONARCH_INDEX_FLAG_SYMLINK ? DT_LNK : DT_REG;
            fi++;
        } else {
            return 0;
        }
        m->pos = (long)(ci << 32 | fi);
        return 1;
    }
    return 0;
}
