/* door_sources.h -- what door_sources.c gives the door's other parts: the dataset's source
 * directories the door's copies open files in, kept open (O_PATH) by their number in the index,
 * shared by every thread (d->sources). Part of front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_SOURCES_H
#define MONARCH_DOOR_SOURCES_H

#define SOURCES_MAX 32768              /* directories kept at most (fewer where the descriptor limit is low) */
#define SOURCES_ROOTS 64               /* MAX_ROOTS (door.h) */
#define SOURCES_WARMERS 2              /* threads opening the index's directories beside the job */
struct door_sources {                  /* insert-only until the door stops: a descriptor handed out stays open */
    pthread_mutex_t mu;                /* the table below (not d->mu: a copy's open holds neither) */
    uint32_t *dir;                     /* open addressing by directory number (0: empty slot) */
    int32_t *fd;                       /* its O_PATH descriptor, or -1: not the snapshot's (opened by path) */
    uint8_t *fresh;                    /* an open in it leaves the file's attributes fresh (source_stat) */
    int root[SOURCES_ROOTS];           /* each root, O_PATH: directories are opened in it (no look-up above it), or -1 */
    uint32_t slots, n, limit;          /* slots: a power of two, at least 2 x limit; limit 0: none kept */
    pthread_t warmers[SOURCES_WARMERS];
    int nwarmers;                      /* started at the first miss after front_door_keep_sources, joined by
                                        * sources_close */
    int warm;                          /* 1: Python wants them (the door copies from the PFS), 2: asked (atomic) */
    uint32_t next_dir;                 /* the warmers' next directory of the index (atomic) */
    int stop;                          /* the door stops: the warmers end (atomic) */
};

struct statx_ts { int64_t sec; uint32_t nsec; int32_t reserved; };
struct statx_buf {                     /* the kernel's struct statx (the fields read here) */
    uint32_t mask, blksize;
    uint64_t attributes;
    uint32_t nlink, uid, gid;
    uint16_t mode, spare0;
    uint64_t ino, size, blocks, attributes_mask;
    struct statx_ts atime, btime, ctime, mtime;
    uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
    uint64_t spare[14];
};
_Static_assert(offsetof(struct statx_buf, mode) == 28 && offsetof(struct statx_buf, mtime) == 112, "struct statx");
#define STATX_WANTED 0x343u            /* TYPE | MODE | MTIME | INO | SIZE */
#define STATX_BASIC 0x7ffu             /* STATX_BASIC_STATS: what a describing needs */
#define STATX_DONT_SYNC 0x4000         /* AT_STATX_DONT_SYNC */

/* -- what the other parts call ---------------------------------------------------------- */
static void sources_init(struct door *d);             /* at start: the limit, from the descriptor limit */
/* the source directory of file ``n`` (``key``'s first ``dlen`` bytes name it, as source_path reads
 * them), kept open: its descriptor (never closed by the caller) and *fresh, or -1 (open by path) */
static int sources_dir(struct door *d, uint32_t n, const char *key, uint32_t dlen, int *fresh);
static void sources_want_warm(struct door *d);        /* the index's directories opened beside the job from its first miss */
static void sources_close(struct door *d);            /* the warmers joined, every descriptor closed, freed */
/* the PFS path of directory ``key`` (its first ``dlen`` bytes), then ``name`` in it when given: its root, or -1 */
static long source_path(struct door *d, const char *key, uint32_t dlen, const char *name, char *path);
/* ``key``'s source (file ``n``, 0: unknown) opened as ``flags``: its descriptor, or -1 */
static int open_source(struct worker *w, const char *key, uint32_t dlen, const char *name, uint32_t n, int flags,
                       int in_order);
/* a just-opened source's stat, from the client's cache where its open refreshed it (``fresh``) */
static int source_stat(int fd, int fresh, unsigned want, struct stat *st);

#endif /* MONARCH_DOOR_SOURCES_H */
