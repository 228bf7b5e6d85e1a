/* shim_fork.h -- what shim_fork.c (fork: the handlers that keep every process of a job the
 * shim's) gives the shim's other parts. Part of monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_FORK_H
#define MONARCH_SHIM_FORK_H

/* ---- what the other parts call ---- */
static void monarch_fork_handlers(void);
/* the child's per-process state reset (a raw fork's child too: shim_rawsys.c) */
static void monarch_atfork_child(void);

#endif /* MONARCH_SHIM_FORK_H */
