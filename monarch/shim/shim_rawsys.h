/* shim_rawsys.h -- what shim_rawsys.c (the system calls a library makes without libc, seen through
 * Linux's syscall user dispatch and answered as the shim's own wrappers answer libc's) gives the
 * shim's other parts. Part of monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_RAWSYS_H
#define MONARCH_SHIM_RAWSYS_H

/* 1 once this process's raw system calls are watched (set at start-up, never cleared) */
static int monarch_raw_on;

/* The constructor's, after monarch_init: watch raw calls when the job writes back (or when
 * MONARCH_SHIM_RAW_SYSCALLS=1), if the kernel can. */
static void monarch_raw_setup(void);
/* This thread's raw calls watched (a new thread's; no-op when off). */
static void monarch_raw_watch_thread(void);
/* A fork's child: its one thread watched (dispatch is not inherited), the other threads' selectors freed. */
static void monarch_raw_atfork_child(void);
/* A thread paused (a raw clone, a compute runtime's wait): watched again (the write-back hooks call it). */
static inline void monarch_raw_rearm(void);
#if defined(__x86_64__)
/* This thread's dispatch on: libc's text goes to the kernel at once, the rest as `sel` says. */
static int monarch_raw_setup_pointer(char *sel);
#endif
/* SIGSYS's disposition as the application set it, while the handler is ours: 1 when answered here */
static int monarch_raw_sigaction(int sig, const struct sigaction *act, struct sigaction *old);
/* SIGSYS taken out of a mask to block (a blocked SIGSYS would end the process at its next raw call) */
static const sigset_t *monarch_raw_unblock(int how, const sigset_t *set, sigset_t *copy);

#endif /* MONARCH_SHIM_RAWSYS_H */
