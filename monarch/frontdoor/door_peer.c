/* Part of front_door.c, one translation unit (what it gives the other parts: door_peer.h). Here:
 * the peer lane: another node's file fetched through the C data path, into the peer area or a
 * sealed memfd (the memfd rule), the opens of one owner gathered into one request (remote_open,
 * run_owner, fetch_batch). */
#include "door_peer.h"

static int64_t peer_room(const struct door *d, uint64_t size)   /* sizes.allocated_size */
{
    return ((int64_t)size + d->peer.unit - 1) / d->peer.unit * d->peer.unit;
}

/* May the door copy index entry ``entry`` from the PFS? Alone on a node, any; on a sharded
 * node only its own, and none before the owners are known. Under the lock. */
static int own_file_locked(const struct door *d, uint32_t entry)
{
    return !d->peer.own_only || entry_is_mine(&d->peer.owners, entry);
}

/* How many of index entries 1 to ``n`` the door may copy: all alone on a node; on a sharded node
 * its own, or all of them before its owners are known (room made as if it were alone). Under the
 * lock. */
static uint32_t own_files_locked(const struct door *d, uint32_t n)
{
    if (!d->peer.own_only || !(d->peer.owners.table || d->peer.owners.mine))
        return n;
    return entries_mine(&d->peer.owners, n);
}

/* The owner of the file ``f`` if the peer lane fetches it (another node's, small), else -1.
 * Under the lock. Not the route published in the index: that one is the file's static route on
 * this node (size, kind, store), written before a sharded cluster's owners arrive; whose file it
 * is comes from the door's owner table (front_door_peers), so the PEER_LANE row is tested
 * here, on the owner and the row's size. */
static int peer_owner_locked(const struct door *d, const struct idx_file *f)
{
    if (!d->peer.fetch || !d->peer.allowed || d->never_copy || !S_ISREG(f->mode) ||
        !monarch_route_fits(MONARCH_ROUTE_PEER_LANE, f->size))
        return -1;
    int owner = entry_owner(d, &d->peer.owners, f->entry);
    return owner >= 0 && owner != d->peer.self_node ? owner : -1;
}

/* An OPEN answered with a descriptor (ANSWER_FD): the frame and ``passed`` in one message. */
static int send_answer_fd(int fd, int32_t status, int passed)
{
    char frame[8] = {0};
    memcpy(frame, &status, 4);
    struct iovec iov = {frame, sizeof frame};
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &passed, sizeof(int));
    return sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof frame ? 0 : -1;
}

/* -- which remote files go into the peer area: the memfd rule ---------------------------- */
/* A copy kept in the area costs P (here: create, write, futimens, close, rename; in Python: its
 * booking, its place in the LRU, its eviction's unlink) where a memfd costs M (create, write,
 * seal); each later open of a kept copy is then a probe hit H in the application (the shim
 * opens it itself), of a memfd's file another fetch F (requester and owner) and memfd. With r
 * later opens per copy the area pays when F + P + r*H < (1 + r)*(F + M), i.e. r > (P - M) /
 * (F + M - H). REUSE_MIN, 1/2, is the middle of the break-even's measured range
 * (docs/performance.md, "What the constants rest on").
 * r is measured, not guessed: 1 fetch in PEER_SAMPLE still goes into the area (all of them
 * while r is above REUSE_MIN), and r is the opens the shim counted in the peer slot
 * (front_door_peer_reuse) less those the door answered with a fresh fetch, per copy made. An
 * epoch that reads each file once measures r ~ 0 (memfds); one that rereads what the area
 * holds measures r ~ 1 and keeps everything. */
#define PEER_SAMPLE 8                  /* 1 fetch in this many into the area while r is low */
#define REUSE_WINDOW 32                /* copies made plus opens again per measure of r */
#define REUSE_MIN_NUM 1                /* r's break-even, REUSE_MIN_NUM / REUSE_MIN_DEN (above) */
#define REUSE_MIN_DEN 2

/* r measured again once the window holds REUSE_WINDOW copies made and opens again (those on
 * their own when the area serves every open: a rereading epoch closes its windows too), the
 * windows before it weighing half as much each: the copies made now are opened again later,
 * not in their own window, whose r a run of files missing from the area would make look low.
 * The door counts its answers before it sends them: the shim's count of the same opens lags,
 * never leads, and a lag only makes r look lower. Under the lock. */
static void measure_reuse_locked(struct door *d)
{
    uint64_t opens = __atomic_load_n(d->peer.reuse.opens, __ATOMIC_RELAXED);
    uint64_t first = __atomic_load_n(&d->peer.reuse.first, __ATOMIC_RELAXED);
    int64_t again = (int64_t)(opens - d->peer.reuse.opens_at) - (int64_t)(first - d->peer.reuse.first_at);
    if (again < 0)
        again = 0;
    if (again + (int64_t)d->peer.reuse.copies < REUSE_WINDOW)
        return;
    d->peer.reuse.again_sum = d->peer.reuse.again_sum / 2 + again;
    d->peer.reuse.copies_sum = d->peer.reuse.copies_sum / 2 + (int64_t)d->peer.reuse.copies;
    d->peer.reuse.keep_all = d->peer.reuse.again_sum * REUSE_MIN_DEN >= d->peer.reuse.copies_sum * REUSE_MIN_NUM;
    d->peer.reuse.permille = (uint64_t)(1000 * d->peer.reuse.again_sum / (d->peer.reuse.copies_sum ? d->peer.reuse.copies_sum : 1));
    d->peer.reuse.opens_at = opens;
    d->peer.reuse.first_at = first;
    d->peer.reuse.copies = 0;
}

/* Into the peer area (1, its room taken from the lease) or a memfd (0)? Under the lock. */
static int to_area_locked(struct door *d, const struct idx_file *f)
{
    if (peer_room(d, f->size) > d->books.lease[Q_PEER])
        return 0;                      /* no room lent: the area is full of young copies */
    if (d->peer.reuse.opens) {
        measure_reuse_locked(d);
        if (!d->peer.reuse.keep_all && d->peer.reuse.seq++ % PEER_SAMPLE)
            return 0;
        d->peer.reuse.copies++;
    }
    d->books.lease[Q_PEER] -= peer_room(d, f->size);  /* its blocks, not its bytes: never removed for want of room */
    return 1;
}

/* -- the opens of one owner, gathered ------------------------------------------------- */
/* A remote open waits in its owner's queue; the workers that fetch from that owner (as many at
 * once as its measure allows: inflight.c's rule, files a second against requests in flight,
 * slow start from PEER_INFLIGHT_LOW, never below it) each take what waits there as one batch (one request,
 * one reply: peer_fetch_many), so the opens that arrive during a round trip go together in
 * the next. The worker that read such an OPEN goes back to its loop when that owner's fetches
 * are all under way, or when half the workers fetch (peer_fetchers_max). */
#define PEER_INFLIGHT_LOW 4            /* requests in flight to an owner, at least (and at first): bench_peer
                                          with 8 readers, 1 fixed gave 8,500 remote opens/s, 2 9,400, 4 12,500;
                                          the rule from 2 fell to 5,800 in a run, from 4 it stays 12,000-13,500 */
#define PEER_BATCH_FILES DP_BATCH_FILES_MAX    /* files per request: the data path's limit (datapath.h) */
#define PEER_BATCH_BYTES ((uint64_t)DP_BATCH_BYTES_MAX) /* their bytes, one reply: the data path's limit */

/* Workers fetching at once, at most: half of them (the others answer local opens and other
 * owners' first requests; bench_peer, 8 workers: 4 or 7 alike, 12,000-13,500 remote opens/s). */
static int peer_fetchers_max(const struct door *d)
{
    return d->nworkers > 1 ? d->nworkers / 2 : 1;
}

/* Owner ``owner``'s queue (made on first use), or NULL (no memory). Under the lock; the
 * pointer is good until the lock is let go (the array may move). */
static struct owner_queue *owner_queue_locked(struct door *d, int owner)
{
    if (owner >= d->peer.noq) {
        int n = owner + 1 > 2 * d->peer.noq ? owner + 1 : 2 * d->peer.noq;
        struct owner_queue *more = realloc(d->peer.oq, (size_t)n * sizeof *more);
        if (!more)
            return NULL;
        memset(more + d->peer.noq, 0, (size_t)(n - d->peer.noq) * sizeof *more);
        for (int i = 0; i < n; i++) {
            if (!more[i].head)         /* an empty queue's tail points into the array, which moved */
                more[i].tail = &more[i].head;
            if (i >= d->peer.noq)
                inflight_init(&more[i].flow, 0, PEER_INFLIGHT_LOW, PEER_INFLIGHT_LOW, peer_fetchers_max(d));
        }
        d->peer.oq = more;
        d->peer.noq = n;
    }
    return &d->peer.oq[owner];
}

/* The owner a fetcher serves next (counted in its ``inflight``), or -1: first one waiting with
 * no fetch under way (round the owners from ``after``: none waits for another's stream), then
 * ``after`` itself, then any with room in its limit. Under the lock. */
static int next_owner_locked(struct door *d, int after)
{
    int pick = -1;
    for (int k = 1; k <= d->peer.noq && pick < 0; k++) {
        int o = (after + k) % d->peer.noq;
        if (d->peer.oq[o].head && !d->peer.oq[o].inflight)
            pick = o;
    }
    for (int k = 0; k < d->peer.noq && pick < 0; k++) {
        int o = (after + k) % d->peer.noq;
        if (d->peer.oq[o].head && d->peer.oq[o].inflight < inflight_limit(&d->peer.oq[o].flow))
            pick = o;
    }
    if (pick >= 0)
        d->peer.oq[pick].inflight++;
    return pick;
}

/* -- waiting for an answer, serving ------------------------------------------------------ */
/* A worker that fetches leaves its epoll while the answer is due; its kept connections (the
 * shims' threads it answered last) would wait for its fetch to end, and their readers fall
 * behind the others (bench_peer: 3 of 8 reader threads ended 1.9 s after the rest). So it
 * waits on its epoll between looks at the answer (poll_pace.h's rule), serving what comes:
 * a local open answered, a remote one queued for its owner's next request. One wake-up, not
 * two, when an open comes while an answer is due. */

#ifndef SYS_epoll_pwait2
#define SYS_epoll_pwait2 441               /* Linux 5.11; the same number on every architecture */
#endif

/* At most ``ns`` on the worker's epoll, serving what comes; a sleep where there is no
 * epoll_pwait2 (Linux < 5.11) or the door stops. */
static void wait_serving(struct worker *w, int64_t ns)
{
    struct door *d = w->d;
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    if (!w->stopping && !w->waiting && !__atomic_load_n(&d->peer.pwait2_off, __ATOMIC_RELAXED)) {
        struct epoll_event evs[16];
        long n = syscall(SYS_epoll_pwait2, w->ep, evs, 16, &ts, NULL, 0);
        if (n >= 0) {
            w->waiting = 1;            /* a request served meanwhile that waits too sleeps: no deeper */
            w->stopping = n > 0 && serve_events(w, evs, (int)n);
            w->waiting = 0;
            return;
        }
        if (errno == EINTR)
            return;
        __atomic_store_n(&d->peer.pwait2_off, 1, __ATOMIC_RELAXED);
    }
    nanosleep(&ts, NULL);
}

/* Until the request ``h`` (posted at ``t0``) ended: answered, or given up by the data path (its
 * deadline, a loss, the stop). */
static void await_answer(struct worker *w, dp_test_fn *test, struct dp *dp, struct dp_request *h, int64_t t0)
{
    struct door *d = w->d;
    int64_t rtt = __atomic_load_n(&d->peer.rtt_ns, __ATOMIC_RELAXED);
    int64_t sleep = pace_first_look(rtt), until = t0 + sleep;
    int first = 1;
    while (!test(dp, h)) {
        int64_t now = monarch_now_ns();
        if (now >= until) {            /* the round trip's bulk is waited: shorter looks from here */
            sleep = pace_next_look(sleep, rtt, first);
            first = 0;
            until = now + sleep;
        }
        __atomic_add_fetch(&d->peer.waits, 1, __ATOMIC_RELAXED);
        wait_serving(w, until - now);
    }
    __atomic_store_n(&d->peer.rtt_ns, pace_round_trip(rtt, monarch_now_ns() - t0), __ATOMIC_RELAXED);
}

/* A reply's files written into their descriptors at offset 0 (dp_take's callback). */
struct reply_to_fds { int n; const int *fds; int64_t *got; };

static void write_reply(void *arg, const char *const *bytes, const int64_t *results)
{
    struct reply_to_fds *r = arg;
    for (int i = 0; i < r->n; i++) {
        int64_t size = results[i];
        r->got[i] = size < 0 ? size : bytes[i] && monarch_write_all(r->fds[i], bytes[i], (size_t)size, 1) == 0 ? size : -1;
    }
}

static void fetch_each(dp_fetch_fn *fetch, struct dp *dp, int owner, int n, const char *const *keys, const int *lens,
                       const uint64_t *sizes, const int *fds, int64_t *results, int timeout_ms)
{
    for (int i = 0; i < n; i++)        /* the data path without peer_fetch_many: one request each */
        results[i] = fetch(dp, owner, keys[i], lens[i], sizes[i], fds[i], timeout_ms);
}

/* -- the worker's memfds ---------------------------------------------------------------- */
/* A fresh memfd pays for its pages (allocated, zeroed, freed: 12.7 us of a 16 KiB file on this
 * VM, scripts/cluster/page_cost.c), rewriting one's pages a tenth of that (the read-only open through
 * /proc costs some of it back: perf, bench_peer, 24% of the requesting door's CPU -> 17%). So each worker keeps up to
 * PEER_POOL memfds (as the shim's pool does, docs/compression.md): its own read-write open of
 * each, the application given a new read-only open, never sealed (the shim takes a read-only
 * open of a nameless file); one is written again only once the kernel grants a write lease on
 * it, which it grants only while no other open of it exists anywhere (a descriptor in any
 * process, one passed and not yet received, a mapping). A lease break signals SIGURG, ignored,
 * not SIGIO, which would end the daemon. Leases or /proc refused: fresh sealed memfds. */

/* A new open file description of the file of this process's descriptor ``fd``. */
static int reopen_fd(int fd, int flags)
{
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    return open(self, flags);
}

/* A memfd of the worker's pool no one else holds, not ``taken`` yet in this batch (its bit
 * set now), ``size`` bytes long: its descriptor (the pool's: not closed by the caller), or -1. */
static int pool_take(struct worker *w, uint64_t size, uint32_t *taken)
{
    for (int k = 0; k < w->npool && !w->pool_off; k++) {
        int i = (w->pool_next + k) % w->npool;
        if (*taken & (1u << i))
            continue;
        if (fcntl(w->pool[i], F_SETLEASE, F_WRLCK) != 0) {
            if (errno != EAGAIN && errno != EBUSY)
                w->pool_off = 1;       /* leases off here: fresh memfds from now on */
            continue;
        }
        fcntl(w->pool[i], F_SETLEASE, F_UNLCK);
        if (ftruncate(w->pool[i], (off_t)size) != 0)
            continue;
        *taken |= 1u << i;
        w->pool_next = i + 1;
        return w->pool[i];
    }
    if (w->pool_off || w->npool >= PEER_POOL)
        return -1;
    int m = (int)syscall(SYS_memfd_create, "monarch-peer", MFD_CLOEXEC);
    int rw = m < 0 ? -1 : reopen_fd(m, O_RDWR | O_CLOEXEC);  /* memfd_create's own is no writer for a lease */
    if (m >= 0)
        close(m);
    if (rw < 0 || fcntl(rw, F_SETSIG, SIGURG) != 0 || ftruncate(rw, (off_t)size) != 0) {
        if (rw >= 0)
            close(rw);
        w->pool_off = m >= 0;          /* no /proc here: fresh memfds from now on */
        return -1;
    }
    *taken |= 1u << w->npool;
    w->pool[w->npool++] = rw;
    return rw;
}

static void close_pool(struct worker *w)
{
    for (int i = 0; i < w->npool; i++)
        close(w->pool[i]);
    w->npool = 0;
}

/* Answer an OPEN with the memfd ``m`` (ANSWER_FD), counted first (measure_reuse_locked). 1: sent. */
static int answer_fd(struct door *d, int fd, int keep, int m)
{
    __atomic_add_fetch(&d->peer.reuse.first, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&d->count.hits[d->peer.slot], 1, __ATOMIC_RELAXED);
    if (send_answer_fd(fd, d->peer.slot | MONARCH_ANSWER_FD | (keep ? MONARCH_ANSWER_KEPT : 0), m) == 0)
        return 1;
    __atomic_sub_fetch(&d->peer.reuse.first, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&d->count.hits[d->peer.slot], 1, __ATOMIC_RELAXED);
    return 0;
}

/* The requests parked on a key fetched into a memfd: each its own open file description of it
 * (its own offset), reopened through /proc; a waiter it cannot be given to goes to Python. */
static void answer_parked_fd(struct door *d, struct waiter *ready, int m)
{
    for (struct waiter *q = ready, *next; q; q = next) {
        next = q->next;
        int own = reopen_fd(m, O_RDONLY | O_CLOEXEC);
        if (own < 0) {
            hand_over(d, q->fd, q->req, q->got, R_PYTHON_KEY);
        } else {
            pthread_mutex_lock(&d->mu);
            int keep = keep_locked(d, asks_keep(q->req));
            pthread_mutex_unlock(&d->mu);
            int sent = answer_fd(d, q->fd, keep, own);
            close(own);
            finish_open(d, q->fd, keep, sent);
        }
        free(q);
    }
}

/* One remote open's fetch ended (``ok``: its bytes are in ``out``): the copy published in the
 * area (``kdir``, ``tmp``) or the memfd sealed; the key's state, the peer cache's event, then the
 * answers (its own, the parked ones), or the open handed over (Python's protocol fetches it, or
 * says why not). Frees ``q``. */
static void remote_done(struct door *d, struct waiter *q, int out, int pooled, int kdir, const char *tmp, int ok, int64_t t0)
{
    int passed = -1;                   /* a pooled memfd's read-only open the application is given */
    const char *key = q->req + MONARCH_REQUEST_HEADER_SIZE;
    const struct idx_file *f = &q->f;
    char dest[PATH_MAX];
    int pl = 0;
    if (q->to_area) {
        struct timespec times[2] = {{f->mtime / 1000000000LL, f->mtime % 1000000000LL},
                                    {f->mtime / 1000000000LL, f->mtime % 1000000000LL}};
        ok = ok && futimens(out, times) == 0;
        if (out >= 0 && close(out) < 0)
            ok = 0;
        pl = snprintf(dest, sizeof dest, "%s/%.*s", d->tiers[d->peer.slot], (int)q->len, key);
        /* renamed outside the door's lock, as copy_and_publish's copies are */
        ok = ok && pl < (int)sizeof dest && !__atomic_load_n(&d->never_copy, __ATOMIC_ACQUIRE) &&
             renameat(kdir, tmp, kdir, strrchr(dest, '/') + 1) == 0;
        if (!ok && out >= 0)
            unlinkat(kdir, tmp, 0);
        if (kdir >= 0)
            close(kdir);
        out = -1;
    } else if (pooled) {               /* its own offset, from 0 */
        ok = ok && (passed = reopen_fd(out, O_RDONLY | O_CLOEXEC)) >= 0;
    } else {
        ok = ok && fcntl(out, F_ADD_SEALS, MONARCH_MEMFD_SEALS) == 0 && lseek(out, 0, SEEK_SET) == 0;
    }
    pthread_mutex_lock(&d->mu);
    struct entry *e = find(d, key, q->len, q->hash);   /* the table may have grown meanwhile */
    int64_t ns = monarch_now_ns() - t0;
    if (ok && q->to_area) {
        e->state = K_STAGED;
        e->slot = (uint8_t)d->peer.slot;
        e->ring = 0;
        mark_answered(e, door_ms(d));
        d->peer.fetches++;
        post_event_locked(d, Q_PEER, EV_STAGED, (uint32_t)d->peer.slot, key, q->len, f->entry, f->size, 0, ns);
    } else if (ok) {
        e->state = K_FREE;             /* gone with the application's descriptor: the next open fetches again */
        d->peer.transient++;
        post_event_locked(d, Q_PEER, EV_TRANSIENT, (uint32_t)d->peer.slot, key, q->len, f->entry, f->size, 0, ns);
    } else {
        e->state = K_PYTHON;           /* Python's protocol fetches it (staging it there first), or says why not */
        if (q->to_area)
            d->books.lease[Q_PEER] += peer_room(d, f->size);
        d->peer.failures++;
        post_event_locked(d, Q_PEER, EV_FAILED, (uint32_t)d->peer.slot, key, q->len, f->entry, f->size, 0, ns);
    }
    struct waiter *ready = d->answers.parked ? unpark_locked(d, key, q->len, q->hash) : NULL;
    d->busy--;
    pthread_cond_broadcast(&d->cv);
    int keep = ok && !q->to_area && keep_locked(d, asks_keep(q->req));
    pthread_mutex_unlock(&d->mu);
    if (!ok) {
        hand_over(d, q->fd, q->req, q->got, R_COPY_FAILED);
        if (ready)
            answer_parked(d, ready, -1, NULL);
    } else if (q->to_area) {
        uint64_t first = 1;            /* counted before they are sent (measure_reuse_locked) */
        for (struct waiter *r = ready; r; r = r->next)
            first++;
        __atomic_add_fetch(&d->peer.reuse.first, first, __ATOMIC_RELAXED);
        if (answer_open(d, q->fd, q->req, d->peer.slot, dest, (uint32_t)pl) != 0)  /* unsent: the shim reads the PFS */
            __atomic_sub_fetch(&d->peer.reuse.first, 1, __ATOMIC_RELAXED);
        if (ready)
            answer_parked(d, ready, d->peer.slot, dest);
    } else {
        int sent = answer_fd(d, q->fd, keep, pooled ? passed : out);
        finish_open(d, q->fd, keep, sent);
        if (ready)
            answer_parked_fd(d, ready, out);
    }
    if (passed >= 0)
        close(passed);                 /* the application's descriptor is the one passed */
    if (out >= 0 && !pooled)
        close(out);
    free(q);
}

/* Fetch the ``n`` remote opens of ``batch`` (all of node ``owner``) in one request, then
 * answer each. */
static void fetch_batch(struct worker *w, struct waiter **batch, int n, int owner)
{
    struct door *d = w->d;
    const char *keys[PEER_BATCH_FILES];
    int lens[PEER_BATCH_FILES], fds[PEER_BATCH_FILES], outs[PEER_BATCH_FILES], kdirs[PEER_BATCH_FILES];
    int pooled[PEER_BATCH_FILES];
    uint32_t taken = 0;                /* the pool's memfds this batch writes */
    uint64_t sizes[PEER_BATCH_FILES];
    int64_t results[PEER_BATCH_FILES];
    char tmps[PEER_BATCH_FILES][48];
    int64_t t0 = monarch_now_ns();
    int m = 0;                         /* the files asked for, in order */
    for (int i = 0; i < n; i++) {
        struct waiter *q = batch[i];
        const char *key = q->req + MONARCH_REQUEST_HEADER_SIZE;
        outs[i] = kdirs[i] = -1;
        pooled[i] = 0;
        results[i] = -1;
        if (q->to_area) {
            /* the worker's directory of the file, kept (door_dirs.c), duplicated for this file:
             * the next file's may take its slot */
            const char *base = memrchr(key, '/', q->len);
            uint32_t dlen = base ? (uint32_t)(base - key) : 0;
            snprintf(tmps[i], sizeof tmps[i], "%s%016llx", MONARCH_TMP_PREFIX,
                     (unsigned long long)(w->tmp_seq++ * 0x9E3779B97F4A7C15ULL));
            const int create = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
            for (int again = 0; again < 2 && outs[i] < 0; again++) {
                int kdir = dirs_get(&w->peer_dirs, d->tiers[d->peer.slot], key, dlen);
                outs[i] = kdir < 0 ? -1 : openat(kdir, tmps[i], create, (q->f.mode & 0700) | 0600);
                int gone = outs[i] < 0 && kdir >= 0 && errno == ENOENT;
                if (outs[i] >= 0 && (kdirs[i] = fcntl(kdir, F_DUPFD_CLOEXEC, 0)) < 0) {
                    unlinkat(kdir, tmps[i], 0);
                    close(outs[i]);
                    outs[i] = -1;
                }
                if (gone)              /* the directory went meanwhile: opened afresh */
                    dirs_forget_all(&w->peer_dirs);
                dirs_put(&w->peer_dirs, kdir);
                if (!gone)
                    break;
            }
        } else if ((outs[i] = pool_take(w, q->f.size, &taken)) >= 0) {
            pooled[i] = 1;
            lseek(outs[i], 0, SEEK_SET);   /* a peer_fetch writes from the offset: the last file's end */
        } else {
            outs[i] = (int)syscall(SYS_memfd_create, "monarch-peer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        }
        if (outs[i] >= 0) {
            keys[m] = key;
            lens[m] = (int)q->len;
            sizes[m] = q->f.size;
            fds[m++] = outs[i];
        }
    }
    pthread_mutex_lock(&d->mu);        /* read under the lock: the lane may be turned off meanwhile */
    dp_fetch_fn *fetch = d->peer.fetch;
    dp_fetch_many_fn *many = d->peer.fetch_many;
    dp_post_fn *post = d->peer.post;
    dp_test_fn *test = d->peer.test;
    dp_take_fn *take = d->peer.take;
    struct dp *dp = d->peer.dp;
    int timeout_ms = d->peer.timeout_ms;
    d->peer.batches += m > 0;
    d->peer.batched += (uint64_t)m;
    pthread_mutex_unlock(&d->mu);
    int64_t got[PEER_BATCH_FILES];
    for (int i = 0; i < m; i++)
        got[i] = -1;
    if (m && post && test && take) {   /* posted; this worker serves its connections till the answer */
        int why = 0;
        int64_t posted = monarch_now_ns();
        struct dp_request *h = post(dp, owner, m, keys, lens, sizes, 1, timeout_ms, &why);
        if (h) {
            await_answer(w, test, dp, h, posted);
            struct reply_to_fds r = {m, fds, got};
            take(dp, h, sizes, got, write_reply, &r);
        }                              /* not posted (the stop, a lost owner): each result stays -1, Python's */
    } else if (m && many)
        many(dp, owner, m, keys, lens, sizes, fds, got, timeout_ms);
    else if (m && fetch)
        fetch_each(fetch, dp, owner, m, keys, lens, sizes, fds, got, timeout_ms);
    for (int i = 0, j = 0; i < n; i++)
        if (outs[i] >= 0)
            results[i] = got[j++];
    for (int i = 0; i < n; i++)
        remote_done(d, batch[i], outs[i], pooled[i], kdirs[i], tmps[i],
                    outs[i] >= 0 && results[i] == (int64_t)batch[i]->f.size, t0);
}

/* Fetch what waits for owner ``owner`` (the caller counted itself in its ``inflight`` and in
 * the door's fetchers), a batch at a time, then for any owner whose opens wait, until none do. */
static void run_owner(struct worker *w, int owner)
{
    struct door *d = w->d;
    struct waiter *batch[PEER_BATCH_FILES];
    for (;;) {
        pthread_mutex_lock(&d->mu);
        struct owner_queue *oq = &d->peer.oq[owner];
        int n = 0;
        uint64_t bytes = 0;
        while (oq->head && n < PEER_BATCH_FILES && (n == 0 || bytes + oq->head->f.size <= PEER_BATCH_BYTES)) {
            struct waiter *q = oq->head;
            if (!(oq->head = q->next))
                oq->tail = &oq->head;
            bytes += q->f.size;
            batch[n++] = q;
        }
        if (!n)
            inflight_starved(&oq->flow);   /* a fetcher free, nothing to fetch: says nothing of the owner */
        pthread_mutex_unlock(&d->mu);
        double t0 = (double)monarch_now_ns() / 1e9;
        if (n)
            fetch_batch(w, batch, n, owner);
        pthread_mutex_lock(&d->mu);
        double now = (double)monarch_now_ns() / 1e9;
        for (int i = 0; i < n; i++)    /* files a second: a batch's files are its copies */
            inflight_completed(&d->peer.oq[owner].flow, now - t0, now);
        d->peer.oq[owner].inflight--;
        owner = next_owner_locked(d, owner);
        if (owner < 0) {
            d->peer.fetchers--;
            w->fetching = 0;
        }
        pthread_mutex_unlock(&d->mu);
        if (owner < 0)
            return;
    }
}

/* An OPEN of another node's file (``e``: its entry, NULL or K_FREE; ``owner``: its node), under
 * the lock, which this lets go: queued for its owner, fetched now by this worker if the owner's
 * limit and the door's fetchers allow, answered when its batch's reply is in. -1, or R_*. */
static int remote_open(struct worker *w, int fd, const char *req, uint32_t got, const char *key, uint32_t len,
                       uint32_t hash, struct entry *e, const struct idx_file *f, int owner)
{
    struct door *d = w->d;
    struct waiter *q = new_waiter(fd, req, got, hash, len);
    struct owner_queue *oq = q ? owner_queue_locked(d, owner) : NULL;
    if (!oq || (!e && !(e = insert(d, key, len, hash)))) {
        pthread_mutex_unlock(&d->mu);
        free(q);
        return R_OTHER;                /* no memory: Python's */
    }
    e->state = K_BUSY;                 /* one fetch per key: other opens of it park on this one */
    d->busy++;
    q->f = *f;
    q->to_area = to_area_locked(d, f);
    *oq->tail = q;
    oq->tail = &q->next;
    /* a worker already fetching (it read this while its answer was due) leaves it queued: its
     * own loop, or another fetcher, takes it in the next request */
    int run = !w->fetching && oq->inflight < inflight_limit(&oq->flow) && d->peer.fetchers < peer_fetchers_max(d);
    oq->inflight += run;
    d->peer.fetchers += run;
    w->fetching |= run;
    pthread_mutex_unlock(&d->mu);
    if (run)
        run_owner(w, owner);
    return -1;
}
