/* shim_zpool.h -- what shim_zpool.c (the memfds that compressed hits are decoded into, reused
 * once nothing holds them) gives the shim's other parts; the pool is its own. Part of
 * monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_ZPOOL_H
#define MONARCH_SHIM_ZPOOL_H

/* ---- what the other parts call ---- */
static int monarch_zpool_decode(const void *src, size_t fsize, uint64_t size, const void *ddict, int flags,
                                int *frame_bad, int *reused);
static void monarch_zpool_release_fd(int fd);
static void monarch_zpool_release_range(unsigned first, unsigned last);
static void monarch_zpool_atfork_child(void);

#endif /* MONARCH_SHIM_ZPOOL_H */
