/* shim_view.h -- what shim_view.c (the application's view of the daemon's paths: each root and tier
 * folder the same filesystem object as for the daemon, the run folder reachable and the user's;
 * each fallback said once) gives the shim's other parts. Part of monarch_shim.c's one translation
 * unit. */
#ifndef MONARCH_SHIM_VIEW_H
#define MONARCH_SHIM_VIEW_H

#define MONARCH_PROBE_UNSEEN (-4) /* a probe dir that is not the daemon's here: never probed */

/* a root's view (struct monarch_root.view) */
#define MONARCH_VIEW_UNCHECKED 0 /* the daemon published its identity: checked at its first use */
#define MONARCH_VIEW_SAME 1      /* the daemon's object (or nothing published to check) */
#define MONARCH_VIEW_ELSEWHERE 2 /* another object here: not managed, read directly */

/* ---- the state it shares: whether this process made a call under a root (counted once) ---- */
static int monarch_at_roots;

/* ---- what the other parts call ---- */
static void monarch_view_parse(void);
static int monarch_view_run_folder(const char *counters);
static int monarch_root_elsewhere(struct monarch_root *r);
static int monarch_probe_unseen(struct monarch_probe *pr, int fd, const struct stat *st);
static int monarch_tiers_unseen(void);
static void monarch_view_daemon_uid(unsigned uid);
static void monarch_count_at_roots(void);
static void monarch_view_atfork_child(void);
/* "monarch: ..." on stderr, once for the job per FALLBACK_* bit */
static void monarch_say(unsigned bit, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* MONARCH_SHIM_VIEW_H */
