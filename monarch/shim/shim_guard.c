/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_guard.h).
 * Here: a cluster's large file mapped before its blocks are local (shim_blocks.c moves each
 * block onto the copy as it comes).
 *
 * Left on the PFS, such a mapping's faults read the PFS through the kernel, beside the owner
 * that reads the same block for the cluster: the PFS twice, and once more per node. So the
 * blocks of a cluster's mapping not yet local are guarded (PROT_NONE), and a fault on one is
 * served here, on the faulting thread (a SIGSEGV handler, as DAOS's libpil4dfs does):
 *   - the block is marked WANTED (with the blocks after it, for a reader going in order) and
 *     the thread waits for it, up to the map's wait_us, without any lock held;
 *   - once it is STAGED it is mapped from the copy over the same addresses, and the access
 *     runs again: the copy's bytes, which are the source's;
 *   - when it does not come in time, its guard is lifted (its pages read the PFS through the
 *     kernel, as before: fail open); when blocks keep coming late, the daemon is done, or the
 *     copy was closed, every guard of the file is, and this process guards it no more.
 * Weighed against the other ways (docs/cluster.md): userfaultfd, for unprivileged users, serves
 * only faults of user mode and not a fork child's; this serves any thread and any fork child
 * (the handler and the guards are inherited), and costs kernel-mode reads of a guarded page,
 * which fail with EFAULT rather than fault: the write and send calls that read the
 * application's memory fault its guarded pages in first (monarch_guard_touch); a raw syscall,
 * io_uring or another process reading this memory (process_vm_readv) is not covered, and
 * MONARCH_SHIM_MAP_GUARD=0 turns guards off for such a job.
 * A cluster's file larger than a node's room (the map's window) keeps only its own ranges pinned;
 * other owners' blocks come into a window of the room left (LENT), the oldest leaving for the next
 * one a reader in order wants. A LENT block is never mapped from the copy (its pages would go with
 * it, under the application): a fault copies it into pages of this process's own, put over the
 * guarded range at once (mremap), up to MONARCH_GUARD_COPIES blocks a process, the oldest guarded
 * again past that. A random fault there wants nothing (another owner's whole block for a few bytes
 * would push out of the window the blocks a reader in order is to read): its pages come from the
 * block's owner (shim_pages.c); where they cannot, it reads its page from the PFS as elsewhere,
 * and once that share is read, its whole block.
 * The application's own SIGSEGV disposition is kept: sigaction and signal of SIGSEGV are
 * answered from a copy while the handler is ours, and a fault that is not a guard's goes to
 * it (the default: the handler is reset and the fault, run again, ends the process as it
 * would have). */
#include "shim_guard.h"

#define MONARCH_GUARD_AHEAD_IN_ORDER 16 /* blocks wanted past a fault that follows the last one (a window's) */
#define MONARCH_GUARD_AHEAD_ROOM 64     /* ... where the node has room for the file: more runs under way at once */
#define MONARCH_GUARD_LATE_MAX 4        /* blocks late in a row that end a file's guards in this process */
#define MONARCH_GUARD_PAGE_WAIT_NS 250000ULL /* a random fault's wait for its block */
#define MONARCH_GUARD_AGAIN_MAX 2        /* faults in a row at one address with nothing guarded there run again */
#define MONARCH_GUARD_PFS_SHARE 128     /* ... then its page from the PFS, up to this share of the file */
#define MONARCH_GUARD_FILLING_WAITS 4   /* wait_us times a reader in order waits for a block under way */
#define MONARCH_GUARD_COPIES 16         /* LENT blocks copied into a process's pages at once (a window's): its memory */

static int monarch_guards_off = -1;     /* -1: not read yet from the environment */
static size_t monarch_guard_page = 4096; /* the page size (read when the first mapping is guarded) */
/* the last fault this thread found nothing guarded at, and how many times in a row (see monarch_guard_serve) */
static __thread uintptr_t monarch_guard_last __attribute__((tls_model("initial-exec")));
static __thread unsigned monarch_guard_again __attribute__((tls_model("initial-exec")));
static int monarch_segv_ours;           /* SIGSEGV's handler is monarch_guard_on_fault */
static struct sigaction monarch_app_segv; /* ... and the application's disposition is this */
static int monarch_segv_mu;             /* a spin lock over the two, held for a copy */
/* the LENT blocks copied into this process's pages, oldest first (a ring): the mapping's address and the block */
static struct {
    uintptr_t addr;
    uint64_t block;
} monarch_copies[MONARCH_GUARD_COPIES];
static unsigned monarch_copies_at;      /* the ring's next entry (the oldest once it is full) */

static void monarch_segv_lock(void)
{
    while (__atomic_exchange_n(&monarch_segv_mu, 1, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void monarch_segv_unlock(void)
{
    __atomic_store_n(&monarch_segv_mu, 0, __ATOMIC_RELEASE);
}

/* The bytes of blocks [b, e] that mapping m covers: at and len (the mapping's offset is
 * page-aligned, and a block is a whole number of pages). */
static void monarch_guard_span(struct monarch_mapping *m, struct monarch_part *pt, uint64_t b, uint64_t e,
                               void **at, size_t *len)
{
    uint64_t from = b << pt->shift, to = (e + 1) << pt->shift;
    from = from < m->off ? m->off : from;
    to = to > m->off + m->len ? m->off + m->len : to;
    *at = (void *)(m->addr + (from - m->off));
    *len = (size_t)(to - from);
}

static inline int monarch_guarded(const struct monarch_mapping *m, uint64_t b)
{
    return m->guarded && ((m->guarded[(b - m->first) / 8] >> ((b - m->first) % 8)) & 1);
}

static void monarch_guard_clear(struct monarch_mapping *m, uint64_t b)
{
    m->guarded[(b - m->first) / 8] &= (uint8_t)~(1u << ((b - m->first) % 8));
    __atomic_fetch_sub(&monarch_nguarded, 1, __ATOMIC_RELEASE);
}

static void monarch_guard_on_fault(int sig, siginfo_t *si, void *ctx);

/* SIGSEGV's handler made ours, the application's disposition kept: 1 when it is. */
static int monarch_guard_handler(void)
{
    if (__atomic_load_n(&monarch_segv_ours, __ATOMIC_ACQUIRE))
        return 1;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = monarch_guard_on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    monarch_segv_lock();
    int ok = MONARCH_RESOLVE(sigaction) && real_sigaction(SIGSEGV, &sa, &old) == 0;
    if (ok) {
        monarch_app_segv = old;
        __atomic_store_n(&monarch_segv_ours, 1, __ATOMIC_RELEASE);
    }
    monarch_segv_unlock();
    return ok;
}

/* Mapping m (registered, its staged blocks moved) of a cluster's file whose blocks come from
 * their owners (the map's wait_us), the daemon not done: its blocks not staged guarded.
 * Under the registry's lock. */
static void monarch_guard_mapping_locked(struct monarch_mapping *m, struct monarch_part *pt)
{
    if (monarch_guards_off < 0) {
        const char *v = getenv(MONARCH_ENV_MAP_GUARD);
        monarch_guards_off = v && strcmp(v, "0") == 0;
        monarch_guard_page = (size_t)sysconf(_SC_PAGESIZE);
    }
    if (monarch_guards_off || pt->unguarded || !__atomic_load_n(&pt->hdr->wait_us, __ATOMIC_ACQUIRE)
        || __atomic_load_n(&pt->hdr->done, __ATOMIC_ACQUIRE) || !monarch_guard_handler())
        return;
    if (!m->guarded && !(m->guarded = calloc((size_t)((m->last - m->first) / 8 + 1), 1)))
        return;
    __typeof__(real_mprotect) protect = MONARCH_RESOLVE(mprotect);
    for (uint64_t b = m->first; b <= m->last && protect;) {
        uint64_t i = b - m->first;
        if (((m->moved[i / 8] >> (i % 8)) & 1) || monarch_guarded(m, b)
            || __atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE) == MONARCH_BLOCK_STAGED) {
            b++;
            continue;
        }
        uint64_t e = b; /* a run of blocks not staged: one mprotect */
        while (e + 1 <= m->last && !((m->moved[(e + 1 - m->first) / 8] >> ((e + 1 - m->first) % 8)) & 1)
               && __atomic_load_n(&pt->states[e + 1], __ATOMIC_ACQUIRE) != MONARCH_BLOCK_STAGED)
            e++;
        void *at;
        size_t len;
        monarch_guard_span(m, pt, b, e, &at, &len);
        if (protect(at, len, PROT_NONE) != 0) {
            MONARCH_DEBUG(1, "guarding a mapping's blocks failed (%s): their faults read the PFS", strerror(errno));
            return; /* (the blocks guarded so far are, the rest read the PFS) */
        }
        for (uint64_t x = b; x <= e; x++)
            m->guarded[(x - m->first) / 8] |= (uint8_t)(1u << ((x - m->first) % 8));
        __atomic_fetch_add(&monarch_nguarded, (int)(e - b + 1), __ATOMIC_RELEASE);
        b = e + 1;
    }
}

/* Blocks [b, e] of m guarded no more: their pages as the application mapped them (the PFS's).
 * Under the registry's lock. */
static void monarch_guard_lift_locked(struct monarch_mapping *m, uint64_t b, uint64_t e)
{
    if (!m->guarded)
        return;
    struct monarch_part *pt = &monarch_parts[m->part - 1];
    __typeof__(real_mprotect) protect = MONARCH_RESOLVE(mprotect);
    for (uint64_t x = b; x <= e;) {
        if (!monarch_guarded(m, x)) {
            x++;
            continue;
        }
        uint64_t y = x;
        while (y + 1 <= e && monarch_guarded(m, y + 1))
            y++;
        void *at;
        size_t len;
        monarch_guard_span(m, pt, x, y, &at, &len);
        if (protect(at, len, m->prot) != 0) /* (only if the range is gone: nothing to read there) */
            MONARCH_DEBUG(1, "lifting a mapping's guard failed (%s)", strerror(errno));
        for (uint64_t z = x; z <= y; z++)
            monarch_guard_clear(m, z);
        x = y + 1;
    }
}

static void monarch_guard_lift_all_locked(struct monarch_mapping *m)
{
    monarch_guard_lift_locked(m, m->first, m->last);
}

/* A guarded fault at a (block b): the mapping's reader goes in order when the fault is on the
 * page after the last one's (a scan within a block), or on a later block with only blocks
 * already local since the last fault's (a scan over them); a random reader's faults are neither.
 * b is wanted, and once the reader went in order twice in a row the blocks after it too, so they
 * come before it gets there. Under the registry's lock. */
static void monarch_guard_want_locked(struct monarch_mapping *m, struct monarch_part *pt, uint64_t b, uintptr_t a)
{
    uintptr_t page = a & ~(uintptr_t)(monarch_guard_page - 1);
    uint64_t last = m->fault_next ? m->fault_next - 1 : 0;
    int in_order = m->fault_next && page == m->fault_page + monarch_guard_page;
    if (m->fault_next && b > last && b - last <= MONARCH_GUARD_AHEAD_IN_ORDER) {
        in_order = 1;
        for (uint64_t x = last + 1; x < b && in_order; x++)
            in_order = !monarch_guarded(m, x);
    }
    m->fault_run = in_order ? m->fault_run + 1 : 0;
    m->fault_next = b + 1;
    m->fault_page = page;
    int window = __atomic_load_n(&pt->hdr->window, __ATOMIC_ACQUIRE) != 0;
    uint64_t ahead = m->fault_run < 2 ? 0 : window ? MONARCH_GUARD_AHEAD_IN_ORDER : MONARCH_GUARD_AHEAD_ROOM;
    if (!ahead && window)
        return; /* a window's random fault: its block is not fetched for it (monarch_guard_serve) */
    for (uint64_t x = b; x <= b + ahead && x < pt->blocks; x++) {
        uint8_t absent = MONARCH_BLOCK_ABSENT;
        __atomic_compare_exchange_n(&pt->states[x], &absent, MONARCH_BLOCK_WANTED, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
    }
}

static inline void monarch_bit_set(uint8_t *bits, uint64_t i, int on)
{
    if (on)
        bits[i / 8] |= (uint8_t)(1u << (i % 8));
    else
        bits[i / 8] &= (uint8_t)~(1u << (i % 8));
}

/* A window's mapping keeps a descriptor of the application's file (fd): a copied block is
 * guarded again by mapping the file over it, PROT_NONE. Under the registry's lock. */
static void monarch_guard_keep_fd_locked(struct monarch_mapping *m, struct monarch_part *pt, int fd)
{
    if (!__atomic_load_n(&pt->hdr->window, __ATOMIC_ACQUIRE) || m->pfs_fd >= 0)
        return;
    m->pfs_fd = (int)syscall(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 0); /* (the kernel's: fcntl is wrapped) */
    if (m->pfs_fd >= 0)
        __atomic_fetch_add(&monarch_pfs_fds, 1, __ATOMIC_RELEASE);
}

/* The application closes [first, last]: a mapping's kept descriptor among them is the mapping's
 * no more (the number may name another file next); its copied blocks stay copied. */
static void monarch_guard_fds_closing(unsigned first, unsigned last)
{
    if (MONARCH_LIKELY(!__atomic_load_n(&monarch_pfs_fds, __ATOMIC_ACQUIRE)) || monarch_guard)
        return;
    sigset_t maps_held_;
    MONARCH_MAPS_LOCK(maps_held_);
    for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS; i++) {
        struct monarch_mapping *m = &monarch_mappings[i];
        if (m->addr && m->pfs_fd >= 0 && (unsigned)m->pfs_fd >= first && (unsigned)m->pfs_fd <= last) {
            m->pfs_fd = -1;
            __atomic_fetch_sub(&monarch_pfs_fds, 1, __ATOMIC_RELEASE);
        }
    }
    MONARCH_MAPS_UNLOCK(maps_held_);
}

/* Copied block b of m guarded again: the application's file mapped over it, PROT_NONE (its
 * pages go back to the PFS's, to be copied again at the next fault). Under the registry's lock. */
static void monarch_guard_uncopy_locked(struct monarch_mapping *m, uint64_t b)
{
    struct monarch_part *pt = &monarch_parts[m->part - 1];
    if (!m->copied || !((m->copied[(b - m->first) / 8] >> ((b - m->first) % 8)) & 1) || m->pfs_fd < 0)
        return; /* (no descriptor: the copy stays, the right bytes in this process's memory) */
    void *at;
    size_t len;
    monarch_guard_span(m, pt, b, b, &at, &len);
    if (MONARCH_RESOLVE(mmap)(at, len, PROT_NONE, m->share | MAP_FIXED, m->pfs_fd,
                              (off_t)(m->off + ((uintptr_t)at - m->addr))) == MAP_FAILED)
        return;
    monarch_bit_set(m->copied, b - m->first, 0);
    monarch_bit_set(m->moved, b - m->first, 0);
    monarch_bit_set(m->guarded, b - m->first, 1);
    __atomic_fetch_add(&monarch_nguarded, 1, __ATOMIC_RELEASE);
}

/* LENT block b of m copied into pages of this process's own, put over its guarded range at once
 * (a thread that touches it meanwhile faults, and finds the copy). 1 when it is; 0 when the block
 * left while it was read (the map's evictions changed: the bytes may be a dropped block's); -1
 * when it cannot be (no memory). Under the registry's lock. */
static int monarch_guard_copy_locked(struct monarch_mapping *m, struct monarch_part *pt, uint64_t b)
{
    void *at;
    size_t len;
    monarch_guard_span(m, pt, b, b, &at, &len);
    uint64_t from = m->off + ((uintptr_t)at - m->addr);
    size_t want = from + len > pt->size ? (size_t)(pt->size - from) : len;
    size_t span = (len + monarch_guard_page - 1) & ~(monarch_guard_page - 1);
    if (m->pfs_fd < 0 || (!m->copied && !(m->copied = calloc((size_t)((m->last - m->first) / 8 + 1), 1))))
        return -1;
    uint64_t evictions = __atomic_load_n(&pt->hdr->evictions, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE) != MONARCH_BLOCK_LENT)
        return 0;
    __typeof__(real_mmap) map = MONARCH_RESOLVE(mmap);
    char *tmp = map(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tmp == MAP_FAILED)
        return -1;
    size_t got = 0;
    while (got < want) {
        ssize_t n = (ssize_t)syscall(SYS_pread64, pt->copy_fd, tmp + got, want - got, (long)(from + got));
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    int left = got < want || __atomic_load_n(&pt->hdr->evictions, __ATOMIC_ACQUIRE) != evictions;
    if (left || MONARCH_RESOLVE(mprotect)(tmp, span, m->prot) != 0
        || syscall(SYS_mremap, tmp, span, span, MREMAP_MAYMOVE | MREMAP_FIXED, at) == -1) {
        MONARCH_RESOLVE(munmap)(tmp, span);
        return left ? 0 : -1;
    }
    uint64_t i = b - m->first;
    monarch_bit_set(m->copied, i, 1);
    monarch_bit_set(m->moved, i, 1); /* (the remapper leaves it be) */
    monarch_guard_clear(m, b);
    /* the oldest copy of the ring guarded again, if there is one, and this one in its place */
    unsigned r = monarch_copies_at;
    monarch_copies_at = (r + 1) % MONARCH_GUARD_COPIES;
    for (unsigned k = 0; k < MONARCH_MAX_MAPPINGS && monarch_copies[r].addr; k++)
        if (monarch_mappings[k].addr == monarch_copies[r].addr) {
            monarch_guard_uncopy_locked(&monarch_mappings[k], monarch_copies[r].block);
            break;
        }
    monarch_copies[r].addr = m->addr;
    monarch_copies[r].block = b;
    return 1;
}

/* The registered mapping holding address a, or NULL. Under the registry's lock. */
static struct monarch_mapping *monarch_mapping_at_locked(uintptr_t a)
{
    for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS; i++)
        if (monarch_mappings[i].addr && monarch_mappings[i].addr <= a
            && a < monarch_mappings[i].addr + monarch_mappings[i].len)
            return &monarch_mappings[i];
    return NULL;
}

/* The guarded page at a made readable: its bytes the PFS's, through the kernel (counted as read
 * so, and as a fault whose block was not here). 1 when it is. Under the registry's lock. */
static int monarch_guard_page_from_pfs_locked(struct monarch_mapping *m, struct monarch_part *pt, uintptr_t a)
{
    if (MONARCH_RESOLVE(mprotect)((void *)(a & ~(uintptr_t)(monarch_guard_page - 1)), monarch_guard_page, m->prot) != 0)
        return 0;
    pt->pages_read += monarch_guard_page;
    monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULTS_LATE, 1);
    return 1;
}

static inline uint64_t monarch_guard_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* A fault at address a: 1 when it was a guard's, now lifted (the access runs again and finds
 * the copy's page, or the PFS's); 0 when it is not this shim's to serve. In the handler: the
 * registry's lock is taken and given back around each look, never held while waiting; no
 * thread holds it while touching the application's mapped pages, so the faulting one never
 * holds it here. */
static int monarch_guard_serve(uintptr_t a)
{
    uint64_t t0 = 0, step_us = 50;
    int pages_tried = 0;
    for (;;) {
        sigset_t maps_held_;
        MONARCH_MAPS_LOCK(maps_held_);
        struct monarch_mapping *m = monarch_mapping_at_locked(a);
        struct monarch_part *pt = m ? &monarch_parts[m->part - 1] : NULL;
        uint64_t b = m ? (m->off + (a - m->addr)) >> pt->shift : 0;
        if (!m || !monarch_guarded(m, b)) {
            /* nothing guarded there now: a guard lifted since the fault (by another thread, the
             * remapper, an mprotect or munmap of the range: before this handler ran, or while it
             * waited), and the access runs again; or the fault was never a guard's, and runs again
             * into the same address, for a third time in a row at most (then it is not ours) */
            MONARCH_MAPS_UNLOCK(maps_held_);
            if (a != monarch_guard_last) {
                monarch_guard_last = a;
                monarch_guard_again = 0;
            }
            return ++monarch_guard_again <= MONARCH_GUARD_AGAIN_MAX;
        }
        monarch_guard_last = 0;
        uint64_t now = monarch_guard_now_ns();
        t0 = t0 ? t0 : now; /* (now == t0: this fault's first look) */
        if (__atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE) == MONARCH_BLOCK_STAGED && pt->copy_fd >= 0) {
            void *at;
            size_t len;
            monarch_guard_span(m, pt, b, b, &at, &len);
            void *r = MONARCH_RESOLVE(mmap)(at, len, m->prot, m->share | MAP_FIXED, pt->copy_fd,
                                            (off_t)(m->off + (uint64_t)((uintptr_t)at - m->addr)));
            if (r != MAP_FAILED) {
                m->moved[(b - m->first) / 8] |= (uint8_t)(1u << ((b - m->first) % 8));
                monarch_guard_clear(m, b);
                monarch_extra_add(MONARCH_EXTRA_BLOCK_REMAPPED_BYTES, len);
                monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULTS_HELD, 1);
                pt->late = 0;
                monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULT_WAIT_NS, now - t0);
                MONARCH_MAPS_UNLOCK(maps_held_);
                return 1;
            }
            MONARCH_DEBUG(1, "mapping a block from its copy failed (%s): the mapping reads the PFS", strerror(errno));
        } else if (__atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE) == MONARCH_BLOCK_LENT && pt->copy_fd >= 0
                   && m->pfs_fd >= 0) {
            if (now == t0)
                monarch_guard_want_locked(m, pt, b, a); /* (the reader's order, as below) */
            int copied = monarch_guard_copy_locked(m, pt, b);
            if (copied > 0) {
                monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULTS_HELD, 1);
                pt->late = 0;
                monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULT_WAIT_NS, now - t0);
            } else if (copied < 0) { /* no memory for a copy: its pages from the PFS */
                monarch_guard_lift_locked(m, b, b);
                monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULTS_LATE, 1);
            }
            MONARCH_MAPS_UNLOCK(maps_held_);
            if (copied)
                return 1;
            continue; /* it left as it was read: looked at again (ABSENT now, or LENT anew) */
        } else if (!__atomic_load_n(&pt->hdr->done, __ATOMIC_ACQUIRE) && pt->copy_fd >= 0 && !pt->unguarded) {
            if (now == t0)
                monarch_guard_want_locked(m, pt, b, a); /* (once per fault: it tells the reader's order) */
            if (m->fault_run < 2 && monarch_pages_may_locked(m, pt, b)) {
                /* a window's random fault on another owner's block: its pages from that owner
                 * (shim_pages.c); where they cannot be had now, its page from the PFS, not its whole
                 * block's (the owners serve its other pages once they answer again), kept among the
                 * runs (a mapping of its own each: their number is bounded, the oldest guarded again) */
                if (!pages_tried && !monarch_pages_paused()) {
                    MONARCH_MAPS_UNLOCK(maps_held_);
                    if (monarch_pages_serve(a))
                        return 1;
                    pages_tried = 1;
                    continue;
                }
                if (monarch_guard_page_from_pfs_locked(m, pt, a)) {
                    monarch_pages_keep_locked(m, a & ~(uintptr_t)(monarch_guard_page - 1), monarch_guard_page, b);
                    MONARCH_MAPS_UNLOCK(maps_held_);
                    return 1;
                }
            }
            if (m->fault_run < 2 && __atomic_load_n(&pt->hdr->window, __ATOMIC_ACQUIRE)
                && pt->pages_read + monarch_guard_page > pt->size / MONARCH_GUARD_PFS_SHARE) {
                /* a window's random fault, past the pages it may read from the PFS while its block
                 * comes (below): nothing wanted for it (monarch_guard_want_locked), and its block's
                 * pages are the PFS's from now on, in this process */
                monarch_guard_lift_locked(m, b, b);
                monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULTS_LATE, 1);
                MONARCH_MAPS_UNLOCK(maps_held_);
                return 1;
            }
            /* a reader in order waits for the block, as long as a large read does (its owner may
             * read it first), its next blocks on their way. A random fault waits about a page's
             * round trip on the PFS, then reads its page there (its block still comes: a run of
             * 8 under way can take a second at the start, when every node fetches at once), while
             * this process has read less than 1/MONARCH_GUARD_PFS_SHARE of the file so: a random
             * reader's first steps go at the PFS's pace, not the blocks', and the PFS is read at
             * most that much more per node; then it waits for its blocks too */
            uint64_t budget = m->fault_run >= 2
                                      || pt->pages_read + monarch_guard_page > pt->size / MONARCH_GUARD_PFS_SHARE
                                  ? __atomic_load_n(&pt->hdr->wait_us, __ATOMIC_ACQUIRE) * 1000ULL
                                  : MONARCH_GUARD_PAGE_WAIT_NS;
            /* a reader in order waits longer for a block the daemon is fetching (FILLING): it comes,
             * from its owner or, should the owner fail, from the PFS by the daemon (its bytes read once
             * still). A random fault does not: its stall would cost the job more than its page */
            if (m->fault_run >= 2 && __atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE) == MONARCH_BLOCK_FILLING)
                budget *= MONARCH_GUARD_FILLING_WAITS;
            if (now - t0 < budget) {
                MONARCH_MAPS_UNLOCK(maps_held_);
                struct timespec ts = {0, (long)step_us * 1000L};
                nanosleep(&ts, NULL); /* (async-signal-safe; another signal ends it early) */
                step_us = step_us * 2 > 1000 ? 1000 : step_us * 2;
                continue;
            }
            if (budget == MONARCH_GUARD_PAGE_WAIT_NS && monarch_guard_page_from_pfs_locked(m, pt, a)) {
                MONARCH_MAPS_UNLOCK(maps_held_);
                return 1;
            }
        }
        int late = !__atomic_load_n(&pt->hdr->done, __ATOMIC_ACQUIRE) && pt->copy_fd >= 0 && !pt->unguarded;
        if (late)
            monarch_extra_add(MONARCH_EXTRA_BLOCK_FAULTS_LATE, 1);
        if (!late || ++pt->late >= MONARCH_GUARD_LATE_MAX) {
            /* no more blocks will come (done), the copy is closed, or blocks keep coming late
             * (the daemon or the peer plane lost): this file's mappings read the PFS from now on */
            pt->unguarded = 1;
            for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS; i++)
                if (monarch_mappings[i].addr && monarch_mappings[i].part == m->part)
                    monarch_guard_lift_all_locked(&monarch_mappings[i]);
        } else
            monarch_guard_lift_locked(m, b, b); /* late (a queue at its owner): its pages from the PFS */
        MONARCH_MAPS_UNLOCK(maps_held_);
        return 1;
    }
}

/* A signal the shim's handler does not serve, given the application's handler ``app`` when it set
 * one (1); 0: its disposition is the default or to ignore (the caller acts it). */
static int monarch_app_handler(const struct sigaction *app, int sig, siginfo_t *si, void *ctx)
{
    if ((app->sa_flags & SA_SIGINFO) && app->sa_sigaction) {
        app->sa_sigaction(sig, si, ctx);
        return 1;
    }
    if (!(app->sa_flags & SA_SIGINFO) && app->sa_handler != SIG_DFL && app->sa_handler != SIG_IGN) {
        app->sa_handler(sig);
        return 1;
    }
    return 0;
}

/* A fault that is not a guard's, or SIGSEGV sent by kill: the application's disposition. */
static void monarch_guard_chain(int sig, siginfo_t *si, void *ctx)
{
    struct sigaction app = monarch_app_segv; /* (a copy: the application may change it meanwhile) */
    if (monarch_app_handler(&app, sig, si, ctx))
        return;
    if (app.sa_handler == SIG_IGN && si->si_code <= 0)
        return; /* sent, and ignored */
    /* the default: end the process as without the shim. A fault runs again and meets it; a
     * signal sent is sent again, held until this handler returns */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(SIGSEGV, &dfl, NULL);
    if (si->si_code <= 0)
        syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), SIGSEGV);
}

static void monarch_guard_on_fault(int sig, siginfo_t *si, void *ctx)
{
    int saved = errno;
    if (si->si_code == SEGV_ACCERR && monarch_guard_serve((uintptr_t)si->si_addr)) {
        errno = saved;
        return;
    }
    monarch_guard_chain(sig, si, ctx);
    errno = saved;
}

/* Before a write or send reads [p, p + n): the guarded pages there faulted in from user mode. */
static void monarch_guard_touch_slow(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p, z = a + n;
    for (unsigned i = 0; i < MONARCH_MAX_MAPPINGS; i++) {
        uintptr_t addr = __atomic_load_n(&monarch_mappings[i].addr, __ATOMIC_ACQUIRE);
        size_t len = __atomic_load_n(&monarch_mappings[i].len, __ATOMIC_ACQUIRE);
        if (!addr || !monarch_mappings[i].guarded || addr >= z || a >= addr + len)
            continue;
        uintptr_t from = (a > addr ? a : addr) & ~(uintptr_t)4095, to = z < addr + len ? z : addr + len;
        for (uintptr_t q = from; q < to; q += 4096)
            (void)*(volatile const char *)q;
    }
}

/* The application changes a range's protection: a mapping being moved there is moved no more
 * (its guards lifted first: the protection left is the application's). */
MONARCH_EXPORT int mprotect(void *addr, size_t len, int prot)
{
    MONARCH_REAL(mprotect, -1)
    if (MONARCH_LIKELY(!__atomic_load_n(&monarch_nmappings, __ATOMIC_ACQUIRE)))
        return real_(addr, len, prot);
    sigset_t maps_held_;
    MONARCH_MAPS_LOCK(maps_held_);
    monarch_mappings_forget_locked((uintptr_t)addr, len);
    int r = real_(addr, len, prot);
    MONARCH_MAPS_UNLOCK(maps_held_);
    return r;
}

/* ---- SIGSEGV's disposition, as the application sees it ---- */
MONARCH_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    MONARCH_REAL(sigaction, -1)
    if (MONARCH_UNLIKELY(sig == SIGSYS) && monarch_raw_sigaction(sig, act, old))
        return 0; /* SIGSYS's handler is the shim's while raw calls are watched: shim_rawsys.c */
    if (MONARCH_LIKELY(sig != SIGSEGV || !__atomic_load_n(&monarch_segv_ours, __ATOMIC_ACQUIRE)))
        return real_(sig, act, old);
    struct sigaction copy;
    if (act)
        copy = *act; /* (read before the lock: a bad pointer faults here, as in libc) */
    monarch_segv_lock();
    if (old)
        *old = monarch_app_segv;
    if (act)
        monarch_app_segv = copy;
    monarch_segv_unlock();
    return 0;
}

/* signal, bsd_signal and sysv_signal call libc's own sigaction, never this one: SIGSEGV's (and
 * SIGSYS's), while the handler is ours, is kept here as sigaction keeps it (BSD's semantics for
 * signal and bsd_signal, System V's one-shot for sysv_signal) */
static sighandler_t monarch_kept_signal(int sig, sighandler_t h, int flags)
{
    struct sigaction n, o;
    memset(&n, 0, sizeof n);
    n.sa_handler = h;
    n.sa_flags = flags;
    sigemptyset(&n.sa_mask);
    if (!(flags & SA_NODEFER))
        sigaddset(&n.sa_mask, sig);
    sigaction(sig, &n, &o);
    return (o.sa_flags & SA_SIGINFO) ? (sighandler_t)(void (*)(void))o.sa_sigaction : o.sa_handler;
}

#define MONARCH_WRAP_SIGNAL(name, flags)                                                    \
    MONARCH_EXPORT sighandler_t name(int sig, sighandler_t h)                               \
    {                                                                                       \
        MONARCH_REAL(name, SIG_ERR)                                                         \
        if (MONARCH_LIKELY((sig != SIGSEGV || !__atomic_load_n(&monarch_segv_ours, __ATOMIC_ACQUIRE)) \
                           && (sig != SIGSYS || !__atomic_load_n(&monarch_raw_on, __ATOMIC_ACQUIRE)))) \
            return real_(sig, h);                                                           \
        return monarch_kept_signal(sig, h, flags);                                          \
    }
MONARCH_WRAP_SIGNAL(signal, SA_RESTART)
MONARCH_WRAP_SIGNAL(bsd_signal, SA_RESTART)
MONARCH_WRAP_SIGNAL(sysv_signal, SA_RESETHAND | SA_NODEFER)

/* ---- the calls whose kernel reads the application's memory: its guarded pages faulted in first ---- */
static void monarch_guard_touch_iov(const struct iovec *v, int c)
{
    if (MONARCH_UNLIKELY(__atomic_load_n(&monarch_nguarded, __ATOMIC_RELAXED)) && v)
        for (int i = 0; i < c; i++)
            monarch_guard_touch(v[i].iov_base, v[i].iov_len);
}

/* (and a write-back file's room, and its writes' time: shim_writeback.c) */
#define MONARCH_WRAP_WRITE(ret, name, params, args, fail, touch)                    \
    MONARCH_EXPORT ret name params                                                   \
    {                                                                                \
        MONARCH_REAL(name, fail)                                                     \
        touch;                                                                       \
        return real_ args;                                                           \
    }
#define MONARCH_WRAP_FDWRITE(ret, name, params, args, fd, n, touch)                  \
    MONARCH_EXPORT ret name params                                                   \
    {                                                                                \
        MONARCH_REAL(name, -1)                                                       \
        touch;                                                                       \
        uint64_t wb_ = monarch_wb_writing(fd, n);                                    \
        ret r_ = real_ args;                                                         \
        monarch_wb_wrote(fd, wb_);                                                   \
        return r_;                                                                   \
    }
static size_t monarch_iov_len(const struct iovec *v, int c)
{
    size_t n = 0;
    for (int i = 0; v && i < c; i++)
        n += v[i].iov_len;
    return n;
}
MONARCH_WRAP_FDWRITE(ssize_t, write, (int fd, const void *b, size_t n), (fd, b, n), fd, n, monarch_guard_touch(b, n))
MONARCH_WRAP_FDWRITE(ssize_t, pwrite, (int fd, const void *b, size_t n, off_t o), (fd, b, n, o), fd, n,
                     monarch_guard_touch(b, n))
MONARCH_WRAP_FDWRITE(ssize_t, pwrite64, (int fd, const void *b, size_t n, off64_t o), (fd, b, n, o), fd, n,
                     monarch_guard_touch(b, n))
MONARCH_WRAP_FDWRITE(ssize_t, writev, (int fd, const struct iovec *v, int c), (fd, v, c), fd,
                     monarch_nwb ? monarch_iov_len(v, c) : 0, monarch_guard_touch_iov(v, c))
MONARCH_WRAP_FDWRITE(ssize_t, pwritev, (int fd, const struct iovec *v, int c, off_t o), (fd, v, c, o), fd,
                     monarch_nwb ? monarch_iov_len(v, c) : 0, monarch_guard_touch_iov(v, c))
MONARCH_WRAP_FDWRITE(ssize_t, pwritev64, (int fd, const struct iovec *v, int c, off64_t o), (fd, v, c, o), fd,
                     monarch_nwb ? monarch_iov_len(v, c) : 0, monarch_guard_touch_iov(v, c))
MONARCH_WRAP_WRITE(ssize_t, send, (int fd, const void *b, size_t n, int f), (fd, b, n, f), -1,
                   monarch_guard_touch(b, n))
MONARCH_WRAP_WRITE(ssize_t, sendto, (int fd, const void *b, size_t n, int f, const struct sockaddr *to, socklen_t tl),
                   (fd, b, n, f, to, tl), -1, monarch_guard_touch(b, n))
MONARCH_WRAP_WRITE(ssize_t, sendmsg, (int fd, const struct msghdr *h, int f), (fd, h, f), -1,
                   if (h) monarch_guard_touch_iov(h->msg_iov, (int)h->msg_iovlen))
/* (stdio writes a large item from the application's buffer with libc's own write, unseen) */
MONARCH_WRAP_WRITE(size_t, fwrite, (const void *b, size_t s, size_t n, FILE *fp), (b, s, n, fp), 0,
                   monarch_guard_touch(b, s * n))
#undef fwrite_unlocked /* a macro of bits/stdio.h when optimizing */
MONARCH_WRAP_WRITE(size_t, fwrite_unlocked, (const void *b, size_t s, size_t n, FILE *fp), (b, s, n, fp), 0,
                   monarch_guard_touch(b, s * n))
