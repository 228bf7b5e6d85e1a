/* Part of front_door.c, one translation unit (what it gives the other parts: door_loop.h). Here:
 * the hot path: the OPEN decision (try_open), a request's frame, each worker's event loop (accept,
 * read, serve). */
#include "door_loop.h"


/* Why the door may not copy a miss of ``key`` itself (an R_*: the connection goes to Python),
 * or -1: it may, ``*f`` is its file and ``*e`` its new entry. ``*e``: the key's entry, if the
 * table has one (neither BUSY nor STAGED: the caller answered those). Under the lock. */
static int why_not_copy_locked(struct door *d, struct entry **e, const char *key, uint32_t len, uint32_t hash,
                               struct idx_file *f)
{
    if (*e)
        return R_PYTHON_KEY;           /* claimed by Python, or handed over before */
    if (!d->allowed || d->never_copy)
        return R_NOT_COPYING;          /* Python said no, or the job wrote under a root */
    if (!index_file(d, key, len, f) || !monarch_index_routes(f->flags, MONARCH_ROUTE_DOOR)
        || !monarch_route_fits(MONARCH_ROUTE_DOOR, f->size))
        return R_NOT_SMALL_FILE;       /* not in the index, or its published route is not the door's (large: blocks or
                                        * the stager's; a store's; not copied); the size bounds the copy's buffer */
    if (!own_file_locked(d, f->entry))
        return R_NOT_COPYING;          /* a sharded node's: another node owns it */
    if ((int64_t)f->size > d->books.lease[Q_BOOKS])
        return R_NO_ROOM;              /* more than the room lent */
    if (!(*e = insert(d, key, len, hash)))
        return R_OTHER;                /* no memory for the key */
    return -1;
}

/* An OPEN of a valid key (``req``: the request's ``got`` bytes): answered here or later (-1),
 * or why it is to be handed over (R_*). */
static int try_open(struct worker *w, int fd, const char *req, uint32_t got, const char *key, uint32_t len)
{
    struct door *d = w->d;
    char dest[PATH_MAX];
    int described = 0;                 /* a listed file described here once: asked again */
again:
    pthread_mutex_lock(&d->mu);
    if (!d->gate_open) {
        pthread_mutex_unlock(&d->mu);
        return R_CLOSED_GATE;
    }
    uint32_t hash = monarch_crc32(key, len);
    struct entry *e = find(d, key, len, hash);
    if (e && e->state == K_BUSY) {     /* another thread copies it: its answer is ours, given when it ends */
        struct waiter *q = new_waiter(fd, req, got, hash, len);
        if (q) {
            q->next = d->answers.parked;
            d->answers.parked = q;
        }
        pthread_mutex_unlock(&d->mu);
        return q ? -1 : R_OTHER;
    }
    if (e && e->state == K_STAGED) {
        int slot = e->slot;
        const char *tier = d->tiers[slot];
        mark_answered(e, door_ms(d));
        int pl = snprintf(dest, sizeof dest, "%s/%.*s", tier, (int)len, key);
        int keep = pl < (int)sizeof dest && keep_locked(d, asks_keep(req));
        pthread_mutex_unlock(&d->mu);
        if (pl >= (int)sizeof dest)
            return R_OTHER;
        __atomic_add_fetch(&d->count.hits[slot], 1, __ATOMIC_RELAXED);  /* before: the client may ask for the report next */
        int sent = send_answer(fd, slot | (keep ? MONARCH_ANSWER_KEPT : 0), dest, (uint32_t)pl) == 0;
        if (!sent)
            __atomic_sub_fetch(&d->count.hits[slot], 1, __ATOMIC_RELAXED);
        finish_open(d, fd, keep, sent);
        return -1;
    }
    struct idx_file f;
    int owner;
    if ((!e || e->state == K_FREE) && d->peer.fetch && index_file(d, key, len, &f) && (owner = peer_owner_locked(d, &f)) >= 0)
        return remote_open(w, fd, req, got, key, len, hash, e, &f, owner);   /* the lock let go */
    int why = why_not_copy_locked(d, &e, key, len, hash, &f);
    if (why >= 0) {
        uint32_t listed = why == R_NOT_SMALL_FILE && !e && !described ? index_listed(d, key, len, hash) : 0;
        /* another node's file (a sharded node's: its owner by its hash) is opened there, never here:
         * described from its owner's index (else by its name alone), then fetched from its owner */
        struct owner_ask ask = owner_ask_locked(d, listed);
        pthread_mutex_unlock(&d->mu);
        if (listed && (described = (ask.describe && describe_from_owner(w, &ask, key, len, listed))
                                   || describe_listed(w, key, len, listed, 0, ask.owner >= 0)))  /* outside the lock */
            goto again;
        return why;
    }
    e->state = K_BUSY;
    d->busy++;
    d->copies_busy++;
    d->books.lease[Q_BOOKS] -= (int64_t)f.size;
    /* demand first, whatever the lane does: a fast source's miss is copied here, at once (no
     * hand-off costs more than the copy); a slow one's by a copier, so that this thread goes
     * on accepting while the source answers, and as many misses are in flight as readers wait */
    struct waiter *q = d->copiers.flow.recent < 0 || d->copiers.flow.recent > INLINE_COPY_SECONDS ? new_waiter(fd, req, got, hash, len) : NULL;
    if (q) {
        q->f = f;
        q->listed_src = w->listed_src;  /* the copier copies from it */
        w->listed_src = -1;
        *d->copiers.demand_tail = q;
        d->copiers.demand_tail = &q->next;
        d->copiers.ndemand++;
        staff_locked(d);
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    pthread_mutex_unlock(&d->mu);

    int published = copy_and_publish(w, key, len, hash, &f, EV_STAGED, dest);
    if (published < 0)
        return R_COPY_FAILED;
    answer_open(d, fd, req, published, dest, (uint32_t)strlen(dest));  /* unsent: the shim reads the PFS */
    return -1;
}

/* ``got`` bytes of HINT PROGRESS requests back to back (a reader sends the next before the last
 * is answered): all whole, the last cut short, or anything else (Python's). */
static int progress_state(const char *buf, uint32_t got)
{
    const uint32_t one = MONARCH_REQUEST_HEADER_SIZE + MONARCH_HINT_PROGRESS_BODY;
    const unsigned char head[MONARCH_REQUEST_HEADER_SIZE + 1] = {MONARCH_VERB_HINT, 0, 0, 0, MONARCH_HINT_PROGRESS_BODY,
                                                                 0, 0, 0, MONARCH_HINT_PROGRESS};
    if (got > PROGRESS_FRAMES_MAX * one)
        return F_ODD;
    for (uint32_t at = 0; at < got; at += one) {
        uint32_t have = got - at;
        if (memcmp(buf + at, head, have < sizeof head ? have : sizeof head) != 0)
            return F_ODD;
        if (have < one)
            return F_MORE;
    }
    return F_HINT_PROGRESS;
}

/* What ``got`` bytes of a request are: not all there yet, a whole OPEN, an INDEX poll, a HINT
 * PROGRESS (alone: several at once go to Python), a whole PAGES, or anything else. */
static int frame_state(const char *buf, uint32_t got)
{
    if (got < MONARCH_REQUEST_HEADER_SIZE)
        return F_MORE;
    uint32_t length;
    memcpy(&length, buf + 4, 4);
    static const char poll_body[] = MONARCH_INDEX_POLL;
    if ((unsigned char)buf[0] == MONARCH_VERB_INDEX && !buf[1] && !buf[2] && !buf[3] && length == sizeof poll_body - 1)
        return got < MONARCH_REQUEST_HEADER_SIZE + length ? F_MORE
               : got == MONARCH_REQUEST_HEADER_SIZE + length
                 && !memcmp(buf + MONARCH_REQUEST_HEADER_SIZE, poll_body, length) ? F_INDEX_POLL : F_ODD;
    if ((unsigned char)buf[0] == MONARCH_VERB_HINT && length == MONARCH_HINT_PROGRESS_BODY)
        return progress_state(buf, got);
    if ((unsigned char)buf[0] == MONARCH_VERB_PAGES)
        return pages_frame(buf, got, length);
    if ((unsigned char)buf[0] == MONARCH_VERB_DESCRIBE && !buf[1] && !buf[2] && !buf[3] && length &&
        length <= MONARCH_MAX_REQUEST && got <= MONARCH_REQUEST_HEADER_SIZE + length)
        return got < MONARCH_REQUEST_HEADER_SIZE + length ? F_MORE : F_DESCRIBE;
    if ((unsigned char)buf[0] != MONARCH_VERB_OPEN || ((unsigned char)buf[1] & ~MONARCH_REQUEST_KEEP) || buf[2] || buf[3] || length == 0 ||
        length > MONARCH_MAX_REQUEST || got > MONARCH_REQUEST_HEADER_SIZE + length)
        return F_ODD;
    return got < MONARCH_REQUEST_HEADER_SIZE + length ? F_MORE : F_OPEN;
}

/* A DESCRIBE: a file the walk only listed, described here (one lookup, as its miss would: the index is
 * the daemon's own), then answered 0, or 1 when it is no file now; -1, or why it is Python's. */
static int try_describe(struct worker *w, int fd, const char *key, uint32_t len)
{
    struct door *d = w->d;
    uint32_t hash = monarch_crc32(key, len);
    pthread_mutex_lock(&d->mu);
    int open = d->gate_open, ours = open && d->index.borrowed && __atomic_load_n(&d->steps.known, __ATOMIC_ACQUIRE);
    uint32_t n = ours ? index_listed(d, key, len, hash) : 0;
    struct idx_file f;
    int described = ours && !n && index_file(d, key, len, &f);
    struct owner_ask ask = owner_ask_locked(d, n);
    pthread_mutex_unlock(&d->mu);
    if (!open)
        return R_CLOSED_GATE;
    if (!ours)
        return R_OTHER;
    if (n)  /* outside the lock: another node's from its owner, else a PFS call */
        described = (ask.describe && describe_from_owner(w, &ask, key, len, n)) || describe_named(w, key, len, n);
    send_answer(fd, described ? 0 : 1, "", 0);     /* unsent: the shim asks the PFS */
    close(fd);
    return -1;
}

/* A whole request (or an odd one): answered here, or the connection handed over. */
static void serve(struct worker *w, int fd, const char *buf, uint32_t got, int state)
{
    const char *key = buf + MONARCH_REQUEST_HEADER_SIZE;
    size_t klen = got - MONARCH_REQUEST_HEADER_SIZE;
    if (state == F_INDEX_POLL && !__atomic_load_n(&w->d->settled, __ATOMIC_ACQUIRE)) {
        send_answer(fd, MONARCH_INDEX_WALKING, "", 0);  /* unsent: the shim asks again later */
        close(fd);
        return;
    }
    if (state == F_HINT_PROGRESS && peer_progress_frames(w->d, fd, buf, got))
        return;
    if (state == F_PAGES) {
        serve_pages(w, fd, buf, got);
        return;
    }
    int why = state == F_OPEN && valid_key(key, klen) ? try_open(w, fd, buf, got, key, klen)
              : state == F_DESCRIBE && valid_key(key, klen) ? try_describe(w, fd, key, (uint32_t)klen) : R_OTHER;
    if (w->listed_src >= 0) {          /* a listed file's source opened and not copied from (a hit meanwhile, no room) */
        close(w->listed_src);
        w->listed_src = -1;
    }
    if (why >= 0)
        hand_over(w->d, fd, buf, got, why);
}

static void drop_pending(struct worker *w, struct conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        w->pending = c->next;
    if (c->next)
        c->next->prev = c->prev;
    w->npending--;
    epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
}

static void on_readable(struct worker *w, struct conn *c)
{
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->got, sizeof c->buf - c->got, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            arm_once(w->ep, c->fd, c, 1);   /* the rest, once it comes (not armed: the sweep's, in time) */
            return;
        }
        int state = r > 0 ? (c->got += (uint32_t)r, frame_state(c->buf, c->got)) : F_ODD;
        if (state == F_MORE)
            continue;
        drop_pending(w, c);
        if (r > 0 || c->got)
            serve(w, c->fd, c->buf, c->got, state);  /* a request cut short: Python says so */
        else
            close(c->fd);                            /* gone before asking */
        free(c);
        return;
    }
}

/* Out of descriptors: the connection would wait in the backlog, its listening socket
 * readable, this loop spinning on it. The spare is given up to accept it and close it at
 * once (its shim reads the PFS), then taken back. Another worker may take the descriptor
 * first: its accept is then a real one, served as any, and this spare is taken back at the
 * next refusal a descriptor is free for. */
static int refuse_one(struct worker *w)
{
    if (w->spare_fd < 0)               /* lost to another worker's accept last time: take it back if one is free */
        w->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (w->spare_fd < 0)
        return 0;
    close(w->spare_fd);
    int fd = accept4(w->d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
        pthread_mutex_lock(&w->d->mu);
        w->d->count.closed_too_many++;       /* before the close: its client may ask for the counts next */
        pthread_mutex_unlock(&w->d->mu);
        close(fd);
    }
    w->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd >= 0;
}

/* A connection (``c``, its fd set: accepted, or kept and readable again) with its request read
 * as far as it has come: served when whole, else pending in this worker's epoll (swept to
 * Python after PENDING_NS). ``reused``: a kept one (counted when it brings a request). */
static void take_request(struct worker *w, struct conn *c, int reused)
{
    struct door *d = w->d;
    int fd = c->fd;
    c->kept = 0;
    c->got = 0;
    c->since = monarch_now_ns();
    ssize_t r = recv(fd, c->buf, sizeof c->buf, MSG_DONTWAIT);
    if (r > 0 && reused)
        __atomic_add_fetch(&d->count.reused, 1, __ATOMIC_RELAXED);
    int state = r > 0 ? frame_state(c->buf, c->got = (uint32_t)r) : F_MORE;
    if (state != F_MORE) {
        serve(w, fd, c->buf, c->got, state);
        free(c);
        return;
    } else if (r == 0) {
        close(fd);
        free(c);
        return;
    }
    if (w->npending >= PENDING_MAX) {
        hand_over(d, fd, c->buf, c->got, R_OTHER);
        free(c);
        return;
    }
    /* one-shot: each event is served by the one wait that took it, even when a handler waits on
     * this epoll again (await_answer) while the loop still holds the events after its own; a
     * kept connection is registered here already (disarmed) */
    if (arm_once(w->ep, fd, c, reused) < 0) {
        hand_over(d, fd, c->buf, c->got, R_OTHER);
        free(c);
        return;
    }
    c->prev = NULL;
    c->next = w->pending;
    if (w->pending)
        w->pending->prev = c;
    w->pending = c;
    w->npending++;
}

static void on_accept(struct worker *w)
{
    struct door *d = w->d;
    for (;;) {
        int fd = accept4(d->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE) {
                if (refuse_one(w))
                    continue;
                struct timespec ts = {0, 1000000};  /* no spare either: look again in 1 ms, not at once */
                nanosleep(&ts, NULL);
            }
            return;                    /* EAGAIN; or out of descriptors: the next turn retries */
        }
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0 || cred.uid != d->uid) {
            hand_over(d, fd, NULL, 0, R_OTHER);    /* Python refuses it, counts it and says why */
            continue;
        }
        struct conn *c = malloc(sizeof *c);
        if (!c) {
            hand_over(d, fd, NULL, 0, R_OTHER);
            continue;
        }
        __atomic_add_fetch(&d->count.accepted, 1, __ATOMIC_RELAXED);
        c->fd = fd;
        take_request(w, c, 0);
    }
}

/* A kept connection (finish_open) is readable: its shim's next request, or its end. */
static void on_kept(struct worker *w, struct conn *c)
{
    struct door *d = w->d;
    pthread_mutex_lock(&d->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        d->answers.kept = c->next;
    if (c->next)
        c->next->prev = c->prev;
    d->answers.nkept--;
    pthread_mutex_unlock(&d->mu);
    take_request(w, c, 1);             /* still registered here, disarmed (one-shot): arm_once */
}

static void sweep_slow(struct worker *w)
{
    int64_t now = monarch_now_ns();
    for (struct conn *c = w->pending, *next; c; c = next) {
        next = c->next;
        if (now - c->since < PENDING_NS)
            continue;
        drop_pending(w, c);
        hand_over(w->d, c->fd, c->buf, c->got, R_OTHER);
        free(c);
    }
}

/* The ``n`` events of one wait on the worker's epoll, served: new connections, kept ones with
 * their next request, requests still coming. 1: the door stops (its event stays readable: the
 * worker's loop sees it again). Also called by a worker waiting for a fetch's answer
 * (await_answer), which is why the slow ones are swept by the loop alone: the loop may still
 * hold a pending connection's event. */
static int serve_events(struct worker *w, const struct epoll_event *evs, int n)
{
    for (int i = 0; i < n; i++) {
        void *p = evs[i].data.ptr;
        if (p == (void *)(uintptr_t)T_STOP)
            return 1;
        if (p == (void *)(uintptr_t)T_LISTEN)
            on_accept(w);
        else if (((struct conn *)p)->kept)
            on_kept(w, p);
        else
            on_readable(w, p);
    }
    return 0;
}

static void *door_main(void *arg)
{
    struct worker *w = arg;
    struct epoll_event evs[64];
    prctl(PR_SET_NAME, "monarch-door");
    prctl(PR_SET_TIMERSLACK, 1000UL);  /* its waits for a fetch's answer are short (await_answer) */
    for (;;) {
        int n = epoll_wait(w->ep, evs, 64, w->npending ? 100 : -1);
        if (n < 0 && errno != EINTR)
            break;
        if (serve_events(w, evs, n < 0 ? 0 : n))
            return NULL;
        if (w->npending)
            sweep_slow(w);
    }
    return NULL;
}
