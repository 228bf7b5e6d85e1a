/* shim_writeback.h -- what shim_writeback.c (a job's calls under the write-back paths, answered
 * from the daemon's view of them) gives the shim's other parts. Part of monarch_shim.c's one
 * translation unit. */
#ifndef MONARCH_SHIM_WRITEBACK_H
#define MONARCH_SHIM_WRITEBACK_H

#define MONARCH_MAX_WB 8       /* write-back paths */
#define MONARCH_WB_NOT_OURS (-2) /* a call not under a write-back path: the caller goes on as before */

/* Under a write-back path, the path the job's view gives replaces `path` (an absolute one: dirfd
 * no longer matters), or the call fails as the view says (the stat, access and opendir wrappers);
 * `mode` (or NULL): a pending file's mode, to show in its stat (its copy's is 0600). */
#define MONARCH_WB_VIEW(dirfd, path, list, fail, mode)                    \
    if (MONARCH_UNLIKELY(monarch_nwb)) {                                  \
        int wbe_;                                                         \
        const char *wbp_ = monarch_wb_view(dirfd, path, list, &wbe_, mode); \
        if (wbe_) {                                                       \
            errno = wbe_;                                                 \
            return fail;                                                  \
        }                                                                 \
        if (wbp_)                                                         \
            path = wbp_;                                                  \
    }

/* A call the view sent to a pending file's local copy (path is not the job's wbpath) that found
 * nothing: the file was published meanwhile (its copy removed), so the view is asked again. */
#define MONARCH_WB_AGAIN(r, path, wbpath, tries, again, reset)            \
    if (MONARCH_UNLIKELY(r == -1 && errno == ENOENT && path != wbpath && strcmp(path, wbpath) != 0 \
                         && ++tries < 3)) {                               \
        path = wbpath;                                                    \
        reset;                                                            \
        goto again;                                                       \
    }

/* A call that changes the namespace (rename, unlink, mkdir ...): `wb` makes it in the daemon's
 * view when its path is under a write-back path, and the wrapper returns its result. */
#define MONARCH_WB_CHANGE(wb)                                             \
    if (MONARCH_UNLIKELY(monarch_nwb)) {                                  \
        int wb_ = (wb);                                                   \
        if (wb_ != MONARCH_WB_NOT_OURS)                                   \
            return wb_;                                                   \
    }

/* ---- the state it shares: how many write-back paths (0: none, every hook returns at once) ---- */
static unsigned monarch_nwb;

/* ---- what the other parts call ---- */
static void monarch_wb_parse(const char *env);
static int monarch_wb_open(int dirfd, const char *path, int flags, mode_t mode, int *fdp);
static const char *monarch_wb_view(int dirfd, const char *path, int list, int *err, int *mode);
static void monarch_wb_map_marks(const char *path); /* MONARCH_WRITEBACK_MARKS, at the start */
static void monarch_wb_parse_door(const char *path); /* MONARCH_WRITEBACK_SOCKET, at the start */
static void monarch_wb_thread_exit(void);            /* this thread's connection to it closed */
static void monarch_wb_atfork_child(void);           /* the forking thread's copy closed in the child */
static int monarch_wb_rename(int od, const char *o, int nd, const char *n, unsigned flags);
static int monarch_wb_unlink(int dirfd, const char *path, int flags);
static int monarch_wb_mkdir(int dirfd, const char *path, mode_t mode);
static int monarch_wb_creat(const char *path, mode_t mode);
static int monarch_wb_remove(const char *path);
static int monarch_wb_fopen(const char *path, const char *mode, FILE **fpp);
static uint32_t monarch_wb_closing(int fd);
static void monarch_wb_closed(uint32_t seq);
static int monarch_wb_sync(int fd);
static int monarch_wb_settle(int d1, const char **p1, int d2, const char *p2, long kind, mode_t mode);
static void monarch_wb_mapped(int fd, void *p, size_t len, int flags);
static void monarch_wb_unmapped(void *addr, size_t len);
static uint64_t monarch_wb_writing(int fd, size_t n);
static void monarch_wb_mode_stat(struct stat *st, int mode);
static void monarch_wb_mode_stat64(struct stat64 *st, int mode);
static void monarch_wb_mode_statx(struct statx *st, int mode);
static void monarch_wb_wrote(int fd, uint64_t t0);
static void monarch_wb_dup(int oldfd, int newfd);

#endif /* MONARCH_SHIM_WRITEBACK_H */
