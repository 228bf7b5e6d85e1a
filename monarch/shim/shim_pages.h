/* shim_pages.h -- what shim_pages.c (a guarded fault on another owner's block served with its
 * pages, fetched from that owner's copy through the daemon's front door) gives shim_guard.c.
 * Part of monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_PAGES_H
#define MONARCH_SHIM_PAGES_H

struct monarch_mapping;
struct monarch_part;
/* May a random fault on block b of m be served with its pages from the block's owner (a window's
 * mapping, the block another node's)? Under the registry's lock. */
static int monarch_pages_may_locked(const struct monarch_mapping *m, const struct monarch_part *pt, uint64_t b);
/* ... not now: the owners' answers failed or came slow lately (its faults read a PFS page each) */
static int monarch_pages_paused(void);
/* Serve it: 1 when the fault's pages are now the owner's bytes, in this process's memory (the
 * access runs again); 0 when they could not be had (the caller reads them from the PFS). Takes
 * and gives back the registry's lock itself (never held during the fetch); called without it. */
static int monarch_pages_serve(uintptr_t a);
/* Pages [at, at + len) of block b of m, made readable (a run from the owner, or a page of the
 * PFS's), kept in the process's ring: the oldest there guarded again. Under the registry's lock. */
static void monarch_pages_keep_locked(const struct monarch_mapping *m, uintptr_t at, size_t len, uint64_t b);
/* a thread's connection for them, closed when it exits (shim_daemon.c's key destructor) */
static void monarch_pages_thread_exit(void);
static void monarch_pages_atfork_child(void);  /* the forking thread's, in the child: its copy closed */

#endif /* MONARCH_SHIM_PAGES_H */
