/* The peer data path in C: a file another node holds staged crosses without Python on either
 * side (issue 31). One thread owns a communicator of its own (a Dup of the cluster's, so its
 * tags never meet the Python engine's) and makes every MPI call on it; MPI runs at
 * MPI_THREAD_MULTIPLE, since the Python engine keeps the control plane on the other
 * communicator (heartbeats, the snapshot, losses, shutdown, and every file this path hands back).
 *
 * Owner: a request names a key and the size the requester's snapshot gives it. A key Python
 * listed as staged here, raw, of that size and at most ONE_MESSAGE_MAX, is read and sent back
 * in one message (a header, then the bytes) from this thread. Anything else (not staged yet,
 * compressed, larger, another size, a read error) is answered DP_PYTHON: the requester asks
 * again through Python's protocol, which stages, streams in chunks, decodes and refuses.
 *
 * Requester: ``dp_fetch`` (called from a Python fetching thread, which ctypes lets go of the
 * GIL) posts the receive and the request through this thread and sleeps on a condition until
 * the answer, a loss (``dp_lost``), the stop or its deadline; then writes the bytes into the
 * destination itself. A fetch that gave up leaves its receive posted (and its buffer owned
 * here) until the answer comes, so a late answer never lands in another fetch's buffer.
 *
 * MPI offers nothing to sleep on: the thread polls, without sleeping for SPIN_NS after any
 * progress while something is under way, then with the shortest sleep while busy in the last
 * ACTIVE_NS, then sleeping longer and longer up to IDLE_MAX_NS (an idle owner's answer waits
 * that at most).
 */
#define _GNU_SOURCE
#include <mpi.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

#define TAG_REQUEST 1
#define FIRST_TAG 16
#define ONE_MESSAGE_MAX (4 << 20)     /* larger files take Python's chunked path */
#define KEY_MAX 4096
#define MAX_SLOTS 16
#define SPIN_NS 50000LL               /* after progress, look again at once this long ... */
#define IDLE_MIN_NS 10000LL           /* ... then sleep this long (timer slack 1 us: dp_main) ... */
#define ACTIVE_NS 50000000LL          /* ... while busy this recently, else doubling up to: */
#define IDLE_MAX_NS 500000LL          /* an idle owner answers within this */
#define MAX_PEERS 65536

/* dp_fetch's answers (>= 0: the file's bytes written) */
enum { DP_PYTHON = -1, DP_TIMEOUT = -2, DP_MPI_ERROR = -3, DP_CORRUPT = -4, DP_LOCAL_IO = -5, DP_STOPPED = -6,
       DP_LOST = -7 };
enum { ST_OK = 0, ST_PYTHON = 1 };

struct reply_header { int32_t status; uint32_t pad; uint64_t size; };       /* then the bytes */
struct request_header { uint32_t tag; uint32_t pad; uint64_t size; };       /* then the key */

struct staged { struct staged *next; uint32_t hash, len; uint8_t slot; char key[]; };

struct fetch {                          /* one requester's wait; owned by the engine once posted */
    struct fetch *next;                 /* the submission queue, then the in-flight list */
    int owner, tag, done, result, abandoned;
    uint64_t size;
    MPI_Request recv;
    char *buf;                          /* reply header + bytes */
    struct request_header *req;         /* header + key, sent */
    MPI_Request send;
    int sent;
    pthread_cond_t cv;
};

struct sending { struct sending *next; MPI_Request req; char *buf; };

struct dp {
    MPI_Comm comm;
    int rank, size, tag_ub;
    pthread_t thread;
    pthread_mutex_t mu;
    int stop, running;
    struct fetch *submitted, *inflight;
    struct sending *sends;
    int next_tag;
    struct staged **buckets;
    uint32_t nbuckets, nstaged;
    char *tiers[MAX_SLOTS];
    unsigned char lost[MAX_PEERS / 8];
    uint64_t served_files, served_bytes, handed_back, fetched_files, fetched_bytes, mpi_errors;
};

static uint32_t hash_of(const char *p, size_t n)   /* FNV-1a */
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

static struct staged **find_locked(struct dp *d, const char *key, uint32_t len, uint32_t h)
{
    struct staged **p = &d->buckets[h & (d->nbuckets - 1)];
    while (*p && !((*p)->hash == h && (*p)->len == len && !memcmp((*p)->key, key, len)))
        p = &(*p)->next;
    return p;
}

static void grow_locked(struct dp *d)
{
    uint32_t n = d->nbuckets * 2;
    struct staged **b = calloc(n, sizeof *b);
    if (!b)
        return;                         /* longer chains, still right */
    for (uint32_t i = 0; i < d->nbuckets; i++)
        for (struct staged *s = d->buckets[i], *next; s; s = next) {
            next = s->next;
            s->next = b[s->hash & (n - 1)];
            b[s->hash & (n - 1)] = s;
        }
    free(d->buckets);
    d->buckets = b;
    d->nbuckets = n;
}

/* -- the owner's side: one request, answered from this thread ----------------------------- */
static char *read_staged(struct dp *d, const char *key, uint32_t len, uint64_t size)
{
    char path[PATH_MAX];
    pthread_mutex_lock(&d->mu);
    struct staged *s = *find_locked(d, key, len, hash_of(key, len));
    const char *dir = s ? d->tiers[s->slot] : NULL;
    int n = dir ? snprintf(path, sizeof path, "%s/%.*s", dir, (int)len, key) : -1;
    pthread_mutex_unlock(&d->mu);
    if (n < 0 || n >= (int)sizeof path || size > ONE_MESSAGE_MAX)
        return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == size && (buf = malloc(sizeof(struct reply_header) + size))) {
        char *at = buf + sizeof(struct reply_header);
        uint64_t got = 0;
        while (got < size) {
            ssize_t r = pread(fd, at + got, size - got, (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (uint64_t)r;
        }
        if (got != size) {
            free(buf);
            buf = NULL;
        }
    }
    close(fd);
    return buf;
}

static void answer(struct dp *d, int src, const char *msg, int count)
{
    struct request_header rh;
    if (count < (int)sizeof rh || count - (int)sizeof rh > KEY_MAX)
        return;                         /* not ours to answer: the requester's deadline does */
    memcpy(&rh, msg, sizeof rh);
    uint32_t len = (uint32_t)count - sizeof rh;
    char *buf = read_staged(d, msg + sizeof rh, len, rh.size);
    struct reply_header h = {.status = buf ? ST_OK : ST_PYTHON, .size = buf ? rh.size : 0};
    if (!buf && !(buf = malloc(sizeof h)))
        return;
    memcpy(buf, &h, sizeof h);
    struct sending *s = malloc(sizeof *s);
    if (!s || MPI_Isend(buf, (int)(sizeof h + h.size), MPI_BYTE, src, (int)rh.tag, d->comm, &s->req) != MPI_SUCCESS) {
        d->mpi_errors++;
        free(s);
        free(buf);
        return;
    }
    s->buf = buf;
    s->next = d->sends;
    d->sends = s;
    pthread_mutex_lock(&d->mu);
    if (h.status == ST_OK) {
        d->served_files++;
        d->served_bytes += h.size;
    } else {
        d->handed_back++;
    }
    pthread_mutex_unlock(&d->mu);
}

static int take_requests(struct dp *d)
{
    int n = 0;
    for (; n < 64; n++) {
        int flag = 0;
        MPI_Message m;
        MPI_Status st;
        if (MPI_Improbe(MPI_ANY_SOURCE, TAG_REQUEST, d->comm, &flag, &m, &st) != MPI_SUCCESS) {
            d->mpi_errors++;
            break;                      /* ULFM: a peer died; Python's engine finds out who */
        }
        if (!flag)
            break;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        char *msg = malloc(count > 0 ? (size_t)count : 1);
        if (!msg || MPI_Mrecv(msg, count, MPI_BYTE, &m, &st) != MPI_SUCCESS) {
            d->mpi_errors++;
            free(msg);
            continue;
        }
        answer(d, st.MPI_SOURCE, msg, count);
        free(msg);
    }
    return n;
}

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

/* -- the requester's side ----------------------------------------------------------------- */
static void finish_locked(struct fetch *f, int result)
{
    f->done = 1;
    f->result = result;
    pthread_cond_signal(&f->cv);
}

static void free_fetch(struct fetch *f)
{
    pthread_cond_destroy(&f->cv);
    free(f->buf);
    free(f->req);
    free(f);
}

static int tag_in_use(struct dp *d, int tag)
{
    for (struct fetch *f = d->inflight; f; f = f->next)
        if (f->tag == tag)
            return 1;
    return 0;
}

static void post_locked(struct dp *d, struct fetch *f)
{
    int tag = d->next_tag;
    while (tag_in_use(d, tag))
        tag = tag < d->tag_ub ? tag + 1 : FIRST_TAG;
    d->next_tag = tag < d->tag_ub ? tag + 1 : FIRST_TAG;
    f->tag = tag;
    f->req->tag = (uint32_t)tag;
    int len = (int)(sizeof(struct reply_header) + f->size);
    if (MPI_Irecv(f->buf, len, MPI_BYTE, f->owner, tag, d->comm, &f->recv) != MPI_SUCCESS) {
        d->mpi_errors++;
        if (f->abandoned)
            free_fetch(f);
        else
            finish_locked(f, DP_MPI_ERROR);
        return;
    }
    f->next = d->inflight;
    d->inflight = f;
    if (MPI_Isend(f->req, (int)(sizeof *f->req + f->req->pad), MPI_BYTE, f->owner, TAG_REQUEST, d->comm,
                  &f->send) != MPI_SUCCESS) {
        d->mpi_errors++;
        f->sent = 1;                    /* nothing to wait for; the receive stays posted (a late answer lands here) */
        finish_locked(f, DP_MPI_ERROR);
    }
}

static int progress_fetches(struct dp *d)
{
    int n = 0;
    pthread_mutex_lock(&d->mu);
    for (struct fetch *f = d->submitted, *next; f; f = next) {
        next = f->next;
        post_locked(d, f);
        n++;
    }
    d->submitted = NULL;
    for (struct fetch **p = &d->inflight; *p;) {
        struct fetch *f = *p;
        if (!f->sent) {
            int flag = 0;
            if (MPI_Test(&f->send, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                f->sent = 1;
                d->mpi_errors++;
            } else if (flag) {
                f->sent = 1;
            }
        }
        int flag = 0;
        MPI_Status st;
        int rc = MPI_Test(&f->recv, &flag, &st);
        if (rc == MPI_SUCCESS && !flag) {
            p = &f->next;
            continue;
        }
        if (!f->sent && rc == MPI_SUCCESS) {   /* answered before MPI let go of the request */
            MPI_Wait(&f->send, MPI_STATUS_IGNORE);
        } else if (!f->sent) {          /* a dead owner: never wait on it; its buffer goes with it */
            MPI_Request_free(&f->send);
            f->req = NULL;
        }
        *p = f->next;
        n++;
        int result = DP_MPI_ERROR;
        if (rc != MPI_SUCCESS) {
            d->mpi_errors++;
        } else {
            int count = 0;
            MPI_Get_count(&st, MPI_BYTE, &count);
            struct reply_header h;
            if (count >= (int)sizeof h) {
                memcpy(&h, f->buf, sizeof h);
                if (h.status == ST_PYTHON)
                    result = DP_PYTHON;
                else if (h.status != ST_OK || h.size != f->size || (uint64_t)count != sizeof h + f->size)
                    result = DP_CORRUPT;
                else
                    result = 0;
            } else {
                result = DP_CORRUPT;
            }
        }
        if (f->abandoned)
            free_fetch(f);
        else if (!f->done)
            finish_locked(f, result);
        /* else ended already (lost, stopped): its waiter, about to wake, frees it */
    }
    pthread_mutex_unlock(&d->mu);
    return n;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *dp_main(void *arg)
{
    struct dp *d = arg;
    prctl(PR_SET_TIMERSLACK, 1000UL);   /* the default 50 us would set the pace of every remote open */
    prctl(PR_SET_NAME, "monarch-data");
    int64_t idle = IDLE_MIN_NS, last_busy = now_ns();
    while (!__atomic_load_n(&d->stop, __ATOMIC_ACQUIRE)) {
        int busy = take_requests(d) + reap_sends(d) + progress_fetches(d);
        int64_t now = now_ns();
        if (busy) {
            last_busy = now;
            idle = IDLE_MIN_NS;
            continue;
        }
        pthread_mutex_lock(&d->mu);
        int under_way = d->inflight || d->submitted || d->sends;
        pthread_mutex_unlock(&d->mu);
        if (under_way && now - last_busy < SPIN_NS) {
            sched_yield();              /* an answer is due within microseconds: a sleep would cost ~60 us here */
            continue;
        }
        if (under_way || now - last_busy < ACTIVE_NS)
            idle = IDLE_MIN_NS;         /* recently busy: the next request is likely near */
        struct timespec ts = {0, idle};
        nanosleep(&ts, NULL);
        idle = idle * 2 > IDLE_MAX_NS ? IDLE_MAX_NS : idle * 2;
    }
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
    if (slot < 0 || slot >= MAX_SLOTS)
        return;
    pthread_mutex_lock(&d->mu);
    free(d->tiers[slot]);
    d->tiers[slot] = strdup(dir);
    pthread_mutex_unlock(&d->mu);
}

EXPORT void dp_staged(struct dp *d, const char *key, int len, int slot)
{
    if (len <= 0 || len > KEY_MAX || slot < 0 || slot >= MAX_SLOTS)
        return;
    uint32_t h = hash_of(key, (size_t)len);
    pthread_mutex_lock(&d->mu);
    struct staged **p = find_locked(d, key, (uint32_t)len, h);
    if (*p) {
        (*p)->slot = (uint8_t)slot;
    } else {
        struct staged *s = malloc(sizeof *s + (size_t)len);
        if (s) {
            s->next = NULL;
            s->hash = h;
            s->len = (uint32_t)len;
            s->slot = (uint8_t)slot;
            memcpy(s->key, key, (size_t)len);
            *p = s;
            if (++d->nstaged > 2 * d->nbuckets)
                grow_locked(d);
        }
    }
    pthread_mutex_unlock(&d->mu);
}

EXPORT void dp_forget(struct dp *d, const char *key, int len)
{
    if (len <= 0 || len > KEY_MAX)
        return;
    pthread_mutex_lock(&d->mu);
    struct staged **p = find_locked(d, key, (uint32_t)len, hash_of(key, (size_t)len));
    if (*p) {
        struct staged *s = *p;
        *p = s->next;
        free(s);
        d->nstaged--;
    }
    pthread_mutex_unlock(&d->mu);
}

/* Node ``node`` is lost (Python's liveness said so): its fetches end at once, DP_LOST. */
EXPORT void dp_lost(struct dp *d, int node)
{
    if (node < 0 || node >= MAX_PEERS)
        return;
    pthread_mutex_lock(&d->mu);
    d->lost[node / 8] |= (unsigned char)(1u << (node % 8));
    for (struct fetch *f = d->inflight; f; f = f->next)
        if (f->owner == node && !f->done)
            finish_locked(f, DP_LOST);
    pthread_mutex_unlock(&d->mu);
}

/* Fetch ``key`` (``size`` bytes in the requester's snapshot) from node ``owner`` into ``fd``
 * (written from its current offset): the bytes written, or a DP_* answer. Waits at most
 * ``timeout_ms``. Any thread; the caller's GIL is let go by ctypes. */
EXPORT int64_t dp_fetch(struct dp *d, int owner, const char *key, int len, uint64_t size, int fd, int timeout_ms)
{
    if (owner < 0 || owner >= d->size || owner == d->rank || len <= 0 || len > KEY_MAX)
        return DP_PYTHON;
    if (size > ONE_MESSAGE_MAX)
        return DP_PYTHON;
    struct fetch *f = calloc(1, sizeof *f);
    if (!f)
        return DP_LOCAL_IO;
    f->owner = owner;
    f->size = size;
    f->buf = malloc(sizeof(struct reply_header) + size);
    f->req = malloc(sizeof *f->req + (size_t)len);
    if (!f->buf || !f->req) {
        free(f->buf);
        free(f->req);
        free(f);
        return DP_LOCAL_IO;
    }
    f->req->size = size;
    f->req->pad = (uint32_t)len;     /* the key's length, for the send (not read by the owner) */
    memcpy(f->req + 1, key, (size_t)len);
    pthread_cond_init(&f->cv, NULL);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&d->mu);
    if (d->stop || !d->running || (d->lost[owner / 8] & (1u << (owner % 8)))) {
        int why = d->stop || !d->running ? DP_STOPPED : DP_LOST;
        pthread_mutex_unlock(&d->mu);
        free_fetch(f);
        return why;
    }
    f->next = d->submitted;
    d->submitted = f;
    while (!f->done && !d->stop)
        if (pthread_cond_timedwait(&f->cv, &d->mu, &deadline) == ETIMEDOUT)
            break;
    int64_t result = f->done ? f->result : d->stop ? DP_STOPPED : DP_TIMEOUT;
    int engine_owns = 0;
    for (struct fetch **p = &d->submitted; *p; p = &(*p)->next)
        if (*p == f) {                  /* never posted: nothing can land in it */
            *p = f->next;
            break;
        }
    for (struct fetch *g = d->inflight; g; g = g->next)
        engine_owns |= g == f;
    if (engine_owns)
        f->abandoned = 1;               /* its receive stays posted: the engine frees it with the answer */
    pthread_mutex_unlock(&d->mu);
    if (engine_owns)
        return result >= 0 ? DP_TIMEOUT : result;
    if (result == 0) {
        const char *at = f->buf + sizeof(struct reply_header);
        uint64_t put = 0;
        while (put < size) {
            ssize_t w = write(fd, at + put, size - put);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            put += (uint64_t)w;
        }
        result = put == size ? (int64_t)size : DP_LOCAL_IO;
        if (result >= 0) {
            pthread_mutex_lock(&d->mu);
            d->fetched_files++;
            d->fetched_bytes += size;
            pthread_mutex_unlock(&d->mu);
        }
    }
    free_fetch(f);
    return result;
}

/* out: files and bytes served from here, requests handed back to Python, files and bytes
 * fetched, MPI errors seen, keys listed as staged. */
EXPORT void dp_counts(struct dp *d, uint64_t *out)
{
    pthread_mutex_lock(&d->mu);
    out[0] = d->served_files;
    out[1] = d->served_bytes;
    out[2] = d->handed_back;
    out[3] = d->fetched_files;
    out[4] = d->fetched_bytes;
    out[5] = d->mpi_errors;
    out[6] = d->nstaged;
    pthread_mutex_unlock(&d->mu);
}

/* Stop the thread; waiting fetches end DP_STOPPED. Requests still posted are left to MPI
 * (a peer may be dead: waiting for them could hang); their buffers are not freed. */
EXPORT void dp_stop(struct dp *d)
{
    if (!d->running)
        return;
    __atomic_store_n(&d->stop, 1, __ATOMIC_RELEASE);
    pthread_join(d->thread, NULL);
    pthread_mutex_lock(&d->mu);
    d->running = 0;
    for (struct fetch *f = d->inflight; f; f = f->next)
        if (!f->done)
            finish_locked(f, DP_STOPPED);
    for (struct fetch *f = d->submitted; f; f = f->next)
        if (!f->done)
            finish_locked(f, DP_STOPPED);
    pthread_mutex_unlock(&d->mu);
}
