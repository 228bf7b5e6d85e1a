/* The dataset walk in C: every root's tree listed (getdents64) and described (one fstatat
 * per entry, relative to its directory's descriptor) by a few threads at once, and the
 * snapshot index (monarch/protocol.py, "Snapshot index") built from what it found, with no
 * object per file and no interpreter on the way (design principle 12).
 *
 * It sees what the Python walk (monarch/node/snapshot/snapshot.py: take_snapshot) sees, entry for
 * entry: directories are not followed through symlinks, a symlink to a regular file is
 * that file (its own lstat kept as its link record), a broken link or a special file is
 * named in its directory's listing but not described, and a directory whose listing or
 * any entry failed is kept unlisted (its names stay the PFS's). The index it writes is
 * the one monarch/node/snapshot/index_writer.py writes for that snapshot, byte for byte, with
 * the files in this walk's order: directories sorted by key, each one's files by name
 * (tests/unit/node/snapshot/test_walker.py holds the two equal).
 *
 * Listing mode (walk_run's ``describe`` 0): the namespace at the pace of the listings, as ``find``
 * walks: a name whose d_type says regular file or directory is not stat'ed. A file's record is left
 * without a stat (protocol.py) for the daemon to describe when something needs it (snapshot.py) or
 * in one pass later (walk_describe); a directory is described by the fstat of the descriptor its
 * listing opens. Names of other types (a symlink, DT_UNKNOWN) are stat'ed as in a full walk.
 *
 * Memory: while the walk runs a name costs its bytes and a 16-byte listing record (a file's number
 * is its place, a subdirectory and a spare name are found in small per-directory arrays), a
 * described file also its future stat (112 bytes: an array per directory in a full walk, one
 * allocation each in listing mode, where few are): about 30 bytes a file in listing mode, beside
 * the index's ~36. walk_build writes the index into the caller's buffer one directory at a time and
 * frees each directory as it goes, so the peak is about one index's size, not two (the buffer comes
 * unwritten, its stats' room zeroed: its pages are touched only as the index fills them, the stats'
 * room unused never).
 *
 * Use (monarch/node/snapshot/walker.py): walk_run (blocking; the threads are its own), then
 * walk_index_size, a buffer of that size, walk_build into it, walk_free. */

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../native/monarch_native.h" /* EXPORT, CRC-32; the index layout (the wire's): one definition */

#define SLICE 256           /* entries of one directory described per task (a flat directory is split) */
#define DENTS_BUFFER 65536  /* bytes per getdents64 call */
#define TRIM_BYTES (8u << 20) /* the freed records given back to the system every this many bytes of the index built */

enum kind { K_FAILED, K_FILE, K_LINKED_FILE, K_DIR, K_OTHER };

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* One name of a listed directory: what the walk holds per name, beside the name's bytes. A file's
 * number is its place among its directory's files (they are numbered directory by directory). */
struct ent {
    uint64_t d_ino;
    uint32_t name_off;  /* in the directory's names */
    uint16_t name_len;
    uint8_t d_type;     /* as the listing gives it (DT_REG for a file, DT_LNK for a linked one, ...) */
    uint8_t kind;
};

/* A name the walk stat'ed where no per-name array holds it (few are): by its name's offset. */
struct stated {
    uint32_t name_off;
    struct monarch_index_entry *e;
};

struct dir {
    char *key;          /* "<k>/" for root k, "<k>/<path>" below it */
    uint32_t key_len, rel_off;  /* rel_off: where the path under the root starts in key */
    int root;           /* index into the walk's root descriptors */
    struct monarch_index_entry self;  /* its own stat (lstat by its parent; fstat for a root) */
    uint64_t parent_ino;
    int fd;
    int unlisted;       /* its listing or an entry failed: the PFS's names stand */
    int undescribed;    /* listing mode: its own stat is taken when it is opened to be listed */
    uint32_t n;         /* names in the listing */
    struct ent *ents;
    char *names;
    /* a file's stat and a linked file's own lstat: a full walk's stats in ``recs``, per name, and
     * each linked file's own lstat alone in ``stated``; a listing walk (recs NULL): in ``stated``,
     * a described file's stat, then a linked file's own lstat (a file not there: not described) */
    struct monarch_index_entry *recs;
    struct stated *stated;       /* sorted by name_off once the directory is finished */
    uint32_t nstated, cap_stated;
    struct dir **subs;           /* its subdirectories (sorted by key once finished: its K_DIR names' order) */
    uint32_t nsubs, cap_subs;
    uint32_t *spare;             /* its other names' offsets among the spare names, in name order */
    int slices_left;    /* guarded by the walk's lock */
    uint32_t number;    /* its place among the directories (entry files + 1 + number) */
    uint64_t key_off;   /* its key's offset after the file names */
    uint16_t prefix, suffix;  /* its files' names' common prefix and suffix (dir_affixes) */
    uint32_t affix_at;  /* those bytes' offset in names, once its files' are cut to their middles */
    int middles;        /* its files' names are their middles (name_off, name_len), as in the index */
    uint64_t affix_off; /* where they are among the affixes (the key bytes' last) */
};

struct task {
    struct dir *d;
    uint32_t lo, hi;    /* hi == 0 and lo == 0: list the directory; else describe ents[lo, hi) */
};

struct walk {
    pthread_mutex_t lock;
    pthread_cond_t more;
    struct task *tasks;
    size_t ntasks, cap_tasks;
    int busy;           /* threads running a task */
    int error;          /* an allocation failed: the walk is void */
    struct dir **dirs;
    size_t ndirs, cap_dirs;
    const int *root_fds;
    int describe;       /* 0: listing mode (the module doc) */
    /* the index, once laid out */
    uint64_t nfiles, nlinked, total, nbuckets, names_size, keys_size, nchildren, spare_size, affix_size, size;
    uint64_t files_off, ranges_off, affixes_off, inos_off, entries_off, keys_off, children_off, shapes_off, stats_off;
    uint64_t described;  /* files stat'ed by the walk (in listing mode: links, names of unknown type) */
    int one_ino;         /* the inodes table is one u64 (MONARCH_INDEX_INOS_ONE) */
};

static void fill(struct monarch_index_entry *e, const struct stat *st)
{
    memset(e, 0, sizeof *e);
    monarch_index_stat_fields(e, st);
}

static uint8_t d_type_of(mode_t mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return DT_REG;
    case S_IFDIR: return DT_DIR;
    case S_IFLNK: return DT_LNK;
    case S_IFIFO: return DT_FIFO;
    case S_IFSOCK: return DT_SOCK;
    case S_IFCHR: return DT_CHR;
    case S_IFBLK: return DT_BLK;
    }
    return DT_UNKNOWN;
}

/* -- the queue (under w->lock) ----------------------------------------------------------- */
static int push_locked(struct walk *w, struct dir *d, uint32_t lo, uint32_t hi)
{
    if (w->ntasks == w->cap_tasks) {
        size_t cap = w->cap_tasks ? 2 * w->cap_tasks : 256;
        struct task *t = realloc(w->tasks, cap * sizeof *t);
        if (!t)
            return -1;
        w->tasks = t;
        w->cap_tasks = cap;
    }
    w->tasks[w->ntasks++] = (struct task){d, lo, hi};
    pthread_cond_signal(&w->more);
    return 0;
}

static void free_dir(struct dir *d);

/* -1 on failure: ``d`` freed unless it is among the walk's directories (walk_free's then). */
static int add_dir_locked(struct walk *w, struct dir *d)
{
    if (w->ndirs == w->cap_dirs) {
        size_t cap = w->cap_dirs ? 2 * w->cap_dirs : 256;
        struct dir **p = realloc(w->dirs, cap * sizeof *p);
        if (!p) {
            free_dir(d);
            return -1;
        }
        w->dirs = p;
        w->cap_dirs = cap;
    }
    w->dirs[w->ndirs++] = d;
    return push_locked(w, d, 0, 0);
}

/* ``p`` (``n`` items of ``size`` bytes, room for ``*cap``) with room for one more, or NULL. */
static void *grown(void *p, uint32_t n, uint32_t *cap, size_t size)
{
    if (n < *cap)
        return p;
    uint32_t c = *cap ? 2 * *cap : 4;
    if ((p = realloc(p, c * size)))
        *cap = c;
    return p;
}

/* Name ``name_off`` of ``d`` stat'ed into ``e`` (its own allocation), kept in d->stated (slices of
 * ``d`` add theirs at once: under the lock). */
static int add_stated(struct walk *w, struct dir *d, uint32_t name_off, struct monarch_index_entry *e)
{
    pthread_mutex_lock(&w->lock);
    struct stated *p = grown(d->stated, d->nstated, &d->cap_stated, sizeof *p);
    if (p)
        d->stated = p, p[d->nstated++] = (struct stated){name_off, e};
    pthread_mutex_unlock(&w->lock);
    if (!p)
        free(e);
    return p ? 0 : -1;
}

static void fail(struct walk *w)
{
    pthread_mutex_lock(&w->lock);
    w->error = ENOMEM;
    pthread_mutex_unlock(&w->lock);
}

static struct dir *new_dir(int root, const char *parent_key, uint32_t parent_len, const char *name, size_t name_len)
{
    struct dir *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    int slash = parent_len && parent_key[parent_len - 1] != '/';
    d->key_len = parent_len + slash + (uint32_t)name_len;
    d->key = malloc(d->key_len + 1);
    if (!d->key) {
        free(d);
        return NULL;
    }
    memcpy(d->key, parent_key, parent_len);
    if (slash)
        d->key[parent_len] = '/';
    memcpy(d->key + parent_len + slash, name, name_len);
    d->key[d->key_len] = 0;
    d->root = root;
    d->fd = -1;
    return d;
}

/* Subdirectory ``name`` of ``d`` walked too: ``st`` its lstat, or NULL in listing mode (described
 * when it is opened; its d_ino ``ino`` meanwhile). */
static int add_sub(struct walk *w, struct dir *d, const char *name, size_t len, const struct stat *st, uint64_t ino)
{
    struct dir *sub = new_dir(d->root, d->key, d->key_len, name, len);
    if (!sub)
        return -1;
    sub->rel_off = d->rel_off;
    sub->parent_ino = d->self.ino;
    if (st) {
        fill(&sub->self, st);
    } else {
        sub->undescribed = 1;
        sub->self.mode = S_IFDIR, sub->self.ino = ino, sub->self.dev = d->self.dev;
    }
    pthread_mutex_lock(&w->lock);
    struct dir **p = grown(d->subs, d->nsubs, &d->cap_subs, sizeof *p);
    int err = -1;
    if (p)
        d->subs = p, p[d->nsubs++] = sub, err = add_dir_locked(w, sub);
    else
        free_dir(sub);
    pthread_mutex_unlock(&w->lock);
    return err;
}

/* -- one directory ----------------------------------------------------------------------- */
static int name_cmp(const char *names, const struct ent *x, const struct ent *y)
{
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(names + x->name_off, names + y->name_off, n);
    return c ? c : (int)x->name_len - (int)y->name_len;
}

static int by_name_arg(const void *a, const void *b, void *names)
{
    return name_cmp(names, a, b);
}

static int by_place_name(const void *a, const void *b, void *dir)
{
    const struct dir *d = dir;
    return name_cmp(d->names, &d->ents[*(const uint32_t *)a], &d->ents[*(const uint32_t *)b]);
}

static int by_name_off(const void *a, const void *b)
{
    uint32_t x = ((const struct stated *)a)->name_off, y = ((const struct stated *)b)->name_off;
    return (x > y) - (x < y);
}

static int by_key(const void *a, const void *b)
{
    const struct dir *x = *(struct dir *const *)a, *y = *(struct dir *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* A directory's files' names' common prefix and common suffix (each file's own bytes, its middle,
 * at least one: every name is longer than both), stored once for the directory; none under two
 * files. Its names are in bytewise order: the common prefix is the first's and the last's. */
static void dir_affixes(struct dir *d)
{
    const struct ent *first = NULL, *last = NULL;
    uint32_t shortest = UINT32_MAX, files = 0;
    for (uint32_t i = 0; i < d->n; i++)
        if (d->ents[i].kind == K_FILE || d->ents[i].kind == K_LINKED_FILE) {
            last = &d->ents[i], first = first ? first : last, files++;
            shortest = last->name_len < shortest ? last->name_len : shortest;
        }
    d->prefix = d->suffix = 0;
    if (files < 2)
        return;
    const char *a = d->names + first->name_off, *b = d->names + last->name_off;
    uint32_t p = 0, s = shortest;  /* the suffix: shortened by each name in turn */
    while (p + 1 < shortest && a[p] == b[p])
        p++;
    for (uint32_t i = 0; i < d->n && s; i++) {
        const struct ent *e = &d->ents[i];
        if (e->kind != K_FILE && e->kind != K_LINKED_FILE)
            continue;
        const char *name = d->names + e->name_off;
        uint32_t k = 0;
        while (k < s && name[e->name_len - 1 - k] == a[first->name_len - 1 - k])
            k++;
        s = k;
    }
    if (p + s >= shortest)
        s = shortest - 1 - p;
    d->prefix = (uint16_t)p, d->suffix = (uint16_t)s;
}

static int is_file(const struct ent *e)
{
    return e->kind == K_FILE || e->kind == K_LINKED_FILE;
}

static int by_name_off_arg(const void *a, const void *b, void *ents)
{
    uint32_t x = ((const struct ent *)ents)[*(const uint32_t *)a].name_off;
    uint32_t y = ((const struct ent *)ents)[*(const uint32_t *)b].name_off;
    return (x > y) - (x < y);
}

/* ``d``'s files' names cut to their middles in place, their common prefix and suffix (dir_affixes)
 * stored once after the names (at d->affix_at), its other names whole: until the index is written
 * a listed file costs the walk its ent and its middle, as it will cost the index, not its whole
 * name (a dataset's names share most of their bytes: "n01440764_10026.JPEG"). Moved in the order
 * of their offsets (each to one no later), so the buffer is only shrunk: no new one beside it.
 * d->stated (sorted by offset) follow their names. 0, or -1: no memory. */
static int keep_middles(struct dir *d)
{
    dir_affixes(d);
    uint32_t cut = d->prefix + d->suffix, at = 0, s = 0;
    uint32_t *order = d->n ? malloc(d->n * sizeof *order) : NULL;
    if (d->n && !order)
        return -1;
    char affix[2 * 256];  /* (a name is 255 bytes at most, longer than both) */
    int copied = !cut;
    for (uint32_t i = 0; i < d->n; i++) {
        order[i] = i;
        const struct ent *e = &d->ents[i];
        if (!copied && is_file(e)) {  /* from the first file */
            memcpy(affix, d->names + e->name_off, d->prefix);
            memcpy(affix + d->prefix, d->names + e->name_off + e->name_len - d->suffix, d->suffix);
            copied = 1;
        }
    }
    if (d->n)
        qsort_r(order, d->n, sizeof *order, by_name_off_arg, d->ents);
    for (uint32_t k = 0; k < d->n; k++) {
        struct ent *e = &d->ents[order[k]];
        uint32_t skip = is_file(e) ? d->prefix : 0, len = is_file(e) ? e->name_len - cut : e->name_len;
        memmove(d->names + at, d->names + e->name_off + skip, len);
        while (s < d->nstated && d->stated[s].name_off < e->name_off)
            s++;
        if (s < d->nstated && d->stated[s].name_off == e->name_off)
            d->stated[s++].name_off = at;  /* (new offsets rise as the old ones did: still sorted) */
        e->name_off = at, e->name_len = (uint16_t)len;
        at += len;
    }
    free(order);
    if (at + cut) {  /* shrunk: the names' bytes were at least this many */
        char *names = realloc(d->names, at + cut);
        d->names = names ? names : d->names;
        memcpy(d->names + at, affix, cut);
    }
    d->affix_at = at, d->middles = 1;
    return 0;
}

/* Every slice described: the descriptor closed, the arrays cut to their size, the names sorted (a
 * full walk's stats follow their name), the subdirectories and stat'ed names in look-up order. */
static int finish_dir(struct dir *d)
{
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    if (d->n) {  /* the listing grew them by doubling */
        struct ent *last = &d->ents[d->n - 1];
        char *names = realloc(d->names, (size_t)last->name_off + last->name_len);
        struct ent *ents = realloc(d->ents, d->n * sizeof *ents);
        d->names = names ? names : d->names;
        d->ents = ents ? ents : d->ents;
    }
    if (d->n >= 2 && !d->recs) {
        qsort_r(d->ents, d->n, sizeof *d->ents, by_name_arg, d->names);
    } else if (d->n >= 2) {  /* the stats follow their name: sorted by place */
        uint32_t *place = malloc(d->n * sizeof *place);
        struct ent *ents = malloc(d->n * sizeof *ents);
        struct monarch_index_entry *recs = malloc(d->n * sizeof *recs);
        if (!place || !ents || !recs) {
            free(place), free(ents), free(recs);
            return -1;
        }
        for (uint32_t i = 0; i < d->n; i++)
            place[i] = i;
        qsort_r(place, d->n, sizeof *place, by_place_name, d);
        for (uint32_t i = 0; i < d->n; i++)
            ents[i] = d->ents[place[i]], recs[i] = d->recs[place[i]];
        free(place), free(d->ents), free(d->recs);
        d->ents = ents, d->recs = recs;
    }
    qsort(d->stated, d->nstated, sizeof *d->stated, by_name_off);
    qsort(d->subs, d->nsubs, sizeof *d->subs, by_key);  /* a sub's key is d's and its name: its name's order */
    return keep_middles(d);
}

static int list_dir(struct walk *w, struct dir *d)
{
    int rfd = w->root_fds[d->root];
    const char *rel = d->key + d->rel_off;
    int fd = *rel ? openat(rfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : dup(rfd);
    struct stat st;
    if (fd < 0)
        goto unlisted;
    if (fstat(fd, &st) != 0 || (!d->undescribed && st.st_ino != d->self.ino) ||
        (d->undescribed && !S_ISDIR(st.st_mode)))
        goto unlisted;
    if (d->undescribed) {  /* listing mode: the descriptor's stat is the directory's own */
        fill(&d->self, &st);
        d->undescribed = 0;
    }
    if (!*rel && lseek(fd, 0, SEEK_SET) != 0)  /* a dup shares its offset with the root's descriptor */
        goto unlisted;
    size_t cap = 0, names_cap = 0, names_len = 0;
    char *buf = malloc(DENTS_BUFFER);
    if (!buf)
        goto nomem;
    for (;;) {
        long got = syscall(SYS_getdents64, fd, buf, DENTS_BUFFER);
        if (got < 0) {
            free(buf);
            goto unlisted_entries;
        }
        if (got == 0)
            break;
        for (long off = 0; off < got;) {
            struct linux_dirent64 *de = (struct linux_dirent64 *)(buf + off);
            off += de->d_reclen;
            const char *name = de->d_name;
            if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2])))
                continue;
            size_t len = strlen(name);
            if (d->n == cap) {
                cap = cap ? 2 * cap : 64;
                struct ent *e = realloc(d->ents, cap * sizeof *e);
                if (!e) {
                    free(buf);
                    goto nomem;
                }
                d->ents = e;
            }
            if (names_len + len > names_cap) {
                names_cap = 2 * (names_len + len) + 1024;
                char *p = realloc(d->names, names_cap);
                if (!p) {
                    free(buf);
                    goto nomem;
                }
                d->names = p;
            }
            memcpy(d->names + names_len, name, len);
            d->ents[d->n++] = (struct ent){.d_ino = de->d_ino, .name_off = (uint32_t)names_len,
                                           .name_len = (uint16_t)len, .d_type = de->d_type, .kind = K_FAILED};
            names_len += len;
        }
    }
    free(buf);
    d->fd = fd;
    d->recs = w->describe ? calloc(d->n ? d->n : 1, sizeof *d->recs) : NULL;  /* listing mode: d->stated */
    if (w->describe && !d->recs)
        goto nomem;
    pthread_mutex_lock(&w->lock);
    d->slices_left = d->n ? (int)((d->n + SLICE - 1) / SLICE) : 0;
    int err = 0;
    for (uint32_t lo = SLICE; lo < d->n && !err; lo += SLICE)  /* the first slice is this thread's */
        err = push_locked(w, d, lo, lo + SLICE < d->n ? lo + SLICE : d->n);
    pthread_mutex_unlock(&w->lock);
    return err;

unlisted_entries:  /* the listing failed half-way: nothing of it is described */
    d->n = 0;
unlisted:
    if (fd >= 0)
        close(fd);
    d->unlisted = 1;
    if (d->undescribed) {  /* listing mode, not opened: described by name (a vanished one keeps only its type) */
        if (fstatat(rfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
            fill(&d->self, &st);
        d->undescribed = 0;
    }
    return 0;
nomem:
    if (fd >= 0)
        close(fd);
    d->fd = -1;
    d->n = 0;
    d->unlisted = 1;
    return -1;
}

static int describe(struct walk *w, struct dir *d, uint32_t lo, uint32_t hi)
{
    int failed = 0, err = 0;
    for (uint32_t i = lo; i < hi; i++) {
        struct ent *e = &d->ents[i];
        char name[256 + 1];
        size_t len = e->name_len < 256 ? e->name_len : 256;
        memcpy(name, d->names + e->name_off, len);
        name[len] = 0;
        struct stat st, target;
        if (!w->describe && (e->d_type == DT_REG || e->d_type == DT_DIR)) {  /* listing mode: the name's type is enough */
            e->kind = e->d_type == DT_REG ? K_FILE : K_DIR;  /* a file: no stat (none in d->stated) */
            if (e->kind == K_DIR && (err = add_sub(w, d, name, len, NULL, e->d_ino)))
                break;
            continue;
        }
        if (fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            e->kind = K_FAILED;
            failed = 1;
            continue;
        }
        int linked = S_ISLNK(st.st_mode);
        if (linked) {
            int got = fstatat(d->fd, name, &target, 0) == 0;
            if (!got || !S_ISREG(target.st_mode)) {  /* named only: a link to a directory, a special file, nothing */
                e->kind = got || errno == ENOENT ? K_OTHER : K_FAILED;
                failed |= e->kind == K_FAILED, e->d_type = DT_LNK;
                continue;
            }
        }
        if (S_ISDIR(st.st_mode)) {
            e->kind = K_DIR, e->d_type = DT_DIR;
            if ((err = add_sub(w, d, name, len, &st, 0)))
                break;
        } else if (S_ISREG(st.st_mode) || linked) {  /* its stat in recs or in d->stated, a link's own lstat after */
            size_t apart = (d->recs ? 0 : 1) + (size_t)linked;  /* entries not in recs */
            struct monarch_index_entry *r = apart ? malloc(apart * sizeof *r) : NULL;
            if (apart && !r) {
                err = -1;
                break;
            }
            fill(d->recs ? &d->recs[i] : r, linked ? &target : &st);
            if (linked)
                fill(d->recs ? r : r + 1, &st);
            if (apart && (err = add_stated(w, d, e->name_off, r)))
                break;
            e->kind = linked ? K_LINKED_FILE : K_FILE, e->d_type = linked ? DT_LNK : DT_REG;
        } else {
            e->kind = K_OTHER, e->d_type = d_type_of(st.st_mode);
        }
    }
    pthread_mutex_lock(&w->lock);
    if (failed)
        d->unlisted = 1;
    int last = --d->slices_left == 0;
    pthread_mutex_unlock(&w->lock);
    return last && !err ? finish_dir(d) : err;
}

static void *worker(void *arg)
{
    struct walk *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->ntasks && w->busy && !w->error)
            pthread_cond_wait(&w->more, &w->lock);
        if (!w->ntasks || w->error)
            break;
        struct task t = w->tasks[--w->ntasks];
        w->busy++;
        pthread_mutex_unlock(&w->lock);
        int err;
        if (t.lo == 0 && t.hi == 0) {
            err = list_dir(w, t.d);
            if (!err && !t.d->unlisted && t.d->n)
                err = describe(w, t.d, 0, t.d->n < SLICE ? t.d->n : SLICE);
            else if (!err)
                err = finish_dir(t.d);
        } else {
            err = describe(w, t.d, t.lo, t.hi);
        }
        if (err)
            fail(w);
        pthread_mutex_lock(&w->lock);
        w->busy--;
        if (!w->ntasks && !w->busy)
            pthread_cond_broadcast(&w->more);  /* the walk is over: every waiting thread ends */
    }
    pthread_cond_broadcast(&w->more);
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* ``d``'s names and what it holds per name freed: about the bytes they took. */
static uint64_t drop_names(struct dir *d)
{
    uint64_t bytes = (uint64_t)d->n * ((d->recs ? sizeof *d->recs : 0) + sizeof *d->ents) +
                     (d->n ? d->ents[d->n - 1].name_off + d->ents[d->n - 1].name_len : 0) +
                     d->nstated * (sizeof *d->stated + 2 * sizeof *d->recs);
    for (uint32_t i = 0; i < d->nstated; i++)
        free(d->stated[i].e);
    free(d->recs), free(d->stated), free(d->subs), free(d->spare), free(d->ents), free(d->names);
    d->recs = NULL, d->stated = NULL, d->subs = NULL, d->spare = NULL, d->ents = NULL, d->names = NULL;
    d->n = d->nstated = d->nsubs = 0;
    return bytes;
}

static void free_dir(struct dir *d)
{
    if (d->fd >= 0)
        close(d->fd);
    drop_names(d);
    free(d->key), free(d);
}

EXPORT void walk_free(struct walk *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i])
            free_dir(w->dirs[i]);
    free(w->dirs), free(w->tasks);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->more);
    free(w);
}

/* -- the spare names: listed names that are no entry's key, each stored once --------------- */
struct spares {
    struct spare {
        uint64_t at;    /* its offset among the spare names + 1; 0: an empty slot */
        const char *name;
        uint16_t len;
    } *slots;
    size_t cap, used;
};

static int spare_offset(struct spares *s, const char *name, uint16_t len, uint64_t *size, uint32_t *off)
{
    if (2 * (s->used + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        struct spare *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return -1;
        for (size_t i = 0; i < s->cap; i++)
            if (s->slots[i].at) {
                size_t b = monarch_crc32_update(0, s->slots[i].name, s->slots[i].len) & (cap - 1);
                while (slots[b].at)
                    b = (b + 1) & (cap - 1);
                slots[b] = s->slots[i];
            }
        free(s->slots);
        s->slots = slots, s->cap = cap;
    }
    size_t b = monarch_crc32_update(0, name, len) & (s->cap - 1);
    for (; s->slots[b].at; b = (b + 1) & (s->cap - 1))
        if (s->slots[b].len == len && !memcmp(s->slots[b].name, name, len)) {
            *off = (uint32_t)(s->slots[b].at - 1);
            return 0;
        }
    s->slots[b] = (struct spare){*size + 1, name, len};
    s->used++;
    *off = (uint32_t)*size;
    *size += len;
    return 0;
}

static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

/* -- the walk ---------------------------------------------------------------------------- */
/* Walk the roots (descriptors open on each; ``indexes``: the key prefix k of each; the
 * parent directory's inode of each) with ``threads`` threads, stat'ing every name (``describe``)
 * or in listing mode (the module doc). NULL with errno on failure. */
EXPORT struct walk *walk_run(const int *root_fds, const int *indexes, const uint64_t *parent_inos, int nroots,
                             int threads, int describe)
{
    monarch_crc_init();
    struct spares spares = {0};
    struct walk *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->more, NULL);
    w->root_fds = root_fds;
    w->describe = describe;
    for (int r = 0; r < nroots; r++) {
        char prefix[24];
        int plen = snprintf(prefix, sizeof prefix, "%d/", indexes[r]);
        struct dir *d = new_dir(r, "", 0, prefix, (size_t)plen);
        struct stat st;
        if (!d || fstat(root_fds[r], &st) != 0) {
            int err = d ? errno : ENOMEM;
            if (d)
                free_dir(d);
            walk_free(w);
            errno = err;
            return NULL;
        }
        d->rel_off = (uint32_t)plen;
        fill(&d->self, &st);
        d->parent_ino = parent_inos[r];
        if (add_dir_locked(w, d) != 0)
            goto nomem;
    }
    if (threads < 1)
        threads = 1;
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    int started = 0;
    for (int i = 1; ids && i < threads; i++)
        if (pthread_create(&ids[i], NULL, worker, w) == 0)
            started = i;
        else
            break;
    worker(w);
    for (int i = 1; ids && i <= started; i++)
        pthread_join(ids[i], NULL);
    free(ids);
    if (w->error)
        goto nomem;
    free(w->tasks);
    w->tasks = NULL;

    /* the layout: directories by key, each one's files by name (numbered in that order) */
    qsort(w->dirs, w->ndirs, sizeof *w->dirs, by_key);
    uint64_t nfiles = 0, nlinked = 0, names = 0, dir_keys = 0, children = 0, listed = 0, first_ino = 0;
    int one_ino = 1;  /* every file listed with the same d_ino (a FUSE filesystem's unknown one): stored once */
    for (size_t j = 0; j < w->ndirs; j++) {
        struct dir *d = w->dirs[j];
        uint32_t files = 0, others = 0;
        if (!d->middles && keep_middles(d) != 0)  /* (every finished directory has them already) */
            goto nomem;
        d->affix_off = w->affix_size;
        w->affix_size += d->prefix + d->suffix;
        for (uint32_t i = 0; i < d->n; i++) {
            struct ent *e = &d->ents[i];
            if (e->kind == K_FILE || e->kind == K_LINKED_FILE) {
                uint64_t ino = d->unlisted ? 0 : e->d_ino;
                if (!nfiles && !files)
                    first_ino = ino;
                one_ino &= ino == first_ino;
                files++, names += e->name_len, nlinked += e->kind == K_LINKED_FILE;
            } else
                others += e->kind != K_DIR;
        }
        nfiles += files;
        w->described += d->recs ? files : d->nstated;
        d->number = (uint32_t)j;
        d->key_off = dir_keys;
        dir_keys += d->key_len;
        if (d->unlisted)
            continue;
        children += 2 + d->n - files;
        listed++;
        /* its other names' offsets among the spare names, each stored once, in child record order */
        if (others && !(d->spare = malloc(others * sizeof *d->spare)))
            goto nomem;
        for (uint32_t i = 0, k = 0; i < d->n; i++) {
            struct ent *e = &d->ents[i];
            if (e->kind != K_FILE && e->kind != K_LINKED_FILE && e->kind != K_DIR &&
                spare_offset(&spares, d->names + e->name_off, e->name_len, &w->spare_size, &d->spare[k++]))
                goto nomem;
        }
    }
    free(spares.slots);
    if (names > UINT32_MAX || nfiles + w->ndirs + nlinked >= UINT32_MAX
        || nfiles * (1 + MONARCH_INDEX_SHORT_ROOM) >= MONARCH_INDEX_DESCRIBING) {  /* past the format's u32 fields */
        walk_free(w);
        errno = EOVERFLOW;
        return NULL;
    }
    w->nfiles = nfiles;
    w->nlinked = nlinked;
    w->total = nfiles + w->ndirs + nlinked;
    /* 3/2 of the directories (only they are keyed: a file is found in its directory's range),
     * rounded up to 16 (the tables after them start on 64 bytes); index_layout.py's bucket_count */
    w->nbuckets = (3 * w->ndirs + 31) / 32 * 16;
    if (w->nbuckets < 16)
        w->nbuckets = 16;
    w->names_size = names;
    w->keys_size = names + dir_keys + w->spare_size + w->affix_size;
    w->nchildren = children;
    /* header, buckets, file records, ranges, inodes, fixed entries (directories, link records),
     * keys, children, shapes, short words, stats */
    w->files_off = MONARCH_INDEX_HEADER_SIZE + 4 * w->nbuckets;
    w->ranges_off = w->files_off + MONARCH_INDEX_FILE_SIZE * nfiles;
    w->affixes_off = pad8(w->ranges_off + 4 * (w->ndirs + 1));
    w->entries_off = w->affixes_off + sizeof(struct monarch_index_affix) * w->ndirs;
    w->one_ino = nfiles && one_ino;
    if (listed)  /* the inodes: only a listing has them */
        w->inos_off = w->entries_off, w->entries_off += 8 * (w->one_ino ? 1 : nfiles);
    w->keys_off = w->entries_off + MONARCH_INDEX_ENTRY_SIZE * (w->ndirs + nlinked);
    w->children_off = pad8(w->keys_off + w->keys_size);
    w->shapes_off = pad8(w->children_off + MONARCH_INDEX_CHILD_SIZE * children);
    w->stats_off = w->shapes_off + MONARCH_INDEX_ENTRY_SIZE * w->ndirs + 8 * MONARCH_INDEX_SHORT_ROOM * nfiles;
    w->size = w->stats_off + MONARCH_INDEX_ENTRY_SIZE * nfiles;
    return w;
nomem:
    free(spares.slots);
    walk_free(w);
    errno = ENOMEM;
    return NULL;
}

#include "index_build.c" /* the index written from the walk */
#include "index_fill.c" /* the routes published and the listed files described, in an index */
