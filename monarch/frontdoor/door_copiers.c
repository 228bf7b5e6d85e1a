/* Part of front_door.c, one translation unit (what it gives the other parts: door_copiers.h). Here:
 * the copiers (a slow source's misses, first) and the read-ahead lane; the copiers stopped. */
#include "door_copiers.h"

/* How many copiers the process's descriptor limit allows: each holds up to four while it
 * copies (its cached source and tier directories, the source, the copy), and the rest of the
 * daemon wants some (a node's soft limit is often 1,024; the daemon raises it at start). */
static int copiers_allowed(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return COPIERS_MAX;
    long n = ((long)rl.rlim_cur - 256) / 4;
    return n < INFLIGHT_LOW ? INFLIGHT_LOW : n > COPIERS_MAX ? COPIERS_MAX : (int)n;
}

/* Start copiers while the work waiting (queued misses, the lane's free slots under its limit)
 * outnumbers the idle ones, and wake that many. Under the lock. */
static void staff_locked(struct door *d)
{
    int lane = d->ahead.on ? d->copiers.flow.limit - d->copies_busy : 0;
    int want = d->copiers.ndemand + (lane > 0 ? lane : 0);
    while (d->copiers.n - d->copiers.working < want && d->copiers.n < d->copiers.cap && !d->copiers.stop) {
        struct worker *w = &d->copiers.threads[d->copiers.n];
        w->d = d;
        w->spare_fd = w->ep = w->src_dir = w->key_dir = w->listed_src = -1;
        w->ahead_held = 0;
        w->tmp_seq = (uint64_t)monarch_now_ns() ^ (uint64_t)getpid() << 32 ^ (uint64_t)(MAX_WORKERS + d->copiers.n) << 48;
        w->copy_buf = w->copy_buf ? w->copy_buf : malloc(MONARCH_INLINE_MAX + 1);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);  /* the interpreter's threads take the signals */
        int ok = w->copy_buf && pthread_create(&w->thread, NULL, copier_main, w) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (!ok)
            break;                     /* the copiers there are do the work, in turn */
        d->copiers.n++;
    }
    for (int i = 0; i < want; i++)
        pthread_cond_signal(&d->copiers.work_cv);
}

/* -- the copiers: queued misses first, then the read-ahead lane ------------------------------ */

/* A queued miss (BUSY, its room taken) copied and answered, or handed over to Python. */
static void copy_queued_miss(struct worker *w, struct waiter *q)
{
    char dest[PATH_MAX];
    w->listed_src = q->listed_src;     /* opened by the worker that described it: copied from */
    int published = copy_and_publish(w, q->req + MONARCH_REQUEST_HEADER_SIZE, q->len, q->hash, &q->f, EV_STAGED, dest);
    if (published < 0) {
        hand_over(w->d, q->fd, q->req, q->got, R_COPY_FAILED);
    } else {
        answer_open(w->d, q->fd, q->req, published, dest, (uint32_t)strlen(dest));  /* unsent: the shim reads the PFS */
    }
    free(q);
}

/* The lane is through, or stopped early (``why``: A_*). Under the lock. */
static void lane_end_locked(struct door *d, int why)
{
    d->ahead.on = 0;
    if (d->peer.take_wanted)
        d->peer.take_wanted(d->peer.dp, NULL, 0, 0);  /* peers read the names of what they open from now */
    if (why != A_WHOLE && d->ahead.end == A_WHOLE)
        d->ahead.end = why;
    inflight_starved(&d->copiers.flow);        /* no more work for every slot: the window says nothing */
    if (!d->ahead.busy)
        wake_python_locked(d);         /* its books see the lane's last copies, and that it ended */
}

enum { L_NONE, L_TAKEN, L_ROOM, L_DESCRIBE, L_SKIP };

/* May the lane copy now? Else it ends (why in *why). Under the lock. */
static int lane_may_copy_locked(const struct door *d, int *why)
{
    *why = d->stopped ? A_STOPPED : !d->gate_open || !d->allowed || d->never_copy ? A_NOT_COPYING : A_WHOLE;
    return *why == A_WHOLE;
}

/* Entry ``n`` (from 1) for the lane: L_TAKEN (made BUSY, its room taken: the caller copies it),
 * L_SKIP (not the door's: another route, staged, being copied, Python's), L_DESCRIBE (a file the
 * walk only listed: the caller opens it, or looks its name up, and describes it from that
 * descriptor first, outside the lock, then asks again: no file is stat'ed ahead of the lane, and
 * one it copies is opened once), L_ROOM (the caller waits
 * for room to be lent) or L_NONE (another copier times that wait; the lane ended for want of it).
 * ``held``: described by the caller for the lane (the lane counts it busy since). Under the lock. */
static int lane_consider_locked(struct door *d, uint32_t n, int held, struct idx_file *f, char *key, uint32_t *len,
                                uint32_t *hash)
{
    if (!index_entry(d, n, f, key, len))
        return !held && index_listed_number(d, n) && (*len = index_key(d, n, key)) ? L_DESCRIBE : L_SKIP;
    if (!monarch_index_routes(f->flags, MONARCH_ROUTE_DOOR) || !monarch_route_fits(MONARCH_ROUTE_DOOR, f->size))
        return L_SKIP;                 /* not the door's route (published in the index): Python's stager copies it */
    *hash = monarch_crc32(key, *len);
    if (find(d, key, *len, *hash))
        return L_SKIP;                 /* staged, being copied, or Python's */
    if ((int64_t)f->size > d->books.lease[Q_BOOKS]) {
        if (d->ahead.room_wait)
            return L_NONE;             /* one copier times the wait; a grant wakes them all */
        if (++d->ahead.waits > AHEAD_WAITS) {
            lane_end_locked(d, A_NO_ROOM);
            return L_NONE;
        }
        wake_python_locked(d);         /* its books lend more when it drains them */
        inflight_starved(&d->copiers.flow);
        d->ahead.room_wait = 1;
        return L_ROOM;
    }
    d->ahead.waits = 0;
    struct entry *e = insert(d, key, *len, *hash);
    if (!e)
        return L_SKIP;
    e->state = K_BUSY;
    d->busy++;
    d->copies_busy++;
    if (!held)
        d->ahead.busy++;               /* (a held entry's counts since its L_DESCRIBE) */
    d->books.lease[Q_BOOKS] -= (int64_t)f->size;
    return L_TAKEN;
}

/* The lane's next small file the door has never heard of: L_TAKEN (made BUSY for this copier, its
 * key built into ``key``, INDEX_KEY_MAX bytes), L_DESCRIBE (entry *n to describe first: counted
 * busy and in flight), L_NONE: nothing for the lane now (off, through, at its limit, or another
 * copier waits for room); L_ROOM: the caller waits for room to be lent. The lane ends when its
 * list does, when copying is not allowed (a write by the job, a failed tier: Python's stager
 * takes the rest) or when no room is lent for AHEAD_WAITS waits in a row. Under the lock. */
static int lane_next_locked(struct door *d, struct idx_file *f, char *key, uint32_t *len, uint32_t *hash, uint32_t *n)
{
    int why;
    while (d->ahead.on) {
        if (d->copies_busy >= d->copiers.flow.limit)
            return L_NONE;             /* in flight as many as the source's measure allows */
        if (d->ahead.next >= d->ahead.n) {
            lane_end_locked(d, A_WHOLE);
            break;
        }
        if (!lane_may_copy_locked(d, &why)) {
            lane_end_locked(d, why);
            break;
        }
        *n = d->ahead.wanted;          /* one that waited for room, else one a peer wants now */
        d->ahead.wanted = 0;
        if (*n || (d->peer.take_wanted && d->peer.take_wanted(d->peer.dp, n, 1, 1) == 1)) {
            /* a file of this node's a peer opens now, not described there: first, described as it
             * is copied (unless the lane passed it: described, or its open under way) */
            if (*n <= d->ahead.next || *n > d->ahead.n || !own_file_locked(d, *n))
                continue;
            int r = lane_consider_locked(d, *n, 0, f, key, len, hash);
            if (r == L_DESCRIBE) {
                d->copies_busy++;
                d->ahead.busy++;
            }
            if (r == L_ROOM || r == L_NONE)
                d->ahead.wanted = *n;  /* first again, after the wait */
            if (r != L_SKIP)
                return r;
            continue;
        }
        *n = d->ahead.next + 1;
        if (!own_file_locked(d, *n)) {
            d->ahead.next++;           /* another node's: its owner stages it */
            continue;
        }
        int r = lane_consider_locked(d, *n, 0, f, key, len, hash);
        if (r == L_ROOM || r == L_NONE)
            return r;                  /* the same entry again, after the wait */
        d->ahead.next++;
        if (r == L_DESCRIBE) {
            d->copies_busy++;          /* its open is a call in flight toward the PFS (until described) */
            d->ahead.busy++;           /* the lane is not through until it is taken or let go */
        }
        if (r != L_SKIP)
            return r;
    }
    return L_NONE;
}

/* A copier's described entry let go (not the door's after all, the lane stopped): its source
 * closed, the lane's count given back, and its end told if it was the last. Under the lock. */
static void lane_let_go_locked(struct worker *w)
{
    struct door *d = w->d;
    w->ahead_held = 0;
    if (w->listed_src >= 0) {
        close(w->listed_src);
        w->listed_src = -1;
    }
    if (--d->ahead.busy == 0 && !d->ahead.on)
        wake_python_locked(d);         /* its books see the lane's last copies, and that it ended */
}

/* The entry a copier described for the lane (w->ahead_held, its source in w->listed_src), now
 * taken (L_TAKEN), waited for (L_ROOM, L_NONE: the copier waits, then asks again), or let go
 * (L_SKIP). Under the lock. */
static int lane_held_locked(struct worker *w, struct idx_file *f, char *key, uint32_t *len, uint32_t *hash)
{
    struct door *d = w->d;
    int why;
    int r = d->ahead.end == A_WHOLE && lane_may_copy_locked(d, &why)
            ? lane_consider_locked(d, w->ahead_held, 1, f, key, len, hash) : L_SKIP;
    if (r == L_SKIP && index_entry(d, w->ahead_held, f, NULL, NULL) && !monarch_route_fits(MONARCH_ROUTE_DOOR, f->size))
        d->ahead.large++;              /* the stager's: past the lane's size */
    if ((r == L_ROOM || r == L_NONE) && d->ahead.end == A_WHOLE)
        return r;
    if (r == L_TAKEN)
        w->ahead_held = 0;             /* counted busy since its L_DESCRIBE: copy_and_publish gives it back */
    else
        lane_let_go_locked(w);         /* (or the lane ended for want of room meanwhile) */
    return r == L_TAKEN ? L_TAKEN : L_SKIP;
}

/* One copier: a queued miss if there is one, else the lane's next file while the lane is
 * under its limit, else it waits for work. */
static void *copier_main(void *arg)
{
    struct worker *w = arg;
    struct door *d = w->d;
    char dest[PATH_MAX];
    prctl(PR_SET_NAME, "monarch-copy");
    pthread_mutex_lock(&d->mu);
    while (!d->copiers.stop) {
        struct waiter *q = w->ahead_held ? NULL : d->copiers.demand;
        struct idx_file f;
        char key[INDEX_KEY_MAX];
        uint32_t len, hash, n = 0;
        int lane;
        if (q) {
            d->copiers.demand = q->next;
            if (!d->copiers.demand)
                d->copiers.demand_tail = &d->copiers.demand;
            d->copiers.ndemand--;
            d->copiers.working++;
            pthread_mutex_unlock(&d->mu);
            copy_queued_miss(w, q);
            pthread_mutex_lock(&d->mu);
            d->copiers.working--;
            continue;
        }
        lane = w->ahead_held ? lane_held_locked(w, &f, key, &len, &hash)
                             : lane_next_locked(d, &f, key, &len, &hash, &n);
        if (lane == L_TAKEN) {
            d->copiers.working++;
            pthread_mutex_unlock(&d->mu);
            copy_and_publish(w, key, len, hash, &f, EV_AHEAD, dest);
            pthread_mutex_lock(&d->mu);
            d->copiers.working--;
        } else if (lane == L_DESCRIBE) {
            /* mostly files past the lane's size so far: each looked up by name (the stager opens it
             * to copy it); else opened, its stat taken from the open, the descriptor kept for the copy */
            int by_name = 2 * d->ahead.large > d->ahead.described;
            d->ahead.described++;
            d->copiers.working++;
            pthread_mutex_unlock(&d->mu);
            int described = describe_listed(w, key, len, n, 1, by_name);
            pthread_mutex_lock(&d->mu);
            d->copiers.working--;
            d->copies_busy--;          /* described: not in flight while it waits to be taken (a
                                          change of copy tier waits for the copies in flight) */
            pthread_cond_broadcast(&d->cv);
            w->ahead_held = n;
            if (!described && w->listed_src >= 0) {
                close(w->listed_src);
                w->listed_src = -1;
            }
        } else if (lane == L_ROOM || (lane == L_NONE && w->ahead_held)) {
            timed_wait(&d->copiers.work_cv, &d->mu, AHEAD_WAIT_NS);  /* (a held entry never waits untimed) */
            if (lane == L_ROOM)
                d->ahead.room_wait = 0;
        } else if (lane != L_SKIP) {
            if (!d->ahead.on)
                inflight_starved(&d->copiers.flow);  /* a copier free and nothing to copy */
            pthread_cond_wait(&d->copiers.work_cv, &d->mu);
        }
    }
    if (w->ahead_held)
        lane_let_go_locked(w);         /* stopped with an entry described */
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* The copiers stopped and joined (the lane with them); their copies under way end first. */
static void stop_copiers(struct door *d)
{
    pthread_mutex_lock(&d->mu);
    d->copiers.stop = 1;
    if (d->ahead.on)
        lane_end_locked(d, A_STOPPED);
    pthread_cond_broadcast(&d->copiers.work_cv);
    int n = d->copiers.n;
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < n; i++) {
        struct worker *w = &d->copiers.threads[i];
        pthread_join(w->thread, NULL);
        close_cached_dirs(w);
    }
    pthread_mutex_lock(&d->mu);
    d->copiers.n = 0;                   /* joined: a second stop joins none (copiers_stop starts none) */
    pthread_mutex_unlock(&d->mu);
}

/* After every thread is joined: the misses still queued and the requests still parked are
 * closed (their shims read the PFS), their keys Python's. */
static void close_waiting(struct door *d)
{
    pthread_mutex_lock(&d->mu);
    struct waiter *lists[2] = {d->copiers.demand, d->answers.parked};
    for (struct waiter *q = d->copiers.demand; q; q = q->next) {
        struct entry *e = find(d, q->req + MONARCH_REQUEST_HEADER_SIZE, q->len, q->hash);
        if (e)
            e->state = K_PYTHON;
        d->busy--;
        d->copies_busy--;
        d->books.lease[Q_BOOKS] += (int64_t)q->f.size;
    }
    d->copiers.demand = d->answers.parked = NULL;
    d->copiers.demand_tail = &d->copiers.demand;
    d->copiers.ndemand = 0;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < 2; i++) {
        for (struct waiter *q = lists[i], *next; q; q = next) {
            next = q->next;
            close(q->fd);
            if (q->listed_src >= 0)
                close(q->listed_src);
            free(q);
        }
    }
}
