/*
 * monarch_native.h -- what Monarch's C libraries share, defined once: the export marker,
 * the clock, writing a buffer whole, CRC-32 (protocol.key_hash: zlib's) and the snapshot index's look-up
 * (protocol.index_lookup). Each library is one translation unit that includes this
 * header (the shim's monarch_shim.c, the front door's front_door.c, the walker, the
 * remover, the peer data path); everything here is static, so each keeps its own copy
 * and exports nothing it did not mark EXPORT.
 *
 * The builder (monarch/native/build.py) counts this header in every library's source
 * digest: a change here rebuilds them all.
 */
#ifndef MONARCH_NATIVE_H
#define MONARCH_NATIVE_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../wire/monarch_wire.h" /* the index layout */

/* Linux's lease calls (the memfd pools of the shim and the front door), which an older or
 * another libc's <fcntl.h> may not name */
#ifndef F_SETLEASE
#define F_SETLEASE 1024
#endif
#ifndef F_SETSIG
#define F_SETSIG 10
#endif

/* -- exports ------------------------------------------------------------------------------ */
/* Built with -fvisibility=hidden: only what is marked here is seen by ctypes or the app. */
#define EXPORT __attribute__((visibility("default")))

/* -- writing ------------------------------------------------------------------------------ */
/* ``n`` bytes of ``p`` written whole to ``fd``: ``at_zero``, at offset 0, its offset left alone (a
 * fresh file or one written over), else from its offset. 0, or -1. */
static inline int monarch_write_all(int fd, const char *p, uint64_t n, int at_zero)
{
    uint64_t put = 0;
    while (put < n) {
        ssize_t w = at_zero ? pwrite(fd, p + put, n - put, (off_t)put) : write(fd, p + put, n - put);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        put += (uint64_t)w;
    }
    return 0;
}

/* -- the clock ---------------------------------------------------------------------------- */
static inline int64_t monarch_now_ns(void)  /* CLOCK_MONOTONIC, in ns */
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* -- CRC-32 (zlib's, reflected 0xEDB88320): protocol.key_hash ----------------------------- */
static uint32_t monarch_crc_table[256] __attribute__((unused));
static pthread_once_t monarch_crc_once __attribute__((unused)) = PTHREAD_ONCE_INIT;

static inline void monarch_crc_fill(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        monarch_crc_table[i] = c;
    }
}

/* The table filled, once per process: call before the first monarch_crc32. */
static inline void monarch_crc_init(void)
{
    pthread_once(&monarch_crc_once, monarch_crc_fill);
}

/* The running CRC ``c`` (0xFFFFFFFF to start) over ``n`` more bytes; not inverted at the end. */
static inline uint32_t monarch_crc32_update(uint32_t c, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        c = monarch_crc_table[(c ^ (unsigned char)p[i]) & 0xFF] ^ (c >> 8);
    return c;
}

/* zlib's crc32(p[0:n]) */
static inline uint32_t monarch_crc32(const char *p, size_t n)
{
    return monarch_crc32_update(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
}

/* -- the snapshot index: protocol.index_lookup -------------------------------------------- */
/* The entry number (from 1) of ``key`` (``hash``: its monarch_crc32) in the index mapped at
 * ``x`` whose header is ``h``, or 0. Bounded by the table's size; an entry outside the mapping
 * or with a key outside the key area ends the search (index_valid checked the tables' bounds). */
static inline uint32_t monarch_index_find(const unsigned char *x, const struct monarch_index_header *h,
                                          const char *key, size_t len, uint32_t hash)
{
    uint32_t mask = h->buckets - 1;
    for (uint32_t b = hash & mask, probes = 0; probes < h->buckets; b = (b + 1) & mask, probes++) {
        uint32_t n;
        memcpy(&n, x + h->buckets_off + 4ull * b, sizeof n);
        if (!n || n > h->entries)
            return 0;
        struct monarch_index_entry e;
        memcpy(&e, x + h->entries_off + (uint64_t)sizeof e * (n - 1), sizeof e);
        if (e.hash == hash && e.key_len == len && e.key_off <= h->keys_size && len <= h->keys_size - e.key_off &&
            !memcmp(x + h->keys_off + e.key_off, key, len))
            return n;
    }
    return 0;
}

/* -- a file a listing-mode walk left undescribed (INDEX_FLAG_UNDESCRIBED), described in place ---- */
#define MONARCH_ROUTE_STEPS 8 /* route steps per root at most (index_writer.py's ROUTE_STEPS) */

struct monarch_route_steps {  /* each root's routes by size (index_writer.route_tables) */
    const uint64_t *smallest;  /* root k's steps at k * MONARCH_ROUTE_STEPS: the least size of each */
    const uint8_t *route;      /* and its route */
    const int *nsteps;
    int nroots;
};

/* The flags bits of the route of a file of ``key`` (index_writer.py's route_flags): 0 for none. */
static inline uint32_t monarch_route_bits(const struct monarch_route_steps *t, const char *key, uint32_t key_len,
                                          uint64_t size, uint32_t mode)
{
    uint32_t i = 0, bits = 0;
    long k = 0;
    while (i < key_len && i < 10 && key[i] >= '0' && key[i] <= '9')
        k = 10 * k + (key[i++] - '0');
    if (i && i < key_len && key[i] == '/' && k < t->nroots && S_ISREG(mode))
        for (int s = 0; s < t->nsteps[k] && s < MONARCH_ROUTE_STEPS; s++)
            if (size >= t->smallest[k * MONARCH_ROUTE_STEPS + s])
                bits = ((uint32_t)t->route[k * MONARCH_ROUTE_STEPS + s] + 1u) << MONARCH_INDEX_ROUTE_SHIFT;
    return bits;
}

/* Is entry ``at`` (a file's) still undescribed? (acquire: a clear flag means whole fields) */
static inline int monarch_index_undescribed(const unsigned char *at)
{
    return (__atomic_load_n((const uint32_t *)(at + offsetof(struct monarch_index_entry, flags)), __ATOMIC_ACQUIRE)
            & MONARCH_INDEX_FLAG_UNDESCRIBED) != 0;
}

/* Entry ``at`` (key ``key``, a file still undescribed) described from ``st``: its stat's fields,
 * then its flags (UNDESCRIBED cleared, its route from ``steps``) with a release store, so that a
 * reader that loads the flags first (monarch_index_undescribed) reads whole fields. Every writer
 * (the daemon's walk pass and its Python, the front door) writes the same file's stat. */
static inline void monarch_index_describe(unsigned char *at, const char *key, uint32_t key_len, const struct stat *st,
                                          const struct monarch_route_steps *steps)
{
    struct monarch_index_entry e;
    memcpy(&e, at, sizeof e);
    e.size = (uint64_t)st->st_size;
    e.mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    e.atime_ns = (int64_t)st->st_atim.tv_sec * 1000000000 + st->st_atim.tv_nsec;
    e.ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
    e.ino = st->st_ino;
    e.dev = st->st_dev;
    e.mode = st->st_mode;
    e.uid = st->st_uid;
    e.gid = st->st_gid;
    e.nlink = (uint32_t)st->st_nlink;
    e.blocks = (uint64_t)st->st_blocks;
    e.blksize = (uint32_t)st->st_blksize;
    /* the stat's fields only (size .. nlink, blocks, blksize): the key's and the flags' stay */
    memcpy(at + offsetof(struct monarch_index_entry, size), &e.size,
           offsetof(struct monarch_index_entry, flags) - offsetof(struct monarch_index_entry, size));
    memcpy(at + offsetof(struct monarch_index_entry, blocks), &e.blocks, sizeof e.blocks + sizeof e.blksize);
    uint32_t flags = (e.flags & ~(uint32_t)(MONARCH_INDEX_FLAG_UNDESCRIBED | MONARCH_INDEX_ROUTE_MASK))
                     | monarch_route_bits(steps, key, key_len, e.size, e.mode);
    __atomic_store_n((uint32_t *)(at + offsetof(struct monarch_index_entry, flags)), flags, __ATOMIC_RELEASE);
}

#endif /* MONARCH_NATIVE_H */
