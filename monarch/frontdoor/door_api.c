/* Part of front_door.c, one translation unit (its exports: front_door.h). Here: the functions
 * Python calls (ctypes), declared in front_door.h. */
#include "front_door.h"

/* -- Python's side (ctypes; every call but start/stop may come from any thread) ---------- */

/* Start serving ``listen_fd`` (the door takes its own duplicate). ``roots`` and ``tiers``
 * are NUL-separated lists: the dataset roots by index; the tier directories by slot ("" for
 * none). ``workers``: its threads (0: one per core, up to CORE_WORKERS). Returns the door, or
 * NULL (errno set). */
EXPORT struct door *front_door_start(int listen_fd, const char *roots, int nroots, const char *tiers, int ntiers,
                                     int copy_slot, int workers)
{
    if (nroots < 0 || nroots > MAX_ROOTS || ntiers < 0 || ntiers > MONARCH_MAX_SLOTS || copy_slot < 0 || copy_slot >= ntiers) {
        errno = EINVAL;
        return NULL;
    }
    monarch_crc_init();
    struct door *d = NULL;             /* aligned as its type says (the lock and the counters on lines of their own) */
    if (posix_memalign((void **)&d, _Alignof(struct door), sizeof *d) != 0)
        return NULL;
    memset(d, 0, sizeof *d);
    d->uid = getuid();
    d->started_ns = monarch_now_ns();
    d->answers.hq_tail = &d->answers.hq;
    d->answers.keeping = 1;
    d->copy_slot = copy_slot;
    d->listen_fd = d->stop_fd = d->wake_fd = -1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->books.take_mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->copiers.work_cv, NULL);
    d->copiers.demand_tail = &d->copiers.demand;
    d->copiers.cap = copiers_allowed();
    inflight_init(&d->copiers.flow, 0, 0, INFLIGHT_LOW, d->copiers.cap);
    sources_init(d);                   /* after the copiers' cap: the descriptors they leave */
    d->copiers.threads = calloc(COPIERS_MAX, sizeof *d->copiers.threads);  /* zero pages until a copier starts */
    for (int i = 0; i < nroots; roots += strlen(roots) + 1, i++) {
        d->root_fresh[d->nroots] = -1;  /* asked at the first open under it (door_sources.c) */
        d->roots[d->nroots++] = strdup(roots);
    }
    for (int i = 0; i < ntiers; tiers += strlen(tiers) + 1, i++)
        d->tiers[i] = *tiers ? strdup(tiers) : NULL;
    d->listen_fd = fcntl(listen_fd, F_DUPFD_CLOEXEC, 3);
    d->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    d->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    /* the workers take no signals: they stay with the interpreter's threads, whose handlers
     * (SIGTERM: stop) must run, and no system call of the door is cut short by one */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int want = workers > 0 ? (workers > MAX_WORKERS ? MAX_WORKERS : workers)
               : cores < 1 ? 1 : cores > CORE_WORKERS ? CORE_WORKERS : (int)cores;
    int ok = d->copiers.threads && d->tiers[copy_slot] && d->listen_fd >= 0 && d->stop_fd >= 0 && d->wake_fd >= 0 &&
             fcntl(d->listen_fd, F_SETFL, O_NONBLOCK) == 0;
    for (int i = 0; ok && i < want; i++) {
        struct worker *w = &d->workers[i];
        w->d = d;
        /* temporary names need only differ (O_EXCL refuses a clash): no getrandom, which
         * glibc has only since 2.25 (the door builds wherever the shim does, back to 2.17) */
        w->tmp_seq = (uint64_t)monarch_now_ns() ^ (uint64_t)getpid() << 32 ^ (uint64_t)i << 56;
        w->copy_buf = malloc(MONARCH_INLINE_MAX + 1);
        /* here, not on the thread: it must be held before anything can use the descriptors up */
        w->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        w->src_dir = w->key_dir = w->listed_src = -1;
        w->ep = epoll_create1(EPOLL_CLOEXEC);
        /* EPOLLEXCLUSIVE: one worker woken per connection, not all of them */
        struct epoll_event lev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = (void *)(uintptr_t)T_LISTEN};
        struct epoll_event sev = {.events = EPOLLIN, .data.ptr = (void *)(uintptr_t)T_STOP};
        ok = w->copy_buf && w->ep >= 0 && epoll_ctl(w->ep, EPOLL_CTL_ADD, d->listen_fd, &lev) == 0 &&
             epoll_ctl(w->ep, EPOLL_CTL_ADD, d->stop_fd, &sev) == 0 &&
             pthread_create(&w->thread, NULL, door_main, w) == 0;
        if (!ok) {
            if (w->spare_fd >= 0)
                close(w->spare_fd);
            if (w->ep >= 0)
                close(w->ep);
            free(w->copy_buf);
            w->copy_buf = NULL;
            break;
        }
        d->nworkers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!ok) {
        int saved = errno ? errno : EINVAL;
        front_door_stop(d);
        front_door_free(d);
        errno = saved;
        return NULL;
    }
    return d;
}

/* The descriptor Python watches: readable when connections or events wait. */
EXPORT int front_door_wake_fd(struct door *d) { return d->wake_fd; }

/* The next connection for Python: its descriptor (now Python's, which checks its peer again)
 * and the bytes read so far into ``buf`` (returns their number; -1 when none waits; -2 with
 * ``*fd`` set if they do not fit ``cap``: call again with room for that many). */
EXPORT int front_door_take(struct door *d, int *fd, char *buf, int cap)
{
    pthread_mutex_lock(&d->mu);
    struct handed *h = d->answers.hq;
    if (!h) {
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    if ((int)h->len > cap) {
        *fd = (int)h->len;
        pthread_mutex_unlock(&d->mu);
        return -2;
    }
    d->answers.hq = h->next;
    d->answers.nhanded--;
    if (!d->answers.hq)
        d->answers.hq_tail = &d->answers.hq;
    pthread_mutex_unlock(&d->mu);
    *fd = h->fd;
    int n = (int)h->len;
    memcpy(buf, h->data, h->len);
    free(h);
    return n;
}

/* Events, packed into ``buf`` as many as fit: per event ``<IIQQqII`` (kind: 1 staged,
 * 2 failed, 4 staged by the read-ahead lane, 5 answered as a memfd; slot;
 * size; bytes read from the PFS; nanoseconds; key length; the key's index entry, from 1, 0
 * none) then the key. Returns the bytes used (0: none waits). When
 * nothing waits either way, the next arrival wakes Python again. */
EXPORT int front_door_events(struct door *d, int q, char *buf, int cap)
{
    if (q < 0 || q >= NQUEUES)
        return 0;
    pthread_mutex_lock(&d->books.take_mu);
    struct evqueue *queue = &d->books.evq[q];
    if (queue->out_off == queue->out_len) {
        pthread_mutex_lock(&d->mu);
        if (queue->len) {              /* take them all at once: the lock is held for a swap */
            char *spare = queue->out;
            size_t spare_cap = queue->out_cap;
            queue->out = queue->buf;
            queue->out_cap = queue->cap;
            queue->out_len = queue->len;
            queue->out_off = 0;
            queue->buf = spare;
            queue->cap = spare_cap;
            queue->len = 0;
            queue->n = 0;
        } else {
            queue->out_off = queue->out_len = 0;
            int other = q == Q_BOOKS ? Q_PEER : Q_BOOKS;
            if (!d->books.evq[other].len && d->books.evq[other].out_off == d->books.evq[other].out_len && !d->answers.hq) {
                uint64_t v;            /* nothing waits either way: the next arrival wakes Python */
                if (read(d->wake_fd, &v, sizeof v) < 0) {
                    /* nothing was pending: fine */
                }
                d->answers.woken = 0;
            }
        }
        pthread_mutex_unlock(&d->mu);
    }
    int used = 0;
    while (queue->out_off < queue->out_len) {
        uint32_t len;
        memcpy(&len, queue->out + queue->out_off + 32, 4);
        if (used + EVENT_HEAD + (int)len > cap)
            break;
        memcpy(buf + used, queue->out + queue->out_off, EVENT_HEAD + len);
        used += EVENT_HEAD + (int)len;
        queue->out_off += EVENT_HEAD + len;
    }
    if (queue->out_off == queue->out_len && queue->out_cap > EVENTS_KEPT) {
        free(queue->out);              /* a burst's room (Python busy meanwhile) given back once taken */
        queue->out = NULL;
        queue->out_cap = queue->out_off = queue->out_len = 0;
    }
    pthread_mutex_unlock(&d->books.take_mu);
    return used;
}

/* The snapshot is ready: answer from now on, with ``index_path`` (the shim's index) for
 * the files' sizes and mtimes. 0, or -1 if the index cannot be mapped or is not one. */
EXPORT int front_door_open(struct door *d, const char *index_path)
{
    pthread_mutex_lock(&d->mu);
    int open_already = d->gate_open;
    pthread_mutex_unlock(&d->mu);
    if (open_already)
        return 0;
    int fd = open(index_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > 0)
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);  /* the daemon describes files in place */
    close(fd);
    if (p == MAP_FAILED)
        return -1;
    if (!index_valid(p, (size_t)st.st_size)) {
        munmap(p, (size_t)st.st_size);
        errno = EINVAL;
        return -1;
    }
    pthread_mutex_lock(&d->mu);
    if (d->gate_open || d->stopped) {  /* opened meanwhile, or stopped */
        pthread_mutex_unlock(&d->mu);
        munmap(p, (size_t)st.st_size);
        return 0;
    }
    d->index.map = p;
    d->index.len = (size_t)st.st_size;
    d->gate_open = 1;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* front_door_open with the index the daemon holds (``n`` bytes at ``p``, kept by the caller
 * until front_door_free): one copy of a large index in the process, not two. */
EXPORT int front_door_open_memory(struct door *d, const unsigned char *p, uint64_t n)
{
    if (!index_valid(p, (size_t)n)) {
        errno = EINVAL;
        return -1;
    }
    pthread_mutex_lock(&d->mu);
    if (!d->gate_open && !d->stopped) {
        d->index.map = p;
        d->index.len = (size_t)n;
        d->index.borrowed = 1;
        d->gate_open = 1;
    }
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* A file a listing-mode walk left undescribed is described by the door at its miss, its route by
 * these steps (index_writer.route_tables: root k's at k * MONARCH_ROUTE_STEPS), where the index is
 * the daemon's own (front_door_open_memory, called after this): the door writes it in place. */
EXPORT void front_door_describe_with(struct door *d, const uint64_t *smallest, const uint8_t *route, const int *nsteps,
                                     int nroots)
{
    int n = nroots < MAX_ROOTS ? nroots : MAX_ROOTS;
    pthread_mutex_lock(&d->mu);
    if (!__atomic_load_n(&d->steps.known, __ATOMIC_RELAXED) && n > 0) {
        memcpy(d->steps.smallest, smallest, sizeof *smallest * MONARCH_ROUTE_STEPS * (size_t)n);
        memcpy(d->steps.route, route, sizeof *route * MONARCH_ROUTE_STEPS * (size_t)n);
        memcpy(d->steps.nsteps, nsteps, sizeof *nsteps * (size_t)n);
        d->steps.nroots = n;
        __atomic_store_n(&d->steps.known, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&d->mu);
}

/* The snapshot is ready or failed: INDEX polls are handed over to Python from now on. */
EXPORT void front_door_settle(struct door *d)
{
    __atomic_store_n(&d->settled, 1, __ATOMIC_RELEASE);
}

/* Python copies ``key`` itself from now on: 0; or 1 if the door has staged it (its event
 * tells Python where). Waits while the door is copying it. */
EXPORT int front_door_claim(struct door *d, const char *key, int len)
{
    pthread_mutex_lock(&d->mu);
    struct entry *e = find_or_insert(d, key, (uint32_t)len);
    while (e && e->state == K_BUSY) {
        pthread_cond_wait(&d->cv, &d->mu);
        e = find_or_insert(d, key, (uint32_t)len);   /* the table may have grown */
    }
    int staged = e && e->state == K_STAGED;
    if (e && !staged)
        e->state = K_PYTHON;
    pthread_mutex_unlock(&d->mu);
    return e ? staged : 0;
}

/* The peer lane: misses of files ``owners`` (by index entry - 1; -1: none) gives to another
 * node than ``self_node`` are fetched with ``fetch(dp, ...)`` into the tier of ``peer_slot``
 * (the peer area), each paying its size rounded up to ``unit`` out of the peer lease;
 * ``fetch`` NULL turns the lane off. ``fetch_many`` (dp_fetch_many, may be NULL) fetches many of
 * one owner's files in one request; ``post``, ``test`` and ``take`` (dp_post, dp_test, dp_take:
 * all or none) keep the read-ahead lane's requests in flight from its one thread (none: it
 * fetches one batch at a time). The door's own copies are offered with ``offer(dp, ...)``
 * (may be NULL). ``owners`` (NULL: the ring front_door_ring gave) stays the caller's, and is
 * not read once this returns after another call. */
EXPORT int front_door_peers(struct door *d, dp_fetch_fn *fetch, dp_staged_fn *offer, struct dp *dp, const int16_t *owners,
                            uint32_t nowners, int self_node, int peer_slot, int timeout_ms, int64_t unit,
                            dp_fetch_many_fn *fetch_many, dp_post_fn *post, dp_test_fn *test, dp_take_fn *take)
{
    if (fetch && (peer_slot < 0 || peer_slot >= MONARCH_MAX_SLOTS || !d->tiers[peer_slot] || unit <= 0))
        return -1;
    pthread_mutex_lock(&d->mu);
    d->peer.fetch = fetch;
    d->peer.fetch_many = fetch ? fetch_many : NULL;
    int flight = fetch && fetch_many && post && test && take;
    d->peer.post = flight ? post : NULL;
    d->peer.test = flight ? test : NULL;
    d->peer.take = flight ? take : NULL;
    d->peer.offer = fetch ? offer : NULL;
    d->peer.dp = dp;
    if (!fetch)
        d->peer.owners = (struct entry_owners){.self = self_node};
    else if (owners)
        d->peer.owners = (struct entry_owners){.table = owners, .n = nowners, .self = self_node};
    /* (else whose file is whose stays front_door_ring's) */
    d->peer.self_node = self_node;
    d->peer.slot = peer_slot;
    d->peer.timeout_ms = timeout_ms;
    d->peer.unit = unit > 0 ? unit : 1;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* Whose file each of index entries 1..``n`` is, from the placement's ring: ``parts`` parts,
 * part i the hashes from ``starts[i]`` (``starts[0]`` 0, never decreasing) to the next start, owned
 * by ``nodes[i]``; a key's hash is XXH64 of its bytes with ``seed``. ``bits`` (a bit an entry,
 * (n + 63) / 64 words) is filled here from the keys of ``index`` (``len`` bytes: the index the door
 * answers from, or will once it opens: the lane may start first), set where the entry is
 * ``self_node``'s. ``starts``, ``nodes`` and ``bits`` stay the caller's, read until the next call
 * here or to front_door_peers with owners. ``n`` at most the index's files. This node's entries,
 * or -1 (a bad ring or index). */
EXPORT int64_t front_door_ring(struct door *d, const unsigned char *index, uint64_t len, const uint64_t *starts,
                               const int16_t *nodes, uint32_t parts, uint64_t seed, int self_node, uint64_t *bits,
                               uint32_t n)
{
    if (!index || !index_valid(index, (size_t)len) || !starts || !nodes || !bits || parts == 0 || starts[0] != 0 ||
        n > index_header(index).files)
        return -1;
    for (uint32_t i = 1; i < parts; i++)
        if (starts[i] < starts[i - 1])
            return -1;
    struct entry_owners o = {.mine = bits, .starts = starts, .nodes = nodes, .parts = parts, .seed = seed,
                             .n = n, .self = self_node};
    ring_bits(index, &o, bits);        /* (a pass over the index's keys, outside the lock) */
    pthread_mutex_lock(&d->mu);
    d->peer.owners = o;
    pthread_mutex_unlock(&d->mu);
    return entries_mine(&o, n);
}

/* -- the peer lane's memfd rule (door_peer.c) ------------------------------------------- */
/* Measure how often copies in the peer area are opened again from the shim's counters file
 * at ``path`` (the run's, created by the daemon): its 8-byte word at ``offset`` counts the
 * opens served from the peer slot. From then on a remote file goes into the area only while
 * that measure says it pays (1 in PEER_SAMPLE otherwise: a sealed memfd); ``path`` NULL: every
 * one into the area while there is room, as without a measure. 0, or -1 (errno). */
EXPORT int front_door_peer_reuse(struct door *d, const char *path, uint64_t offset)
{
    void *map = NULL;
    size_t len = (size_t)offset + sizeof(uint64_t);
    if (path) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        if (fd < 0)
            return -1;
        if (offset % sizeof(uint64_t) || fstat(fd, &st) != 0 || (uint64_t)st.st_size < offset + sizeof(uint64_t) ||
            (map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
            close(fd);
            errno = errno ? errno : EINVAL;
            return -1;
        }
        close(fd);
    }
    pthread_mutex_lock(&d->mu);
    void *old = d->peer.reuse.map;
    size_t old_len = d->peer.reuse.map_len;
    d->peer.reuse.map = map;
    d->peer.reuse.map_len = len;
    d->peer.reuse.opens = map ? (const uint64_t *)((const char *)map + offset) : NULL;
    d->peer.reuse.opens_at = map ? __atomic_load_n(d->peer.reuse.opens, __ATOMIC_RELAXED) : 0;
    d->peer.reuse.first_at = __atomic_load_n(&d->peer.reuse.first, __ATOMIC_RELAXED);
    d->peer.reuse.copies = 0;
    d->peer.reuse.again_sum = d->peer.reuse.copies_sum = 0;
    d->peer.reuse.keep_all = 0;              /* until reuse is seen: a first epoch reads each file once */
    pthread_mutex_unlock(&d->mu);
    if (old)
        munmap(old, old_len);          /* read only under the lock */
    return 0;
}

/* A cluster's: a shim's PAGES answered with ``fetch_pages`` on ``dp`` (NULL: refused). 0. */
EXPORT int front_door_pages(struct door *d, dp_fetch_pages_fn *fetch_pages, struct dp *dp, int self_node,
                             int timeout_ms)
{
    pthread_mutex_lock(&d->mu);
    d->pages = (struct door_pages){.fetch_pages = fetch_pages, .dp = fetch_pages ? dp : NULL,
                                   .self_node = self_node, .timeout_ms = timeout_ms > 0 ? timeout_ms : 1};
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* A sharded node's door (``on``): it copies only this node's own files, none before the peer
 * lane tells it who owns which (front_door_peers). */
EXPORT void front_door_own_only(struct door *d, int on)
{
    pthread_mutex_lock(&d->mu);
    d->peer.own_only = on;
    pthread_mutex_unlock(&d->mu);
}

EXPORT void front_door_peer_describe(struct door *d, dp_describe_fn *describe, dp_take_wanted_fn *take_wanted)
{
    pthread_mutex_lock(&d->mu);
    d->peer.describe = describe;
    d->peer.take_wanted = take_wanted;
    pthread_mutex_unlock(&d->mu);
}

/* Whether the peer lane may fetch now (Python: the area is usable, the job wrote nothing). */
EXPORT void front_door_peer_copying(struct door *d, int on)
{
    pthread_mutex_lock(&d->mu);
    d->peer.allowed = on;
    pthread_mutex_unlock(&d->mu);
}

/* ``key`` has a raw copy in ``slot``: the door answers its opens with that path. */
EXPORT void front_door_staged(struct door *d, const char *key, int len, int slot)
{
    pthread_mutex_lock(&d->mu);
    struct entry *e = find_or_insert(d, key, (uint32_t)len);
    if (e && slot >= 0 && slot < MONARCH_MAX_SLOTS && d->tiers[slot]) {
        e->state = K_STAGED;
        e->slot = (uint8_t)slot;
        e->ring = 0;
    } else if (e) {
        e->state = K_PYTHON;
    }
    pthread_mutex_unlock(&d->mu);
}

/* ``key``'s copy is going (or was never the door's to answer): hand its opens over.
 * Returns once no answer of the door can name it any more... except one already on its way,
 * which the shim treats like any copy that vanished: it reads the PFS. */
EXPORT void front_door_forget(struct door *d, const char *key, int len)
{
    pthread_mutex_lock(&d->mu);
    struct entry *e = find_or_insert(d, key, (uint32_t)len);
    while (e && e->state == K_BUSY) {
        pthread_cond_wait(&d->cv, &d->mu);
        e = find_or_insert(d, key, (uint32_t)len);
    }
    if (e)
        e->state = K_PYTHON;
    pthread_mutex_unlock(&d->mu);
}

/* An evicting cache would drop ``key``'s copy: 1 and its opens handed over from now on, or 0
 * (nothing changed) if the door answered it less than ``grace_ns`` ago, so that an
 * application it was answered to can still open it. The check and the hand-over are one
 * step under the lock: no answer of the door can name a copy evicted after it. */
EXPORT int front_door_evict(struct door *d, const char *key, int len, int64_t grace_ns)
{
    pthread_mutex_lock(&d->mu);
    uint32_t hash = monarch_crc32(key, (uint32_t)len);
    struct entry *e;
    while ((e = find(d, key, (uint32_t)len, hash)) && e->state == K_BUSY)
        pthread_cond_wait(&d->cv, &d->mu);
    int evict = !(e && e->state == K_STAGED && e->answered &&
                  (int64_t)answered_ago_ms(e, door_ms(d)) * 1000000 < grace_ns);
    if (e && evict)
        e->state = K_PYTHON;
    pthread_mutex_unlock(&d->mu);
    return evict;
}

/* The door copies misses from the PFS: from the first, the index's directories are opened beside
 * the job and kept (door_sources.c), so that a miss costs its name's look-up and its open, no more. */
EXPORT void front_door_keep_sources(struct door *d)
{
    sources_want_warm(d);
}

/* Python allows (1) the door to copy misses itself, or not (0). */
EXPORT void front_door_copying(struct door *d, int on)
{
    pthread_mutex_lock(&d->mu);
    d->allowed = on;
    pthread_mutex_unlock(&d->mu);
}

/* The job wrote into its dataset: the door copies nothing more, and returns once no copy
 * of its own is running (so Python's books, drained next, hold every copy it made). */
EXPORT void front_door_disable(struct door *d)
{
    pthread_mutex_lock(&d->mu);
    __atomic_store_n(&d->never_copy, 1, __ATOMIC_RELEASE);
    while (d->busy)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

/* Copy into the tier of ``slot`` from now on (the first tier is full: the stager's next), with
 * ``bytes`` lent there, once no copy from the PFS is under way (each ends in the tier whose
 * room it took). Returns what was left of the old lease (the caller releases it in the old
 * tier), or -1 if ``slot`` has no tier (nothing changed). */
EXPORT int64_t front_door_copy_to(struct door *d, int slot, int64_t bytes)
{
    if (slot < 0 || slot >= MONARCH_MAX_SLOTS || !d->tiers[slot])
        return -1;
    pthread_mutex_lock(&d->mu);
    while (d->copies_busy)
        pthread_cond_wait(&d->cv, &d->mu);
    int64_t left = d->books.lease[Q_BOOKS];
    d->copy_slot = slot;
    d->books.lease[Q_BOOKS] = bytes;
    d->books.low_water[Q_BOOKS] = bytes / 2;
    pthread_cond_broadcast(&d->cv);
    pthread_cond_broadcast(&d->copiers.work_cv);  /* the read-ahead lane may wait for room */
    pthread_mutex_unlock(&d->mu);
    return left;
}

/* Tier bytes the door may fill, for books ``q`` (Q_BOOKS: the copy tier's, Q_PEER: the peer
 * area's; Python reserved them there). */
EXPORT void front_door_grant(struct door *d, int q, int64_t bytes)
{
    if (q < 0 || q >= NQUEUES)
        return;
    pthread_mutex_lock(&d->mu);
    d->books.lease[q] += bytes;
    d->books.low_water[q] = d->books.lease[q] / 2;
    pthread_cond_broadcast(&d->cv);
    pthread_cond_broadcast(&d->copiers.work_cv);  /* the read-ahead lane may wait for room */
    if (d->pa) {                       /* so may the peer read-ahead lane (door_peer_ahead.c) */
        if (q == Q_PEER && bytes > 0) {
            d->pa->grants++;           /* Python lends again: the lane asks it as often as at first */
            if (d->pa->room_wake_ns > PA_ROOM_WAKE_NS)
                d->pa->room_wake_ns = PA_ROOM_WAKE_NS;
        }
        pthread_cond_broadcast(&d->pa->cv);
    }
    pthread_mutex_unlock(&d->mu);
}

/* What is left of the grants (now 0: Python releases it in the tier). */
EXPORT int64_t front_door_reclaim(struct door *d, int q)
{
    if (q < 0 || q >= NQUEUES)
        return 0;
    pthread_mutex_lock(&d->mu);
    int64_t left = d->books.lease[q];
    d->books.lease[q] = 0;
    pthread_mutex_unlock(&d->mu);
    return left;
}

EXPORT int64_t front_door_lease(struct door *d, int q)
{
    if (q < 0 || q >= NQUEUES)
        return 0;
    pthread_mutex_lock(&d->mu);
    int64_t left = d->books.lease[q];
    pthread_mutex_unlock(&d->mu);
    return left;
}

/* The door's counters (front_door.h: struct front_door_counts). */
EXPORT void front_door_counts(struct door *d, struct front_door_counts *out)
{
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < MONARCH_MAX_SLOTS; i++)
        out->hits[i] = __atomic_load_n(&d->count.hits[i], __ATOMIC_RELAXED);
    for (int i = 0; i < R_REASONS; i++)
        out->handed_because[i] = d->count.why[i];
    out->copies = d->count.copies;
    out->handed = d->count.handed;
    out->failures = d->count.failures;
    out->bytes_read = d->count.bytes_read;
    out->closed_too_many = d->count.closed_too_many;
    out->peer_fetches = d->peer.fetches;
    out->peer_failures = d->peer.failures;
    out->peer_transient = d->peer.transient;
    out->accepted = d->count.accepted;
    out->reused = d->count.reused;
    /* the peer lane's batches and its memfd rule (door_peer.c) */
    out->peer_batches = d->peer.batches;
    out->peer_batched = d->peer.batched;
    out->peer_keep_all = (uint64_t)d->peer.reuse.keep_all;
    out->peer_reuse_permille = d->peer.reuse.permille;
    out->peer_waits = __atomic_load_n(&d->peer.waits, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&d->mu);
}

/* Stop the thread; connections still here or not taken by Python are closed (their
 * shims read the PFS). Events stay for Python to drain; every call stays harmless until
 * front_door_free. */
EXPORT void front_door_stop(struct door *d)
{
    pthread_mutex_lock(&d->mu);
    d->answers.keeping = 0;                    /* no connection kept from now on: those answered now are closed */
    pthread_mutex_unlock(&d->mu);
    stop_peer_ahead(d);                /* the peer read-ahead lane (door_peer_ahead.c) */
    stop_copiers(d);
    uint64_t one = 1;
    if (d->stop_fd >= 0 && write(d->stop_fd, &one, sizeof one) < 0) {
        /* an eventfd write of 1 cannot fail here */
    }
    for (int i = 0; i < d->nworkers; i++)  /* the stop stays readable: every worker sees it */
        pthread_join(d->workers[i].thread, NULL);
    for (struct conn *c = d->answers.kept, *next; c; c = next) {  /* no thread answers any more: none is kept after */
        next = c->next;
        close(c->fd);
        free(c);
    }
    d->answers.kept = NULL;
    for (int i = 0; i < d->nworkers; i++) {  /* every worker joined: no epoll is written to now */
        struct worker *w = &d->workers[i];
        for (struct conn *c = w->pending, *next; c; c = next) {
            next = c->next;
            close(c->fd);
            free(c);
        }
        w->pending = NULL;
        close(w->ep);
        w->ep = -1;
        if (w->spare_fd >= 0)
            close(w->spare_fd);
        w->spare_fd = -1;
        close_cached_dirs(w);
        close_pool(w);                 /* door_peer.c's memfds */
    }
    d->nworkers = 0;
    sources_close(d);                  /* every thread joined: no open in them now */
    close_waiting(d);
    pthread_mutex_lock(&d->mu);
    d->gate_open = 0;
    __atomic_store_n(&d->never_copy, 1, __ATOMIC_RELEASE);
    d->stopped = 1;
    for (struct handed *h = d->answers.hq, *next; h; h = next) {
        next = h->next;
        close(h->fd);
        free(h);
    }
    d->answers.hq = NULL;
    d->answers.hq_tail = &d->answers.hq;
    d->answers.nhanded = 0;
    pthread_mutex_unlock(&d->mu);
    if (d->listen_fd >= 0)
        close(d->listen_fd);
    if (d->stop_fd >= 0)
        close(d->stop_fd);
    d->listen_fd = d->stop_fd = -1;
}

/* Free a stopped door (nothing may call it any more). */
EXPORT void front_door_free(struct door *d)
{
    for (size_t i = 0; i < d->keys.nown; i++)
        free(d->keys.own[i].key);
    free(d->keys.own);
    free(d->keys.tab);
    free(d->keys.dense);
    for (int i = 0; i < d->nroots; i++)
        free(d->roots[i]);
    for (int i = 0; i < MONARCH_MAX_SLOTS; i++)
        free(d->tiers[i]);
    for (int q = 0; q < NQUEUES; q++) {
        free(d->books.evq[q].buf);
        free(d->books.evq[q].out);
    }
    if (d->index.map && !d->index.borrowed)
        munmap((void *)d->index.map, d->index.len);
    if (d->peer.reuse.map)
        munmap(d->peer.reuse.map, d->peer.reuse.map_len);
    free(d->peer.oq);
    if (d->wake_fd >= 0)
        close(d->wake_fd);
    for (int i = 0; i < MAX_WORKERS; i++)
        free(d->workers[i].copy_buf);
    for (int i = 0; d->copiers.threads && i < COPIERS_MAX; i++)
        free(d->copiers.threads[i].copy_buf);
    free(d->copiers.threads);
    free_peer_ahead(d);                /* the peer read-ahead lane (door_peer_ahead.c) */
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->books.take_mu);
    pthread_mutex_destroy(&d->sources.mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->copiers.work_cv);
    free(d);
}

/* -- the read-ahead lane and the copies in flight ------------------------------------- */
/* Copy the small files of index entries 1 to ``n`` (the snapshot's files, in its order) ahead
 * of the reader, as many at once as the source's measure allows (inflight.c; ``fixed`` > 0:
 * that many, staging.threads; else from ``start``), within the room lent. Once per door: 0,
 * or -1 (errno) if a lane was asked for before or nothing could start. */
EXPORT int front_door_read_ahead(struct door *d, uint32_t n, uint32_t most, int fixed, int start)
{
    pthread_mutex_lock(&d->mu);
    if (d->ahead.asked || d->stopped || !d->gate_open) {
        pthread_mutex_unlock(&d->mu);
        errno = EBUSY;
        return -1;
    }
    /* room in the table for every key the lane can copy (``most``: what the tiers hold, not the
     * list's every file: each key touches a page of the table; a sharded node's own files) now,
     * while it is small: doubled as the lane fills it, its old slots would stand beside the new
     * ones at the daemon's peak */
    uint32_t keys = own_files_locked(d, n);
    if (reserve_keys(d, d->keys.used + (most < keys ? most : keys)) != 0) {
        pthread_mutex_unlock(&d->mu);
        errno = ENOMEM;
        return -1;
    }
    double recent = d->copiers.flow.recent;    /* what the misses measured so far stays */
    inflight_init(&d->copiers.flow, fixed, start, INFLIGHT_LOW, d->copiers.cap);
    d->copiers.flow.recent = recent;
    d->ahead.asked = 1;
    d->ahead.n = n;
    d->ahead.next = 0;
    d->ahead.wanted = 0;
    d->ahead.end = A_WHOLE;
    d->ahead.on = 1;
    staff_locked(d);
    int started = d->copiers.n > 0;
    if (!started)
        d->ahead.on = 0;
    pthread_mutex_unlock(&d->mu);
    if (!started)
        errno = EAGAIN;
    return started ? 0 : -1;
}

/* The read-ahead lane (front_door.h: struct front_door_read_ahead_state). */
EXPORT void front_door_read_ahead_state(struct door *d, struct front_door_read_ahead_state *out)
{
    pthread_mutex_lock(&d->mu);
    out->running = (uint64_t)(d->ahead.on && !d->ahead.busy ? 1 : d->ahead.busy);
    out->through = d->ahead.next;
    out->copies = d->ahead.copies;
    out->ended_because = (uint64_t)d->ahead.end;
    out->key_bytes = key_room(d);
    pthread_mutex_unlock(&d->mu);
}

/* The door's measure of its source (inflight_state's figures) and its copiers now. */
EXPORT void front_door_inflight(struct door *d, struct front_door_inflight *out)
{
    pthread_mutex_lock(&d->mu);
    inflight_state(&d->copiers.flow, &out->flow);
    out->copiers = (uint64_t)d->copiers.n;
    out->in_flight = (uint64_t)d->copies_busy;
    pthread_mutex_unlock(&d->mu);
}
