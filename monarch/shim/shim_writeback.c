/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_writeback.h).
 * Here: the job's calls under the write-back paths (MONARCH_WRITEBACK; the contract:
 * docs/consistency.md, "Write-back").
 *   - an open that creates or truncates a file for writing asks the daemon (WB_OPEN), which makes
 *     it in the run's area and answers its local path: the application writes there at the node's
 *     speed, its descriptor remembered with the file's seq; an open for update of a file the PFS
 *     holds is answered with the PFS path (written through);
 *   - close, fclose (and a normal exit with it still open) tell the daemon (WB_CLOSE), which
 *     publishes the file once no process holds it; a killed process tells nothing: what it was
 *     writing is not published; a close with nothing written since the descriptor's fsync says so
 *     (WB_CLOSE_SYNCED): that fsync's copy on the PFS is the file, not copied again;
 *   - rename, unlink, rmdir and mkdir are made in the daemon's view (journaled, replayed on the PFS
 *     in order); stat, access, a read-only open and a listing are answered from it (WB_RESOLVE,
 *     WB_LIST: the path to use instead);
 *   - chmod, chown, utime, truncate, link, symlink and mknod there first wait for what the job
 *     changed at their paths to reach the PFS (WB_SETTLE), then the kernel makes them; a file being
 *     written is truncated or timed at its local copy, and its chmod (fchmod) is its published mode;
 *   - fsync, fdatasync, sync_file_range(WAIT_AFTER) of such a descriptor, and msync(MS_SYNC) of a
 *     shared mapping of one, return once its bytes so far are on the PFS (WB_SYNC);
 *   - write, pwrite and writev to one reserve its room ahead (WB_ROOM, granted some bytes ahead
 *     of their need): they wait while the room is full; a file larger than the room is moved to the PFS,
 *     its descriptor then the PFS's temporary file at the same offset (written through). Their
 *     time is told at the close (what the report sets beside direct's).
 * A daemon that cannot be asked leaves the call to the kernel, as without Monarch (fail open). Every
 * hook costs one load of monarch_nwb when there are no write-back paths.
 */
#include "shim_writeback.h"

static char monarch_wb_dirs[MONARCH_MAX_WB][PATH_MAX];
static size_t monarch_wb_lens[MONARCH_MAX_WB];
static uint32_t monarch_wb_fd_seq[MONARCH_MAX_FDS]; /* a descriptor's write-back file, 0: none */
static int monarch_wb_held; /* descriptors with one in this process: none, nothing to tell at exit */
static uint64_t monarch_wb_used[MONARCH_MAX_FDS], monarch_wb_granted[MONARCH_MAX_FDS];
static uint64_t monarch_wb_write_ns[MONARCH_MAX_FDS];
/* writes made through a descriptor, and their count when its last fsync began (NEVER: none): a
 * close with none since says so, and the drain's copy at that fsync is the file's publish */
static uint64_t monarch_wb_writes[MONARCH_MAX_FDS], monarch_wb_synced_at[MONARCH_MAX_FDS];
#define MONARCH_WB_NEVER UINT64_MAX
static __thread int monarch_wb_closing_synced; /* the closing descriptor's: nothing written since its fsync */
static __thread uint64_t monarch_wb_closing_ns; /* the closing descriptor's write time, for its WB_CLOSE */
#define MONARCH_WB_MAPS 64 /* shared mappings of write-back files msync can name (more: not synced) */
static struct { uintptr_t start, end; uint32_t seq; } monarch_wb_maps[MONARCH_WB_MAPS];
static char monarch_wb_maps_lock;
static __thread char monarch_wb_buf[PATH_MAX] __attribute__((tls_model("initial-exec")));
#define MONARCH_RENAME_NOREPLACE 1 /* renameat2's flag (glibc 2.17's headers lack it) */
#define MONARCH_WB_WAIT_MS (24 * 3600 * 1000) /* a call may wait for the drain; heartbeats keep it alive */

/* MONARCH_WRITEBACK: absolute directories separated by ':'. */
static void monarch_wb_parse(const char *env)
{
    while (env && *env) {
        const char *end = strchr(env, ':');
        size_t n = end ? (size_t)(end - env) : strlen(env);
        if (n > 0 && n < PATH_MAX && env[0] == '/' && monarch_nwb < MONARCH_MAX_WB) {
            char *dir = monarch_wb_dirs[monarch_nwb];
            memcpy(dir, env, n);
            dir[n] = '\0';
            monarch_wb_lens[monarch_nwb++] = monarch_normalize(dir);
            MONARCH_DEBUG(1, "write-back path: %s", dir);
        } else if (n) {
            MONARCH_DEBUG(1, "%s: an entry of %zu bytes ignored (an absolute directory, at most %d)",
                          MONARCH_ENV_WRITEBACK, n, MONARCH_MAX_WB);
        }
        env = end ? end + 1 : NULL;
    }
}

/* The paths where the job's view differs from the PFS, as the daemon marks them (a counting Bloom
 * filter: monarch/writeback/marks.py): a stat, access, read-only open or listing of a path with
 * nothing marked on it or above it is the PFS's own, and asks no one. NULL: every path is asked. */
static const uint8_t *monarch_wb_marks;
static uint64_t monarch_wb_marks_mask;
#define MONARCH_FNV_BASIS 0xcbf29ce484222325ULL
#define MONARCH_FNV_PRIME 0x100000001b3ULL

static void monarch_wb_map_marks(const char *path)
{
    if (!monarch_nwb || !path || !path[0])
        return;
    size_t size = 0;
    const uint8_t *m = monarch_map_file(path, 0, MONARCH_WB_MARKS_HEADER_SIZE, &size);
    uint32_t slots = 0;
    if (m)
        memcpy(&slots, m + 8, sizeof slots);
    if (!m || memcmp(m, MONARCH_WB_MARKS_MAGIC, 8) != 0 || !slots || (slots & (slots - 1))
        || size != MONARCH_WB_MARKS_HEADER_SIZE + (size_t)slots) {
        MONARCH_DEBUG(1, "%s=%s: not a marks file; every path under the write-back paths is asked for",
                      MONARCH_ENV_WRITEBACK_MARKS, path);
        if (m)
            munmap((void *)m, size);
        return;
    }
    monarch_wb_marks_mask = slots - 1;
    monarch_wb_marks = m + MONARCH_WB_MARKS_HEADER_SIZE;
}

static inline int monarch_wb_marked_hash(uint64_t h)
{
    return __atomic_load_n(&monarch_wb_marks[h & monarch_wb_marks_mask], __ATOMIC_RELAXED)
           && __atomic_load_n(&monarch_wb_marks[(h >> 32) & monarch_wb_marks_mask], __ATOMIC_RELAXED);
}

/* Must the daemon be asked for abs (normalized, under a write-back path)? Yes where it, or a
 * directory above it up to its write-back path (a rename or removal of one), is marked; for a
 * listing, also where something in it is. One pass: FNV-1a's state at each '/' is its prefix's. */
static int monarch_wb_marked(const char *abs, int list)
{
    if (!monarch_wb_marks)
        return 1;
    size_t root = 0, len = strlen(abs);
    for (unsigned i = 0; i < monarch_nwb; i++)
        if (len >= monarch_wb_lens[i] && memcmp(abs, monarch_wb_dirs[i], monarch_wb_lens[i]) == 0
            && (abs[monarch_wb_lens[i]] == '/' || abs[monarch_wb_lens[i]] == '\0') && monarch_wb_lens[i] > root)
            root = monarch_wb_lens[i];
    uint64_t h = MONARCH_FNV_BASIS;
    for (size_t i = 0; i < len; i++) {
        if (abs[i] == '/' && i > 0 && i >= root && monarch_wb_marked_hash(h))
            return 1;
        h = (h ^ (unsigned char)abs[i]) * MONARCH_FNV_PRIME;
    }
    if (monarch_wb_marked_hash(h))
        return 1;
    return list && monarch_wb_marked_hash((h ^ (unsigned char)'/') * MONARCH_FNV_PRIME);
}

/* ---- the write-back calls' own socket (MONARCH_WRITEBACK_SOCKET: node/writeback_door.py) ----
 * The daemon serves each connection there on a thread of its own, call after call: each thread
 * keeps one connection (no connect, accept or close per call). As the OPEN connection of
 * shim_daemon.c: checked to be the socket it was before each use, never kept by a vfork child
 * (another pid, the parent's memory), the forking thread's copy closed in a fork child, closed at
 * the thread's exit. A socket that cannot be reached sends the call to the main one. */
static struct sockaddr_un monarch_wb_door;
static int monarch_wb_have_door;
static __thread int monarch_wb_door_fd __attribute__((tls_model("initial-exec"))) = -1;
static __thread pid_t monarch_wb_door_pid __attribute__((tls_model("initial-exec")));
static __thread ino_t monarch_wb_door_ino __attribute__((tls_model("initial-exec")));

static void monarch_wb_parse_door(const char *path)
{
    if (!monarch_nwb || !path || !path[0])
        return;
    if (strlen(path) >= sizeof monarch_wb_door.sun_path) {
        MONARCH_DEBUG(1, "%s: path too long; write-back calls go to the daemon's socket", MONARCH_ENV_WRITEBACK_SOCKET);
        return;
    }
    monarch_wb_door.sun_family = AF_UNIX;
    strcpy(monarch_wb_door.sun_path, path);
    monarch_wb_have_door = 1;
}

static void monarch_wb_door_drop(void)
{
    struct stat st;
    if (monarch_wb_door_fd >= 0 && syscall(SYS_newfstatat, monarch_wb_door_fd, "", &st, AT_EMPTY_PATH) == 0
        && S_ISSOCK(st.st_mode) && st.st_ino == monarch_wb_door_ino)
        real_close(monarch_wb_door_fd);
    monarch_wb_door_fd = -1;
}

static void monarch_wb_thread_exit(void)
{
    if (monarch_wb_door_fd >= 0 && monarch_wb_door_pid == getpid())
        monarch_wb_door_drop();
}

static void monarch_wb_atfork_child(void)
{
    monarch_wb_door_drop();
    monarch_wb_door_pid = 0;
}

/* One call on the write-back socket: its status (as monarch_request_why's), or INT_MIN with *fallback
 * set when that socket cannot be reached (the caller asks the main one). A call sent on a kept
 * connection is never sent again: the daemon may have made it. */
static int monarch_wb_door_call(const char *body, size_t n, char *answer, size_t max, int wait_ms, int *why,
                                int *fallback)
{
    struct stat st;
    pid_t pid = getpid();
    int kept = monarch_wb_door_fd >= 0 && monarch_wb_door_pid == pid;
    int s = -1, reused = 0;
    *fallback = 0;
    if (kept && syscall(SYS_newfstatat, monarch_wb_door_fd, "", &st, AT_EMPTY_PATH) == 0 && S_ISSOCK(st.st_mode)
        && st.st_ino == monarch_wb_door_ino) {
        s = monarch_wb_door_fd;
        reused = 1;
    } else if (kept) {
        monarch_wb_door_fd = -1; /* the application closed or replaced it: its descriptor now */
    }
    int keep = !reused && pid == monarch_pid; /* (a vfork child's pid is not monarch_pid: the parent's memory) */
    if (s < 0 && ((s = monarch_connect_to(&monarch_wb_door, MONARCH_HEARTBEAT_TIMEOUT_MS)) < 0
                  || syscall(SYS_newfstatat, s, "", &st, AT_EMPTY_PATH) != 0)) {
        if (s >= 0)
            real_close(s);
        *fallback = 1;
        return INT_MIN;
    }
    int busy = 0;
    long start = monarch_now_ms();
    int status = monarch_exchange(s, MONARCH_VERB_WB, 0, body, n, answer, max, NULL, start, start + wait_ms, &busy);
    *why = status != INT_MIN ? MONARCH_ANSWERED : busy ? MONARCH_BUSY : MONARCH_LOST;
    if (status == INT_MIN) {
        if (reused)
            monarch_wb_door_fd = -1;
        real_close(s);
        *fallback = !reused && !busy; /* a fresh connection closed at once: the door is full or gone */
        return INT_MIN;
    }
    if (keep && !reused) {
        monarch_conn_close_at_exit();
        monarch_wb_door_fd = s;
        monarch_wb_door_pid = pid;
        monarch_wb_door_ino = st.st_ino;
    } else if (!reused) {
        real_close(s);
    }
    return status;
}

/* Is (dirfd, path) under a write-back path? Its absolute form in abs[PATH_MAX]. */
static int monarch_wb_under(int dirfd, const char *path, char *abs)
{
    size_t len;
    monarch_raw_rearm(); /* a thread whose dispatch a raw clone paused: watched again */
    if (monarch_guard || !path || !path[0] || !monarch_start() || monarch_abspath(dirfd, path, abs, &len) != 0)
        return 0;
    for (unsigned i = 0; i < monarch_nwb; i++) {
        size_t l = monarch_wb_lens[i];
        if (len >= l && memcmp(abs, monarch_wb_dirs[i], l) == 0 && (abs[l] == '/' || abs[l] == '\0'))
            return 1;
    }
    return 0;
}

/* The daemon answered a write-back call of this process (or of its parent before a fork): once it is
 * lost, its tier may hold files of the job not yet on the PFS, and a change made on the PFS directly
 * could reach it before them (a commit file before its shards): such a change fails instead. */
static int monarch_wb_took;

/* Does ``op`` change what the PFS will hold, in the job's order (a create, a namespace change, an
 * fsync's promise)? Reads, closes and room requests go on without the daemon, as without Monarch. */
static int monarch_wb_changes(unsigned op)
{
    return op == MONARCH_WB_OPEN || op == MONARCH_WB_RENAME || op == MONARCH_WB_UNLINK || op == MONARCH_WB_MKDIR ||
           op == MONARCH_WB_RMDIR || op == MONARCH_WB_SETTLE || op == MONARCH_WB_SYNC;
}

static int monarch_wb_lost(void)
{
    monarch_say(MONARCH_FALLBACK_WB_LOST, "%s", "the node daemon was lost with writes of the job it took not all on "
                "the PFS: a change under the write-back paths now could reach the PFS before them, so it fails (EIO); "
                "`monarch drain` publishes what the daemon kept");
    return MONARCH_WB_ERRNO + EIO;
}

/* One call to the daemon: its status (the body, a path, in out[PATH_MAX]), or INT_MIN when it
 * cannot be asked (or MONARCH_WB_ERRNO + EIO: a change once the daemon that took the job's writes
 * is lost). */
static int monarch_wb_ask(unsigned op, const char *p1, const char *p2, long n1, long n2, char *out)
{
    char body[MONARCH_KEY_MAX];
    int n = snprintf(body, sizeof body, "%c%s%c%s%c%ld%c%ld%c", (char)op, p1 ? p1 : "", 0, p2 ? p2 : "", 0, n1, 0,
                     n2, 0);
    if (n < 0 || (size_t)n >= sizeof body)
        return INT_MIN;
    char answer[PATH_MAX + 1];
    int saved = errno;
    monarch_guard = 1;
    int why;
    int64_t t0 = monarch_debug >= 2 ? monarch_now_ns() : 0;
    int st = INT_MIN, fallback = 1;
    if (monarch_wb_have_door)
        st = monarch_wb_door_call(body, (size_t)n, answer, sizeof answer, MONARCH_WB_WAIT_MS, &why, &fallback);
    if (fallback)
        st = monarch_request_why(MONARCH_VERB_WB, body, (size_t)n, answer, sizeof answer, NULL, MONARCH_WB_WAIT_MS,
                                 &why);
    MONARCH_DEBUG(2, "write-back call %u %s%s%s: %d in %.3f ms (%s)", op, p1 ? p1 : "", p2 ? " " : "", p2 ? p2 : "", st,
                  (double)(monarch_now_ns() - t0) / 1e6, fallback ? "the daemon's socket" : "its own socket");
    monarch_guard = 0;
    errno = saved;
    if (st < 0 && why == MONARCH_LOST && monarch_wb_took && monarch_wb_changes(op))
        return monarch_wb_lost();
    if (st < 0) /* not answered, or refused (a daemon without write-back): as if there were none */
        return INT_MIN;
    monarch_wb_took = 1;
    monarch_raw_watch_all(); /* threads paused in a compute runtime: watched again, a write-back file may be new */
    if (out)
        memcpy(out, answer, strlen(answer) + 1);
    return st;
}

/* The umask, without changing it (umask(2) sets it: a race with other threads). */
static mode_t monarch_wb_umask(void)
{
    char buf[2048];
    int fd = MONARCH_RESOLVE(openat)(AT_FDCWD, "/proc/self/status", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : syscall(SYS_read, fd, buf, sizeof buf - 1);
    if (fd >= 0)
        real_close(fd);
    if (n <= 0)
        return 022;
    buf[n] = '\0';
    const char *u = strstr(buf, "Umask:");
    return u ? (mode_t)strtoul(u + 6, NULL, 8) : 022;
}

/* Descriptor fd's write-back file is now ``seq`` (0: none); the one it had. */
static uint32_t monarch_wb_set(int fd, uint32_t seq)
{
    uint32_t old = __atomic_exchange_n(&monarch_wb_fd_seq[fd], seq, __ATOMIC_RELAXED);
    if (!old != !seq)
        __atomic_fetch_add(&monarch_wb_held, seq ? 1 : -1, __ATOMIC_RELAXED);
    return old;
}

static inline int monarch_wb_failed(int st)
{
    return st >= MONARCH_WB_ERRNO;
}

/* An open under a write-back path: 1 with *fdp (or -1 and errno) when it was answered here. */
static int monarch_wb_open(int dirfd, const char *path, int flags, mode_t mode, int *fdp)
{
    char abs[PATH_MAX], where[PATH_MAX + 1];
    if (!monarch_wb_under(dirfd, path, abs))
        return 0;
    int writes = (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
    if (!writes && !monarch_wb_marked(abs, 0))
        return 0; /* nothing of the job's pending there: the PFS's file */
    int st = writes ? monarch_wb_ask(MONARCH_WB_OPEN, abs, NULL, flags, (long)(mode & ~monarch_wb_umask() & 07777),
                                     where)
                    : monarch_wb_ask(MONARCH_WB_RESOLVE, abs, NULL, MONARCH_WB_RESOLVE_TO_READ, 0, where);
    if (!writes && st >= MONARCH_WB_ANSWER_LOCAL && !monarch_wb_failed(st))
        st = MONARCH_WB_ANSWER_PFS; /* a pending file's copy, to read: its mode is for stat */
    if (st == INT_MIN)
        return 0; /* no daemon to ask: the kernel's, as without Monarch */
    if (monarch_wb_failed(st)) {
        *fdp = -1;
        errno = st - MONARCH_WB_ERRNO;
        return 1;
    }
    /* a file of the area: already made there (O_EXCL was the daemon's to check) */
    int lflags = st > 0 ? flags & ~(O_CREAT | O_EXCL) : flags;
    int fd = MONARCH_RESOLVE(openat)(AT_FDCWD, where, lflags, mode);
    /* a file published or renamed on the PFS between the answer and this open: asked again */
    for (int again = 0; fd < 0 && errno == ENOENT && !writes && st == 0 && strcmp(where, abs) && again < 3; again++) {
        st = monarch_wb_ask(MONARCH_WB_RESOLVE, abs, NULL, 0, 0, where);
        if (st == INT_MIN || monarch_wb_failed(st)) {
            errno = st == INT_MIN ? ENOENT : st - MONARCH_WB_ERRNO;
            break;
        }
        st = MONARCH_WB_ANSWER_PFS;
        fd = MONARCH_RESOLVE(openat)(AT_FDCWD, where, lflags, mode);
    }
    if (fd >= 0 && st > 0 && (unsigned)fd < MONARCH_MAX_FDS) {
        monarch_wb_set(fd, (uint32_t)st);
        monarch_wb_used[fd] = monarch_wb_granted[fd] = monarch_wb_write_ns[fd] = monarch_wb_writes[fd] = 0;
        monarch_wb_synced_at[fd] = MONARCH_WB_NEVER;
    }
    MONARCH_DEBUG(1, "open %s: write-back %s (seq %d, fd %d)", abs, where, st, fd);
    *fdp = fd;
    return 1;
}

static int monarch_wb_creat(const char *path, mode_t mode)
{
    int fd;
    if (MONARCH_LIKELY(!monarch_nwb) || !monarch_wb_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, &fd))
        return MONARCH_WB_NOT_OURS;
    return fd;
}

/* stat, access, a read-only open or a listing under a write-back path: the path to use instead
 * (the file's local copy, where the PFS still holds it, a listing made by the daemon), NULL to use
 * the path as it is; *err: the call fails with it (ENOENT: the job removed it). */
static const char *monarch_wb_view(int dirfd, const char *path, int list, int *err, int *mode)
{
    char abs[PATH_MAX];
    *err = 0;
    if (MONARCH_LIKELY(!monarch_nwb) || !monarch_wb_under(dirfd, path, abs) || !monarch_wb_marked(abs, list))
        return NULL;
    int st = monarch_wb_ask(list ? MONARCH_WB_LIST : MONARCH_WB_RESOLVE, abs, NULL, 0, 0, monarch_wb_buf);
    if (st == INT_MIN)
        return NULL;
    if (monarch_wb_failed(st)) {
        *err = st - MONARCH_WB_ERRNO;
        return NULL;
    }
    if (mode && st >= MONARCH_WB_ANSWER_LOCAL)
        *mode = st - MONARCH_WB_ANSWER_LOCAL;
    return monarch_wb_buf;
}

/* A pending file's stat: the mode it is published with, not its local copy's 0600. */
static void monarch_wb_mode_stat(struct stat *st, int mode)
{
    st->st_mode = (st->st_mode & ~07777u) | (unsigned)mode;
}

static void monarch_wb_mode_stat64(struct stat64 *st, int mode)
{
    st->st_mode = (st->st_mode & ~07777u) | (unsigned)mode;
}

static void monarch_wb_mode_statx(struct statx *st, int mode)
{
    st->stx_mode = (uint16_t)((st->stx_mode & ~07777u) | (unsigned)mode);
}

/* A change of the namespace made in the daemon's view: the call's result, or NOT_OURS. */
static int monarch_wb_change(unsigned op, const char *a, const char *b, long n1)
{
    int st = monarch_wb_ask(op, a, b, n1, 0, NULL);
    if (st == INT_MIN)
        return MONARCH_WB_NOT_OURS;
    if (monarch_wb_failed(st)) {
        errno = st - MONARCH_WB_ERRNO;
        return -1;
    }
    return 0;
}

static int monarch_wb_rename(int od, const char *o, int nd, const char *n, unsigned flags)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (MONARCH_LIKELY(!monarch_nwb))
        return MONARCH_WB_NOT_OURS;
    int ia = monarch_wb_under(od, o, a), ib = monarch_wb_under(nd, n, b);
    if (!ia && !ib)
        return MONARCH_WB_NOT_OURS;
    if (ia != ib || (flags & ~MONARCH_RENAME_NOREPLACE)) { /* across the write-back's edge, or RENAME_EXCHANGE */
        errno = ia != ib ? EXDEV : EINVAL;
        return -1;
    }
    return monarch_wb_change(MONARCH_WB_RENAME, a, b, flags ? 1 : 0); /* n1: NOREPLACE (tempfile's persist_noclobber) */
}

static int monarch_wb_unlink(int dirfd, const char *path, int flags)
{
    char a[PATH_MAX];
    if (MONARCH_LIKELY(!monarch_nwb) || !monarch_wb_under(dirfd, path, a))
        return MONARCH_WB_NOT_OURS;
    if (flags & AT_REMOVEDIR)
        return monarch_wb_change(MONARCH_WB_RMDIR, a, NULL, 0);
    return monarch_wb_change(MONARCH_WB_UNLINK, a, NULL, 0);
}

/* remove(3): a file, or else an empty directory, as glibc's does. */
static int monarch_wb_remove(const char *path)
{
    int r = monarch_wb_unlink(AT_FDCWD, path, 0);
    if (r == -1 && errno == EISDIR)
        r = monarch_wb_unlink(AT_FDCWD, path, AT_REMOVEDIR);
    return r;
}

static int monarch_wb_mkdir(int dirfd, const char *path, mode_t mode)
{
    char a[PATH_MAX];
    if (MONARCH_LIKELY(!monarch_nwb) || !monarch_wb_under(dirfd, path, a))
        return MONARCH_WB_NOT_OURS;
    return monarch_wb_change(MONARCH_WB_MKDIR, a, NULL, (long)(mode & ~monarch_wb_umask() & 07777));
}

/* chmod, chown, utime, truncate, link, symlink and mknod under a write-back path (`kind`: a
 * MONARCH_WB_SETTLE_*): the daemon puts on the PFS what the job changed at these paths first, then
 * the kernel makes the call as asked (NOT_OURS); a file being written is truncated or timed at its
 * local copy (*p1 replaced by its path) or given its mode by the daemon (0). */
static int monarch_wb_settle(int d1, const char **p1, int d2, const char *p2, long kind, mode_t mode)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (MONARCH_LIKELY(!monarch_nwb))
        return MONARCH_WB_NOT_OURS;
    int ia = p1 && monarch_wb_under(d1, *p1, a), ib = p2 && monarch_wb_under(d2, p2, b);
    if (!ia && !ib)
        return MONARCH_WB_NOT_OURS;
    int st = monarch_wb_ask(MONARCH_WB_SETTLE, ia ? a : "", ib ? b : "", kind, (long)(mode & 07777), monarch_wb_buf);
    if (st == INT_MIN)
        return MONARCH_WB_NOT_OURS;
    if (monarch_wb_failed(st)) {
        errno = st - MONARCH_WB_ERRNO;
        return -1;
    }
    if (st == MONARCH_WB_ANSWER_DONE)
        return 0;
    if (ia && strcmp(monarch_wb_buf, a) != 0)
        *p1 = monarch_wb_buf; /* the local copy of a file being written */
    return MONARCH_WB_NOT_OURS;
}

static uint32_t monarch_wb_seq_of(int fd)
{
    return (unsigned)fd < MONARCH_MAX_FDS ? __atomic_load_n(&monarch_wb_fd_seq[fd], __ATOMIC_RELAXED) : 0;
}

static int monarch_wb_is_mapped(uint32_t seq);

/* Before a close: the descriptor's write-back file, forgotten (0: none). */
static uint32_t monarch_wb_closing(int fd)
{
    if (MONARCH_LIKELY(!monarch_nwb) || (unsigned)fd >= MONARCH_MAX_FDS)
        return 0;
    uint32_t seq = monarch_wb_set(fd, 0);
    monarch_wb_closing_ns = seq ? monarch_wb_write_ns[fd] : 0;
    monarch_wb_closing_synced = seq && monarch_wb_synced_at[fd] == monarch_wb_writes[fd] && !monarch_wb_is_mapped(seq);
    return seq;
}

/* After it: the daemon publishes the file once no process holds it (errno kept). */
static void monarch_wb_closed(uint32_t seq)
{
    if (MONARCH_UNLIKELY(seq))
        monarch_wb_ask(monarch_wb_closing_synced ? MONARCH_WB_CLOSE_SYNCED : MONARCH_WB_CLOSE, NULL, NULL, (long)seq,
                       (long)monarch_wb_closing_ns, NULL);
}

/* After a successful fsync/fdatasync/msync: file seq's bytes so far on the PFS (0), or -1 and EIO. */
static int monarch_wb_sync_seq(uint32_t seq)
{
    if (!seq)
        return 0;
    int st = monarch_wb_ask(MONARCH_WB_SYNC, NULL, NULL, (long)seq, 0, NULL);
    if (st == 0)
        return 0;
    errno = st == INT_MIN ? EIO : st - MONARCH_WB_ERRNO;
    return -1;
}

static int monarch_wb_sync(int fd)
{
    uint32_t seq = monarch_wb_seq_of(fd);
    if (!seq)
        return 0;
    uint64_t writes = __atomic_load_n(&monarch_wb_writes[fd], __ATOMIC_RELAXED); /* before: a write meanwhile is after */
    int r = monarch_wb_sync_seq(seq);
    if (r == 0)
        monarch_wb_synced_at[fd] = writes;
    return r;
}

/* A shared mapping of a write-back file (mmap), or a range let go (munmap): what msync names. */
static void monarch_wb_mapped(int fd, void *p, size_t len, int flags)
{
    uint32_t seq = MONARCH_UNLIKELY(monarch_nwb) && (flags & MAP_SHARED) ? monarch_wb_seq_of(fd) : 0;
    if (!seq)
        return;
    while (__atomic_test_and_set(&monarch_wb_maps_lock, __ATOMIC_ACQUIRE))
        ;
    for (unsigned i = 0; i < MONARCH_WB_MAPS; i++)
        if (!monarch_wb_maps[i].seq) {
            monarch_wb_maps[i].start = (uintptr_t)p;
            monarch_wb_maps[i].end = (uintptr_t)p + len;
            monarch_wb_maps[i].seq = seq;
            break;
        }
    __atomic_clear(&monarch_wb_maps_lock, __ATOMIC_RELEASE);
}

/* (A range of a mapping let go forgets the whole mapping: an msync of what is left is the kernel's.) */
static uint32_t monarch_wb_mapping(uintptr_t addr, size_t len, int forget)
{
    uint32_t seq = 0;
    while (__atomic_test_and_set(&monarch_wb_maps_lock, __ATOMIC_ACQUIRE))
        ;
    for (unsigned i = 0; i < MONARCH_WB_MAPS; i++) {
        if (monarch_wb_maps[i].seq && addr < monarch_wb_maps[i].end && addr + len > monarch_wb_maps[i].start) {
            seq = monarch_wb_maps[i].seq;
            if (forget)
                monarch_wb_maps[i].seq = 0;
        }
    }
    __atomic_clear(&monarch_wb_maps_lock, __ATOMIC_RELEASE);
    return seq;
}

static int monarch_wb_is_mapped(uint32_t seq)
{
    for (unsigned i = 0; i < MONARCH_WB_MAPS; i++)
        if (__atomic_load_n(&monarch_wb_maps[i].seq, __ATOMIC_RELAXED) == seq)
            return 1;
    return 0;
}

static void monarch_wb_unmapped(void *addr, size_t len)
{
    if (MONARCH_UNLIKELY(monarch_nwb))
        monarch_wb_mapping((uintptr_t)addr, len ? len : 1, 1);
}

static void monarch_wb_dup(int oldfd, int newfd)
{
    if (MONARCH_LIKELY(!monarch_nwb) || (unsigned)oldfd >= MONARCH_MAX_FDS || (unsigned)newfd >= MONARCH_MAX_FDS)
        return;
    monarch_wb_set(newfd, __atomic_load_n(&monarch_wb_fd_seq[oldfd], __ATOMIC_RELAXED));
    monarch_wb_used[newfd] = monarch_wb_used[oldfd];
    monarch_wb_writes[newfd] = 0;
    monarch_wb_synced_at[newfd] = MONARCH_WB_NEVER; /* (its close says nothing of the other's fsync) */
    monarch_wb_granted[newfd] = monarch_wb_granted[oldfd];
    monarch_wb_write_ns[newfd] = 0;
}

/* The file behind fd moved to the PFS (monarch_wb_buf: its temporary path there, holding the bytes
 * so far): fd becomes a descriptor of it, same access and offset. 1 when it did. */
static int monarch_wb_move(int fd)
{
    __typeof__(real_fcntl) fcntl_ = MONARCH_RESOLVE(fcntl);
    int fl = fcntl_ ? fcntl_(fd, F_GETFL) : -1, fdfl = fcntl_ ? fcntl_(fd, F_GETFD) : -1;
    off_t off = lseek(fd, 0, SEEK_CUR);
    if (fl < 0 || fdfl < 0 || off < 0)
        return 0;
    int nfd = MONARCH_RESOLVE(openat)(AT_FDCWD, monarch_wb_buf, (fl & (O_ACCMODE | O_APPEND)) | O_CLOEXEC, 0);
    if (nfd < 0)
        return 0;
    int ok = lseek(nfd, off, SEEK_SET) == off
             && syscall(SYS_dup3, nfd, fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0) == fd;
    real_close(nfd);
    return ok;
}

/* Before a write of n bytes to fd: a write-back file's room reserved ahead (a wait while the room is
 * full), or the file moved to the PFS when it is larger than the room (docs/consistency.md, W6).
 * The time the write starts, to be told at its close (0: not a write-back descriptor). */
static uint64_t monarch_wb_writing(int fd, size_t n)
{
    uint32_t seq = MONARCH_UNLIKELY(monarch_nwb) ? monarch_wb_seq_of(fd) : 0;
    if (MONARCH_LIKELY(!seq))
        return 0;
    uint64_t need = monarch_wb_used[fd] + n;
    if (need > monarch_wb_granted[fd] && !monarch_wb_is_mapped(seq)) { /* (a mapped file is not moved) */
        int saved = errno;
        int st = monarch_wb_ask(MONARCH_WB_ROOM, NULL, NULL, (long)seq, (long)need, monarch_wb_buf);
        uint64_t granted = UINT64_MAX; /* no daemon to ask: the writes go on as they are */
        if (st == MONARCH_WB_ANSWER_SPILL) /* on the PFS from here: no more room to ask */
            monarch_wb_ask(MONARCH_WB_SPILLED, NULL, NULL, (long)seq, monarch_wb_move(fd), NULL);
        else if (st == MONARCH_WB_ANSWER_DONE)
            granted = strtoull(monarch_wb_buf, NULL, 10); /* this much, some ahead of the need */
        errno = saved;
        monarch_wb_granted[fd] = granted;
    }
    monarch_wb_used[fd] += n;
    __atomic_fetch_add(&monarch_wb_writes[fd], 1, __ATOMIC_RELAXED);
    return monarch_now_ns();
}

static void monarch_wb_wrote(int fd, uint64_t t0)
{
    if (MONARCH_UNLIKELY(t0) && (unsigned)fd < MONARCH_MAX_FDS)
        monarch_wb_write_ns[fd] += monarch_now_ns() - t0;
}

/* A process that leaves normally with write-back files open closes them as it goes (stdio flushes
 * its buffers after this runs, before the kernel closes the descriptors): told, so the daemon
 * publishes them once they are released. A killed process runs nothing: not told. */
__attribute__((destructor)) static void monarch_wb_at_exit(void)
{
    if (!monarch_nwb || !__atomic_load_n(&monarch_wb_held, __ATOMIC_RELAXED) || getpid() != monarch_pid)
        return;
    for (unsigned fd = 0; fd < MONARCH_MAX_FDS; fd++) {
        uint32_t seq = __atomic_load_n(&monarch_wb_fd_seq[fd], __ATOMIC_RELAXED);
        monarch_wb_closing_synced = 0; /* (stdio flushes after this) */
        if (seq)
            monarch_wb_closed(seq);
    }
}

/* fopen under a write-back path: its mode's open flags through monarch_wb_open, then a FILE on
 * the descriptor; 1 with *fpp (NULL and errno on failure) when answered here. */
static int monarch_wb_fopen(const char *path, const char *mode, FILE **fpp)
{
    if (!mode || !strchr("rwa", mode[0]))
        return 0;
    int plus = 0, excl = 0, cloexec = 0;
    char fdmode[8];
    size_t k = 0;
    for (const char *m = mode; *m && *m != ',' && k < sizeof fdmode - 1; m++) {
        plus |= *m == '+';
        excl |= *m == 'x';
        cloexec |= *m == 'e';
        if (*m != 'x' && *m != 'e')
            fdmode[k++] = *m; /* fdopen keeps the descriptor's flags */
    }
    fdmode[k] = '\0';
    int acc = plus ? O_RDWR : mode[0] == 'r' ? O_RDONLY : O_WRONLY;
    int flags = acc | (mode[0] == 'w' ? O_CREAT | O_TRUNC : mode[0] == 'a' ? O_CREAT | O_APPEND : 0)
                | (excl ? O_EXCL : 0) | (cloexec ? O_CLOEXEC : 0);
    int fd;
    if (!monarch_wb_open(AT_FDCWD, path, flags, 0666, &fd))
        return 0;
    *fpp = fd < 0 ? NULL : MONARCH_RESOLVE(fdopen)(fd, fdmode);
    if (fd >= 0 && !*fpp) {
        int saved = errno;
        uint32_t seq = monarch_wb_closing(fd); /* the file made here is told closed, as fclose would */
        real_close(fd);
        monarch_wb_closed(seq);
        errno = saved;
    }
    return 1;
}

/* fsync and fdatasync of a write-back file: its bytes so far on the PFS before they return
 * (docs/consistency.md, W5). Wrapped here, beside what they ask, not in shim_wrappers.c. */
MONARCH_EXPORT int fsync(int fd)
{
    MONARCH_REAL(fsync, -1)
    int r = real_(fd);
    return r == 0 && MONARCH_UNLIKELY(monarch_nwb) ? monarch_wb_sync(fd) : r;
}

MONARCH_EXPORT int fdatasync(int fd)
{
    MONARCH_REAL(fdatasync, -1)
    int r = real_(fd);
    return r == 0 && MONARCH_UNLIKELY(monarch_nwb) ? monarch_wb_sync(fd) : r;
}

/* sync_file_range's WAIT_AFTER asks for the range written out: a write-back file's, to the PFS (the
 * whole of its bytes so far: a superset of the range). Its other flags only start the writing. */
MONARCH_EXPORT int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags)
{
    MONARCH_REAL(sync_file_range, -1)
    int r = real_(fd, off, n, flags);
    return r == 0 && MONARCH_UNLIKELY(monarch_nwb) && (flags & SYNC_FILE_RANGE_WAIT_AFTER) ? monarch_wb_sync(fd) : r;
}

MONARCH_EXPORT int msync(void *addr, size_t len, int flags)
{
    MONARCH_REAL(msync, -1)
    int r = real_(addr, len, flags);
    if (r != 0 || MONARCH_LIKELY(!monarch_nwb) || !(flags & MS_SYNC))
        return r;
    return monarch_wb_sync_seq(monarch_wb_mapping((uintptr_t)addr, len ? len : 1, 0));
}

/* fchmod of a file being written sets the mode it is published with (its local copy stays 0600). */
MONARCH_EXPORT int fchmod(int fd, mode_t mode)
{
    MONARCH_REAL(fchmod, -1)
    monarch_invalidate_fd(fd);
    uint32_t seq = MONARCH_UNLIKELY(monarch_nwb) ? monarch_wb_seq_of(fd) : 0;
    if (!seq)
        return real_(fd, mode);
    int st = monarch_wb_ask(MONARCH_WB_FMODE, NULL, NULL, (long)seq, (long)(mode & 07777), NULL);
    if (st == INT_MIN || st == MONARCH_WB_ANSWER_DONE)
        return st == INT_MIN ? real_(fd, mode) : 0;
    errno = st - MONARCH_WB_ERRNO;
    return -1;
}
