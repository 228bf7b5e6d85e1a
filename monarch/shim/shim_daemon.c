/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_daemon.h).
 * Here: the daemon: a framed request, on the connection a thread kept or a fresh one, and the wait
 * for the snapshot index. */
#include "shim_daemon.h"

/* ---- the daemon ---- */
static long monarch_now_ms(void) /* the shared clock (monarch_native.h), in ms */
{
    return (long)(monarch_now_ns() / 1000000);
}

/* Keep the first descriptor a daemon passed (in *fdp, if wanted and still free) and close
 * every other one: nothing the daemon sends can leak descriptors into the application. */
static void monarch_take_fds(struct msghdr *m, int *fdp)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (fdp && *fdp < 0)
                *fdp = fd;
            else
                real_close(fd);
        }
    }
}

/* Exactly n bytes from s before deadline (ms, monotonic); -1 on timeout, error or EOF.
 * A descriptor passed with them (SCM_RIGHTS) goes to *fdp (see monarch_take_fds). */
static int monarch_recv_exact(int s, void *buf, size_t n, long deadline, int *fdp)
{
    size_t got = 0;
    while (got < n) {
        long left = deadline - monarch_now_ms();
        if (left <= 0)
            return -1;
        struct pollfd pfd = {s, POLLIN, 0};
        int pr = poll(&pfd, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue; /* timeout: the deadline check above ends the loop */
        union {
            struct cmsghdr align;
            char bytes[CMSG_SPACE(MONARCH_MAX_PASSED_FDS * sizeof(int))];
        } control;
        struct iovec iov = {(char *)buf + got, n - got};
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = control.bytes;
        m.msg_controllen = sizeof control.bytes;
        ssize_t r = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
        if (r >= 0)
            monarch_take_fds(&m, fdp);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0) {
            MONARCH_DEBUG(1, "daemon: %s", r == 0 ? "closed without answer" : strerror(errno));
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

static uint32_t monarch_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Why a request got no answer (monarch_request_why): the daemon was asked and is alive but
 * took all of total_ms (BUSY: a walk, a slow copy), or it could not be asked, closed, broke
 * the frame rules or went silent for HEARTBEAT_TIMEOUT_MS (LOST). */

/* ---- the connection kept for the next OPEN ----
 * Each thread keeps the connection of its last OPEN when the front door kept it (asked
 * with REQUEST_KEEP, answered with ANSWER_KEPT) and sends its next OPEN on it: no connect,
 * accept or close per open. Per thread, not per process: an OPEN may wait for a copy or
 * another node's file, and a lock would make every other thread of the process wait with it
 * (8 reader threads hold 8 descriptors, one each at most). Never shared across a fork: the
 * atfork child handler closes the forking thread's copy (the parent's stays the parent's),
 * and a vfork child (same memory, another pid) neither uses nor resets it. Before each use
 * it is checked to be the socket it was (fstat: a socket, same inode): an application that
 * closed or dup2'd over that number keeps its descriptor, and the shim connects anew. A
 * signal handler's open during a request (busy) takes a fresh connection. Any failure on the
 * kept connection (closed by the door or a restarted daemon, an odd answer) closes it and
 * sends the request once more on a fresh connection; then the PFS, as ever. A thread's
 * connection is closed when it exits (a thread-specific key's destructor).
 */
static __thread int monarch_conn_fd __attribute__((tls_model("initial-exec"))) = -1;
static __thread int monarch_conn_busy __attribute__((tls_model("initial-exec")));
static __thread pid_t monarch_conn_pid __attribute__((tls_model("initial-exec")));
static __thread ino_t monarch_conn_ino __attribute__((tls_model("initial-exec")));
static __thread dev_t monarch_conn_dev __attribute__((tls_model("initial-exec")));
static pthread_key_t monarch_conn_key; /* its destructor closes an exiting thread's connection */
static int monarch_conn_key_ok;

/* Is this thread's kept descriptor still the socket it kept (no one closed or replaced it)? */
static int monarch_conn_still_ours(void)
{
    struct stat st;
    return monarch_conn_fd >= 0 &&
           syscall(SYS_newfstatat, monarch_conn_fd, "", &st, AT_EMPTY_PATH) == 0 && S_ISSOCK(st.st_mode) &&
           st.st_ino == monarch_conn_ino && st.st_dev == monarch_conn_dev;
}

/* Forget this thread's kept connection, closing it if the descriptor is still that socket. */
static void monarch_conn_drop(void)
{
    if (monarch_conn_fd >= 0 && monarch_conn_still_ours())
        real_close(monarch_conn_fd);
    monarch_conn_fd = -1;
}

static void monarch_conn_thread_exit(void *unused)
{
    (void)unused;
    if (monarch_conn_fd >= 0 && monarch_conn_pid == getpid())
        monarch_conn_drop();
    monarch_pages_thread_exit();
    monarch_wb_thread_exit();
}

/* This thread's exit closes its connections (monarch_conn_thread_exit): said once it keeps one. */
static void monarch_conn_close_at_exit(void)
{
    if (monarch_conn_key_ok)
        pthread_setspecific(monarch_conn_key, (void *)1);
}

/* At start-up (monarch_init): the key whose destructor closes an exiting thread's connection. */
static void monarch_conn_init(void)
{
    monarch_conn_key_ok = pthread_key_create(&monarch_conn_key, monarch_conn_thread_exit) == 0;
}

/* Keep ``s`` as this thread's connection (the door kept it); closed if it cannot be kept. */
static void monarch_conn_keep(int s)
{
    struct stat st;
    if (!monarch_conn_key_ok || syscall(SYS_newfstatat, s, "", &st, AT_EMPTY_PATH) != 0 ||
        pthread_setspecific(monarch_conn_key, (void *)1) != 0) {  /* once a thread: its destructor runs */
        real_close(s);
        return;
    }
    monarch_conn_fd = s;
    monarch_conn_pid = getpid();
    monarch_conn_ino = st.st_ino;
    monarch_conn_dev = st.st_dev;
}

/* ---- one request ---- */

/* A fresh connection to the daemon's socket at ``addr`` (its uid checked), or -1. */
static int monarch_connect_to(const struct sockaddr_un *addr, int tmo)
{
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct timeval tv = {tmo / 1000, (tmo % 1000) * 1000};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect and send */
    if (connect(s, (const struct sockaddr *)addr, sizeof *addr) != 0) {
        MONARCH_DEBUG(1, "daemon %s: connect: %s", addr->sun_path, strerror(errno));
        real_close(s);
        return -1;
    }
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || clen != sizeof cred || cred.uid != getuid()) {
        MONARCH_DEBUG(1, "daemon %s: peer uid %d is not ours (%d); not asking it", addr->sun_path,
                      clen == sizeof cred ? (int)cred.uid : -1, (int)getuid());
        if (clen == sizeof cred)
            monarch_view_daemon_uid((unsigned)cred.uid); /* never again in this process: no retry per open */
        real_close(s);
        return -1;
    }
    return s;
}

/* A fresh connection to the daemon's main socket, or -1. */
static int monarch_connect(int tmo)
{
    return monarch_connect_to(&monarch_sockaddr, tmo);
}

/* One request on ``s`` (the frame's flags byte ``flags``) and its answer (see
 * monarch_request_why), or INT_MIN; *busy: it ran out of time on a live daemon. */
static int monarch_exchange(int s, unsigned verb, unsigned flags, const char *key, size_t kl, char *body,
                            size_t bodymax, int *fdp, long start, long deadline, int *busy)
{
    unsigned char req[MONARCH_REQUEST_HEADER_SIZE + MONARCH_KEY_MAX];
    req[0] = (unsigned char)verb;
    req[1] = (unsigned char)flags;
    req[2] = req[3] = 0;
    for (int i = 0; i < 4; i++)
        req[4 + i] = (unsigned char)(kl >> (8 * i));
    memcpy(req + MONARCH_REQUEST_HEADER_SIZE, key, kl);
    size_t len = MONARCH_REQUEST_HEADER_SIZE + kl;
    *busy = 0;
    for (size_t off = 0; off < len;) {
        ssize_t w = send(s, req + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            MONARCH_DEBUG(1, "daemon: send: %s", strerror(errno));
            return INT_MIN;
        }
        off += (size_t)w;
    }
    for (;;) {
        unsigned char hdr[MONARCH_ANSWER_HEADER_SIZE];
        long alive = monarch_now_ms() + MONARCH_HEARTBEAT_TIMEOUT_MS;
        if (monarch_recv_exact(s, hdr, sizeof hdr, alive < deadline ? alive : deadline, fdp) != 0) {
            *busy = deadline <= alive && monarch_now_ms() >= deadline; /* not silence, not EOF: time */
            MONARCH_DEBUG(1, "daemon: no answer (%s)", *busy ? "busy for all the time given" : "silent, closed or gone");
            return INT_MIN;
        }
        int32_t st = (int32_t)monarch_le32(hdr);
        uint32_t blen = monarch_le32(hdr + 4);
        if (st == MONARCH_STATUS_PENDING) {
            if (blen) {
                MONARCH_DEBUG(1, "daemon: heartbeat with a %u-byte body", blen);
                return INT_MIN;
            }
            MONARCH_DEBUG(2, "daemon: pending (%ld ms)", monarch_now_ms() - start);
            continue;
        }
        if (body) {
            if (blen >= bodymax) {
                MONARCH_DEBUG(1, "daemon: answer of %u bytes refused (limit %zu)", blen, bodymax - 1);
                return INT_MIN;
            }
            alive = monarch_now_ms() + MONARCH_HEARTBEAT_TIMEOUT_MS;
            if (monarch_recv_exact(s, body, blen, alive < deadline ? alive : deadline, fdp) != 0)
                return INT_MIN;
            if (memchr(body, '\0', blen)) {
                MONARCH_DEBUG(1, "daemon: answer with a NUL byte refused");
                return INT_MIN;
            }
            body[blen] = '\0';
        }
        return st;
    }
}

/*
 * One request to the daemon (verb, key): an OPEN on this thread's kept connection if it has
 * one (then, if that fails, once more on a fresh one), anything else on a fresh connection.
 * Heartbeats (STATUS_PENDING, empty) are skipped, each one restarting the "alive" timer.
 * Returns the answer's status, with its body in body[bodymax] (NUL-terminated;
 * NULL: the body is not wanted and not read) and a descriptor the daemon passed
 * in *fdp (-1 if none; fdp NULL: any is closed), or INT_MIN when the daemon cannot
 * be asked, is not of our uid, goes silent, takes more than total_ms in all or breaks
 * the frame rules (an oversized body, a NUL in it, a heartbeat with a body); then
 * *why (if not NULL) says BUSY (total_ms ran out on a daemon that kept the connection
 * and was not silent for HEARTBEAT_TIMEOUT_MS) or LOST (anything else).
 */
static int monarch_request_why(unsigned verb, const char *key, size_t kl, char *body, size_t bodymax, int *fdp,
                               int total_ms, int *why)
{
    int busy = 0;
    if (why)
        *why = MONARCH_LOST;
    if (!monarch_have_socket || kl > MONARCH_MAX_REQUEST || kl > MONARCH_KEY_MAX)
        return INT_MIN;
    int status = INT_MIN;
    long start = monarch_now_ms(), deadline = start + total_ms;
    int tmo = total_ms < MONARCH_HEARTBEAT_TIMEOUT_MS ? total_ms : MONARCH_HEARTBEAT_TIMEOUT_MS;
    /* an OPEN keeps its connection, unless this is a vfork child (the parent's memory) or a
     * signal handler's open during another request of this thread */
    int keep = verb == MONARCH_VERB_OPEN && body && !monarch_conn_busy && monarch_conn_key_ok;
    pid_t pid = keep ? getpid() : 0;
    if (keep && monarch_conn_fd >= 0 && monarch_conn_pid != pid)
        keep = 0;
    if (keep)
        monarch_conn_busy = 1;
    for (int attempt = 0; attempt < 2 && status == INT_MIN && !busy; attempt++) {
        int s = -1, reused = 0;
        if (keep && monarch_conn_fd >= 0) {
            if (monarch_conn_still_ours()) {
                s = monarch_conn_fd;
                reused = 1;
            }
            monarch_conn_fd = -1;      /* taken (kept again below if the door keeps it) */
        }
        if (s < 0 && (s = monarch_connect(tmo)) < 0)
            break;
        status = monarch_exchange(s, verb, keep ? MONARCH_REQUEST_KEEP : 0, key, kl, body, bodymax, fdp, start,
                                  deadline, &busy);
        int kept = keep && status >= 0 && (status & MONARCH_ANSWER_KEPT);
        if (kept)
            status &= ~MONARCH_ANSWER_KEPT;
        if (status == INT_MIN && fdp && *fdp >= 0) {
            real_close(*fdp);
            *fdp = -1;
        }
        if (kept)
            monarch_conn_keep(s);
        else
            real_close(s);
        if (!reused)
            break;                     /* a fresh connection's failure is the answer */
        if (status == INT_MIN)
            MONARCH_DEBUG(1, "daemon: the kept connection failed; once more on a fresh one");
    }
    if (keep)
        monarch_conn_busy = 0;
    if (why)
        *why = status != INT_MIN ? MONARCH_ANSWERED : busy ? MONARCH_BUSY : MONARCH_LOST;
    return status;
}

static int monarch_request(unsigned verb, const char *key, size_t kl, char *body, size_t bodymax, int *fdp,
                           int total_ms)
{
    return monarch_request_why(verb, key, kl, body, bodymax, fdp, total_ms, NULL);
}

/* Is an OPEN answer's path one we may open: absolute, inside a probe dir, no "..". */
static int monarch_answer_allowed(const char *path)
{
    if (path[0] != '/' || monarch_has_dotdot(path))
        return 0;
    for (unsigned i = 0; i < monarch_nprobes; i++) {
        const struct monarch_probe *pr = &monarch_probes[i];
        if (strncmp(path, pr->dir, pr->len) == 0 && path[pr->len] == '/' && path[pr->len + 1]
            && __atomic_load_n(&pr->fd, __ATOMIC_RELAXED) != MONARCH_PROBE_UNSEEN)
            return 1;
    }
    return 0;
}

/* ---- waiting for the snapshot index ----
 * A process started before the daemon's walk ended finds no index at start. Its first
 * call that needs one (a metadata call or a read-only open under a root) asks the daemon
 * INDEX, which holds the request until the index is written (heartbeats meanwhile) or
 * says the snapshot failed. That wait is bounded by MONARCH_SHIM_INDEX_WAIT_MS (a few
 * hundred ms by default) and HEARTBEAT_TIMEOUT_MS of silence: a walk of millions of files
 * takes a minute, and the application's first stat must not wait for all of it. Then:
 *   ready        map it (MAPPED), or NONE if it cannot be mapped (as without an index);
 *   failed       OFF, for good: every call under a root goes to the PFS;
 *   not yet      EARLY: the daemon is alive (it kept the connection, or answered WALKING);
 *   lost, silent LOST: it could not be reached, closed, or said nothing for 1.5 s.
 * EARLY and LOST are not final: the calls go to the PFS, counted (EXTRA_EARLY_* or
 * EXTRA_LOST_*), and no tier is probed (kept copies are checked against the snapshot
 * before the index appears: until then nobody vouches for them); one thread at a time, at
 * most every INDEX_LOOK_MS, looks for the index file (one openat: the daemon writes it
 * under a fresh name renamed into place once the copies are checked, the same file the
 * constructor maps when it is there at start), and at most every INDEX_ASK_MS polls the
 * daemon (INDEX_POLL: answered at once, by the front door's threads while the walk runs,
 * so a daemon busy walking is never taken for a lost one), bounded by the same wait.
 * The process uses the index from the first call after it is written.
 * Each waiting thread asks on its own connection (nothing shared is held while waiting:
 * a fork or a signal meanwhile cannot deadlock); the first answer installs the verdict,
 * one thread at a time (INSTALLING, a few microseconds), the later ones take it.
 * fstat of a staged descriptor never waits: a descriptor is a staged copy only through an
 * open that found the index mapped (the fd tables do not survive exec).
 */
#define MONARCH_INDEX_LOOK_MS 10  /* EARLY, LOST: look for the index file at most this often */
#define MONARCH_INDEX_ASK_MS 500  /* ... and poll the daemon at most this often */
static long monarch_index_next_look, monarch_index_next_ask; /* monotonic ms; 0: at once */

/* Install a verdict on the index from state `from` (UNKNOWN, EARLY, LOST): one thread
 * does (0), the others see the state another thread installed meanwhile (-1, *sp). */
static int monarch_index_install(int from, int answer, int unanswered, long t0, int *sp)
{
    int expected = from;
    if (!__atomic_compare_exchange_n(&monarch_index_state, &expected, MONARCH_IX_INSTALLING, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        *sp = expected; /* another thread settled it meanwhile */
        return -1;
    }
    int missing = 0, s;
    if (answer == MONARCH_INDEX_NONE)
        s = MONARCH_IX_OFF;
    else if (monarch_map_index(monarch_index_path, &missing) == 0)
        s = MONARCH_IX_MAPPED; /* written (whatever the daemon said, or before it was asked) */
    else if (missing && (answer == INT_MIN || answer == MONARCH_INDEX_WALKING))
        s = answer == INT_MIN && unanswered == MONARCH_LOST ? MONARCH_IX_LOST : MONARCH_IX_EARLY;
    else if (missing && from != MONARCH_IX_UNKNOWN && answer == INT_MAX)
        s = from; /* only looked for the file: not there yet */
    else /* ready, yet unusable; or a daemon that does not know INDEX (it wrote its index before serving) */
        s = MONARCH_IX_NONE;
    long now = monarch_now_ms();
    __atomic_store_n(&monarch_index_next_look, now + MONARCH_INDEX_LOOK_MS, __ATOMIC_RELAXED);
    if (answer != INT_MAX)
        __atomic_store_n(&monarch_index_next_ask, now + MONARCH_INDEX_ASK_MS, __ATOMIC_RELAXED);
    if (s != from || answer != INT_MAX)
        MONARCH_DEBUG(1, "index %s: %s after %ld ms (daemon %d)", monarch_index_path,
                      s == MONARCH_IX_MAPPED ? "mapped" : s == MONARCH_IX_NONE ? "unusable"
                      : s == MONARCH_IX_EARLY ? "not ready yet: the PFS meanwhile"
                      : s == MONARCH_IX_LOST ? "daemon lost: the PFS meanwhile" : "none: the PFS",
                      now - t0, answer);
    __atomic_store_n(&monarch_index_state, s, __ATOMIC_RELEASE);
    *sp = s;
    return 0;
}

/* EARLY or LOST: look again if it is time and no other thread does (never longer than the
 * wait); the state to act on now. */
static int monarch_index_look_again(int s)
{
    long now = monarch_now_ms();
    long next = __atomic_load_n(&monarch_index_next_look, __ATOMIC_RELAXED);
    if (now < next || !__atomic_compare_exchange_n(&monarch_index_next_look, &next, now + 3600L * 1000, 0,
                                                   __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return s; /* looked a moment ago, or another thread looks now: the PFS for this call */
    int answer = INT_MAX, unanswered = MONARCH_ANSWERED; /* INT_MAX: the daemon not asked */
    int missing = 0;
    struct stat st;
    /* the file first: it is there as soon as it is written, whatever the daemon is doing */
    if (syscall(SYS_newfstatat, AT_FDCWD, monarch_index_path, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        missing = errno == ENOENT;
        if (missing && now >= __atomic_load_n(&monarch_index_next_ask, __ATOMIC_RELAXED)) {
            static const char poll_body[] = MONARCH_INDEX_POLL;
            answer = monarch_request_why(MONARCH_VERB_INDEX, poll_body, sizeof poll_body - 1, NULL, 0, NULL,
                                         monarch_index_wait_ms, &unanswered);
            if (answer == INT_MIN || answer == MONARCH_INDEX_WALKING || answer == MONARCH_INDEX_READY
                || answer == MONARCH_INDEX_NONE)
                ; /* known answers */
            else
                answer = MONARCH_INDEX_WALKING; /* an error frame: alive, not ready */
        } else if (missing) {
            __atomic_store_n(&monarch_index_next_look, now + MONARCH_INDEX_LOOK_MS, __ATOMIC_RELAXED);
            return s;
        }
    }
    monarch_index_install(s, answer, unanswered, now, &s);
    return s;
}

static int monarch_index_settle(void)
{
    int s = __atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE);
    while (s < MONARCH_IX_MAPPED) {
        if (s == MONARCH_IX_INSTALLING) {
            sched_yield();
            s = __atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE);
            continue;
        }
        if (s == MONARCH_IX_EARLY || s == MONARCH_IX_LOST)
            return monarch_index_look_again(s);
        long t0 = monarch_now_ms();
        int unanswered;
        MONARCH_DEBUG(1, "index %s: not there yet; waiting for the daemon's snapshot (%d ms at most)",
                      monarch_index_path, monarch_index_wait_ms);
        int answer = monarch_request_why(MONARCH_VERB_INDEX, "", 0, NULL, 0, NULL, monarch_index_wait_ms,
                                         &unanswered);
        if (monarch_index_install(MONARCH_IX_UNKNOWN, answer, unanswered, t0, &s) == 0)
            break;
    }
    return s;
}

/* Is the index state one in which calls under a root go to the PFS for now (EARLY, LOST)?
 * The counter to add them to (EXTRA_EARLY_* or EXTRA_LOST_*, opens; meta is +1), or -1. */
static inline int monarch_index_pending_extra(int s)
{
    return s == MONARCH_IX_EARLY ? MONARCH_EXTRA_EARLY_OPENS : s == MONARCH_IX_LOST ? MONARCH_EXTRA_LOST_OPENS : -1;
}

/* ---- fork ---- */
/* A fork child's share of the daemon's state (shim_fork.c's handler: async-signal-safe, and a
 * store only where something changes): the forking thread's kept connection is the parent's (this
 * copy closed), and the child looks for the index when it next needs it. */
static void monarch_daemon_atfork_child(void)
{
    if (monarch_conn_fd >= 0)
        monarch_conn_drop();
    if (monarch_conn_busy)
        monarch_conn_busy = 0;
    if (monarch_index_next_look)
        monarch_index_next_look = 0;
    monarch_pages_atfork_child();
}
