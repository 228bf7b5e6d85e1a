/* door_peer.h -- what door_peer.c (the peer lane: another node's file fetched through the C data
 * path, ../native/datapath.h) gives the door's other parts: its state (struct door_peer, d->peer,
 * under d->mu but for the counters marked atomic), the test of whose file an open is, and the
 * remote open itself. Part of front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_PEER_H
#define MONARCH_DOOR_PEER_H

#include "inflight.h"                  /* each owner's requests in flight */

#define PEER_POOL 16                   /* memfds kept per worker for remote opens */

struct waiter;
struct owner_queue {                   /* the remote opens waiting for one owner's fetch */
    struct waiter *head, **tail;
    int inflight;                      /* workers fetching from it now */
    struct inflight flow;              /* how many may: the rule of every lane of whole files */
};

/* The memfd rule: a fetch kept in the peer area only while its measured reuse pays (door_peer.c) */
struct peer_reuse {
    const uint64_t *opens;             /* the shim's opens in the peer slot (front_door_peer_reuse), or NULL */
    void *map;                         /* the counters' mapping ``opens`` is in */
    size_t map_len;
    uint64_t first;                    /* opens answered with a fresh fetch (atomic) */
    uint64_t opens_at, first_at, copies;  /* at the window's start: the opens, those; copies made since */
    int64_t again_sum, copies_sum;     /* the windows so far, each weighing half the next */
    uint64_t permille;                 /* r, measured */
    uint64_t seq;                      /* fetches while r is low: 1 in PEER_SAMPLE goes into the area */
    int keep_all;                      /* every fetch into the area (r above the break-even) */
};

/* The peer lane (a sharded cluster): a miss of another node's file fetched through the C peer
 * data path (monarch/cluster/datapath.c) into the peer area, within the peer books' lease */
struct door_peer {
    /* the data path's calls (front_door_peers), by address from Python */
    dp_fetch_fn *fetch;
    dp_fetch_many_fn *fetch_many;      /* batches of one owner's files (NULL: one at a time) */
    dp_post_fn *post;                  /* requests in flight without a thread each (NULL: one batch at a time) */
    dp_test_fn *test;
    dp_take_fn *take;
    dp_staged_fn *offer;               /* the door's own copies offered to other nodes (own_only) */
    dp_describe_fn *describe;          /* another node's listed file described from its owner's index */
    dp_take_wanted_fn *take_wanted;    /* the files not described yet that peers open now, first in the lane */
    struct dp *dp;
    /* whose file is whose */
    int own_only;                      /* a sharded node: copy only the files ``owners`` gives to no other */
    struct entry_owners owners;        /* Python's table or the placement's ring (door_owners.h) */
    int self_node, slot, timeout_ms, allowed;
    int64_t unit;                      /* the area's allocation unit: a fetch pays its size rounded up to it */
    /* the opens of one owner, gathered */
    struct owner_queue *oq;            /* by owner node */
    int noq, fetchers;                 /* owners' queues; workers fetching now */
    int64_t rtt_ns;                    /* answers' round trip, a moving average (relaxed: a hint) */
    int pwait2_off;                    /* no epoll_pwait2 here: a fetcher sleeps while its answer is due */
    struct peer_reuse reuse;
    /* counters (front_door_counts) */
    uint64_t fetches, failures, transient;
    uint64_t batches, batched;         /* requests sent, files in them */
    uint64_t waits;                    /* fetchers' waits for an answer, serving their connections (atomic) */
};

struct owner_ask {                     /* whom a listed file's stat is asked of (owner_ask_locked) */
    int owner, timeout_ms;
    dp_describe_fn *describe;
    struct dp *dp;
    struct entry_owners owners;        /* the door's (its neighbours of that owner asked too) */
};

struct door;
struct worker;
struct entry;
struct idx_file;
/* -- what the other parts call ---------------------------------------------------------- */
static int64_t peer_room(const struct door *d, uint64_t size);  /* a file's room in the area */
/* May the door copy index entry ``entry`` from the PFS (not another node's)? Under the lock. */
static int own_file_locked(const struct door *d, uint32_t entry);
static uint32_t own_files_locked(const struct door *d, uint32_t n);  /* of entries 1..n, those it may copy */
/* The owner of ``f`` if the peer lane fetches it, else -1. Under the lock. */
static int peer_owner_locked(const struct door *d, const struct idx_file *f);
/* ``ns`` waited, the worker's own connections served meanwhile (none while it waits already). */
static void wait_serving(struct worker *w, int64_t ns);
/* An OPEN of another node's file, under the lock, which this lets go. -1, or R_*. */
static int remote_open(struct worker *w, int fd, const char *req, uint32_t got, const char *key, uint32_t len,
                       uint32_t hash, struct entry *e, const struct idx_file *f, int owner);
static void close_pool(struct worker *w);  /* the worker's memfds, closed */

#endif /* MONARCH_DOOR_PEER_H */
