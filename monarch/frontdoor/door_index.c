/* Part of front_door.c, one translation unit (what it gives the other parts: door_index.h). Here:
 * the snapshot's index, read in place (the look-up itself is monarch_native.h's). */
#include "door_index.h"

/* -- the snapshot's index (the file the shim maps: protocol.build_index) --------------- */
/* The index's header, and entry n (from 1) if it lies inside the mapping (index_valid
 * checked the tables' bounds when it was mapped). */
static struct monarch_index_header index_header(const unsigned char *x)
{
    struct monarch_index_header h;
    memcpy(&h, x, sizeof h);
    return h;
}



/* The entry number (from 1) of ``key`` in the index, or 0: the shim's look-up. */
static uint32_t index_number(const struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    struct monarch_index_header h = index_header(d->index.map);
    return monarch_index_find(d->index.map, &h, key, len, hash);
}

/* Entry n (from 1) of the index: the file's fields and its key (in the mapping), if it is a
 * well-formed entry. The mapping stays until front_door_free. */
static int index_entry(const struct door *d, uint32_t n, struct idx_file *out, const char **key, uint32_t *len)
{
    const unsigned char *x = d->index.map;
    struct monarch_index_header h = index_header(x);
    if (!n || n > h.entries)
        return 0;
    struct monarch_index_entry e;
    const unsigned char *at = x + h.entries_off + (uint64_t)sizeof e * (n - 1);
    if (monarch_index_undescribed(at))  /* a listed file not described yet: its fields are not the file's */
        return 0;
    memcpy(&e, at, sizeof e);
    if (e.key_off > h.keys_size || e.key_len > h.keys_size - e.key_off || !e.key_len)
        return 0;
    *key = (const char *)x + h.keys_off + e.key_off;
    *len = e.key_len;
    out->size = e.size;
    out->mtime = e.mtime_ns;
    out->mode = e.mode;
    out->flags = e.flags;
    out->entry = n;
    return 1;
}

static int index_file(const struct door *d, const char *key, uint32_t len, struct idx_file *out)
{
    const char *k;
    uint32_t l;
    uint32_t n = index_number(d, key, len, monarch_crc32(key, len));
    return n && index_entry(d, n, out, &k, &l);
}

/* Entry n's (from 1) key in the index, or NULL if it is no well-formed entry. */
static const char *index_entry_key(const struct door *d, uint32_t n, uint32_t *len)
{
    struct idx_file f;
    const char *k;
    return index_entry(d, n, &f, &k, len) ? k : NULL;
}

static int index_valid(const unsigned char *x, size_t n)
{
    if (n < sizeof(struct monarch_index_header))
        return 0;
    struct monarch_index_header h = index_header(x);
    if (h.magic != MONARCH_INDEX_MAGIC || h.version != MONARCH_INDEX_VERSION || !h.buckets ||
        (h.buckets & (h.buckets - 1)))
        return 0;
    return h.buckets_off <= n && 4ull * h.buckets <= n - h.buckets_off && h.entries_off <= n &&
           (uint64_t)sizeof(struct monarch_index_entry) * h.entries <= n - h.entries_off && h.keys_off <= n &&
           h.keys_size <= n - h.keys_off;
}

/* -- a file a listing-mode walk left undescribed, described by the door at its miss --------- */
static unsigned char *entry_at(const struct door *d, uint32_t n)
{
    struct monarch_index_header h = index_header(d->index.map);
    if (!n || n > h.entries)
        return NULL;
    return (unsigned char *)d->index.map + h.entries_off + (uint64_t)MONARCH_INDEX_ENTRY_SIZE * (n - 1);
}

static uint32_t index_listed(const struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    if (!d->index.borrowed || !__atomic_load_n(&d->steps.known, __ATOMIC_ACQUIRE))
        return 0;  /* a mapping of the file the door made itself is read-only */
    uint32_t n = index_number(d, key, len, hash);
    unsigned char *at = entry_at(d, n);
    return at && monarch_index_undescribed(at) ? n : 0;
}

/* Entry n described from ``st`` (the source's lstat) in place, as the daemon would describe it. */
static void index_describe(struct door *d, uint32_t n, const char *key, uint32_t len, const struct stat *st)
{
    unsigned char *at = entry_at(d, n);
    struct monarch_route_steps t = {d->steps.smallest, d->steps.route, d->steps.nsteps, d->steps.nroots};
    if (at && monarch_index_undescribed(at))
        monarch_index_describe(at, key, len, st, &t);
}
