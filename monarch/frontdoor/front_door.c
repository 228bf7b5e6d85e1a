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
 * closed unread). A shim's OPEN that asks to keep its connection (REQUEST_KEEP) is answered
 * ANSWER_KEPT and its connection kept, idle, for the shim's next OPEN, whichever thread
 * answered it (door_answers.c: finish_open); one handed over is Python's, which closes it.
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
 *
 * The door's parts, one translation unit (the shim's way: every function static, one file
 * compiled), included at the end of this file in the order each needs the ones before it:
 *   front_door.h     the contract with Python: events, reasons, the event record, the API
 *                    (the peer data path's types it calls: ../native/datapath.h; the routes: the
 *                    copy reads each file's in the index, the peer lane tests its row's size and
 *                    the owners: ../wire/monarch_wire.h)
 *   front_door.c     (here) the types, the constants, small things
 *   inflight.c       how many copies are in flight: the rule every lane of whole files follows
 *   door_keys.c      the key table: every key the door has heard of, and its state
 *   door_index.c     the snapshot's index, read in place
 *   door_answers.c   handing over to Python, the events of its books, a request's checks and
 *                    answers, requests answered later (parked on a copy, queued for a copier)
 *   door_dirs.c      a thread's directories of a tier, kept open by their path
 *   door_copies.c    one copy from the PFS into the copy tier, published atomically
 *   door_peer.c      the peer lane: another node's file through the C data path
 *   door_peer_ahead.c the peer read-ahead lane: a hinted order's other nodes' files fetched
 *                    ahead, in batches per owner: its state, ring of copies and gathering
 *   door_peer_lane.c that lane's thread, its requests in flight, and its exports
 *   door_copiers.c   the copiers and the read-ahead lane
 *   door_loop.c      the hot path: the OPEN decision (try_open) and each worker's event loop
 *   door_api.c       what Python calls (ctypes), last
 * An OPEN: door_loop.c (on_accept -> on_readable -> serve -> try_open), then door_keys.c /
 * door_index.c (the key's state, its file), then an answer (door_answers.c), a copy
 * (door_copies.c), a fetch (door_peer.c) or a copier's turn (door_copiers.c).
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
#include "../native/poll_pace.h"     /* the looks at a fetch's answer (as the data path's own) */
#include "front_door.h"                /* events, reasons, the event record, what Python calls: the contract */

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
#define INLINE_COPY_SECONDS 0.0005     /* copies this fast (their moving mean) are made by the worker that
                                          read the miss; slower, by a copier (stager.INLINE_SECONDS) */
#define PENDING_MAX 1024               /* connections waiting here for their request at once ... */
#define PENDING_NS 500000000LL         /* ... for this long; then Python (and its deadline) has them */
#define HANDED_MAX 4096                /* connections waiting for Python to take them (server.py's
                                          MAX_CONNECTIONS); beyond, closed at once: the shim reads the PFS */
#define KEPT_MAX 4096                  /* idle connections kept for their shim's next OPEN (REQUEST_KEEP):
                                          one per application thread; beyond, closed once answered */
#define CORE_WORKERS 4                 /* threads, one per core up to this: the copies are kernel time */
#define MAX_WORKERS 16                 /* threads when asked for (front_door_start's ``workers``) */
#define EVENT_BATCH 256                /* copies reported per wake-up of Python, at most */
#define COPIERS_MAX 256                /* copier threads at most: copies in flight (inflight.c's ``high``) */
#define AHEAD_WAIT_NS 50000000LL       /* the lane, out of room lent, waits this long for more ... */
#define AHEAD_WAITS 100                /* ... this many times in a row before it ends (a full tier) */
#define PEER_POOL 16                   /* memfds kept per worker for remote opens (door_peer.c) */

enum { K_FREE = 0, K_PYTHON = 1, K_BUSY = 2, K_STAGED = 3 };
/* the events (EV_*), books (Q_*), hand-over reasons (R_*) and lane endings (A_*): front_door.h */
enum { T_LISTEN = 1, T_STOP = 2 };

struct entry {                         /* one key the door has heard of: 16 bytes (a million keys, two million slots) */
    uint32_t hash;
    uint32_t ref;                      /* 0: a free slot; its key: the index's entry ``ref`` (from 1) when
                                          borrowed (a million staged files cost no copy of their keys),
                                          else the door's own copy, own[ref - 1] */
    uint8_t state, slot, borrowed, ring;  /* ring: a STAGED copy of the peer read-ahead lane's (BUSY: on its way) */
    uint32_t answered;                 /* when the door last answered it: door_ms (front_door_evict), 0 never */
};
_Static_assert(sizeof(struct entry) == 16, "the key table's slot");

struct own_key {                       /* a key not in the index (asked before the index was open) */
    char *key;
    uint32_t len;
};

struct conn {                          /* a connection whose request has not all arrived, or kept idle
                                          (``kept``: on the door's list, in a worker's epoll, not swept) */
    int fd;
    int kept;
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

#define DIR_CACHE 32                   /* directories a thread keeps open (door_dirs.c) */
struct dir_slot {
    int fd, pins;                      /* pins: its users now (dirs_get, dirs_put) */
    int orphan;                        /* not looked up any more: closed once no one holds it */
    uint32_t len;
    uint64_t used;                     /* when last asked for: the least recent goes first */
    char *key;                         /* its path under the tier ("0/d"; "": the tier itself) */
};
struct dir_cache {                     /* one thread's directories of one tier, kept open by path */
    char *tier;
    uint64_t clock;
    int n;
    struct dir_slot s[DIR_CACHE];
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
    struct dir_cache peer_dirs;        /* its directories in the peer area (door_dirs.c) */
    /* the memfds this worker answers remote opens with, kept with their pages (door_peer.c) */
    int pool[PEER_POOL];               /* read-write opens, the pool's own */
    int npool, pool_next, pool_off;
    int fetching;                      /* in run_owner: the opens it reads meanwhile wait in their queues (under the lock) */
    int stopping;                      /* it saw the stop while an answer was due: sleeps, no more serving */
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
    uint64_t accepted, reused;         /* connections accepted; requests read on a kept one */
    struct conn *kept;                 /* idle connections kept for their next OPEN (door_answers.c) */
    int nkept, keeping;                /* how many (with those being answered with ANSWER_KEPT); 0: stopping */
    /* the peer lane (a sharded cluster): a miss of another node's file fetched through the C
     * peer data path (monarch/cluster/datapath.c) into the peer area, within the same lease */
    dp_fetch_fn *peer_fetch;
    dp_fetch_many_fn *peer_fetch_many; /* batches of one owner's files (NULL: one at a time) */
    dp_post_fn *peer_post;            /* requests in flight without a thread each (NULL: one batch at a time) */
    dp_test_fn *peer_test;
    dp_take_fn *peer_take;
    dp_staged_fn *peer_offer;          /* the door's own copies offered to other nodes (own_only) */
    struct dp *peer_dp;
    int own_only;                      /* a sharded node: copy only the files ``owners`` gives to no other */
    const int16_t *owners;             /* by index entry - 1: the owning node, -1 none (Python's array) */
    uint32_t nowners;
    int self_node, peer_slot, peer_timeout_ms, peer_allowed;
    int64_t peer_unit;                 /* the area's allocation unit: a fetch pays its size rounded up to it */
    uint64_t peer_fetches, peer_failures, peer_transient;
    /* the peer lane's batches and its memfd rule (door_peer.c) */
    struct owner_queue *oq;            /* by owner node */
    int noq, peer_fetchers;            /* owners' queues; workers fetching now */
    uint64_t peer_batches, peer_batched;  /* requests sent, files in them */
    uint64_t peer_waits;               /* fetchers' waits for an answer, serving their connections (atomic) */
    int64_t peer_rtt_ns;               /* their answers' round trip, a moving average (relaxed: a hint) */
    int pwait2_off;                    /* no epoll_pwait2 here: a fetcher sleeps while its answer is due */
    const uint64_t *reuse_opens;       /* the shim's opens in the peer slot (front_door_peer_reuse), or NULL */
    void *reuse_map;
    size_t reuse_map_len;
    uint64_t peer_first;               /* opens answered with a fresh fetch (atomic) */
    uint64_t reuse_opens_at, reuse_first_at, reuse_copies, peer_reuse_permille, peer_seq;
    int64_t reuse_again_sum, reuse_copies_sum;   /* the windows so far, each weighing half the next */
    int peer_keep_all;                 /* every fetch into the area (r above the break-even) */
    int nhanded;                       /* connections in hq */
    int busy;                          /* keys BUSY now */
    int copies_busy;                   /* of which copies from the PFS (front_door_copy_to waits for none) */
    /* the copiers: threads that copy the misses of a slow source (``demand``, first) and the
     * read-ahead lane's files, as many at once as ``flow`` allows (demand whatever it says) */
    struct inflight flow;              /* copies in flight toward the PFS: the lane keeps to its limit */
    struct worker *copiers;            /* COPIERS_MAX of them, started as the work wants them ... */
    int copiers_cap;                   /* ... up to this many: what the descriptor limit allows (copiers_allowed) */
    int ncopiers, copiers_working, copiers_stop;
    pthread_cond_t work_cv;            /* a copier may have work: a miss queued, a slot free, room lent */
    struct waiter *demand, **demand_tail, *parked;
    int ndemand;
    /* the read-ahead lane (front_door_read_ahead): small files copied ahead of the reader */
    int ahead_asked, ahead_on, ahead_busy, ahead_end, ahead_waits, ahead_room_wait;
    uint32_t ahead_n, ahead_next;      /* the lane goes through index entries 1 to ahead_n; the next one, from 0 */
    uint64_t ahead_copies;
    /* the peer read-ahead lane (door_peer_ahead.c): a hinted order's other nodes' files fetched ahead */
    struct peer_ahead *pa;             /* made with its first order, or NULL */
};

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
    int to_area;                       /* a remote open: fetched into the peer area (1) or a memfd (door_peer.c) */
    char req[];                        /* the request as read: the key after its header */
};

struct owner_queue {                   /* the remote opens waiting for one owner's fetch (door_peer.c) */
    struct waiter *head, **tail;
    int inflight;                      /* workers fetching from it now */
    struct inflight flow;              /* how many may: the rule of every lane of whole files */
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

/* used before their parts define them */
static uint32_t index_number(const struct door *d, const char *key, uint32_t len, uint32_t hash);
static const char *index_entry_key(const struct door *d, uint32_t n, uint32_t *len);
static void staff_locked(struct door *d);
static void *copier_main(void *arg);

/* Milliseconds since the door started, from 1 (0: never), wrapping after 49 days: when a key
 * was answered, in 4 bytes of its slot. */
static uint32_t door_ms(const struct door *d)
{
    return (uint32_t)((monarch_now_ns() - d->started_ns) / 1000000) + 1;
}

/* Wait on ``cv`` (with ``mu`` held) until it is signalled or ``ns`` have passed. */
static void timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, long ns)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += ns;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &until);
}

/* -- the parts ------------------------------------------------------------------------- */
#include "door_keys.c"
#include "door_index.c"
#include "door_answers.c"
#include "door_dirs.c"
#include "door_copies.c"
#include "door_peer.c"
#include "door_peer_ahead.c"
#include "door_peer_lane.c"
#include "door_copiers.c"
#include "door_loop.c"
#include "door_api.c"
