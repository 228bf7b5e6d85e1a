/* Part of front_door.c, one translation unit: included there, in order, after the types and the
 * parts before it (after door_peer.c). Here: the peer read-ahead lane, the clairvoyant path:
 * when the readers tell their order (monarch.hints), the other nodes' files of that order are
 * fetched ahead of the reader into the peer area, many per request and reply to each owner,
 * so that the reader's opens of them are local hits (the shim's tier probe).
 *
 * Python gives the lane the order as index entries (front_door_peer_ahead) and the reader's
 * progress (front_door_peer_progress), or the reader tells its progress to the door itself: a
 * connection whose first request is a HINT PROGRESS of the order's stream is answered and kept
 * here (peer_progress_frames), no interpreter per frame; Python's stager takes the last of them
 * when it drains the door (front_door_peer_told), woken for them at most every TOLD_WAKE_NS.
 * One thread of its own goes through the order: the next entries past the progress, no more
 * than ``window`` ahead, that are other nodes' small files the door has never heard of (a
 * staged, busy or Python's key is skipped; one evicted from the area is fetched again:
 * front_door_peer_gone); gathered by owner into batches of up to PA_BATCH files and
 * PA_BATCH_BYTES, each one request and one reply. Up to PA_FLIGHT batches are in flight at once
 * (the data path's dp_post, dp_test, dp_take: no thread and no sleep per request): as the
 * progress frees room the lane gathers and posts the next while the last are on their way, and
 * puts each reply's files in place as it comes (written to a temporary name, or over a spare,
 * and renamed into place, as fetch_from_peer does).
 *
 * The lane keeps its copies' books itself, in C (the ring): no event per file, nothing for
 * Python's LRU. Its room is taken out of the peer lease (Q_PEER) as it grows and given back
 * when the order ends; a copy the reader has consumed (its position below the progress, or of
 * an earlier order) is the first to go when a new one needs room (renamed aside as a spare that
 * a next fetch writes over, PA_SPARES, then renamed from there into its new place: the
 * descriptor it was written with kept on the ring, so going costs one rename), and one the
 * order asks for again before that is kept for its new position. An open of a copy being
 * unlinked parks and is handed to Python, as any open of a key the door gave up. Copies stay STAGED with ``ring`` set;
 * whatever else makes a key STAGED clears it, so the lane never unlinks a copy not its own.
 * A file the owner cannot give (not staged there, another size, compressed, a lost owner) is
 * handed to Python (K_PYTHON): its open goes through Python's protocol, which asks the owner,
 * or the new one. An open that comes before the lane fetched its file is the peer lane's
 * (door_peer.c), or parks on the lane's fetch under way, as on any BUSY key. The exports are
 * at the end of this part, beside the lane they drive. */

#define PA_BATCH 64                    /* files per request to one owner (dp_fetch_many's limit) */
#define PA_BATCH_BYTES (4LL << 20)     /* bytes per reply, at most (dp_fetch_many's limit) */
#define PA_FLIGHT 32                   /* batches at once (one owner's each): gathered, or in flight */
#define PA_WAIT_NS 20000000LL          /* no work or no room: look again after this */
#define PA_ROOM_WAKE_NS 5000000LL     /* a wait for room wakes Python (to lend more) at most this often */
#define PA_NOT_POSTED 1                /* pa_flight: no data path to post requests to (a test's callbacks) */
#define PA_POLL_MIN_NS 20000L          /* requests in flight: look again after at least this, ... */
#define PA_POLL_MAX_NS 500000L         /* ... doubling up to this (sooner when the reader's progress comes) */
#define PROGRESS_FRAMES_MAX 64        /* HINT PROGRESS requests read at once (monarch.hints: UNANSWERED_MAX) */
#define TOLD_WAKE_NS 10000000LL      /* a progress answered here wakes Python (its stager's) at most this often */
#define PA_STALE UINT32_MAX            /* a copy's position once its order was replaced: consumed */
#define PA_GRACE_MS 50                 /* a copy the door answered less than this ago is not unlinked */
#define PA_FDS_MAX 4096               /* ring copies whose descriptor is kept (retired by a rename alone), at
                                          most an eighth of the descriptor limit (pa_fds_allowed) */
#define PA_SPARES 64                   /* consumed copies kept (renamed aside, open) for the next fetches to
                                          write over: a new file where many were just unlinked costs more
                                          than its bytes (this VM's ext4 without a journal scans every inode
                                          freed in the last minutes at each create: 600 us a file in
                                          bench_cluster --hints; tmpfs and ext4 pay new pages, 2x rewriting) */

struct pa_file {                       /* one file of a batch under way */
    const char *key;
    uint32_t len, hash, pos, gen;      /* its position in the order, and the order's generation */
    struct idx_file f;
    int dir, fd;                       /* its directory in the peer area, its temporary copy */
    int aside;                         /* ``tmp`` is a spare's name in the area's top directory, not in ``dir`` */
    char tmp[64];
};

struct pa_copy {                       /* one copy of the ring: in the peer area, the lane's */
    uint32_t entry, pos;               /* its index entry; its position in the order (PA_STALE) */
    int64_t room;                      /* what it holds of the lane's room */
    int fd;                            /* the descriptor it was written with (kept: SIGURG on lease breaks), or -1 */
    mode_t mode;
};

struct pa_spare {                      /* a consumed copy renamed aside, to be written over */
    int fd;                            /* read-write, its lease breaks signalled with SIGURG (ignored) */
    mode_t mode;
    char name[40];                     /* in the area's top directory: MONARCH_TMP_PREFIX and a number */
};

struct pa_victim {                     /* a copy of the ring to unlink: its key (the index's) */
    const char *key;
    uint32_t len, hash;
    int fd;                            /* its kept descriptor, or -1 */
    mode_t mode;
};

enum { PB_FREE, PB_FILLING, PB_FLIGHT };

struct pa_batch {                      /* one owner's request of the lane's: being gathered, or in flight */
    int state, owner, n;
    int64_t bytes, posted_ns;
    void *h;                           /* the data path's, once posted (dp_post) */
    struct pa_file files[PA_BATCH];
    const char *keys[PA_BATCH];
    int lens[PA_BATCH];
    uint64_t sizes[PA_BATCH];
    int64_t results[PA_BATCH];
};

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
    int64_t room_woke_ns;              /* when a wait for room last woke Python */
    struct worker w;                   /* the lane's directory kept and temporary names, as a worker's */
    uint64_t orders, fetched, fetched_bytes, batches, failed, skipped, room_waits;
    uint64_t waited;                   /* opens that came while the lane fetched their file: answered after it */
    uint64_t kept, unlinked, reused;   /* copies asked for again before they went; unlinked; written over */
    struct pa_spare spares[PA_SPARES];
    int nspares, leases_off;           /* leases_off: the area's filesystem grants none: no spares */
    uint64_t spare_seq;
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

/* -- the ring: the lane's copies and their room ----------------------------------------------- */

/* ``e`` is a copy of the ring's (a STAGED key no other path has made its own since). */
static int ring_owns(const struct door *d, const struct entry *e)
{
    return e && e->state == K_STAGED && e->ring && e->slot == d->peer_slot;
}

/* The ring's copy of index entry ``entry`` asked for again, at position ``pos``: kept until the
 * reader is past it. Under the lock. */
static void ring_keep_locked(struct peer_ahead *pa, uint32_t entry, uint32_t pos)
{
    for (uint32_t i = pa->nring; i-- > 0;)
        if (pa->ring[i].entry == entry) {
            pa->kept += pa->ring[i].pos != pos;
            pa->ring[i].pos = pos;
            return;
        }
}

/* A ring copy's kept descriptor closed (it leaves the ring otherwise than as a victim). */
static void ring_close_fd(struct peer_ahead *pa, struct pa_copy *c)
{
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
        pa->nfds--;
    }
}

/* Room for ``need`` more bytes: consumed copies made victims (BUSY: unlinked before the next
 * requests go; their room counted free at once), else room taken from the lease. 1 if there is
 * room, 0 if not. Under the lock. */
static int ring_room_locked(struct door *d, struct peer_ahead *pa, int64_t need)
{
    uint32_t now = door_ms(d), kept = 0;
    for (uint32_t i = 0; i < pa->nring; i++) {
        struct pa_copy c = pa->ring[i];
        int short_of_room = pa->used + need > pa->room && pa->nvictims < PA_FLIGHT * PA_BATCH;
        struct idx_file f;
        const char *key;
        uint32_t len;
        if (!short_of_room || (c.pos != PA_STALE && c.pos >= pa->done) || !index_entry(d, c.entry, &f, &key, &len)) {
            pa->ring[kept++] = c;      /* not needed, or not consumed yet */
            continue;
        }
        uint32_t hash = monarch_crc32(key, len);
        struct entry *e = find(d, key, len, hash);
        if (!ring_owns(d, e)) {        /* no longer the ring's (another path took the key): its room only */
            pa->used -= c.room;
            ring_close_fd(pa, &c);
            continue;
        }
        if (e->answered && (uint32_t)(now - e->answered) < PA_GRACE_MS) {
            pa->ring[kept++] = c;      /* the door just named it to a reader */
            continue;
        }
        e->state = K_BUSY;             /* its opens park until it is gone, then go to Python */
        d->busy++;
        pa->victims[pa->nvictims++] = (struct pa_victim){key, len, hash, c.fd, c.mode};
        pa->nfds -= c.fd >= 0;
        pa->used -= c.room;
    }
    pa->nring = kept;
    if (pa->used + need <= pa->room)
        return 1;
    int64_t take = pa->used + need - pa->room;
    if (take > d->lease[Q_PEER])
        return 0;
    d->lease[Q_PEER] -= take;
    pa->room += take;
    return 1;
}

/* A new copy on the ring, its descriptor ``fd`` kept if fewer than PA_FDS_MAX are (else closed).
 * 0, or -1 (no memory: the caller unlinks it and closes ``fd``). Under the lock. */
static int ring_push_locked(struct peer_ahead *pa, uint32_t entry, uint32_t pos, int64_t room, int fd, mode_t mode)
{
    if (pa->nring == pa->ring_cap) {
        uint32_t cap = pa->ring_cap ? 2 * pa->ring_cap : 256;
        struct pa_copy *grown = realloc(pa->ring, (size_t)cap * sizeof *grown);
        if (!grown)
            return -1;
        pa->ring = grown;
        pa->ring_cap = cap;
    }
    if (fd >= 0 && pa->nfds >= pa->fds_cap) {
        close(fd);
        fd = -1;
    }
    pa->nfds += fd >= 0;
    pa->ring[pa->nring++] = (struct pa_copy){entry, pos, room, fd, mode};
    return 0;
}

/* The spare ``name``'s path in the area. */
static void spare_path(const struct door *d, const char *name, char *out)
{
    snprintf(out, PATH_MAX, "%s/%s", d->tiers[d->peer_slot], name);
}

/* ``path``, a consumed copy of the ring's (``fd``: its kept descriptor, of ``mode``, or -1),
 * renamed aside as a spare. 1 if it is gone from its name (kept, or unlinked when the spares are
 * full; ``fd`` is the spare's or closed), 0 if the caller unlinks it (and closes ``fd``). The
 * lane's own thread only. Reusing a file is safe against an open that found its old name just before:
 * the shim takes a peer-area copy only if its name still is that file once open
 * (shim_open.c: monarch_still_named), and a spare is written over only once a write lease shows
 * that no open of it is left anywhere (pa_take_spare). */
static int ring_retire(struct door *d, struct peer_ahead *pa, const char *path, int fd, mode_t mode)
{
    if (__atomic_load_n(&pa->leases_off, __ATOMIC_RELAXED))
        return 0;
    struct stat st;
    struct pa_spare sp = {.fd = fd, .mode = mode};
    if (sp.fd < 0) {                   /* its descriptor was not kept: opened again */
        sp.fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        if (sp.fd < 0)
            return 0;
        if (fcntl(sp.fd, F_SETSIG, SIGURG) != 0 || fstat(sp.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(sp.fd);
            return 0;
        }
        sp.mode = st.st_mode & 07777;
    }
    snprintf(sp.name, sizeof sp.name, "%s%016llx", MONARCH_TMP_PREFIX,
             (unsigned long long)(++pa->spare_seq * 0x9E3779B97F4A7C15ULL ^ (uint64_t)getpid() << 40));
    char aside[PATH_MAX];
    spare_path(d, sp.name, aside);
    if (rename(path, aside) != 0) {
        if (sp.fd != fd)
            close(sp.fd);
        return 0;
    }
    pthread_mutex_lock(&d->mu);
    int kept = pa->nspares < PA_SPARES;
    if (kept)
        pa->spares[pa->nspares++] = sp;
    pthread_mutex_unlock(&d->mu);
    if (!kept) {
        unlink(aside);
        close(sp.fd);
    }
    return 1;
}

/* A spare no one holds, made ``size`` bytes of mode ``mode``, its name (in the area's top
 * directory, where it stays until it is renamed into place) in ``name``: its descriptor (the
 * caller's now), or -1 (none: the caller creates the file). */
static int pa_take_spare(struct door *d, struct peer_ahead *pa, uint64_t size, mode_t mode, char *name, size_t cap)
{
    for (;;) {
        pthread_mutex_lock(&d->mu);
        struct pa_spare sp = pa->nspares ? pa->spares[--pa->nspares] : (struct pa_spare){.fd = -1};
        pthread_mutex_unlock(&d->mu);
        if (sp.fd < 0)
            return -1;
        char aside[PATH_MAX];
        spare_path(d, sp.name, aside);
        if (fcntl(sp.fd, F_SETLEASE, F_WRLCK) == 0) {   /* granted only while no other open of it is left */
            fcntl(sp.fd, F_SETLEASE, F_UNLCK);
            if (ftruncate(sp.fd, (off_t)size) == 0 && (sp.mode == mode || fchmod(sp.fd, mode) == 0)) {
                __atomic_add_fetch(&pa->reused, 1, __ATOMIC_RELAXED);
                snprintf(name, cap, "%s", sp.name);
                return sp.fd;
            }
        } else if (errno != EAGAIN && errno != EBUSY) {
            __atomic_store_n(&pa->leases_off, 1, __ATOMIC_RELAXED);  /* no leases here: files are made afresh */
        }
        unlink(aside);                 /* held by someone, or unusable: its bytes stay theirs */
        close(sp.fd);
    }
}

/* Every spare unlinked. Not under the lock. */
static void pa_drop_spares(struct door *d, struct peer_ahead *pa)
{
    for (;;) {
        pthread_mutex_lock(&d->mu);
        struct pa_spare sp = pa->nspares ? pa->spares[--pa->nspares] : (struct pa_spare){.fd = -1};
        pthread_mutex_unlock(&d->mu);
        if (sp.fd < 0)
            return;
        char aside[PATH_MAX];
        spare_path(d, sp.name, aside);
        unlink(aside);
        close(sp.fd);
    }
}

/* The victims gone from the peer area, kept as spares (``keep_spares``) or unlinked (not under
 * the lock: the lane is ``busy``), then their keys free again, the opens parked on them handed
 * over to Python. Takes and leaves the lock held. */
static void ring_unlink_victims(struct door *d, struct peer_ahead *pa, int keep_spares)
{
    uint32_t n = pa->nvictims;
    if (!n)
        return;
    pthread_mutex_unlock(&d->mu);
    const char *area = d->tiers[d->peer_slot];
    for (uint32_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        struct pa_victim *v = &pa->victims[i];
        int named = snprintf(path, sizeof path, "%s/%.*s", area, (int)v->len, v->key) < (int)sizeof path;
        if (named && keep_spares && ring_retire(d, pa, path, v->fd, v->mode))
            continue;
        if (named)
            unlink(path);              /* a reader that has it open keeps its bytes */
        if (v->fd >= 0)
            close(v->fd);
    }
    pthread_mutex_lock(&d->mu);
    for (uint32_t i = 0; i < n; i++) {
        struct pa_victim *v = &pa->victims[i];
        struct entry *e = find(d, v->key, v->len, v->hash);
        if (e) {
            e->state = K_FREE;         /* the lane may fetch it again; an open fetches it */
            e->ring = 0;
        }
        d->busy--;
        pa->unlinked++;
        struct waiter *ready = d->parked ? unpark_locked(d, v->key, v->len, v->hash) : NULL;
        if (ready) {
            pthread_mutex_unlock(&d->mu);
            answer_parked(d, ready, -1, NULL);
            pthread_mutex_lock(&d->mu);
        }
    }
    pa->nvictims = 0;
    pthread_cond_broadcast(&d->cv);
}

/* Every copy of the ring unlinked and its room given back to the lease: the order ended.
 * Under the lock, let go while unlinking (the lane is ``busy``: no batch is under way). */
static void ring_drop_locked(struct door *d, struct peer_ahead *pa)
{
    pa->busy = 1;
    while (pa->nring) {
        while (pa->nring && pa->nvictims < PA_FLIGHT * PA_BATCH) {
            struct pa_copy c = pa->ring[--pa->nring];
            struct idx_file f;
            const char *key;
            uint32_t len;
            pa->used -= c.room;
            struct entry *e = index_entry(d, c.entry, &f, &key, &len) ? find(d, key, len, monarch_crc32(key, len)) : NULL;
            if (ring_owns(d, e)) {
                e->state = K_BUSY;
                d->busy++;
                pa->victims[pa->nvictims++] = (struct pa_victim){key, len, e->hash, c.fd, c.mode};
                pa->nfds -= c.fd >= 0;
            } else {
                ring_close_fd(pa, &c);
            }
        }
        ring_unlink_victims(d, pa, 0);
    }
    pthread_mutex_unlock(&d->mu);
    pa_drop_spares(d, pa);
    pthread_mutex_lock(&d->mu);
    d->lease[Q_PEER] += pa->room;
    pa->room = pa->used = 0;
    pa->busy = 0;
    pthread_cond_broadcast(&pa->cv);
}

/* -- gathering: the next files past the progress, by owner ------------------------------------ */

/* A batch being gathered for ``owner`` with room for a file of ``size`` bytes (a free one made so
 * if there is none), or NULL: every batch is in flight or being gathered. */
static struct pa_batch *pa_batch_for(struct peer_ahead *pa, int owner, uint64_t size)
{
    struct pa_batch *free_one = NULL;
    for (int b = 0; b < PA_FLIGHT; b++) {
        struct pa_batch *B = &pa->batch[b];
        if (B->state == PB_FILLING && B->owner == owner && B->n < PA_BATCH
            && B->bytes + (int64_t)size <= PA_BATCH_BYTES)
            return B;
        if (B->state == PB_FREE && !free_one)
            free_one = B;
    }
    if (free_one) {
        free_one->state = PB_FILLING;
        free_one->owner = owner;
        free_one->n = 0;
        free_one->bytes = 0;
    }
    return free_one;
}

/* The next files to fetch, each made BUSY with its room taken from the ring's, gathered by owner
 * into free batches (PB_FILLING), while earlier ones are still in flight; consumed copies to
 * unlink first in ``pa->victims``. Returns how many files; 0 with ``*room`` set when the lease
 * is short. Under the lock. */
static int pa_gather_locked(struct door *d, struct peer_ahead *pa, int *room)
{
    int gathered = 0;
    *room = 0;
    if (!d->peer_fetch || !d->peer_allowed || d->never_copy || d->stopped || !d->gate_open)
        return 0;
    while (pa->next < pa->n && pa->next < pa->done + pa->window) {
        struct idx_file f;
        const char *key;
        uint32_t len;
        uint32_t entry = pa->order[pa->next];
        if (!index_entry(d, entry, &f, &key, &len)) {
            pa->next++;
            continue;
        }
        int owner = peer_owner_locked(d, &f);
        uint32_t hash = owner >= 0 ? monarch_crc32(key, len) : 0;
        struct entry *e = owner >= 0 ? find(d, key, len, hash) : NULL;
        if (ring_owns(d, e)) {
            ring_keep_locked(pa, entry, pa->next++);  /* fetched already: kept for this position */
            continue;
        }
        if (owner < 0 || (e && e->state != K_FREE)) {
            pa->next++;                /* this node's, large, or staged, busy or Python's already */
            pa->skipped++;
            continue;
        }
        struct pa_batch *B = pa_batch_for(pa, owner, f.size);
        if (!B)
            break;                     /* every batch taken: once one comes back */
        int64_t need = peer_room(d, f.size);
        if (!ring_room_locked(d, pa, need)) {
            B->state = B->n ? B->state : PB_FREE;  /* one made for it stays free */
            *room = 1;                 /* Python lends more when it drains the events */
            pa->room_waits++;
            int64_t now = monarch_now_ns();
            if (now - pa->room_woke_ns >= PA_ROOM_WAKE_NS) {  /* once the area is lent out, more wake-ups */
                pa->room_woke_ns = now;                        /* bring nothing: the progress makes room */
                wake_python_locked(d);
            }
            break;
        }
        if (!e && !(e = insert(d, key, len, hash))) {
            B->state = B->n ? B->state : PB_FREE;
            break;
        }
        e->state = K_BUSY;
        d->busy++;
        pa->used += need;
        struct pa_file *p = &B->files[B->n];
        B->keys[B->n] = key;           /* the index's: mapped while the door lives */
        B->lens[B->n] = (int)len;
        B->sizes[B->n++] = f.size;
        B->bytes += (int64_t)f.size;
        p->key = key;
        p->len = len;
        p->hash = hash;
        p->pos = pa->next;
        p->gen = pa->gen;
        p->f = f;
        p->dir = p->fd = -1;
        p->aside = 0;
        p->tmp[0] = 0;
        pa->next++;
        gathered++;
    }
    return gathered;
}

/* -- one batch: temporary files, the fetch, the publish ---------------------------------------- */

/* ``p``'s temporary copy in its directory of the peer area: a spare written over, or a new file. */
static void pa_open_tmp(struct door *d, struct peer_ahead *pa, struct worker *w, struct pa_file *p)
{
    const char *base = memrchr(p->key, '/', p->len);
    uint32_t dlen = base ? (uint32_t)(base - p->key) : 0;
    snprintf(p->tmp, sizeof p->tmp, "%s%016llx", MONARCH_TMP_PREFIX, (unsigned long long)(w->tmp_seq++ * 0x9E3779B97F4A7C15ULL));
    const int create = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    mode_t mode = (p->f.mode & 0700) | 0600;
    p->aside = 0;
    for (int attempt = 0; base && attempt < 2 && p->fd < 0; attempt++) {
        int kdir = cached_dir(&w->peer_dir, w->peer_dir_key, &w->peer_dir_len, p->key, dlen, open_peer_dir, w);
        p->dir = kdir < 0 ? -1 : dup(kdir);   /* kept to its rename: the next file may be elsewhere */
        if (p->dir >= 0 && (p->fd = pa_take_spare(d, pa, p->f.size, mode, p->tmp, sizeof p->tmp)) >= 0) {
            p->aside = 1;
            break;
        }
        p->fd = p->dir < 0 ? -1 : openat(p->dir, p->tmp, create, mode);
        if (p->fd >= 0 && fcntl(p->fd, F_SETSIG, SIGURG) != 0) {  /* kept on the ring: its lease breaks ignored */
            close(p->fd);
            unlinkat(p->dir, p->tmp, 0);
            p->fd = -1;
            break;
        }
        if (p->fd >= 0 || errno != ENOENT || w->peer_dir < 0)
            break;
        close(p->dir);                 /* its directory went meanwhile: opened afresh */
        p->dir = -1;
        close(w->peer_dir);
        w->peer_dir = -1;
    }
}

/* The files' bytes, each result the bytes written or < 0. */
static void pa_fetch(peer_fetch_fn one, peer_fetch_many_fn many, void *dp, int owner,
                     struct pa_file *files, int n, int64_t *results, int timeout_ms)
{
    const char *keys[PA_BATCH];
    int lens[PA_BATCH], fds[PA_BATCH], m = 0, at[PA_BATCH];
    uint64_t sizes[PA_BATCH];
    int64_t got[PA_BATCH];
    for (int i = 0; i < n; i++) {
        results[i] = -1;
        if (files[i].fd < 0)
            continue;
        keys[m] = files[i].key;
        lens[m] = (int)files[i].len;
        sizes[m] = files[i].f.size;
        fds[m] = files[i].fd;
        at[m++] = i;
    }
    if (!m)
        return;
    if (many) {
        if (many(dp, owner, m, keys, lens, sizes, fds, got, timeout_ms) != 0)
            for (int j = 0; j < m; j++)
                got[j] = -1;
    } else {
        for (int j = 0; j < m; j++)
            got[j] = one(dp, owner, keys[j], lens[j], sizes[j], fds[j], timeout_ms);
    }
    for (int j = 0; j < m; j++)
        results[at[j]] = got[j];
}

/* Each file of a fetched batch published (K_STAGED, on the ring) or handed to Python (K_PYTHON),
 * its waiters answered. Takes and leaves the lock unlocked. */
static void pa_publish(struct door *d, struct peer_ahead *pa, struct pa_file *files, int n, const int64_t *results,
                       int64_t t0)
{
    int slot = d->peer_slot;
    const char *area = d->tiers[slot];
    for (int i = 0; i < n; i++) {
        struct pa_file *p = &files[i];
        struct timespec times[2] = {{p->f.mtime / 1000000000LL, p->f.mtime % 1000000000LL},
                                    {p->f.mtime / 1000000000LL, p->f.mtime % 1000000000LL}};
        int ok = p->fd >= 0 && results[i] == (int64_t)p->f.size && futimens(p->fd, times) == 0;
        const char *name = memrchr(p->key, '/', p->len);
        char base[NAME_MAX + 1], tmp[PATH_MAX];
        size_t bl = name ? p->len - (size_t)(name + 1 - p->key) : 0;
        ok = ok && bl > 0 && bl <= NAME_MAX;
        int from = p->aside ? AT_FDCWD : p->dir;  /* a spare is renamed into place from the area's top */
        if (p->aside)
            spare_path(d, p->tmp, tmp);
        else
            snprintf(tmp, sizeof tmp, "%s", p->tmp);
        if (ok) {
            memcpy(base, name + 1, bl);
            base[bl] = 0;
            ok = !__atomic_load_n(&d->never_copy, __ATOMIC_ACQUIRE) && renameat(from, tmp, p->dir, base) == 0;
        }
        if (!ok && p->fd >= 0) {
            unlinkat(from, tmp, 0);
            close(p->fd);
            p->fd = -1;
        }
        if (p->dir >= 0)
            close(p->dir);
        char dest[PATH_MAX];
        snprintf(dest, sizeof dest, "%s/%.*s", area, (int)p->len, p->key);
        pthread_mutex_lock(&d->mu);
        int64_t need = peer_room(d, p->f.size);
        if (ok && ring_push_locked(pa, p->f.entry, p->gen == pa->gen ? p->pos : PA_STALE, need, p->fd,
                                   (p->f.mode & 0700) | 0600) != 0) {
            pthread_mutex_unlock(&d->mu);
            unlink(dest);              /* no room in the ring's books: not kept */
            close(p->fd);
            pthread_mutex_lock(&d->mu);
            ok = 0;
        }
        struct entry *e = find(d, p->key, p->len, p->hash);  /* BUSY since gathered: still there */
        if (ok) {
            e->state = K_STAGED;
            e->slot = (uint8_t)slot;
            e->ring = 1;
            e->answered = 0;           /* not answered: once consumed, it may go at once */
            pa->fetched++;
            pa->fetched_bytes += p->f.size;
        } else {
            e->state = K_PYTHON;       /* its open goes to Python's protocol: the owner, or the new one */
            e->ring = 0;
            pa->used -= need;
            pa->failed++;
            post_event_locked(d, Q_PEER, EV_FAILED, (uint32_t)slot, p->key, p->len, p->f.entry, p->f.size, 0,
                              monarch_now_ns() - t0);
        }
        /* its waiters open it at once */
        struct waiter *ready = d->parked ? unpark_locked(d, p->key, p->len, p->hash) : NULL;
        for (struct waiter *q = ready; q; q = q->next)
            pa->waited++;
        d->busy--;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        if (ready)
            answer_parked(d, ready, ok ? slot : -1, dest);
    }
}

/* -- the lane's thread ---------------------------------------------------------------------- */

/* ``n`` bytes written at offset 0 of ``fd``: 0, or -1. */
static int pa_write(int fd, const char *p, uint64_t n)
{
    uint64_t put = 0;
    while (put < n) {
        ssize_t w = pwrite(fd, p + put, n - put, (off_t)put);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        put += (uint64_t)w;
    }
    return 0;
}

struct pa_reply_ctx { struct door *d; struct peer_ahead *pa; struct pa_batch *B; };

/* A batch's reply came (dp_take's ``got``): each file written into its temporary copy and
 * published (a file the owner could not give goes to Python's protocol). */
static void pa_reply_got(void *arg, const char *const *bytes, const int64_t *got)
{
    struct pa_reply_ctx *c = arg;
    struct pa_batch *B = c->B;
    for (int i = 0; i < B->n; i++) {  /* ``got`` may be B->results: each read before it is written */
        struct pa_file *p = &B->files[i];
        int ok = bytes[i] && got[i] == (int64_t)p->f.size;
        if (ok)
            pa_open_tmp(c->d, c->pa, &c->pa->w, p);
        B->results[i] = ok && p->fd >= 0 && pa_write(p->fd, bytes[i], p->f.size) == 0 ? (int64_t)p->f.size : -1;
    }
    pa_publish(c->d, c->pa, B->files, B->n, B->results, B->posted_ns);
}

/* The batches gathered posted, each in flight until its reply comes, no thread and no sleep of
 * its own (dp_post); those in flight looked at once (dp_test) and each one ended taken
 * (dp_take: its files put in place). Without the data path's requests in flight (a test's
 * callbacks), each batch gathered is fetched at once, one after another. ``give_up``: those
 * still in flight are ended now (the lane stops). Returns how many ended. Called and returns
 * under the lock (let go meanwhile: the lane is ``busy``). */
static int pa_flight(struct door *d, struct peer_ahead *pa, int give_up)
{
    peer_fetch_fn one = d->peer_fetch;  /* read under the lock: the lane may be turned off meanwhile */
    peer_fetch_many_fn many = d->peer_fetch_many;
    peer_post_fn post = d->peer_post;
    peer_test_fn test = d->peer_test;
    peer_take_fn take = d->peer_take;
    void *dp = d->peer_dp;
    int timeout_ms = d->peer_timeout_ms, posted = 0, ended = 0, flying = 0;
    pthread_mutex_unlock(&d->mu);
    for (int b = 0; b < PA_FLIGHT; b++) {
        struct pa_batch *B = &pa->batch[b];
        if (B->state != PB_FILLING)
            continue;
        B->posted_ns = monarch_now_ns();
        int why = PA_NOT_POSTED;
        B->h = post && one ? post(dp, B->owner, B->n, B->keys, B->lens, B->sizes, timeout_ms, &why) : NULL;
        if (B->h) {
            B->state = PB_FLIGHT;
            posted++;
            continue;
        }
        if (why == PA_NOT_POSTED && one) {  /* no requests in flight here: fetched now */
            for (int i = 0; i < B->n; i++)
                pa_open_tmp(d, pa, &pa->w, &B->files[i]);
            pa_fetch(one, many, dp, B->owner, B->files, B->n, B->results, timeout_ms);
        } else {
            for (int i = 0; i < B->n; i++)
                B->results[i] = -1;    /* not posted (the stop, a lost owner): Python's protocol asks */
        }
        pa_publish(d, pa, B->files, B->n, B->results, B->posted_ns);
        B->state = PB_FREE;
        ended++;
    }
    int64_t now = monarch_now_ns();
    for (int b = 0; b < PA_FLIGHT; b++) {
        struct pa_batch *B = &pa->batch[b];
        if (B->state != PB_FLIGHT)
            continue;
        if (!give_up && !test(dp, B->h)) {
            flying++;
            continue;
        }
        int64_t took = now - B->posted_ns;
        pa->rtt_ns = pa->rtt_ns ? pa->rtt_ns + (took - pa->rtt_ns) / 8 : took;
        struct pa_reply_ctx c = {d, pa, B};
        take(dp, B->h, B->sizes, B->results, pa_reply_got, &c);
        B->h = NULL;
        B->state = PB_FREE;
        ended++;
    }
    pthread_mutex_lock(&d->mu);
    pa->nflight = flying;
    pa->batches += (uint64_t)ended;    /* counted once each, when it ends */
    /* the next look: most of a round trip after a request posted with none before it; soon after
     * one came back (others are likely due); else each look twice as late as the last */
    long rtt = (long)(pa->rtt_ns * 3 / 4);
    if (posted && flying == posted)
        pa->poll_ns = rtt < PA_POLL_MIN_NS ? PA_POLL_MIN_NS : rtt > PA_POLL_MAX_NS ? PA_POLL_MAX_NS : rtt;
    else if (ended)
        pa->poll_ns = PA_POLL_MIN_NS;
    else
        pa->poll_ns = pa->poll_ns * 2 > PA_POLL_MAX_NS ? PA_POLL_MAX_NS : pa->poll_ns * 2 < PA_POLL_MIN_NS ? PA_POLL_MIN_NS : pa->poll_ns * 2;
    pthread_cond_broadcast(&pa->cv);
    return ended;
}

static void *peer_ahead_main(void *arg)
{
    struct door *d = arg;
    struct peer_ahead *pa = d->pa;
    prctl(PR_SET_NAME, "monarch-peerahd");
    prctl(PR_SET_TIMERSLACK, 1000UL);  /* its looks at the requests in flight are short waits */
    pthread_mutex_lock(&d->mu);
    while (!pa->stop) {
        if (pa->busy) {                /* the order ended: its copies are being dropped (ring_drop_locked) */
            pthread_cond_wait(&pa->cv, &d->mu);
            continue;
        }
        int room;
        int gathered = pa_gather_locked(d, pa, &room);
        if (pa->nvictims) {            /* consumed copies go first: their room is the batch's */
            pa->busy = 1;
            ring_unlink_victims(d, pa, 1);
            pa->busy = 0;
            pthread_cond_broadcast(&pa->cv);
        }
        if (gathered || pa->nflight) {
            pa->busy = 1;
            pa_flight(d, pa, 0);
            pa->busy = 0;
        }
        /* requests in flight: look again soon (or when the reader's progress frees room for more) */
        timed_wait(&pa->cv, &d->mu, pa->nflight ? pa->poll_ns : PA_WAIT_NS);
    }
    if (pa->nflight) {                 /* stopping: the requests in flight given up */
        pa->busy = 1;
        pa_flight(d, pa, 1);
        pa->busy = 0;
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Ring copies whose descriptors may be kept open: an eighth of the descriptor limit, up to PA_FDS_MAX. */
static uint32_t pa_fds_allowed(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return PA_FDS_MAX;
    return rl.rlim_cur / 8 < PA_FDS_MAX ? (uint32_t)(rl.rlim_cur / 8) : PA_FDS_MAX;
}

/* The lane's state made (not its thread), or NULL. */
static struct peer_ahead *peer_ahead_new(void)
{
    struct peer_ahead *pa = calloc(1, sizeof *pa);
    if (!pa)
        return NULL;
    pa->fds_cap = pa_fds_allowed();
    pthread_cond_init(&pa->cv, NULL);
    struct worker *w = &pa->w;
    w->spare_fd = w->ep = w->src_dir = w->key_dir = w->peer_dir = -1;
    w->tmp_seq = (uint64_t)monarch_now_ns() ^ (uint64_t)getpid() << 32 ^ 0xA4EADULL << 44;
    return pa;
}

/* The lane stopped and its thread joined (its batch under way ends first); harmless twice. */
static void stop_peer_ahead(struct door *d)
{
    struct peer_ahead *pa = d->pa;
    if (!pa)
        return;
    pthread_mutex_lock(&d->mu);
    pa->stop = 1;
    pthread_cond_broadcast(&pa->cv);
    int started = pa->started;
    pa->started = 0;
    pthread_mutex_unlock(&d->mu);
    if (started)
        pthread_join(pa->thread, NULL);
    pa_drop_spares(d, pa);
    pa->w.d = d;
    close_cached_dirs(&pa->w);
}

static void free_peer_ahead(struct door *d)
{
    if (!d->pa)
        return;
    free(d->pa->order);
    for (uint32_t i = 0; i < d->pa->nring; i++)
        ring_close_fd(d->pa, &d->pa->ring[i]);
    free(d->pa->ring);
    pthread_cond_destroy(&d->pa->cv);
    free(d->pa);
    d->pa = NULL;
}

/* -- what Python calls (front_door.h: the peer read-ahead lane) --------------------------------- */

/* The reader's order: ``entries`` (index entries, from 1; copied), of which the lane fetches the
 * other nodes' files ahead of the progress, at most ``window`` positions ahead; the progress
 * starts at 0, told by Python or by the reader of hint stream ``stream`` to the door (the last
 * order's progress told and not yet taken is dropped: it counted another order's positions). n == 0: the lane has no order (it waits for its batch under way to end). The
 * lane's thread starts with the first order. 0, or -1 (no memory, no thread: no lane). */
EXPORT int front_door_peer_ahead(struct door *d, const uint32_t *entries, uint32_t n, uint32_t window, uint64_t stream)
{
    uint32_t *copy = n ? malloc((size_t)n * sizeof *copy) : NULL;
    if (n && !copy)
        return -1;
    if (n)
        memcpy(copy, entries, (size_t)n * sizeof *copy);
    pthread_mutex_lock(&d->mu);
    if (!d->pa && !(d->pa = peer_ahead_new())) {
        pthread_mutex_unlock(&d->mu);
        free(copy);
        return -1;
    }
    struct peer_ahead *pa = d->pa;
    while (!n && (pa->busy || pa->nflight) && pa->started)  /* no order: its requests in flight end first, */
        pthread_cond_wait(&pa->cv, &d->mu);                  /* then its copies go */
    free(pa->order);
    pa->order = copy;
    pa->gen++;
    for (uint32_t i = 0; i < pa->nring; i++)
        pa->ring[i].pos = PA_STALE;    /* consumed, unless the new order asks for it again */
    if (!n)
        ring_drop_locked(d, pa);
    pa->n = n;
    pa->next = pa->done = 0;
    pa->stream = stream;
    pa->told_fresh = 0;
    pa->window = window ? window : 1;
    pa->orders += n > 0;
    int ok = 0;
    if (n && !pa->started && !pa->stop && !d->stopped) {
        pa->w.d = d;
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);  /* the interpreter's threads take the signals */
        pa->started = pthread_create(&pa->thread, NULL, peer_ahead_main, d) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        ok = pa->started ? 0 : -1;
    }
    pthread_cond_broadcast(&pa->cv);
    pthread_mutex_unlock(&d->mu);
    return ok;
}

/* ``key``'s copy left the peer area (the cache evicted it) and no one fetches it: the lane may
 * fetch it again (K_FREE; its opens are still handed over, as those of a key Python had). */
EXPORT void front_door_peer_gone(struct door *d, const char *key, int len)
{
    pthread_mutex_lock(&d->mu);
    struct entry *e = find(d, key, (uint32_t)len, monarch_crc32(key, (uint32_t)len));
    if (e && e->state == K_PYTHON)
        e->state = K_FREE;
    pthread_mutex_unlock(&d->mu);
}

/* The reader is done with the first ``consumed`` positions of the order. Under the lock. */
static void peer_progress_locked(struct peer_ahead *pa, uint64_t consumed)
{
    uint32_t at = consumed > UINT32_MAX ? UINT32_MAX : (uint32_t)consumed;
    if (at > pa->done) {
        pa->done = at;
        pthread_cond_broadcast(&pa->cv);
    }
}

EXPORT void front_door_peer_progress(struct door *d, uint32_t consumed)
{
    pthread_mutex_lock(&d->mu);
    if (d->pa)
        peer_progress_locked(d->pa, consumed);
    pthread_mutex_unlock(&d->mu);
}

/* HINT PROGRESS requests (``got`` bytes: whole ones back to back, progress_state) on connection
 * ``fd``: answered here if they are of the stream whose order the lane follows (1: the connection
 * is the door's, kept for the next ones), else 0 (the caller hands them to Python, which answers
 * every other hint). Python's stager gets the last such progress when it drains the door. */
static int peer_progress_frames(struct door *d, int fd, const char *buf, uint32_t got)
{
    const uint32_t one = MONARCH_REQUEST_HEADER_SIZE + MONARCH_HINT_PROGRESS_BODY;
    uint32_t n = got / one;
    uint64_t stream, consumed = 0;
    memcpy(&stream, buf + MONARCH_REQUEST_HEADER_SIZE + 1, 8);
    for (uint32_t i = 0; i < n; i++) {
        const char *body = buf + i * one + MONARCH_REQUEST_HEADER_SIZE;
        uint64_t s, c;
        memcpy(&s, body + 1, 8);
        memcpy(&c, body + 9, 8);
        if (s != stream)
            return 0;
        consumed = c > consumed ? c : consumed;
    }
    pthread_mutex_lock(&d->mu);
    struct peer_ahead *pa = d->pa;
    if (!n || !pa || !pa->n || pa->stream != stream || d->stopped) {
        pthread_mutex_unlock(&d->mu);
        return 0;
    }
    peer_progress_locked(pa, consumed);
    pa->told = consumed > pa->told || !pa->told_fresh ? consumed : pa->told;
    pa->told_fresh = 1;
    pa->told_frames += n;
    int64_t now = monarch_now_ns();
    if (now - pa->told_woke_ns >= TOLD_WAKE_NS) {
        pa->told_woke_ns = now;
        wake_python_locked(d);
    }
    int keep = keep_locked(d, 1);
    pthread_mutex_unlock(&d->mu);
    char answers[PROGRESS_FRAMES_MAX * MONARCH_ANSWER_HEADER_SIZE] = {0};  /* each: status 0, no body */
    ssize_t sent = send(fd, answers, (size_t)n * MONARCH_ANSWER_HEADER_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT);
    finish_open(d, fd, keep, sent == (ssize_t)n * MONARCH_ANSWER_HEADER_SIZE);
    return 1;
}

/* The last progress answered by the door (peer_progress_frame) that Python has not taken:
 * out[0] its stream, out[1] the positions consumed, out[2] the frames the door answered so far.
 * 1 if there was one (taken now), else 0. */
EXPORT int front_door_peer_told(struct door *d, uint64_t *out)
{
    pthread_mutex_lock(&d->mu);
    struct peer_ahead *pa = d->pa;
    int fresh = pa && pa->told_fresh;
    out[0] = pa ? pa->stream : 0;
    out[1] = pa ? pa->told : 0;
    out[2] = pa ? pa->told_frames : 0;
    if (pa)
        pa->told_fresh = 0;
    pthread_mutex_unlock(&d->mu);
    return fresh;
}

/* out[17]: orders, files fetched, their bytes, batches, failed, skipped, waits for room,
 * the order's length, its next position, positions consumed, opens that waited for a fetch,
 * copies on the ring, the room they hold (bytes taken from the lease), copies gone (unlinked or
 * kept as spares), copies asked for again before they went, fetches written over a spare,
 * progress requests the door answered itself. */
EXPORT void front_door_peer_ahead_state(struct door *d, uint64_t *out)
{
    memset(out, 0, 17 * sizeof *out);
    pthread_mutex_lock(&d->mu);
    struct peer_ahead *pa = d->pa;
    if (pa) {
        uint64_t v[17] = {pa->orders, pa->fetched, pa->fetched_bytes, pa->batches, pa->failed, pa->skipped,
                          pa->room_waits, pa->n, pa->next, pa->done, pa->waited, pa->nring, (uint64_t)pa->room,
                          pa->unlinked, pa->kept, pa->reused, pa->told_frames};
        memcpy(out, v, sizeof v);
    }
    pthread_mutex_unlock(&d->mu);
}
