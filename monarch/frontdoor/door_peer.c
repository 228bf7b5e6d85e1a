/* Part of front_door.c, one translation unit: included there, in order, after the types and the
 * parts before it. Here: the peer lane: another node's file fetched through the C data path,
 * into the peer area or a memfd. */

/* The owner of the file ``f`` if the peer lane fetches it (another node's, small), else -1.
 * Under the lock. */
static int64_t peer_room(const struct door *d, uint64_t size)   /* sizes.allocated_size */
{
    return ((int64_t)size + d->peer_unit - 1) / d->peer_unit * d->peer_unit;
}

/* May the door copy index entry ``entry`` from the PFS? Alone on a node, any; on a sharded
 * node only its own (``owners``: -1), and none before the owners are known. Under the lock. */
static int own_file_locked(const struct door *d, uint32_t entry)
{
    return !d->own_only || (d->owners && entry > 0 && entry <= d->nowners && d->owners[entry - 1] < 0);
}

static int peer_owner_locked(const struct door *d, const struct idx_file *f)
{
    if (!d->peer_fetch || !d->peer_allowed || d->never_copy || !S_ISREG(f->mode) || f->size > MONARCH_INLINE_MAX ||
        f->entry == 0 || f->entry > d->nowners)
        return -1;
    int owner = d->owners[f->entry - 1];
    return owner >= 0 && owner != d->self_node ? owner : -1;
}

/* Fetch ``key`` (entry ``e``, BUSY, its size taken from the lease) from node ``owner`` into the
 * peer area, published as the stager's copies are, and answer: -1, or R_COPY_FAILED (handed
 * over: Python's protocol fetches it, or says why not). */
static int fetch_from_peer(struct worker *w, int fd, const char *req, const char *key, uint32_t len, uint32_t hash,
                           const struct idx_file *f, int owner)
{
    struct door *d = w->d;
    char dest[PATH_MAX], tmp[64];
    const char *area = d->tiers[d->peer_slot];
    const char *base = memrchr(key, '/', len);     /* valid_key: "<k>/...", so there is one */
    int64_t t0 = monarch_now_ns();
    int ok = base && snprintf(dest, sizeof dest, "%s/%.*s", area, (int)len, key) < (int)sizeof dest;
    snprintf(tmp, sizeof tmp, "%s%016llx", MONARCH_TMP_PREFIX, (unsigned long long)(w->tmp_seq++ * 0x9E3779B97F4A7C15ULL));
    /* the worker's directory of the last fetch, kept (an epoch's files share few directories):
     * no walk of the area's components per fetch; opened afresh if it went meanwhile */
    uint32_t dlen = base ? (uint32_t)(base - key) : 0;
    int kdir = ok ? cached_dir(&w->peer_dir, w->peer_dir_key, &w->peer_dir_len, key, dlen, open_peer_dir, w) : -1;
    const int create = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    int out = kdir < 0 ? -1 : openat(kdir, tmp, create, (f->mode & 0700) | 0600);
    if (out < 0 && kdir >= 0 && errno == ENOENT) {
        close(w->peer_dir);
        w->peer_dir = -1;
        kdir = cached_dir(&w->peer_dir, w->peer_dir_key, &w->peer_dir_len, key, dlen, open_peer_dir, w);
        out = kdir < 0 ? -1 : openat(kdir, tmp, create, (f->mode & 0700) | 0600);
    }
    struct timespec times[2] = {{f->mtime / 1000000000LL, f->mtime % 1000000000LL},
                                {f->mtime / 1000000000LL, f->mtime % 1000000000LL}};
    ok = out >= 0 && d->peer_fetch(d->peer_dp, owner, key, (int)len, f->size, out, d->peer_timeout_ms) == (int64_t)f->size
         && futimens(out, times) == 0;
    if (out >= 0 && close(out) < 0)
        ok = 0;
    const char *name = strrchr(dest, '/') + 1;
    /* renamed outside the door's lock, as copy_and_publish's copies are */
    ok = ok && !__atomic_load_n(&d->never_copy, __ATOMIC_ACQUIRE) && renameat(kdir, tmp, kdir, name) == 0;
    pthread_mutex_lock(&d->mu);
    struct entry *e = find(d, key, len, hash);   /* the table may have grown meanwhile */
    if (ok) {
        e->state = K_STAGED;
        e->slot = (uint8_t)d->peer_slot;
        e->answered = door_ms(d);
        d->peer_fetches++;
        post_event_locked(d, Q_PEER, EV_STAGED, (uint32_t)d->peer_slot, key, len, f->entry, f->size, 0, monarch_now_ns() - t0);
    } else {
        if (out >= 0)
            unlinkat(kdir, tmp, 0);
        ok = 0;
        e->state = K_PYTHON;           /* Python's protocol fetches it (staging it there first), or says why not */
        d->lease[Q_PEER] += peer_room(d, f->size);
        d->peer_failures++;
        post_event_locked(d, Q_PEER, EV_FAILED, (uint32_t)d->peer_slot, key, len, f->entry, f->size, 0, monarch_now_ns() - t0);
    }
    struct waiter *ready = d->parked ? unpark_locked(d, key, len, hash) : NULL;
    if (ready && ok)
        e->answered = door_ms(d);
    d->busy--;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (ready)
        answer_parked(d, ready, ok ? d->peer_slot : -1, dest);
    if (!ok)
        return R_COPY_FAILED;
    answer_open(d, fd, req, d->peer_slot, dest, (uint32_t)strlen(dest));  /* unsent: the shim reads the PFS */
    return -1;
}

/* An OPEN answered with a descriptor (ANSWER_FD): the frame and ``passed`` in one message. */
static int send_answer_fd(int fd, int32_t status, int passed)
{
    char frame[8] = {0};
    memcpy(frame, &status, 4);
    struct iovec iov = {frame, sizeof frame};
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &passed, sizeof(int));
    return sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof frame ? 0 : -1;
}

/* Another node's file with no room lent in the peer area (it is full of copies answered
 * within GRACE, or Python has not lent again yet): fetched into a sealed memfd passed with
 * the answer, the peer cache's transient copy, gone when the application closes it. Under
 * a global shuffle a copy kept in the area is read again on this node with the same odds
 * whichever it is, so nothing is evicted for it. The caller counted it BUSY (``fetch`` and
 * ``dp`` read under the lock: the lane may be turned off meanwhile). -1, or R_COPY_FAILED. */
static int fetch_transient(struct worker *w, int fd, const char *req, const char *key, uint32_t len, const struct idx_file *f,
                           int owner, peer_fetch_fn fetch, void *dp, int timeout_ms)
{
    struct door *d = w->d;
    int64_t t0 = monarch_now_ns();
    int m = (int)syscall(SYS_memfd_create, "monarch-peer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    int ok = m >= 0 && fetch(dp, owner, key, (int)len, f->size, m, timeout_ms) == (int64_t)f->size &&
             fcntl(m, F_ADD_SEALS, MONARCH_MEMFD_SEALS) == 0 && lseek(m, 0, SEEK_SET) == 0;
    pthread_mutex_lock(&d->mu);
    if (ok) {
        d->peer_transient++;
        post_event_locked(d, Q_PEER, EV_TRANSIENT, (uint32_t)d->peer_slot, key, len, f->entry, f->size, 0, monarch_now_ns() - t0);
    } else {
        d->peer_failures++;            /* handed over: Python's protocol fetches it, or says why not */
        post_event_locked(d, Q_PEER, EV_FAILED, (uint32_t)d->peer_slot, key, len, f->entry, f->size, 0, monarch_now_ns() - t0);
    }
    d->busy--;
    pthread_cond_broadcast(&d->cv);
    int keep = ok && keep_locked(d, asks_keep(req));
    pthread_mutex_unlock(&d->mu);
    int sent = ok && send_answer_fd(fd, d->peer_slot | MONARCH_ANSWER_FD | (keep ? MONARCH_ANSWER_KEPT : 0), m) == 0;
    if (sent)
        __atomic_add_fetch(&d->hits[d->peer_slot], 1, __ATOMIC_RELAXED);
    if (m >= 0)
        close(m);                      /* the application's descriptor is the one passed */
    if (!ok)
        return R_COPY_FAILED;
    finish_open(d, fd, keep, sent);
    return -1;
}
