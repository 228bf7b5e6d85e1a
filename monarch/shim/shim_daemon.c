/* Part of monarch_shim.c, one translation unit: included there, in order, after the
 * declarations it uses. Here: the daemon: one framed request per connection, and the wait for the snapshot index. */

/* ---- the daemon ---- */
static long monarch_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

/*
 * One request to the daemon (verb, key) over a fresh connection. Heartbeats
 * (STATUS_PENDING, empty) are skipped, each one restarting the "alive" timer.
 * Returns the answer's status, with its body in body[bodymax] (NUL-terminated;
 * NULL: the body is not wanted and not read) and a descriptor the daemon passed
 * in *fdp (-1 if none; fdp NULL: any is closed), or INT_MIN when the daemon cannot
 * be asked, is not of our uid, goes silent, takes more than total_ms in all or breaks
 * the frame rules (an oversized body, a NUL in it, a heartbeat with a body).
 */
static int monarch_request(unsigned verb, const char *key, size_t kl, char *body, size_t bodymax, int *fdp,
                           int total_ms)
{
    unsigned char req[MONARCH_REQUEST_HEADER_SIZE + MONARCH_KEY_MAX];
    if (!monarch_have_socket || kl > MONARCH_MAX_REQUEST || kl > MONARCH_KEY_MAX)
        return INT_MIN;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return INT_MIN;
    int status = INT_MIN;
    long start = monarch_now_ms(), deadline = start + total_ms;
    int tmo = total_ms < MONARCH_HEARTBEAT_TIMEOUT_MS ? total_ms : MONARCH_HEARTBEAT_TIMEOUT_MS;
    struct timeval tv = {tmo / 1000, (tmo % 1000) * 1000};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect and send */
    if (connect(s, (const struct sockaddr *)&monarch_sockaddr, sizeof monarch_sockaddr) != 0) {
        MONARCH_DEBUG(1, "daemon %s: connect: %s", monarch_sockaddr.sun_path, strerror(errno));
        goto out;
    }
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || clen != sizeof cred || cred.uid != getuid()) {
        MONARCH_DEBUG(1, "daemon %s: peer uid %d is not ours (%d); not asking it", monarch_sockaddr.sun_path,
                      clen == sizeof cred ? (int)cred.uid : -1, (int)getuid());
        goto out;
    }
    req[0] = (unsigned char)verb;
    req[1] = req[2] = req[3] = 0;
    for (int i = 0; i < 4; i++)
        req[4 + i] = (unsigned char)(kl >> (8 * i));
    memcpy(req + MONARCH_REQUEST_HEADER_SIZE, key, kl);
    size_t len = MONARCH_REQUEST_HEADER_SIZE + kl;
    for (size_t off = 0; off < len;) {
        ssize_t w = send(s, req + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            MONARCH_DEBUG(1, "daemon: send: %s", strerror(errno));
            goto out;
        }
        off += (size_t)w;
    }
    for (;;) {
        unsigned char hdr[MONARCH_ANSWER_HEADER_SIZE];
        long alive = monarch_now_ms() + MONARCH_HEARTBEAT_TIMEOUT_MS;
        if (monarch_recv_exact(s, hdr, sizeof hdr, alive < deadline ? alive : deadline, fdp) != 0) {
            MONARCH_DEBUG(1, "daemon: no answer (silent for %d ms, or %d ms in all)", MONARCH_HEARTBEAT_TIMEOUT_MS,
                          total_ms);
            goto out;
        }
        int32_t st = (int32_t)monarch_le32(hdr);
        uint32_t blen = monarch_le32(hdr + 4);
        if (st == MONARCH_STATUS_PENDING) {
            if (blen) {
                MONARCH_DEBUG(1, "daemon: heartbeat with a %u-byte body", blen);
                goto out;
            }
            MONARCH_DEBUG(2, "daemon: pending (%ld ms)", monarch_now_ms() - start);
            continue;
        }
        if (body) {
            if (blen >= bodymax) {
                MONARCH_DEBUG(1, "daemon: answer of %u bytes refused (limit %zu)", blen, bodymax - 1);
                goto out;
            }
            alive = monarch_now_ms() + MONARCH_HEARTBEAT_TIMEOUT_MS;
            if (monarch_recv_exact(s, body, blen, alive < deadline ? alive : deadline, fdp) != 0)
                goto out;
            if (memchr(body, '\0', blen)) {
                MONARCH_DEBUG(1, "daemon: answer with a NUL byte refused");
                goto out;
            }
            body[blen] = '\0';
        }
        status = st;
        break;
    }
out:
    real_close(s);
    if (status == INT_MIN && fdp && *fdp >= 0) {
        real_close(*fdp);
        *fdp = -1;
    }
    return status;
}

/* Is an OPEN answer's path one we may open: absolute, inside a probe dir, no "..". */
static int monarch_answer_allowed(const char *path)
{
    if (path[0] != '/' || monarch_has_dotdot(path))
        return 0;
    for (unsigned i = 0; i < monarch_nprobes; i++) {
        const struct monarch_probe *pr = &monarch_probes[i];
        if (strncmp(path, pr->dir, pr->len) == 0 && path[pr->len] == '/' && path[pr->len + 1])
            return 1;
    }
    return 0;
}

/* ---- waiting for the snapshot index ----
 * A process started before the daemon's walk ended finds no index at start. Its first
 * call that needs one (a metadata call or a read-only open under a root) asks the daemon
 * INDEX, which holds the request until the index is written (heartbeats meanwhile) or
 * says the snapshot failed. The wait is bounded: MONARCH_SHIM_INDEX_WAIT_MS in all, and
 * HEARTBEAT_TIMEOUT_MS of silence. Then, once for the process:
 *   ready        map it (MAPPED), or NONE if it cannot be mapped (as without an index);
 *   failed, lost, silent, too long: OFF -- every call under a root goes to the PFS, and
 *                no tier is probed (kept copies are checked against the snapshot before
 *                the index appears: without it, nobody vouches for them).
 * Each waiting thread asks on its own connection (nothing shared is held while waiting:
 * a fork or a signal meanwhile cannot deadlock); the first answer installs the verdict,
 * one thread at a time (INSTALLING, a few microseconds), the later ones take it.
 * fstat of a staged descriptor never waits: a descriptor is a staged copy only through an
 * open that waited (the fd tables do not survive exec).
 */
static int monarch_index_settle(void)
{
    int s = __atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE);
    while (s < MONARCH_IX_MAPPED) {
        if (s == MONARCH_IX_INSTALLING) {
            sched_yield();
            s = __atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE);
            continue;
        }
        long t0 = monarch_now_ms();
        MONARCH_DEBUG(1, "index %s: not there yet; waiting for the daemon's snapshot", monarch_index_path);
        int answer = monarch_request(MONARCH_VERB_INDEX, "", 0, NULL, 0, NULL, monarch_index_wait_ms);
        int expected = MONARCH_IX_UNKNOWN;
        if (!__atomic_compare_exchange_n(&monarch_index_state, &expected, MONARCH_IX_INSTALLING, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            s = expected; /* another thread settled it meanwhile */
            continue;
        }
        int missing = 0;
        if (answer == INT_MIN || answer == MONARCH_INDEX_NONE)
            s = MONARCH_IX_OFF;
        else /* ready; or a daemon that does not know INDEX (it wrote its index before serving) */
            s = monarch_map_index(monarch_index_path, &missing) == 0 ? MONARCH_IX_MAPPED : MONARCH_IX_NONE;
        MONARCH_DEBUG(1, "index %s: %s after %ld ms (daemon %d)", monarch_index_path,
                      s == MONARCH_IX_MAPPED ? "mapped" : s == MONARCH_IX_NONE ? "unusable" : "none: the PFS",
                      monarch_now_ms() - t0, answer);
        __atomic_store_n(&monarch_index_state, s, __ATOMIC_RELEASE);
    }
    return s;
}
