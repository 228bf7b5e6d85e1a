/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_touched.h).
 * Here: a mapping's reader, seen through the pages its faults brought in from the PFS (mincore),
 * for the two things the daemon cannot see of it: where a cluster's reader is, and whether one
 * node's reader reads records at random. */
#include "shim_touched.h"

#define MONARCH_TOUCH_AHEAD 8                  /* blocks wanted past the furthest one a mapping's reader touched */
#define MONARCH_TOUCH_EVERY_NS 10000000ULL     /* a mapping's touched pages are looked at every 10 ms at most */
#define MONARCH_IN_ORDER_LOOKS 3                /* looks in a row that make a mapping's reader sequential */
#define MONARCH_TOUCH_AHEAD_IN_ORDER 32         /* blocks wanted past a sequential reader */
#define MONARCH_RECORDS_SAMPLE 128             /* blocks not staged a look for records mincores */
#define MONARCH_RECORDS_RUNS 8                 /* runs of resident pages seen before it is decided */
#define MONARCH_RECORDS_PAGES_MIN 4            /* a mean run of this many pages or more: records (16 KiB) */
#define MONARCH_RECORDS_PAGES_MAX 64           /* ... and fewer than this: not a scan's (256 KiB) */
#define MONARCH_RECORDS_VEC 1024               /* mincore's vector: the pages of a block (4 MiB at most) */
#define MONARCH_RECORDS_COUNTED_MAX (1ULL << 26) /* pages of a file looked at (256 GiB: 8 MiB of bits) */

/* A mapping's faults are the kernel's, so the daemon cannot see where its reader is: the
 * blocks not staged whose pages are resident (faulted in from the PFS: the reader touched them)
 * are marked WANTED, with the MONARCH_TOUCH_AHEAD blocks after the furthest of them, so the
 * daemon fetches from their owners the blocks where the reader is and where a sequential reader
 * goes next before its read-ahead. Every MONARCH_TOUCH_EVERY_NS at most: one mincore over the
 * mapping. A cluster's file only (its map's wait_us): on one node the read-ahead goes in the
 * file's order from its start, ahead of a reader in order, and the look costs a reader that maps
 * a large file anew at every step a mincore of all of it each time (bench_block_copy: 40% of its
 * steps while the copy runs). Under the registry's lock. */
static void monarch_mapping_want_touched_locked(struct monarch_mapping *m, struct monarch_part *pt)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t ns = (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
    if (ns - m->looked_ns < MONARCH_TOUCH_EVERY_NS || __atomic_load_n(&pt->hdr->window, __ATOMIC_ACQUIRE))
        return; /* (a window's blocks are wanted by the guarded faults of a reader in order alone) */
    m->looked_ns = ns;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (m->len + page - 1) / page;
    if (!m->resident && !(m->resident = malloc(pages)))
        return;
    if (mincore((void *)m->addr, m->len, m->resident) != 0)
        return;
    uint64_t furthest = 0, nearest = 0;
    int touched = 0;
    for (uint64_t b = m->first; b <= m->last; b++) {
        uint64_t i = b - m->first;
        if ((m->moved[i / 8] >> (i % 8)) & 1)
            continue;
        uint8_t s = __atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE);
        if (s == MONARCH_BLOCK_STAGED)
            continue;
        uint64_t from = b << pt->shift, to = (b + 1) << pt->shift;
        from = from < m->off ? m->off : from;
        to = to > m->off + m->len ? m->off + m->len : to;
        size_t p = (size_t)((from - m->off) / page), end = (size_t)((to - m->off + page - 1) / page);
        while (p < end && p < pages && !(m->resident[p] & 1))
            p++;
        if (p >= end || p >= pages)
            continue;
        nearest = touched ? nearest : b;
        touched = 1;
        furthest = b;
        uint8_t absent = MONARCH_BLOCK_ABSENT;
        __atomic_compare_exchange_n(&pt->states[b], &absent, MONARCH_BLOCK_WANTED, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
    }
    if (!touched)
        return;
    /* a reader whose touched blocks not staged are a few adjacent ones, going forward, look after
     * look, reads in order (a weights load, a scan): the blocks well past it are wanted too, so
     * its pages are moved onto the copy before it gets there (its faults stay page by page on
     * the PFS: read around, a reader the PFS serves as fast as the copy would never wait for
     * its blocks, and the PFS would be read twice). A random reader's touches are spread. */
    m->in_order = furthest - nearest <= 2 && furthest >= m->furthest ? m->in_order + 1 : 0;
    m->furthest = furthest;
    uint64_t ahead = m->in_order >= MONARCH_IN_ORDER_LOOKS ? MONARCH_TOUCH_AHEAD_IN_ORDER : MONARCH_TOUCH_AHEAD;
    for (uint64_t b = furthest + 1; b <= furthest + ahead && b <= m->last; b++) {
        uint8_t absent = MONARCH_BLOCK_ABSENT;
        __atomic_compare_exchange_n(&pt->states[b], &absent, MONARCH_BLOCK_WANTED, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
    }
}

/* A random reader of records (an LMDB's values, a few pages each) waits for its faults one after
 * another: with MADV_RANDOM each of its pages is a fault of its own, and every one of them waits
 * behind the read-ahead's queue at the link, so while its file stages it ran at 0.46x direct's
 * pace. Such a reader is told apart by the runs of pages its faults bring in (MADV_RANDOM: one
 * page a fault, so a run is what the reader touched): a mean run of MONARCH_RECORDS_PAGES_MIN pages
 * or more, under MONARCH_RECORDS_PAGES_MAX (a scan's runs are whole blocks), over
 * MONARCH_RECORDS_RUNS runs. Then the map's records is MONARCH_RECORDS_YES: this process's mappings
 * (and every other's, at their remapper's next look or their mmap) read around as direct's do, and the
 * daemon's read-ahead yields the link to their faults (read_pace.py). A 2 KiB window's runs are one
 * or two pages: its faults stay page-sized and the read-ahead at its pace. A look mincores
 * MONARCH_RECORDS_SAMPLE blocks not staged, in turn (a whole 1 GiB mapping's mincore takes 23 ms),
 * every MONARCH_RECORDS_EVERY_NS at most, until it is decided, once per file (a reader that maps the
 * file anew each step looks through several mappings: the first process to decide says so in the map,
 * MONARCH_RECORDS_NO too, and every process's looks end). Each page is counted once, and a run where
 * its first page is new: a record being faulted in when a look comes is counted short, then grows
 * at the next looks (counted at every look, the records a loaded machine faults in over several
 * looks would each be counted short several times, and their reader taken for one of pages). Blocks
 * the daemon is filling are not looked at: its reads of the source bring in whole runs of pages. A
 * file of over MONARCH_RECORDS_COUNTED_MAX pages is not looked at. One node's
 * file only: a cluster's faults are the guards' (shim_guard.c). Under the registry's lock. */
static void monarch_mapping_records_locked(struct monarch_mapping *m, struct monarch_part *pt)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t per = ((size_t)1 << pt->shift) / page;
    uint64_t file_pages = (pt->size + page - 1) / page;
    unsigned char vec[MONARCH_RECORDS_VEC];
    /* (pages a fault only under MADV_RANDOM: the shim's, or the application's own) */
    if (pt->records_known || !(m->random || m->app_advice == MADV_RANDOM + 1) || per > sizeof vec
        || file_pages > MONARCH_RECORDS_COUNTED_MAX
        || __atomic_load_n(&pt->hdr->records, __ATOMIC_ACQUIRE)) { /* (decided here, or by another process) */
        pt->records_known = 1;
        return;
    }
    uint64_t ns = monarch_now_ns();
    if (ns - pt->records_looked_ns < MONARCH_RECORDS_EVERY_NS) {
        monarch_records_looking = 1;
        return;
    }
    if (!pt->records_counted && !(pt->records_counted = calloc((size_t)(file_pages / 8 + 1), 1)))
        return;
    pt->records_first_ns = pt->records_first_ns ? pt->records_first_ns : ns;
    pt->records_looked_ns = ns;
    uint64_t b = pt->records_next >= m->first && pt->records_next <= m->last ? pt->records_next : m->first;
    unsigned looked = 0;
    for (uint64_t k = 0; k <= m->last - m->first && looked < MONARCH_RECORDS_SAMPLE;
         k++, b = b == m->last ? m->first : b + 1) {
        uint64_t i = b - m->first;
        uint8_t state = __atomic_load_n(&pt->states[b], __ATOMIC_ACQUIRE);
        if (((m->moved[i / 8] >> (i % 8)) & 1) || (state != MONARCH_BLOCK_ABSENT && state != MONARCH_BLOCK_WANTED))
            continue;
        uint64_t from = b << pt->shift, to = (b + 1) << pt->shift;
        from = from < m->off ? m->off : from;
        to = to > m->off + m->len ? m->off + m->len : to;
        size_t pages = (size_t)((to - from + page - 1) / page);
        if (mincore((void *)(m->addr + (from - m->off)), (size_t)(to - from), vec) != 0)
            continue;
        looked++;
        uint64_t first_page = from / page;
        for (size_t p = 0; p < pages && first_page + p < file_pages; p++) { /* (a mapping may pass the end) */
            uint64_t fp = first_page + p;
            uint8_t bit = (uint8_t)(1u << (fp % 8));
            if (!(vec[p] & 1) || (pt->records_counted[fp / 8] & bit))
                continue;
            pt->records_counted[fp / 8] |= bit;
            pt->records_pages++;
            pt->records_runs += p == 0 || !(vec[p - 1] & 1);
        }
    }
    pt->records_next = b;
    if (pt->records_runs < MONARCH_RECORDS_RUNS) {
        monarch_records_looking = 1;
        return;
    }
    free(pt->records_counted);
    pt->records_counted = NULL;
    pt->records_known = 1;
    int yes = pt->records_pages >= MONARCH_RECORDS_PAGES_MIN * pt->records_runs
              && pt->records_pages < MONARCH_RECORDS_PAGES_MAX * pt->records_runs;
    uint64_t none = 0; /* (the first find stands: once per file, for every process) */
    __atomic_compare_exchange_n(&pt->hdr->records, &none, yes ? MONARCH_RECORDS_YES : MONARCH_RECORDS_NO, 0,
                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (yes) {
        MONARCH_DEBUG(1, "a mapping's reader reads records (%llu pages in %llu runs, %.0f ms of looks): its faults read around",
                      (unsigned long long)pt->records_pages, (unsigned long long)pt->records_runs,
                      (double)(ns - pt->records_first_ns) / 1e6);
    } else
        MONARCH_DEBUG(1, "a mapping's reader reads no records (%llu pages in %llu runs, %.0f ms of looks)",
                      (unsigned long long)pt->records_pages, (unsigned long long)pt->records_runs,
                      (double)(ns - pt->records_first_ns) / 1e6);
}
