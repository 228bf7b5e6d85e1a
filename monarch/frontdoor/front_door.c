/* The node daemon's front door: the hot path of its socket, in C, on threads of its own
 * (one per core, up to 4, or as many as asked up to MAX_WORKERS: a cluster's daemon asks for
 * more, since a worker waits on the network while it fetches another node's file; each with
 * its own epoll on the listening socket).
 *
 * Every connection is accepted here, its peer checked (SO_PEERCRED) and its request read.
 * The door answers the two requests that dominate a cold epoch without the Python
 * interpreter: an OPEN of a file already staged (its path), and an OPEN of a small file
 * not staged yet from a fast source, which it copies from the PFS into the first tier
 * itself (the Python stager's publish: a temporary name in the copy's directory, the
 * source's mtime and owner-only mode, a rename) before answering. Everything else (other
 * verbs, odd or partial frames, another uid, a key the Python stager owns, a failed copy)
 * is handed over to the Python server as the connection with the bytes already read:
 * And while the snapshot walk runs, an INDEX poll (body INDEX_POLL) is answered here,
 * INDEX_WALKING, so a shim tells a daemon busy walking (its interpreter perhaps held for a
 * while by the walk's own work) from a lost one; once Python says the snapshot settled
 * (front_door_settle) polls are Python's, which knows whether it is ready or failed.
 * the door never refuses a request and never decides policy (only a flood beyond
 * HANDED_MAX connections waiting for Python, or one arriving with no descriptor left, is
 * closed unread).
 *
 * Python keeps the policy and the books. It tells the door which keys are staged where
 * (front_door_staged / front_door_forget), which keys it copies itself
 * (front_door_claim), how many tier bytes the door may fill (front_door_grant), and
 * whether it may copy at all (front_door_copying); it drains what the door copied
 * (front_door_events) into its own accounting. Whether the source is fast enough to copy
 * inline, and how many copies it keeps in flight, the door measures itself (inflight.c: as
 * many as hide the source's latency at the rate it gives): a miss from a fast source is
 * copied by the worker that read it, one from a slow source by the door's copiers, a pool of
 * threads that also run the read-ahead lane; a slow source is a reason for more copies in
 * flight, never for handing misses to Python. In a sharded cluster the door
 * copies only this node's own files (front_door_own_only: those ``owners`` gives to no other
 * node), and offers each copy to the C peer data path at once, so other nodes fetch it
 * without Python too. Two sets of books: the stager's (copies, lent room in the first tier)
 * and the peer cache's (fetches, lent room in the peer area), each with its own lease and
 * events (Q_BOOKS, Q_PEER). A key is in one state:
 * absent (never asked: the door may copy it), BUSY (the door copies it now), STAGED
 * (answerable), or PYTHON (anything else: handed over).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "../wire/monarch_wire.h" /* frames, index layout, limits: one definition (tests/unit/test_wire.py) */
#include "../native/monarch_native.h" /* EXPORT, the clock, CRC-32, the index look-up: shared */

#ifndef F_ADD_SEALS                    /* an older glibc's headers predate memfd (the kernel has it) */
#define F_ADD_SEALS 1033
#endif
#if !defined(SYS_statx) && defined(__x86_64__)   /* headers older than the kernel (statx: Linux 4.11) */
#define SYS_statx 332
#elif !defined(SYS_statx) && defined(__aarch64__)
#define SYS_statx 291
#endif

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x1U
#define MFD_ALLOW_SEALING 0x2U
#endif

#ifndef EPOLLEXCLUSIVE
#define EPOLLEXCLUSIVE (1u << 28)          /* Linux 4.5; older headers lack the name */
#endif

#define MAX_ROOTS 64
#define INLINE_COPY_NS 0.0005          /* copies this fast (their moving mean, s) are made by the worker that
                                          read the miss; slower, by a copier (stager.INLINE_SECONDS) */
#define PENDING_MAX 1024               /* connections waiting here for their request at once ... */
#define PENDING_NS 500000000LL         /* ... for this long; then Python (and its deadline) has them */
#define HANDED_MAX 4096                /* connections waiting for Python to take them (server.py's
                                          MAX_CONNECTIONS); beyond, closed at once: the shim reads the PFS */
#define CORE_WORKERS 4                 /* threads, one per core up to this: the copies are kernel time */
#define MAX_WORKERS 16                 /* threads when asked for (front_door_start's ``workers``) */
#define EVENT_BATCH 256                /* copies reported per wake-up of Python, at most */
#define COPIERS_MAX 256                /* copier threads at most: copies in flight (inflight.c's ``high``) */
#define AHEAD_WAIT_NS 50000000LL       /* the lane, out of room lent, waits this long for more ... */
#define AHEAD_WAITS 100                /* ... this many times in a row before it ends (a full tier) */

enum { K_FREE = 0, K_PYTHON = 1, K_BUSY = 2, K_STAGED = 3 };
enum { EV_STAGED = 1, EV_FAILED = 2, EV_AHEAD = 4, EV_TRANSIENT = 5 };  /* 3 (a slow source) is no more */
/* whose books an event or a lease is: the stager's (copies from the PFS into the copy tier)
 * or the peer cache's (fetches from other nodes into the peer area) */
enum { Q_BOOKS = 0, Q_PEER = 1, NQUEUES = 2 };
/* EV_AHEAD: staged by the read-ahead lane; EV_TRANSIENT: another node's file answered as a memfd */
/* why the read-ahead lane ended before its list did (front_door_read_ahead_state) */
enum { A_WHOLE, A_NOT_COPYING, A_NO_ROOM, A_STOPPED };
enum { T_LISTEN = 1, T_STOP = 2 };
/* why a connection was handed over (front_door_counts) */
enum { R_OTHER, R_CLOSED_GATE, R_PYTHON_KEY, R_NOT_COPYING, R_NOT_SMALL_FILE, R_NO_ROOM, R_COPY_FAILED, R_REASONS };

struct entry {                         /* one key the door has heard of: 16 bytes (a million keys, two million slots) */
    uint32_t hash;
    uint32_t ref;                      /* 0: a free slot; its key: the index's entry ``ref`` (from 1) when
                                          borrowed (a million staged files cost no copy of their keys),
                                          else the door's own copy, own[ref - 1] */
    uint8_t state, slot, borrowed, unused;
    uint32_t answered;                 /* when the door last answered it: door_ms (front_door_evict), 0 never */
};
_Static_assert(sizeof(struct entry) == 16, "the key table's slot");

struct own_key {                       /* a key not in the index (asked before the index was open) */
    char *key;
    uint32_t len;
};

struct conn {                          /* a connection whose request has not all arrived */
    int fd;
    uint32_t got;
    int64_t since;
    struct conn *prev, *next;
    char buf[MONARCH_REQUEST_HEADER_SIZE + MONARCH_MAX_REQUEST];
};

struct handed {                        /* a connection for Python, with what was read */
    struct handed *next;
    int fd;
    uint32_t len;
    char data[];
};

#include "inflight.c"

struct waiter;
struct door;
/* datapath.c's dp_fetch: the bytes written into fd, or < 0 */
typedef int64_t (*peer_fetch_fn)(void *dp, int owner, const char *key, int len, uint64_t size, int fd, int timeout_ms);
/* datapath.c's dp_staged: the data path answers other nodes' requests for ``key`` from ``slot`` */
typedef void (*peer_offer_fn)(void *dp, const char *key, int len, int slot);

/* One set of books' events, oldest first, packed as front_door_events hands them over (no
 * allocation per event: a copy's publishing holds the door's lock, which the lane's threads
 * wait for). The door appends to ``buf`` under the lock; a reader takes the whole of it at
 * once (swapped with its emptied ``out``) and hands it over outside the lock. */
struct evqueue {
    char *buf;                         /* under d->mu */
    size_t len, cap;
    int n;                             /* events in buf */
    char *out;                         /* taken, not yet handed over: under d->take_mu */
    size_t out_len, out_off, out_cap;
};

struct worker {                        /* one thread of the door: its own epoll and buffers */
    struct door *d;
    pthread_t thread;
    int ep;
    struct conn *pending;
    int npending;
    uint64_t tmp_seq;
    char *copy_buf;
    int spare_fd;                      /* /dev/null held back: given up to refuse a connection when
                                          the process is out of descriptors, or -1 */
    /* the directories of the last copy (copy_in): the next file is most often a neighbour */
    int src_dir, key_dir;              /* its source directory, its directory in the copy tier, or -1 */
    int key_dir_slot;                  /* the copy tier ``key_dir`` is in */
    int src_fresh;                     /* an open in ``src_dir`` leaves the file's attributes fresh */
    uint32_t src_dir_len, key_dir_len; /* the key's directory part they were opened for */
    char src_dir_key[PATH_MAX], key_dir_key[PATH_MAX];
    int peer_dir;                      /* the last fetch's directory in the peer area (fetch_from_peer), or -1 */
    uint32_t peer_dir_len;
    char peer_dir_key[PATH_MAX];
};

struct door {
    int listen_fd, stop_fd, wake_fd;
    uid_t uid;
    struct worker workers[MAX_WORKERS];
    int nworkers;
    pthread_mutex_t mu;                /* everything below */
    pthread_cond_t cv;                 /* a BUSY key is done */
    struct entry *tab;
    size_t cap, used;
    struct own_key *own;               /* the keys the table does not borrow from the index */
    size_t nown, cap_own;
    int64_t started_ns;                /* door_ms counts from here */
    char *roots[MAX_ROOTS];
    int nroots;
    char *tiers[MONARCH_MAX_SLOTS];            /* slot -> tier directory (NULL: none) */
    int copy_slot;
    const unsigned char *idx;
    size_t idx_len;
    int idx_borrowed;                  /* the daemon's own copy (front_door_open_memory): not unmapped here */
    int settled;                       /* the snapshot is ready or failed: INDEX polls are Python's */
    int gate_open, allowed, never_copy;  /* copying: Python allows it, no write by the job seen */
    int stopped;
    int64_t lease[NQUEUES], low_water[NQUEUES];  /* room lent, by books (Q_*); wake Python below this */
    struct handed *hq, **hq_tail;
    struct evqueue evq[NQUEUES];
    pthread_mutex_t take_mu;           /* front_door_events' (before d->mu, never after) */
    int woken;
    uint64_t hits[MONARCH_MAX_SLOTS], copies, handed, failures, bytes_read, why[R_REASONS], closed_too_many;
    /* the peer lane (a sharded cluster): a miss of another node's file fetched through the C
     * peer data path (monarch/cluster/datapath.c) into the peer area, within the same lease */
    peer_fetch_fn peer_fetch;
    peer_offer_fn peer_offer;          /* the door's own copies offered to other nodes (own_only) */
    void *peer_dp;
    int own_only;                      /* a sharded node: copy only the files ``owners`` gives to no other */
    const int16_t *owners;             /* by index entry - 1: the owning node, -1 none (Python's array) */
    uint32_t nowners;
    int self_node, peer_slot, peer_timeout_ms, peer_allowed;
    int64_t peer_unit;                 /* the area's allocation unit: a fetch pays its size rounded up to it */
    uint64_t peer_fetches, peer_failures, peer_transient;
    int nhanded;                       /* connections in hq */
    int busy;                          /* keys BUSY now */
    int copies_busy;                   /* of which copies from the PFS (front_door_copy_to waits for none) */
    /* the copiers: threads that copy the misses of a slow source (``demand``, first) and the
     * read-ahead lane's files, as many at once as ``flow`` allows (demand whatever it says) */
    struct inflight flow;              /* copies in flight toward the PFS: the lane keeps to its limit */
    struct worker *copiers;            /* COPIERS_MAX of them, started as the work wants them */
    int ncopiers, copiers_working, copiers_stop;
    pthread_cond_t work_cv;            /* a copier may have work: a miss queued, a slot free, room lent */
    struct waiter *demand, **demand_tail, *parked;
    int ndemand;
    /* the read-ahead lane (front_door_read_ahead): small files copied ahead of the reader */
    int ahead_asked, ahead_on, ahead_busy, ahead_end, ahead_waits, ahead_room_wait;
    uint32_t ahead_n, ahead_next;      /* the lane goes through index entries 1 to ahead_n; the next one, from 0 */
    uint64_t ahead_copies;
};

/* -- small things -------------------------------------------------------------------- */
static int write_full(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static uint32_t index_number(const struct door *d, const char *key, uint32_t len, uint32_t hash);
static const char *index_entry_key(const struct door *d, uint32_t n, uint32_t *len);

/* Milliseconds since the door started, from 1 (0: never), wrapping after 49 days: when a key
 * was answered, in 4 bytes of its slot. */
static uint32_t door_ms(const struct door *d)
{
    return (uint32_t)((monarch_now_ns() - d->started_ns) / 1000000) + 1;
}

/* -- the key table (open addressing; entries change state, never go) ------------------- */
static const char *entry_key(const struct door *d, const struct entry *e, uint32_t *len)
{
    if (e->borrowed)
        return index_entry_key(d, e->ref, len);  /* checked when it was inserted */
    *len = d->own[e->ref - 1].len;
    return d->own[e->ref - 1].key;
}

static struct entry *find(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    if (!d->cap)
        return NULL;
    for (size_t i = hash & (d->cap - 1);; i = (i + 1) & (d->cap - 1)) {
        struct entry *e = &d->tab[i];
        if (!e->ref)
            return NULL;
        uint32_t elen;
        const char *ekey;
        if (e->hash == hash && (ekey = entry_key(d, e, &elen)) && elen == len && !memcmp(ekey, key, len))
            return e;
    }
}

/* Room for ``keys`` keys at most half the slots full; 0, or -1 if it could not be made. */
static int reserve_keys(struct door *d, size_t keys)
{
    if (2 * keys > d->cap) {
        size_t cap = d->cap ? d->cap : 1024;
        while (2 * keys > cap)
            cap *= 2;
        struct entry *tab = calloc(cap, sizeof *tab);
        if (!tab)
            return -1;
        for (size_t j = 0; j < d->cap; j++) {
            if (!d->tab[j].ref)
                continue;
            size_t i = d->tab[j].hash & (cap - 1);
            while (tab[i].ref)
                i = (i + 1) & (cap - 1);
            tab[i] = d->tab[j];
        }
        free(d->tab);
        d->tab = tab;
        d->cap = cap;
    }
    return 0;
}

static struct entry *insert(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    if (reserve_keys(d, d->used + 1) != 0)
        return NULL;
    size_t i = hash & (d->cap - 1);
    while (d->tab[i].ref)
        i = (i + 1) & (d->cap - 1);
    /* a key of the index is its entry's number (the index is mapped until front_door_free) */
    uint32_t elen, n = d->idx ? index_number(d, key, len, hash) : 0;
    if (n && !index_entry_key(d, n, &elen))
        n = 0;
    if (!n) {
        if (d->nown == d->cap_own) {
            size_t cap = d->cap_own ? 2 * d->cap_own : 64;
            struct own_key *own = realloc(d->own, cap * sizeof *own);
            if (!own)
                return NULL;
            d->own = own;
            d->cap_own = cap;
        }
        char *copy = malloc(len ? len : 1);
        if (!copy)
            return NULL;
        memcpy(copy, key, len);
        d->own[d->nown++] = (struct own_key){copy, len};
    }
    d->tab[i] = (struct entry){.hash = hash, .ref = n ? n : (uint32_t)d->nown, .state = K_FREE, .borrowed = n != 0};
    d->used++;
    return &d->tab[i];
}

static struct entry *find_or_insert(struct door *d, const char *key, uint32_t len)
{
    uint32_t hash = monarch_crc32(key, len);
    struct entry *e = find(d, key, len, hash);
    return e ? e : insert(d, key, len, hash);
}

/* -- the snapshot's index (the file the shim maps: protocol.build_index) --------------- */
struct idx_file {                      /* what the door needs of an INDEX_ENTRY */
    uint64_t size;
    int64_t mtime;
    uint32_t mode, flags;
    uint32_t entry;                    /* its number, from 1 (files first, in the snapshot's order) */
};

/* A request answered later: an OPEN of a key another thread copies now (parked until that
 * copy ends), or a miss queued for a copier (``f``: its file). */
struct waiter {
    struct waiter *next;
    int fd;
    uint32_t hash, len, got;           /* the key's hash and length; the request's bytes in ``req`` */
    struct idx_file f;
    char req[];                        /* the request as read: the key after its header */
};

/* The index's header, and entry n (from 1) if it lies inside the mapping (index_valid
 * checked the tables' bounds when it was mapped). */
static struct monarch_index_header index_header(const unsigned char *x)
{
    struct monarch_index_header h;
    memcpy(&h, x, sizeof h);
    return h;
}



/* The entry number (from 1) of ``key`` in the index, or 0: the shim's look-up. */
static uint32_t index_number(const struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    struct monarch_index_header h = index_header(d->idx);
    return monarch_index_find(d->idx, &h, key, len, hash);
}

/* Entry n (from 1) of the index: the file's fields and its key (in the mapping), if it is a
 * well-formed entry. The mapping stays until front_door_free. */
static int index_entry(const struct door *d, uint32_t n, struct idx_file *out, const char **key, uint32_t *len)
{
    const unsigned char *x = d->idx;
    struct monarch_index_header h = index_header(x);
    if (!n || n > h.entries)
        return 0;
    struct monarch_index_entry e;
    memcpy(&e, x + h.entries_off + (uint64_t)sizeof e * (n - 1), sizeof e);
    if (e.key_off > h.keys_size || e.key_len > h.keys_size - e.key_off || !e.key_len)
        return 0;
    *key = (const char *)x + h.keys_off + e.key_off;
    *len = e.key_len;
    out->size = e.size;
    out->mtime = e.mtime_ns;
    out->mode = e.mode;
    out->flags = e.flags;
    out->entry = n;
    return 1;
}

static int index_file(const struct door *d, const char *key, uint32_t len, struct idx_file *out)
{
    const char *k;
    uint32_t l;
    uint32_t n = index_number(d, key, len, monarch_crc32(key, len));
    return n && index_entry(d, n, out, &k, &l);
}

/* Entry n's (from 1) key in the index, or NULL if it is no well-formed entry. */
static const char *index_entry_key(const struct door *d, uint32_t n, uint32_t *len)
{
    struct idx_file f;
    const char *k;
    return index_entry(d, n, &f, &k, len) ? k : NULL;
}

static int index_valid(const unsigned char *x, size_t n)
{
    if (n < sizeof(struct monarch_index_header))
        return 0;
    struct monarch_index_header h = index_header(x);
    if (h.magic != MONARCH_INDEX_MAGIC || h.version != MONARCH_INDEX_VERSION || !h.buckets ||
        (h.buckets & (h.buckets - 1)))
        return 0;
    return h.buckets_off <= n && 4ull * h.buckets <= n - h.buckets_off && h.entries_off <= n &&
           (uint64_t)sizeof(struct monarch_index_entry) * h.entries <= n - h.entries_off && h.keys_off <= n &&
           h.keys_size <= n - h.keys_off;
}

/* -- handing over to Python ------------------------------------------------------------ */
static void wake_python_locked(struct door *d)
{
    if (d->woken)
        return;
    d->woken = 1;
    uint64_t one = 1;
    if (write(d->wake_fd, &one, sizeof one) < 0) {
        /* the counter cannot overflow at one write per drain; nothing to do */
    }
}

static void hand_over(struct door *d, int fd, const char *data, uint32_t len, int why)
{
    pthread_mutex_lock(&d->mu);
    int full = d->nhanded >= HANDED_MAX;   /* Python is not taking them: a flood, or it is stuck */
    if (full)
        d->closed_too_many++;
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
    *d->hq_tail = h;
    d->hq_tail = &h->next;
    d->nhanded++;
    d->handed++;
    d->why[why]++;
    wake_python_locked(d);
    pthread_mutex_unlock(&d->mu);
}

#define EVENT_HEAD 40                  /* front_door_events' header: <IIQQqII */
static void post_event_locked(struct door *d, int q, uint32_t kind, uint32_t slot, const char *key, uint32_t len,
                              uint32_t entry, uint64_t size, uint64_t bytes_read, int64_t ns)
{
    struct evqueue *queue = &d->evq[q];
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
    memcpy(p, &kind, 4);
    memcpy(p + 4, &slot, 4);
    memcpy(p + 8, &size, 8);
    memcpy(p + 16, &bytes_read, 8);
    memcpy(p + 24, &ns, 8);
    memcpy(p + 32, &len, 4);
    memcpy(p + 36, &entry, 4);
    memcpy(p + EVENT_HEAD, key, len);
    queue->len = need;
    /* the books can wait (Python drains them on its own tick, and before any report) for a
     * batch, or for the room lent to run low: one wake-up per batch, not per copy */
    if (++queue->n >= EVENT_BATCH || (kind != EV_STAGED && kind != EV_AHEAD && kind != EV_TRANSIENT) ||
        d->lease[q] < d->low_water[q])
        wake_python_locked(d);
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

/* -- answers given later: requests parked on a copy under way, misses queued for a copier -- */

/* A request kept to be answered later (its bytes copied: the caller's buffer goes), or NULL. */
static struct waiter *new_waiter(int fd, const char *req, uint32_t got, uint32_t hash, uint32_t len)
{
    struct waiter *q = malloc(sizeof *q + got);
    if (!q)
        return NULL;
    memset(q, 0, sizeof *q);
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
    struct waiter *ready = NULL, **pp = &d->parked;
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
            __atomic_add_fetch(&d->hits[slot], 1, __ATOMIC_RELAXED);  /* before: the client may ask for the report next */
            if (send_answer(q->fd, slot, path, (uint32_t)strlen(path)) != 0)
                __atomic_sub_fetch(&d->hits[slot], 1, __ATOMIC_RELAXED);
            close(q->fd);
        } else {
            hand_over(d, q->fd, q->req, q->got, R_PYTHON_KEY);
        }
        free(q);
    }
}

/* The directory of ``key`` ("0/d/x.bin": "<tier>/0/d") opened from the tier, one component at a
 * time with O_NOFOLLOW, each made 0700 if missing (os.makedirs under a tier): a symlink planted
 * inside the tier cannot send a copy elsewhere. Its descriptor (the copy's name is after the
 * last '/' of ``key``), or -1. */
static int open_key_dir(const char *tier, const char *key, uint32_t len)
{
    const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    char part[NAME_MAX + 1];
    int dfd = open(tier, flags);
    const char *p = key, *end = key + len, *slash;
    while (dfd >= 0 && (slash = memchr(p, '/', (size_t)(end - p))) != NULL) {
        size_t n = (size_t)(slash - p);
        int next = -1;
        if (n > 0 && n <= NAME_MAX) {  /* valid_key: no "." or ".." parts */
            memcpy(part, p, n);
            part[n] = 0;
            next = openat(dfd, part, flags);
            if (next < 0 && errno == ENOENT && (mkdirat(dfd, part, 0700) == 0 || errno == EEXIST))
                next = openat(dfd, part, flags);
        }
        close(dfd);
        dfd = next;
        p = slash + 1;
    }
    return dfd;
}

/* Copy ``key`` (``f``: the snapshot's view of it) into the copy tier under a temporary
 * name; 0 and that name in ``tmp`` if the copy is whole and the source still the file the
 * snapshot saw; -2 if the source is not, -3 if the tier would not take it, -1 otherwise.
 * ``*bytes_read`` counts what was read from the PFS, whatever the outcome. */
/* The worker's descriptor of the directory of ``key`` (its first ``dlen`` bytes name it) as
 * ``open_dir`` opens it, kept for the next key of the same directory (the read-ahead's order
 * and an epoch's neighbours): no path walk and no open per file. Owned by the worker. */
static int cached_dir(int *fd, char *for_key, uint32_t *for_len, const char *key, uint32_t dlen,
                      int (*open_dir)(struct worker *, const char *, uint32_t), struct worker *w)
{
    if (*fd >= 0 && *for_len == dlen && !memcmp(for_key, key, dlen))
        return *fd;
    if (*fd >= 0)
        close(*fd);
    *fd = dlen < PATH_MAX ? open_dir(w, key, dlen) : -1;
    if (*fd >= 0) {
        memcpy(for_key, key, dlen);
        *for_len = dlen;
    }
    return *fd;
}

/* Does an open on ``fd``'s filesystem leave the file's attributes fresh in the client's cache
 * (NFS, FUSE, GPFS: pfsmeta.FRESH_AFTER_OPEN)? Asked once per source directory. */
static int fresh_after_open(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return 0;
    unsigned long type = (unsigned long)sf.f_type & 0xFFFFFFFFUL;
    return type == 0x6969UL || type == 0x65735546UL || type == 0x47504653UL;
}

struct statx_ts { int64_t sec; uint32_t nsec; int32_t reserved; };
struct statx_buf {                     /* the kernel's struct statx (the fields read here) */
    uint32_t mask, blksize;
    uint64_t attributes;
    uint32_t nlink, uid, gid;
    uint16_t mode, spare0;
    uint64_t ino, size, blocks, attributes_mask;
    struct statx_ts atime, btime, ctime, mtime;
    uint64_t spare[16];
};
_Static_assert(offsetof(struct statx_buf, mode) == 28 && offsetof(struct statx_buf, mtime) == 112, "struct statx");
#define STATX_WANTED 0x343u            /* TYPE | MODE | MTIME | INO | SIZE */
#define STATX_DONT_SYNC 0x4000         /* AT_STATX_DONT_SYNC */

/* The just-opened source's attributes. Where its open refreshed them (``fresh``), as that
 * open left them in the client's cache (statx, AT_STATX_DONT_SYNC): no second round trip to
 * the PFS's metadata server per copy, as the stager (pfsmeta.opened_stat); else fstat. */
static int source_attrs(int fd, int fresh, struct stat *st)
{
#ifdef SYS_statx
    struct statx_buf sx;
    if (fresh && syscall(SYS_statx, fd, "", AT_EMPTY_PATH | STATX_DONT_SYNC, STATX_WANTED, &sx) == 0 &&
        (sx.mask & STATX_WANTED) == STATX_WANTED) {
        memset(st, 0, sizeof *st);
        st->st_mode = sx.mode;
        st->st_size = (off_t)sx.size;
        st->st_mtim.tv_sec = sx.mtime.sec;
        st->st_mtim.tv_nsec = sx.mtime.nsec;
        return 0;
    }
#endif
    return fstat(fd, st);
}

static int open_source_dir(struct worker *w, const char *key, uint32_t dlen)  /* dlen: "<k>/<dir>" */
{
    char path[PATH_MAX];
    const char *slash = memchr(key, '/', dlen);
    long root = strtol(key, NULL, 10);
    if (root < 0 || root >= w->d->nroots)
        return -1;
    int rl = slash ? (int)(dlen - (uint32_t)(slash + 1 - key)) : 0;
    if (snprintf(path, sizeof path, "%s/%.*s", w->d->roots[root], rl, slash ? slash + 1 : "") >= (int)sizeof path)
        return -1;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    w->src_fresh = fd >= 0 && fresh_after_open(fd);
    return fd;
}

static int open_copy_dir(struct worker *w, const char *key, uint32_t dlen)
{
    return open_key_dir(w->d->tiers[w->d->copy_slot], key, dlen + 1);  /* up to its last '/' */
}

static int open_peer_dir(struct worker *w, const char *key, uint32_t dlen)
{
    return open_key_dir(w->d->tiers[w->d->peer_slot], key, dlen + 1);  /* up to its last '/' */
}

static void close_cached_dirs(struct worker *w)
{
    if (w->src_dir >= 0)
        close(w->src_dir);
    if (w->key_dir >= 0)
        close(w->key_dir);
    if (w->peer_dir >= 0)
        close(w->peer_dir);
    w->src_dir = w->key_dir = w->peer_dir = -1;
}

static int copy_in(struct worker *w, const char *key, uint32_t len, const struct idx_file *f,
                   char *dest, char *tmp, int *dir_fd, uint64_t *bytes_read)
{
    struct door *d = w->d;
    const char *base = memrchr(key, '/', len);     /* valid_key: "<k>/...", so there is one */
    if (!base)
        return -1;
    uint32_t dlen = (uint32_t)(base - key), nlen = len - dlen - 1;
    char name[NAME_MAX + 1];           /* the key is not NUL-terminated */
    if (!nlen || nlen > NAME_MAX)
        return -1;
    memcpy(name, base + 1, nlen);
    name[nlen] = 0;
    int sdir = cached_dir(&w->src_dir, w->src_dir_key, &w->src_dir_len, key, dlen, open_source_dir, w);
    if (sdir < 0)
        return -1;
    const char *tier = d->tiers[d->copy_slot];
    if (snprintf(dest, PATH_MAX, "%s/%.*s", tier, (int)len, key) >= PATH_MAX)
        return -1;
    /* room first, then the source: the copy's temporary file (``tmp``, a name in the key's
     * directory ``*dir_fd``) is made and given its blocks before a byte of the PFS is read, so
     * that a tier whose filesystem is full (whatever its capacity says) costs the PFS nothing */
    snprintf(tmp, PATH_MAX, "%s%016llx", MONARCH_TMP_PREFIX, (unsigned long long)(w->tmp_seq++ * 0x9E3779B97F4A7C15ULL));
    mode_t mode = (f->mode & 0700) | 0600;          /* secure.owner_only */
    if (w->key_dir >= 0 && w->key_dir_slot != d->copy_slot) {
        close(w->key_dir);             /* the door copies into another tier now (front_door_copy_to) */
        w->key_dir = -1;
    }
    w->key_dir_slot = d->copy_slot;    /* steady while this copy runs: a change waits for it */
    int dfd = cached_dir(&w->key_dir, w->key_dir_key, &w->key_dir_len, key, dlen, open_copy_dir, w);
    int out = dfd < 0 ? -1 : openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (out < 0)
        return -3;
    if (f->size && fallocate(out, 0, 0, (off_t)f->size) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
        close(out);
        unlinkat(dfd, tmp, 0);
        return -3;                     /* no room on the tier's filesystem: nothing read */
    }
    /* O_NONBLOCK: a FIFO swapped in for the file (by anyone who may write its directory)
     * opens at once instead of blocking this thread, and the daemon's exit, for ever */
    int in = openat(sdir, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    int r = 0;
    struct stat st;
    int fl;
    if (in < 0)
        r = -1;
    else if (source_attrs(in, w->src_fresh, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != f->size ||
             (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec != f->mtime)
        r = -2;                        /* changed since the snapshot: Python finds it and says so */
    else if ((fl = fcntl(in, F_GETFL)) < 0 || fcntl(in, F_SETFL, fl & ~O_NONBLOCK) < 0)
        r = -1;                        /* a regular file: read as any reader would */
    uint64_t n = 0, cap = f->size + 1;  /* one byte more: a file that grew is seen */
    for (; r == 0;) {
        ssize_t got = read(in, w->copy_buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        n += (uint64_t)got;
        *bytes_read += (uint64_t)got;
        if (n == f->size || n == cap)
            break;                     /* a short read at the expected size is the end */
    }
    if (in >= 0)
        close(in);
    if (r == 0 && n != f->size)
        r = -2;
    if (r != 0) {
        close(out);
        unlinkat(dfd, tmp, 0);
        return r;
    }
    struct timespec times[2] = {{f->mtime / 1000000000LL, f->mtime % 1000000000LL},
                                {f->mtime / 1000000000LL, f->mtime % 1000000000LL}};
    int ok = write_full(out, w->copy_buf, n) == 0 && futimens(out, times) == 0;
    if (close(out) < 0)
        ok = 0;
    if (!ok) {
        unlinkat(dfd, tmp, 0);
        return -3;
    }
    *dir_fd = dfd;                     /* the worker's (cached_dir): not closed by the caller */
    return 0;
}

/* The owner of the file ``f`` if the peer lane fetches it (another node's, small), else -1.
 * Under the lock. */
static int64_t peer_room(const struct door *d, uint64_t size)   /* sizes.allocated_size */
{
    return ((int64_t)size + d->peer_unit - 1) / d->peer_unit * d->peer_unit;
}

/* May the door copy index entry ``entry`` from the PFS? Alone on a node, any; on a sharded
 * node only its own (``owners``: -1), and none before the owners are known. Under the lock. */
static int own_file_locked(const struct door *d, uint32_t entry)
{
    return !d->own_only || (d->owners && entry > 0 && entry <= d->nowners && d->owners[entry - 1] < 0);
}

static int peer_owner_locked(const struct door *d, const struct idx_file *f)
{
    if (!d->peer_fetch || !d->peer_allowed || d->never_copy || !S_ISREG(f->mode) || f->size > MONARCH_INLINE_MAX ||
        f->entry == 0 || f->entry > d->nowners)
        return -1;
    int owner = d->owners[f->entry - 1];
    return owner >= 0 && owner != d->self_node ? owner : -1;
}

/* Fetch ``key`` (entry ``e``, BUSY, its size taken from the lease) from node ``owner`` into the
 * peer area, published as the stager's copies are, and answer: -1, or R_COPY_FAILED (handed
 * over: Python's protocol fetches it, or says why not). */
static int fetch_from_peer(struct worker *w, int fd, const char *key, uint32_t len, uint32_t hash,
                           const struct idx_file *f, int owner)
{
    struct door *d = w->d;
    char dest[PATH_MAX], tmp[64];
    const char *area = d->tiers[d->peer_slot];
    const char *base = memrchr(key, '/', len);     /* valid_key: "<k>/...", so there is one */
    int64_t t0 = monarch_now_ns();
    int ok = base && snprintf(dest, sizeof dest, "%s/%.*s", area, (int)len, key) < (int)sizeof dest;
    snprintf(tmp, sizeof tmp, "%s%016llx", MONARCH_TMP_PREFIX, (unsigned long long)(w->tmp_seq++ * 0x9E3779B97F4A7C15ULL));
    /* the worker's directory of the last fetch, kept (an epoch's files share few directories):
     * no walk of the area's components per fetch; opened afresh if it went meanwhile */
    uint32_t dlen = base ? (uint32_t)(base - key) : 0;
    int kdir = ok ? cached_dir(&w->peer_dir, w->peer_dir_key, &w->peer_dir_len, key, dlen, open_peer_dir, w) : -1;
    const int create = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    int out = kdir < 0 ? -1 : openat(kdir, tmp, create, (f->mode & 0700) | 0600);
    if (out < 0 && kdir >= 0 && errno == ENOENT) {
        close(w->peer_dir);
        w->peer_dir = -1;
        kdir = cached_dir(&w->peer_dir, w->peer_dir_key, &w->peer_dir_len, key, dlen, open_peer_dir, w);
        out = kdir < 0 ? -1 : openat(kdir, tmp, create, (f->mode & 0700) | 0600);
    }
    struct timespec times[2] = {{f->mtime / 1000000000LL, f->mtime % 1000000000LL},
                                {f->mtime / 1000000000LL, f->mtime % 1000000000LL}};
    ok = out >= 0 && d->peer_fetch(d->peer_dp, owner, key, (int)len, f->size, out, d->peer_timeout_ms) == (int64_t)f->size
         && futimens(out, times) == 0;
    if (out >= 0 && close(out) < 0)
        ok = 0;
    const char *name = strrchr(dest, '/') + 1;
    /* renamed outside the door's lock, as copy_and_publish's copies are */
    ok = ok && !__atomic_load_n(&d->never_copy, __ATOMIC_ACQUIRE) && renameat(kdir, tmp, kdir, name) == 0;
    pthread_mutex_lock(&d->mu);
    struct entry *e = find(d, key, len, hash);   /* the table may have grown meanwhile */
    if (ok) {
        e->state = K_STAGED;
        e->slot = (uint8_t)d->peer_slot;
        e->answered = door_ms(d);
        d->peer_fetches++;
        post_event_locked(d, Q_PEER, EV_STAGED, (uint32_t)d->peer_slot, key, len, f->entry, f->size, 0, monarch_now_ns() - t0);
    } else {
        if (out >= 0)
            unlinkat(kdir, tmp, 0);
        ok = 0;
        e->state = K_PYTHON;           /* Python's protocol fetches it (staging it there first), or says why not */
        d->lease[Q_PEER] += peer_room(d, f->size);
        d->peer_failures++;
        post_event_locked(d, Q_PEER, EV_FAILED, (uint32_t)d->peer_slot, key, len, f->entry, f->size, 0, monarch_now_ns() - t0);
    }
    struct waiter *ready = d->parked ? unpark_locked(d, key, len, hash) : NULL;
    if (ready && ok)
        e->answered = door_ms(d);
    d->busy--;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (ready)
        answer_parked(d, ready, ok ? d->peer_slot : -1, dest);
    if (!ok)
        return R_COPY_FAILED;
    send_answer(fd, d->peer_slot, dest, (uint32_t)strlen(dest));  /* unsent: the shim reads the PFS */
    close(fd);
    return -1;
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

/* Another node's file with no room lent in the peer area (it is full of copies answered
 * within GRACE, or Python has not lent again yet): fetched into a sealed memfd passed with
 * the answer, the peer cache's transient copy, gone when the application closes it. Under
 * a global shuffle a copy kept in the area is read again on this node with the same odds
 * whichever it is, so nothing is evicted for it. The caller counted it BUSY (``fetch`` and
 * ``dp`` read under the lock: the lane may be turned off meanwhile). -1, or R_COPY_FAILED. */
static int fetch_transient(struct worker *w, int fd, const char *key, uint32_t len, const struct idx_file *f,
                           int owner, peer_fetch_fn fetch, void *dp, int timeout_ms)
{
    struct door *d = w->d;
    int64_t t0 = monarch_now_ns();
    int m = (int)syscall(SYS_memfd_create, "monarch-peer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    int ok = m >= 0 && fetch(dp, owner, key, (int)len, f->size, m, timeout_ms) == (int64_t)f->size &&
             fcntl(m, F_ADD_SEALS, MONARCH_MEMFD_SEALS) == 0 && lseek(m, 0, SEEK_SET) == 0;
    pthread_mutex_lock(&d->mu);
    if (ok) {
        d->peer_transient++;
        post_event_locked(d, Q_PEER, EV_TRANSIENT, (uint32_t)d->peer_slot, key, len, f->entry, f->size, 0, monarch_now_ns() - t0);
    } else {
        d->peer_failures++;            /* handed over: Python's protocol fetches it, or says why not */
        post_event_locked(d, Q_PEER, EV_FAILED, (uint32_t)d->peer_slot, key, len, f->entry, f->size, 0, monarch_now_ns() - t0);
    }
    d->busy--;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (ok && send_answer_fd(fd, d->peer_slot | MONARCH_ANSWER_FD, m) == 0)
        __atomic_add_fetch(&d->hits[d->peer_slot], 1, __ATOMIC_RELAXED);
    if (m >= 0)
        close(m);                      /* the application's descriptor is the one passed */
    if (!ok)
        return R_COPY_FAILED;
    close(fd);
    return -1;
}

static void *copier_main(void *arg);

/* Start copiers while the work waiting (queued misses, the lane's free slots under its limit)
 * outnumbers the idle ones, and wake that many. Under the lock. */
static void staff_locked(struct door *d)
{
    int lane = d->ahead_on ? d->flow.limit - d->copies_busy : 0;
    int want = d->ndemand + (lane > 0 ? lane : 0);
    while (d->ncopiers - d->copiers_working < want && d->ncopiers < COPIERS_MAX && !d->copiers_stop) {
        struct worker *w = &d->copiers[d->ncopiers];
        w->d = d;
        w->spare_fd = w->ep = w->src_dir = w->key_dir = w->peer_dir = -1;
        w->tmp_seq = (uint64_t)monarch_now_ns() ^ (uint64_t)getpid() << 32 ^ (uint64_t)(MAX_WORKERS + d->ncopiers) << 48;
        w->copy_buf = w->copy_buf ? w->copy_buf : malloc(MONARCH_INLINE_MAX + 1);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);  /* the interpreter's threads take the signals */
        int ok = w->copy_buf && pthread_create(&w->thread, NULL, copier_main, w) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (!ok)
            break;                     /* the copiers there are do the work, in turn */
        d->ncopiers++;
    }
    for (int i = 0; i < want; i++)
        pthread_cond_signal(&d->work_cv);
}

/* Copy ``key`` (BUSY, its size taken from the lease, by the caller) from the PFS into the
 * copy tier and publish it (STAGED, event ``kind``), or give it to Python (PYTHON, EV_FAILED);
 * the copy's time goes to the door's measure of the source (``flow``). The requests parked on
 * it are answered. The slot of the tier it was published in (``dest``: the copy's path), or -1. */
static int copy_and_publish(struct worker *w, const char *key, uint32_t len, uint32_t hash, const struct idx_file *f,
                            uint32_t kind, char *dest)
{
    struct door *d = w->d;
    char tmp[PATH_MAX];
    struct entry *e;
    uint64_t bytes_read = 0;
    int kdir = -1;                     /* the key's directory in the tier (copy_in) */
    int raised = 0;                    /* the measure allows more copies in flight now */
    peer_offer_fn offer = NULL;
    void *offer_dp = NULL;
    int64_t t0 = monarch_now_ns();
    int r = copy_in(w, key, len, f, dest, tmp, &kdir, &bytes_read);
    const char *name = strrchr(dest, '/') + 1;
    int64_t t1 = monarch_now_ns();
    /* the rename outside the door's lock: it waits for the directory's, which the lane's other
     * copies into that directory hold in turn (under the door's lock, the lane was one copy at
     * a time: 25k files/s on a core). A front_door_disable (a write by the job) either came
     * before, and nothing is renamed, or waits for this copy (busy) and finds it in Python's
     * books, published below before busy drops. */
    if (r == 0 && __atomic_load_n(&d->never_copy, __ATOMIC_ACQUIRE)) {
        unlinkat(kdir, tmp, 0);
        r = -4;
    } else if (r == 0 && renameat(kdir, tmp, kdir, name) < 0) {
        unlinkat(kdir, tmp, 0);
        r = -3;
    }

    pthread_mutex_lock(&d->mu);
    e = find(d, key, len, hash);       /* the table may have grown meanwhile: ``e`` moved */
    int published = -1;
    if (r == 0) {
        e->state = K_STAGED;
        e->slot = (uint8_t)d->copy_slot;
        if (kind == EV_AHEAD)
            d->ahead_copies++;
        else
            d->copies++;
        d->bytes_read += bytes_read;
        post_event_locked(d, Q_BOOKS, kind, (uint32_t)d->copy_slot, key, len, f->entry, f->size, bytes_read, t1 - t0);
        published = d->copy_slot;
        if (d->own_only && d->peer_offer) {
            offer = d->peer_offer;     /* read under the lock: the lane may be turned off meanwhile */
            offer_dp = d->peer_dp;
        }
        int before = d->flow.limit;
        inflight_completed(&d->flow, (t1 - t0) / 1e9, t1 / 1e9);
        raised = d->flow.limit > before;
    } else {
        e->state = K_PYTHON;           /* Python copies it, or finds why not, and says so */
        if (r == -3)
            d->allowed = 0;            /* the tier failed (full?): Python finds out, and allows again or not */
        d->lease[Q_BOOKS] += (int64_t)f->size;
        d->failures++;
        d->bytes_read += bytes_read;
        post_event_locked(d, Q_BOOKS, EV_FAILED, 0, key, len, f->entry, f->size, bytes_read, t1 - t0);
    }
    struct waiter *ready = d->parked ? unpark_locked(d, key, len, hash) : NULL;
    if (ready && published >= 0)
        e->answered = door_ms(d);
    if (kind == EV_AHEAD && --d->ahead_busy == 0 && !d->ahead_on)
        wake_python_locked(d);         /* its books see the lane's last copies, and that it ended */
    d->busy--;
    d->copies_busy--;
    pthread_cond_broadcast(&d->cv);
    if (raised)
        staff_locked(d);               /* more copiers for the lane, if it runs */
    else if (!(w >= d->copiers && w < d->copiers + COPIERS_MAX))
        pthread_cond_signal(&d->work_cv);  /* a worker's copy freed a slot (a copier's goes on itself) */
    pthread_mutex_unlock(&d->mu);
    if (ready)
        answer_parked(d, ready, published, dest);
    if (offer)                         /* other nodes fetch it through the data path from now on */
        offer(offer_dp, key, (int)len, published);
    return published;
}

/* An OPEN of a valid key (``req``: the request's ``got`` bytes): answered here or later (-1),
 * or why it is to be handed over (R_*). */
static int try_open(struct worker *w, int fd, const char *req, uint32_t got, const char *key, uint32_t len)
{
    struct door *d = w->d;
    char dest[PATH_MAX];
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
            q->next = d->parked;
            d->parked = q;
        }
        pthread_mutex_unlock(&d->mu);
        return q ? -1 : R_OTHER;
    }
    if (e && e->state == K_STAGED) {
        int slot = e->slot;
        const char *tier = d->tiers[slot];
        e->answered = door_ms(d);
        pthread_mutex_unlock(&d->mu);
        int pl = snprintf(dest, sizeof dest, "%s/%.*s", tier, (int)len, key);
        if (pl >= (int)sizeof dest)
            return R_OTHER;
        __atomic_add_fetch(&d->hits[slot], 1, __ATOMIC_RELAXED);  /* before: the client may ask for the report next */
        if (send_answer(fd, slot, dest, (uint32_t)pl) != 0)
            __atomic_sub_fetch(&d->hits[slot], 1, __ATOMIC_RELAXED);
        close(fd);
        return -1;
    }
    struct idx_file f;
    int owner;
    if (!e && d->peer_fetch && index_file(d, key, len, &f) && (owner = peer_owner_locked(d, &f)) >= 0) {
        if (peer_room(d, f.size) <= d->lease[Q_PEER] && (e = insert(d, key, len, hash))) {
            e->state = K_BUSY;
            d->busy++;
            d->lease[Q_PEER] -= peer_room(d, f.size);  /* its blocks, not its bytes: never removed for want of room */
            pthread_mutex_unlock(&d->mu);
            return fetch_from_peer(w, fd, key, len, hash, &f, owner);
        }
        peer_fetch_fn fetch = d->peer_fetch;
        void *dp = d->peer_dp;
        int timeout_ms = d->peer_timeout_ms;
        d->busy++;
        pthread_mutex_unlock(&d->mu);
        return fetch_transient(w, fd, key, len, &f, owner, fetch, dp, timeout_ms);
    }
    int why = e ? R_PYTHON_KEY : !d->allowed || d->never_copy ? R_NOT_COPYING
            : !index_file(d, key, len, &f) || !S_ISREG(f.mode) || f.size > MONARCH_INLINE_MAX ? R_NOT_SMALL_FILE
            : !own_file_locked(d, f.entry) ? R_NOT_COPYING
            : (int64_t)f.size > d->lease[Q_BOOKS] ? R_NO_ROOM : !(e = insert(d, key, len, hash)) ? R_OTHER : -1;
    if (why >= 0) {
        pthread_mutex_unlock(&d->mu);
        return why;
    }
    e->state = K_BUSY;
    d->busy++;
    d->copies_busy++;
    d->lease[Q_BOOKS] -= (int64_t)f.size;
    /* demand first, whatever the lane does: a fast source's miss is copied here, at once (no
     * hand-off costs more than the copy); a slow one's by a copier, so that this thread goes
     * on accepting while the source answers, and as many misses are in flight as readers wait */
    struct waiter *q = d->flow.recent < 0 || d->flow.recent > INLINE_COPY_NS ? new_waiter(fd, req, got, hash, len) : NULL;
    if (q) {
        q->f = f;
        *d->demand_tail = q;
        d->demand_tail = &q->next;
        d->ndemand++;
        staff_locked(d);
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    pthread_mutex_unlock(&d->mu);

    int published = copy_and_publish(w, key, len, hash, &f, EV_STAGED, dest);
    if (published < 0)
        return R_COPY_FAILED;
    send_answer(fd, published, dest, (uint32_t)strlen(dest));  /* unsent: the shim reads the PFS */
    close(fd);
    return -1;
}

/* -- the copiers: queued misses first, then the read-ahead lane ------------------------------ */

/* A queued miss (BUSY, its room taken) copied and answered, or handed over to Python. */
static void copy_queued_miss(struct worker *w, struct waiter *q)
{
    char dest[PATH_MAX];
    int published = copy_and_publish(w, q->req + MONARCH_REQUEST_HEADER_SIZE, q->len, q->hash, &q->f, EV_STAGED, dest);
    if (published < 0) {
        hand_over(w->d, q->fd, q->req, q->got, R_COPY_FAILED);
    } else {
        send_answer(q->fd, published, dest, (uint32_t)strlen(dest));  /* unsent: the shim reads the PFS */
        close(q->fd);
    }
    free(q);
}

/* The lane is through, or stopped early (``why``: A_*). Under the lock. */
static void lane_end_locked(struct door *d, int why)
{
    d->ahead_on = 0;
    if (why != A_WHOLE && d->ahead_end == A_WHOLE)
        d->ahead_end = why;
    inflight_starved(&d->flow);        /* no more work for every slot: the window says nothing */
    if (!d->ahead_busy)
        wake_python_locked(d);         /* its books see the lane's last copies, and that it ended */
}

enum { L_NONE, L_TAKEN, L_ROOM };

/* The lane's next small file the door has never heard of, made BUSY for a copier (L_TAKEN);
 * L_NONE: nothing for the lane now (off, through, at its limit, or another copier waits for
 * room); L_ROOM: the caller waits for room to be lent. The lane ends when its list does, when
 * copying is not allowed (a write by the job, a failed tier: Python's stager takes the rest)
 * or when no room is lent for AHEAD_WAITS waits in a row. Under the lock. */
static int lane_next_locked(struct door *d, struct idx_file *f, const char **key, uint32_t *len, uint32_t *hash)
{
    while (d->ahead_on) {
        if (d->copies_busy >= d->flow.limit)
            return L_NONE;             /* in flight as many as the source's measure allows */
        if (d->ahead_next >= d->ahead_n) {
            lane_end_locked(d, A_WHOLE);
            break;
        }
        if (d->stopped) {
            lane_end_locked(d, A_STOPPED);
            break;
        }
        if (!d->gate_open || !d->allowed || d->never_copy) {
            lane_end_locked(d, A_NOT_COPYING);
            break;
        }
        if (!own_file_locked(d, d->ahead_next + 1)) {
            d->ahead_next++;           /* another node's: its owner stages it */
            continue;
        }
        if (!index_entry(d, d->ahead_next + 1, f, key, len) || !S_ISREG(f->mode) || f->size > MONARCH_INLINE_MAX) {
            d->ahead_next++;           /* not a small file: Python's stager copies it */
            continue;
        }
        *hash = monarch_crc32(*key, *len);
        if (find(d, *key, *len, *hash)) {
            d->ahead_next++;           /* staged, being copied, or Python's */
            continue;
        }
        if ((int64_t)f->size > d->lease[Q_BOOKS]) {
            if (d->ahead_room_wait)
                return L_NONE;         /* one copier times the wait; a grant wakes them all */
            if (++d->ahead_waits > AHEAD_WAITS) {
                lane_end_locked(d, A_NO_ROOM);
                break;
            }
            wake_python_locked(d);     /* its books lend more when it drains them */
            inflight_starved(&d->flow);
            d->ahead_room_wait = 1;
            return L_ROOM;
        }
        d->ahead_waits = 0;
        d->ahead_next++;
        struct entry *e = insert(d, *key, *len, *hash);
        if (!e)
            continue;
        e->state = K_BUSY;
        d->busy++;
        d->copies_busy++;
        d->ahead_busy++;
        d->lease[Q_BOOKS] -= (int64_t)f->size;
        return L_TAKEN;
    }
    return L_NONE;
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
    while (!d->copiers_stop) {
        struct waiter *q = d->demand;
        struct idx_file f;
        const char *key;
        uint32_t len, hash;
        int lane;
        if (q) {
            d->demand = q->next;
            if (!d->demand)
                d->demand_tail = &d->demand;
            d->ndemand--;
            d->copiers_working++;
            pthread_mutex_unlock(&d->mu);
            copy_queued_miss(w, q);
            pthread_mutex_lock(&d->mu);
            d->copiers_working--;
        } else if ((lane = lane_next_locked(d, &f, &key, &len, &hash)) == L_TAKEN) {
            d->copiers_working++;
            pthread_mutex_unlock(&d->mu);
            copy_and_publish(w, key, len, hash, &f, EV_AHEAD, dest);
            pthread_mutex_lock(&d->mu);
            d->copiers_working--;
        } else if (lane == L_ROOM) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += AHEAD_WAIT_NS;
            until.tv_sec += until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&d->work_cv, &d->mu, &until);
            d->ahead_room_wait = 0;
        } else {
            if (!d->ahead_on)
                inflight_starved(&d->flow);  /* a copier free and nothing to copy */
            pthread_cond_wait(&d->work_cv, &d->mu);
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Copy the small files of index entries 1 to ``n`` (the snapshot's files, in its order) ahead
 * of the reader, as many at once as the source's measure allows (inflight.c; ``fixed`` > 0:
 * that many, staging.threads; else from ``start``), within the room lent. Once per door: 0,
 * or -1 (errno) if a lane was asked for before or nothing could start. */
EXPORT int front_door_read_ahead(struct door *d, uint32_t n, int fixed, int start)
{
    pthread_mutex_lock(&d->mu);
    if (d->ahead_asked || d->stopped || !d->gate_open) {
        pthread_mutex_unlock(&d->mu);
        errno = EBUSY;
        return -1;
    }
    /* room in the table for every key of the list now, while it is small: doubled as the lane
     * fills it, its old slots would stand beside the new ones at the daemon's peak */
    if (reserve_keys(d, d->used + n) != 0) {
        pthread_mutex_unlock(&d->mu);
        errno = ENOMEM;
        return -1;
    }
    double recent = d->flow.recent;    /* what the misses measured so far stays */
    inflight_init(&d->flow, fixed, start, INFLIGHT_LOW, COPIERS_MAX);
    d->flow.recent = recent;
    d->ahead_asked = 1;
    d->ahead_n = n;
    d->ahead_next = 0;
    d->ahead_end = A_WHOLE;
    d->ahead_on = 1;
    staff_locked(d);
    int started = d->ncopiers > 0;
    if (!started)
        d->ahead_on = 0;
    pthread_mutex_unlock(&d->mu);
    if (!started)
        errno = EAGAIN;
    return started ? 0 : -1;
}

/* The lane: out[0] copies it has in flight (at least 1 while its list is not through), out[1]
 * entries gone through, out[2] files it copied, out[3] why it ended early (A_*; A_WHOLE: it
 * did not). */
EXPORT void front_door_read_ahead_state(struct door *d, uint64_t *out)
{
    pthread_mutex_lock(&d->mu);
    out[0] = (uint64_t)(d->ahead_on && !d->ahead_busy ? 1 : d->ahead_busy);
    out[1] = d->ahead_next;
    out[2] = d->ahead_copies;
    out[3] = (uint64_t)d->ahead_end;
    pthread_mutex_unlock(&d->mu);
}

/* The door's measure of its source (inflight_state's figures) and its copiers now. */
EXPORT void front_door_inflight(struct door *d, double *out)
{
    pthread_mutex_lock(&d->mu);
    inflight_state(&d->flow, out);
    out[6] = d->ncopiers;
    out[7] = d->copies_busy;
    pthread_mutex_unlock(&d->mu);
}

/* The copiers stopped and joined (the lane with them); their copies under way end first. */
static void stop_copiers(struct door *d)
{
    pthread_mutex_lock(&d->mu);
    d->copiers_stop = 1;
    if (d->ahead_on)
        lane_end_locked(d, A_STOPPED);
    pthread_cond_broadcast(&d->work_cv);
    int n = d->ncopiers;
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < n; i++) {
        struct worker *w = &d->copiers[i];
        pthread_join(w->thread, NULL);
        close_cached_dirs(w);
    }
    pthread_mutex_lock(&d->mu);
    d->ncopiers = 0;                   /* joined: a second stop joins none (copiers_stop starts none) */
    pthread_mutex_unlock(&d->mu);
}

/* After every thread is joined: the misses still queued and the requests still parked are
 * closed (their shims read the PFS), their keys Python's. */
static void close_waiting(struct door *d)
{
    pthread_mutex_lock(&d->mu);
    struct waiter *lists[2] = {d->demand, d->parked};
    for (struct waiter *q = d->demand; q; q = q->next) {
        struct entry *e = find(d, q->req + MONARCH_REQUEST_HEADER_SIZE, q->len, q->hash);
        if (e)
            e->state = K_PYTHON;
        d->busy--;
        d->copies_busy--;
        d->lease[Q_BOOKS] += (int64_t)q->f.size;
    }
    d->demand = d->parked = NULL;
    d->demand_tail = &d->demand;
    d->ndemand = 0;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < 2; i++) {
        for (struct waiter *q = lists[i], *next; q; q = next) {
            next = q->next;
            close(q->fd);
            free(q);
        }
    }
}

enum { F_MORE, F_OPEN, F_ODD, F_INDEX_POLL };

/* What ``got`` bytes of a request are: not all there yet, a whole OPEN, or anything else. */
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
    if ((unsigned char)buf[0] != MONARCH_VERB_OPEN || buf[1] || buf[2] || buf[3] || length == 0 ||
        length > MONARCH_MAX_REQUEST || got > MONARCH_REQUEST_HEADER_SIZE + length)
        return F_ODD;
    return got < MONARCH_REQUEST_HEADER_SIZE + length ? F_MORE : F_OPEN;
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
    int why = state == F_OPEN && valid_key(key, klen) ? try_open(w, fd, buf, got, key, klen) : R_OTHER;
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
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
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
        w->d->closed_too_many++;       /* before the close: its client may ask for the counts next */
        pthread_mutex_unlock(&w->d->mu);
        close(fd);
    }
    w->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd >= 0;
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
        c->fd = fd;
        c->got = 0;
        c->since = monarch_now_ns();
        ssize_t r = recv(fd, c->buf, sizeof c->buf, MSG_DONTWAIT);
        int state = r > 0 ? frame_state(c->buf, c->got = (uint32_t)r) : F_MORE;
        if (state != F_MORE) {
            serve(w, fd, c->buf, c->got, state);
            free(c);
            continue;
        } else if (r == 0) {
            close(fd);
            free(c);
            continue;
        }
        if (w->npending >= PENDING_MAX) {
            hand_over(d, fd, c->buf, c->got, R_OTHER);
            free(c);
            continue;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            hand_over(d, fd, c->buf, c->got, R_OTHER);
            free(c);
            continue;
        }
        c->prev = NULL;
        c->next = w->pending;
        if (w->pending)
            w->pending->prev = c;
        w->pending = c;
        w->npending++;
    }
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

static void *door_main(void *arg)
{
    struct worker *w = arg;
    struct epoll_event evs[64];
    prctl(PR_SET_NAME, "monarch-door");
    for (;;) {
        int n = epoll_wait(w->ep, evs, 64, w->npending ? 100 : -1);
        if (n < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == (void *)(uintptr_t)T_STOP)
                return NULL;
            if (p == (void *)(uintptr_t)T_LISTEN)
                on_accept(w);
            else
                on_readable(w, p);
        }
        if (w->npending)
            sweep_slow(w);
    }
    return NULL;
}

/* -- Python's side (ctypes; every call but start/stop may come from any thread) ---------- */
EXPORT void front_door_stop(struct door *d);
EXPORT void front_door_free(struct door *d);

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
    struct door *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->uid = getuid();
    d->started_ns = monarch_now_ns();
    d->hq_tail = &d->hq;
    d->copy_slot = copy_slot;
    d->listen_fd = d->stop_fd = d->wake_fd = -1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->take_mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->work_cv, NULL);
    d->demand_tail = &d->demand;
    inflight_init(&d->flow, 0, 0, INFLIGHT_LOW, COPIERS_MAX);
    d->copiers = calloc(COPIERS_MAX, sizeof *d->copiers);  /* zero pages until a copier starts */
    for (int i = 0; i < nroots; roots += strlen(roots) + 1, i++)
        d->roots[d->nroots++] = strdup(roots);
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
    int ok = d->copiers && d->tiers[copy_slot] && d->listen_fd >= 0 && d->stop_fd >= 0 && d->wake_fd >= 0 &&
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
        w->src_dir = w->key_dir = w->peer_dir = -1;
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
    struct handed *h = d->hq;
    if (!h) {
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    if ((int)h->len > cap) {
        *fd = (int)h->len;
        pthread_mutex_unlock(&d->mu);
        return -2;
    }
    d->hq = h->next;
    d->nhanded--;
    if (!d->hq)
        d->hq_tail = &d->hq;
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
    pthread_mutex_lock(&d->take_mu);
    struct evqueue *queue = &d->evq[q];
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
            if (!d->evq[other].len && d->evq[other].out_off == d->evq[other].out_len && !d->hq) {
                uint64_t v;            /* nothing waits either way: the next arrival wakes Python */
                if (read(d->wake_fd, &v, sizeof v) < 0) {
                    /* nothing was pending: fine */
                }
                d->woken = 0;
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
    pthread_mutex_unlock(&d->take_mu);
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
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
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
    d->idx = p;
    d->idx_len = (size_t)st.st_size;
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
        d->idx = p;
        d->idx_len = (size_t)n;
        d->idx_borrowed = 1;
        d->gate_open = 1;
    }
    pthread_mutex_unlock(&d->mu);
    return 0;
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
 * ``fetch`` NULL turns the lane off. The door's own copies are offered with ``offer(dp,
 * ...)`` (may be NULL). ``owners`` stays the caller's, and is not read once this returns
 * after another call. */
EXPORT int front_door_peers(struct door *d, void *fetch, void *offer, void *dp, const int16_t *owners,
                            uint32_t nowners, int self_node, int peer_slot, int timeout_ms, int64_t unit)
{
    if (fetch && (peer_slot < 0 || peer_slot >= MONARCH_MAX_SLOTS || !d->tiers[peer_slot] || unit <= 0))
        return -1;
    pthread_mutex_lock(&d->mu);
    d->peer_fetch = (peer_fetch_fn)fetch;
    d->peer_offer = fetch ? (peer_offer_fn)offer : NULL;
    d->peer_dp = dp;
    d->owners = fetch ? owners : NULL;
    d->nowners = fetch ? nowners : 0;
    d->self_node = self_node;
    d->peer_slot = peer_slot;
    d->peer_timeout_ms = timeout_ms;
    d->peer_unit = unit > 0 ? unit : 1;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* A sharded node's door (``on``): it copies only this node's own files, none before the peer
 * lane tells it who owns which (front_door_peers). */
EXPORT void front_door_own_only(struct door *d, int on)
{
    pthread_mutex_lock(&d->mu);
    d->own_only = on;
    pthread_mutex_unlock(&d->mu);
}

/* Whether the peer lane may fetch now (Python: the area is usable, the job wrote nothing). */
EXPORT void front_door_peer_copying(struct door *d, int on)
{
    pthread_mutex_lock(&d->mu);
    d->peer_allowed = on;
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
                  (int64_t)(uint32_t)(door_ms(d) - e->answered) * 1000000 < grace_ns);
    if (e && evict)
        e->state = K_PYTHON;
    pthread_mutex_unlock(&d->mu);
    return evict;
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
    int64_t left = d->lease[Q_BOOKS];
    d->copy_slot = slot;
    d->lease[Q_BOOKS] = bytes;
    d->low_water[Q_BOOKS] = bytes / 2;
    pthread_cond_broadcast(&d->cv);
    pthread_cond_broadcast(&d->work_cv);  /* the read-ahead lane may wait for room */
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
    d->lease[q] += bytes;
    d->low_water[q] = d->lease[q] / 2;
    pthread_cond_broadcast(&d->cv);
    pthread_cond_broadcast(&d->work_cv);  /* the read-ahead lane may wait for room */
    pthread_mutex_unlock(&d->mu);
}

/* What is left of the grants (now 0: Python releases it in the tier). */
EXPORT int64_t front_door_reclaim(struct door *d, int q)
{
    if (q < 0 || q >= NQUEUES)
        return 0;
    pthread_mutex_lock(&d->mu);
    int64_t left = d->lease[q];
    d->lease[q] = 0;
    pthread_mutex_unlock(&d->mu);
    return left;
}

EXPORT int64_t front_door_lease(struct door *d, int q)
{
    if (q < 0 || q >= NQUEUES)
        return 0;
    pthread_mutex_lock(&d->mu);
    int64_t left = d->lease[q];
    pthread_mutex_unlock(&d->mu);
    return left;
}

/* Counters: out[0..MONARCH_MAX_SLOTS) opens answered with a staged copy, by slot; then copies
 * made, connections handed over, copies failed, bytes read from the PFS; then the
 * connections handed over by reason (R_*); then those closed with HANDED_MAX waiting; then
 * the peer lane's fetches, its failures, and its transient answers (memfds). */
EXPORT void front_door_counts(struct door *d, uint64_t *out)
{
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < MONARCH_MAX_SLOTS; i++)
        out[i] = __atomic_load_n(&d->hits[i], __ATOMIC_RELAXED);
    out[MONARCH_MAX_SLOTS] = d->copies;
    out[MONARCH_MAX_SLOTS + 1] = d->handed;
    out[MONARCH_MAX_SLOTS + 2] = d->failures;
    out[MONARCH_MAX_SLOTS + 3] = d->bytes_read;
    for (int i = 0; i < R_REASONS; i++)
        out[MONARCH_MAX_SLOTS + 4 + i] = d->why[i];
    out[MONARCH_MAX_SLOTS + 4 + R_REASONS] = d->closed_too_many;
    out[MONARCH_MAX_SLOTS + 5 + R_REASONS] = d->peer_fetches;
    out[MONARCH_MAX_SLOTS + 6 + R_REASONS] = d->peer_failures;
    out[MONARCH_MAX_SLOTS + 7 + R_REASONS] = d->peer_transient;
    pthread_mutex_unlock(&d->mu);
}

/* Stop the thread; connections still here or not taken by Python are closed (their
 * shims read the PFS). Events stay for Python to drain; every call stays harmless until
 * front_door_free. */
EXPORT void front_door_stop(struct door *d)
{
    stop_copiers(d);
    uint64_t one = 1;
    if (d->stop_fd >= 0 && write(d->stop_fd, &one, sizeof one) < 0) {
        /* an eventfd write of 1 cannot fail here */
    }
    for (int i = 0; i < d->nworkers; i++) {  /* the stop stays readable: every worker sees it */
        struct worker *w = &d->workers[i];
        pthread_join(w->thread, NULL);
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
    }
    d->nworkers = 0;
    close_waiting(d);
    pthread_mutex_lock(&d->mu);
    d->gate_open = 0;
    __atomic_store_n(&d->never_copy, 1, __ATOMIC_RELEASE);
    d->stopped = 1;
    for (struct handed *h = d->hq, *next; h; h = next) {
        next = h->next;
        close(h->fd);
        free(h);
    }
    d->hq = NULL;
    d->hq_tail = &d->hq;
    d->nhanded = 0;
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
    for (size_t i = 0; i < d->nown; i++)
        free(d->own[i].key);
    free(d->own);
    free(d->tab);
    for (int i = 0; i < d->nroots; i++)
        free(d->roots[i]);
    for (int i = 0; i < MONARCH_MAX_SLOTS; i++)
        free(d->tiers[i]);
    for (int q = 0; q < NQUEUES; q++) {
        free(d->evq[q].buf);
        free(d->evq[q].out);
    }
    if (d->idx && !d->idx_borrowed)
        munmap((void *)d->idx, d->idx_len);
    if (d->wake_fd >= 0)
        close(d->wake_fd);
    for (int i = 0; i < MAX_WORKERS; i++)
        free(d->workers[i].copy_buf);
    for (int i = 0; d->copiers && i < COPIERS_MAX; i++)
        free(d->copiers[i].copy_buf);
    free(d->copiers);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->take_mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->work_cv);
    free(d);
}
