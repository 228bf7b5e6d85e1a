/* The peer data path in C: a file another node holds staged crosses without Python on either
 * side; its contract with Python and the front door is datapath.h. It has a communicator of
 * its own (a Dup of the cluster's, so its tags never meet the Python engine's, which keeps the
 * control plane: heartbeats, the snapshot, losses, shutdown, and every file this path hands
 * back); MPI runs at MPI_THREAD_MULTIPLE.
 *
 * Owner: one thread answers requests. A request names a key and the size the requester's
 * snapshot gives it. A key Python listed as staged here, raw, of that size and at most
 * DP_ONE_MESSAGE_MAX, is read and sent back in one message (a header, then the bytes). A span of
 * a large file (up to DP_RANGE_MAX) is answered so when Python offered the file whole or by
 * blocks and every block of the span is STAGED in a map of the requester's version of the file.
 * Anything else (not staged yet, compressed, larger, another size, a read error) is answered
 * DP_HANDED_BACK: the requester asks again through Python's protocol, which stages, streams in
 * chunks, decodes and refuses.
 *
 * Requester: ``dp_fetch``'s caller (the front door's worker, or a Python fetching thread that
 * ctypes lets go of the GIL) posts its receive and its request itself and polls them, no
 * hand-off to another thread, until the answer, a loss (``dp_lost``), the stop or its
 * deadline; then writes the bytes into the destination. Or it posts a request (``dp_post``),
 * looks at it when it likes (``dp_test``) and takes its reply (``dp_take``): the front door's
 * read-ahead lane keeps many owners' requests in flight so from one thread. A fetch given up with its receive
 * still posted is left to the owner's thread (an orphan) until the answer comes, so a late
 * answer never lands in another fetch's buffer and its tag is not reused before.
 *
 * MPI offers nothing to sleep on, so both poll, each sleeping between looks as
 * monarch/native/poll_pace.h rules (a requester by the answers' recent round trip, the owner's
 * thread by the requests' recent gap, bounded while an application's open waits on them: a
 * request says so, REQ_WAITED). Timer slack is 1 us on these threads: the default 50 us would
 * set the pace of every remote open.
 */
#define _GNU_SOURCE
#include <mpi.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "../native/monarch_native.h" /* EXPORT, the clock */
#include "../native/poll_pace.h"     /* how long the polling threads sleep */
#include "../native/datapath.h"       /* answers, limits, counters, what Python and the door call: the contract */

#define TAG_REQUEST 1
#define FIRST_TAG 16
enum { ST_OK = 0, ST_HANDED_BACK = 1, ST_COMING = 2 };  /* a file's status in a reply (ST_COMING: DP_COMING) */

/* One request names up to DP_BATCH_FILES_MAX files (their items, then their keys back to back);
 * its reply has one item per file, then the bytes of those answered ST_OK, back to back: a
 * batch of files crosses in one message each way. A span's request (REQ_RANGE) names one large
 * file: its item (the file's size), the span, then its key; the reply's item has the span's
 * length, then its bytes. */
struct request_header { uint32_t tag; uint16_t n; uint16_t flags; };
#define REQ_WAITED 1u                   /* flags: an application's open waits on this reply (poll_pace.h) */
#define REQ_RANGE 2u                    /* flags: a span of one large file's staged blocks */
#define REQ_PAGES 4u                    /* flags: ... a fault's pages, which it waits on (poll_pace.h) */
#define REQ_DESCRIBE 8u                 /* flags: files' stats from the owner's index, not their bytes (dp_describe) */
#define REQ_WANTED 16u                  /* flags: ... the first one opened now: copied by its owner if not described */
struct request_item { uint64_t size; uint32_t len; uint32_t pad; };
struct request_span { uint64_t offset, length; int64_t mtime_ns; };
struct reply_header { uint32_t n; uint32_t pad; };
struct reply_item { int32_t status; uint32_t pad; uint64_t size; };

struct dp_request {                     /* one request of this node's, posted */
    struct dp_request *next;            /* dp.active */
    int owner, tag, n;
    int sent;                           /* the request's send has completed (or failed) */
    int orphan;                         /* given up on: the owner's thread tests and frees it */
    uint64_t cap;                       /* the reply's largest size: every file answered */
    MPI_Request recv, send;
    char *buf;                          /* the reply: header, items, bytes */
    char *req;                          /* the request: header, items, keys */
    int req_len, got;                   /* the request's length; the reply's */
    int why, posted;                    /* dp_post's: its answer so far (WAITING), its receive still posted */
    int span;                           /* a span of a large file (dp_fetch_range), not a fault's pages: paced apart
                                           (poll_pace.h) */
    int pages;                          /* a fault's pages (dp_fetch_pages): looked at sooner */
    int64_t posted_ns, deadline;        /* dp_post's: when it was posted, when it is given up */
};

struct sending { struct sending *next; MPI_Request req; char *buf; };
struct block_offer { struct block_offer *next; uint32_t len; uint8_t slot; char key[]; };
struct let_go { int fd; char *map; uint64_t mapped; };  /* a withdrawn offer's kept file (datapath_offers.c) */

#define OFFER_GENS 1024                 /* a kept descriptor's check that its entry's offer still stands */
#define WANTED_MAX 256                  /* entries wanted and not taken yet: a peer asked beyond them reads its name */

struct dp {
    MPI_Comm comm;
    int rank, size, tag_ub;
    pthread_t thread;
    pthread_mutex_t mu;
    int stop, running;
    struct dp_request *active;          /* posted fetches: their tags are taken */
    struct sending *sends;
    int next_tag;
    struct staged **buckets;            /* the offers by key (datapath_offers.c): keys the index lacks, kept files */
    uint32_t nbuckets, nlinked, nstaged; /* nstaged: every offer, by key or by entry */
    const unsigned char *offer_index;   /* the index lent last (checked), whose entries may number offers, or NULL */
    struct monarch_index_header offer_head;
    uint8_t *offer_slot;                /* by its entry - 1: an offered file's slot + 1, 0 none; NULL: by key */
    uint32_t offer_gens[OFFER_GENS];    /* entry offers made or withdrawn, by entry % OFFER_GENS */
    uint64_t offers;                    /* offers made: each one's generation */
    uint32_t kept_fds, fds_allowed;     /* descriptors kept open, at most */
    struct let_go *closing;             /* withdrawn offers' kept files, for the owner's thread to close */
    struct block_offer *block_offers;   /* large files staged by blocks here (dp_blocks) */
    uint32_t nclosing, closing_cap;
    int reads_over;                     /* the owner's thread has ended: descriptors are closed at once */
    char *tiers[MONARCH_MAX_SLOTS];
    unsigned char in_ram[MONARCH_MAX_SLOTS]; /* the tier is on tmpfs: its kept files are mapped (datapath_offers.c) */
    unsigned char lost[DP_MAX_PEERS / 8];
    uint64_t served_files, served_bytes, handed_back, fetched_files, fetched_bytes, mpi_errors;
    uint64_t requests, served_requests;  /* messages: sent as a requester, answered as an owner */
    uint64_t waits, idle_sleeps;         /* sleeps: requesters' while a reply was due; the owner thread's */
    uint64_t served_ranges, served_range_bytes, fetched_ranges, fetched_range_bytes;
    int64_t rtt_ns;                     /* answers' round trip, a moving average (relaxed: a hint) */
    const unsigned char *index_next;    /* the index lent next (dp_index), under mu ... */
    size_t index_next_len;
    int index_lent;                     /* ... once lent */
    const unsigned char *index;         /* the index the owner's thread reads (the daemon's mapping), or NULL */
    size_t index_len;
    uint32_t wanted[WANTED_MAX];        /* entries peers want now, for the door's lane (dp_take_wanted), under mu */
    int nwanted, wanted_on;             /* how many; whether that lane takes them (its last word) */
    uint32_t taken[WANTED_MAX];         /* the last ones it took (a ring): asked again while their copy is under
                                           way, never handed to it twice (a second open of the file) */
    int ntaken, taken_next;
};

#include "datapath_offers.c"      /* the offers, and the owner's read of one */
#include "datapath_answers.c"     /* the owner's answers to the requests that came */

static int reap_sends(struct dp *d)
{
    int n = 0;
    for (struct sending **p = &d->sends; *p;) {
        int flag = 0;
        int rc = MPI_Test(&(*p)->req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || flag) {    /* an error: the requester is gone; MPI freed the request */
            struct sending *s = *p;
            *p = s->next;
            free(s->buf);
            free(s);
            n++;
        } else {
            p = &(*p)->next;
        }
    }
    return n;
}

/* -- the requester's side: the calling thread makes its own MPI calls ----------------- */
static void free_fetch(struct dp_request *f)
{
    free(f->buf);
    free(f->req);
    free(f);
}

static int tag_in_use_locked(struct dp *d, int tag)
{
    for (struct dp_request *f = d->active; f; f = f->next)
        if (f->tag == tag)
            return 1;
    return 0;
}

static void unlist_locked(struct dp *d, struct dp_request *f)
{
    for (struct dp_request **p = &d->active; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            return;
        }
}

static int reap_orphans(struct dp *d)
{
    int n = 0;
    pthread_mutex_lock(&d->mu);
    for (struct dp_request **p = &d->active; *p;) {
        struct dp_request *f = *p;
        int flag = 0;
        if (!f->orphan || (MPI_Test(&f->recv, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag)) {
            p = &f->next;
            continue;
        }
        *p = f->next;                   /* answered late, or failed: its buffers can go */
        flag = 0;
        if (!f->sent && MPI_Test(&f->send, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag) {
            MPI_Request_free(&f->send);
            f->req = NULL;              /* MPI may still read it: left to MPI */
        }
        free_fetch(f);
        n++;
    }
    pthread_mutex_unlock(&d->mu);
    return n;
}

static int lost_node(struct dp *d, int node)
{
    return __atomic_load_n(&d->lost[node / 8], __ATOMIC_RELAXED) & (1u << (node % 8));
}

#define WAITING 1                       /* a posted fetch whose answer has not come (look, dp_test) */

/* One look at a fetch whose answer is WAITING (*why): *why 0 once the answer is in f->buf
 * (f->got bytes), a DP_* once it failed or its owner is lost; *posted cleared once its receive is
 * no longer posted. ``since``: when the wait began (the round trip's measure). 1 if it ended. */
static int look(struct dp *d, struct dp_request *f, int *why, int *posted, int64_t since)
{
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&f->recv, &flag, &st) != MPI_SUCCESS) {
        *posted = 0;                    /* completed in error (ULFM: a dead owner), freed by MPI */
        *why = DP_MPI_ERROR;
        return 1;
    }
    if (flag) {
        *posted = 0;
        int64_t took = monarch_now_ns() - since;  /* as seen through the poll's steps: what the next waits first */
        int64_t rtt = __atomic_load_n(&d->rtt_ns, __ATOMIC_RELAXED);
        if (!f->span)                   /* (a span's megabytes would set small files' looks to their longest) */
            __atomic_store_n(&d->rtt_ns, pace_round_trip(rtt, took), __ATOMIC_RELAXED);
        MPI_Get_count(&st, MPI_BYTE, &f->got);
        /* shorter than a header: no owner of ours sends that: a receive ended by a failure (ULFM) */
        *why = f->got < (int)sizeof(struct reply_header) ? DP_MPI_ERROR : 0;
        return 1;
    }
    if (!f->sent && (MPI_Test(&f->send, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag))
        f->sent = 1;
    if (lost_node(d, f->owner)) {
        *why = DP_LOST;
        return 1;
    }
    return 0;
}

/* Until a posted fetch is answered (*why 0: the answer is in f->buf) or given up (a DP_*
 * answer): by a loss, the stop or ``deadline``; *posted cleared once its receive is no longer
 * posted. */
static void wait_answer(struct dp *d, struct dp_request *f, int64_t deadline, int *why, int *posted)
{
    int64_t t0 = monarch_now_ns();
    int64_t rtt = __atomic_load_n(&d->rtt_ns, __ATOMIC_RELAXED);
    int64_t poll = f->span ? SPAN_POLL_NS : f->pages ? pace_first_look_pages(rtt) : pace_first_look(rtt);
    int first = 1;
    while (!look(d, f, why, posted, t0)) {
        int stopped = __atomic_load_n(&d->stop, __ATOMIC_ACQUIRE);
        if (stopped || monarch_now_ns() >= deadline) {
            *why = stopped ? DP_STOPPED : DP_TIMEOUT;
            return;
        }
        struct timespec ts = {0, (long)poll};
        nanosleep(&ts, NULL);
        __atomic_add_fetch(&d->waits, 1, __ATOMIC_RELAXED);
        if (!f->span)  /* the round trip's bulk is waited: shorter looks from here (a fault's: longer) */
            poll = pace_next_look(poll, rtt, first && !f->pages);
        first = 0;
    }
}

static void *dp_main(void *arg)
{
    struct dp *d = arg;
    prctl(PR_SET_TIMERSLACK, 1000UL);
    prctl(PR_SET_NAME, "monarch-data");
    struct owner_pace pace;
    owner_pace_init(&pace);
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        close_let_go(d);
        adopt_index(d);
        int waited = 0, took = take_requests(d, &waited);
        if (took + reap_sends(d) + reap_orphans(d)) {
            owner_pace_worked(&pace, monarch_now_ns(), took, waited);
            continue;
        }
        struct timespec ts = {0, (long)pace.idle};
        nanosleep(&ts, NULL);
        __atomic_add_fetch(&d->idle_sleeps, 1, __ATOMIC_RELAXED);
        owner_pace_slept(&pace, monarch_now_ns());
    }
    d->index = NULL;
    return NULL;
}

/* -- Python's side (ctypes) ------------------------------------------------------------ */
EXPORT int dp_thread_multiple(void)
{
    int level = 0;
    MPI_Query_thread(&level);
    return level == MPI_THREAD_MULTIPLE;
}

/* Start on ``comm_handle`` (mpi4py's handle of a communicator the caller dup'ed for this
 * path alone, MPI_ERRORS_RETURN set); NULL if MPI is not at MPI_THREAD_MULTIPLE. */
EXPORT struct dp *dp_start(intptr_t comm_handle, int tag_ub)
{
    if (!dp_thread_multiple())
        return NULL;
    struct dp *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->comm = (MPI_Comm)comm_handle;
    MPI_Comm_rank(d->comm, &d->rank);
    MPI_Comm_size(d->comm, &d->size);
    d->tag_ub = tag_ub > FIRST_TAG ? tag_ub : 32767;
    d->next_tag = FIRST_TAG;
    d->nbuckets = 1024;
    d->fds_allowed = fds_allowed();
    d->buckets = calloc(d->nbuckets, sizeof *d->buckets);
    pthread_mutex_init(&d->mu, NULL);
    if (!d->buckets || pthread_create(&d->thread, NULL, dp_main, d) != 0) {
        free(d->buckets);
        free(d);
        return NULL;
    }
    d->running = 1;
    return d;
}

EXPORT void dp_tier(struct dp *d, int slot, const char *dir)
{
    if (slot < 0 || slot >= MONARCH_MAX_SLOTS)
        return;
    struct statfs sf;
    int in_ram = statfs(dir, &sf) == 0 && ((unsigned long)sf.f_type & 0xFFFFFFFFUL) == 0x01021994UL;  /* TMPFS_MAGIC */
    pthread_mutex_lock(&d->mu);
    free(d->tiers[slot]);
    d->tiers[slot] = strdup(dir);
    d->in_ram[slot] = (unsigned char)in_ram;
    pthread_mutex_unlock(&d->mu);
}

EXPORT void dp_index(struct dp *d, const unsigned char *p, uint64_t n)
{
    monarch_crc_init();                 /* (offers are found by their keys' CRC in it) */
    pthread_mutex_lock(&d->mu);
    renumber_offers_locked(d, p, (size_t)n);
    d->index_next = p;
    d->index_next_len = (size_t)n;
    d->index_lent = 1;
    pthread_mutex_unlock(&d->mu);
}

/* Node ``node`` is lost (Python's liveness said so): its fetches end at once, DP_LOST. */
EXPORT void dp_lost(struct dp *d, int node)
{
    if (node >= 0 && node < DP_MAX_PEERS)
        __atomic_fetch_or(&d->lost[node / 8], (unsigned char)(1u << (node % 8)), __ATOMIC_RELAXED);
}

/* The reply in f->buf checked against the request (an owner's bytes are not trusted): each file
 * answered ST_OK has its bytes at at[i] (in f->buf) and results[i] its size, any other results[i]
 * DP_HANDED_BACK; or every result DP_CORRUPT. */
static void reply_files(struct dp_request *f, const uint64_t *sizes, const char **at, int64_t *results)
{
    struct reply_header h;
    memcpy(&h, f->buf, sizeof h);
    size_t head = sizeof h + (size_t)f->n * sizeof(struct reply_item);
    const struct reply_item *items = (const struct reply_item *)(f->buf + sizeof h);
    uint64_t bytes = 0;
    int bad = h.n != (uint32_t)f->n || (size_t)f->got < head;
    for (int i = 0; !bad && i < f->n; i++) {
        struct reply_item r;
        memcpy(&r, &items[i], sizeof r);
        bad = (r.status == ST_OK && r.size != sizes[i]) ||
              (r.status != ST_OK && ((r.status != ST_HANDED_BACK && r.status != ST_COMING) || r.size));
        bytes += r.size;
    }
    bad = bad || (uint64_t)f->got != head + bytes;
    const char *next = f->buf + head;
    for (int i = 0; i < f->n; i++) {
        struct reply_item r;
        memcpy(&r, &items[i], sizeof r);
        at[i] = !bad && r.status == ST_OK ? next : NULL;
        results[i] = bad ? DP_CORRUPT : r.status == ST_OK ? (int64_t)r.size : r.status == ST_COMING ? DP_COMING : DP_HANDED_BACK;
        next += bad ? 0 : r.size;
    }
}

/* Files fetched and their bytes, counted. */
static void count_fetched(struct dp *d, const int64_t *results, int n)
{
    uint64_t files = 0, bytes = 0;
    for (int i = 0; i < n; i++)
        if (results[i] >= 0) {
            files++;
            bytes += (uint64_t)results[i];
        }
    pthread_mutex_lock(&d->mu);
    d->fetched_files += files;
    d->fetched_bytes += bytes;
    pthread_mutex_unlock(&d->mu);
}

/* The reply in f->buf checked (reply_files) and each file answered ST_OK written into its
 * descriptor: results[i] its bytes, or a DP_* answer. */
static void deliver(struct dp *d, struct dp_request *f, const uint64_t *sizes, const int *fds, int64_t *results, int at_zero)
{
    const char *at[DP_BATCH_FILES_MAX];
    reply_files(f, sizes, at, results);
    for (int i = 0; i < f->n; i++)
        if (at[i] && monarch_write_all(fds[i], at[i], (uint64_t)results[i], at_zero) != 0)
            results[i] = DP_LOCAL_IO;
    count_fetched(d, results, f->n);
}

/* The calling thread's timer slack at 1 us, once: its short sleeps while it polls. */
static void short_sleeps(void)
{
    static __thread int set;
    if (!set) {
        prctl(PR_SET_TIMERSLACK, 1000UL);
        set = 1;
    }
}

/* One request of ``n`` files to ``owner`` posted (its receive, then its send): *out is the fetch
 * and the answer WAITING, or DP_MPI_ERROR with the fetch to finish (finish_batch); or a DP_*
 * with *out NULL (nothing posted: a file not for this path, no memory, the stop, a lost owner). */
static int post_batch(struct dp *d, int owner, int n, const char *const *keys, const int *lens, const uint64_t *sizes,
                      const struct request_span *span, uint32_t flags, struct dp_request **out, int *posted)
{
    uint64_t bytes = 0, keys_len = 0;
    *out = NULL;
    *posted = 0;
    int why = n <= 0 || n > DP_BATCH_FILES_MAX || (span && n != 1) || owner < 0 || owner >= d->size ||
              owner == d->rank ? DP_HANDED_BACK : 0;
    for (int i = 0; !why && i < n; i++) {
        why = lens[i] <= 0 || lens[i] > DP_KEY_MAX || (!span && sizes[i] > DP_BATCH_BYTES_MAX) ? DP_HANDED_BACK : 0;
        bytes += sizes[i];
        keys_len += (uint64_t)(lens[i] > 0 ? lens[i] : 0);
    }
    if (span) {                         /* a span of the file (n == 1): its bytes come back */
        bytes = span->length;
        flags |= REQ_RANGE;
        if (!why && (span->length == 0 || span->length > DP_RANGE_MAX || span->offset > sizes[0] ||
                     span->length > sizes[0] - span->offset))
            why = DP_HANDED_BACK;
    } else if (!why && bytes > DP_BATCH_BYTES_MAX) {
        why = DP_HANDED_BACK;
    }
    struct dp_request *f = why ? NULL : calloc(1, sizeof *f);
    size_t head = sizeof(struct request_header) + (size_t)n * sizeof(struct request_item) + (span ? sizeof *span : 0);
    if (!why && (!f || !(f->buf = malloc(sizeof(struct reply_header) + (size_t)n * sizeof(struct reply_item) + bytes)) ||
                 !(f->req = malloc(head + keys_len))))
        why = DP_LOCAL_IO;
    if (why) {
        if (f)
            free_fetch(f);
        return why;
    }
    f->owner = owner;
    f->n = n;
    f->span = span != NULL && span->length > SPAN_PAGES_MAX;
    f->req_len = (int)(head + keys_len);
    struct request_item *items = (struct request_item *)(f->req + sizeof(struct request_header));
    char *k = f->req + head;
    for (int i = 0; i < n; i++) {
        struct request_item it = {.size = sizes[i], .len = (uint32_t)lens[i]};
        memcpy(&items[i], &it, sizeof it);
        memcpy(k, keys[i], (size_t)lens[i]);
        k += lens[i];
    }
    if (span)                           /* between the items and the keys */
        memcpy(items + n, span, sizeof *span);
    pthread_mutex_lock(&d->mu);
    why = !d->running || __atomic_load_n(&d->stop, __ATOMIC_ACQUIRE) ? DP_STOPPED : lost_node(d, owner) ? DP_LOST : 0;
    if (why) {
        pthread_mutex_unlock(&d->mu);
        free_fetch(f);
        return why;
    }
    int tag = d->next_tag;
    while (tag_in_use_locked(d, tag))
        tag = tag < d->tag_ub ? tag + 1 : FIRST_TAG;
    d->next_tag = tag < d->tag_ub ? tag + 1 : FIRST_TAG;
    f->tag = tag;
    struct request_header rh = {.tag = (uint32_t)tag, .n = (uint16_t)n, .flags = (uint16_t)flags};
    memcpy(f->req, &rh, sizeof rh);
    f->next = d->active;
    d->active = f;
    d->requests++;
    pthread_mutex_unlock(&d->mu);

    *out = f;
    int cap = (int)(sizeof(struct reply_header) + (size_t)n * sizeof(struct reply_item) + bytes);
    *posted = MPI_Irecv(f->buf, cap, MPI_BYTE, owner, tag, d->comm, &f->recv) == MPI_SUCCESS;
    if (!*posted) {
        f->sent = 1;
        return DP_MPI_ERROR;
    }
    if (MPI_Isend(f->req, f->req_len, MPI_BYTE, owner, TAG_REQUEST, d->comm, &f->send) != MPI_SUCCESS) {
        f->sent = 1;                    /* nothing was sent: no answer will come; the receive stays posted */
        return DP_MPI_ERROR;
    }
    return WAITING;
}

/* A posted fetch ended with answer ``why`` (look's): each file answered ST_OK written into
 * its descriptor (see dp_fetch_many; ``at_zero``: with pwrite at offset 0, else from each
 * descriptor's offset), or, with ``kept``, the fetch left whole to the caller (*kept = why) to
 * read and free; one whose receive is still ``posted`` is left to the owner's thread (an
 * orphan). Returns ``why``. */
static int finish_batch(struct dp *d, struct dp_request *f, int why, int posted, const uint64_t *sizes, const int *fds,
                        int64_t *results, int at_zero, int *kept)
{
    pthread_mutex_lock(&d->mu);
    if (why == DP_MPI_ERROR)
        __atomic_add_fetch(&d->mpi_errors, 1, __ATOMIC_RELAXED);
    if (posted) {                       /* still waiting for an answer: the owner's thread's now */
        f->orphan = 1;
        pthread_mutex_unlock(&d->mu);
        return why;
    }
    unlist_locked(d, f);
    pthread_mutex_unlock(&d->mu);
    if (!f->sent)
        MPI_Wait(&f->send, MPI_STATUS_IGNORE);  /* answered, so the request arrived: done at once */
    if (kept) {                         /* the caller reads the reply, then frees it */
        *kept = why;
        return why;
    }
    if (why == 0)
        deliver(d, f, sizes, fds, results, at_zero);
    free_fetch(f);
    return why;
}

/* One request of ``n`` files to ``owner``, one reply (see dp_fetch_many): 0, or a DP_* for the whole batch. */
static int fetch_batch(struct dp *d, int owner, int n, const char *const *keys, const int *lens, const uint64_t *sizes,
                       const int *fds, int64_t *results, int timeout_ms, int at_zero)
{
    struct dp_request *f;
    int posted, why = post_batch(d, owner, n, keys, lens, sizes, NULL, REQ_WAITED, &f, &posted);
    if (!f)
        return why;
    if (why == WAITING)
        wait_answer(d, f, monarch_now_ns() + (int64_t)timeout_ms * 1000000LL, &why, &posted);
    return finish_batch(d, f, why, posted, sizes, fds, results, at_zero, NULL);
}

/* Fetch ``key`` (``size`` bytes in the requester's snapshot) from node ``owner`` into ``fd``
 * (written from its current offset): the bytes written, or a DP_* answer. Waits at most
 * ``timeout_ms``. Any thread, several at once. */
EXPORT int64_t dp_fetch(struct dp *d, int owner, const char *key, int len, uint64_t size, int fd, int timeout_ms)
{
    short_sleeps();
    int64_t result = DP_HANDED_BACK;
    int why = fetch_batch(d, owner, 1, &key, &len, &size, &fd, &result, timeout_ms, 0);
    return why ? why : result;
}

/* Fetch ``n`` files from node ``owner`` in one request and one reply message: ``keys[i]``
 * (``lens[i]`` bytes), ``sizes[i]`` as this node's snapshot gives them; each file's bytes are
 * written into ``fds[i]`` at offset 0 (pwrite: fresh empty files or memfds, their offsets left
 * alone). ``results[i]``: the bytes written, or a DP_* answer for that file (DP_HANDED_BACK: not
 * staged there, compressed, another size: Python's protocol fetches it). Returns 0 once the
 * reply came (each result says), or a DP_* for the whole batch (then every result is that
 * too). At most DP_BATCH_FILES_MAX files of DP_BATCH_BYTES_MAX bytes together, else
 * DP_HANDED_BACK for all. Waits at most ``timeout_ms``. Any thread, several at once. */
EXPORT int dp_fetch_many(struct dp *d, int owner, int n, const char *const *keys, const int *lens,
                         const uint64_t *sizes, const int *fds, int64_t *results, int timeout_ms)
{
    short_sleeps();
    int why = fetch_batch(d, owner, n, keys, lens, sizes, fds, results, timeout_ms, 1);
    for (int i = 0; why && i < n; i++)
        results[i] = why;
    return why;
}

/* The entries peers want now (want), taken by the door's read-ahead lane (see dp_take_wanted_fn). */
EXPORT int dp_take_wanted(struct dp *d, uint32_t *entries, int most, int on)
{
    pthread_mutex_lock(&d->mu);
    d->wanted_on = on;
    int n = on ? (most < d->nwanted ? most : d->nwanted) : 0;
    if (n > 0) {
        memcpy(entries, d->wanted, (size_t)n * sizeof *entries);
        memmove(d->wanted, d->wanted + n, (size_t)(d->nwanted - n) * sizeof *entries);
        for (int i = 0; i < n; i++) {
            d->taken[d->taken_next] = entries[i];
            d->taken_next = (d->taken_next + 1) % WANTED_MAX;
            d->ntaken += d->ntaken < WANTED_MAX;
        }
    }
    d->nwanted = on ? d->nwanted - n : 0;
    pthread_mutex_unlock(&d->mu);
    return n;
}

/* Files' stats from node ``owner``'s index (see dp_describe_fn): a fetch of each one's 112 bytes. */
EXPORT int dp_describe(struct dp *d, int owner, int n, const char *const *keys, const int *lens,
                       struct monarch_index_entry *out, int64_t *results, int wanted, int timeout_ms)
{
    short_sleeps();
    uint64_t sizes[DP_BATCH_FILES_MAX];
    const char *at[DP_BATCH_FILES_MAX];
    struct dp_request *f = NULL;
    int posted = 0, kept = 0, why = n > 0 && n <= DP_BATCH_FILES_MAX ? 0 : DP_HANDED_BACK;
    for (int i = 0; !why && i < n; i++)
        sizes[i] = sizeof *out;
    if (!why)
        why = post_batch(d, owner, n, keys, lens, sizes, NULL, REQ_WAITED | REQ_DESCRIBE | (wanted ? REQ_WANTED : 0), &f, &posted);
    if (f && why == WAITING)
        wait_answer(d, f, monarch_now_ns() + (int64_t)timeout_ms * 1000000LL, &why, &posted);
    if (f && finish_batch(d, f, why, posted, NULL, NULL, NULL, 0, &kept) == 0) {
        reply_files(f, sizes, at, results);
        for (int i = 0; i < n; i++)
            if (at[i])
                memcpy(&out[i], at[i], sizeof *out);
    } else if (f && !posted) {
        free_fetch(f);                  /* (else an orphan: the owner's thread frees it) */
        f = NULL;
    }
    if (why || !f) {
        for (int i = 0; i < n; i++)
            results[i] = why ? why : DP_HANDED_BACK;
        return why ? why : DP_HANDED_BACK;
    }
    free_fetch(f);
    return 0;
}

/* A span of large file ``key`` from node ``owner``'s staged blocks: one request, one reply of the
 * span's bytes, written into ``fd`` at ``offset``, or copied to ``dst`` (not NULL). */
static int64_t fetch_span(struct dp *d, int owner, const char *key, int len, uint64_t size, int64_t mtime_ns,
                          uint64_t offset, uint64_t length, int fd, char *dst, int timeout_ms)
{
    short_sleeps();
    struct request_span span = {.offset = offset, .length = length, .mtime_ns = mtime_ns};
    struct dp_request *f;
    int posted, why = post_batch(d, owner, 1, &key, &len, &size, &span, REQ_WAITED | (dst ? REQ_PAGES : 0), &f,
                                 &posted);
    if (!f)
        return why;
    f->pages = dst != NULL;
    if (why == WAITING)
        wait_answer(d, f, monarch_now_ns() + (int64_t)timeout_ms * 1000000LL, &why, &posted);
    int kept = why;
    if (finish_batch(d, f, why, posted, NULL, NULL, NULL, 0, &kept) != 0) {
        if (!posted)                    /* (else an orphan: the owner's thread frees it) */
            free_fetch(f);
        return why;
    }
    const char *at = NULL;
    int64_t result = DP_HANDED_BACK;
    reply_files(f, &length, &at, &result);
    if (at && dst) {
        memcpy(dst, at, length);
        at = NULL;
    }
    for (uint64_t put = 0; at && put < length;) {
        ssize_t w = pwrite(fd, at + put, length - put, (off_t)(offset + put));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            result = DP_LOCAL_IO;
            break;
        }
        put += (uint64_t)w;
    }
    free_fetch(f);
    if (result >= 0) {
        pthread_mutex_lock(&d->mu);
        d->fetched_ranges++;
        d->fetched_range_bytes += (uint64_t)result;
        pthread_mutex_unlock(&d->mu);
    }
    return result;
}

/* Fetch a span of large file ``key`` from node ``owner``'s staged blocks (datapath.h): one request,
 * one reply of the span's bytes, written into ``fd`` at ``offset``. Any thread, several at once. */
EXPORT int64_t dp_fetch_range(struct dp *d, int owner, const char *key, int len, uint64_t size, int64_t mtime_ns,
                              uint64_t offset, uint64_t length, int fd, int timeout_ms)
{
    return fetch_span(d, owner, key, len, size, mtime_ns, offset, length, fd, NULL, timeout_ms);
}

/* ... a few pages of it, copied to ``dst`` (a fault's: the front door's answer to a shim's PAGES) */
EXPORT int64_t dp_fetch_pages(struct dp *d, int owner, const char *key, int len, uint64_t size, int64_t mtime_ns,
                              uint64_t offset, uint64_t length, char *dst, int timeout_ms)
{
    return fetch_span(d, owner, key, len, size, mtime_ns, offset, length, -1, dst, timeout_ms);
}

/* A request of ``n`` files to node ``owner`` (as dp_fetch_many's) posted, not waited for: a
 * handle for dp_test and dp_take, which its caller (one thread) must end with dp_take; or NULL
 * with *why a DP_* (nothing posted: not for this path, no memory, the stop, a lost owner). The
 * caller keeps ``keys`` and ``sizes`` until dp_take. Given up ``timeout_ms`` after now. So one
 * thread keeps many owners' requests in flight at once and polls them as it likes (the front
 * door's peer read-ahead: gathering the next while the last are on their way; its transparent
 * fetches: serving other opens while the answer is due). ``waited``: an application's open
 * waits on it (the owner then looks for requests more often: poll_pace.h). */
EXPORT struct dp_request *dp_post(struct dp *d, int owner, int n, const char *const *keys, const int *lens,
                                  const uint64_t *sizes, int waited, int timeout_ms, int *why)
{
    struct dp_request *f;
    int posted, w = post_batch(d, owner, n, keys, lens, sizes, NULL, waited ? REQ_WAITED : 0, &f, &posted);
    *why = w;
    if (!f)
        return NULL;
    short_sleeps();
    f->why = w;
    f->posted = posted;
    f->posted_ns = monarch_now_ns();
    f->deadline = f->posted_ns + (int64_t)timeout_ms * 1000000LL;
    *why = 0;
    return f;
}

/* One look at a posted request (no sleep): 1 once it ended (answered, failed, its owner lost,
 * the stop, its deadline), else 0. */
EXPORT int dp_test(struct dp *d, struct dp_request *f)
{
    if (f->why == WAITING && !look(d, f, &f->why, &f->posted, f->posted_ns)) {
        int stopped = __atomic_load_n(&d->stop, __ATOMIC_ACQUIRE);
        if (stopped || monarch_now_ns() >= f->deadline)
            f->why = stopped ? DP_STOPPED : DP_TIMEOUT;
    }
    return f->why != WAITING;
}

/* A posted request ended: its reply checked and handed to ``got`` (``sizes``: the request's, as
 * posted; ``results``: n of them, written), then the handle freed. One still waiting is given up
 * (DP_STOPPED: its receive left to the owner's thread). */
EXPORT void dp_take(struct dp *d, struct dp_request *f, const uint64_t *sizes, int64_t *results, dp_reply_fn *got,
                    void *arg)
{
    const char *at[DP_BATCH_FILES_MAX] = {0};
    int n = f->n, why = f->why == WAITING ? DP_STOPPED : f->why, posted = f->posted;
    if (finish_batch(d, f, why, posted, sizes, NULL, NULL, 0, &why) == 0) {
        reply_files(f, sizes, at, results);
        count_fetched(d, results, n);
    } else {
        for (int i = 0; i < n; i++)
            results[i] = why;
    }
    got(arg, at, results);
    if (!posted)
        free_fetch(f);
}

/* The counters (datapath.h: struct dp_counts). */
EXPORT void dp_counts(struct dp *d, struct dp_counts *out)
{
    pthread_mutex_lock(&d->mu);
    *out = (struct dp_counts){
        .served_files = d->served_files,
        .served_bytes = d->served_bytes,
        .handed_back = d->handed_back,
        .fetched_files = d->fetched_files,
        .fetched_bytes = d->fetched_bytes,
        .mpi_errors = __atomic_load_n(&d->mpi_errors, __ATOMIC_RELAXED),
        .offered = d->nstaged,
        .requests = d->requests,
        .served_requests = d->served_requests,
        .waits = __atomic_load_n(&d->waits, __ATOMIC_RELAXED),
        .idle_sleeps = __atomic_load_n(&d->idle_sleeps, __ATOMIC_RELAXED),
        .served_ranges = d->served_ranges,
        .served_range_bytes = d->served_range_bytes,
        .fetched_ranges = d->fetched_ranges,
        .fetched_range_bytes = d->fetched_range_bytes,
    };
    pthread_mutex_unlock(&d->mu);
}

/* Stop the thread; fetches under way end DP_STOPPED. Requests still posted are left to MPI
 * (a peer may be dead: waiting for them could hang); their buffers are not freed. */
EXPORT void dp_stop(struct dp *d)
{
    if (!d->running)
        return;
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
    pthread_join(d->thread, NULL);
    close_let_go(d);
    pthread_mutex_lock(&d->mu);
    d->running = 0;
    close_kept_locked(d);               /* no read is left: the kept descriptors go now, and later ones at once */
    pthread_mutex_unlock(&d->mu);
}
