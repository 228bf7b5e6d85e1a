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
#include <limits.h>
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
#define MONARCH_INDEX_KEY_MAX (PATH_MAX + 16) /* a key built whole: "<k>/" and a path below PATH_MAX */

/* Where the shorts (SHORT_ROOM words a file) and the shapes (an INDEX_ENTRY a directory) lie: just
 * before the stats, in that order backwards (monarch_index_bounded checks they fit there). */
static inline uint64_t monarch_index_shorts_off(const struct monarch_index_header *h)
{
    return h->stats_off - 8ull * MONARCH_INDEX_SHORT_ROOM * h->files;
}

static inline uint64_t monarch_index_shapes_off(const struct monarch_index_header *h)
{
    return monarch_index_shorts_off(h) - (uint64_t)MONARCH_INDEX_ENTRY_SIZE * h->dirs;
}

/* Where the directories' affixes lie: after the ranges, at a multiple of 8. */
static inline uint64_t monarch_index_affixes_off(const struct monarch_index_header *h)
{
    return (h->ranges_off + 4ull * (h->dirs + 1) + 7) & ~7ull;
}

/* Do ``count`` items of ``size`` bytes at offset ``off`` lie inside ``len`` bytes? */
static inline int monarch_index_table_in(uint64_t off, uint64_t count, uint64_t size, uint64_t len)
{
    return off <= len && count <= (len - off) / size;
}

/* Are the tables of the index whose header is ``h`` inside ``len`` bytes (a mapping, at most the
 * header's ``size``), its stats' room inside ``size``? ``stats_room``: the stats slots that must lie
 * in ``len`` too (``files`` for a mapping of the whole file; the used ones for a copy that may stop
 * there, with the shorts before them; none: a copy may stop at the shapes). protocol's
 * check_tables, in C. */
static inline int monarch_index_bounded(const struct monarch_index_header *h, uint64_t len, uint64_t stats_room)
{
    return h->magic == MONARCH_INDEX_MAGIC && h->version == MONARCH_INDEX_VERSION && h->buckets
           && h->files <= h->entries
           && h->dirs <= h->entries - h->files && h->dirs < h->buckets
           && h->stats_used <= h->files && len <= h->size
           && monarch_index_table_in(h->buckets_off, h->buckets, 4, len)
           && monarch_index_table_in(h->files_off, h->files, MONARCH_INDEX_FILE_SIZE, len)
           && monarch_index_table_in(h->ranges_off, (uint64_t)h->dirs + 1, 4, len)
           && monarch_index_table_in(monarch_index_affixes_off(h), h->dirs, sizeof(struct monarch_index_affix), len)
           && monarch_index_affixes_off(h) + sizeof(struct monarch_index_affix) * h->dirs <= h->entries_off
           && (!h->sizes_off || monarch_index_table_in(h->sizes_off, h->files, 8, len))
           && (!h->inos_off || monarch_index_table_in(h->inos_off, h->reserved & MONARCH_INDEX_INOS_ONE ? 1 : h->files,
                                                      8, len))
           && monarch_index_table_in(h->entries_off, h->entries - h->files, MONARCH_INDEX_ENTRY_SIZE, len)
           && h->keys_off <= len && h->keys_size <= len - h->keys_off && h->names_size <= h->keys_size
           && monarch_index_table_in(h->children_off, h->children_count, MONARCH_INDEX_CHILD_SIZE, len)
           && h->stats_off <= h->size && (uint64_t)MONARCH_INDEX_ENTRY_SIZE * h->files == h->size - h->stats_off
           && h->stats_off >= 8ull * MONARCH_INDEX_SHORT_ROOM * h->files + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * h->dirs
           && (uint64_t)h->files * (1 + MONARCH_INDEX_SHORT_ROOM) < MONARCH_INDEX_DESCRIBING
           && h->children_off + (uint64_t)MONARCH_INDEX_CHILD_SIZE * h->children_count <= monarch_index_shapes_off(h)
           && stats_room <= h->files
           && (stats_room ? monarch_index_table_in(h->stats_off, stats_room, MONARCH_INDEX_ENTRY_SIZE, len)
                          : monarch_index_shapes_off(h) <= len);  /* a copy of an index with no stat: to the shapes */
}

/* The number of file ``n``'s directory (the j with ranges[j] < n <= ranges[j + 1]: entry files + 1
 * + j), by a binary search of the ranges; 0 if there is no file n, or the ranges say nonsense. */
static inline uint32_t monarch_index_dir_of(const unsigned char *x, const struct monarch_index_header *h, uint32_t n)
{
    const unsigned char *r = x + h->ranges_off;
    uint32_t lo = 0, hi = h->dirs, at_lo, at_hi, at;
    if (!n || n > h->files || !hi)
        return 0;
    memcpy(&at_lo, r, sizeof at_lo);
    memcpy(&at_hi, r + 4ull * hi, sizeof at_hi);
    if (at_lo >= n || at_hi < n)
        return 0;
    while (hi - lo > 1) {  /* ranges[lo] < n <= ranges[hi] */
        uint32_t mid = lo + (hi - lo) / 2;
        memcpy(&at, r + 4ull * mid, sizeof at);
        if (at < at_lo || at > at_hi)
            return 0;  /* not monotonic */
        if (at < n)
            lo = mid, at_lo = at;
        else
            hi = mid, at_hi = at;
    }
    return h->files + 1 + lo;
}

/* Directory j's (from 0) files: *first and *count, if its range lies inside the files; else 0. */
static inline int monarch_index_dir_files(const unsigned char *x, const struct monarch_index_header *h, uint32_t j,
                                          uint32_t *first, uint32_t *count)
{
    uint32_t r[2];
    if (j >= h->dirs)
        return 0;
    memcpy(r, x + h->ranges_off + 4ull * j, sizeof r);
    if (r[0] > r[1] || r[1] > h->files)
        return 0;
    *first = r[0] + 1;
    *count = r[1] - r[0];
    return 1;
}

/* The key of fixed entry ``m`` (a directory; a link record's is its file's name), its hash in
 * *hash if not NULL; NULL if there is no entry m or its key lies outside the key bytes. */
static inline const char *monarch_index_fixed_key(const unsigned char *x, const struct monarch_index_header *h,
                                                  uint32_t m, uint32_t *len, uint32_t *hash)
{
    if (m <= h->files || m > h->entries)
        return NULL;
    const unsigned char *at = x + h->entries_off + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * (m - h->files - 1);
    uint32_t head[2];
    uint64_t off;
    memcpy(head, at, sizeof head);
    memcpy(&off, at + offsetof(struct monarch_index_entry, key_off), sizeof off);
    if (off > h->keys_size || head[1] > h->keys_size - off || !head[1])
        return NULL;
    if (hash)
        *hash = head[0];
    *len = head[1];
    return (const char *)x + h->keys_off + off;
}

/* The key of file ``n``'s directory, or NULL. */
static inline const char *monarch_index_dir_key(const unsigned char *x, const struct monarch_index_header *h,
                                                uint32_t n, uint32_t *len)
{
    uint32_t m = monarch_index_dir_of(x, h, n);
    return m ? monarch_index_fixed_key(x, h, m, len, NULL) : NULL;
}

/* File ``n``'s name in three parts: its directory's files' common prefix, its own middle, their
 * common suffix (monarch_index_affix); its directory's number in ``dir`` (from dir_of). 1, or 0 if
 * there is no file n or its offsets are not those of a middle inside the names (each file's from
 * its own offset to the next's, never empty) and affixes inside the key bytes. */
struct monarch_index_name {
    const char *prefix, *middle, *suffix;
    uint32_t prefix_len, middle_len, suffix_len, dir;
};

static inline int monarch_index_name_of(const unsigned char *x, const struct monarch_index_header *h, uint32_t n,
                                        struct monarch_index_name *out)
{
    uint32_t m = monarch_index_dir_of(x, h, n);
    if (!m)
        return 0;
    const unsigned char *at = x + h->files_off + (uint64_t)MONARCH_INDEX_FILE_SIZE * (n - 1);
    uint32_t off, next;
    uint64_t end = h->names_size;
    memcpy(&off, at + offsetof(struct monarch_index_file, name_off), sizeof off);
    if (n < h->files) {
        memcpy(&next, at + MONARCH_INDEX_FILE_SIZE + offsetof(struct monarch_index_file, name_off), sizeof next);
        end = next;
    }
    struct monarch_index_affix a;
    memcpy(&a, x + monarch_index_affixes_off(h) + sizeof a * (m - h->files - 1), sizeof a);
    if (off >= end || end > h->names_size || (uint64_t)a.off + a.prefix + a.suffix > h->keys_size)
        return 0;
    const char *keys = (const char *)x + h->keys_off;
    *out = (struct monarch_index_name){keys + a.off, keys + off, keys + a.off + a.prefix, a.prefix,
                                       (uint32_t)(end - off), a.suffix, m};
    return 1;
}

/* ``name``'s length, whole. */
static inline uint32_t monarch_index_name_len(const struct monarch_index_name *name)
{
    return name->prefix_len + name->middle_len + name->suffix_len;
}

/* ``name`` written whole at ``buf`` (monarch_index_name_len bytes). */
static inline void monarch_index_name_copy(const struct monarch_index_name *name, char *buf)
{
    memcpy(buf, name->prefix, name->prefix_len);
    memcpy(buf + name->prefix_len, name->middle, name->middle_len);
    memcpy(buf + name->prefix_len + name->middle_len, name->suffix, name->suffix_len);
}

/* Does file ``n`` have the key whose last "/" is at ``key[p - 1]``? Its name first (no hash is
 * stored for a file: its length and middle reject most, then its directory's affixes), then its
 * directory's key and the "/" between them (none after a key that ends with one: a root's "<k>/"). */
static inline int monarch_index_file_is(const unsigned char *x, const struct monarch_index_header *h, uint32_t n,
                                        const char *key, size_t len, size_t p)
{
    struct monarch_index_name nm;
    uint32_t dl = 0;
    const char *dk;
    if (!p || !monarch_index_name_of(x, h, n, &nm) || monarch_index_name_len(&nm) != len - p
        || memcmp(nm.middle, key + p + nm.prefix_len, nm.middle_len) || memcmp(nm.prefix, key + p, nm.prefix_len)
        || memcmp(nm.suffix, key + len - nm.suffix_len, nm.suffix_len)
        || !(dk = monarch_index_fixed_key(x, h, nm.dir, &dl, NULL)))
        return 0;
    return (dk[dl - 1] == '/' ? p == dl : p == (size_t)dl + 1) && !memcmp(dk, key, dl);
}

/* Where the last component of ``key`` starts (after its last "/"; 0 if it has none). */
static inline size_t monarch_key_tail(const char *key, size_t len)
{
    size_t p = len;
    while (p && key[p - 1] != '/')
        p--;
    return p;
}

/* Is ``key`` (``hash``: its monarch_crc32) the key of keyed number ``n`` (a file or a directory)? */
static inline int monarch_index_is(const unsigned char *x, const struct monarch_index_header *h, uint32_t n,
                                   const char *key, size_t len, uint32_t hash)
{
    if (n && n <= h->files)
        return monarch_index_file_is(x, h, n, key, len, monarch_key_tail(key, len));
    uint32_t kl = 0, kh = 0;
    const char *k = n <= h->files + h->dirs ? monarch_index_fixed_key(x, h, n, &kl, &kh) : NULL;
    return k && kh == hash && kl == len && !memcmp(k, key, len);
}

/* Number ``n``'s key (a file's: its directory's, "/" unless that ends with one, its name; a
 * directory's as stored) written into ``buf`` (``cap`` bytes, not NUL-terminated): its length, or 0
 * if there is no such keyed number, it is ill-formed, or it does not fit. */
static inline uint32_t monarch_index_key(const unsigned char *x, const struct monarch_index_header *h, uint32_t n,
                                         char *buf, size_t cap)
{
    struct monarch_index_name nm = {0};
    uint32_t nl = 0, dl = 0;
    const char *dk;
    int file = n && n <= h->files;
    if (!n || n > h->files + h->dirs)
        return 0;
    if (file) {
        if (!monarch_index_name_of(x, h, n, &nm) || !(dk = monarch_index_fixed_key(x, h, nm.dir, &dl, NULL)))
            return 0;
        nl = monarch_index_name_len(&nm);
    } else if (!(dk = monarch_index_fixed_key(x, h, n, &dl, NULL))) {
        return 0;
    }
    size_t sep = file && dk[dl - 1] != '/', total = (size_t)dl + sep + nl;
    if (total > cap || total > UINT32_MAX)
        return 0;
    memcpy(buf, dk, dl);
    if (sep)
        buf[dl] = '/';
    if (file)
        monarch_index_name_copy(&nm, buf + dl + sep);
    return (uint32_t)total;
}

/* File n's d_ino in its directory's listing (0 without the inodes table; its one u64 with INOS_ONE). */
static inline uint64_t monarch_index_listed_ino(const unsigned char *x, const struct monarch_index_header *h, uint32_t n)
{
    uint64_t v = 0;
    if (h->inos_off && n && n <= h->files)
        memcpy(&v, x + h->inos_off + (h->reserved & MONARCH_INDEX_INOS_ONE ? 0 : 8ull * (n - 1)), sizeof v);
    return v;
}

/* A file's listed u64 (``off``: the header's sizes_off; 0 without them). */
static inline uint64_t monarch_index_file_u64(const unsigned char *x, const struct monarch_index_header *h,
                                              uint64_t off, uint32_t n)
{
    uint64_t v = 0;
    if (off && n && n <= h->files)
        memcpy(&v, x + off + 8ull * (n - 1), sizeof v);
    return v;
}

/* Directory j's (from 0) shape, once whole: the stat fields its files' short words share; else NULL. */
static inline const unsigned char *monarch_index_shape(const unsigned char *x, const struct monarch_index_header *h,
                                                       uint32_t j)
{
    const unsigned char *at = x + monarch_index_shapes_off(h) + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * j;
    return j < h->dirs && __atomic_load_n((const uint32_t *)at, __ATOMIC_ACQUIRE) == MONARCH_INDEX_SHAPE_READY
           ? at : NULL;
}

/* A file's st_blocks from its size, as a short word's ``how`` says (~0: none can be). */
static inline uint64_t monarch_short_blocks(unsigned how, uint64_t size, uint32_t blksize)
{
    switch (how) {
    case MONARCH_SHORT_BLOCKS_512: return (size + 511) / 512;
    case MONARCH_SHORT_BLOCKS_4096: return (size + 4095) / 4096 * 8;
    case MONARCH_SHORT_BLOCKS_BLKSIZE: return blksize >= 512 ? (size + blksize - 1) / blksize * (blksize / 512) : ~0ull;
    default: return 0;
    }
}

/* The words a short stat takes, from its first. */
static inline uint32_t monarch_short_words(uint64_t first)
{
    return 1 + (uint32_t)((first >> MONARCH_INDEX_SHORT_TIMES_AT) & 3);
}

/* File n's short stat (its first word at word k of the shorts) with its directory's shape, as a
 * whole stat into *e (its key fields its name's, its first child its number): 1, or 0 if it is not
 * inside the shorts' room or the shape is not whole. */
static inline int monarch_index_short(const unsigned char *x, const struct monarch_index_header *h, uint32_t n,
                                      uint64_t k, struct monarch_index_entry *e)
{
    const uint64_t *at = (const uint64_t *)(x + monarch_index_shorts_off(h)) + k;
    uint64_t w = __atomic_load_n(at, __ATOMIC_RELAXED), t[3];  /* written before the record's release store */
    uint32_t more = monarch_short_words(w) - 1;
    struct monarch_index_name nm;
    if (!(w >> 63) || !monarch_index_name_of(x, h, n, &nm) || k + 1 + more > (uint64_t)MONARCH_INDEX_SHORT_ROOM * h->files)
        return 0;
    const unsigned char *shape = monarch_index_shape(x, h, nm.dir - h->files - 1);
    if (!shape)
        return 0;
    memcpy(e, shape, sizeof *e);
    for (uint32_t i = 0; i < more; i++)
        t[i] = __atomic_load_n(at + 1 + i, __ATOMIC_RELAXED);
    if (more) {  /* SHORT_TIMES_M: mtime; _MA: mtime, atime; _MAC: mtime, atime, ctime */
        e->mtime_ns = (int64_t)t[0];
        e->atime_ns = more > 1 ? (int64_t)t[1] : e->mtime_ns;
        e->ctime_ns = more > 2 ? (int64_t)t[2] : e->mtime_ns;
    }
    int64_t delta = (int64_t)(w << 1) >> (64 - MONARCH_INDEX_SHORT_INO_BITS);  /* bits 27..62, signed */
    e->hash = 0, e->key_len = nm.middle_len, e->key_off = (uint64_t)(nm.middle - (const char *)(x + h->keys_off));
    e->size = w & ((1u << MONARCH_INDEX_SHORT_SIZE_BITS) - 1);
    e->ino += (uint64_t)delta;
    e->blocks = monarch_short_blocks((unsigned)(w >> MONARCH_INDEX_SHORT_BLOCKS_AT) & 3, e->size, e->blksize);
    e->flags = (uint32_t)((w >> MONARCH_INDEX_SHORT_ROUTE_AT) & 0xF) << MONARCH_INDEX_ROUTE_SHIFT;
    e->link = 0, e->nchildren = 0, e->children = n;
    return 1;
}

/* Number ``n``'s stat into *e: a file's from its slot or its short stat (monarch_index_short), a
 * fixed entry's as stored. 0 when nothing may be answered from it: a file not described (its
 * record's ``stat`` 0, DESCRIBING or out of range), a fixed entry flagged UNDESCRIBED. The record's
 * ``stat`` is loaded with acquire: a slot or a short stat seen is whole. */
static inline int monarch_index_read(const unsigned char *x, const struct monarch_index_header *h, uint32_t n,
                                     struct monarch_index_entry *e)
{
    if (!n || n > h->entries)
        return 0;
    if (n <= h->files) {
        const unsigned char *at = x + h->files_off + (uint64_t)MONARCH_INDEX_FILE_SIZE * (n - 1);
        uint32_t s = __atomic_load_n((const uint32_t *)(at + offsetof(struct monarch_index_file, stat)),
                                     __ATOMIC_ACQUIRE);
        if (!s || s == MONARCH_INDEX_DESCRIBING)
            return 0;
        if (s > h->files)
            return monarch_index_short(x, h, n, (uint64_t)s - h->files - 1, e);
        const unsigned char *stat = x + h->stats_off + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * (s - 1);
        uint64_t named;  /* a slot whose stat does not name its file back (a copy cut while it was written) is none */
        memcpy(&named, stat + offsetof(struct monarch_index_entry, children), sizeof named);
        if (named != n)
            return 0;
        memcpy(e, stat, sizeof *e);
        return 1;
    }
    const unsigned char *at = x + h->entries_off + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * (n - h->files - 1);
    memcpy(e, at, sizeof *e);
    return !(e->flags & MONARCH_INDEX_FLAG_UNDESCRIBED);
}

/* Fixed entry ``m``'s stat in place (a directory's, a link record's), NULL if there is no such
 * entry or it is flagged UNDESCRIBED. */
static inline const unsigned char *monarch_index_fixed_stat(const unsigned char *x, const struct monarch_index_header *h,
                                                            uint32_t m)
{
    if (m <= h->files || m > h->entries)
        return NULL;
    const unsigned char *at = x + h->entries_off + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * (m - h->files - 1);
    uint32_t flags;
    memcpy(&flags, at + offsetof(struct monarch_index_entry, flags), sizeof flags);
    return flags & MONARCH_INDEX_FLAG_UNDESCRIBED ? NULL : at;
}

/* Is ``n`` a file whose stat is not there yet (not described, or being described)? */
static inline int monarch_index_undescribed(const unsigned char *x, const struct monarch_index_header *h, uint32_t n)
{
    struct monarch_index_entry e;
    return n && n <= h->files && !monarch_index_read(x, h, n, &e);
}

/* The first of ``buckets`` buckets a key of hash ``hash`` is looked for in: the hash's place in
 * [0, buckets), so that any count of buckets serves (protocol.py, "Snapshot index"). */
static inline uint32_t monarch_index_bucket(uint32_t hash, uint32_t buckets)
{
    return (uint32_t)(((uint64_t)hash * buckets) >> 32);
}

/* The bytewise order of ``q`` (``ql`` bytes) against ``a`` and ``b`` joined: < 0, 0 or > 0. */
static inline int monarch_cmp_joined(const char *q, size_t ql, const char *a, size_t al, const char *b, size_t bl)
{
    int c = memcmp(q, a, ql < al ? ql : al);
    if (c || ql <= al)
        return c ? c : ql < al || bl ? -1 : 0;
    q += al, ql -= al;
    c = memcmp(q, b, ql < bl ? ql : bl);
    return c ? c : ql < bl ? -1 : ql > bl;
}

/* The number of the file named ``name`` (``len`` bytes) in directory ``m`` (its entry number), or
 * 0: a binary search of its files, which lie in the bytewise order of their names (so no file
 * has a bucket). Its directory's prefix and suffix are checked once, its files' middles and the
 * suffix compared at each step; offsets that are not a middle's end the search. */
static inline uint32_t monarch_index_find_in(const unsigned char *x, const struct monarch_index_header *h, uint32_t m,
                                             const char *name, size_t len)
{
    uint32_t lo, count;
    if (m <= h->files || !monarch_index_dir_files(x, h, m - h->files - 1, &lo, &count))
        return 0;
    struct monarch_index_affix a;
    memcpy(&a, x + monarch_index_affixes_off(h) + sizeof a * (m - h->files - 1), sizeof a);
    const char *keys = (const char *)x + h->keys_off, *suffix = keys + a.off + a.prefix;
    if ((uint64_t)a.off + a.prefix + a.suffix > h->keys_size || len <= (size_t)a.prefix + a.suffix
        || memcmp(name, keys + a.off, a.prefix) || memcmp(name + len - a.suffix, suffix, a.suffix))
        return 0;
    const char *q = name + a.prefix;
    size_t ql = len - a.prefix;  /* its middle and the suffix */
    const unsigned char *recs = x + h->files_off + offsetof(struct monarch_index_file, name_off);
    for (uint32_t hi = lo + count; lo < hi;) {  /* files lo .. hi - 1 (numbered from 1) */
        uint32_t n = lo + (hi - lo) / 2, off, end = (uint32_t)h->names_size;
        memcpy(&off, recs + (uint64_t)MONARCH_INDEX_FILE_SIZE * (n - 1), sizeof off);
        if (n < h->files)
            memcpy(&end, recs + (uint64_t)MONARCH_INDEX_FILE_SIZE * n, sizeof end);
        if (off >= end || end > h->names_size)
            return 0;
        int c = monarch_cmp_joined(q, ql, keys + off, end - off, suffix, a.suffix);
        if (!c)
            return n;
        if (c < 0)
            hi = n;
        else
            lo = n + 1;
    }
    return 0;
}

/* The number (from 1) of directory ``key`` (``hash``: its monarch_crc32), or 0: its bucket, then
 * the next ones. Bounded by the table's size; an empty bucket or a number that is no directory's
 * ends the search (monarch_index_bounded checked the tables' bounds). */
static inline uint32_t monarch_index_find_dir(const unsigned char *x, const struct monarch_index_header *h,
                                              const char *key, size_t len, uint32_t hash)
{
    for (uint32_t b = monarch_index_bucket(hash, h->buckets), probes = 0; probes < h->buckets;
         b = b + 1 == h->buckets ? 0 : b + 1, probes++) {
        uint32_t n, kl = 0, kh = 0;
        memcpy(&n, x + h->buckets_off + 4ull * b, sizeof n);
        if (n <= h->files || n > h->files + h->dirs)
            return 0;
        const char *k = monarch_index_fixed_key(x, h, n, &kl, &kh);
        if (k && kh == hash && kl == len && !memcmp(k, key, len))
            return n;
    }
    return 0;
}

/* The number (from 1) of file ``key`` in the index mapped at ``x`` whose header is ``h``, or 0:
 * its directory's key (up to its last "/"; a root's file's, "<k>/"), then its name in that
 * directory. */
static inline uint32_t monarch_index_find_file(const unsigned char *x, const struct monarch_index_header *h,
                                               const char *key, size_t len)
{
    size_t p = monarch_key_tail(key, len);
    if (p < 2 || p == len || key[p - 2] == '/')  /* no name, or "a//b": no file's */
        return 0;
    size_t dl = memchr(key, '/', p - 1) ? p - 1 : p;
    uint32_t m = monarch_index_find_dir(x, h, key, dl, monarch_crc32(key, dl));
    return m ? monarch_index_find_in(x, h, m, key + p, len - p) : 0;
}

/* The number (from 1) of ``key`` (``hash``: its monarch_crc32) in the index, or 0: a file's,
 * else a directory's. */
static inline uint32_t monarch_index_find(const unsigned char *x, const struct monarch_index_header *h,
                                          const char *key, size_t len, uint32_t hash)
{
    uint32_t n = monarch_index_find_file(x, h, key, len);
    return n ? n : monarch_index_find_dir(x, h, key, len, hash);
}

/* monarch_index_find for a caller without the key's hash: made only if no file has the key. */
static inline uint32_t monarch_index_find_key(const unsigned char *x, const struct monarch_index_header *h,
                                              const char *key, size_t len)
{
    uint32_t n = monarch_index_find_file(x, h, key, len);
    return n ? n : monarch_index_find_dir(x, h, key, len, monarch_crc32(key, len));
}

/* -- a file's stat, written when it is described (the daemon's process only) --------------- */
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

/* ``st``'s fields into an index entry's (size .. nlink, blocks, blksize); the rest left alone. */
static inline void monarch_index_stat_fields(struct monarch_index_entry *e, const struct stat *st)
{
    e->size = (uint64_t)st->st_size;
    e->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    e->atime_ns = (int64_t)st->st_atim.tv_sec * 1000000000 + st->st_atim.tv_nsec;
    e->ctime_ns = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
    e->ino = st->st_ino;
    e->dev = st->st_dev;
    e->mode = st->st_mode;
    e->uid = st->st_uid;
    e->gid = st->st_gid;
    e->nlink = (uint32_t)st->st_nlink;
    e->blocks = (uint64_t)st->st_blocks;
    e->blksize = (uint32_t)st->st_blksize;
}

/* The short stat (``w``: its words, returned how many) of a file of stat ``f`` (route bits ``bits``)
 * beside directory shape ``shape``, if it has every field the shape has but its size (at most
 * SHORT_MAX_SIZE), its inode (within 2^35 of the shape's), its blocks (one of SHORT_BLOCKS_* of its
 * size) and its times (SHORT_TIMES_*); else 0. */
static inline uint32_t monarch_index_short_words(const unsigned char *shape, const struct monarch_index_entry *f,
                                                 uint32_t bits, uint64_t w[4])
{
    struct monarch_index_entry t;
    memcpy(&t, shape, sizeof t);
    if (!S_ISREG(f->mode) || f->size > MONARCH_INDEX_SHORT_MAX_SIZE || f->dev != t.dev || f->mode != t.mode
        || f->uid != t.uid || f->gid != t.gid || f->nlink != t.nlink || f->blksize != t.blksize)
        return 0;
    unsigned how = 0, times;
    while (how < 4 && monarch_short_blocks(how, f->size, f->blksize) != f->blocks)
        how++;
    int64_t delta = (int64_t)(f->ino - t.ino), bound = (int64_t)1 << (MONARCH_INDEX_SHORT_INO_BITS - 1);
    if (how == 4 || delta < -bound || delta >= bound)
        return 0;
    if (f->mtime_ns == t.mtime_ns && f->atime_ns == t.atime_ns && f->ctime_ns == t.ctime_ns)
        times = MONARCH_SHORT_TIMES_SHAPE;
    else if (f->ctime_ns != f->mtime_ns)
        times = MONARCH_SHORT_TIMES_MAC;
    else
        times = f->atime_ns == f->mtime_ns ? MONARCH_SHORT_TIMES_M : MONARCH_SHORT_TIMES_MA;
    w[0] = 1ull << 63 | f->size | (uint64_t)(bits >> MONARCH_INDEX_ROUTE_SHIFT) << MONARCH_INDEX_SHORT_ROUTE_AT
           | (uint64_t)how << MONARCH_INDEX_SHORT_BLOCKS_AT | (uint64_t)times << MONARCH_INDEX_SHORT_TIMES_AT
           | ((uint64_t)delta & ((1ull << MONARCH_INDEX_SHORT_INO_BITS) - 1)) << MONARCH_INDEX_SHORT_INO_AT;
    w[1] = (uint64_t)f->mtime_ns, w[2] = (uint64_t)f->atime_ns, w[3] = (uint64_t)f->ctime_ns;
    return 1 + times;
}

/* File ``n`` of the index mapped writable at ``x`` (header ``h``, checked: monarch_index_bounded
 * with ``files`` slots) described with the stat fields of ``f`` (size .. nlink, blocks, blksize),
 * its route from ``steps`` (on its directory's key: the root's number starts it): the record
 * claimed (0 -> DESCRIBING); then its short stat if its directory's shape has its other fields
 * (monarch_index_short_words) and the shorts have room (words taken from the mapping's
 * shorts_used), else a slot taken from the mapping's stats_used and written (its key fields the
 * name's), and the directory's shape made from it if it has none (its first regular file
 * described: claimed, written, then marked whole); the listed size; then the record's ``stat``
 * released (files + 1 + the short's first word, or the slot). Every describer (the walk's pass, the door, Python) does
 * the same. 1 described now; 0 described or being described already; -1 no such file, or no room. */
static inline int monarch_index_put_fields(unsigned char *x, const struct monarch_index_header *h, uint32_t n,
                                           const struct monarch_index_entry *f, const struct monarch_route_steps *steps)
{
    struct monarch_index_name nm;
    uint32_t dl = 0, m;
    const char *dk;
    if (!monarch_index_name_of(x, h, n, &nm) || !(dk = monarch_index_fixed_key(x, h, m = nm.dir, &dl, NULL)))
        return -1;
    unsigned char *at = x + h->files_off + (uint64_t)MONARCH_INDEX_FILE_SIZE * (n - 1);
    uint32_t *stat = (uint32_t *)(at + offsetof(struct monarch_index_file, stat)), zero = 0;
    if (!__atomic_compare_exchange_n(stat, &zero, MONARCH_INDEX_DESCRIBING, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return 0;
    uint32_t bits = monarch_route_bits(steps, dk, dl, f->size, f->mode), j = m - h->files - 1;
    const unsigned char *shape = monarch_index_shape(x, h, j);
    uint64_t w[4];
    uint32_t words = shape ? monarch_index_short_words(shape, f, bits, w) : 0;
    uint32_t *taken = (uint32_t *)(x + offsetof(struct monarch_index_header, shorts_used));
    uint64_t room = (uint64_t)MONARCH_INDEX_SHORT_ROOM * h->files;
    uint32_t k = 0;
    if (words && __atomic_load_n(taken, __ATOMIC_RELAXED) + (uint64_t)words <= room)
        k = __atomic_fetch_add(taken, words, __ATOMIC_RELAXED);
    else
        words = 0;
    if (words && (uint64_t)k + words <= room) {
        uint64_t *at = (uint64_t *)(x + monarch_index_shorts_off(h)) + k;
        for (uint32_t i = 0; i < words; i++)
            __atomic_store_n(at + i, w[i], __ATOMIC_RELAXED);
        if (h->sizes_off)
            memcpy(x + h->sizes_off + 8ull * (n - 1), &f->size, sizeof f->size);
        __atomic_store_n(stat, h->files + 1 + k, __ATOMIC_RELEASE);
        return 1;
    }  /* the shorts full (their counter past the room: left there), or no shape: a slot */
    uint32_t s = __atomic_add_fetch((uint32_t *)(x + offsetof(struct monarch_index_header, stats_used)), 1,
                                    __ATOMIC_ACQ_REL);
    if (!s || s > h->files) {
        __atomic_store_n(stat, 0, __ATOMIC_RELEASE);
        return -1;
    }
    struct monarch_index_entry e = *f;
    e.hash = 0, e.key_len = nm.middle_len, e.key_off = (uint64_t)(nm.middle - (const char *)(x + h->keys_off));
    e.flags = bits;
    e.link = 0, e.nchildren = 0;
    e.children = n;
    memcpy(x + h->stats_off + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * (s - 1), &e, sizeof e);
    uint32_t *state = (uint32_t *)(x + monarch_index_shapes_off(h) + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * j);
    zero = 0;
    if (!shape && S_ISREG(e.mode)
        && __atomic_compare_exchange_n(state, &zero, MONARCH_INDEX_SHAPE_WRITING, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
        struct monarch_index_entry t = e;  /* what its directory's files share: never changed after */
        t.hash = MONARCH_INDEX_SHAPE_READY, t.key_len = 0, t.key_off = 0, t.size = 0, t.flags = 0, t.blocks = 0;
        t.children = 0;
        memcpy((unsigned char *)state + sizeof t.hash, (const unsigned char *)&t + sizeof t.hash, sizeof t - sizeof t.hash);
        __atomic_store_n(state, MONARCH_INDEX_SHAPE_READY, __ATOMIC_RELEASE);
    }
    if (h->sizes_off)
        memcpy(x + h->sizes_off + 8ull * (n - 1), &e.size, sizeof e.size);
    __atomic_store_n(stat, s, __ATOMIC_RELEASE);
    return 1;
}

/* monarch_index_put_fields from ``st`` (a regular file's lstat). */
static inline int monarch_index_put_stat(unsigned char *x, const struct monarch_index_header *h, uint32_t n,
                                         const struct stat *st, const struct monarch_route_steps *steps)
{
    struct monarch_index_entry f;
    memset(&f, 0, sizeof f);
    monarch_index_stat_fields(&f, st);
    return monarch_index_put_fields(x, h, n, &f, steps);
}

#endif /* MONARCH_NATIVE_H */
