/* shim_blocks.h -- what shim_blocks.c (files staged by blocks: a part (the local copy and its
 * block map) beside the application's descriptor, its reads and mappings) gives the shim's other
 * parts; the parts and the mapping registry, and the two locks that guard them. Part of
 * monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_BLOCKS_H
#define MONARCH_SHIM_BLOCKS_H

#define MONARCH_MAX_PARTS 256    /* files staged by blocks open at once in a process (more: the PFS) */
#define MONARCH_MAX_MAPPINGS 256 /* their read-only mappings being moved at once (more: stay on the PFS) */

struct monarch_part {
    int refs;                 /* descriptors and mappings holding it; 0: free */
    int copy_fd;              /* the local copy, read-only */
    unsigned slot;            /* the tier's: bytes read from the copy count there */
    unsigned shift;           /* a block is 1 << shift bytes */
    uint64_t size, blocks;
    dev_t copy_dev;           /* the copy's identity: a fill reopens it writable (monarch_part_fill) */
    ino_t copy_ino;
    struct monarch_blockmap_header *hdr; /* the map: header, then the state bytes */
    uint8_t *states;
    const int16_t *owners;    /* ... then each block's owner (a cluster's; -1: none to ask) */
    char *key;                /* its key (the daemon's name for it: PAGES requests), malloc'd */
    size_t key_len;
    size_t map_len;
    uint64_t next, run;       /* where its last read ended; the bytes read in order up to there */
    int unguarded;            /* its mappings are guarded no more: they read the PFS (shim_guard.c) */
    unsigned late;            /* guarded blocks that came late in a row (shim_guard.c) */
    uint64_t pages_read;      /* bytes of guarded pages read from the PFS while their blocks came */
    /* its mappings' reader, told apart by the runs of pages its faults bring in (one node's file,
     * while it stages: monarch_mapping_records_locked) */
    int records_known;        /* decided: records (the map's records set) or not */
    uint64_t records_next;    /* the next block to look at */
    uint64_t records_first_ns, records_looked_ns; /* its first look, its last */
    uint64_t records_runs, records_pages; /* runs of resident pages seen, and their pages */
    uint8_t *records_counted; /* a bit a page of the file: counted in records_pages (each once) */
};

/* a read-only mapping of a part's descriptor, moved onto the copy as its blocks come */
struct monarch_mapping {
    uintptr_t addr;           /* 0: a free entry */
    size_t len;
    uint64_t off;             /* the file offset mapped at addr */
    int prot, share;          /* MAP_SHARED or MAP_PRIVATE, as the application asked */
    unsigned part;            /* index + 1 */
    uint8_t *moved;           /* a bit per block of the range: mapped from the copy */
    uint64_t first, last;     /* the blocks the range covers */
    int random;               /* the shim advised MADV_RANDOM on it (until the map says read around) */
    int app_advice;           /* the application's own read-ahead advice on it, MADV_* + 1 (0: none): it stands */
    uint8_t *resident;        /* mincore's vector of its pages (made at the first look: want_touched) */
    uint64_t looked_ns;       /* when its touched pages were last looked at */
    uint64_t furthest;        /* the furthest block not staged its reader touched, at the last look */
    int in_order;             /* looks in a row that found its reader going forward in one place */
    uint8_t *guarded;         /* a bit per block: PROT_NONE until its block comes (shim_guard.c) */
    uint64_t fault_next;      /* the block after the last guarded one faulted on (0: none yet) */
    uintptr_t fault_page;     /* ... and the page of that fault */
    unsigned fault_run;       /* guarded faults in a row going in order (monarch_guard_want_locked) */
    uint8_t *copied;          /* a bit per block: a LENT block copied into this process's pages (a window's) */
    int pfs_fd;               /* a window's: the application's file, to guard a copied block again (-1: none) */
};

static struct monarch_part monarch_parts[MONARCH_MAX_PARTS];
static struct monarch_mapping monarch_mappings[MONARCH_MAX_MAPPINGS];

/* the registry of mappings being moved (shim_blocks.c): how many, read without the lock on every
 * munmap (0: nothing to check); changed under the registry's lock (below) */
static int monarch_nmappings;

/* ---- the shim's two locks: the mapping registry's (maps), then the parts' (parts) ----
 * Each is a plain mutex and the holding thread's depth:
 *   - the thread that holds one takes it again without waiting: an allocator preloaded before
 *     libc's (jemalloc, tcmalloc) may munmap from the free() the registry calls under it, and
 *     that munmap comes back here;
 *   - not glibc's recursive mutex, which remembers its owner's thread id: a fork child's thread
 *     has another, its unlock in the child handler fails (EPERM), and the child's own fork
 *     then waits for the lock forever (bash's `x=$(cmd | head -1)`);
 *   - the application's threads hold one with every signal blocked, so a handler that closes
 *     or unmaps (both async-signal-safe) never finds its own thread halfway through a change.
 * fork takes both in its prepare handler (no other thread is then inside) and releases both in
 * the parent's and in the child's handler: a child, and its children, find them free. */
static pthread_mutex_t monarch_maps_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t monarch_parts_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread unsigned monarch_maps_depth __attribute__((tls_model("initial-exec")));
static __thread unsigned monarch_parts_depth __attribute__((tls_model("initial-exec")));

static void monarch_lock_take(pthread_mutex_t *mu, unsigned *depth, sigset_t *old);
static void monarch_lock_give(pthread_mutex_t *mu, unsigned *depth, const sigset_t *old);
/* `old` names a sigset_t the caller keeps for the mask to restore */
#define MONARCH_MAPS_LOCK(old) monarch_lock_take(&monarch_maps_mu, &monarch_maps_depth, &(old))
#define MONARCH_MAPS_UNLOCK(old) monarch_lock_give(&monarch_maps_mu, &monarch_maps_depth, &(old))
#define MONARCH_PARTS_LOCK(old) monarch_lock_take(&monarch_parts_mu, &monarch_parts_depth, &(old))
#define MONARCH_PARTS_UNLOCK(old) monarch_lock_give(&monarch_parts_mu, &monarch_parts_depth, &(old))
/* the part an OPEN answer named (ANSWER_BLOCKS), for monarch_after to give the descriptor */
static __thread unsigned monarch_part_pending __attribute__((tls_model("initial-exec")));

/* ---- what the other parts call ---- */
static inline unsigned monarch_part_of(int fd);
static inline void monarch_extra_add(unsigned which, uint64_t n);
static unsigned monarch_part_load(unsigned slot, const char *key, size_t kl, uint32_t n);
static void monarch_part_attach(int fd);
static void monarch_part_drop(int fd);
static void monarch_part_copy_closing(unsigned first, unsigned last);
static void monarch_part_dup(int oldfd, int newfd);
static int monarch_part_staged(struct monarch_part *pt, uint64_t off, uint64_t n);
static int monarch_part_pread(int fd, void *buf, size_t n, off_t o, ssize_t *out);
static int monarch_part_read(int fd, void *buf, size_t n, ssize_t *out);
static int monarch_part_readv(int fd, const struct iovec *v, int c, off_t o, ssize_t *out);
static inline void monarch_part_read_pfs(struct monarch_part *pt);
static inline void monarch_part_reads_pfs(int fd);
static inline void monarch_part_pfs_bytes(int fd, ssize_t n);
static void monarch_part_mapped(int fd, void *p, size_t len, int prot, int flags, uint64_t off);
static void monarch_mappings_forget_locked(uintptr_t addr, size_t len);
static void monarch_blocks_prefork(void);
static void monarch_blocks_postfork_parent(void);
static void monarch_blocks_postfork_child(void);
static inline void monarch_blocks_resume(void);

#endif /* MONARCH_SHIM_BLOCKS_H */
