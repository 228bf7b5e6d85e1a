/*
 * front_door.h -- the contract between the front door (front_door.c, one translation unit
 * with its door_*.c parts and inflight.c) and Python (monarch/frontdoor/__init__.py):
 * the events it reports, why it hands a connection over, why its read-ahead lane ended, the
 * phases of its rule for copies in flight, the event record, its counters and states, and
 * every function Python calls.
 *
 * Each list is declared once, as an X-macro (after Darshan's log-format headers), expanded
 * here into the C enum; tests/unit/frontdoor/test_front_door_header.py reads this file and holds the
 * Python side (EV_*, BOOKS, HANDED_OVER_BECAUSE, AHEAD_ENDED_BECAUSE, the phases, _EVENT,
 * the counters' Structures, _PROTOTYPES) against it, as tests/unit/test_wire.py holds
 * monarch/wire/monarch_wire.h. Change a list or a record here and in Python together: a
 * reason's place is its number in front_door_counts.handed_because.
 */
#ifndef MONARCH_FRONT_DOOR_H
#define MONARCH_FRONT_DOOR_H

#include <stddef.h>
#include <stdint.h>

#include "../native/datapath.h" /* the peer data path's functions the door calls: their types */

/* -- what the door reports (front_door_events: kind), with its number ---------------------- */
#define FRONT_DOOR_EVENTS(X)                                                          \
    X(EV_STAGED, 1)     /* copied into the copy tier (or fetched into the peer area) */ \
    X(EV_FAILED, 2)     /* a copy or fetch failed: the key is Python's now */        \
    X(EV_AHEAD, 4)      /* copied by the read-ahead lane (3, a slow source, is no more) */ \
    X(EV_TRANSIENT, 5)  /* another node's file answered as a memfd (6, the peer read-ahead's copy, is no more: \
                           door_peer_ahead.c keeps its own books) */

/* -- whose books an event or room lent is ------------------------------------------------- */
#define FRONT_DOOR_BOOKS(X)                                                           \
    X(Q_BOOKS, 0)       /* the stager's: copies from the PFS into the copy tier */   \
    X(Q_PEER, 1)        /* the peer cache's: fetches from other nodes into the peer area */

/* -- why a connection was handed over to Python (front_door_counts), in order ------------- */
#define FRONT_DOOR_HANDED_OVER(X)                                                     \
    X(R_OTHER, "other_request")                                                       \
    X(R_CLOSED_GATE, "snapshot_not_ready")                                            \
    X(R_PYTHON_KEY, "python_owns_key")                                                \
    X(R_NOT_COPYING, "not_copying")                                                   \
    X(R_NOT_SMALL_FILE, "not_small_file")                                             \
    X(R_NO_ROOM, "no_room_lent")                                                      \
    X(R_COPY_FAILED, "copy_failed")

/* -- why the read-ahead lane ended before its list did (front_door_read_ahead_state) ------ */
#define FRONT_DOOR_AHEAD_ENDED(X)                                                     \
    X(A_WHOLE, "")                                                                    \
    X(A_NOT_COPYING, "not_copying")                                                   \
    X(A_NO_ROOM, "no_room")                                                           \
    X(A_STOPPED, "stopped")

/* -- the phases of inflight.c's rule (inflight_state: phase), in order -------------------- */
#define INFLIGHT_PHASES(X)                                                            \
    X(P_START, "slow_start")  /* doubling while the latency stays flat */             \
    X(P_MEASURE, "measure")   /* a round's base: the current limit's rate */          \
    X(P_UP, "up")             /* twice as many, kept if they pay */                   \
    X(P_DOWN, "down")         /* half as many, taken if they give as much */          \
    X(P_SETTLED, "settled")   /* until the next round */

#define FRONT_DOOR_ENUM_VALUE(name, value) name = value,
#define FRONT_DOOR_ENUM_NAME(name, text) name,
enum front_door_event { FRONT_DOOR_EVENTS(FRONT_DOOR_ENUM_VALUE) };
enum front_door_books { FRONT_DOOR_BOOKS(FRONT_DOOR_ENUM_VALUE) NQUEUES };
enum front_door_handed_over { FRONT_DOOR_HANDED_OVER(FRONT_DOOR_ENUM_NAME) R_REASONS };
enum front_door_ahead_ended { FRONT_DOOR_AHEAD_ENDED(FRONT_DOOR_ENUM_NAME) };
enum inflight_phase { INFLIGHT_PHASES(FRONT_DOOR_ENUM_NAME) };

/* -- the event record: front_door_events hands these over, each followed by its key ------- */
#define FRONT_DOOR_EVENT_FORMAT "<IIQQqII"  /* Python's struct format of the head */
struct front_door_event_head {
    uint32_t kind, slot;               /* FRONT_DOOR_EVENTS; the slot it was published in */
    uint64_t size, bytes_read;         /* the file's size; bytes read from its source */
    int64_t ns;                        /* how long the copy took */
    uint32_t len, entry;               /* the key's length (the key follows); its index entry, from 1 (0: none) */
};
_Static_assert(sizeof(struct front_door_event_head) == 40, "the event record's head: no padding");
_Static_assert(offsetof(struct front_door_event_head, ns) == 24, "the event record: ns");
_Static_assert(offsetof(struct front_door_event_head, entry) == 36, "the event record: entry");

/* -- the door's counters, read by name (Python: DoorCounts, ReadAheadState, PeerTold,
 * PeerAheadState, InflightState, DoorInflight); each record is whole words, so Python's
 * Structure has the same layout ---------------------------------------------------------- */
struct front_door_counts {
    uint64_t hits[MONARCH_MAX_SLOTS];       /* opens answered with a staged copy, by slot */
    uint64_t copies, handed, failures;      /* copies made, connections handed over, copies failed */
    uint64_t bytes_read;                    /* bytes read from the PFS */
    uint64_t handed_because[R_REASONS];     /* connections handed over, by reason (FRONT_DOOR_HANDED_OVER) */
    uint64_t closed_too_many;               /* closed with HANDED_MAX waiting, or no descriptor left */
    uint64_t peer_fetches, peer_failures;   /* the peer lane: files fetched, fetches failed, */
    uint64_t peer_transient;                /* ... and answered as a memfd */
    uint64_t accepted, reused;              /* connections accepted; requests read on a kept one */
    uint64_t peer_batches, peer_batched;    /* the peer lane's requests to owners, the files in them */
    uint64_t peer_keep_all;                 /* its memfd rule now: every fetch into the area (1), ... */
    uint64_t peer_reuse_permille;           /* ... by the measured reuse of the area's copies, per mille */
    uint64_t peer_waits;                    /* the fetching workers' looks while an answer was due */
};
struct front_door_read_ahead_state {        /* the read-ahead lane (front_door_read_ahead_state) */
    uint64_t running;                       /* copies in flight (at least 1 while its list is not through) */
    uint64_t through, copies;               /* entries gone through, files copied */
    uint64_t ended_because;                 /* FRONT_DOOR_AHEAD_ENDED (A_WHOLE: it did not end early) */
    uint64_t key_bytes;                     /* the door's records of the keys it heard of (its key table) */
};
struct front_door_peer_told {               /* the last progress the door answered itself */
    uint64_t stream, consumed;              /* its hint stream, the positions consumed */
    uint64_t answered;                      /* progress requests the door answered so far */
};
struct front_door_peer_ahead_state {        /* the peer read-ahead lane (door_peer_ahead.c) */
    uint64_t orders, fetched, fetched_bytes;  /* orders given, files fetched, their bytes */
    uint64_t batches, failed, skipped;      /* requests, files failed, files skipped */
    uint64_t room_waits;                    /* waits for room */
    uint64_t order, next, consumed;         /* the order's length, its next position, positions consumed */
    uint64_t waited;                        /* opens that waited for a fetch */
    uint64_t copies, room;                  /* copies on the ring, the room they hold (taken from the lease) */
    uint64_t unlinked, kept, reused;        /* copies gone (unlinked or kept as spares), asked for again
                                               before they went, fetches written over a spare */
    uint64_t progress_answered;             /* progress requests the door answered itself */
    uint64_t written_mapped;                /* fetches written through a spare's kept mapping */
};
struct inflight_state {                     /* one lane's copies in flight (inflight.c's rule: inflight_state) */
    uint64_t limit, peak;                   /* copies in flight allowed now; the highest it reached */
    uint64_t windows_judged;                /* measurement windows that counted */
    uint64_t phase;                         /* INFLIGHT_PHASES */
    double mean_copy_seconds;               /* a copy's seconds, a moving mean (< 0: none yet) */
    double last_rate;                       /* copies a second of the last window judged */
};
struct front_door_inflight {                /* the door's own lane toward its source (front_door_inflight) */
    struct inflight_state flow;             /* its rule's state */
    uint64_t copiers, in_flight;            /* its copier threads; copies under way now */
};
_Static_assert(sizeof(struct front_door_counts) == 8 * (MONARCH_MAX_SLOTS + R_REASONS + 15), "the counters: words");
_Static_assert(sizeof(struct front_door_read_ahead_state) == 8 * 5, "the read-ahead lane's state: words");
_Static_assert(sizeof(struct front_door_peer_told) == 8 * 3, "the progress told: words");
_Static_assert(sizeof(struct front_door_peer_ahead_state) == 8 * 18, "the peer read-ahead lane's state: words");
_Static_assert(sizeof(struct inflight_state) == 8 * 6, "a lane's copies in flight: words");
_Static_assert(sizeof(struct front_door_inflight) == 8 * 8, "the door's copies in flight: words");

/* -- what Python calls (ctypes): monarch/frontdoor/__init__.py's _PROTOTYPES --------------- */
struct door;
struct inflight;
/* the door's life */
EXPORT struct door *front_door_start(int listen_fd, const char *roots, int nroots, const char *tiers, int ntiers,
                                     int copy_slot, int workers);
EXPORT void front_door_stop(struct door *d);
EXPORT void front_door_free(struct door *d);
/* the server's side: connections handed over, and the door's books */
EXPORT int front_door_wake_fd(struct door *d);
EXPORT int front_door_take(struct door *d, int *fd, char *buf, int cap);
EXPORT int front_door_events(struct door *d, int q, char *buf, int cap);
EXPORT void front_door_counts(struct door *d, struct front_door_counts *out);
/* the snapshot's index */
EXPORT int front_door_open(struct door *d, const char *index_path);
EXPORT int front_door_open_memory(struct door *d, const unsigned char *p, uint64_t n);
EXPORT void front_door_settle(struct door *d);
EXPORT void front_door_describe_with(struct door *d, const uint64_t *smallest, const uint8_t *route, const int *nsteps,
                                     int nroots);
/* the stager's policy: which keys are whose, whether and where the door may copy */
EXPORT int front_door_claim(struct door *d, const char *key, int len);
EXPORT void front_door_staged(struct door *d, const char *key, int len, int slot);
EXPORT void front_door_forget(struct door *d, const char *key, int len);
EXPORT int front_door_evict(struct door *d, const char *key, int len, int64_t grace_ns);
EXPORT void front_door_copying(struct door *d, int on);
EXPORT void front_door_keep_sources(struct door *d);  /* from the first miss, the index's directories opened, kept */
EXPORT void front_door_disable(struct door *d);
EXPORT int64_t front_door_copy_to(struct door *d, int slot, int64_t bytes);
/* room lent, by books (FRONT_DOOR_BOOKS) */
EXPORT void front_door_grant(struct door *d, int q, int64_t bytes);
EXPORT int64_t front_door_reclaim(struct door *d, int q);
EXPORT int64_t front_door_lease(struct door *d, int q);
/* the peer lane (a sharded cluster): the data path's functions (datapath.h), by address from Python */
EXPORT int front_door_peers(struct door *d, dp_fetch_fn *fetch, dp_staged_fn *offer, struct dp *dp, const int16_t *owners,
                            uint32_t nowners, int self_node, int peer_slot, int timeout_ms, int64_t unit,
                            dp_fetch_many_fn *fetch_many, dp_post_fn *post, dp_test_fn *test, dp_take_fn *take);
EXPORT int64_t front_door_ring(struct door *d, const unsigned char *index, uint64_t len, const uint64_t *starts,
                               const int16_t *nodes, uint32_t parts, uint64_t seed, int self_node, uint64_t *bits,
                               uint32_t n);
/* a cluster's: a shim's PAGES (a guarded fault's pages of another owner's block) fetched with
 * ``fetch_pages`` (the data path's dp_fetch_pages, on ``dp``) from the owner it names; NULL: refused */
EXPORT int front_door_pages(struct door *d, dp_fetch_pages_fn *fetch_pages, struct dp *dp, int self_node,
                             int timeout_ms);
EXPORT void front_door_own_only(struct door *d, int on);
/* a sharded node's: a file its listing left undescribed that another node owns described from that
 * owner's index with ``describe`` (the data path's dp_describe, on front_door_peers' ``dp``), never
 * stat'ed on the PFS here; NULL: by its name (a lookup). ``take_wanted`` (dp_take_wanted): such files
 * of this node's that peers open now, copied first by the read-ahead lane (which describes them) */
EXPORT void front_door_peer_describe(struct door *d, dp_describe_fn *describe, dp_take_wanted_fn *take_wanted);
EXPORT void front_door_peer_copying(struct door *d, int on);
EXPORT int front_door_peer_reuse(struct door *d, const char *path, uint64_t offset);
/* the peer read-ahead lane (door_peer_ahead.c): a hinted order's other nodes' files fetched ahead */
EXPORT int front_door_peer_ahead(struct door *d, const uint32_t *entries, uint32_t n, uint32_t window, uint64_t stream);
EXPORT void front_door_peer_progress(struct door *d, uint32_t consumed);
EXPORT int front_door_peer_told(struct door *d, struct front_door_peer_told *out);
EXPORT void front_door_peer_gone(struct door *d, const char *key, int len);
EXPORT void front_door_peer_ahead_state(struct door *d, struct front_door_peer_ahead_state *out);
/* the read-ahead lane and the copies in flight */
EXPORT int front_door_read_ahead(struct door *d, uint32_t n, uint32_t most, int fixed, int start);
EXPORT void front_door_read_ahead_state(struct door *d, struct front_door_read_ahead_state *out);
EXPORT void front_door_inflight(struct door *d, struct front_door_inflight *out);
/* inflight.c's rule, for Python's lanes (monarch/node/stage/concurrency.py) */
EXPORT struct inflight *inflight_new(int fixed, int start, int low, int high);
EXPORT void inflight_free(struct inflight *c);
EXPORT void inflight_copy_ended(struct inflight *c, double seconds, double now);
EXPORT void inflight_nothing_to_copy(struct inflight *c);
EXPORT int inflight_limit(const struct inflight *c);
EXPORT void inflight_state(const struct inflight *c, struct inflight_state *out);

#endif /* MONARCH_FRONT_DOOR_H */
