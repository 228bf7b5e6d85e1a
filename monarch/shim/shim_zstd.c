/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_zstd.h). Here:
 * a compressed copy decoded in the application's own process.
 *
 * A tier with compression keeps a file's zstd frame at <tier>/.z/<key> (docs/compression.md).
 * When the probe of <tier>/<key> misses in every tier, the shim looks for <tier>/.z/<key>
 * and, if the system's libzstd (libzstd.so.1, loaded with dlopen when the first frame is found:
 * no zstd.h, no link-time dependency, nothing paid by a process that never meets a frame) is
 * there, decodes the frame itself into a memfd:
 *   open the frame (O_NOFOLLOW), map it, check it (content size = the snapshot index's
 *   size; a dictionary frame: the tier's dictionary, below), decompress straight into a
 *   memfd of this process's pool that nobody holds any more (shim_zpool.c: its pages are
 *   already there) with this thread's DCtx, check the decoded size, hand the application a
 *   read-only open of it. When the pool cannot take it: a fresh memfd, memfd_create +
 *   ftruncate + mmap MAP_SHARED|MAP_POPULATE, decoded into, unmapped and sealed
 *   (F_SEAL_SEAL | SHRINK | GROW | WRITE, as the daemon's memfds).
 * No daemon round trip, no copy through a buffer, no heap allocation but one DCtx per
 * thread (made at the thread's first compressed open, freed when the thread ends).
 * Any failure (no frame, no library, a dictionary that is not there, a corrupt or short frame, a
 * size the index does not vouch for, no memfd) returns -1 and the caller asks the daemon,
 * as it did before: fail open. The opens served here are counted under the tier's slot
 * like the daemon's memfds, and in the EXTRA_ZSTD_* counters (opens, ns, bytes, fallbacks,
 * reused memfds).
 *
 * MONARCH_SHIM_ZSTD: unset, the library libzstd.so.1; "0" (or "off"): never decode here
 * (every compressed open asks the daemon); anything else: the library to dlopen instead.
 */
#include "shim_zstd.h"

/* ---- the few libzstd entry points (zstd.h's stable API, declared here) ---- */
#define MONARCH_ZSTD_LIBRARY "libzstd.so.1"
#define MONARCH_ZSTD_CONTENTSIZE_UNKNOWN (0ULL - 1)
#define MONARCH_ZSTD_CONTENTSIZE_ERROR (0ULL - 2)
#define MONARCH_ZSTD_MIN_VERSION 10300 /* ZSTD_getFrameContentSize: v1.3.0 */

/* libzstd's state in this process: loaded at the first frame found, by one thread */
enum { MONARCH_ZSTD_OFF, MONARCH_ZSTD_WANTED, MONARCH_ZSTD_LOADING, MONARCH_ZSTD_ON };
static int monarch_zstd_state; /* OFF until start-up says the library is wanted */
static char monarch_zstd_name[256];
static pthread_key_t monarch_zstd_key;

static void monarch_zstd_free(void *dctx)
{
    monarch_zstd.free((monarch_zstd_dctx *)dctx);
}

#define MONARCH_ZSTD_SYM(field, name)                                                  \
    (*(void **)&monarch_zstd.field = dlsym(lib, name)) != NULL

/* Start-up (monarch_init, under pthread_once): whether, and which, libzstd is wanted. */
static void monarch_zstd_init(void)
{
    const char *want = getenv(MONARCH_ENV_SHIM_ZSTD);
    if (want && (strcmp(want, "0") == 0 || strcmp(want, "off") == 0)) {
        MONARCH_DEBUG(1, "%s=%s: compressed copies are decoded by the daemon", MONARCH_ENV_SHIM_ZSTD, want);
        return;
    }
    const char *name = want && want[0] ? want : MONARCH_ZSTD_LIBRARY;
    if (strlen(name) >= sizeof monarch_zstd_name) {
        MONARCH_DEBUG(1, "%s: name too long; compressed copies are decoded by the daemon", MONARCH_ENV_SHIM_ZSTD);
        return;
    }
    strcpy(monarch_zstd_name, name);
    monarch_zstd_state = MONARCH_ZSTD_WANTED;
}

/* The library loaded: 1 when loaded (ON), 0 when it cannot be. */
static int monarch_zstd_load(void)
{
    const char *name = monarch_zstd_name;
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        MONARCH_DEBUG(1, "%s: not loaded (%s); compressed copies are decoded by the daemon", name, dlerror());
        return 0;
    }
    if (!(MONARCH_ZSTD_SYM(version, "ZSTD_versionNumber") && MONARCH_ZSTD_SYM(create, "ZSTD_createDCtx")
          && MONARCH_ZSTD_SYM(free, "ZSTD_freeDCtx") && MONARCH_ZSTD_SYM(decompress, "ZSTD_decompressDCtx")
          && MONARCH_ZSTD_SYM(content_size, "ZSTD_getFrameContentSize")
          && MONARCH_ZSTD_SYM(is_error, "ZSTD_isError") && MONARCH_ZSTD_SYM(dict_id, "ZSTD_getDictID_fromFrame")
          && MONARCH_ZSTD_SYM(create_ddict, "ZSTD_createDDict") && MONARCH_ZSTD_SYM(free_ddict, "ZSTD_freeDDict")
          && MONARCH_ZSTD_SYM(decompress_ddict, "ZSTD_decompress_usingDDict"))
        || monarch_zstd.version() < MONARCH_ZSTD_MIN_VERSION
        || pthread_key_create(&monarch_zstd_key, monarch_zstd_free) != 0) {
        MONARCH_DEBUG(1, "%s: too old or incomplete; compressed copies are decoded by the daemon", name);
        dlclose(lib);
        return 0;
    }
    MONARCH_DEBUG(1, "%s %u: compressed copies are decoded in this process", name, monarch_zstd.version());
    return 1;
}

/* Is libzstd there to decode a frame just found? The first thread to ask loads it (a few
 * tens of microseconds); another asking meanwhile waits for it. */
static int monarch_zstd_ready(void)
{
    for (;;) {
        int s = __atomic_load_n(&monarch_zstd_state, __ATOMIC_ACQUIRE);
        if (s == MONARCH_ZSTD_ON || s == MONARCH_ZSTD_OFF)
            return s == MONARCH_ZSTD_ON;
        if (s == MONARCH_ZSTD_LOADING) {
            sched_yield();
            continue;
        }
        if (__atomic_compare_exchange_n(&monarch_zstd_state, &s, MONARCH_ZSTD_LOADING, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
            __atomic_store_n(&monarch_zstd_state, monarch_zstd_load() ? MONARCH_ZSTD_ON : MONARCH_ZSTD_OFF,
                             __ATOMIC_RELEASE);
        }
    }
}

/* A fork child: a parent's thread was loading the library; the child's half-made load is left
 * alone and the daemon decodes its frames. */
static void monarch_zstd_atfork_child(void)
{
    if (monarch_zstd_state == MONARCH_ZSTD_LOADING)
        monarch_zstd_state = MONARCH_ZSTD_OFF;
}

/* This thread's decompression context, made at its first use (the one allocation). */
static monarch_zstd_dctx *monarch_zstd_dctx_here(void)
{
    monarch_zstd_dctx *d = pthread_getspecific(monarch_zstd_key);
    if (MONARCH_UNLIKELY(!d)) {
        d = monarch_zstd.create();
        if (d && pthread_setspecific(monarch_zstd_key, d) != 0) {
            monarch_zstd.free(d);
            d = NULL;
        }
    }
    return d;
}

/*
 * Dictionaries: a tier whose small files compress better with one keeps it at
 * <probe dir>/.z/.dict/<id> (monarch/node/tiers/codecs.py; no key starts with '.'), written before any
 * frame that uses it. A process loads each at its first frame that names it (ZSTD_createDDict,
 * the one allocation) into a table published without a lock (claim a free entry, fill it,
 * mark it ready); a DDict is read-only, shared by every thread. A full table, or a missing
 * or unloadable dictionary: the frame is the daemon's to decode.
 */
#define MONARCH_ZSTD_DICTS 8
static struct {
    int state; /* 0 free, 1 being filled, 2 ready (release) */
    unsigned probe;
    uint32_t id;
    void *ddict;
} monarch_zstd_dicts[MONARCH_ZSTD_DICTS];

static void *monarch_zstd_ddict(unsigned probe, uint32_t id)
{
    for (unsigned i = 0; i < MONARCH_ZSTD_DICTS; i++)
        if (__atomic_load_n(&monarch_zstd_dicts[i].state, __ATOMIC_ACQUIRE) == 2 && monarch_zstd_dicts[i].id == id
            && monarch_zstd_dicts[i].probe == probe)
            return monarch_zstd_dicts[i].ddict;
    char name[32], path[PATH_MAX];
    int n = snprintf(name, sizeof name, ".z/.dict/%u", (unsigned)id);
    if (n <= 0 || monarch_probe_path(&monarch_probes[probe], name, (size_t)n, path) != 0)
        return NULL;
    int fd = MONARCH_RESOLVE(openat)(AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    void *m = MAP_FAILED, *ddict = NULL;
    if (fd >= 0 && monarch_sys_fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0
        && st.st_size <= (1 << 24))
        m = MONARCH_RESOLVE(mmap)(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (fd >= 0)
        real_close(fd);
    if (m == MAP_FAILED) {
        MONARCH_DEBUG(1, "dictionary %s: not there; asking the daemon", path);
        return NULL;
    }
    ddict = monarch_zstd.create_ddict(m, (size_t)st.st_size); /* copies the dictionary */
    munmap(m, (size_t)st.st_size);
    for (unsigned i = 0; ddict && i < MONARCH_ZSTD_DICTS; i++) {
        int free_ = 0;
        if (__atomic_compare_exchange_n(&monarch_zstd_dicts[i].state, &free_, 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            monarch_zstd_dicts[i].probe = probe;
            monarch_zstd_dicts[i].id = id;
            monarch_zstd_dicts[i].ddict = ddict;
            __atomic_store_n(&monarch_zstd_dicts[i].state, 2, __ATOMIC_RELEASE);
            MONARCH_DEBUG(1, "dictionary %s: loaded", path);
            return ddict;
        }
    }
    if (ddict)
        monarch_zstd.free_ddict(ddict); /* the table is full: the daemon decodes these frames */
    return NULL;
}

/* The frame mapped at src (fsize bytes) decoded into a new sealed memfd of size bytes:
 * its descriptor, or -1. The memfd is close-on-exec (the caller clears it if wanted). */
static int monarch_zstd_memfd(const void *src, size_t fsize, uint64_t size, const void *ddict, const char *name)
{
#ifdef SYS_memfd_create
    int mfd = (int)syscall(SYS_memfd_create, name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mfd < 0)
        return -1;
    monarch_zstd_dctx *dctx = monarch_zstd_dctx_here();
    void *dst = MAP_FAILED;
    if (dctx && syscall(SYS_ftruncate, mfd, (off_t)size) == 0)
        dst = MONARCH_RESOLVE(mmap)(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd, 0);
    size_t r = 1;
    if (dst != MAP_FAILED) {
        r = ddict ? monarch_zstd.decompress_ddict(dctx, dst, (size_t)size, src, fsize, ddict)
                  : monarch_zstd.decompress(dctx, dst, (size_t)size, src, fsize);
        munmap(dst, (size_t)size); /* before F_SEAL_WRITE, which a writable mapping would refuse */
    }
    if (dst == MAP_FAILED || monarch_zstd.is_error(r) || r != size
        || syscall(SYS_fcntl, mfd, F_ADD_SEALS, MONARCH_MEMFD_SEALS) != 0) {
        MONARCH_DEBUG(1, "decode %s: %s", name,
                      dst == MAP_FAILED ? "no memfd mapping" : monarch_zstd.is_error(r) ? "corrupt frame"
                      : r != size ? "short frame" : "seals refused");
        real_close(mfd);
        return -1;
    }
    return mfd;
#else
    (void)src, (void)fsize, (void)size, (void)ddict, (void)name;
    return -1;
#endif
}

static int monarch_zpool_decode(const void *src, size_t fsize, uint64_t size, const void *ddict, int flags,
                                int *frame_bad, int *reused); /* shim_zpool.c */

/*
 * <pr dir>/.z/<key>, decoded here into a memfd (see the top of this file): its
 * descriptor, or -1: no frame (*found 0), or one this process cannot decode (*found 1,
 * counted as a fallback: the caller asks the daemon). close-on-exec as flags say.
 */
static int monarch_zstd_open(unsigned probe, const char *key, size_t kl, int flags, int *found)
{
    char zkey[MONARCH_KEY_MAX + 3], path[PATH_MAX];
    *found = 0;
    if (__atomic_load_n(&monarch_zstd_state, __ATOMIC_RELAXED) == MONARCH_ZSTD_OFF || kl + 3 >= sizeof zkey)
        return -1;
    memcpy(zkey, ".z/", 3);
    memcpy(zkey + 3, key, kl + 1);
    if (monarch_probe_path(&monarch_probes[probe], zkey, kl + 3, path) != 0)
        return -1;
    uint64_t t0 = monarch_now_ns();
    int zfd = MONARCH_RESOLVE(openat)(AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (zfd < 0)
        return -1; /* no compressed copy here: the common miss */
    if (!monarch_zstd_ready()) {
        real_close(zfd); /* no library: the daemon decodes it, as with no frame here */
        return -1;
    }
    *found = 1;
    struct monarch_index_entry e;
    struct stat st;
    uint32_t n = monarch_index_lookup(key, kl);
    uint64_t size = n && monarch_index_entry(n, &e) == 0 ? e.size : 0;
    int mfd = -1, reused = 0;
    const void *src = MAP_FAILED;
    if (size > 0 && size <= SIZE_MAX / 2
        && monarch_sys_fstat(zfd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0
        && (uint64_t)st.st_size <= SIZE_MAX / 2)
        src = MONARCH_RESOLVE(mmap)(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, zfd, 0);
    real_close(zfd);
    if (src == MAP_FAILED) {
        MONARCH_DEBUG(1, "decode %s: not a frame of a file the index knows; asking the daemon", path);
        goto out;
    }
    size_t fsize = (size_t)st.st_size;
    /* the content size must be the snapshot's; a dictionary frame needs the tier's dictionary */
    unsigned long long cs = monarch_zstd.content_size(src, fsize);
    unsigned id = cs == size ? monarch_zstd.dict_id(src, fsize) : 0;
    const void *ddict = id ? monarch_zstd_ddict(probe, id) : NULL;
    if (cs != size || (id && !ddict))
        MONARCH_DEBUG(1, "decode %s: %s; asking the daemon", path,
                      cs != size ? "its content size is not the snapshot's" : "no dictionary for it");
    else { /* the memfd's name (/proc/self/fd shows it): the file's, as the daemon's memfds */
        char name[64];
        const char *slash = strrchr(key, '/'), *base = slash ? slash + 1 : key;
        size_t bl = strlen(base) < sizeof name - 1 ? strlen(base) : sizeof name - 1;
        memcpy(name, base, bl);
        name[bl] = '\0';
        int frame_bad;
        mfd = monarch_zpool_decode(src, fsize, size, ddict, flags, &frame_bad, &reused);
        reused = reused && mfd >= 0;
        if (mfd < 0 && !frame_bad) {
            mfd = monarch_zstd_memfd(src, fsize, size, ddict, name);
            if (mfd >= 0 && !(flags & O_CLOEXEC) && syscall(SYS_fcntl, mfd, F_SETFD, 0) != 0) {
                real_close(mfd);
                mfd = -1;
            }
        }
    }
    munmap((void *)src, fsize);
out:;
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && mfd >= 0) {
        __atomic_fetch_add(monarch_extra(c, MONARCH_EXTRA_ZSTD_OPENS), 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(monarch_extra(c, MONARCH_EXTRA_ZSTD_NS), monarch_now_ns() - t0, __ATOMIC_RELAXED);
        __atomic_fetch_add(monarch_extra(c, MONARCH_EXTRA_ZSTD_BYTES), size, __ATOMIC_RELAXED);
        if (reused)
            __atomic_fetch_add(monarch_extra(c, MONARCH_EXTRA_ZSTD_REUSED), 1, __ATOMIC_RELAXED);
    } else if (c)
        __atomic_fetch_add(monarch_extra(c, MONARCH_EXTRA_ZSTD_FALLBACKS), 1, __ATOMIC_RELAXED);
    return mfd;
}
