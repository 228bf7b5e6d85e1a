/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_fill.h). Here:
 * an application's large read of blocks not staged fills the copy.
 *
 * A read of MONARCH_FILL_MIN bytes or more (a whole-file read, a checkpoint's tensors, a
 * shard read in large calls) reads the PFS once for the application and the copy: the blocks
 * it spans that it may fill are claimed (FILLING, by compare-and-swap: the daemon skips them, as
 * the shim skips the daemon's), read from the PFS whole, in the application's order, straight
 * into the copy (a mapping of the copy is the read's buffer: the bytes in the copy are the
 * PFS's, never the application's memory, which another of its threads may change), copied to
 * the application's buffer, and marked STAGED. Without it the application's read and the
 * daemon's read-ahead read the same bytes: the job read a file read whole twice. Its blocks
 * staged already are read from the copy; those another process or the daemon is filling are
 * waited for (up to MONARCH_FILL_WAIT_NS, then read from the PFS at the read's own size).
 *
 * Which blocks it may fill: of a file the room holds whole (the map's `fill`), any block not
 * staged (ABSENT, WANTED); of a file larger than its room, only the blocks the daemon PLANNED
 * (room held for them, the read-ahead's next). The others a read of a larger file goes through
 * in order are read from the PFS at the read's own size and marked PASSED, not WANTED: the
 * application has them, so the daemon stages them last, once nothing else is left, never before
 * a block the reader will still read (a one-pass job reads each byte from the PFS once).
 *
 * Whole blocks: the read's first and last blocks are read whole (at most two blocks more than
 * it asked, on a read of at least four), so that no block is left for the daemon to read a
 * second time. A smaller read does the same only when it continues, after a block or more, the
 * part's reads in the file's order (monarch_part_sequential: cat's 128 KiB reads, a FILE's
 * buffer, shim_stdio.c), whose next blocks it reads anyway; else it stays at its own size (its
 * blocks WANTED), so a random reader of small records never pays a block on its time.
 *
 * Never a wrong byte: a block is STAGED only once its bytes are in the copy, and only if it is
 * still FILLING (the job's own write sets every block ABSENT first: then the fill is lost, not
 * served); a read that fails or comes back short gives its blocks back (ABSENT, or PLANNED),
 * and the whole read is then the PFS's, as before. Only while the daemon stages (not done),
 * and not on a cluster's node (its blocks come from their owners: monarch_part_wait). readv
 * stays as before.
 */
#include "shim_fill.h"

#define MONARCH_FILL_MAX_BLOCKS 4096         /* blocks of one such read (more: the PFS's as before) */
#define MONARCH_FILL_CHUNK 16                /* blocks read at once, STAGED as each chunk lands */
#define MONARCH_FILL_WAIT_NS 500000000LL     /* the most a read waits for blocks another fills */

/* The copy reopened writable (its number is the shim's read-only one; the application may
 * have closed and reused it: the identity is checked), or -1. */
static int monarch_part_fill_fd(struct monarch_part *pt)
{
    char p[48];
    int cfd = pt->copy_fd;
    if (cfd < 0 || snprintf(p, sizeof p, "/proc/self/fd/%d", cfd) >= (int)sizeof p)
        return -1;
    int w = MONARCH_RESOLVE(openat)(AT_FDCWD, p, O_RDWR | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (w >= 0 && (monarch_sys_fstat(w, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != pt->copy_dev
                   || st.st_ino != pt->copy_ino || (uint64_t)st.st_size != pt->size)) {
        real_close(w);
        w = -1;
    }
    return w;
}

static inline int monarch_fill_bit(const uint64_t *bits, uint64_t i)
{
    return (int)((bits[i / 64] >> (i % 64)) & 1);
}

/* Blocks [b, e] claimed by this read given back (to `back`: ABSENT, or PLANNED: the room stays
 * held) when still FILLING. */
static void monarch_fill_unclaim(struct monarch_part *pt, uint64_t *bits, uint64_t first, uint64_t b, uint64_t e,
                                 uint8_t back)
{
    for (uint64_t x = b; x <= e; x++) {
        if (!monarch_fill_bit(bits, x - first))
            continue;
        uint8_t filling = MONARCH_BLOCK_FILLING;
        __atomic_compare_exchange_n(&pt->states[x], &filling, back, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
        bits[(x - first) / 64] &= ~(1ULL << ((x - first) % 64));
    }
}

/* Blocks [b, e] (claimed) read from the PFS into the copy, the application's part of them
 * copied to buf (the read's [start, end)); 0 if the PFS failed or came back short. */
static int monarch_fill_run(int fd, int wfd, struct monarch_part *pt, uint64_t b, uint64_t e, char *buf,
                            uint64_t start, uint64_t end, uint64_t *pfs)
{
    uint64_t off = b << pt->shift, to = (e + 1) << pt->shift;
    if (to > pt->size)
        to = pt->size;
    size_t len = (size_t)(to - off);
    char *w = MONARCH_RESOLVE(mmap)(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, wfd, (off_t)off);
    if (w == MAP_FAILED)
        return 0;
    size_t got = 0;
    monarch_part_read_pfs(pt); /* (each run: a long read keeps saying it) */
    while (got < len) {
        ssize_t r = (ssize_t)syscall(SYS_pread64, fd, w + got, len - got, (long)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got == len) {
        uint64_t a = off > start ? off : start, z = to < end ? to : end;
        memcpy(buf + (a - start), w + (a - off), (size_t)(z - a));
        *pfs += z - a;
        /* after the bytes: a reader that sees STAGED reads them. Not once the daemon is done (the
         * job wrote to the file, or its source changed, or it stops): the bytes are the
         * application's, the blocks stay ABSENT */
        uint8_t to_state = __atomic_load_n(&pt->hdr->done, __ATOMIC_ACQUIRE) ? MONARCH_BLOCK_ABSENT
                                                                               : MONARCH_BLOCK_STAGED;
        for (uint64_t x = b; x <= e; x++) {
            uint8_t filling = MONARCH_BLOCK_FILLING;
            __atomic_compare_exchange_n(&pt->states[x], &filling, to_state, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
        }
    }
    MONARCH_RESOLVE(munmap)(w, len);
    return got == len;
}

/* [a, z) of the read [start, end) from the PFS into buf at the read's own size; 0 if the PFS
 * failed or ended early. */
static int monarch_fill_direct(int fd, char *buf, uint64_t start, uint64_t a, uint64_t z)
{
    size_t got = 0;
    monarch_part_reads_pfs(fd);
    while (got < z - a) {
        ssize_t r = (ssize_t)syscall(SYS_pread64, fd, buf + (a - start) + got, (size_t)(z - a - got), (long)(a + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got == z - a;
}

/* A read of n bytes at o (-1: the descriptor's offset) of part pt: 1 and *out when it was
 * served here (filling what it read from the PFS into the copy); 0 when the plain path is to
 * serve it (not eligible: fewer than min bytes, ...; every block staged, or anything failed:
 * then nothing is counted and the descriptor's offset is untouched). */
static int monarch_part_fill(int fd, struct monarch_part *pt, void *buf, size_t n, off_t o, int at_offset,
                             size_t min, ssize_t *out)
{
    struct monarch_blockmap_header *h = pt->hdr;
    if (n < min)
        return 0;
    /* whole: room for every block; else only PLANNED blocks are this read's to fill. done: none
     * (the staged blocks from the copy, the others from the PFS, rather than all from the PFS) */
    int done = __atomic_load_n(&h->done, __ATOMIC_ACQUIRE) != 0;
    int whole = !done && __atomic_load_n(&h->fill, __ATOMIC_ACQUIRE) != 0;
    if (!whole && __atomic_load_n(&h->wait_us, __ATOMIC_ACQUIRE))
        return 0; /* a cluster's node: its blocks come from their owners */
    uint8_t back = whole ? MONARCH_BLOCK_ABSENT : MONARCH_BLOCK_PLANNED;
    if (o < 0 && (o = (off_t)syscall(SYS_lseek, fd, 0, SEEK_CUR)) < 0)
        return 0;
    if ((uint64_t)o >= pt->size)
        return 0;
    uint64_t start = (uint64_t)o, end = start + n < pt->size ? start + n : pt->size;
    uint64_t first = start >> pt->shift, last = (end - 1) >> pt->shift;
    if (last - first + 1 > MONARCH_FILL_MAX_BLOCKS)
        return 0;
    uint64_t bits[MONARCH_FILL_MAX_BLOCKS / 64] = {0};
    int pending = 0, claimed = 0;
    for (uint64_t b = first; b <= last; b++) {
        uint8_t s = __atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE);
        if (s == MONARCH_BLOCK_STAGED)
            continue;
        pending = 1;
        if (done)
            continue;
        if (whole ? s == MONARCH_BLOCK_ABSENT || s == MONARCH_BLOCK_WANTED : s == MONARCH_BLOCK_PLANNED) {
            if (__atomic_compare_exchange_n(&pt->states[b], &s, MONARCH_BLOCK_FILLING, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
                bits[(b - first) / 64] |= 1ULL << ((b - first) % 64), claimed = 1;
        }
        /* a larger file's block with no room planned: this read takes it from the PFS (PASSED before
         * its bytes are read, so the daemon plans after it); planned meanwhile: claimed after all */
        while (!whole && (s == MONARCH_BLOCK_ABSENT || s == MONARCH_BLOCK_WANTED)
               && !__atomic_compare_exchange_n(&pt->states[b], &s, MONARCH_BLOCK_PASSED, 0, __ATOMIC_ACQ_REL,
                                               __ATOMIC_ACQUIRE))
            if (s == MONARCH_BLOCK_PLANNED
                && __atomic_compare_exchange_n(&pt->states[b], &s, MONARCH_BLOCK_FILLING, 0, __ATOMIC_ACQ_REL,
                                               __ATOMIC_ACQUIRE))
                bits[(b - first) / 64] |= 1ULL << ((b - first) % 64), claimed = 1;
    }
    if (!pending)
        return 0; /* every block staged: the copy's, by the plain path */
    int wfd = !claimed ? -2 : __atomic_load_n(&h->done, __ATOMIC_ACQUIRE) ? -1 : monarch_part_fill_fd(pt);
    if (wfd == -1) {
        monarch_fill_unclaim(pt, bits, first, first, last, back);
        return 0;
    }
    uint64_t pfs = 0, local = 0;
    for (uint64_t b = first; b <= last; b++) { /* the claimed blocks, in chunks of runs */
        if (!monarch_fill_bit(bits, b - first))
            continue;
        uint64_t e = b;
        while (e + 1 <= last && e + 1 - b < MONARCH_FILL_CHUNK && monarch_fill_bit(bits, e + 1 - first))
            e++;
        if (!monarch_fill_run(fd, wfd, pt, b, e, (char *)buf, start, end, &pfs)) {
            monarch_fill_unclaim(pt, bits, first, b, last, back);
            real_close(wfd);
            return 0;
        }
        b = e; /* (their bits stay set: served) */
    }
    if (wfd >= 0)
        real_close(wfd);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t ra = 0, rz = 0; /* a run of the others the PFS serves at the read's size, read as one */
    for (uint64_t b = first; b <= last + 1; b++) { /* the others: staged, another's fill, or the PFS's */
        int mine = b <= last && monarch_fill_bit(bits, b - first);
        uint64_t a = b << pt->shift, z = (b + 1) << pt->shift;
        a = a > start ? a : start;
        z = z < end ? z : end;
        uint8_t s = MONARCH_BLOCK_STAGED;
        while (b <= last && !mine && (s = __atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE)) == MONARCH_BLOCK_FILLING) {
            struct timespec now, nap = {0, 200000};
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((now.tv_sec - t0.tv_sec) * 1000000000LL + (now.tv_nsec - t0.tv_nsec) > MONARCH_FILL_WAIT_NS) {
                MONARCH_DEBUG(2, "fill: block %llu waited out", (unsigned long long)b);
                break;
            }
            nanosleep(&nap, NULL);
        }
        if (b <= last && !mine && s != MONARCH_BLOCK_STAGED) {
            if (whole)
                monarch_part_staged(pt, a, z - a); /* its ABSENT blocks WANTED */
            if (rz != a)
                ra = a;
            rz = z;
            continue;
        }
        if (rz > ra) { /* the run ends here: read it */
            if (!monarch_fill_direct(fd, (char *)buf, start, ra, rz))
                return 0; /* the PFS failed or ends early: the plain read says so (blocks filled stay staged) */
            pfs += rz - ra;
            ra = rz = 0;
        }
        if (b > last || mine)
            continue;
        ssize_t r = (ssize_t)syscall(SYS_pread64, pt->copy_fd, (char *)buf + (a - start), (size_t)(z - a), (long)a);
        if (r == (ssize_t)(z - a)) {
            local += z - a;
            continue;
        }
        if (!monarch_fill_direct(fd, (char *)buf, start, a, z)) /* the copy failed: the PFS's */
            return 0;
        pfs += z - a;
    }
    MONARCH_DEBUG(2, "fill %llu+%zu: whole %d claimed %d local %llu pfs %llu", (unsigned long long)start, n, whole,
                  claimed, (unsigned long long)local, (unsigned long long)pfs);
    *out = (ssize_t)(end - start);
    if (at_offset)
        syscall(SYS_lseek, fd, (off_t)end, SEEK_SET);
    monarch_count_bytes(fd, pfs);
    monarch_extra_add(MONARCH_EXTRA_BLOCK_PFS_BYTES, pfs);
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && local && getpid() == monarch_pid)
        __atomic_fetch_add(monarch_counter(pt->slot, 1), local, __ATOMIC_RELAXED);
    monarch_extra_add(MONARCH_EXTRA_BLOCK_LOCAL_BYTES, local);
    return 1;
}
