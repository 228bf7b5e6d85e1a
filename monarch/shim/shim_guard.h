/* shim_guard.h -- what shim_guard.c (a cluster's mapping: its ranges not yet local guarded, a
 * fault on one served from the block its owner sends) gives the shim's other parts. Part of
 * monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_GUARD_H
#define MONARCH_SHIM_GUARD_H

/* blocks guarded (PROT_NONE) in this process's mappings: 0, the write wrappers look no further */
static int monarch_nguarded;
/* mappings holding a descriptor of the application's file (a window's: monarch_guard_keep_fd_locked) */
static int monarch_pfs_fds;

struct monarch_mapping;
struct monarch_part;
static inline int monarch_guarded(const struct monarch_mapping *m, uint64_t b);
static void monarch_guard_clear(struct monarch_mapping *m, uint64_t b);
static void monarch_guard_mapping_locked(struct monarch_mapping *m, struct monarch_part *pt);
static void monarch_guard_lift_locked(struct monarch_mapping *m, uint64_t b, uint64_t e);
static void monarch_guard_lift_all_locked(struct monarch_mapping *m);
/* the bytes of blocks [b, e] that m covers; the page size (shim_pages.c's runs) */
static void monarch_guard_span(struct monarch_mapping *m, struct monarch_part *pt, uint64_t b, uint64_t e,
                               void **at, size_t *len);
static size_t monarch_guard_page;
static inline uint64_t monarch_guard_now_ns(void);  /* CLOCK_MONOTONIC */
static struct monarch_mapping *monarch_mapping_at_locked(uintptr_t a);  /* the mapping holding a (the registry's lock) */
/* a window's mapping (the map's window): the application's descriptor kept to guard its copied
 * blocks again (monarch_part_mapped), and forgotten when the application closes that number */
static void monarch_guard_keep_fd_locked(struct monarch_mapping *m, struct monarch_part *pt, int fd);
static void monarch_guard_fds_closing(unsigned first, unsigned last);
/* before the kernel reads [p, p + n) for a write or a send: its guarded pages faulted in by the
 * application's thread (a kernel access to a PROT_NONE page fails with EFAULT, never faults) */
static void monarch_guard_touch_slow(const void *p, size_t n);
/* a signal the shim does not serve, to the application's handler ``app`` (1), or 0: its default or ignore */
static int monarch_app_handler(const struct sigaction *app, int sig, siginfo_t *si, void *ctx);
static inline void monarch_guard_touch(const void *p, size_t n)
{
    if (MONARCH_UNLIKELY(__atomic_load_n(&monarch_nguarded, __ATOMIC_RELAXED)) && n)
        monarch_guard_touch_slow(p, n);
}

#endif /* MONARCH_SHIM_GUARD_H */
