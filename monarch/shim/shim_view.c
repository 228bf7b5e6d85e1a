/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_view.h). Here:
 * the application's view of the daemon's paths. Inside a container, a chroot or any mount
 * namespace a path may name other bytes than it does for the daemon, and the daemon's folders may
 * not be there at all. So:
 *   - a root is served only where it is the same filesystem object (device and inode: bind mounts
 *     keep both) as the daemon's: checked at the root's first use in the process, one stat; another
 *     object is not managed, its files read by the kernel as without Monarch;
 *   - a tier folder (probe dir) is probed only where it is the daemon's: checked when it is first
 *     opened; with none of them seen, opens read the PFS without asking the daemon, whose answers
 *     would name folders not here;
 *   - a run folder that is not here, or is another uid's (a container user mapped elsewhere), turns
 *     the shim off in the process at start, as a daemon of another uid does at its first answer;
 * and each of these is said once, as one line on stderr with its fix, and in the counters
 * (EXTRA_FALLBACKS, EXTRA_ROOTS_ELSEWHERE) for the report. Also here: the processes that made a
 * call under a root (EXTRA_ROOT_PROCESSES), the readers, told apart from a runtime's wrappers that
 * merely loaded the shim. */
#include "shim_view.h"

static unsigned monarch_said_here; /* FALLBACK_* bits said in this process or by its parents */
static int monarch_unseen_any;     /* a tier folder with a published identity is not the daemon's here */
static int monarch_probes_viewed;  /* every probe dir opened and checked once */

/* "monarch: ..." on stderr, once for the job per reason: the first process of the run to set the
 * reason's bit in the counters says it; with no counters, once in this process tree (a child
 * inherits MONARCH_SHIM_SAID; the caller exports it where that is safe, at start-up). */
__attribute__((format(printf, 2, 3)))
static void monarch_say(unsigned bit, const char *fmt, ...)
{
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (__atomic_fetch_or(&monarch_said_here, bit, __ATOMIC_RELAXED) & bit)
        return;
    if (c && (__atomic_fetch_or(monarch_extra(c, MONARCH_EXTRA_FALLBACKS), bit, __ATOMIC_RELAXED) & bit))
        return;
    va_list ap;
    va_start(ap, fmt);
    monarch_stderr_line("monarch: ", fmt, ap);
    va_end(ap);
}

/* The next "<n>=<dev>,<ino>" of *s (fields separated by ':'); 0, or -1 at the end or on a bad one. */
static int monarch_next_id(const char **s, unsigned long *n, dev_t *dev, ino_t *ino)
{
    const char *c = *s;
    if (!c || !*c)
        return -1;
    char *end;
    *n = strtoul(c, &end, 10);
    int ok = end != c && *end == '=';
    if (ok) {
        c = end + 1;
        *dev = (dev_t)strtoull(c, &end, 10);
        ok = end != c && *end == ',';
    }
    if (ok) {
        c = end + 1;
        *ino = (ino_t)strtoull(c, &end, 10);
        ok = end != c && (*end == ':' || *end == '\0');
    }
    const char *next = strchr(*s, ':');
    *s = next ? next + 1 : NULL;
    return ok ? 0 : -1;
}

/* Start-up, after the roots and probe dirs are parsed: the identities the daemon published
 * (MONARCH_ROOT_IDS, MONARCH_PROBE_IDS) and what the parents already said. A root with none
 * published (a store's, an older daemon's) is taken as the same. */
static void monarch_view_parse(void)
{
    const char *said = getenv(MONARCH_ENV_SAID);
    if (said && said[0])
        monarch_said_here = (unsigned)strtoul(said, NULL, 10);
    for (unsigned i = 0; i < monarch_nroots; i++)
        monarch_roots[i].view = MONARCH_VIEW_SAME;
    unsigned long n;
    dev_t dev;
    ino_t ino;
    for (const char *s = getenv(MONARCH_ENV_ROOT_IDS); s && *s;) {
        if (monarch_next_id(&s, &n, &dev, &ino) != 0)
            continue;
        for (unsigned i = 0; i < monarch_nroots; i++) {
            struct monarch_root *r = &monarch_roots[i];
            if (r->index == n) {
                r->id_dev = dev;
                r->id_ino = ino;
                r->view = MONARCH_VIEW_UNCHECKED;
            }
        }
    }
    for (const char *s = getenv(MONARCH_ENV_PROBE_IDS); s && *s;) {
        if (monarch_next_id(&s, &n, &dev, &ino) != 0)
            continue;
        for (unsigned i = 0; i < monarch_nprobes; i++) {
            struct monarch_probe *p = &monarch_probes[i];
            if (p->slot == n) {
                p->id_dev = dev;
                p->id_ino = ino;
                p->has_id = 1;
            }
        }
    }
}

/* Start-up, when the counters file named by the daemon does not map: is the run folder not here,
 * or another uid's? Then this process passes everything through (-1), said once; else 0 (a bad
 * file: serve, uncounted, as before). */
static int monarch_view_run_folder(const char *counters)
{
    struct stat st;
    unsigned before = monarch_said_here;
    int r = 0;
    int found = monarch_sys_lstatat(AT_FDCWD, counters, &st) == 0;
    if (!found && errno == EACCES) { /* the daemon's private folder, and we are not its user */
        monarch_say(MONARCH_FALLBACK_UID_MISMATCH,
                    "the node's daemon runs as another user than this process (uid %u): its run folder (%s) "
                    "is not open to it, so it reads the dataset directly, not through Monarch. Run the job as "
                    "the daemon's user (podman --userns=keep-id; Apptainer and Enroot keep it), or run "
                    "`monarch run` inside as this user", (unsigned)getuid(), counters);
        r = -1;
    } else if (!found) {
        monarch_say(MONARCH_FALLBACK_DAEMON_UNREACHABLE,
                    "the run folder of the node's daemon is not reachable here (%s: %s): this process reads the "
                    "dataset directly, not through Monarch. Bind the run folder at the same path (apptainer --bind, "
                    "podman -v, --container-mounts) and pass the MONARCH_* variables, or run `monarch run` inside",
                    counters, strerror(errno));
        r = -1;
    } else if (st.st_uid != getuid()) {
        monarch_say(MONARCH_FALLBACK_UID_MISMATCH,
                    "the node's daemon runs as uid %u (its %s), this process as uid %u: it reads the dataset "
                    "directly, not through Monarch. Run the job as the daemon's user (podman --userns=keep-id; "
                    "Apptainer and Enroot keep it), or run `monarch run` inside as this user",
                    (unsigned)st.st_uid, counters, (unsigned)getuid());
        r = -1;
    }
    if (monarch_said_here != before) { /* at start-up, before the application runs: safe to export */
        char bits[16];
        snprintf(bits, sizeof bits, "%u", monarch_said_here);
        setenv(MONARCH_ENV_SAID, bits, 1);
    }
    return r;
}

/* The daemon that answered is another uid's: it is never asked again in this process, said once. */
static void monarch_view_daemon_uid(unsigned uid)
{
    __atomic_store_n(&monarch_have_socket, 0, __ATOMIC_RELAXED);
    monarch_say(MONARCH_FALLBACK_UID_MISMATCH,
                "the daemon at %s runs as uid %u, this process as uid %u: it reads the dataset directly, not "
                "through Monarch. Run the job as the daemon's user (podman --userns=keep-id; Apptainer and Enroot "
                "keep it)", monarch_sockaddr.sun_path, uid, (unsigned)getuid());
}

/* Is root r another filesystem object here than for the daemon? Checked once, at its first use. */
static int monarch_root_elsewhere(struct monarch_root *r)
{
    int v = __atomic_load_n(&r->view, __ATOMIC_ACQUIRE);
    if (MONARCH_LIKELY(v == MONARCH_VIEW_SAME))
        return 0;
    if (v == MONARCH_VIEW_ELSEWHERE)
        return 1;
    struct stat st;
    int saved = errno;
    int same = syscall(SYS_newfstatat, AT_FDCWD, r->len ? r->path : "/", &st, 0) == 0 && S_ISDIR(st.st_mode)
               && st.st_dev == r->id_dev && st.st_ino == r->id_ino;
    errno = saved;
    __atomic_store_n(&r->view, same ? MONARCH_VIEW_SAME : MONARCH_VIEW_ELSEWHERE, __ATOMIC_RELEASE);
    if (same)
        return 0;
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c)
        __atomic_fetch_or(monarch_extra(c, MONARCH_EXTRA_ROOTS_ELSEWHERE), monarch_root_bit(r->index),
                          __ATOMIC_RELAXED);
    monarch_say(MONARCH_FALLBACK_ROOT_ELSEWHERE,
                "%s here is not the dataset root the daemon serves (another filesystem object: a container's or "
                "chroot's own files?): read directly, not through Monarch. To serve it, bind the daemon's %s at "
                "the same path (apptainer --bind, podman -v, --container-mounts), or run the daemon where the "
                "job runs", r->len ? r->path : "/", r->len ? r->path : "/");
    return 1;
}

/* A probe dir just opened (fd and its stat; fd < 0: it did not open): 1 when the daemon published
 * its identity and this is not it, or not here. */
static int monarch_probe_unseen(struct monarch_probe *pr, int fd, const struct stat *st)
{
    if (!pr->has_id)
        return 0;
    if (fd >= 0 && st->st_dev == pr->id_dev && st->st_ino == pr->id_ino)
        return 0;
    MONARCH_DEBUG(1, "probe slot %u: %s is not the daemon's folder here; not probed", pr->slot, pr->dir);
    return 1;
}

/* Is a tier folder of the daemon's not here? Then opens ask the daemon nothing (its answers would
 * name copies this process cannot open); the tiers that are here are probed all the same. Every
 * probe dir is opened and checked once, at the first open under a root; the answer is said once. */
static int monarch_tiers_unseen(void)
{
    if (MONARCH_LIKELY(__atomic_load_n(&monarch_probes_viewed, __ATOMIC_ACQUIRE)))
        return __atomic_load_n(&monarch_unseen_any, __ATOMIC_RELAXED);
    unsigned with_id = 0, unseen = 0, opening = 0;
    const char *first = NULL;
    for (unsigned i = 0; i < monarch_nprobes; i++) {
        struct monarch_probe *pr = &monarch_probes[i];
        int fd = monarch_probe_fd(pr);
        opening += fd == MONARCH_PROBE_OPENING;
        with_id += pr->has_id;
        if (fd == MONARCH_PROBE_UNSEEN) {
            unseen++;
            first = first ? first : pr->dir;
        }
    }
    if (opening)
        return 0; /* another thread opens one now: look again at the next open */
    int all = with_id && unseen == with_id;
    __atomic_store_n(&monarch_unseen_any, unseen > 0, __ATOMIC_RELAXED); /* any: the daemon is not asked */
    __atomic_store_n(&monarch_probes_viewed, 1, __ATOMIC_RELEASE);
    if (unseen)
        monarch_say(MONARCH_FALLBACK_TIERS_UNSEEN,
                    "%s of the daemon's %u tier folder(s) %s not visible here (%s%s): %s. Bind them at the same "
                    "paths (apptainer --bind, podman -v, --container-mounts; a container's private /dev/shm hides "
                    "the RAM tier's), or run `monarch run` inside", all ? "all" : "some", with_id,
                    all ? "are" : "is", first, unseen > 1 ? ", ..." : "",
                    all ? "opens read the dataset directly, not through Monarch"
                        : "its copies there are read from the dataset instead, and no open asks the daemon");
    return unseen > 0;
}

/* This process made a call under a root: counted once per process (a fork child counts itself). */
static void monarch_count_at_roots(void)
{
    if (__atomic_exchange_n(&monarch_at_roots, 1, __ATOMIC_RELAXED))
        return;
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && getpid() == monarch_pid)
        __atomic_fetch_add(monarch_extra(c, MONARCH_EXTRA_ROOT_PROCESSES), 1, __ATOMIC_RELAXED);
}

/* A fork child is a process of its own: it counts itself at its own first call under a root. */
static void monarch_view_atfork_child(void)
{
    if (monarch_at_roots)
        monarch_at_roots = 0;
}
