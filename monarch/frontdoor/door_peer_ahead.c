/* Part of front_door.c, one translation unit (what it gives the other parts: door_peer_ahead.h).
 * Here: the peer read-ahead lane's state, its ring of copies and its gathering (its thread, the
 * requests in flight and the exports are the next part's, door_peer_lane.c). The lane is the
 * clairvoyant path: when the readers tell their order (monarch.hints), the other nodes' files of
 * that order are fetched ahead of the reader into the peer area, many per request and reply to each
 * owner, so that the reader's opens of them are local hits (the shim's tier probe).
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
 * puts each reply's files in place as it comes (a new file, or a spare written over, under a
 * name of its own, then its key's name linked to it).
 *
 * The lane keeps its copies' books itself, in C (the ring): no event per file, nothing for
 * Python's LRU. Its room is taken out of the peer lease (Q_PEER) as it grows and given back
 * when the order ends; a copy the reader has consumed (its position below the progress, or of
 * an earlier order) is the first to go when a new one needs room (its key's name unlinked, the
 * file kept as a spare that a next fetch writes over, PA_SPARES, then linked to its next key's
 * name: the descriptor it was written with kept on the ring), and one the
 * order asks for again before that is kept for its new position. An open of a copy being
 * unlinked parks and is handed to Python, as any open of a key the door gave up. Copies stay STAGED with ``ring`` set;
 * whatever else makes a key STAGED clears it, so the lane never unlinks a copy not its own.
 * A file the owner cannot give (not staged there, another size, compressed, a lost owner) is
 * handed to Python (K_PYTHON): its open goes through Python's protocol, which asks the owner,
 * or the new one. An open that comes before the lane fetched its file is the peer lane's
 * (door_peer.c), or parks on the lane's fetch under way, as on any BUSY key. */
#include "door_peer_ahead.h"

/* -- a lane file: its own name, its descriptor and mapping -------------------------------------- */
/* Each file the lane makes has a name of its own in the area's top directory for as long as it
 * lives (MONARCH_TMP_PREFIX: never served, swept as a leftover); as a copy it also has its key's
 * name, linked to it once its bytes are in. Retiring a consumed copy unlinks the key's name, and
 * writing a next fetch over it links the next key's: a link and an unlink a file cost less than
 * renaming it aside and back, two renames (scripts/cluster/lane_costs.c measures both). */

static void pa_home_name(char *buf, size_t cap, uint64_t home)
{
    snprintf(buf, cap, "%s%016llx", MONARCH_TMP_PREFIX, (unsigned long long)home);
}

/* A new lane file's own name's number. */
static uint64_t pa_new_home(struct peer_ahead *pa)
{
    return ++pa->home_seq * 0x9E3779B97F4A7C15ULL ^ (uint64_t)getpid() << 40;
}

/* The lane file ``home``'s own name unlinked (its path walked: not the lane's hot path). */
static void unlink_home(const struct door *d, uint64_t home)
{
    char path[PATH_MAX], name[40];
    pa_home_name(name, sizeof name, home);
    if (snprintf(path, sizeof path, "%s/%s", d->tiers[d->peer.slot], name) < (int)sizeof path)
        unlink(path);
}

static void pa_unmap(struct pa_map *m)
{
    if (m->at)
        munmap(m->at, m->mapped);
    *m = (struct pa_map){0};
}

/* A lane file's descriptor closed and its mapping dropped. */
static void pa_close(int fd, struct pa_map *m)
{
    pa_unmap(m);
    if (fd >= 0)
        close(fd);
}

/* A spare made ``size`` bytes long: its pages past that are no longer the file's. */
static void pa_map_cut(struct pa_map *m, uint64_t size)
{
    if (m->ready > size)
        m->ready = size;
}

/* ``size`` bytes written into the lane's file ``fd`` from offset 0: through its mapping when the
 * file holds their pages (1), else by pwrite, after which they are mapped for the next fetch
 * written over it, a spare's (0). -1: not written. */
static int pa_write(int fd, struct pa_map *m, const char *bytes, uint64_t size)
{
    if (m->at && size <= m->ready) {
        memcpy(m->at, bytes, size);
        return 1;
    }
    pa_unmap(m);
    if (monarch_write_all(fd, bytes, size, 1) != 0)
        return -1;
    struct statfs sf;
    int in_ram = fstatfs(fd, &sf) == 0 && ((unsigned long)sf.f_type & 0xFFFFFFFFUL) == 0x01021994UL;  /* TMPFS_MAGIC */
    void *at = size && in_ram ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
    if (at != MAP_FAILED)
        *m = (struct pa_map){at, size, size};
    return 0;
}

/* -- the ring: the lane's copies and their room ----------------------------------------------- */

/* ``e`` is a copy of the ring's (a STAGED key no other path has made its own since). */
static int ring_owns(const struct door *d, const struct entry *e)
{
    return e && e->state == K_STAGED && e->ring && e->slot == d->peer.slot;
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

/* A ring copy's kept descriptor closed. */
static void ring_close_fd(struct peer_ahead *pa, struct pa_copy *c)
{
    if (c->fd >= 0) {
        pa_close(c->fd, &c->map);
        c->fd = -1;
        pa->nfds--;
    }
}

/* A ring copy that is no longer the ring's (another path took its key): its file let go, its
 * own name unlinked (the key's is the other path's now). */
static void ring_forget(const struct door *d, struct peer_ahead *pa, struct pa_copy *c)
{
    ring_close_fd(pa, c);
    unlink_home(d, c->home);
}

/* Room for ``need`` more bytes: consumed copies made victims (BUSY: unlinked before the next
 * requests go; their room counted free at once), else room taken from the lease. 1 if there is
 * room, 0 if not. Under the lock. */
static int ring_room_locked(struct door *d, struct peer_ahead *pa, int64_t need)
{
    if (pa->used + need <= pa->room)
        return 1;                      /* the common case while the lane is ahead: no look at the ring */
    uint32_t now = door_ms(d), kept = 0;
    for (uint32_t i = 0; i < pa->nring; i++) {
        struct pa_copy c = pa->ring[i];
        int short_of_room = pa->used + need > pa->room && pa->nvictims < PA_FLIGHT * PA_BATCH;
        struct idx_file f;
        char key[INDEX_KEY_MAX];
        uint32_t len;
        if (!short_of_room || (c.pos != PA_STALE && c.pos >= pa->done) || !index_entry(d, c.entry, &f, key, &len)) {
            pa->ring[kept++] = c;      /* not needed, or not consumed yet */
            continue;
        }
        struct entry *e = find(d, key, len, c.hash);
        if (!ring_owns(d, e)) {        /* no longer the ring's (another path took the key): its room only */
            pa->used -= c.room;
            ring_forget(d, pa, &c);
            continue;
        }
        if (e->answered && answered_ago_ms(e, now) < PA_GRACE_MS) {
            pa->ring[kept++] = c;      /* the door just named it to a reader */
            continue;
        }
        e->state = K_BUSY;             /* its opens park until it is gone, then go to Python */
        d->busy++;
        pa->victims[pa->nvictims++] = (struct pa_victim){c.entry, c.hash, c.fd, c.mode, c.map, f.size, c.home};
        pa->nfds -= c.fd >= 0;
        pa->used -= c.room;
    }
    pa->nring = kept;
    if (pa->used + need <= pa->room)
        return 1;
    int64_t take = pa->used + need - pa->room;
    if (take > d->books.lease[Q_PEER])
        return 0;
    d->books.lease[Q_PEER] -= take;
    pa->room += take;
    return 1;
}

/* A new copy on the ring, its descriptor ``fd`` and mapping ``map`` kept if fewer than PA_FDS_MAX
 * are (else closed). 0, or -1 (no memory: the caller unlinks it and closes ``fd``). Under the lock. */
static int ring_push_locked(struct peer_ahead *pa, uint32_t entry, uint32_t hash, uint32_t pos, int64_t room, int fd,
                            mode_t mode, struct pa_map map, uint64_t home)
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
        pa_close(fd, &map);
        fd = -1;
    }
    pa->nfds += fd >= 0;
    pa->ring[pa->nring++] = (struct pa_copy){entry, pos, hash, room, fd, mode, map, home};
    return 0;
}

/* The consumed copy ``v`` of the ring's, named ``name`` in ``dir`` (its key's directory, kept),
 * kept as a spare: its key's name unlinked, its file (its descriptor, or opened again by its own
 * name in the area's top directory ``top``) kept to be written over. 1 if it is gone from its
 * key's name and ``v``'s descriptor is the spare's (or closed: the spares are full, its own name
 * unlinked too), 0 if the caller unlinks both names (and closes the descriptor). The lane's own
 * thread only. Reusing a file is safe against an open that found its key's name just before:
 * the shim takes a peer-area copy only if its name still is that file once open
 * (shim_open.c: monarch_still_named), and a spare is written over only once a write lease shows
 * that no open of it is left anywhere (pa_take_spare). */
static int ring_retire(struct door *d, struct peer_ahead *pa, int dir, const char *name, int top, struct pa_victim *v)
{
    if (__atomic_load_n(&pa->leases_off, __ATOMIC_RELAXED))
        return 0;
    struct stat st;
    struct pa_spare sp = {.fd = v->fd, .mode = v->mode, .map = v->map, .size = v->size, .home = v->home};
    if (sp.fd < 0) {                   /* its descriptor was not kept: opened again */
        char own[40];
        pa_home_name(own, sizeof own, v->home);
        sp.fd = openat(top, own, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        sp.map = (struct pa_map){0};
        if (sp.fd < 0)
            return 0;
        if (fcntl(sp.fd, F_SETSIG, SIGURG) != 0 || fstat(sp.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(sp.fd);
            return 0;
        }
        sp.mode = st.st_mode & 07777;
        sp.size = (uint64_t)st.st_size;
    }
    if (unlinkat(dir, name, 0) != 0 && errno != ENOENT) {
        if (sp.fd != v->fd)
            close(sp.fd);
        return 0;
    }
    pthread_mutex_lock(&d->mu);
    int kept = pa->nspares < PA_SPARES;
    if (kept)
        pa->spares[pa->nspares++] = sp;
    pthread_mutex_unlock(&d->mu);
    if (!kept) {
        char own[40];
        pa_home_name(own, sizeof own, sp.home);
        unlinkat(top, own, 0);
        pa_close(sp.fd, &sp.map);
    }
    v->fd = -1;                        /* the spare's, or closed */
    v->map = (struct pa_map){0};
    return 1;
}

/* A spare no one holds, made ``size`` bytes of mode ``mode``, its own name's number in ``home``
 * and its mapping in ``map``: its descriptor (the caller's now), or -1 (none: the caller creates
 * the file). */
static int pa_take_spare(struct door *d, struct peer_ahead *pa, uint64_t size, mode_t mode, uint64_t *home,
                         struct pa_map *map)
{
    for (;;) {
        pthread_mutex_lock(&d->mu);
        struct pa_spare sp = pa->nspares ? pa->spares[--pa->nspares] : (struct pa_spare){.fd = -1};
        pthread_mutex_unlock(&d->mu);
        if (sp.fd < 0)
            return -1;
        if (fcntl(sp.fd, F_SETLEASE, F_WRLCK) == 0) {   /* granted only while no other open of it is left */
            fcntl(sp.fd, F_SETLEASE, F_UNLCK);
            /* of the same length (a dataset's files often are): written over whole, not truncated */
            if ((sp.size == size || ftruncate(sp.fd, (off_t)size) == 0) && (sp.mode == mode || fchmod(sp.fd, mode) == 0)) {
                __atomic_add_fetch(&pa->reused, 1, __ATOMIC_RELAXED);
                *home = sp.home;
                pa_map_cut(&sp.map, size);
                *map = sp.map;
                return sp.fd;
            }
        } else if (errno != EAGAIN && errno != EBUSY) {
            __atomic_store_n(&pa->leases_off, 1, __ATOMIC_RELAXED);  /* no leases here: files are made afresh */
        }
        unlink_home(d, sp.home);       /* held by someone, or unusable: its bytes stay theirs */
        pa_close(sp.fd, &sp.map);
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
        unlink_home(d, sp.home);
        pa_close(sp.fd, &sp.map);
    }
}

/* The victims gone from the peer area, kept as spares (``keep_spares``: the lane's own thread,
 * through its directories) or unlinked (not under the lock: the lane is ``busy``), then their
 * keys free again, the opens parked on them handed over to Python. Takes and leaves the lock held. */
static void ring_unlink_victims(struct door *d, struct peer_ahead *pa, int keep_spares)
{
    uint32_t n = pa->nvictims;
    if (!n)
        return;
    pthread_mutex_unlock(&d->mu);
    const char *area = d->tiers[d->peer.slot];
    struct dir_cache *dirs = &pa->w.peer_dirs;
    int top = keep_spares ? dirs_get(dirs, area, "", 0) : -1;
    for (uint32_t i = 0; i < n; i++) {
        char path[PATH_MAX], key[INDEX_KEY_MAX];
        struct pa_victim *v = &pa->victims[i];
        uint32_t len = index_key(d, v->entry, key);
        const char *base = memrchr(key, '/', len);
        uint32_t dlen = base ? (uint32_t)(base - key) : 0;
        char name[NAME_MAX + 1];
        size_t nl = len - (base ? dlen + 1 : 0);
        int dir = top >= 0 && nl <= NAME_MAX ? dirs_get(dirs, area, key, dlen) : -1;
        if (dir >= 0) {
            memcpy(name, key + (len - nl), nl);
            name[nl] = 0;
            if (!ring_retire(d, pa, dir, name, top, v)) {
                unlinkat(dir, name, 0);  /* a reader that has it open keeps its bytes */
                unlink_home(d, v->home);
            }
            dirs_put(dirs, dir);
        } else {
            if (len && snprintf(path, sizeof path, "%s/%.*s", area, (int)len, key) < (int)sizeof path)
                unlink(path);
            unlink_home(d, v->home);
        }
        pa_close(v->fd, &v->map);
    }
    dirs_put(dirs, top);
    pthread_mutex_lock(&d->mu);
    for (uint32_t i = 0; i < n; i++) {
        struct pa_victim *v = &pa->victims[i];
        char key[INDEX_KEY_MAX];
        uint32_t len = index_key(d, v->entry, key);
        struct entry *e = len ? find(d, key, len, v->hash) : NULL;
        if (e) {
            e->state = K_FREE;         /* the lane may fetch it again; an open fetches it */
            e->ring = 0;
        }
        d->busy--;
        pa->unlinked++;
        struct waiter *ready = len && d->answers.parked ? unpark_locked(d, key, len, v->hash) : NULL;
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
            char key[INDEX_KEY_MAX];
            uint32_t len;
            pa->used -= c.room;
            struct entry *e = index_entry(d, c.entry, &f, key, &len) ? find(d, key, len, c.hash) : NULL;
            if (ring_owns(d, e)) {
                e->state = K_BUSY;
                d->busy++;
                pa->victims[pa->nvictims++] =
                    (struct pa_victim){c.entry, c.hash, c.fd, c.mode, c.map, f.size, c.home};
                pa->nfds -= c.fd >= 0;
            } else {
                ring_forget(d, pa, &c);
            }
        }
        ring_unlink_victims(d, pa, 0);
    }
    pthread_mutex_unlock(&d->mu);
    pa_drop_spares(d, pa);
    pthread_mutex_lock(&d->mu);
    d->books.lease[Q_PEER] += pa->room;
    pa->room = pa->used = 0;
    pa->busy = 0;
    pthread_cond_broadcast(&pa->cv);
}

/* -- gathering: the next files past the progress, by owner ------------------------------------ */

/* A batch being gathered for ``owner`` with room for a file of ``size`` bytes and its key of ``len``
 * (a free one made so if there is none), or NULL: every batch is in flight or being gathered. */
static struct pa_batch *pa_batch_for(struct peer_ahead *pa, int owner, uint64_t size, uint32_t len)
{
    struct pa_batch *free_one = NULL;
    for (int b = 0; b < PA_FLIGHT; b++) {
        struct pa_batch *B = &pa->batch[b];
        if (B->state == PB_FILLING && B->owner == owner && B->n < PA_BATCH
            && B->bytes + (int64_t)size <= PA_BATCH_BYTES && len <= sizeof B->keys_kept - B->kept)
            return B;
        if (B->state == PB_FREE && !free_one)
            free_one = B;
    }
    if (free_one) {
        free_one->state = PB_FILLING;
        free_one->owner = owner;
        free_one->n = 0;
        free_one->bytes = 0;
        free_one->kept = 0;
    }
    return free_one;
}

/* The file ``key`` of a batch being gathered or in flight given position ``pos`` of the order now
 * (an earlier order's request for it is on its way: its copy comes back for this one, not
 * consumed). 1 if there was one. Under the lock (the lane's thread: its batches' files are its). */
static int pa_refile_locked(struct peer_ahead *pa, const char *key, uint32_t len, uint32_t pos)
{
    for (int b = 0; b < PA_FLIGHT; b++) {
        struct pa_batch *B = &pa->batch[b];
        for (int i = 0; B->state != PB_FREE && i < B->n; i++) {
            struct pa_file *p = &B->files[i];
            if (p->len == len && (p->key == key || !memcmp(p->key, key, len))) {
                pa->kept += p->gen != pa->gen || p->pos != pos;
                p->pos = pos;
                p->gen = pa->gen;
                return 1;
            }
        }
    }
    return 0;
}

/* The next files to fetch, each made BUSY with its room taken from the ring's, gathered by owner
 * into free batches (PB_FILLING), while earlier ones are still in flight; consumed copies to
 * unlink first in ``pa->victims``. Returns how many files; 0 with ``*room`` set when the lease
 * is short. Under the lock. */
static int pa_gather_locked(struct door *d, struct peer_ahead *pa, int *room)
{
    int gathered = 0;
    *room = 0;
    if (!d->peer.fetch || !d->peer.allowed || d->never_copy || d->stopped || !d->gate_open)
        return 0;
    while (pa->next < pa->n && pa->next < pa->done + pa->window) {
        struct idx_file f;
        char key[INDEX_KEY_MAX];
        uint32_t len;
        uint32_t entry = pa->order[pa->next];
        if (!index_entry(d, entry, &f, key, &len)) {
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
        if (e && e->state == K_BUSY && e->ring && pa_refile_locked(pa, key, len, pa->next)) {
            pa->next++;                /* on its way (an earlier order's request): its copy for this position */
            continue;
        }
        if (owner < 0 || (e && e->state != K_FREE)) {
            pa->next++;                /* this node's, large, or staged, busy or Python's already */
            pa->skipped++;
            continue;
        }
        struct pa_batch *B = pa_batch_for(pa, owner, f.size, len);
        if (!B)
            break;                     /* every batch taken: once one comes back */
        int64_t need = peer_room(d, f.size);
        if (!ring_room_locked(d, pa, need)) {
            B->state = B->n ? B->state : PB_FREE;  /* one made for it stays free */
            *room = 1;                 /* Python lends more when it drains the events */
            pa->room_waits++;
            int64_t now = monarch_now_ns();
            if (now - pa->room_woke_ns >= pa->room_wake_ns) {
                /* once the area is lent out, a wake-up brings nothing (the progress makes room, and
                 * Python lends what it can at each drain): after one it lent nothing for, the next
                 * waits twice as long (strace, bench_cluster --hints: over half of the door's
                 * wake-ups of Python, each 60-80 us of its CPU) */
                int lent = pa->grants != pa->grants_at_wake;
                pa->room_wake_ns = lent || !pa->room_wake_ns ? PA_ROOM_WAKE_NS
                                   : pa->room_wake_ns * 2 > PA_ROOM_WAKE_MAX_NS ? PA_ROOM_WAKE_MAX_NS
                                   : pa->room_wake_ns * 2;
                pa->grants_at_wake = pa->grants;
                pa->room_woke_ns = now;
                wake_python_locked(d);
            }
            break;
        }
        if (!e && !(e = insert(d, key, len, hash))) {
            B->state = B->n ? B->state : PB_FREE;
            break;
        }
        e->state = K_BUSY;
        e->ring = 1;                   /* the lane's, on its way: a next order may take it for its own */
        d->busy++;
        pa->used += need;
        struct pa_file *p = &B->files[B->n];
        char *kept = memcpy(B->keys_kept + B->kept, key, len);  /* the batch's own until it is free again */
        B->kept += len;
        B->keys[B->n] = kept;
        B->lens[B->n] = (int)len;
        B->sizes[B->n++] = f.size;
        B->bytes += (int64_t)f.size;
        p->key = kept;
        p->len = len;
        p->hash = hash;
        p->pos = pa->next;
        p->gen = pa->gen;
        p->f = f;
        p->dir = p->fd = -1;
        p->map = (struct pa_map){0};
        p->home = 0;
        pa->next++;
        gathered++;
    }
    return gathered;
}
