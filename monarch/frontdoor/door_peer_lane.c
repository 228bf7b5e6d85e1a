/* Part of front_door.c, one translation unit (what it gives the other parts: door_peer_lane.h).
 * Here: the peer read-ahead lane's thread: its batches posted and kept in flight, each reply's
 * files put in place; and what Python and the door's loop call to drive it (the order, the
 * progress, the readers' own progress requests, the figures). */
#include "door_peer_lane.h"

/* -- one batch: temporary files, the fetch, the publish ---------------------------------------- */

/* ``p``'s file: a spare written over, or a new one under its own name in the area's top
 * directory; its key's directory (``p->dir``) pinned in the lane's directories until pa_publish
 * links the key's name to it. */
static void pa_open_tmp(struct door *d, struct peer_ahead *pa, struct worker *w, struct pa_file *p)
{
    const char *area = d->tiers[d->peer.slot];
    const char *base = memrchr(p->key, '/', p->len);
    uint32_t dlen = base ? (uint32_t)(base - p->key) : 0;
    const int create = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;  /* read too: mapped (pa_write) */
    mode_t mode = (p->f.mode & 0700) | 0600;
    p->map = (struct pa_map){0};
    p->dir = base ? dirs_get(&w->peer_dirs, area, p->key, dlen) : -1;
    if (p->dir < 0)
        return;
    if ((p->fd = pa_take_spare(d, pa, p->f.size, mode, &p->home, &p->map)) >= 0)
        return;
    for (int attempt = 0; attempt < 2 && p->fd < 0; attempt++) {
        char own[40];
        int top = dirs_get(&w->peer_dirs, area, "", 0);
        p->home = pa_new_home(pa);
        pa_home_name(own, sizeof own, p->home);
        p->fd = top < 0 ? -1 : openat(top, own, create, mode);
        if (p->fd >= 0 && fcntl(p->fd, F_SETSIG, SIGURG) != 0) {  /* kept on the ring: its lease breaks ignored */
            close(p->fd);
            unlinkat(top, own, 0);
            p->fd = -1;
        }
        int gone = p->fd < 0 && top >= 0 && errno == ENOENT;
        dirs_put(&w->peer_dirs, top);
        if (!gone)
            break;
        dirs_forget_all(&w->peer_dirs);  /* the area's top went meanwhile: opened afresh */
    }
}

/* The key's name ``base`` in ``p->dir`` linked to ``p``'s file, named ``own`` in the area's top
 * ``top``: a name left there (a copy no one books) is replaced, as a rename would; a directory
 * that went meanwhile is made again. 0, or -1. */
static int pa_link(struct door *d, struct worker *w, struct pa_file *p, int top, const char *own, const char *base)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (p->dir >= 0 && linkat(top, own, p->dir, base, 0) == 0)
            return 0;
        if (p->dir >= 0 && errno == EEXIST)
            unlinkat(p->dir, base, 0);
        else if (p->dir < 0 || errno == ENOENT) {
            dirs_forget_all(&w->peer_dirs);
            dirs_put(&w->peer_dirs, p->dir);
            const char *slash = memrchr(p->key, '/', p->len);
            p->dir = dirs_get(&w->peer_dirs, d->tiers[d->peer.slot], p->key, slash ? (uint32_t)(slash - p->key) : 0);
        } else
            return -1;
    }
    return p->dir >= 0 && linkat(top, own, p->dir, base, 0) == 0 ? 0 : -1;
}

/* The files' bytes, each result the bytes written or < 0. */
static void pa_fetch(dp_fetch_fn *one, dp_fetch_many_fn *many, struct dp *dp, int owner,
                     struct pa_file *files, int n, int64_t *results, int timeout_ms)
{
    const char *keys[PA_BATCH];
    int lens[PA_BATCH], fds[PA_BATCH], m = 0, at[PA_BATCH];
    uint64_t sizes[PA_BATCH];
    int64_t got[PA_BATCH];
    for (int i = 0; i < n; i++) {
        results[i] = -1;
        if (files[i].fd < 0)
            continue;
        keys[m] = files[i].key;
        lens[m] = (int)files[i].len;
        sizes[m] = files[i].f.size;
        fds[m] = files[i].fd;
        at[m++] = i;
    }
    if (!m)
        return;
    if (many) {
        if (many(dp, owner, m, keys, lens, sizes, fds, got, timeout_ms) != 0)
            for (int j = 0; j < m; j++)
                got[j] = -1;
    } else {
        for (int j = 0; j < m; j++)
            got[j] = one(dp, owner, keys[j], lens[j], sizes[j], fds[j], timeout_ms);
    }
    for (int j = 0; j < m; j++)
        results[at[j]] = got[j];
}

/* Each file of a fetched batch published (K_STAGED, on the ring) or handed to Python (K_PYTHON),
 * its waiters answered. Takes and leaves the lock unlocked. */
static void pa_publish(struct door *d, struct peer_ahead *pa, struct pa_file *files, int n, const int64_t *results,
                       int64_t t0)
{
    int slot = d->peer.slot;
    const char *area = d->tiers[slot];
    for (int i = 0; i < n; i++) {
        struct pa_file *p = &files[i];
        struct timespec times[2] = {{p->f.mtime / 1000000000LL, p->f.mtime % 1000000000LL},
                                    {p->f.mtime / 1000000000LL, p->f.mtime % 1000000000LL}};
        int ok = p->fd >= 0 && results[i] == (int64_t)p->f.size && futimens(p->fd, times) == 0;
        const char *name = memrchr(p->key, '/', p->len);
        char base[NAME_MAX + 1];
        size_t bl = name ? p->len - (size_t)(name + 1 - p->key) : 0;
        ok = ok && bl > 0 && bl <= NAME_MAX;
        /* its key's name linked to the file's own, in the area's top */
        int top = p->fd >= 0 ? dirs_get(&pa->w.peer_dirs, area, "", 0) : -1;
        char own[40];
        pa_home_name(own, sizeof own, p->home);
        if (ok) {
            memcpy(base, name + 1, bl);
            base[bl] = 0;
            ok = top >= 0 && !__atomic_load_n(&d->never_copy, __ATOMIC_ACQUIRE) &&
                 pa_link(d, &pa->w, p, top, own, base) == 0;
        }
        if (!ok && p->fd >= 0) {
            if (top >= 0)
                unlinkat(top, own, 0);
            else
                unlink_home(d, p->home);
            pa_close(p->fd, &p->map);
            p->fd = -1;
        }
        dirs_put(&pa->w.peer_dirs, top);
        dirs_put(&pa->w.peer_dirs, p->dir);
        char dest[PATH_MAX];
        snprintf(dest, sizeof dest, "%s/%.*s", area, (int)p->len, p->key);
        pthread_mutex_lock(&d->mu);
        int64_t need = peer_room(d, p->f.size);
        if (ok && ring_push_locked(pa, p->f.entry, p->hash, p->gen == pa->gen ? p->pos : PA_STALE, need, p->fd,
                                   (p->f.mode & 0700) | 0600, p->map, p->home) != 0) {
            pthread_mutex_unlock(&d->mu);
            unlink(dest);              /* no room in the ring's books: not kept */
            unlink_home(d, p->home);
            pa_close(p->fd, &p->map);
            pthread_mutex_lock(&d->mu);
            ok = 0;
        }
        struct entry *e = find(d, p->key, p->len, p->hash);  /* BUSY since gathered: still there */
        if (ok) {
            e->state = K_STAGED;
            e->slot = (uint8_t)slot;
            e->ring = 1;
            e->answered = 0;           /* not answered (unless waited for): once consumed, it may go at once */
            pa->fetched++;
            pa->fetched_bytes += p->f.size;
        } else {
            e->state = K_PYTHON;       /* its open goes to Python's protocol: the owner, or the new one */
            e->ring = 0;
            pa->used -= need;
            pa->failed++;
            post_event_locked(d, Q_PEER, EV_FAILED, (uint32_t)slot, p->key, p->len, p->f.entry, p->f.size, 0,
                              monarch_now_ns() - t0);
        }
        /* its waiters open it at once: named to them, a copy that came back consumed (its order
         * replaced while it was on its way, or the reader past it) stays its grace (PA_GRACE_MS);
         * one ahead of the progress stays until the reader is past it, so until it has opened it */
        struct waiter *ready = d->answers.parked ? unpark_locked(d, p->key, p->len, p->hash) : NULL;
        for (struct waiter *q = ready; q; q = q->next)
            pa->waited++;
        if (ok && ready && (p->gen != pa->gen || p->pos < pa->done))
            mark_answered(e, door_ms(d));
        d->busy--;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        if (ready)
            answer_parked(d, ready, ok ? slot : -1, dest);
    }
}

/* -- the lane's thread ---------------------------------------------------------------------- */

struct pa_reply_ctx { struct door *d; struct peer_ahead *pa; struct pa_batch *B; };

/* A batch's reply came (dp_take's ``got``): each file written into its temporary copy and
 * published (a file the owner could not give goes to Python's protocol). */
static void pa_reply_got(void *arg, const char *const *bytes, const int64_t *got)
{
    struct pa_reply_ctx *c = arg;
    struct pa_batch *B = c->B;
    for (int i = 0; i < B->n; i++) {  /* ``got`` may be B->results: each read before it is written */
        struct pa_file *p = &B->files[i];
        int ok = bytes[i] && got[i] == (int64_t)p->f.size;
        if (ok)
            pa_open_tmp(c->d, c->pa, &c->pa->w, p);
        int how = ok && p->fd >= 0 ? pa_write(p->fd, &p->map, bytes[i], p->f.size) : -1, written = how >= 0;
        c->pa->mapped += how == 1;     /* the lane's thread's alone (read under the lock: a hint) */
        B->results[i] = written ? (int64_t)p->f.size : -1;
    }
    pa_publish(c->d, c->pa, B->files, B->n, B->results, B->posted_ns);
}

/* The batches gathered posted, each in flight until its reply comes, no thread and no sleep of
 * its own (dp_post); those in flight looked at once (dp_test) and each one ended taken
 * (dp_take: its files put in place). Without the data path's requests in flight (a test's
 * callbacks), each batch gathered is fetched at once, one after another. ``give_up``: those
 * still in flight are ended now (the lane stops). Returns how many ended. Called and returns
 * under the lock (let go meanwhile: the lane is ``busy``). */
static int pa_flight(struct door *d, struct peer_ahead *pa, int give_up)
{
    dp_fetch_fn *one = d->peer.fetch;  /* read under the lock: the lane may be turned off meanwhile */
    dp_fetch_many_fn *many = d->peer.fetch_many;
    dp_post_fn *post = d->peer.post;
    dp_test_fn *test = d->peer.test;
    dp_take_fn *take = d->peer.take;
    struct dp *dp = d->peer.dp;
    int timeout_ms = d->peer.timeout_ms, posted = 0, ended = 0, flying = 0;
    pthread_mutex_unlock(&d->mu);
    for (int b = 0; b < PA_FLIGHT; b++) {
        struct pa_batch *B = &pa->batch[b];
        if (B->state != PB_FILLING)
            continue;
        B->posted_ns = monarch_now_ns();
        int why = PA_NOT_POSTED;
        B->h = post && test && take && one ? post(dp, B->owner, B->n, B->keys, B->lens, B->sizes, 0, timeout_ms, &why)
                                            : NULL;
        if (B->h) {
            B->state = PB_FLIGHT;
            B->dp = dp;
            B->test = test;
            B->take = take;
            posted++;
            continue;
        }
        if (why == PA_NOT_POSTED && one) {  /* no requests in flight here: fetched now */
            for (int i = 0; i < B->n; i++)
                pa_open_tmp(d, pa, &pa->w, &B->files[i]);
            pa_fetch(one, many, dp, B->owner, B->files, B->n, B->results, timeout_ms);
        } else {
            for (int i = 0; i < B->n; i++)
                B->results[i] = -1;    /* not posted (the stop, a lost owner): Python's protocol asks */
        }
        pa_publish(d, pa, B->files, B->n, B->results, B->posted_ns);
        B->state = PB_FREE;
        ended++;
    }
    int64_t now = monarch_now_ns();
    for (int b = 0; b < PA_FLIGHT; b++) {
        struct pa_batch *B = &pa->batch[b];
        if (B->state != PB_FLIGHT)
            continue;
        if (!give_up && !B->test(B->dp, B->h)) {
            flying++;
            continue;
        }
        int64_t took = now - B->posted_ns;
        pa->rtt_ns = pa->rtt_ns ? pa->rtt_ns + (took - pa->rtt_ns) / 8 : took;
        struct pa_reply_ctx c = {d, pa, B};
        B->take(B->dp, B->h, B->sizes, B->results, pa_reply_got, &c);
        B->h = NULL;
        B->state = PB_FREE;
        ended++;
    }
    pthread_mutex_lock(&d->mu);
    pa->nflight = flying;
    pa->batches += (uint64_t)ended;    /* counted once each, when it ends */
    /* the next look: most of a round trip after a request posted with none before it; soon after
     * one came back (others are likely due); else each look twice as late as the last */
    long rtt = (long)(pa->rtt_ns * 3 / 4);
    if (posted && flying == posted)
        pa->poll_ns = rtt < PA_POLL_MIN_NS ? PA_POLL_MIN_NS : rtt > PA_POLL_MAX_NS ? PA_POLL_MAX_NS : rtt;
    else if (ended)
        pa->poll_ns = PA_POLL_MIN_NS;
    else
        pa->poll_ns = pa->poll_ns * 2 > PA_POLL_MAX_NS ? PA_POLL_MAX_NS
                      : pa->poll_ns * 2 < PA_POLL_MIN_NS ? PA_POLL_MIN_NS : pa->poll_ns * 2;
    pthread_cond_broadcast(&pa->cv);
    return ended;
}

static void *peer_ahead_main(void *arg)
{
    struct door *d = arg;
    struct peer_ahead *pa = d->pa;
    prctl(PR_SET_NAME, "monarch-peerahd");
    prctl(PR_SET_TIMERSLACK, 1000UL);  /* its looks at the requests in flight are short waits */
    pthread_mutex_lock(&d->mu);
    while (!pa->stop) {
        if (pa->busy) {                /* the order ended: its copies are being dropped (ring_drop_locked) */
            pthread_cond_wait(&pa->cv, &d->mu);
            continue;
        }
        int room;
        int gathered = pa_gather_locked(d, pa, &room);
        if (pa->nvictims) {            /* consumed copies go first: their room is the batch's */
            pa->busy = 1;
            ring_unlink_victims(d, pa, 1);
            pa->busy = 0;
            pthread_cond_broadcast(&pa->cv);
        }
        if (gathered || pa->nflight) {
            pa->busy = 1;
            pa_flight(d, pa, 0);
            pa->busy = 0;
        }
        /* requests in flight: look again soon (or when the reader's progress frees room for more) */
        timed_wait(&pa->cv, &d->mu, pa->nflight ? pa->poll_ns : PA_WAIT_NS);
    }
    if (pa->nflight) {                 /* stopping: the requests in flight given up */
        pa->busy = 1;
        pa_flight(d, pa, 1);
        pa->busy = 0;
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Ring copies whose descriptors may be kept open: an eighth of the descriptor limit, up to PA_FDS_MAX. */
static uint32_t pa_fds_allowed(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return PA_FDS_MAX;
    return rl.rlim_cur / 8 < PA_FDS_MAX ? (uint32_t)(rl.rlim_cur / 8) : PA_FDS_MAX;
}

/* The lane's state made (not its thread), or NULL. */
static struct peer_ahead *peer_ahead_new(void)
{
    struct peer_ahead *pa = calloc(1, sizeof *pa);
    if (!pa)
        return NULL;
    pa->fds_cap = pa_fds_allowed();
    pthread_cond_init(&pa->cv, NULL);
    struct worker *w = &pa->w;
    w->spare_fd = w->ep = w->src_dir = w->key_dir = w->listed_src = -1;
    return pa;
}

/* The lane stopped and its thread joined (its batch under way ends first); harmless twice. */
static void stop_peer_ahead(struct door *d)
{
    struct peer_ahead *pa = d->pa;
    if (!pa)
        return;
    pthread_mutex_lock(&d->mu);
    pa->stop = 1;
    pthread_cond_broadcast(&pa->cv);
    int started = pa->started;
    pa->started = 0;
    pthread_mutex_unlock(&d->mu);
    if (started)
        pthread_join(pa->thread, NULL);
    pa_drop_spares(d, pa);
    pa->w.d = d;
    close_cached_dirs(&pa->w);
}

static void free_peer_ahead(struct door *d)
{
    if (!d->pa)
        return;
    free(d->pa->order);
    for (uint32_t i = 0; i < d->pa->nring; i++)
        ring_close_fd(d->pa, &d->pa->ring[i]);
    free(d->pa->ring);
    pthread_cond_destroy(&d->pa->cv);
    free(d->pa);
    d->pa = NULL;
}

/* -- what Python calls (front_door.h: the peer read-ahead lane) --------------------------------- */

/* The reader's order: ``entries`` (index entries, from 1; copied), of which the lane fetches the
 * other nodes' files ahead of the progress, at most ``window`` positions ahead; the progress
 * starts at 0, told by Python or by the reader of hint stream ``stream`` to the door (the last
 * order's progress told and not yet taken is dropped: it counted another order's positions).
 * n == 0: the lane has no order (its requests in flight end first, then its copies go). The
 * lane's thread starts with the first order. 0, or -1 (no memory, no thread: no lane). */
EXPORT int front_door_peer_ahead(struct door *d, const uint32_t *entries, uint32_t n, uint32_t window, uint64_t stream)
{
    uint32_t *copy = n ? malloc((size_t)n * sizeof *copy) : NULL;
    if (n && !copy)
        return -1;
    if (n)
        memcpy(copy, entries, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&d->mu);
    if (!d->pa && !(d->pa = peer_ahead_new())) {
        pthread_mutex_unlock(&d->mu);
        free(copy);
        return -1;
    }
    struct peer_ahead *pa = d->pa;
    while (!n && (pa->busy || pa->nflight) && pa->started)  /* no order: its requests in flight end first, */
        pthread_cond_wait(&pa->cv, &d->mu);                  /* then its copies go */
    free(pa->order);
    pa->order = copy;
    pa->gen++;
    for (uint32_t i = 0; i < pa->nring; i++)
        pa->ring[i].pos = PA_STALE;    /* consumed, unless the new order asks for it again */
    if (!n)
        ring_drop_locked(d, pa);
    pa->n = n;
    pa->next = pa->done = 0;
    pa->stream = stream;
    pa->told_fresh = 0;
    pa->window = window ? window : 1;
    pa->orders += n > 0;
    pa->room_wake_ns = 0;              /* a new order's first wait for room wakes Python at once */
    int ok = 0;
    if (n && !pa->started && !pa->stop && !d->stopped) {
        pa->w.d = d;
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);  /* the interpreter's threads take the signals */
        pa->started = pthread_create(&pa->thread, NULL, peer_ahead_main, d) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        ok = pa->started ? 0 : -1;
    }
    pthread_cond_broadcast(&pa->cv);
    pthread_mutex_unlock(&d->mu);
    return ok;
}

/* ``key``'s copy left the peer area (the cache evicted it) and no one fetches it: the lane may
 * fetch it again (K_FREE; its opens are still handed over, as those of a key Python had). */
EXPORT void front_door_peer_gone(struct door *d, const char *key, int len)
{
    pthread_mutex_lock(&d->mu);
    struct entry *e = find(d, key, (uint32_t)len, monarch_crc32(key, (uint32_t)len));
    if (e && e->state == K_PYTHON)
        e->state = K_FREE;
    pthread_mutex_unlock(&d->mu);
}

/* The reader is done with the first ``consumed`` positions of the order. Under the lock. */
static void peer_progress_locked(struct peer_ahead *pa, uint64_t consumed)
{
    uint32_t at = consumed > UINT32_MAX ? UINT32_MAX : (uint32_t)consumed;
    if (at > pa->done) {
        pa->done = at;
        pthread_cond_broadcast(&pa->cv);
    }
}

EXPORT void front_door_peer_progress(struct door *d, uint32_t consumed)
{
    pthread_mutex_lock(&d->mu);
    if (d->pa)
        peer_progress_locked(d->pa, consumed);
    pthread_mutex_unlock(&d->mu);
}

/* HINT PROGRESS requests (``got`` bytes: whole ones back to back, progress_state) on connection
 * ``fd``: answered here if they are of the stream whose order the lane follows (1: the connection
 * is the door's, kept for the next ones), else 0 (the caller hands them to Python, which answers
 * every other hint). Python's stager gets the last such progress when it drains the door. */
static int peer_progress_frames(struct door *d, int fd, const char *buf, uint32_t got)
{
    const uint32_t one = MONARCH_REQUEST_HEADER_SIZE + MONARCH_HINT_PROGRESS_BODY;
    uint32_t n = got / one;
    uint64_t stream, consumed = 0;
    memcpy(&stream, buf + MONARCH_REQUEST_HEADER_SIZE + 1, 8);
    for (uint32_t i = 0; i < n; i++) {
        const char *body = buf + i * one + MONARCH_REQUEST_HEADER_SIZE;
        uint64_t s, c;
        memcpy(&s, body + 1, 8);
        memcpy(&c, body + 9, 8);
        if (s != stream)
            return 0;
        consumed = c > consumed ? c : consumed;
    }
    pthread_mutex_lock(&d->mu);
    struct peer_ahead *pa = d->pa;
    if (!n || !pa || !pa->n || pa->stream != stream || d->stopped) {
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    peer_progress_locked(pa, consumed);
    pa->told = consumed > pa->told || !pa->told_fresh ? consumed : pa->told;
    pa->told_fresh = 1;
    pa->told_frames += n;
    int64_t now = monarch_now_ns();
    if (now - pa->told_woke_ns >= TOLD_WAKE_NS) {
        pa->told_woke_ns = now;
        wake_python_locked(d);
    }
    int keep = keep_locked(d, 1);
    pthread_mutex_unlock(&d->mu);
    char answers[PROGRESS_FRAMES_MAX * MONARCH_ANSWER_HEADER_SIZE] = {0};  /* each: status 0, no body */
    ssize_t sent = send(fd, answers, (size_t)n * MONARCH_ANSWER_HEADER_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT);
    finish_open(d, fd, keep, sent == (ssize_t)n * MONARCH_ANSWER_HEADER_SIZE);
    return 1;
}

/* The last progress answered by the door (peer_progress_frame) that Python has not taken, and
 * the frames the door answered so far (front_door.h: struct front_door_peer_told). 1 if there
 * was one (taken now), else 0. */
EXPORT int front_door_peer_told(struct door *d, struct front_door_peer_told *out)
{
    pthread_mutex_lock(&d->mu);
    struct peer_ahead *pa = d->pa;
    int fresh = pa && pa->told_fresh;
    out->stream = pa ? pa->stream : 0;
    out->consumed = pa ? pa->told : 0;
    out->answered = pa ? pa->told_frames : 0;
    if (pa)
        pa->told_fresh = 0;
    pthread_mutex_unlock(&d->mu);
    return fresh;
}

/* The peer read-ahead lane's books (front_door.h: struct front_door_peer_ahead_state). */
EXPORT void front_door_peer_ahead_state(struct door *d, struct front_door_peer_ahead_state *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&d->mu);
    struct peer_ahead *pa = d->pa;
    if (pa)
        *out = (struct front_door_peer_ahead_state){
            .orders = pa->orders, .fetched = pa->fetched, .fetched_bytes = pa->fetched_bytes,
            .batches = pa->batches, .failed = pa->failed, .skipped = pa->skipped, .room_waits = pa->room_waits,
            .order = pa->n, .next = pa->next, .consumed = pa->done, .waited = pa->waited, .copies = pa->nring,
            .room = (uint64_t)pa->room, .unlinked = pa->unlinked, .kept = pa->kept, .reused = pa->reused,
            .progress_answered = pa->told_frames, .written_mapped = pa->mapped,
        };
    pthread_mutex_unlock(&d->mu);
}
