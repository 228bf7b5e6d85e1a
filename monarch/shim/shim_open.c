/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_open.h). Here:
 * the open decision (probe, ask, or the PFS) and the invalidation before a write. */
#include "shim_open.h"

/* ---- the open decision ---- */

/* A copy the application may get: a regular file (a directory in a kept tier where the
 * dataset now has a file, a FIFO or socket planted there: never), its stat in *st. */
static int monarch_open_regular(int dirfd, const char *path, int flags, struct stat *st)
{
    int fd = MONARCH_RESOLVE(openat)(dirfd, path, flags);
    if (fd >= 0 && (monarch_sys_fstat(fd, st) != 0 || !S_ISREG(st->st_mode))) {
        real_close(fd);
        errno = EISDIR; /* any error but EBADF and ENOTDIR: the caller's "not a copy" */
        fd = -1;
    }
    return fd;
}

/* A copy in the peer area (slot MONARCH_SLOT_PEER) may be a file of the read-ahead lane's that
 * it reused for another key once its reader was past it (door_peer_ahead.c): an open that found
 * the old name just before it went would read the new key's bytes. The name still being this
 * file once it is open settles it, as the lane never changes a file anyone has open. 1 if the
 * copy ``fd`` (``st``, opened as ``path`` under ``dirfd``) may be used. */
static int monarch_still_named(unsigned slot, int dirfd, const char *path, const struct stat *st)
{
    struct stat now;
    return slot != MONARCH_SLOT_PEER
           || (monarch_sys_lstatat(dirfd, path, &now) == 0 && now.st_ino == st->st_ino && now.st_dev == st->st_dev);
}

static int monarch_open_staged(const char *path, int flags, unsigned slot)
{
    struct stat st;
    int fd = monarch_open_regular(AT_FDCWD, path, flags, &st);
    if (fd >= 0 && !monarch_still_named(slot, AT_FDCWD, path, &st)) {
        real_close(fd);
        errno = ENOENT;
        fd = -1;
    }
    return fd;
}

/* The copy of key in a shared probe dir (another job of this user may have staged it from
 * its own snapshot): used only when its size and mtime are those of the key's index entry
 * n + 1, else -1 (the daemon is asked, or the PFS read). Opened relative to the dir's
 * descriptor, as monarch_probe_open does; by path when the descriptor is no longer the dir. */
static int monarch_probe_open_shared(struct monarch_probe *pr, const char *key, size_t kl, int flags, uint32_t n,
                                     char *staged)
{
    struct monarch_index_entry e;
    struct stat st;
    if (!n || monarch_index_entry(n, &e) != 0)
        return -1;
    int dfd = monarch_probe_fd(pr), fd = -1;
    if (MONARCH_LIKELY(dfd >= 0)) {
        fd = monarch_open_regular(dfd, key, flags, &st);
        if (fd >= 0 && st.st_dev != pr->dev && !monarch_probe_fd_valid(pr, dfd)) {
            real_close(fd); /* the number is no longer the dir's */
            fd = -2;
        } else if (fd < 0 && (errno == EBADF || errno == ENOTDIR) && !monarch_probe_fd_valid(pr, dfd))
            fd = -2;
    }
    if ((dfd < 0 || fd == -2) && monarch_probe_path(pr, key, kl, staged) == 0)
        fd = monarch_open_regular(AT_FDCWD, staged, flags, &st);
    if (fd < 0)
        return -1;
    if ((uint64_t)st.st_size == e.size && (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec == e.mtime_ns)
        return fd;
    real_close(fd);
    return -1;
}

/* The copy of key in probe dir pr, relative to the dir's descriptor (see "probe
 * directories" in shim_paths.c), else by path into staged[PATH_MAX]; -1 if none. A copy
 * through the descriptor is used at once when it is on the dir's device and of the size and
 * mtime of the key's index entry n + 1 (0: none); otherwise, or when the open fails with
 * EBADF or ENOTDIR, only if the descriptor is still the dir (else by path). */
static int monarch_probe_open(struct monarch_probe *pr, const char *key, size_t kl, int flags, uint32_t n,
                              char *staged)
{
    if (pr->shared)
        return monarch_probe_open_shared(pr, key, kl, flags, n, staged);
    int dfd = monarch_probe_fd(pr);
    if (MONARCH_LIKELY(dfd >= 0)) {
        struct stat st;
        struct monarch_index_entry e;
        int fd = monarch_open_regular(dfd, key, flags, &st);
        if (fd >= 0) {
            if (((st.st_dev == pr->dev && monarch_index_entry(n, &e) == 0 && (uint64_t)st.st_size == e.size
                  && (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec == e.mtime_ns)
                 || monarch_probe_fd_valid(pr, dfd))
                && monarch_still_named(pr->slot, dfd, key, &st))
                return fd;
            real_close(fd);
        } else if ((errno != EBADF && errno != ENOTDIR) || monarch_probe_fd_valid(pr, dfd))
            return -1;
        /* the number is no longer the dir's: by path, as before */
    }
    return monarch_probe_path(pr, key, kl, staged) == 0 ? monarch_open_staged(staged, flags, pr->slot) : -1;
}

/* A descriptor the daemon passed for key (a decompressed copy, another node's file): a regular
 * file, sealed against any change (MONARCH_MEMFD_SEALS) or a read-only open of a nameless one
 * (the door's memfd pool), of the snapshot's size; close-on-exec only
 * if the application asked for it (it arrived with FD_CLOEXEC set). */
static int monarch_passed_ok(int fd, const char *key, size_t kl, int flags)
{
    struct stat st;
    struct monarch_index_entry e;
    uint32_t n = monarch_index_lookup(key, kl);
    if (monarch_sys_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    long seals = syscall(SYS_fcntl, fd, F_GET_SEALS);
    if (seals < 0 || (seals & MONARCH_MEMFD_SEALS) != MONARCH_MEMFD_SEALS) {
        /* or a read-only open of a nameless file: a memfd of the front door's pool, which the
         * door rewrites only once no open of it is left anywhere (a write lease says so) */
        long fl = syscall(SYS_fcntl, fd, F_GETFL);
        if (fl < 0 || (fl & O_ACCMODE) != O_RDONLY || st.st_nlink != 0)
            return 0;
    }
    if (n && monarch_index_entry(n, &e) == 0 && (uint64_t)st.st_size != e.size)
        return 0;
    if (!(flags & O_CLOEXEC) && syscall(SYS_fcntl, fd, F_SETFD, 0) != 0)
        return 0;
    return 1;
}

static inline int monarch_start(void)
{
    if (MONARCH_UNLIKELY(!__atomic_load_n(&monarch_ready, __ATOMIC_ACQUIRE)))
        monarch_ensure_init();
    return monarch_enabled;
}

/*
 * Before the application's open: -1 = not managed (pass through); 0 = managed,
 * open the PFS original with the application's own call (monarch_after counts
 * it); > 0 = a staged copy is open in *fdp, counted under the returned slot,
 * its source's index entry + 1 in *entryp; MONARCH_HOW_EIO = a store's file that
 * could not be served: the open fails with EIO (there is no original to open).
 */
static int monarch_before(int dirfd, const char *path, int flags, int *fdp, uint32_t *entryp)
{
    if (monarch_guard || !path || !path[0])
        return -1;
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC | O_DIRECTORY | O_PATH)))
        return -1;
    if (!monarch_start() || monarch_wants_dir(path))
        return -1;
    char key[MONARCH_KEY_MAX];
    size_t kl;
    if (monarch_key(dirfd, path, key, &kl) != 0)
        return -1;

    /* Managed: from here on, the slow path. */
    int saved = errno;
    monarch_guard = 1;
    /* No tier copy before the snapshot is ready: kept copies are checked against it first. */
    int ix = monarch_index_ready();
    int early = monarch_index_pending_extra(ix);
    monarch_pfs_why = early;
    int store = monarch_store_key(key);
    if (store && ix != MONARCH_IX_OFF && early < 0 && !monarch_is_plain_file(key, kl)) {
        /* not a file of the store's manifest: the kernel's answer (ENOENT: no such path on disk) */
        monarch_guard = 0;
        errno = saved;
        return -1;
    }
    if (store && (ix == MONARCH_IX_OFF || early >= 0)) {
        MONARCH_DEBUG(1, "open %s: a store's file and no snapshot index: EIO", path);
        monarch_pfs_why = -1;
        monarch_guard = 0;
        errno = saved;
        return MONARCH_HOW_EIO;
    }
    if (ix == MONARCH_IX_OFF || early >= 0 || ((flags & O_NOFOLLOW) && !monarch_is_plain_file(key, kl))) {
        /* OFF, or not ready yet (EARLY, LOST): the PFS original, counted. O_NOFOLLOW of a name
         * the index cannot vouch for: the kernel's answer (ELOOP for a symlink) is the app's,
         * uncounted. */
        monarch_guard = 0;
        errno = saved;
        return ix == MONARCH_IX_OFF || early >= 0 ? MONARCH_SLOT_PFS : -1;
    }
    char staged[PATH_MAX];
    int slot = MONARCH_SLOT_PFS, fd = -1;
    uint32_t entry = monarch_index_lookup(key, kl); /* once: the probe checks a copy against it, out: keeps it */
    /* a tmpfs copy may refuse O_DIRECT, O_NOATIME; a copy is a file, never a symlink */
    int pflags = (flags & ~(O_DIRECT | O_NOATIME)) | O_NOFOLLOW;
    for (unsigned i = 0; i < monarch_nprobes && __atomic_load_n(&monarch_probing, __ATOMIC_RELAXED); i++) {
        struct monarch_probe *pr = &monarch_probes[i];
        if ((fd = monarch_probe_open(pr, key, kl, pflags, entry, staged)) >= 0) {
            MONARCH_DEBUG(1, "open %s: hit slot %u %s/%s (fd %d)", path, pr->slot, pr->dir, key, fd);
            slot = (int)pr->slot;
            goto out;
        }
    }
    /* no raw or decoded copy: a compressed one (<probe dir>/.z/<key>), decoded here (shim_zstd.c) */
    for (unsigned i = 0; i < monarch_nprobes && __atomic_load_n(&monarch_probing, __ATOMIC_RELAXED); i++) {
        int found;
        if ((fd = monarch_zstd_open(i, key, kl, flags, &found)) >= 0) {
            MONARCH_DEBUG(1, "open %s: hit slot %u, decoded in this process (fd %d)", path, monarch_probes[i].slot, fd);
            slot = (int)monarch_probes[i].slot;
            goto out;
        }
        if (found)
            break; /* a frame this process cannot decode: the daemon can, or says PFS */
    }
    if (MONARCH_UNLIKELY(!store && monarch_tiers_unseen())) {
        /* a tier folder of the daemon's is not here: its answers would name copies this process
         * cannot open, at a request each; the tiers it sees were probed above */
        monarch_guard = 0;
        errno = saved;
        return MONARCH_SLOT_PFS;
    }
    int answer = INT_MIN;
    /* Asked once more when the copy the daemon named is gone before it opened (evicted in
     * between: a decoded file trimmed as its tier filled); the second answer stages it anew. */
    for (int ask = 0; ask < 2; ask++) {
        int passed = -1, unanswered;
        answer = monarch_request_why(MONARCH_VERB_OPEN, key, kl, staged, sizeof staged, &passed, monarch_timeout_ms,
                                     &unanswered);
        if (answer == INT_MIN && monarch_have_socket && unanswered == MONARCH_LOST)
            monarch_pfs_why = MONARCH_EXTRA_LOST_OPENS; /* the daemon gone or silent: the report says so */
        if (answer > 0 && (answer & MONARCH_ANSWER_BLOCKS)) {
            /* staged by blocks: the application's own open of the PFS original, and its staged
             * blocks read from the copy (shim_blocks.c), for a file whose route, published in the
             * index, is the blocks' (never bytes of a copy the snapshot does not route so) */
            int s = answer & ~MONARCH_ANSWER_BLOCKS;
            struct monarch_index_entry e;
            if (passed >= 0)
                real_close(passed);
            if (s > MONARCH_SLOT_PFS && s < MONARCH_MAX_SLOTS && __atomic_load_n(&monarch_probing, __ATOMIC_RELAXED)
                && entry && monarch_index_entry(entry, &e) == 0 && monarch_index_routes(e.flags, MONARCH_ROUTE_BLOCKS))
                monarch_part_pending = monarch_part_load((unsigned)s, key, kl, entry);
            MONARCH_DEBUG(1, "open %s: staged by blocks in slot %d, %s", path, s,
                          monarch_part_pending ? "its staged blocks read from the copy" : "the PFS only");
            break;
        }
        if (answer > 0 && (answer & MONARCH_ANSWER_FD) && passed >= 0) {
            int s = answer & ~MONARCH_ANSWER_FD;
            if (s > MONARCH_SLOT_PFS && s < MONARCH_MAX_SLOTS && monarch_passed_ok(passed, key, kl, flags)) {
                MONARCH_DEBUG(1, "open %s: daemon slot %d, a decompressed copy (fd %d)", path, s, passed);
                fd = passed;
                slot = s;
                goto out;
            }
            MONARCH_DEBUG(1, "open %s: daemon passed fd %d, which is not a sealed copy of the file: refused", path,
                          passed);
        }
        if (passed >= 0)
            real_close(passed);
        if (answer <= MONARCH_SLOT_PFS || answer >= MONARCH_MAX_SLOTS)
            break;
        if (!monarch_answer_allowed(staged)) {
            MONARCH_DEBUG(1, "open %s: daemon named %.200s, outside the probe dirs: refused", path, staged);
            break;
        }
        monarch_probe_dirs_check();
        if ((fd = monarch_open_staged(staged, pflags, (unsigned)answer)) >= 0) {
            MONARCH_DEBUG(1, "open %s: daemon slot %d %s (fd %d)", path, answer, staged, fd);
            slot = answer;
            goto out;
        }
        int gone = errno == ENOENT;
        MONARCH_DEBUG(1, "open %s: daemon named %s, which does not open: %s", path, staged, strerror(errno));
        if (!gone)
            break;
    }
    if (store) {
        MONARCH_DEBUG(1, "open %s: a store's file the daemon did not serve (%d): EIO", path, answer);
        monarch_pfs_why = -1;
        slot = MONARCH_HOW_EIO;
        goto out;
    }
    MONARCH_DEBUG(1, "open %s: PFS (daemon %d)", path, answer);
out:
    if (slot > MONARCH_SLOT_PFS) {
        *fdp = fd;
        *entryp = entry;
    }
    monarch_guard = 0;
    errno = saved;
    return slot;
}

/* After the application's own open call (pass-through or PFS original). */
static inline void monarch_after(int fd, int how)
{
    struct stat st;
    if (how == MONARCH_SLOT_PFS && fd >= 0 && monarch_sys_fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        monarch_forget(fd); /* a directory (tar, opendir without O_DIRECTORY): not a file open */
        monarch_part_attach(-1);
    } else if (how == MONARCH_SLOT_PFS) {
        monarch_track(fd, MONARCH_SLOT_PFS, 0);
        monarch_part_attach(fd); /* a file staged by blocks: fd reads its staged blocks from the copy */
        uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
        if (fd >= 0 && c && monarch_pfs_why >= 0) /* why it is the PFS's: not ready yet, or no daemon */
            __atomic_fetch_add(monarch_extra(c, (unsigned)monarch_pfs_why), 1, __ATOMIC_RELAXED);
    }
    if (how == MONARCH_SLOT_PFS)
        monarch_pfs_why = -1;
    else if (fd >= 0)
        monarch_forget(fd); /* a stale entry from a close we did not see */
}

/*
 * Before a call that changes (dirfd, path) -- a write-open, creat, rename,
 * unlink, rmdir, truncate -- when it lies under a root: the daemon drops its
 * copies of the key (INVALIDATE) and we remove <probe dir>/<key> ourselves.
 * Without the daemon's confirmation this process stops probing tiers for good:
 * a copy we could not remove (a directory's files, another slot) is never read.
 */
/* Unlink <probe dir>/<key> without following a symlink at any step below the probe dir
 * (whose real path the daemon resolved and checked): each directory of the key is opened
 * O_NOFOLLOW from the one before, and the name is unlinked there (unlinkat). A symlink
 * planted inside the tier cannot send the unlink elsewhere. 0, or -1 with errno. */
static int monarch_unlink_below(const struct monarch_probe *pr, const char *key, size_t kl)
{
    char name[MONARCH_KEY_MAX + 3];
    if (kl >= sizeof name)
        return -1;
    memcpy(name, key, kl + 1);
    const int dflags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int dfd = MONARCH_RESOLVE(openat)(AT_FDCWD, pr->dir, dflags);
    char *part = name, *slash;
    while (dfd >= 0 && (slash = strchr(part, '/')) != NULL) {
        *slash = '\0';
        int next = strcmp(part, ".") && strcmp(part, "..") ? MONARCH_RESOLVE(openat)(dfd, part, dflags) : -1;
        MONARCH_RESOLVE(close)(dfd);
        dfd = next;
        part = slash + 1;
    }
    if (dfd < 0)
        return -1;
    int r = (int)syscall(SYS_unlinkat, dfd, part, 0); /* the real one: unlinkat is wrapped */
    int saved = errno;
    MONARCH_RESOLVE(close)(dfd);
    errno = saved;
    return r;
}

static void monarch_invalidate_key(const char *key, size_t kl, unsigned k, const char *path)
{
    /* First, for every process of the job on this node: root k's metadata is the PFS's now. */
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && !(__atomic_fetch_or(monarch_extra(c, MONARCH_EXTRA_META_OFF), monarch_root_bit(k), __ATOMIC_ACQ_REL)
               & monarch_root_bit(k)))
        MONARCH_DEBUG(1, "metadata of root %u: from the PFS from now on (the job changes %s)", k, path);
    if (key[kl - 1] == '/') /* the root itself: no file key to invalidate */
        return;
    int status = monarch_request(MONARCH_VERB_INVALIDATE, key, kl, NULL, 0, NULL, monarch_timeout_ms);
    if (status != 0 && __atomic_load_n(&monarch_probing, __ATOMIC_RELAXED)) {
        __atomic_store_n(&monarch_probing, 0, __ATOMIC_RELAXED);
        MONARCH_DEBUG(1, "invalidate %s: daemon did not confirm (%d); no more tier probes in this process", path,
                      status);
    }
    char staged[PATH_MAX];
    for (unsigned i = 0; i < monarch_nprobes; i++)
        if (monarch_probe_path(&monarch_probes[i], key, kl, staged) == 0
            && monarch_unlink_below(&monarch_probes[i], key, kl) == 0)
            MONARCH_DEBUG(1, "invalidate %s: removed %s", path, staged);
    /* a compressed copy (<probe dir>/.z/<key>) too, so no copy of the old bytes outlives the write */
    char zkey[MONARCH_KEY_MAX + 3];
    if (kl + 3 < sizeof zkey) {
        memcpy(zkey, ".z/", 3);
        memcpy(zkey + 3, key, kl + 1);
        for (unsigned i = 0; i < monarch_nprobes; i++)
            if (monarch_probe_path(&monarch_probes[i], zkey, kl + 3, staged) == 0
                && monarch_unlink_below(&monarch_probes[i], zkey, kl + 3) == 0)
                MONARCH_DEBUG(1, "invalidate %s: removed %s", path, staged);
    }
    MONARCH_DEBUG(1, "invalidate %s: key %s, daemon %d", path, key, status);
}

/* abs with its symlinks resolved, as the kernel will follow them, into out[PATH_MAX]: the
 * whole path, or (a name not there yet) its directory and then the name; -1 if neither. */
static int monarch_resolved(const char *abs, char *out)
{
    if (realpath(abs, out))
        return 0;
    const char *slash = strrchr(abs, '/');
    if (!slash || !slash[1])
        return -1;
    char dir[PATH_MAX];
    size_t dl = (size_t)(slash - abs);
    memcpy(dir, abs, dl);
    dir[dl] = '\0';
    if (!realpath(dl ? dir : "/", out))
        return -1;
    size_t ol = strlen(out), nl = strlen(slash + 1);
    if (ol + 1 + nl >= PATH_MAX)
        return -1;
    if (ol > 1)
        out[ol++] = '/';
    memcpy(out + ol, slash + 1, nl + 1);
    return 0;
}

static void monarch_invalidate(int dirfd, const char *path)
{
    if (monarch_guard || !path || !path[0] || !monarch_start())
        return;
    char key[MONARCH_KEY_MAX], abs[PATH_MAX];
    size_t kl = 0;
    unsigned k;
    int saved = errno;
    monarch_guard = 1;
    int named = monarch_key_abs(dirfd, path, 1, key, &kl, &k, abs) == 0;
    if (named)
        monarch_invalidate_key(key, kl, k, path);
    /* A write through a symlink under a root changes its target: the target's key goes too
     * (a rename or unlink of the link itself then drops a copy it did not have to:
     * harmless). Only for names under a root: resolving costs lookups, and every write
     * elsewhere (checkpoints, logs) would pay them. */
    char resolved[PATH_MAX], rkey[MONARCH_KEY_MAX];
    size_t rkl;
    unsigned rk;
    if (named && monarch_resolved(abs, resolved) == 0 && strcmp(resolved, abs) != 0
        && monarch_key_abs(AT_FDCWD, resolved, 1, rkey, &rkl, &rk, abs) == 0
        && !(rkl == kl && memcmp(rkey, key, kl) == 0))
        monarch_invalidate_key(rkey, rkl, rk, path);
    monarch_guard = 0;
    errno = saved;
}

/* A change through a descriptor (fchmod, fchown, futimens): its path, as /proc names it. */
static void monarch_invalidate_fd(int fd)
{
    if (fd >= 0 && !monarch_guard && monarch_start())
        monarch_invalidate(fd, ".");
}

/* Both paths of a rename (or one: p2 NULL). */
static void monarch_invalidate2(int d1, const char *p1, int d2, const char *p2)
{
    monarch_invalidate(d1, p1);
    if (p2)
        monarch_invalidate(d2, p2);
}

/* fopen mode -> open flags when the mode is read-only, else -1. */
static int monarch_fopen_flags(const char *mode)
{
    if (!mode || mode[0] != 'r')
        return -1;
    int flags = O_RDONLY;
    for (const char *m = mode + 1; *m && *m != ','; m++) {
        if (*m == '+')
            return -1;
        if (*m == 'e')
            flags |= O_CLOEXEC;
    }
    return flags;
}

