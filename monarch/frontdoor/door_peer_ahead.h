/* door_peer_ahead.h -- what door_peer_ahead.c (the peer read-ahead lane's state, its ring of copies
 * and its gathering) gives door_peer_lane.c (the lane's thread and exports) and the rest of the
 * door: the lane's limits, its state (struct peer_ahead, d->pa: the lane's own, made with its
 * first order; under d->mu), and the ring's calls. Part of front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_PEER_AHEAD_H
#define MONARCH_DOOR_PEER_AHEAD_H

#include "door.h"                      /* struct worker: the lane's directories, as a worker's */

#define PA_BATCH DP_BATCH_FILES_MAX    /* files per request to one owner (the data path's limit) */
#define PA_BATCH_BYTES ((int64_t)DP_BATCH_BYTES_MAX) /* bytes per reply, at most (the data path's limit) */
#define PA_FLIGHT 32                   /* batches at once (one owner's each): gathered, or in flight */
#define PA_BATCH_KEYS (PA_BATCH * 256) /* bytes of a batch's keys (built from the index), at most */
#define PA_WAIT_NS 20000000LL          /* no work or no room: look again after this */
#define PA_ROOM_WAKE_NS 5000000LL     /* a wait for room wakes Python (to lend more) at most this often, */
#define PA_ROOM_WAKE_MAX_NS 320000000LL /* ... half as often after each one it lent nothing for, down to this */
#define PA_NOT_POSTED 1                /* pa_flight: no data path to post requests to (a test's callbacks) */
#define PA_POLL_MIN_NS 20000L          /* requests in flight: look again after at least this, ... */
#define PA_POLL_MAX_NS 500000L         /* ... doubling up to this (sooner when the reader's progress comes) */
#define TOLD_WAKE_NS 10000000LL      /* a progress answered here wakes Python (its stager's) at most this often */
#define PA_STALE UINT32_MAX            /* a copy's position once its order was replaced: consumed */
#define PA_GRACE_MS 50                 /* a copy the door answered less than this ago is not unlinked */
#define PA_FDS_MAX 4096               /* ring copies whose descriptor is kept (retired by an unlink alone), at
                                          most an eighth of the descriptor limit (pa_fds_allowed) */
#define PA_SPARES 64                   /* consumed copies kept (unnamed but their own, open) for the next fetches to
                                          write over: a new file where many were just unlinked costs more
                                          than its bytes (new pages, and on some filesystems a scan of the
                                          inodes just freed) */

/* A lane file's writable mapping, kept with its descriptor wherever it goes (the ring, the victims,
 * the spares): writing a fetch over a spare through it costs a memcpy, a fraction of a pwrite
 * over the same pages (scripts/cluster/lane_costs.c measures both). A store that faults fails with
 * SIGBUS where a pwrite says ENOSPC or EIO, so only a file in RAM (tmpfs: no disk to fail a
 * page's read) is mapped, and only ``ready`` bytes, whose pages the file holds (written whole
 * before, never cut since), are written through it: none has to be allocated. */
struct pa_map {
    char *at;                          /* NULL: none */
    uint64_t mapped, ready;            /* its length; of it, the bytes backed by the file's pages */
};

struct pa_file {                       /* one file of a batch under way */
    const char *key;                   /* in its batch's keys_kept */
    uint32_t len, hash, pos, gen;      /* its position in the order, and the order's generation */
    struct idx_file f;
    int dir, fd;                       /* its directory in the peer area (pinned), its file */
    struct pa_map map;                 /* ``fd``'s (a spare's, kept) */
    uint64_t home;                     /* the file's own name (pa_home_name) */
};

struct pa_copy {                       /* one copy of the ring: in the peer area, the lane's */
    uint32_t entry, pos;               /* its index entry; its position in the order (PA_STALE) */
    uint32_t hash;                     /* its key's monarch_crc32: looked up at each want of room */
    int64_t room;                      /* what it holds of the lane's room */
    int fd;                            /* the descriptor it was written with (kept: SIGURG on lease breaks), or -1 */
    mode_t mode;
    struct pa_map map;                 /* ``fd``'s */
    uint64_t home;                     /* its file's own name (pa_home_name) */
};

struct pa_spare {                      /* a consumed copy, its key's name unlinked, to be written over */
    int fd;                            /* read-write, its lease breaks signalled with SIGURG (ignored) */
    mode_t mode;
    struct pa_map map;                 /* ``fd``'s */
    uint64_t size;                     /* its length (a spare of the next file's is not truncated) */
    uint64_t home;                     /* its own name, now its only one (pa_home_name) */
};

struct pa_victim {                     /* a copy of the ring to unlink: its key's index entry */
    uint32_t entry, hash;
    int fd;                            /* its kept descriptor, or -1 */
    mode_t mode;
    struct pa_map map;                 /* ``fd``'s */
    uint64_t size;                     /* its length (the index's) */
    uint64_t home;                     /* its file's own name (pa_home_name) */
};

enum { PB_FREE, PB_FILLING, PB_FLIGHT };

struct pa_batch {                      /* one owner's request of the lane's: being gathered, or in flight */
    int state, owner, n;
    int64_t bytes, posted_ns;
    struct dp_request *h;                           /* the data path's, once posted (dp_post) ... */
    struct dp *dp;                          /* ... with the data path and the calls it was posted with (kept: */
    dp_test_fn *test;                 /* the lane may be turned off while it is in flight) */
    dp_take_fn *take;
    struct pa_file files[PA_BATCH];
    const char *keys[PA_BATCH];        /* its files' keys, in keys_kept */
    int lens[PA_BATCH];
    uint64_t sizes[PA_BATCH];
    int64_t results[PA_BATCH];
    uint32_t kept;                     /* bytes of keys_kept taken */
    char keys_kept[PA_BATCH_KEYS];
};
_Static_assert(PA_BATCH_KEYS >= INDEX_KEY_MAX, "any key fits an empty batch");

struct peer_ahead {
    pthread_t thread;
    int started, stop, busy;           /* busy: a batch or an unlinking under way (outside the lock) */
    pthread_cond_t cv;                 /* an order, progress, or the stop */
    uint32_t *order;                   /* index entries, from 1, in the reader's order */
    uint32_t n, next, done, window;    /* the next position looked at; positions consumed; how far ahead */
    uint32_t gen;                      /* orders given so far: a batch of an earlier one is stale */
    uint64_t stream;                   /* the hint stream whose order this is (its PROGRESS frames are answered here) */
    int told_fresh;                    /* a progress answered here that Python's stager has not taken yet */
    uint64_t told, told_frames;        /* the last progress answered here; frames answered here so far */
    int64_t told_woke_ns;              /* when one last woke Python */
    int64_t room_woke_ns;              /* when a wait for room last woke Python, */
    int64_t room_wake_ns;              /* ... the least time until the next one, */
    uint64_t grants, grants_at_wake;   /* ... Python's grants of room to the lane so far, and then */
    struct worker w;                   /* the lane's directory kept and temporary names, as a worker's */
    uint64_t orders, fetched, fetched_bytes, batches, failed, skipped, room_waits;
    uint64_t waited;                   /* opens that came while the lane fetched their file: answered after it */
    uint64_t kept, unlinked, reused;   /* copies asked for again before they went; unlinked; written over */
    uint64_t mapped;                   /* of those written over, through their kept mapping (pa_write) */
    struct pa_spare spares[PA_SPARES];
    int nspares, leases_off;           /* leases_off: the area's filesystem grants none: no spares */
    uint64_t home_seq;                 /* the lane's files made so far: their own names' numbers */
    struct pa_copy *ring;              /* its copies, in the order fetched */
    uint32_t nring, ring_cap, nfds;    /* nfds: of them, those whose descriptor is kept ... */
    uint32_t fds_cap;                  /* ... at most this many */
    int64_t room, used;                /* the room taken out of the lease; what its copies hold of it */
    struct pa_victim victims[PA_FLIGHT * PA_BATCH];  /* copies to unlink before the next fetches */
    uint32_t nvictims;
    struct pa_batch batch[PA_FLIGHT];
    int nflight;                       /* of them, posted and not taken yet (under the lock) */
    int64_t rtt_ns;                    /* a request's round trip, a moving average */
    long poll_ns;                      /* the next look at the requests in flight, after this */
};

/* -- what door_peer_lane.c calls (the _locked ones under d->mu) ------------------------------ */
/* a lane file: its own name, its descriptor and mapping */
static void pa_home_name(char *buf, size_t cap, uint64_t home);
static uint64_t pa_new_home(struct peer_ahead *pa);
static void unlink_home(const struct door *d, uint64_t home);
static void pa_close(int fd, struct pa_map *m);
static int pa_write(int fd, struct pa_map *m, const char *bytes, uint64_t size);
/* the ring of copies, its spares and victims */
static void ring_close_fd(struct peer_ahead *pa, struct pa_copy *c);
static int ring_push_locked(struct peer_ahead *pa, uint32_t entry, uint32_t hash, uint32_t pos, int64_t room, int fd,
                            mode_t mode, struct pa_map map, uint64_t home);
static int pa_take_spare(struct door *d, struct peer_ahead *pa, uint64_t size, mode_t mode, uint64_t *home,
                         struct pa_map *map);
static void pa_drop_spares(struct door *d, struct peer_ahead *pa);
static void ring_unlink_victims(struct door *d, struct peer_ahead *pa, int keep_spares);
static void ring_drop_locked(struct door *d, struct peer_ahead *pa);
/* the next batches gathered */
static int pa_gather_locked(struct door *d, struct peer_ahead *pa, int *room);

#endif /* MONARCH_DOOR_PEER_AHEAD_H */
