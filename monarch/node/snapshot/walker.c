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
 * Memory: a file costs its name, a 32-byte listing record and a pointer while the walk runs, and
 * a described one its future stat (112 bytes: an array per directory in a full walk, one
 * allocation each in listing mode, where few are); walk_build writes the index into the caller's
 * buffer one directory at a time and frees each directory as it goes, so the peak is about one
 * index's size, not two (the buffer comes unwritten, its stats' room zeroed: its pages are touched
 * only as the index fills them, the stats' room unused never).
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

struct dir;

/* One name of a listed directory. */
struct ent {
    uint64_t d_ino;
    uint32_t name_off;  /* in the directory's names */
    uint16_t name_len;
    uint8_t d_type;     /* as the listing gives it (DT_REG for a file, DT_LNK for a linked one, ...) */
    uint8_t kind;
    uint32_t number;    /* K_FILE, K_LINKED_FILE: file number; K_OTHER: its name's offset among the spare names */
    uint32_t spare_new; /* K_OTHER: 1 if this is the first time the name is seen (its bytes are written here) */
    struct dir *sub;    /* K_DIR: the subdirectory */
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
    /* a file's stat and a linked file's own lstat (stat_of, own_of): a full walk's stats in ``recs``,
     * per name, and each linked file's own lstat alone in ``links``; a listing walk (recs NULL): in
     * ``links``, a described file's stat, then a linked file's own lstat (NULL: not described) */
    struct monarch_index_entry *recs;
    struct monarch_index_entry **links;
    int slices_left;    /* guarded by the walk's lock */
    uint32_t number;    /* its entry number in the index (from 0) */
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
    uint64_t nfiles, nlinked, total, nbuckets, keys_size, nchildren, spare_size, size;
    uint64_t files_off, entries_off, keys_off, children_off, stats_off;
    uint64_t described;  /* files stat'ed by the walk (in listing mode: links, names of unknown type) */
};

static void fill(struct monarch_index_entry *e, const struct stat *st)
{
    memset(e, 0, sizeof *e);
    monarch_index_stat_fields(e, st);
}

/* Name i's file stat (K_FILE, K_LINKED_FILE), or NULL if a listing walk did not take it. */
static struct monarch_index_entry *stat_of(const struct dir *d, uint32_t i)
{
    return d->recs ? &d->recs[i] : d->links[i];
}

/* Name i's own lstat (K_LINKED_FILE). */
static struct monarch_index_entry *own_of(const struct dir *d, uint32_t i)
{
    return d->recs ? d->links[i] : d->links[i] + 1;
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

static int add_dir_locked(struct walk *w, struct dir *d)
{
    if (w->ndirs == w->cap_dirs) {
        size_t cap = w->cap_dirs ? 2 * w->cap_dirs : 256;
        struct dir **p = realloc(w->dirs, cap * sizeof *p);
        if (!p)
            return -1;
        w->dirs = p;
        w->cap_dirs = cap;
    }
    w->dirs[w->ndirs++] = d;
    return push_locked(w, d, 0, 0);
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

/* -- one directory ----------------------------------------------------------------------- */
static int by_name_arg(const void *a, const void *b, void *names)
{
    const struct ent *x = a, *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp((char *)names + x->name_off, (char *)names + y->name_off, n);
    return c ? c : (int)x->name_len - (int)y->name_len;
}

/* Every slice described: the listing sorted, the descriptor closed. */
static void finish_dir(struct dir *d)
{
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    if (d->n < 2)
        return;
    /* sort the names; the per-name arrays follow their name */
    struct ent *ents = malloc(d->n * sizeof *ents);
    struct monarch_index_entry *recs = d->recs ? malloc(d->n * sizeof *recs) : NULL;
    struct monarch_index_entry **links = malloc(d->n * sizeof *links);
    if (!ents || (d->recs && !recs) || !links) {  /* cannot sort: keep it unlisted (correct, slower) */
        free(ents), free(recs), free(links);
        d->unlisted = 1;
        return;
    }
    for (uint32_t i = 0; i < d->n; i++)
        d->ents[i].number = i;  /* its place before the sort */
    qsort_r(d->ents, d->n, sizeof *d->ents, by_name_arg, d->names);
    for (uint32_t i = 0; i < d->n; i++) {
        uint32_t from = d->ents[i].number;
        ents[i] = d->ents[i];
        if (recs)
            recs[i] = d->recs[from];
        links[i] = d->links[from];
    }
    free(d->ents), free(d->recs), free(d->links);
    d->ents = ents, d->recs = recs, d->links = links;
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
    d->recs = w->describe ? calloc(d->n ? d->n : 1, sizeof *d->recs) : NULL;  /* listing mode: stat_of */
    d->links = calloc(d->n ? d->n : 1, sizeof *d->links);
    if ((w->describe && !d->recs) || !d->links)
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
            if (e->d_type == DT_REG) {
                e->kind = K_FILE;  /* no stat: links[i] stays NULL */
                continue;
            }
            struct dir *sub = new_dir(d->root, d->key, d->key_len, name, len);
            if (!sub) {
                err = -1;
                break;
            }
            sub->rel_off = d->rel_off;
            sub->undescribed = 1;
            sub->self.mode = S_IFDIR;
            sub->self.ino = e->d_ino;
            sub->self.dev = d->self.dev;
            sub->parent_ino = d->self.ino;
            e->kind = K_DIR, e->sub = sub;
            pthread_mutex_lock(&w->lock);
            err = add_dir_locked(w, sub);
            pthread_mutex_unlock(&w->lock);
            if (err)
                break;
            continue;
        }
        if (fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            e->kind = K_FAILED;
            failed = 1;
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            struct dir *sub = new_dir(d->root, d->key, d->key_len, name, len);
            if (!sub) {
                err = -1;
                break;
            }
            sub->rel_off = d->rel_off;
            fill(&sub->self, &st);
            sub->parent_ino = d->self.ino;
            e->kind = K_DIR, e->d_type = DT_DIR, e->sub = sub;
            pthread_mutex_lock(&w->lock);
            err = add_dir_locked(w, sub);
            pthread_mutex_unlock(&w->lock);
            if (err)
                break;
        } else if (S_ISREG(st.st_mode)) {
            struct monarch_index_entry *r = d->recs ? &d->recs[i] : (d->links[i] = malloc(sizeof *r));
            if (!r) {
                err = -1;
                break;
            }
            fill(r, &st);
            e->kind = K_FILE, e->d_type = DT_REG;
        } else if (S_ISLNK(st.st_mode)) {
            if (fstatat(d->fd, name, &target, 0) == 0) {
                if (S_ISREG(target.st_mode)) {
                    if (!(d->links[i] = malloc((d->recs ? 1 : 2) * sizeof *d->links[i]))) {
                        err = -1;
                        break;
                    }
                    fill(stat_of(d, i), &target);
                    fill(own_of(d, i), &st);
                    e->kind = K_LINKED_FILE;
                } else {
                    e->kind = K_OTHER;  /* a link to a directory or a special file: named only */
                }
                e->d_type = DT_LNK;
            } else if (errno == ENOENT) {
                e->kind = K_OTHER, e->d_type = DT_LNK;  /* broken */
            } else {
                e->kind = K_FAILED;
                failed = 1;
            }
        } else {
            e->kind = K_OTHER, e->d_type = d_type_of(st.st_mode);
        }
    }
    pthread_mutex_lock(&w->lock);
    if (failed)
        d->unlisted = 1;
    int last = --d->slices_left == 0;
    pthread_mutex_unlock(&w->lock);
    if (last)
        finish_dir(d);
    return err;
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
                finish_dir(t.d);
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

static void free_dir(struct dir *d)
{
    if (d->fd >= 0)
        close(d->fd);
    if (d->links)
        for (uint32_t i = 0; i < d->n; i++)
            free(d->links[i]);
    free(d->links), free(d->recs), free(d->ents), free(d->names), free(d->key), free(d);
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

static int by_key(const void *a, const void *b)
{
    const struct dir *x = *(struct dir *const *)a, *y = *(struct dir *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* -- the spare names: listed names that are no entry's key, each stored once --------------- */
struct spares {
    uint64_t *slots;  /* (offset + 1) into the spare blob per slot, 0 empty */
    const char **names;
    uint16_t *lens;
    size_t cap, used;
};

static int spare_offset(struct spares *s, const char *name, uint16_t len, uint64_t *size, uint32_t *off, int *is_new)
{
    if (2 * (s->used + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        struct spares grown = {calloc(cap, sizeof *s->slots), calloc(cap, sizeof *s->names),
                               calloc(cap, sizeof *s->lens), cap, s->used};
        if (!grown.slots || !grown.names || !grown.lens) {
            free(grown.slots), free(grown.names), free(grown.lens);
            return -1;
        }
        for (size_t i = 0; i < s->cap; i++)
            if (s->slots[i]) {
                size_t b = monarch_crc32_update(0, s->names[i], s->lens[i]) & (cap - 1);
                while (grown.slots[b])
                    b = (b + 1) & (cap - 1);
                grown.slots[b] = s->slots[i], grown.names[b] = s->names[i], grown.lens[b] = s->lens[i];
            }
        free(s->slots), free(s->names), free(s->lens);
        *s = grown;
    }
    size_t b = monarch_crc32_update(0, name, len) & (s->cap - 1);
    while (s->slots[b]) {
        if (s->lens[b] == len && !memcmp(s->names[b], name, len)) {
            *off = (uint32_t)(s->slots[b] - 1);
            *is_new = 0;
            return 0;
        }
        b = (b + 1) & (s->cap - 1);
    }
    s->slots[b] = *size + 1, s->names[b] = name, s->lens[b] = len;
    s->used++;
    *off = (uint32_t)*size;
    *is_new = 1;
    *size += len;
    return 0;
}

/* -- the walk ---------------------------------------------------------------------------- */
/* Walk the roots (descriptors open on each; ``indexes``: the key prefix k of each; the
 * parent directory's inode of each) with ``threads`` threads, stat'ing every name (``describe``)
 * or in listing mode (the module doc). NULL with errno on failure. */
EXPORT struct walk *walk_run(const int *root_fds, const int *indexes, const uint64_t *parent_inos, int nroots,
                             int threads, int describe)
{
    monarch_crc_init();
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
        if (add_dir_locked(w, d) != 0) {
            free_dir(d);
            walk_free(w);
            errno = ENOMEM;
            return NULL;
        }
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
    if (w->error) {
        walk_free(w);
        errno = ENOMEM;
        return NULL;
    }
    free(w->tasks);
    w->tasks = NULL;

    /* the layout: directories by key, each one's files by name */
    qsort(w->dirs, w->ndirs, sizeof *w->dirs, by_key);
    struct spares spares = {0};
    uint64_t nfiles = 0, nlinked = 0, keys = 0, children = 0;
    for (size_t j = 0; j < w->ndirs; j++) {
        struct dir *d = w->dirs[j];
        uint32_t prefix = d->key_len + (d->key[d->key_len - 1] != '/');
        for (uint32_t i = 0; i < d->n; i++) {
            struct ent *e = &d->ents[i];
            if (e->kind == K_FILE || e->kind == K_LINKED_FILE) {
                w->described += stat_of(d, i) != NULL;
                e->number = (uint32_t)nfiles++;
                keys += prefix + e->name_len;
                nlinked += e->kind == K_LINKED_FILE;
            }
        }
        keys += d->key_len;
        if (!d->unlisted)
            children += 2 + d->n;
    }
    for (size_t j = 0; j < w->ndirs; j++) {
        struct dir *d = w->dirs[j];
        d->number = (uint32_t)(nfiles + j);
        if (d->unlisted)
            continue;
        for (uint32_t i = 0; i < d->n; i++) {
            struct ent *e = &d->ents[i];
            int is_new = 0;
            if (e->kind == K_OTHER) {
                if (spare_offset(&spares, d->names + e->name_off, e->name_len, &w->spare_size, &e->number, &is_new)) {
                    free(spares.slots), free(spares.names), free(spares.lens);
                    walk_free(w);
                    errno = ENOMEM;
                    return NULL;
                }
                e->spare_new = (uint32_t)is_new;
            }
        }
    }
    free(spares.slots), free(spares.names), free(spares.lens);
    w->nfiles = nfiles;
    w->nlinked = nlinked;
    w->total = nfiles + w->ndirs + nlinked;
    w->nbuckets = 16;
    while (w->nbuckets < 2 * w->total)
        w->nbuckets *= 2;
    w->keys_size = keys + w->spare_size;
    w->nchildren = children;
    /* header, buckets, file records, fixed entries (directories, link records), keys, children, stats */
    w->files_off = MONARCH_INDEX_HEADER_SIZE + 4 * w->nbuckets;
    w->entries_off = w->files_off + MONARCH_INDEX_FILE_SIZE * nfiles;
    w->keys_off = w->entries_off + MONARCH_INDEX_ENTRY_SIZE * (w->ndirs + nlinked);
    w->children_off = w->keys_off + w->keys_size;
    w->children_off += (8 - w->children_off % 8) % 8;
    w->stats_off = w->children_off + MONARCH_INDEX_CHILD_SIZE * children;
    w->stats_off += (8 - w->stats_off % 8) % 8;
    w->size = w->stats_off + MONARCH_INDEX_ENTRY_SIZE * nfiles;
    return w;
}

EXPORT uint64_t walk_index_size(struct walk *w) { return w->size; }

EXPORT void walk_counts(struct walk *w, uint64_t *out)
{
    out[0] = w->nfiles;
    out[1] = w->ndirs;
    out[2] = w->nlinked;
}

static void place(uint32_t *buckets, uint64_t mask, uint32_t hash, uint32_t number)
{
    uint64_t b = hash & mask;
    while (buckets[b])
        b = (b + 1) & mask;
    buckets[b] = number + 1;
}

/* Write the index into ``out`` (walk_index_size bytes: any content but the stats' room, which comes
 * zeroed): every byte but the stats slots no file takes is written, the scattered parts zeroed
 * first, the rest in the order it fills, so that its pages are touched only as the walk's records
 * are freed and the unused stats' pages never; each directory's records freed once written (the
 * walk can only be freed after). The files the walk described take slots 1.. in their order. */
EXPORT int walk_build(struct walk *w, unsigned char *out, uint64_t size)
{
    if (size != w->size)
        return -1;
    uint64_t mask = w->nbuckets - 1, items = w->nfiles + w->ndirs;
    uint32_t *buckets = (uint32_t *)(out + MONARCH_INDEX_HEADER_SIZE);
    struct monarch_index_file *files = (struct monarch_index_file *)(out + w->files_off);
    struct monarch_index_entry *fixed = (struct monarch_index_entry *)(out + w->entries_off);  /* number m: m - files - 1 */
    struct monarch_index_entry *stats = (struct monarch_index_entry *)(out + w->stats_off);
    char *keys = (char *)(out + w->keys_off);
    struct monarch_index_child *child = (struct monarch_index_child *)(out + w->children_off);
    uint64_t file_keys = 0, dir_keys = 0, spare_base = 0, linked = 0, nchild = 0;
    uint32_t slots = 0;                /* stats slots taken */
    uint64_t freed = 0;                /* bytes of records freed since the last trim */
    memset(out, 0, MONARCH_INDEX_HEADER_SIZE + 4 * w->nbuckets);  /* the header, the buckets (placed at random) */
    for (size_t j = 0; j < w->ndirs; j++) {
        struct dir *d = w->dirs[j];
        for (uint32_t i = 0; i < d->n; i++)
            if (d->ents[i].kind == K_FILE || d->ents[i].kind == K_LINKED_FILE)
                dir_keys += d->key_len + (d->key[d->key_len - 1] != '/') + d->ents[i].name_len;
    }
    spare_base = dir_keys;  /* dir keys start after every file key; spare names after every key */
    for (size_t j = 0; j < w->ndirs; j++)
        spare_base += w->dirs[j]->key_len;
    memset(keys + spare_base, 0, (size_t)(w->children_off - w->keys_off - spare_base));  /* spare names, padding */
    memset(child + w->nchildren, 0, (size_t)(w->stats_off - w->children_off - MONARCH_INDEX_CHILD_SIZE * w->nchildren));

    for (size_t j = 0; j < w->ndirs; j++) {
        struct dir *d = w->dirs[j];
        int slash = d->key[d->key_len - 1] != '/';
        uint32_t prefix = d->key_len + (uint32_t)slash;
        uint32_t dir_hash = monarch_crc32_update(0xFFFFFFFFu, d->key, d->key_len) ^ 0xFFFFFFFFu;
        uint32_t prefix_hash = monarch_crc32_update(0xFFFFFFFFu, d->key, d->key_len);
        if (slash)
            prefix_hash = monarch_crc32_update(prefix_hash, "/", 1);
        /* its files: key, record, stat if described, bucket */
        for (uint32_t i = 0; i < d->n; i++) {
            struct ent *e = &d->ents[i];
            if (e->kind != K_FILE && e->kind != K_LINKED_FILE)
                continue;
            char *k = keys + file_keys;
            memcpy(k, d->key, d->key_len);
            if (slash)
                k[d->key_len] = '/';
            memcpy(k + prefix, d->names + e->name_off, e->name_len);
            const struct monarch_index_entry *st = stat_of(d, i);
            struct monarch_index_file *r = &files[e->number];
            *r = (struct monarch_index_file){
                .hash = monarch_crc32_update(prefix_hash, d->names + e->name_off, e->name_len) ^ 0xFFFFFFFFu,
                .key_len = prefix + e->name_len, .key_off = file_keys, .size = st ? st->size : 0};
            if (st) {
                struct monarch_index_entry *s = &stats[slots];
                *s = *st;
                s->hash = r->hash, s->key_len = r->key_len, s->key_off = r->key_off;
                s->flags = 0, s->link = 0, s->nchildren = 0;
                s->children = e->number + 1;
                if (e->kind == K_LINKED_FILE) {
                    s->flags = MONARCH_INDEX_FLAG_SYMLINK;
                    s->link = (uint32_t)(items + linked + 1);
                }
                r->stat = ++slots;
            }
            if (e->kind == K_LINKED_FILE) {  /* its own lstat, after the directories */
                struct monarch_index_entry *l = &fixed[w->ndirs + linked];
                *l = *own_of(d, i);
                l->hash = r->hash, l->key_len = r->key_len, l->key_off = r->key_off;
                linked++;
            }
            place(buckets, mask, r->hash, e->number);
            file_keys += r->key_len;
        }
        /* its own key and record (its bucket comes after every file's: the dirs' pass below) */
        struct monarch_index_entry *r = &fixed[j];
        *r = d->self;
        r->hash = dir_hash;
        r->key_len = d->key_len;
        r->key_off = dir_keys;
        memcpy(keys + dir_keys, d->key, d->key_len);
        dir_keys += d->key_len;
        r->children = nchild;
        if (!d->unlisted) {
            r->flags = MONARCH_INDEX_FLAG_LISTED;
            child[nchild++] = (struct monarch_index_child){.d_ino = d->self.ino, .d_type = DT_DIR};
            child[nchild++] = (struct monarch_index_child){.d_ino = d->parent_ino, .d_type = DT_DIR};
            for (uint32_t i = 0; i < d->n; i++) {
                struct ent *e = &d->ents[i];
                struct monarch_index_child *c = &child[nchild++];
                *c = (struct monarch_index_child){.d_ino = e->d_ino, .name_len = e->name_len, .d_type = e->d_type};
                if (e->kind == K_FILE || e->kind == K_LINKED_FILE) {
                    c->name_off = files[e->number].key_off + prefix;
                    c->entry = e->number + 1;
                } else if (e->kind == K_DIR) {
                    c->name_off = UINT64_MAX;  /* the subdirectory's key offset, once written (below) */
                    c->entry = e->sub->number + 1;
                } else {
                    c->name_off = spare_base + e->number;
                    if (e->spare_new)
                        memcpy(keys + spare_base + e->number, d->names + e->name_off, e->name_len);
                }
            }
        }
        r->nchildren = (uint32_t)(nchild - r->children);
        /* what only the index needs from here on is kept; the rest goes now (the peak stays one index) */
        freed += (uint64_t)d->n * ((d->recs ? sizeof *d->recs : 0) + sizeof *d->links + sizeof *d->ents);
        for (uint32_t i = 0; i < d->n; i++) {
            freed += d->links[i] ? sizeof *d->links[i] : 0;
            free(d->links[i]);
            d->links[i] = NULL;
        }
        free(d->recs), free(d->links), free(d->ents), free(d->names);  /* (a parent needs only its subdirectory's number) */
        d->recs = NULL, d->links = NULL, d->ents = NULL, d->names = NULL;
        d->n = 0;
        if (freed >= TRIM_BYTES) {     /* given back as the index takes its place: the peak stays the index */
            malloc_trim(0);
            freed = 0;
        }
    }
    /* the directories' buckets, after every file's (the Python builder's order), and their
     * children's name offsets (a subdirectory's key is written when its own turn comes) */
    for (size_t j = 0; j < w->ndirs; j++)
        place(buckets, mask, fixed[j].hash, w->dirs[j]->number);
    for (uint64_t c = 0; c < nchild; c++)
        if (child[c].name_off == UINT64_MAX) {
            struct monarch_index_entry *sub = &fixed[child[c].entry - 1 - w->nfiles];
            child[c].name_off = sub->key_off + sub->key_len - child[c].name_len;
        }
    struct monarch_index_header *h = (struct monarch_index_header *)out;
    h->magic = MONARCH_INDEX_MAGIC;
    h->version = MONARCH_INDEX_VERSION;
    h->entries = (uint32_t)w->total;
    h->buckets = (uint32_t)w->nbuckets;
    h->reserved = !w->describe && !w->described ? MONARCH_INDEX_LISTING : 0;  /* every file undescribed */
    h->buckets_off = MONARCH_INDEX_HEADER_SIZE;
    h->entries_off = w->entries_off;
    h->keys_off = w->keys_off;
    h->keys_size = w->keys_size;
    h->children_off = w->children_off;
    h->children_count = nchild;
    h->files = (uint32_t)w->nfiles;
    h->stats_used = slots;
    h->files_off = w->files_off;
    h->stats_off = w->stats_off;
    h->size = w->size;
    return 0;
}

#include "index_fill.c" /* the routes published and the listed files described, in an index */
