/* Part of monarch_shim.c, one translation unit: included by shim_blocks.c, used by the
 * remapper thread only (under the mapping registry's lock). */

/* ---- how a fault of the PFS's pages reads while blocks still come: measured per file ----
 * MADV_RANDOM (a page per fault) suits a reader of small windows (2 KiB of tokens: one or two
 * pages, the daemon's blocks the read-ahead); it costs a reader of larger records dearly (an
 * LMDB get of 64 KiB takes 16 faults, where direct's one fault reads 128 KiB around). The
 * remapper looks (mincore, at most every MONARCH_AROUND_LOOK_NS per file) at the pages of
 * the file's blocks not staged that came into memory since its last look: under MADV_RANDOM
 * each is a page the application touched, so their runs are the lengths it reads. Once
 * MONARCH_AROUND_RUNS runs were seen, a mean of MONARCH_AROUND_RUN pages or more chooses the
 * kernel's read-around for the file's mappings, for the rest of the job (read around, every
 * run would look long); less keeps reading pages, and measuring. A file's first look is the
 * base: pages another process had read are not this reader's. */
#define MONARCH_AROUND_RUN 4
#define MONARCH_AROUND_RUNS 16
#define MONARCH_AROUND_LOOK_NS 100000000LL

static uint8_t *monarch_look_vec; /* the remapper's own (under the registry's lock) */
static size_t monarch_look_cap;

static void monarch_around_count(struct monarch_part *pt, uint64_t run)
{
    pt->look_runs++;
    pt->look_pages += run < 32 ? run : 32; /* (a run past 128 KiB says no more) */
    if (pt->look_runs < MONARCH_AROUND_RUNS)
        return;
    if (pt->look_pages >= MONARCH_AROUND_RUN * pt->look_runs)
        pt->around = 1;
    pt->look_runs = pt->look_pages = 0;
}

/* Under the registry's lock (the remapper): mapping m's file pages looked at. */
static void monarch_mapping_measure_locked(struct monarch_mapping *m)
{
    struct monarch_part *pt = &monarch_parts[m->part - 1];
    if (!m->random || pt->around)
        return;
    int64_t now = monarch_now_ns();
    if (pt->looked_ns && now - pt->looked_ns < MONARCH_AROUND_LOOK_NS)
        return;
    pt->looked_ns = now;
    uint64_t end = m->off + m->len < pt->size ? m->off + m->len : pt->size;
    if (end <= m->off)
        return;
    size_t pages = (size_t)((end - m->off + 4095) / 4096);
    int base = 0;
    if (!pt->seen) {
        pt->seen = calloc((size_t)(pt->size / 4096 / 8 + 2), 1);
        if (!pt->seen)
            return;
        base = 1;
    }
    if (pages > monarch_look_cap) {
        uint8_t *v = realloc(monarch_look_vec, pages);
        if (!v)
            return;
        monarch_look_vec = v;
        monarch_look_cap = pages;
    }
    if (mincore((void *)m->addr, pages * 4096, monarch_look_vec) != 0)
        return;
    uint64_t run = 0, first = m->off / 4096;
    for (size_t i = 0; i < pages; i++) {
        uint64_t fp = first + i;
        int resident = monarch_look_vec[i] & 1, was = (pt->seen[fp / 8] >> (fp % 8)) & 1;
        int fresh = resident && !was && !base
                    && __atomic_load_n(&pt->states[(fp * 4096) >> pt->shift], __ATOMIC_RELAXED)
                           != MONARCH_BLOCK_STAGED;
        if (resident != was)
            pt->seen[fp / 8] ^= (uint8_t)(1u << (fp % 8));
        if (fresh) {
            run++;
        } else if (run) {
            monarch_around_count(pt, run);
            run = 0;
        }
    }
    if (run)
        monarch_around_count(pt, run);
}
