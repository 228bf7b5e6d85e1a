/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_rawthreads.h).
 * Here: which threads' raw system calls are watched at a given moment, and what watching cost.
 * A watched thread's dispatch is on from its first instruction (shim_rawsys.c); at each call made
 * outside libc the kernel reads the thread's selector, a byte: BLOCK (the call raises SIGSYS and the
 * shim answers it) or ALLOW (the kernel makes it at once, at its own cost). The selectors live in one
 * table, so that a thread can set every other's:
 *   - a thread is paused (ALLOW) when a raw call made by a compute runtime's own code traps (libgomp
 *     makes an OpenMP team's futex waits and wakes with an inline `syscall`; libiomp5, OpenBLAS,
 *     MKL, TBB alike): those would cost a signal each, thousands a second in a training loop's
 *     threads, and never name a file;
 *   - every thread is watched again (BLOCK) at each write-back call the daemon answers, from any
 *     thread of the process, and a thread at its own next call through a write-back hook; a raw call
 *     on a write-back file made after the file's last call through libc is answered as libc's, from
 *     any thread that has not waited in a compute runtime since (docs/consistency.md, W10);
 *   - a raw clone pauses its thread the same way (shim_rawsys.c).
 * A thread beyond the table's MONARCH_RAW_SLOTS keeps its selector in its own TLS: it is watched
 * again only by its own hooks. A slot is given back at the thread's exit (its key's destructor).
 * What it cost goes to the counters (EXTRA_RAW_*): raw calls answered, by system call, the ns their
 * handler took, and the pauses.
 */
#include "shim_rawthreads.h"

#if defined(__x86_64__)
#include <link.h>

#define MONARCH_RAW_SLOTS 1024
#define MONARCH_RAW_OBJECTS 32 /* text ranges of the objects raw calls came from, each a runtime or not */

static char monarch_raw_slots[MONARCH_RAW_SLOTS]; /* the threads' selectors, read by the kernel */
static char monarch_raw_taken[MONARCH_RAW_SLOTS];
static unsigned monarch_raw_top; /* slots ever taken: watching every thread again looks no further */
static __thread char *monarch_raw_sel __attribute__((tls_model("initial-exec"))); /* this thread's selector */
static __thread char monarch_raw_own __attribute__((tls_model("initial-exec")));  /* ... when no slot was free */
static pthread_key_t monarch_raw_key;
static int monarch_raw_keyed;

/* The compute runtimes whose own raw calls pause a thread (their file names' beginnings). */
static const char *const monarch_compute_runtimes[] = {"libgomp", "libiomp5", "libomp.", "libomp-", "libopenblas",
                                                       "libmkl_", "libtbb", "libblis", "libnvomp", NULL};
static struct {
    uintptr_t lo, hi;
    int runtime;
} monarch_raw_objects[MONARCH_RAW_OBJECTS];
static unsigned monarch_raw_nobjects;
static int monarch_raw_objects_mu;

/* This thread's selector: a slot of the table, taken at the thread's first watch. */
static char *monarch_raw_selector(void)
{
    if (monarch_raw_sel)
        return monarch_raw_sel;
    for (unsigned i = 0; i < MONARCH_RAW_SLOTS; i++) {
        if (__atomic_load_n(&monarch_raw_taken[i], __ATOMIC_RELAXED)
            || __atomic_exchange_n(&monarch_raw_taken[i], 1, __ATOMIC_ACQ_REL))
            continue;
        unsigned top = __atomic_load_n(&monarch_raw_top, __ATOMIC_RELAXED);
        while (top < i + 1
               && !__atomic_compare_exchange_n(&monarch_raw_top, &top, i + 1, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
            ;
        monarch_raw_sel = &monarch_raw_slots[i];
        if (monarch_raw_keyed)
            pthread_setspecific(monarch_raw_key, monarch_raw_sel);
        return monarch_raw_sel;
    }
    return monarch_raw_sel = &monarch_raw_own;
}

static inline char *monarch_raw_selector_if_any(void)
{
    return monarch_raw_sel;
}

/* A thread's exit: its selector moved into its own TLS (the kernel told), its slot given back. */
static void monarch_raw_slot_free(void *p)
{
    char *slot = p;
    monarch_raw_own = __atomic_load_n(slot, __ATOMIC_RELAXED);
    monarch_raw_sel = &monarch_raw_own;
    if (__atomic_load_n(&monarch_raw_on, __ATOMIC_ACQUIRE)) /* (off: this thread's dispatch never was on) */
        (void)monarch_raw_setup_pointer(&monarch_raw_own);
    __atomic_store_n(&monarch_raw_taken[slot - monarch_raw_slots], 0, __ATOMIC_RELEASE);
}

static void monarch_raw_threads_setup(void)
{
    monarch_raw_keyed = pthread_key_create(&monarch_raw_key, monarch_raw_slot_free) == 0;
}

/* A fork's child has one thread: the others' slots are free again (only the bytes that change written). */
static void monarch_raw_threads_atfork_child(void)
{
    unsigned top = monarch_raw_top;
    for (unsigned i = 0; i < top; i++)
        if (monarch_raw_taken[i] && &monarch_raw_slots[i] != monarch_raw_sel)
            monarch_raw_taken[i] = 0;
}

static inline void monarch_raw_pause(void)
{
    __atomic_store_n(monarch_raw_selector(), MONARCH_SUD_ALLOW, __ATOMIC_RELAXED);
}

static void monarch_raw_watch_all(void)
{
    if (!__atomic_load_n(&monarch_raw_on, __ATOMIC_ACQUIRE))
        return;
    unsigned top = __atomic_load_n(&monarch_raw_top, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < top; i++)
        if (__atomic_load_n(&monarch_raw_taken[i], __ATOMIC_RELAXED)
            && __atomic_load_n(&monarch_raw_slots[i], __ATOMIC_RELAXED) == MONARCH_SUD_ALLOW)
            __atomic_store_n(&monarch_raw_slots[i], MONARCH_SUD_BLOCK, __ATOMIC_RELAXED);
    if (monarch_raw_sel == &monarch_raw_own)
        monarch_raw_own = MONARCH_SUD_BLOCK;
}

/* Which object's text holds `at`, and is it a compute runtime's? */
struct monarch_raw_find {
    uintptr_t at, lo, hi;
    int found, runtime;
};

static int monarch_raw_find_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct monarch_raw_find *f = data;
    for (int k = 0; k < info->dlpi_phnum; k++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[k];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || f->at < lo || f->at >= hi)
            continue;
        const char *name = strrchr(info->dlpi_name, '/');
        name = name ? name + 1 : info->dlpi_name;
        for (const char *const *r = monarch_compute_runtimes; *r; r++)
            f->runtime |= !strncmp(name, *r, strlen(*r));
        f->lo = lo, f->hi = hi, f->found = 1;
        return 1;
    }
    return 0;
}

/* Did a raw call at `at` come from a compute runtime's own code? Each object looked up once (the
 * loader's list walked), then found in a small table. */
static int monarch_raw_in_runtime(uintptr_t at)
{
    unsigned n = __atomic_load_n(&monarch_raw_nobjects, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < n; i++)
        if (at >= monarch_raw_objects[i].lo && at < monarch_raw_objects[i].hi)
            return monarch_raw_objects[i].runtime;
    struct monarch_raw_find f = {.at = at};
    dl_iterate_phdr(monarch_raw_find_object, &f);
    if (!f.found)
        return 0;
    while (__atomic_exchange_n(&monarch_raw_objects_mu, 1, __ATOMIC_ACQUIRE))
        sched_yield();
    n = monarch_raw_nobjects;
    if (n < MONARCH_RAW_OBJECTS) {
        monarch_raw_objects[n].lo = f.lo, monarch_raw_objects[n].hi = f.hi;
        monarch_raw_objects[n].runtime = f.runtime;
        __atomic_store_n(&monarch_raw_nobjects, n + 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&monarch_raw_objects_mu, 0, __ATOMIC_RELEASE);
    return f.runtime;
}

/* One raw call answered: counted with its handler's ns (and the pause it made) for the report. */
static void monarch_raw_count(long nr, uint64_t ns, int paused)
{
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (!c)
        return;
    uint64_t *x = c + MONARCH_HEADER_WORDS + MONARCH_SLOT_WORDS * MONARCH_MAX_SLOTS;
    __atomic_fetch_add(&x[MONARCH_EXTRA_RAW_CALLS], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&x[MONARCH_EXTRA_RAW_NS], ns, __ATOMIC_RELAXED);
    if (paused)
        __atomic_fetch_add(&x[MONARCH_EXTRA_RAW_PAUSES], 1, __ATOMIC_RELAXED);
    uint64_t key = (uint64_t)nr + 1;
    for (unsigned i = 0; i < MONARCH_RAW_NRS; i++) {
        uint64_t *pair = &x[MONARCH_EXTRA_RAW_BY_CALL + 2 * i], seen = __atomic_load_n(pair, __ATOMIC_RELAXED);
        if (seen == 0 && __atomic_compare_exchange_n(pair, &seen, key, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            seen = key;
        if (seen == key) {
            __atomic_fetch_add(&pair[1], 1, __ATOMIC_RELAXED);
            return;
        }
    }
}
#else /* no syscall user dispatch on this architecture: no thread is watched */
static void monarch_raw_watch_all(void) {}
#endif
