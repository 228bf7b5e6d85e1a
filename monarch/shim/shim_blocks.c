/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_blocks.h).
 * Here: files staged by blocks (a large file the daemon copies block by block while the application
 * reads it: monarch/node/stage/blocks.py).
 *
 * The application's descriptor is the PFS original's (opened by its own call), so its
 * fstat, lseek and every byte not yet staged are the source's. Beside it the shim keeps a
 * "part": the local copy (<probe dir>/.blocks/<key>, opened read-only) and its block map
 * (<probe dir>/.blockmap/<key>, mapped shared: a state byte per block). Then:
 *   - a read, pread or readv whose blocks are all STAGED is read from the copy (a read()
 *     moves the descriptor's offset itself); any other read goes to the PFS at the
 *     application's own size, and its ABSENT blocks are marked WANTED (the daemon stages
 *     those first). Never a whole block on the application's time.
 *   - a read-only mapping of the descriptor is made on the PFS and registered; a thread of
 *     the shim's (started with the first such mapping, and in a fork child that has some by
 *     its first read, open or mapping) maps each run of STAGED blocks over the same addresses from the copy (MAP_FIXED:
 *     the same bytes, so the application cannot tell), until every block is moved or the
 *     daemon says no more will come. munmap, mremap and a MAP_FIXED mmap over a registered
 *     range take the registry's lock, so no range is ever mapped again once the
 *     application let it go. On a cluster the blocks not yet local are guarded meanwhile, so
 *     that a fault waits for its block from the owner rather than read the PFS (shim_guard.c).
 * Descriptors made with dup* and inherited by fork children share the part; close drops it.
 * A FILE opened on such a file (fopen, fdopen) reads through these reads too (shim_stdio.c).
 * A descriptor carried across exec, or reopened through /proc, reads the PFS.
 */
#include "shim_blocks.h"

static uint16_t monarch_fd_part[MONARCH_MAX_FDS]; /* part index + 1 of a descriptor; 0: none */
/* part index + 1 whose copy is open as this descriptor: an application that closes descriptors
 * it did not open (closerange in a worker) takes the copy away, never gets it read in its place */
static uint16_t monarch_copy_fd_part[MONARCH_MAX_FDS];
static int monarch_remapper_running;
/* set (never cleared) before this process's first part is made: until then fork takes no lock */
static int monarch_blocks_used;
/* a fork child has mappings to move: its first read, open or mapping starts its remapper
 * (a thread is not started from the fork handler, where only async-signal-safe work belongs) */
static int monarch_remapper_owed;


/* The shim's own threads and locks call libc's functions, not the shim's interposed names: a
 * signal mask set here is the kernel's, a thread started here is not the application's. */
static void monarch_sigmask(int how, const sigset_t *set, sigset_t *old)
{
    __typeof__(real_pthread_sigmask) real_ = MONARCH_RESOLVE(pthread_sigmask);
    if (real_)
        real_(how, set, old);
}

static void monarch_lock_take(pthread_mutex_t *mu, unsigned *depth, sigset_t *old)
{
    if (old) {
        sigset_t all;
        sigfillset(&all);
        monarch_sigmask(SIG_BLOCK, &all, old);
    }
    if ((*depth)++ == 0)
        pthread_mutex_lock(mu);
}

static void monarch_lock_give(pthread_mutex_t *mu, unsigned *depth, const sigset_t *old)
{
    if (--(*depth) == 0)
        pthread_mutex_unlock(mu);
    if (old)
        monarch_sigmask(SIG_SETMASK, old, NULL);
}


static inline unsigned monarch_part_of(int fd)
{
    return (unsigned)fd < MONARCH_MAX_FDS ? __atomic_load_n(&monarch_fd_part[fd], __ATOMIC_RELAXED) : 0;
}

static inline void monarch_extra_add(unsigned which, uint64_t n)
{
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && n)
        __atomic_fetch_add(monarch_extra(c, which), n, __ATOMIC_RELAXED);
}

/* ---- parts: made from an OPEN answer, held by descriptors and mappings ---- */

/* Release one hold on part i + 1 (under monarch_parts_mu). */
static void monarch_part_unref_locked(unsigned p)
{
    struct monarch_part *pt = &monarch_parts[p - 1];
    if (--pt->refs > 0)
        return;
    if (pt->copy_fd >= 0) {
        if ((unsigned)pt->copy_fd < MONARCH_MAX_FDS)
            __atomic_store_n(&monarch_copy_fd_part[pt->copy_fd], 0, __ATOMIC_RELAXED);
        real_close(pt->copy_fd);
    }
    MONARCH_RESOLVE(munmap)(pt->hdr, pt->map_len); /* the shim's own mapping: never registered */
    free(pt->key);
    free(pt->records_counted);
    memset(pt, 0, sizeof *pt);
}

/* The part of key (its copy and map in probe slot `slot`), checked against the index entry
 * n + 1: index + 1, or 0 when anything is off (the application then reads the PFS only). */
static unsigned monarch_part_load(unsigned slot, const char *key, size_t kl, uint32_t n)
{
    if (!__atomic_load_n(&monarch_blocks_used, __ATOMIC_RELAXED))
        __atomic_store_n(&monarch_blocks_used, 1, __ATOMIC_SEQ_CST);
    struct monarch_probe *pr = NULL;
    struct monarch_index_entry e;
    for (unsigned i = 0; i < monarch_nprobes; i++)
        if (monarch_probes[i].slot == slot)
            pr = &monarch_probes[i];
    if (!pr || !n || monarch_index_entry(n, &e) != 0)
        return 0;
    char copy[PATH_MAX], map[PATH_MAX];
    if (snprintf(copy, sizeof copy, "%s/%s/%.*s", pr->dir, MONARCH_BLOCKS_DIR, (int)kl, key) >= (int)sizeof copy
        || snprintf(map, sizeof map, "%s/%s/%.*s", pr->dir, MONARCH_BLOCKMAP_DIR, (int)kl, key) >= (int)sizeof map)
        return 0;
    struct stat st;
    int mfd = MONARCH_RESOLVE(openat)(AT_FDCWD, map, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (mfd < 0)
        return 0;
    void *m = MAP_FAILED;
    size_t len = 0;
    if (monarch_sys_fstat(mfd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid()
        && !(st.st_mode & (S_IWGRP | S_IWOTH)) && st.st_size >= MONARCH_BLOCKMAP_HEADER_SIZE) {
        len = (size_t)st.st_size;
        m = MONARCH_RESOLVE(mmap)(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    }
    real_close(mfd);
    if (m == MAP_FAILED)
        return 0;
    struct monarch_blockmap_header *h = m;
    int copy_fd = -1;
    if (h->magic != MONARCH_BLOCKMAP_MAGIC || h->version != MONARCH_BLOCKMAP_VERSION || h->block_shift < 12
        || h->block_shift > 30 || h->size != e.size || h->mtime_ns != e.mtime_ns
        || h->blocks != (h->size + (1ULL << h->block_shift) - 1) >> h->block_shift
        || len != MONARCH_BLOCKMAP_SIZE(h->blocks))
        goto bad;
    copy_fd = MONARCH_RESOLVE(openat)(AT_FDCWD, copy, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (copy_fd < 0 || monarch_sys_fstat(copy_fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid()
        || (uint64_t)st.st_size != h->size)
        goto bad;
    sigset_t held_;
    MONARCH_PARTS_LOCK(held_);
    for (unsigned i = 0; i < MONARCH_MAX_PARTS; i++) {
        struct monarch_part *pt = &monarch_parts[i];
        if (pt->refs)
            continue;
        *pt = (struct monarch_part){.refs = 1, .copy_fd = copy_fd, .slot = slot, .shift = h->block_shift,
                                    .size = h->size, .blocks = h->blocks, .copy_dev = st.st_dev,
                                    .copy_ino = st.st_ino, .hdr = h,
                                    .states = (uint8_t *)m + MONARCH_BLOCKMAP_HEADER_SIZE, .map_len = len,
                                    .owners = (const int16_t *)((char *)m + MONARCH_BLOCKMAP_OWNERS_AT(h->blocks)),
                                    .key = malloc(kl), .key_len = kl};
        if (pt->key)
            memcpy(pt->key, key, kl);
        if ((unsigned)copy_fd < MONARCH_MAX_FDS)
            __atomic_store_n(&monarch_copy_fd_part[copy_fd], (uint16_t)(i + 1), __ATOMIC_RELAXED);
        MONARCH_PARTS_UNLOCK(held_);
        monarch_extra_add(MONARCH_EXTRA_BLOCK_OPENS, 1);
        return i + 1;
    }
    MONARCH_PARTS_UNLOCK(held_);
    MONARCH_DEBUG(1, "%s: more than %d files staged by blocks open at once: read from the PFS", key,
                  MONARCH_MAX_PARTS);
bad:
    if (copy_fd >= 0)
        real_close(copy_fd);
    MONARCH_RESOLVE(munmap)(m, len);
    MONARCH_DEBUG(1, "%s: its block copy or map is not the snapshot's file: read from the PFS", key);
    return 0;
}

/* After the application's own open of a file the daemon stages by blocks: fd holds the part. */
static void monarch_part_attach(int fd)
{
    unsigned p = monarch_part_pending;
    monarch_part_pending = 0;
    if (!p)
        return;
    if ((unsigned)fd < MONARCH_MAX_FDS && fd >= 0) {
        __atomic_store_n(&monarch_fd_part[fd], (uint16_t)p, __ATOMIC_RELAXED);
        return;
    }
    sigset_t held_;
    MONARCH_PARTS_LOCK(held_);
    monarch_part_unref_locked(p);
    MONARCH_PARTS_UNLOCK(held_);
}

/* fd no longer holds its part (closed, or its number reused). */
static void monarch_part_drop(int fd)
{
    unsigned p = monarch_part_of(fd);
    if (!p)
        return;
    sigset_t held_;
    MONARCH_PARTS_LOCK(held_);
    if (__atomic_load_n(&monarch_fd_part[fd], __ATOMIC_RELAXED) == p) {
        __atomic_store_n(&monarch_fd_part[fd], 0, __ATOMIC_RELAXED);
        monarch_part_unref_locked(p);
    }
    MONARCH_PARTS_UNLOCK(held_);
}

/* The application closes [first, last] (close, dup2 over, close_range): a part's copy among
 * them is the part's no more (its reads go to the PFS, its mappings stay as they are), before
 * the number can name another file. Under both locks: the remapper maps only a live copy. */
static void monarch_part_copy_closing(unsigned first, unsigned last)
{
    monarch_guard_fds_closing(first, last);
    if (last >= MONARCH_MAX_FDS)
        last = MONARCH_MAX_FDS - 1;
    for (unsigned fd = first; fd <= last; fd++) {
        unsigned p = __atomic_load_n(&monarch_copy_fd_part[fd], __ATOMIC_RELAXED);
        if (MONARCH_LIKELY(!p) || monarch_guard)
            continue;
        sigset_t maps_held_, held_;
        MONARCH_MAPS_LOCK(maps_held_);
        MONARCH_PARTS_LOCK(held_);
        if (monarch_parts[p - 1].copy_fd == (int)fd) {
            monarch_parts[p - 1].copy_fd = -1;
            __atomic_store_n(&monarch_copy_fd_part[fd], 0, __ATOMIC_RELAXED);
        }
        MONARCH_PARTS_UNLOCK(held_);
        MONARCH_MAPS_UNLOCK(maps_held_);
    }
}

/* newfd is a duplicate of oldfd (dup*, F_DUPFD): it holds oldfd's part too. */
static void monarch_part_dup(int oldfd, int newfd)
{
    unsigned p = monarch_part_of(oldfd);
    if (monarch_part_of(newfd))
        monarch_part_drop(newfd);
    if (!p || (unsigned)newfd >= MONARCH_MAX_FDS)
        return;
    sigset_t held_;
    MONARCH_PARTS_LOCK(held_);
    monarch_parts[p - 1].refs++;
    __atomic_store_n(&monarch_fd_part[newfd], (uint16_t)p, __ATOMIC_RELAXED);
    MONARCH_PARTS_UNLOCK(held_);
}

/* ---- reads: from the copy when every block of the range is staged ---- */
#define MONARCH_WAIT_MIN (64 << 10) /* a read of a cluster's blocks not staged waits for them from this size */

/* Are the blocks of [off, off + n) all in the copy? 1: all STAGED; 2: all STAGED or LENT (a
 * window's: the read is right only if the map's evictions stay as they were before this look,
 * monarch_part_lent_kept); 0: not, and the ABSENT ones are marked WANTED. In a window only a read
 * that waits for them wants them: another owner's whole block for a few bytes read at random
 * would push out the blocks a reader in order is to read. */
static int monarch_part_staged(struct monarch_part *pt, uint64_t off, uint64_t n)
{
    uint64_t first = off >> pt->shift, last = (off + n - 1) >> pt->shift;
    int all = 1, lent = 0;
    int want = n >= MONARCH_WAIT_MIN || !__atomic_load_n(&pt->hdr->window, __ATOMIC_ACQUIRE);
    if (last >= pt->blocks)
        last = pt->blocks - 1;
    for (uint64_t b = first; b <= last; b++) {
        uint8_t s = __atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE);
        if (s == MONARCH_BLOCK_STAGED)
            continue;
        if (s == MONARCH_BLOCK_LENT) {
            lent = 1;
            continue;
        }
        all = 0;
        uint8_t absent = MONARCH_BLOCK_ABSENT;
        if (s == absent && want) /* never over STAGED: the daemon's mark wins */
            __atomic_compare_exchange_n(&pt->states[b], &absent, MONARCH_BLOCK_WANTED, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED);
    }
    return all ? 1 + lent : 0;
}

/* monarch_part_staged, and the map's evictions as they were just before it looked (*evictions). */
static inline int monarch_part_here(struct monarch_part *pt, uint64_t off, uint64_t n, uint64_t *evictions)
{
    *evictions = __atomic_load_n(&pt->hdr->evictions, __ATOMIC_ACQUIRE);
    return monarch_part_staged(pt, off, n);
}

/* After a read of the copy that found LENT blocks (monarch_part_staged's 2) with the map's
 * evictions at `evictions` before it looked: did none leave meanwhile? (Else the bytes read may
 * be a dropped block's, and the PFS answers the read.) */
static inline int monarch_part_lent_kept(struct monarch_part *pt, int local, uint64_t evictions)
{
    return local != 2 || __atomic_load_n(&pt->hdr->evictions, __ATOMIC_ACQUIRE) == evictions;
}

/* A cluster's blocks not staged come from their owners' copies (the map's wait_us is set): a
 * read of MONARCH_WAIT_MIN bytes or more of them waits for them, up to wait_us, rather than read
 * the PFS beside their owner (the PFS once for the cluster; a peer's block costs what the PFS's
 * would). A smaller read goes to the PFS at once: its bytes are few, and it would wait for a
 * whole run of blocks. monarch_part_staged's answer once every block of [off, off + n) is here. */
static int monarch_part_wait(struct monarch_part *pt, uint64_t off, uint64_t n, uint64_t *evictions)
{
    uint64_t wait_us = __atomic_load_n(&pt->hdr->wait_us, __ATOMIC_ACQUIRE);
    if (!wait_us || n < MONARCH_WAIT_MIN)
        return 0;
    uint64_t waited_us = 0, step_us = 100;
    while (waited_us < wait_us && !__atomic_load_n(&pt->hdr->done, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, (long)step_us * 1000L};
        nanosleep(&ts, NULL); /* (a signal ends it early: the time is counted as slept) */
        waited_us += step_us;
        int local = monarch_part_here(pt, off, n, evictions);
        if (local)
            return local;
        step_us = step_us * 2 > 2000 ? 2000 : step_us * 2;
    }
    return monarch_part_here(pt, off, n, evictions);
}

/* The file offset `o` (-1: the descriptor's own) and length of a read of `n` bytes; 0 when the
 * read is to go to the PFS (past the end, or a block not staged), else monarch_part_staged's, with
 * the map's evictions as they were just before the look that found the blocks here. */
static int monarch_part_range(int fd, struct monarch_part *pt, off_t *o, uint64_t n, uint64_t *evictions)
{
    if (*o < 0 && (*o = (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR)) < 0)
        return 0;
    if (!n || (uint64_t)*o >= pt->size)
        return 0;
    uint64_t end = (uint64_t)*o + n < pt->size ? (uint64_t)*o + n : pt->size;
    int local = monarch_part_here(pt, (uint64_t)*o, end - (uint64_t)*o, evictions);
    return local ? local : monarch_part_wait(pt, (uint64_t)*o, end - (uint64_t)*o, evictions);
}

/* A read served from the copy: counted, and for a read at the descriptor's offset, the
 * offset moved as the PFS read would have. */
static void monarch_part_served(int fd, struct monarch_part *pt, off_t o, int at_offset, ssize_t r)
{
    if (r <= 0)
        return;
    if (at_offset)
        syscall(SYS_lseek, fd, (off_t)(o + r), SEEK_SET);
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && getpid() == monarch_pid)
        __atomic_fetch_add(monarch_counter(pt->slot, 1), (uint64_t)r, __ATOMIC_RELAXED);
    monarch_extra_add(MONARCH_EXTRA_BLOCK_LOCAL_BYTES, (uint64_t)r);
}

/* Does a read of n bytes at o continue, after at least a block, the reads of the part in the
 * order of the file (cat's 128 KiB, a FILE's buffer: a reader going through it)? Noted for the
 * next read, as if this one reads its n bytes (by the copy, a fill or the PFS). Threads and
 * processes reading the part elsewhere at once only make a reader look random (as before). */
static int monarch_part_sequential(struct monarch_part *pt, uint64_t o, uint64_t n)
{
    uint64_t run = 0;
    if (o == __atomic_load_n(&pt->next, __ATOMIC_RELAXED))
        run = __atomic_load_n(&pt->run, __ATOMIC_RELAXED);
    __atomic_store_n(&pt->run, run + n, __ATOMIC_RELAXED);
    __atomic_store_n(&pt->next, o + n, __ATOMIC_RELAXED);
    return run >= 1ULL << pt->shift;
}

/* a read of blocks not all staged fills them: shim_fill.c (shim_fill.h) */

static int monarch_part_pread(int fd, void *buf, size_t n, off_t o, ssize_t *out)
{
    unsigned p = monarch_part_of(fd);
    int at_offset = o < 0;
    if (!p || monarch_guard)
        return 0;
    struct monarch_part *pt = &monarch_parts[p - 1];
    if (pt->copy_fd < 0)
        return 0;
    if (o < 0 && (o = (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR)) < 0)
        return 0;
    /* a large read, or one in order, fills what it may (and marks nothing WANTED it filled or passed) */
    size_t min = monarch_part_sequential(pt, (uint64_t)o, n) ? 1 : MONARCH_FILL_MIN;
    if (monarch_part_fill(fd, pt, buf, n, o, at_offset, min, out))
        return 1;
    uint64_t evictions;
    int local = monarch_part_range(fd, pt, &o, n, &evictions);
    if (!local)
        return 0;
    *out = (ssize_t)syscall(SYS_pread64, pt->copy_fd, buf, n, (long)o); /* the kernel's: pread is wrapped */
    if (*out < 0 || !monarch_part_lent_kept(pt, local, evictions))
        return 0; /* the copy failed (it cannot, short of an I/O error), or a block left: the PFS answers */
    monarch_part_served(fd, pt, o, at_offset, *out);
    return 1;
}

static int monarch_part_read(int fd, void *buf, size_t n, ssize_t *out)
{
    return monarch_part_pread(fd, buf, n, -1, out);
}

static int monarch_part_readv(int fd, const struct iovec *v, int c, off_t o, ssize_t *out)
{
    unsigned p = monarch_part_of(fd);
    int at_offset = o < 0;
    if (!p || monarch_guard || c < 0)
        return 0;
    uint64_t n = 0;
    for (int i = 0; i < c; i++)
        n += v[i].iov_len;
    struct monarch_part *pt = &monarch_parts[p - 1];
    if (pt->copy_fd < 0)
        return 0;
    uint64_t evictions;
    int local = monarch_part_range(fd, pt, &o, n, &evictions);
    if (!local)
        return 0;
    *out = (ssize_t)syscall(SYS_preadv, pt->copy_fd, v, c, (long)o, 0L); /* pos_l, pos_h: 64-bit */
    if (*out < 0 || !monarch_part_lent_kept(pt, local, evictions))
        return 0;
    monarch_part_served(fd, pt, o, at_offset, *out);
    return 1;
}

/* The application is about to read part pt's PFS file itself: said in the map (its pfs_reads)
 * before the read, so that the daemon's read-ahead queues little ahead of it (read_pace.py). */
static inline void monarch_part_read_pfs(struct monarch_part *pt)
{
    __atomic_fetch_add(&pt->hdr->pfs_reads, 1, __ATOMIC_RELAXED);
}

/* ... of a part's descriptor fd (its part: a read it did not serve from the copy). */
static inline void monarch_part_reads_pfs(int fd)
{
    unsigned p = monarch_part_of(fd);
    if (p)
        monarch_part_read_pfs(&monarch_parts[p - 1]);
}

/* Bytes a descriptor of a part read from the PFS. */
static inline void monarch_part_pfs_bytes(int fd, ssize_t n)
{
    if (n > 0 && MONARCH_UNLIKELY(monarch_part_of(fd)))
        monarch_extra_add(MONARCH_EXTRA_BLOCK_PFS_BYTES, (uint64_t)n);
}

/* ---- mappings: moved onto the copy as their blocks are staged ---- */
static void monarch_remapper_start(void);

/* Map every run of STAGED, not yet moved blocks of mapping m from the copy, over the same
 * addresses; populated once the application may have touched them (the remapper's moves).
 * 1 when nothing is left to move (all moved, or the daemon is done). Under the registry's
 * lock. */
static int monarch_mapping_move_locked(struct monarch_mapping *m, int populate)
{
    struct monarch_part *pt = &monarch_parts[m->part - 1];
    uint64_t moved = 0;
    int left = 0;
    if (pt->copy_fd < 0)
        return 1; /* its copy was closed under it: the mapping stays as it is */
    /* read before the blocks' states: "done" is set after the last block's state, so a block
     * found not staged by this pass may still come unless done was already set when it began */
    int done = __atomic_load_n(&pt->hdr->done, __ATOMIC_ACQUIRE) != 0;
    for (uint64_t b = m->first; b <= m->last;) {
        uint64_t i = b - m->first;
        if ((m->moved[i / 8] >> (i % 8)) & 1) {
            b++;
            continue;
        }
        if (__atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE) != MONARCH_BLOCK_STAGED) {
            left = 1;
            b++;
            continue;
        }
        uint64_t e = b; /* a run of staged blocks, one mmap; guarded or not alike */
        int guarded = monarch_guarded(m, b);
        while (e + 1 <= m->last && !((m->moved[(e + 1 - m->first) / 8] >> ((e + 1 - m->first) % 8)) & 1)
               && __atomic_load_n(&pt->states[e + 1], __ATOMIC_ACQUIRE) == MONARCH_BLOCK_STAGED
               && monarch_guarded(m, e + 1) == guarded)
            e++;
        uint64_t from = b << pt->shift, to = (e + 1) << pt->shift;
        if (from < m->off)
            from = m->off;
        if (to > m->off + m->len)
            to = m->off + m->len;
        void *at = (void *)(m->addr + (from - m->off));
        /* populated when moved under a mapping in use: the copy's pages are in memory (a tier
         * in RAM, or just written), and the application's next touches of the run find them
         * mapped, as pages it had faulted in from the PFS were. A mapping just made has touched
         * nothing: populating it would cost every staged page at each mmap (a reader that maps
         * the file anew each step), where faults cost only the pages it reads */
        /* (never a guarded run's: nothing of it was touched, and populating it would hold the
         * registry's lock, which a guarded fault waits for, while the pages are mapped) */
        void *r = MONARCH_RESOLVE(mmap)(at, (size_t)(to - from), m->prot,
                                        m->share | MAP_FIXED | (populate && !guarded ? MAP_POPULATE : 0),
                                        pt->copy_fd, (off_t)from);
        if (r == MAP_FAILED) {
            MONARCH_DEBUG(1, "moving a mapping onto its block copy failed (%s): it stays on the PFS",
                          strerror(errno));
            return 1; /* the mapping is whole as it is: the PFS's pages, or the copy's where moved */
        }
        for (uint64_t x = b; x <= e; x++) {
            m->moved[(x - m->first) / 8] |= (uint8_t)(1u << ((x - m->first) % 8));
            if (monarch_guarded(m, x)) /* the copy's pages are mapped over its guard */
                monarch_guard_clear(m, x);
        }
        moved += to - from;
        b = e + 1;
    }
    monarch_extra_add(MONARCH_EXTRA_BLOCK_REMAPPED_BYTES, moved);
    if (left && !done && populate && __atomic_load_n(&pt->hdr->wait_us, __ATOMIC_ACQUIRE))
        monarch_mapping_want_touched_locked(m, pt);
    else if (left && !done && populate)
        monarch_mapping_records_locked(m, pt);
    return !left || done;
}

/* The advice a mapping's ranges on the PFS take now: the kernel's read-around (as direct
 * reads) once the daemon says faults should read around (a long round trip) or that no more
 * blocks will come (done: whole, or the room is full), MADV_RANDOM before (the blocks are the
 * read-ahead). Under the registry's lock. */
static void monarch_mapping_free_locked(struct monarch_mapping *m);

static void monarch_mapping_advise_locked(struct monarch_mapping *m)
{
    struct monarch_blockmap_header *h = monarch_parts[m->part - 1].hdr;
    if (m->random && (__atomic_load_n(&h->readaround, __ATOMIC_ACQUIRE) || __atomic_load_n(&h->done, __ATOMIC_ACQUIRE)
                      || __atomic_load_n(&h->records, __ATOMIC_ACQUIRE) == MONARCH_RECORDS_YES)) {
        /* (the ranges moved already are the copy's: only the PFS's pages' speed depends on it) */
        MONARCH_RESOLVE(madvise)((void *)m->addr, m->len, MADV_NORMAL);
        m->random = 0;
    }
}

/* A mapping the remapper is done with (every block moved, the daemon done, its copy closed):
 * its ranges left on the PFS read as direct's, from now on. */
static void monarch_mapping_release_locked(struct monarch_mapping *m)
{
    if (m->random) {
        MONARCH_RESOLVE(madvise)((void *)m->addr, m->len, MADV_NORMAL);
        m->random = 0;
    }
    monarch_mapping_free_locked(m);
}

static void monarch_mapping_free_locked(struct monarch_mapping *m)
{
    monarch_guard_lift_all_locked(m); /* (before an munmap too: the range it leaves is whole) */
    free(m->guarded);
    free(m->copied);
    if (m->pfs_fd >= 0) {
        real_close(m->pfs_fd);
        __atomic_fetch_sub(&monarch_pfs_fds, 1, __ATOMIC_RELEASE);
    }
    free(m->moved);
    free(m->resident);
    sigset_t held_;
    MONARCH_PARTS_LOCK(held_);
    monarch_part_unref_locked(m->part);
    MONARCH_PARTS_UNLOCK(held_);
    memset(m, 0, sizeof *m);
    __atomic_store_n(&monarch_nmappings, monarch_nmappings - 1, __ATOMIC_RELEASE);
}

/* After the application mapped fd (a part's descriptor) read-only at p: registered, its
 * staged blocks moved now, the rest by the remapper as they come. */
static void monarch_part_mapped(int fd, void *p, size_t len, int prot, int flags, uint64_t off)
{
    unsigned part = monarch_part_of(fd);
    int share = flags & (MAP_SHARED | MAP_PRIVATE);
    if (part) /* its faults read the PFS unseen, moved or not: the read-ahead is never alone on the link */
        __atomic_store_n(&monarch_parts[part - 1].hdr->mapped, 1, __ATOMIC_RELAXED);
    if (!part || (prot & PROT_WRITE) || !(share == MAP_SHARED || share == MAP_PRIVATE) || !len
        || getpid() != monarch_pid)
        return;
    struct monarch_part *pt = &monarch_parts[part - 1];
    if (off >= pt->size)
        return;
    uint64_t end = off + len < pt->size ? off + len : pt->size;
    uint64_t first = off >> pt->shift, last = (end - 1) >> pt->shift;
    uint8_t *moved = calloc((size_t)((last - first) / 8 + 1), 1);
    if (!moved)
        return;
    sigset_t maps_held_;
    MONARCH_MAPS_LOCK(maps_held_);
    struct monarch_mapping *m = NULL;
    for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS && !m; i++)
        if (!monarch_mappings[i].addr)
            m = &monarch_mappings[i];
    if (!m) {
        MONARCH_MAPS_UNLOCK(maps_held_);
        free(moved);
        return;
    }
    sigset_t held_;
    MONARCH_PARTS_LOCK(held_);
    pt->refs++;
    MONARCH_PARTS_UNLOCK(held_);
    *m = (struct monarch_mapping){.addr = (uintptr_t)p, .len = len, .off = off, .prot = prot, .share = share,
                                  .part = part, .moved = moved, .first = first, .last = last, .pfs_fd = -1};
    __atomic_store_n(&monarch_nmappings, monarch_nmappings + 1, __ATOMIC_RELEASE);
    monarch_guard_keep_fd_locked(m, pt, fd);
    /* a fault of the PFS's pages reads what the application touches, not the kernel's read-ahead
     * (128 KiB and more for a 2 KiB window): the daemon's blocks are the read-ahead. Unless the
     * daemon found the PFS's round trip long (the map's readaround): then the read-around of
     * one fault is quicker than a second fault for a window across two pages; or it stages no
     * more (done): then the ranges left on the PFS read as direct's, read-around and all; or a
     * reader of records was found (the map's records: shim_touched.c). */
    if (!__atomic_load_n(&pt->hdr->readaround, __ATOMIC_ACQUIRE) && !__atomic_load_n(&pt->hdr->done, __ATOMIC_ACQUIRE)
        && __atomic_load_n(&pt->hdr->records, __ATOMIC_ACQUIRE) != MONARCH_RECORDS_YES) {
        MONARCH_RESOLVE(madvise)(p, len, MADV_RANDOM);
        m->random = 1;
    }
    if (monarch_mapping_move_locked(m, 0)) {
        monarch_mapping_release_locked(m);
    } else {
        monarch_guard_mapping_locked(m, pt); /* a cluster's: its faults wait for the owners' blocks */
        monarch_remapper_start();
    }
    MONARCH_MAPS_UNLOCK(maps_held_);
}

/* The application's own read-ahead advice on a mapping being moved (LMDB's MADV_RANDOM under
 * MDB_NORDAHEAD): it stands, and the shim's advice (MADV_RANDOM while blocks come, the read-around
 * after) is given no more, so a reader that asked for pages is never given the read-around (before,
 * it was: an LMDB twice the tier read 3.12x its size from the PFS in 3 epochs, direct 3.00x). */
static void monarch_mappings_advised(void *addr, size_t len, int advice)
{
    if (advice != MADV_RANDOM && advice != MADV_SEQUENTIAL && advice != MADV_NORMAL)
        return;
    sigset_t maps_held_;
    MONARCH_MAPS_LOCK(maps_held_);
    for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS; i++) {
        struct monarch_mapping *m = &monarch_mappings[i];
        if (m->addr && m->addr < (uintptr_t)addr + len && (uintptr_t)addr < m->addr + m->len) {
            m->app_advice = advice + 1;
            m->random = 0;
        }
    }
    MONARCH_MAPS_UNLOCK(maps_held_);
}

MONARCH_EXPORT int madvise(void *addr, size_t len, int advice)
{
    MONARCH_REAL(madvise, -1)
    if (MONARCH_UNLIKELY(__atomic_load_n(&monarch_nmappings, __ATOMIC_ACQUIRE)) && !monarch_guard)
        monarch_mappings_advised(addr, len, advice);
    return real_(addr, len, advice);
}

MONARCH_EXPORT int posix_madvise(void *addr, size_t len, int advice)
{
    MONARCH_REAL(posix_madvise, EINVAL)
    /* (POSIX_MADV_* are MADV_*'s values on Linux) */
    if (MONARCH_UNLIKELY(__atomic_load_n(&monarch_nmappings, __ATOMIC_ACQUIRE)) && !monarch_guard)
        monarch_mappings_advised(addr, len, advice);
    return real_(addr, len, advice);
}

/* The application lets [addr, addr + len) go (munmap, mremap, a MAP_FIXED mmap over it): the
 * mappings it overlaps are moved no more. Under the registry's lock, held by the caller
 * across its real call. */
static void monarch_mappings_forget_locked(uintptr_t addr, size_t len)
{
    for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS; i++) {
        struct monarch_mapping *m = &monarch_mappings[i];
        if (m->addr && m->addr < addr + len && addr < m->addr + m->len)
            monarch_mapping_free_locked(m);
    }
}

/* The remapper: every few ms (up to 50 once nothing moves), each registered mapping's newly
 * staged blocks mapped from the copy; it ends when no mapping is left. Signals are the
 * application's threads', never this one's. */
static void *monarch_remapper_main(void *arg)
{
    (void)arg;
    monarch_guard = 1; /* its own calls are never the application's */
    long pause_ms = 2;
    for (;;) {
        sigset_t maps_held_;
        MONARCH_MAPS_LOCK(maps_held_);
        uint64_t before = 0, after = 0;
        monarch_records_looking = 0;
        for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS; i++) {
            struct monarch_mapping *m = &monarch_mappings[i];
            if (!m->addr)
                continue;
            before++;
            monarch_mapping_advise_locked(m);
            if (monarch_mapping_move_locked(m, 1))
                monarch_mapping_release_locked(m);
            else
                after++;
        }
        if (!after) {
            monarch_remapper_running = 0;
            MONARCH_MAPS_UNLOCK(maps_held_);
            return NULL;
        }
        long most = monarch_records_looking ? (long)(MONARCH_RECORDS_EVERY_NS / 1000000) : 50;
        MONARCH_MAPS_UNLOCK(maps_held_);
        pause_ms = after < before ? 2 : pause_ms * 2 > most ? most : pause_ms * 2;
        struct timespec ts = {0, pause_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Under the registry's lock: a remapper runs (started now if none does in this process). */
static void monarch_remapper_start(void)
{
    if (monarch_remapper_running)
        return;
    pthread_t t;
    pthread_attr_t attr;
    sigset_t all, old;
    sigfillset(&all);
    monarch_sigmask(SIG_BLOCK, &all, &old);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    __typeof__(real_pthread_create) create = MONARCH_RESOLVE(pthread_create);
    if (create && create(&t, &attr, monarch_remapper_main, NULL) == 0)
        monarch_remapper_running = 1;
    else
        MONARCH_DEBUG(1, "no remapper thread (%s): mappings of files staged by blocks stay on the PFS",
                      strerror(errno));
    pthread_attr_destroy(&attr);
    monarch_sigmask(SIG_SETMASK, &old, NULL);
}

/* fork: both locks are taken around it, so that no other thread is inside when the process is
 * copied and the child's are free; unless this process never made a part (nothing under them:
 * most processes of a job), so that forking costs it no lock and no page copied for one. No
 * signal is blocked here: fork changes nothing they guard. The child's handler is
 * async-signal-safe (unlocks and stores); a child with mappings to move has its remapper
 * started by its first read, open or mapping (monarch_blocks_resume). */
static __thread int monarch_fork_locked __attribute__((tls_model("initial-exec")));

static void monarch_blocks_prefork(void)
{
    if (!__atomic_load_n(&monarch_blocks_used, __ATOMIC_SEQ_CST))
        return;
    monarch_lock_take(&monarch_maps_mu, &monarch_maps_depth, NULL);
    monarch_lock_take(&monarch_parts_mu, &monarch_parts_depth, NULL);
    monarch_fork_locked = 1;
}

static void monarch_blocks_postfork_parent(void)
{
    if (!monarch_fork_locked)
        return;
    monarch_fork_locked = 0;
    monarch_lock_give(&monarch_parts_mu, &monarch_parts_depth, NULL);
    monarch_lock_give(&monarch_maps_mu, &monarch_maps_depth, NULL);
}

static void monarch_blocks_postfork_child(void)
{
    if (!monarch_fork_locked) {
        /* a thread made the process's first part just as it forked, after the prepare handler
         * looked: the locks it may hold are no one's here, and what it had begun is unreferenced */
        if (__atomic_load_n(&monarch_blocks_used, __ATOMIC_SEQ_CST)) {
            pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
            monarch_maps_mu = fresh;
            monarch_parts_mu = fresh;
        }
        return;
    }
    monarch_fork_locked = 0;
    monarch_remapper_running = 0; /* the parent's thread is not here */
    __atomic_store_n(&monarch_remapper_owed, __atomic_load_n(&monarch_nmappings, __ATOMIC_ACQUIRE) > 0,
                     __ATOMIC_RELEASE);
    /* a plain mutex is released by a store: the child's thread id, not the parent's, does it */
    monarch_lock_give(&monarch_parts_mu, &monarch_parts_depth, NULL);
    monarch_lock_give(&monarch_maps_mu, &monarch_maps_depth, NULL);
}

/* A fork child's first read, open or mapping: the remapper its inherited mappings need. */
static void monarch_blocks_resume_slow(void)
{
    /* a vfork child (another pid in our memory) never starts a thread here: the parent does */
    if (monarch_guard || getpid() != monarch_pid || !__atomic_exchange_n(&monarch_remapper_owed, 0, __ATOMIC_ACQ_REL))
        return;
    sigset_t maps_held_;
    MONARCH_MAPS_LOCK(maps_held_);
    if (monarch_nmappings)
        monarch_remapper_start();
    MONARCH_MAPS_UNLOCK(maps_held_);
}

static inline void monarch_blocks_resume(void)
{
    if (MONARCH_UNLIKELY(__atomic_load_n(&monarch_remapper_owed, __ATOMIC_RELAXED)))
        monarch_blocks_resume_slow();
}
