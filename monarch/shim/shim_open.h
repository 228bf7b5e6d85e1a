/* shim_open.h -- what shim_open.c (the open decision (probe, ask, or the PFS) and the
 * invalidation before a write) gives the shim's other parts. Part of monarch_shim.c's one
 * translation unit. */
#ifndef MONARCH_SHIM_OPEN_H
#define MONARCH_SHIM_OPEN_H

/* open flags that may change the file: the ones a staged copy would miss. */
#define MONARCH_WRITES(flags) (((flags) & O_ACCMODE) != O_RDONLY || ((flags) & (O_CREAT | O_TRUNC)))

/* ---- what the other parts call ---- */
static inline int monarch_start(void);
static int monarch_before(int dirfd, const char *path, int flags, int *fdp, uint32_t *entryp);
static inline void monarch_after(int fd, int how);
static void monarch_invalidate(int dirfd, const char *path);
static void monarch_invalidate_fd(int fd);
static void monarch_invalidate2(int d1, const char *p1, int d2, const char *p2);
static int monarch_fopen_flags(const char *mode);

#endif /* MONARCH_SHIM_OPEN_H */
