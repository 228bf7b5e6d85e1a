/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_zpool.h). Here:
 * the memfds that compressed hits are decoded into, reused once nothing holds them.
 *
 * Why: a fresh memfd per open pays for its pages. On the test VM allocating, zeroing,
 * mapping and freeing them costs 3-4.5 us per 4 KiB page: ~70 us for a 64 KiB file, as much
 * as the codec (docs/compression.md). A memfd whose pages are already there costs ~10 us.
 *
 * How (at most MONARCH_ZPOOL_ENTRIES memfds a process, files up to MONARCH_ZPOOL_MAX_FILE):
 *   - the pool's own descriptor of a memfd is a read-write open of it through /proc/self/fd
 *     (the memfd_create descriptor is closed: the kernel does not count it as a writer, so it
 *     would never grant the lease below), plus a writable shared mapping the frame is
 *     decoded into;
 *   - the application gets a new read-only open of it (its own offset, O_CLOEXEC as it asked),
 *     never the pool's descriptor: it can neither write nor resize it;
 *   - a memfd is decoded into again only after the kernel granted a write lease on it
 *     (F_SETLEASE F_WRLCK, released at once), which it grants only while no other open of
 *     the file exists (fcntl(2)): a descriptor in any process (dup, fork, exec, SCM_RIGHTS
 *     share the one open, which lasts while any holds it) or a mapping (it holds its open).
 *     So bytes the application still holds are never rewritten.
 * Fail open: no /proc, leases refused (fs.leases-enable = 0, another owner), every memfd
 * held, a file too large: the caller makes a fresh sealed memfd, as before the pool.
 * The application closing the pool's descriptor (close, close_range, dup2 onto it, fclose)
 * retires that memfd first (monarch_zpool_release_fd); a number closed behind the shim's back
 * is caught by the inode check before each use. A fork child starts with an empty pool: the
 * parent's memfds are the parent's to reuse. The lease is held for the two fcntl calls;
 * another process opening the memfd through /proc/<pid>/fd in that instant would break it,
 * and the kernel would signal this process: SIGURG (F_SETSIG), ignored unless the
 * application handles it, instead of SIGIO, which would end it.
 */
#include "shim_zpool.h"

#define MONARCH_ZPOOL_ENTRIES 8
#define MONARCH_ZPOOL_MAX_FILE (4u << 20) /* larger files: a fresh memfd (pages held per entry stay small) */

enum { MONARCH_ZP_EMPTY, MONARCH_ZP_BUSY, MONARCH_ZP_OUT };

static struct monarch_zpool_entry {
    int state;            /* MONARCH_ZP_*: EMPTY -> BUSY (a thread owns the fields) -> OUT (handed out) */
    int fd;               /* the pool's read-write open of the memfd */
    dev_t dev;
    ino_t ino;            /* the memfd's, to know fd is still ours */
    unsigned char *map;   /* MAP_SHARED, PROT_WRITE, `mapped` bytes */
    size_t mapped;
    uint64_t size;        /* the memfd's size now */
} monarch_zpool[MONARCH_ZPOOL_ENTRIES];
static int monarch_zpool_used; /* an entry was ever made: close() looks at the pool */
static int monarch_zpool_off;  /* leases or /proc refused once: fresh memfds from then on */

static size_t monarch_page_round(uint64_t n)
{
    size_t page = 4096;
    long p = sysconf(_SC_PAGESIZE);
    if (p > 0)
        page = (size_t)p;
    return (size_t)((n + page - 1) / page * page);
}

/* /proc/self/fd/<fd> reopened with flags: a new open file description of the same file. */
static int monarch_reopen(int fd, int flags)
{
    char path[40];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return MONARCH_RESOLVE(openat)(AT_FDCWD, path, flags);
}

static int monarch_zpool_is_ours(const struct monarch_zpool_entry *e, int fd)
{
    struct stat st;
    return fd >= 0 && monarch_sys_fstat(fd, &st) == 0 && st.st_dev == e->dev && st.st_ino == e->ino;
}

/* Drop a BUSY entry: its mapping goes; its descriptor is closed only if still ours. */
static void monarch_zpool_retire(struct monarch_zpool_entry *e, int close_fd)
{
    if (e->map)
        munmap(e->map, e->mapped);
    if (close_fd && monarch_zpool_is_ours(e, e->fd))
        real_close(e->fd);
    e->map = NULL;
    e->mapped = 0;
    e->fd = -1;
    __atomic_store_n(&e->state, MONARCH_ZP_EMPTY, __ATOMIC_RELEASE);
}

/* 1: no other open of this BUSY entry's memfd exists (it may be rewritten); 0: one does. */
static int monarch_zpool_unheld(struct monarch_zpool_entry *e)
{
    if (!monarch_zpool_is_ours(e, e->fd)) { /* closed behind our back: the number is someone else's */
        e->fd = -1;
        monarch_zpool_retire(e, 0);
        return 0;
    }
    if (syscall(SYS_fcntl, e->fd, F_SETLEASE, F_WRLCK) == 0) {
        syscall(SYS_fcntl, e->fd, F_SETLEASE, F_UNLCK);
        return 1;
    }
    if (errno != EAGAIN && errno != EBUSY) { /* leases off here (EINVAL, EACCES, ENOLCK) */
        MONARCH_DEBUG(1, "memfd pool: lease refused (%s); a fresh memfd per decoded open", strerror(errno));
        __atomic_store_n(&monarch_zpool_off, 1, __ATOMIC_RELAXED);
    }
    return 0;
}

/* A new BUSY entry's memfd (name shown in /proc/<pid>/fd): 0, or -1. */
static int monarch_zpool_make(struct monarch_zpool_entry *e)
{
#ifdef SYS_memfd_create
    int m = (int)syscall(SYS_memfd_create, "monarch-decoded", MFD_CLOEXEC);
    if (m < 0)
        return -1;
    e->fd = monarch_reopen(m, O_RDWR | O_CLOEXEC);
    real_close(m);
    struct stat st;
    if (e->fd < 0 || monarch_sys_fstat(e->fd, &st) != 0) {
        MONARCH_DEBUG(1, "memfd pool: no reopen through /proc/self/fd (%s); a fresh memfd per decoded open",
                      strerror(errno));
        __atomic_store_n(&monarch_zpool_off, 1, __ATOMIC_RELAXED);
        if (e->fd >= 0)
            real_close(e->fd);
        e->fd = -1;
        return -1;
    }
    /* a lease break (see the top) signals SIGURG, ignored by default, not SIGIO, which ends a process */
    syscall(SYS_fcntl, e->fd, F_SETSIG, SIGURG);
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    e->map = NULL;
    e->mapped = 0;
    e->size = 0;
    __atomic_store_n(&monarch_zpool_used, 1, __ATOMIC_RELEASE);
    return 0;
#else
    (void)e;
    return -1;
#endif
}

/* An entry of this process's pool, BUSY for the caller, holding no one's bytes; NULL if none.
 * *reused: 1 for a memfd decoded into before (its pages are there), 0 for a new one. */
static struct monarch_zpool_entry *monarch_zpool_claim(int *reused)
{
    *reused = 1;
    for (unsigned i = 0; i < MONARCH_ZPOOL_ENTRIES; i++) {
        struct monarch_zpool_entry *e = &monarch_zpool[i];
        int out = MONARCH_ZP_OUT;
        if (__atomic_compare_exchange_n(&e->state, &out, MONARCH_ZP_BUSY, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            if (monarch_zpool_unheld(e))
                return e;
            if (__atomic_load_n(&e->state, __ATOMIC_RELAXED) == MONARCH_ZP_BUSY) /* not retired */
                __atomic_store_n(&e->state, MONARCH_ZP_OUT, __ATOMIC_RELEASE);
            if (__atomic_load_n(&monarch_zpool_off, __ATOMIC_RELAXED))
                return NULL;
        }
    }
    for (unsigned i = 0; i < MONARCH_ZPOOL_ENTRIES; i++) {
        struct monarch_zpool_entry *e = &monarch_zpool[i];
        int empty = MONARCH_ZP_EMPTY;
        if (__atomic_compare_exchange_n(&e->state, &empty, MONARCH_ZP_BUSY, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
            *reused = 0;
            if (monarch_zpool_make(e) == 0)
                return e;
            __atomic_store_n(&e->state, MONARCH_ZP_EMPTY, __ATOMIC_RELEASE);
            return NULL;
        }
    }
    return NULL; /* every memfd is held: the caller makes a fresh one */
}

/* The BUSY entry sized to size bytes and mapped over them: its mapping, or NULL (retired). */
static unsigned char *monarch_zpool_fit(struct monarch_zpool_entry *e, uint64_t size)
{
    if (size != e->size && syscall(SYS_ftruncate, e->fd, (off_t)size) != 0)
        goto fail;
    e->size = size;
    if (size > e->mapped) { /* the pages already there are mapped again, the new ones made */
        if (e->map)
            munmap(e->map, e->mapped);
        e->mapped = monarch_page_round(size);
        e->map = MONARCH_RESOLVE(mmap)(NULL, e->mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, e->fd, 0);
        if (e->map == MAP_FAILED) {
            e->map = NULL;
            goto fail;
        }
    }
    return e->map;
fail:
    MONARCH_DEBUG(1, "memfd pool: no room for %llu bytes (%s)", (unsigned long long)size, strerror(errno));
    monarch_zpool_retire(e, 1);
    return NULL;
}

/*
 * The frame src (fsize bytes) decoded into a pooled memfd of size bytes: a new read-only
 * descriptor of it (close-on-exec as flags say; *reused as monarch_zpool_claim says), or -1
 * (*frame_bad 1 when the frame itself does not decode to size bytes; 0: no memfd of the pool
 * could take it, make a fresh one).
 */
static int monarch_zpool_decode(const void *src, size_t fsize, uint64_t size, const void *ddict, int flags,
                                int *frame_bad, int *reused)
{
    *frame_bad = *reused = 0;
    if (size == 0 || size > MONARCH_ZPOOL_MAX_FILE || __atomic_load_n(&monarch_zpool_off, __ATOMIC_RELAXED))
        return -1;
    monarch_zstd_dctx *dctx = monarch_zstd_dctx_here();
    struct monarch_zpool_entry *e = dctx ? monarch_zpool_claim(reused) : NULL;
    unsigned char *dst = e ? monarch_zpool_fit(e, size) : NULL;
    if (!dst)
        return -1;
    size_t r = ddict ? monarch_zstd.decompress_ddict(dctx, dst, (size_t)size, src, fsize, ddict)
                     : monarch_zstd.decompress(dctx, dst, (size_t)size, src, fsize);
    if (monarch_zstd.is_error(r) || r != size) {
        MONARCH_DEBUG(1, "decode: %s", monarch_zstd.is_error(r) ? "corrupt frame" : "short frame");
        *frame_bad = 1;
        __atomic_store_n(&e->state, MONARCH_ZP_OUT, __ATOMIC_RELEASE); /* its bytes are no one's: reusable */
        return -1;
    }
    int fd = monarch_reopen(e->fd, O_RDONLY | (flags & O_CLOEXEC));
    if (fd >= 0 && !monarch_zpool_is_ours(e, fd)) { /* the pool's number was reused under us */
        real_close(fd);
        fd = -1;
    }
    if (fd < 0) {
        monarch_zpool_retire(e, 1);
        return -1;
    }
    __atomic_store_n(&e->state, MONARCH_ZP_OUT, __ATOMIC_RELEASE);
    return fd;
}

/* The application is about to close fd (close, close_range, dup2/dup3 onto it, fclose): if
 * it is one of the pool's, that memfd is retired first, so the number is never used as ours
 * once it is someone else's. Cheap when the pool was never used. */
static void monarch_zpool_release_fd(int fd)
{
    if (!__atomic_load_n(&monarch_zpool_used, __ATOMIC_ACQUIRE) || fd < 0)
        return;
    for (unsigned i = 0; i < MONARCH_ZPOOL_ENTRIES; i++) {
        struct monarch_zpool_entry *e = &monarch_zpool[i];
        for (;;) {
            int state = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
            /* a vfork child (another pid in our memory) closes its own descriptors, not ours */
            if (state == MONARCH_ZP_EMPTY || __atomic_load_n(&e->fd, __ATOMIC_RELAXED) != fd
                || getpid() != monarch_pid)
                break;
            if (state == MONARCH_ZP_BUSY) { /* another thread is decoding into it: a few us */
                sched_yield();
                continue;
            }
            if (__atomic_compare_exchange_n(&e->state, &state, MONARCH_ZP_BUSY, 0, __ATOMIC_ACQUIRE,
                                            __ATOMIC_RELAXED)) {
                MONARCH_DEBUG(1, "memfd pool: the application closes fd %d, the pool's: retired", fd);
                monarch_zpool_retire(e, 0); /* the application's close closes it */
                break;
            }
        }
    }
}

static void monarch_zpool_release_range(unsigned first, unsigned last)
{
    if (!__atomic_load_n(&monarch_zpool_used, __ATOMIC_ACQUIRE))
        return;
    for (unsigned i = 0; i < MONARCH_ZPOOL_ENTRIES; i++) {
        int fd = __atomic_load_n(&monarch_zpool[i].fd, __ATOMIC_RELAXED);
        if (fd >= 0 && (unsigned)fd >= first && (unsigned)fd <= last)
            monarch_zpool_release_fd(fd);
    }
}

/* A fork child: the parent's memfds are the parent's to reuse. The child's copies of the
 * pool's descriptors are closed (still ours: checked) and its mappings of them dropped; an
 * entry a parent thread was filling is only forgotten (its fields may be half set). */
static void monarch_zpool_atfork_child(void)
{
    for (unsigned i = 0; i < MONARCH_ZPOOL_ENTRIES; i++) {
        struct monarch_zpool_entry *e = &monarch_zpool[i];
        if (e->state == MONARCH_ZP_EMPTY)
            continue; /* (no store: a page the child leaves alone is never copied) */
        if (e->state == MONARCH_ZP_OUT) {
            monarch_zpool_retire(e, 1);
        } else {
            e->map = NULL;
            e->mapped = 0;
            e->fd = -1;
            e->state = MONARCH_ZP_EMPTY;
        }
    }
    if (monarch_zpool_used)
        monarch_zpool_used = 0;
}
