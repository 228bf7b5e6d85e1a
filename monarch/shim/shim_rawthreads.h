/* shim_rawthreads.h -- what shim_rawthreads.c (which threads' raw system calls are watched at a
 * given moment, and what watching them cost) gives the shim's other parts. Part of monarch_shim.c's
 * one translation unit. */
#ifndef MONARCH_SHIM_RAWTHREADS_H
#define MONARCH_SHIM_RAWTHREADS_H

/* Every watched thread's raw calls watched again (a write-back call the daemon answered, in any
 * thread); a no-op while raw calls are not watched. */
static void monarch_raw_watch_all(void);

#if defined(__x86_64__)
#define MONARCH_SUD_ALLOW 0 /* a selector's values, the kernel's SYSCALL_DISPATCH_FILTER_*: any other kills */
#define MONARCH_SUD_BLOCK 1
/* This thread's selector: a slot of the table, taken at its first watch. */
static char *monarch_raw_selector(void);
/* ... or NULL while it has none (never watched). */
static inline char *monarch_raw_selector_if_any(void);
/* This thread's raw calls let through (ALLOW) until it is watched again. */
static inline void monarch_raw_pause(void);
/* Did a raw call at `at` come from a compute runtime's own code? */
static int monarch_raw_in_runtime(uintptr_t at);
/* One raw call answered, for the report: its handler's ns and whether it paused its thread. */
static void monarch_raw_count(long nr, uint64_t ns, int paused);
/* The constructor's (before the first thread is watched), and a fork child's. */
static void monarch_raw_threads_setup(void);
static void monarch_raw_threads_atfork_child(void);
#endif

#endif /* MONARCH_SHIM_RAWTHREADS_H */
