/* Part of front_door.c, one translation unit (what it gives the other parts: door_copies.h). Here:
 * one copy from the PFS into the copy tier, published atomically (the directories it keeps open,
 * the copy, the publish). */
#include "door_copies.h"

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

/* ``key``'s directory part's length (``*dlen``, "<k>/<dir>") and its last name, NUL-ended, in ``name``
 * (NAME_MAX + 1 bytes); -1 if it has no name (the key is not NUL-terminated). */
static int key_name(const char *key, uint32_t len, uint32_t *dlen, char *name)
{
    const char *base = memrchr(key, '/', len);     /* valid_key: "<k>/...", so there is one */
    if (!base)
        return -1;
    uint32_t nlen = len - (uint32_t)(base - key) - 1;
    if (!nlen || nlen > NAME_MAX)
        return -1;
    *dlen = (uint32_t)(base - key);
    memcpy(name, base + 1, nlen);
    name[nlen] = 0;
    return 0;
}

/* ``key``'s source opened as copy_in opens one and entry ``n`` (a listed file: index_listed)
 * described from that descriptor, which is kept for the copy (w->listed_src): the miss costs the
 * PFS its lookups and its open, as a direct open does (``in_order``: a read-ahead's, opened in its
 * directory's descriptor, kept for its neighbours). ``by_name``: its name looked up only (O_PATH:
 * no open reaches the PFS), where the file is likely too large for the door to copy; nothing kept.
 * 1 if described. */
static int describe_listed(struct worker *w, const char *key, uint32_t len, uint32_t n, int in_order, int by_name)
{
    uint32_t dlen;
    char name[NAME_MAX + 1];
    if (key_name(key, len, &dlen, name) != 0)
        return 0;
    struct stat st;
    int flags = by_name ? O_PATH | O_NOFOLLOW | O_CLOEXEC : O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
    int in = open_source(w, key, dlen, name, n, flags, in_order);
    if (in < 0)
        return 0;
    if (source_stat(in, w->src_fresh, STATX_BASIC, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(in);
        return 0;
    }
    index_describe(w->d, n, &st);
    if (by_name)
        close(in);                     /* (the copy, if the door's after all, opens it) */
    else
        w->listed_src = in;
    return 1;
}

/* Whom to ask for listed entry ``n``'s stat: its owner, when another node owns it (a sharded node's),
 * with the data path's dp_describe; else owner -1 (and describe NULL: the PFS's). Under the lock. */
static struct owner_ask owner_ask_locked(const struct door *d, uint32_t n)
{
    struct owner_ask a = {.owner = -1};
    if (n && d->peer.own_only && !own_file_locked(d, n))
        a.owner = entry_owner(d, &d->peer.owners, n);
    a.describe = a.owner >= 0 ? d->peer.describe : NULL;
    a.dp = d->peer.dp, a.timeout_ms = d->peer.timeout_ms;
    a.owners = d->peer.owners;
    return a;
}

/* Entry ``n`` (a listed file ``ask->owner`` owns and has not described) asked again until the owner,
 * which copies it first (DP_COMING), has described it: 1, or 0 when it says it will not, or after
 * COMING_WAIT_MS (the caller asks the PFS). Looks at the pace of an answer's round trip, serving the
 * worker's connections meanwhile. */
static int described_when_copied(struct worker *w, const struct owner_ask *ask, const char *key, uint32_t len, uint32_t n)
{
    struct door *d = w->d;
    int64_t rtt = __atomic_load_n(&d->peer.rtt_ns, __ATOMIC_RELAXED), sleep = pace_first_look(rtt);
    int64_t end = monarch_now_ns() + (int64_t)COMING_WAIT_MS * 1000000LL;
    int first = 1;
    for (;;) {
        int64_t now = monarch_now_ns();
        if (now >= end)
            return 0;
        wait_serving(w, sleep < end - now ? sleep : end - now);
        sleep = pace_next_look(sleep, rtt, first);
        first = 0;
        if (!index_listed_number(d, n))
            return 1;                  /* described meanwhile (this node's own look-up, another worker's ask) */
        const char *keys[1] = {key};
        int lens[1] = {(int)len};
        struct monarch_index_entry e;
        int64_t result;
        if (ask->describe(ask->dp, ask->owner, 1, keys, lens, &e, &result, 1, ask->timeout_ms) != 0 || result != DP_COMING) {
            if (result >= 0 && S_ISREG(e.mode))
                index_describe_fields(d, n, &e);
            return !index_listed_number(d, n);
        }
    }
}

/* Entry ``n`` (a listed file ``ask->owner`` owns) described from that owner's index (``ask->describe``:
 * datapath.c's dp_describe), with the next listed files of that owner in the index (its directory's,
 * mostly: a reader opens them too), up to DESCRIBE_AHEAD in one round trip: no PFS call here. An owner
 * that has not described ``n`` copies it first, and is asked again until it has
 * (described_when_copied). 1 if ``n`` is described; 0 (not described there, no answer in time): the
 * caller asks the PFS. */
static int describe_from_owner(struct worker *w, const struct owner_ask *ask, const char *key, uint32_t len, uint32_t n)
{
    struct door *d = w->d;
    uint32_t nums[DESCRIBE_AHEAD] = {n};
    const char *keys[DESCRIBE_AHEAD] = {key};
    int lens[DESCRIBE_AHEAD] = {(int)len}, count = 1;
    char *more = malloc((size_t)(DESCRIBE_AHEAD - 1) * INDEX_KEY_MAX);
    for (uint32_t m = n + 1; more && count < DESCRIBE_AHEAD && m <= ask->owners.n && m <= n + 4 * DESCRIBE_AHEAD; m++) {
        char *k = more + (size_t)(count - 1) * INDEX_KEY_MAX;
        uint32_t kl;
        if (index_listed_number(d, m) && entry_owner(d, &ask->owners, m) == ask->owner && (kl = index_key(d, m, k)) != 0) {
            nums[count] = m, keys[count] = k, lens[count] = (int)kl;
            count++;
        }
    }
    struct monarch_index_entry e[DESCRIBE_AHEAD];
    int64_t results[DESCRIBE_AHEAD];
    int coming = 0;
    if (ask->describe(ask->dp, ask->owner, count, keys, lens, e, results, 1, ask->timeout_ms) == 0) {
        for (int i = 0; i < count; i++)
            if (results[i] >= 0 && S_ISREG(e[i].mode))
                index_describe_fields(d, nums[i], &e[i]);
        coming = results[0] == DP_COMING;
    }
    free(more);
    return !index_listed_number(d, n) || (coming && described_when_copied(w, ask, key, len, n));
}

static int describe_named(struct worker *w, const char *key, uint32_t len, uint32_t n)
{
    uint32_t dlen;
    char name[NAME_MAX + 1], path[PATH_MAX];
    if (key_name(key, len, &dlen, name) != 0)
        return 0;
    struct stat st;
    int near = w->src_dir >= 0 && w->src_dir_len == dlen && !memcmp(w->src_dir_key, key, dlen);
    int r = near ? fstatat(w->src_dir, name, &st, AT_SYMLINK_NOFOLLOW)
                 : source_path(w->d, key, dlen, name, path) < 0 ? -1 : lstat(path, &st);
    if (r != 0 || !S_ISREG(st.st_mode))
        return 0;
    index_describe(w->d, n, &st);
    return 1;
}

static int open_copy_dir(struct worker *w, const char *key, uint32_t dlen)
{
    return open_key_dir(w->d->tiers[w->d->copy_slot], key, dlen + 1);  /* up to its last '/' */
}

static void close_cached_dirs(struct worker *w)
{
    if (w->src_dir >= 0)
        close(w->src_dir);
    if (w->key_dir >= 0)
        close(w->key_dir);
    w->src_dir = w->key_dir = -1;
    dirs_close(&w->peer_dirs);
}

/* Copy ``key`` (``f``: the snapshot's view of it) into the copy tier under a temporary
 * name; 0 and that name in ``tmp`` if the copy is whole and the source still the file the
 * snapshot saw; -2 if the source is not, -3 if the tier would not take it, -1 otherwise
 * (``in_order``: a read-ahead's key, its neighbours next).
 * ``*bytes_read`` counts what was read from the PFS, whatever the outcome. */
static int copy_in(struct worker *w, const char *key, uint32_t len, const struct idx_file *f,
                   char *dest, char *tmp, int *dir_fd, uint64_t *bytes_read, int in_order)
{
    struct door *d = w->d;
    uint32_t dlen;
    char name[NAME_MAX + 1];
    if (key_name(key, len, &dlen, name) != 0)
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
    int listed = w->listed_src;        /* described from this very descriptor: its attributes are the entry's */
    w->listed_src = -1;
    int in = listed >= 0 ? listed
                         : open_source(w, key, dlen, name, f->entry, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, in_order);
    int r = 0;
    struct stat st;
    int fl;
    if (in < 0)
        r = -1;
    else if (listed < 0 && (source_stat(in, w->src_fresh, STATX_WANTED, &st) < 0 || !S_ISREG(st.st_mode) ||
                            (uint64_t)st.st_size != f->size ||
                            (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec != f->mtime))
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
    dp_staged_fn *offer = NULL;
    struct dp *offer_dp = NULL;
    int64_t t0 = monarch_now_ns();
    int r = copy_in(w, key, len, f, dest, tmp, &kdir, &bytes_read, kind == EV_AHEAD);
    if (w->listed_src >= 0) {          /* a listed file's source, not read: the copy ended before (no room) */
        close(w->listed_src);
        w->listed_src = -1;
    }
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
        e->ring = 0;
        if (kind == EV_AHEAD)
            d->ahead.copies++;
        else
            d->count.copies++;
        d->count.bytes_read += bytes_read;
        post_event_locked(d, Q_BOOKS, kind, (uint32_t)d->copy_slot, key, len, f->entry, f->size, bytes_read, t1 - t0);
        published = d->copy_slot;
        if (d->peer.own_only && d->peer.offer) {
            offer = d->peer.offer;     /* read under the lock: the lane may be turned off meanwhile */
            offer_dp = d->peer.dp;
        }
        int before = d->copiers.flow.limit;
        inflight_completed(&d->copiers.flow, (t1 - t0) / 1e9, t1 / 1e9);
        raised = d->copiers.flow.limit > before;
    } else {
        e->state = K_PYTHON;           /* Python copies it, or finds why not, and says so */
        if (r == -3)
            d->allowed = 0;            /* the tier failed (full?): Python finds out, and allows again or not */
        d->books.lease[Q_BOOKS] += (int64_t)f->size;
        d->count.failures++;
        d->count.bytes_read += bytes_read;
        post_event_locked(d, Q_BOOKS, EV_FAILED, 0, key, len, f->entry, f->size, bytes_read, t1 - t0);
    }
    struct waiter *ready = d->answers.parked ? unpark_locked(d, key, len, hash) : NULL;
    if (ready && published >= 0)
        mark_answered(e, door_ms(d));
    if (kind == EV_AHEAD && --d->ahead.busy == 0 && !d->ahead.on)
        wake_python_locked(d);         /* its books see the lane's last copies, and that it ended */
    d->busy--;
    d->copies_busy--;
    pthread_cond_broadcast(&d->cv);
    if (raised)
        staff_locked(d);               /* more copiers for the lane, if it runs */
    else if (!(w >= d->copiers.threads && w < d->copiers.threads + COPIERS_MAX))
        pthread_cond_signal(&d->copiers.work_cv);  /* a worker's copy freed a slot (a copier's goes on itself) */
    pthread_mutex_unlock(&d->mu);
    if (ready)
        answer_parked(d, ready, published, dest);
    if (offer)                         /* other nodes fetch it through the data path from now on */
        offer(offer_dp, key, (int)len, published);
    return published;
}
