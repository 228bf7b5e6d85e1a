/* Part of front_door.c, one translation unit (what it gives the other parts: door_answers.h). Here:
 * handing over to Python, the events of its books, a request checked and answered, answers given
 * later (parked requests, queued misses). */
#include "door_answers.h"

/* -- handing over to Python ------------------------------------------------------------ */
static void wake_python_locked(struct door *d)
{
    if (d->answers.woken)
        return;
    d->answers.woken = 1;
    uint64_t one = 1;
    if (write(d->wake_fd, &one, sizeof one) < 0) {
        /* the counter cannot overflow at one write per drain; nothing to do */
    }
}

static void hand_over(struct door *d, int fd, const char *data, uint32_t len, int why)
{
    pthread_mutex_lock(&d->mu);
    int full = d->answers.nhanded >= HANDED_MAX;   /* Python is not taking them: a flood, or it is stuck */
    if (full)
        d->count.closed_too_many++;
    pthread_mutex_unlock(&d->mu);
    struct handed *h = full ? NULL : malloc(sizeof *h + len);
    if (!h) {
        close(fd);                     /* the client's shim reads the PFS */
        return;
    }
    h->next = NULL;
    h->fd = fd;
    h->len = len;
    if (len)
        memcpy(h->data, data, len);
    pthread_mutex_lock(&d->mu);
    *d->answers.hq_tail = h;
    d->answers.hq_tail = &h->next;
    d->answers.nhanded++;
    d->count.handed++;
    d->count.why[why]++;
    wake_python_locked(d);
    pthread_mutex_unlock(&d->mu);
}

static void post_event_locked(struct door *d, int q, uint32_t kind, uint32_t slot, const char *key, uint32_t len,
                              uint32_t entry, uint64_t size, uint64_t bytes_read, int64_t ns)
{
    struct evqueue *queue = &d->books.evq[q];
    size_t need = queue->len + EVENT_HEAD + len;
    if (need > queue->cap) {           /* doubling: rare, and amortised over the events */
        size_t cap = queue->cap ? 2 * queue->cap : 64 * 1024;
        while (cap < need)
            cap *= 2;
        char *more = realloc(queue->buf, cap);
        if (!more)
            return;                    /* the books lose one line; the bytes are right */
        queue->buf = more;
        queue->cap = cap;
    }
    char *p = queue->buf + queue->len;
    struct front_door_event_head head = {kind, slot, size, bytes_read, ns, len, entry};
    memcpy(p, &head, sizeof head);
    memcpy(p + EVENT_HEAD, key, len);
    queue->len = need;
    /* the books can wait (Python drains them on its own tick, and before any report) for a
     * batch, or for the room lent to run low: one wake-up per batch, not per copy */
    if (++queue->n >= EVENT_BATCH || (kind != EV_STAGED && kind != EV_AHEAD && kind != EV_TRANSIENT)) {
        wake_python_locked(d);
    } else if (d->books.lease[q] < d->books.low_water[q]) {
        /* woken for room: again when half of what is left has gone, not at every event (Python may
         * judge there is room enough still; a fetch answered as a memfd takes none) */
        d->books.low_water[q] = d->books.lease[q] / 2;
        wake_python_locked(d);
    }
}

/* -- a request ------------------------------------------------------------------------- */
static int valid_key(const char *k, uint32_t n)    /* server._valid_key */
{
    uint32_t i = 0;
    while (i < n && k[i] >= '0' && k[i] <= '9')
        i++;
    if (i == 0 || i >= n || k[i] != '/' || i + 1 >= n)
        return 0;
    if (memchr(k, 0, n))
        return 0;
    for (uint32_t s = i + 1; s <= n;) {             /* every component: not "", ".", ".." */
        const char *slash = memchr(k + s, '/', n - s);
        uint32_t e = slash ? (uint32_t)(slash - k) : n;
        uint32_t cl = e - s;
        if (cl == 0 || (cl == 1 && k[s] == '.') || (cl == 2 && k[s] == '.' && k[s + 1] == '.'))
            return 0;
        s = e + 1;
    }
    return 1;
}

static int send_answer(int fd, int32_t status, const char *body, uint32_t len)
{
    char frame[8 + PATH_MAX + 256];
    if (len > sizeof frame - 8)
        return -1;
    memcpy(frame, &status, 4);
    memcpy(frame + 4, &len, 4);
    memcpy(frame + 8, body, len);
    ssize_t w = send(fd, frame, 8 + len, MSG_NOSIGNAL | MSG_DONTWAIT);
    return w == (ssize_t)(8 + len) ? 0 : -1;        /* a fresh socket's buffer takes it whole */
}

/* -- an answered OPEN's connection: kept for its shim's next OPEN, or closed ------------- */
/* A shim asks (REQUEST_KEEP) that its connection stay open once its OPEN is answered; the
 * door keeps it (and says so: ANSWER_KEPT) while it keeps fewer than KEPT_MAX and is not
 * stopping. Kept, it waits idle in a worker's epoll (one-shot, never swept as slow: it is
 * not on the worker's pending list), on the door's list (closed by front_door_stop); its next
 * request is read as a new connection's (take_request), whichever thread answered the last.
 * It stays registered in that epoll (the connection's descriptor picks the worker) from one
 * open to the next. */

/* Arm ``fd`` (``c``) in the epoll ``ep`` for one event. A kept connection stays registered in
 * its worker's epoll once it fired (one-shot: disarmed, not removed), so it is armed again
 * there (one syscall, not a removal and an addition per open); a new one is added. 0: armed. */
static int arm_once(int ep, int fd, struct conn *c, int registered)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.ptr = c};
    int op = registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    if (epoll_ctl(ep, op, fd, &ev) == 0)
        return 0;
    if (errno != (registered ? ENOENT : EEXIST))
        return -1;
    return epoll_ctl(ep, registered ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev);
}

/* Does ``req`` ask to keep its connection (an OPEN's flags byte)? */
static int asks_keep(const char *req)
{
    return ((unsigned char)req[1] & MONARCH_REQUEST_KEEP) != 0;
}

/* Will the connection of a request that asks it be kept (counted now: finish_open ends it)? Under the lock. */
static int keep_locked(struct door *d, int asks)
{
    int keep = asks && d->answers.keeping && d->answers.nkept < KEPT_MAX;
    d->answers.nkept += keep;
    return keep;
}

/* An OPEN answered (``sent``: its frame went whole, saying ANSWER_KEPT if ``keep``): its
 * connection kept, idle, in a worker's epoll, or closed (the shim then connects anew). */
static void finish_open(struct door *d, int fd, int keep, int sent)
{
    if (!keep) {
        close(fd);
        return;
    }
    struct conn *c = sent ? malloc(sizeof *c) : NULL;
    pthread_mutex_lock(&d->mu);
    if (c && d->answers.keeping) {             /* added under the lock: the worker it wakes unlinks it under the lock */
        c->fd = fd;
        c->kept = 1;
        c->got = 0;
        c->since = 0;
        c->prev = NULL;
        c->next = d->answers.kept;
        if (arm_once(d->workers[fd % d->nworkers].ep, fd, c, 1) == 0) {
            if (d->answers.kept)
                d->answers.kept->prev = c;
            d->answers.kept = c;
            pthread_mutex_unlock(&d->mu);
            return;
        }
    }
    d->answers.nkept--;
    pthread_mutex_unlock(&d->mu);
    free(c);
    close(fd);
}

/* Answer an OPEN (``req``: its request) with ``status`` and ``body``, then finish_open. 0: sent. */
static int answer_open(struct door *d, int fd, const char *req, int32_t status, const char *body, uint32_t len)
{
    int keep = 0;
    if (asks_keep(req)) {
        pthread_mutex_lock(&d->mu);
        keep = keep_locked(d, 1);
        pthread_mutex_unlock(&d->mu);
    }
    int sent = send_answer(fd, status | (keep ? MONARCH_ANSWER_KEPT : 0), body, len) == 0;
    finish_open(d, fd, keep, sent);
    return sent ? 0 : -1;
}

/* -- answers given later: requests parked on a copy under way, misses queued for a copier -- */

/* A request kept to be answered later (its bytes copied: the caller's buffer goes), or NULL. */
static struct waiter *new_waiter(int fd, const char *req, uint32_t got, uint32_t hash, uint32_t len)
{
    struct waiter *q = malloc(sizeof *q + got);
    if (!q)
        return NULL;
    memset(q, 0, sizeof *q);
    q->listed_src = -1;
    q->fd = fd;
    q->hash = hash;
    q->len = len;
    q->got = got;
    memcpy(q->req, req, got);
    return q;
}

/* The requests parked on ``key`` (whose copy or fetch just ended), taken off the list. Under the lock. */
static struct waiter *unpark_locked(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    struct waiter *ready = NULL, **pp = &d->answers.parked;
    while (*pp) {
        struct waiter *q = *pp;
        if (q->hash == hash && q->len == len && !memcmp(q->req + MONARCH_REQUEST_HEADER_SIZE, key, len)) {
            *pp = q->next;
            q->next = ready;
            ready = q;
        } else {
            pp = &q->next;
        }
    }
    return ready;
}

/* Answer the requests parked on a key whose copy ended: with the copy (``slot``, ``path``), or
 * (slot < 0) handed over to Python, as an OPEN of a key of Python's is. */
static void answer_parked(struct door *d, struct waiter *ready, int slot, const char *path)
{
    for (struct waiter *q = ready, *next; q; q = next) {
        next = q->next;
        if (slot >= 0) {
            __atomic_add_fetch(&d->count.hits[slot], 1, __ATOMIC_RELAXED);  /* before: the client may ask for the report next */
            if (answer_open(d, q->fd, q->req, slot, path, (uint32_t)strlen(path)) != 0)
                __atomic_sub_fetch(&d->count.hits[slot], 1, __ATOMIC_RELAXED);
        } else {
            hand_over(d, q->fd, q->req, q->got, R_PYTHON_KEY);
        }
        free(q);
    }
}
