/*
 * datapath.h -- the contract of the peer data path (cluster/datapath.c, one translation unit with
 * datapath_offers.c) with its two callers: Python (monarch/cluster/datapath.py, by ctypes) and
 * the front door (monarch/frontdoor, which calls the functions Python hands it, by address).
 * What a fetch answers, the path's limits, its counters and every function either caller
 * calls are declared here once. It lives in native/, the floor below both: the door (a lower
 * floor than cluster/) includes it without reaching up (tests/unit/test_structure.py).
 *
 * The answers and limits are X-macros (after Darshan's log-format headers), expanded here into
 * the C enums; tests/unit/cluster/test_datapath_header.py reads this file and holds Python's
 * side (its answers, limits, ``Counts`` and ``_PROTOTYPES``) against it, as
 * tests/unit/frontdoor/test_front_door_header.py holds the front door's. A function the door
 * calls has its type here (``dp_fetch_fn``...): datapath.c's definition is checked against it
 * by the compiler, and so is the door's use of it. Change a line here and in Python together.
 */
#ifndef MONARCH_DATAPATH_H
#define MONARCH_DATAPATH_H

#include <stdint.h>

#include "monarch_native.h" /* EXPORT; the wire, whose route table sets DP_ONE_MESSAGE_MAX */

/* -- what a fetch answers for a file below 0 (>= 0: its bytes written); Python's names drop DP_ */
#define DATAPATH_ANSWERS(X)                                                           \
    X(DP_HANDED_BACK, -1) /* not for this path (not staged there, compressed, larger, another size): \
                             Python's protocol fetches it */                          \
    X(DP_TIMEOUT, -2)     /* no answer before the deadline */                         \
    X(DP_MPI_ERROR, -3)   /* MPI failed the request (ULFM: a dead owner) */           \
    X(DP_CORRUPT, -4)     /* the owner's reply does not match the request */          \
    X(DP_LOCAL_IO, -5)    /* no memory here, or the destination could not be written */ \
    X(DP_STOPPED, -6)     /* the path was stopped (dp_stop) */                        \
    X(DP_LOST, -7)        /* the owner is lost (dp_lost) */                          \
    X(DP_COMING, -8)      /* not described there yet: its owner copies it now (dp_describe's wanted), \
                             asked again shortly */

/* -- the path's limits: beyond them a file is handed back (Python's protocol) ------------- */
#define DATAPATH_LIMITS(X)                                                            \
    X(DP_ONE_MESSAGE_MAX, MONARCH_ONE_MESSAGE_MAX) /* the route table's: larger files take Python's chunks */ \
    X(DP_BATCH_FILES_MAX, 64)       /* files in one request (dp_fetch_many, dp_post) */ \
    X(DP_BATCH_BYTES_MAX, 4 << 20)  /* their bytes together: one reply */             \
    X(DP_KEY_MAX, 4096)             /* a key's bytes */                               \
    X(DP_RANGE_MAX, 8 << 20)        /* a span of a large file's blocks in one message (dp_fetch_range) */ \
    X(DP_MAX_PEERS, 65536)          /* nodes the path tells lost (dp_lost) */

#define DATAPATH_ENUM_VALUE(name, value) name = value,
enum dp_answer { DATAPATH_ANSWERS(DATAPATH_ENUM_VALUE) };
enum dp_limit { DATAPATH_LIMITS(DATAPATH_ENUM_VALUE) };
_Static_assert(DP_BATCH_BYTES_MAX <= DP_ONE_MESSAGE_MAX, "a batch's reply is one message");
_Static_assert(DP_BATCH_FILES_MAX <= UINT16_MAX, "a request's header counts its files in 16 bits");
_Static_assert(DP_RANGE_MAX < (1 << 30), "a span's reply is one message, its count an int");
_Static_assert(DP_MAX_PEERS % 8 == 0, "lost nodes are a bitmap of whole bytes");

/* -- the path's counters (dp_counts): datapath.py's Counts ---------------------------------- */
struct dp_counts {
    uint64_t served_files, served_bytes;  /* files and bytes answered from here, as an owner */
    uint64_t handed_back;                 /* files asked of this owner and handed back (DP_HANDED_BACK) */
    uint64_t fetched_files, fetched_bytes; /* files and bytes fetched, as a requester */
    uint64_t mpi_errors;                  /* MPI calls that failed, either side */
    uint64_t offered;                     /* keys offered here now (dp_staged, less dp_forget) */
    uint64_t requests, served_requests;   /* messages: sent as a requester, answered as an owner */
    uint64_t waits, idle_sleeps;          /* sleeps: requesters' while a reply was due; the owner thread's */
    uint64_t served_ranges, served_range_bytes;   /* spans of large files answered from here */
    uint64_t fetched_ranges, fetched_range_bytes; /* ... and fetched, as a requester */
};
_Static_assert(sizeof(struct dp_counts) == 15 * sizeof(uint64_t), "the counters: fifteen words, no padding");

/* -- what Python calls (ctypes): datapath.py's _PROTOTYPES ---------------------------------- */
struct dp;                                /* one node's end of the path */
struct dp_request;                        /* a request posted (dp_post), until dp_take */
EXPORT int dp_thread_multiple(void);
EXPORT struct dp *dp_start(intptr_t comm_handle, int tag_ub);
EXPORT void dp_tier(struct dp *d, int slot, const char *dir);
EXPORT void dp_forget(struct dp *d, const char *key, int len);
/* ``key`` is staged by blocks in the tier of ``slot`` (its copy and map under BLOCKS_DIR and
 * BLOCKMAP_DIR there): spans of its STAGED blocks are answered from C (``slot`` -1: no more) */
EXPORT void dp_blocks(struct dp *d, const char *key, int len, int slot);
/* bytes [offset, offset + length) of large file ``key`` (``size`` bytes, ``mtime_ns``, as this
 * node's snapshot gives it) from node ``owner``'s staged blocks, written into ``fd`` at that
 * offset: the bytes written, or a DP_* answer (DP_HANDED_BACK: not all staged there) */
EXPORT int64_t dp_fetch_range(struct dp *d, int owner, const char *key, int len, uint64_t size, int64_t mtime_ns,
                              uint64_t offset, uint64_t length, int fd, int timeout_ms);
EXPORT void dp_lost(struct dp *d, int node);
/* the index this node publishes, ``n`` bytes at ``p`` as the daemon holds it mapped (NULL: none; kept by
 * the caller until dp_stop: a second mapping of the file would count its pages twice in the daemon's
 * resident size): the owner's thread answers a peer's DESCRIBE (dp_describe) of a file described there,
 * and the offers of its files are bytes at their entries (dp_staged) */
EXPORT void dp_index(struct dp *d, const unsigned char *p, uint64_t n);
EXPORT void dp_counts(struct dp *d, struct dp_counts *out);
EXPORT void dp_stop(struct dp *d);

/* -- ... and what Python hands the front door by address (front_door_peers): their types ---- */
/* the owner offers ``key`` from the tier of ``slot`` (the door's own copies too) */
typedef void dp_staged_fn(struct dp *d, const char *key, int len, int slot);
/* one file fetched into ``fd`` (from its offset): its bytes, or a DP_* */
typedef int64_t dp_fetch_fn(struct dp *d, int owner, const char *key, int len, uint64_t size, int fd,
                            int timeout_ms);
/* ``n`` files of one owner in one request and one reply, each into fds[i] at offset 0:
 * results[i] its bytes or a DP_*; 0, or a DP_* for the whole batch */
typedef int dp_fetch_many_fn(struct dp *d, int owner, int n, const char *const *keys, const int *lens,
                             const uint64_t *sizes, const int *fds, int64_t *results, int timeout_ms);
/* ``n`` files' stats as their owner ``owner`` has them in its index (files this node's listing left
 * undescribed: described here from their owner's, never from the PFS), in one request and one reply:
 * out[i] filled where results[i] >= 0, else results[i] a DP_* (DP_HANDED_BACK: not described there);
 * 0, or a DP_* for the whole batch. ``wanted``: keys[0] is opened here now: an owner that has not
 * described it puts it first in its door's read-ahead lane (dp_take_wanted), which describes it as
 * it copies it, and answers DP_COMING for it */
typedef int dp_describe_fn(struct dp *d, int owner, int n, const char *const *keys, const int *lens,
                           struct monarch_index_entry *out, int64_t *results, int wanted, int timeout_ms);
/* the owner's door's lane takes up to ``most`` index entries (from 1) peers want now into
 * ``entries`` (the count; ``on`` 0: the lane is off, nothing is taken and a peer is answered
 * DP_HANDED_BACK from now on, not DP_COMING) */
typedef int dp_take_wanted_fn(struct dp *d, uint32_t *entries, int most, int on);
/* such a request posted, not waited for (NULL: *why a DP_*), looked at (1: ended), and taken:
 * its reply handed to ``got`` (bytes[i] valid during the call only), the request freed */
typedef void dp_reply_fn(void *arg, const char *const *bytes, const int64_t *results);
typedef struct dp_request *dp_post_fn(struct dp *d, int owner, int n, const char *const *keys, const int *lens,
                                      const uint64_t *sizes, int waited, int timeout_ms, int *why);
typedef int dp_test_fn(struct dp *d, struct dp_request *r);
typedef void dp_take_fn(struct dp *d, struct dp_request *r, const uint64_t *sizes, int64_t *results,
                        dp_reply_fn *got, void *arg);
/* a few pages of a large file from its owner's staged blocks, into memory (dp_fetch_pages, above):
 * the front door's answer to a shim's PAGES (front_door_pages) */
typedef int64_t dp_fetch_pages_fn(struct dp *d, int owner, const char *key, int len, uint64_t size, int64_t mtime_ns,
                                  uint64_t offset, uint64_t length, char *dst, int timeout_ms);
EXPORT dp_fetch_pages_fn dp_fetch_pages;
EXPORT dp_staged_fn dp_staged;
EXPORT dp_fetch_fn dp_fetch;
EXPORT dp_fetch_many_fn dp_fetch_many;
EXPORT dp_describe_fn dp_describe;
EXPORT dp_take_wanted_fn dp_take_wanted;
EXPORT dp_post_fn dp_post;
EXPORT dp_test_fn dp_test;
EXPORT dp_take_fn dp_take;

#endif /* MONARCH_DATAPATH_H */
