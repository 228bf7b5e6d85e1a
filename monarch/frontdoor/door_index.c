/* Part of front_door.c, one translation unit (what it gives the other parts: door_index.h). Here:
 * the snapshot's index, read in place (the look-up itself is monarch_native.h's). */
#include "door_index.h"

/* -- the snapshot's index (the file the shim maps: protocol.build_index) --------------- */
/* The index's header (index_valid checked the tables' bounds when it was mapped). */
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

/* Number n (from 1) of the index: the file's (or directory's) fields, from its stat, and its key
 * built into ``key`` (INDEX_KEY_MAX bytes, not NUL-terminated; NULL: not wanted), if it is
 * described and well-formed (0 for a file not described yet). */
static int index_entry(const struct door *d, uint32_t n, struct idx_file *out, char *key, uint32_t *len)
{
    const unsigned char *x = d->index.map;
    struct monarch_index_header h = index_header(x);
    struct monarch_index_entry e;
    if (!monarch_index_read(x, &h, n, &e) || (key && !(*len = monarch_index_key(x, &h, n, key, INDEX_KEY_MAX))))
        return 0;
    out->size = e.size;
    out->mtime = e.mtime_ns;
    out->mode = e.mode;
    out->flags = e.flags;
    out->entry = n;
    return 1;
}

static int index_file(const struct door *d, const char *key, uint32_t len, struct idx_file *out)
{
    uint32_t n = index_number(d, key, len, monarch_crc32(key, len));
    return n && index_entry(d, n, out, NULL, NULL);
}

/* Is ``key`` (``hash``: its monarch_crc32) number n's key in the index? (The mapping stays until
 * front_door_free.) */
static int index_is_key(const struct door *d, uint32_t n, const char *key, uint32_t len, uint32_t hash)
{
    struct monarch_index_header h = index_header(d->index.map);
    return monarch_index_is(d->index.map, &h, n, key, len, hash);
}

/* Number n's key built into ``key`` (INDEX_KEY_MAX bytes, not NUL-terminated): its length, or 0. */
static uint32_t index_key(const struct door *d, uint32_t n, char *key)
{
    struct monarch_index_header h = index_header(d->index.map);
    return monarch_index_key(d->index.map, &h, n, key, INDEX_KEY_MAX);
}

static const unsigned char *index_dir_stat(const struct door *d, uint32_t n, uint32_t *m)
{
    struct monarch_index_header h = index_header(d->index.map);
    *m = monarch_index_dir_of(d->index.map, &h, n);
    return *m ? monarch_index_fixed_stat(d->index.map, &h, *m) : NULL;
}

static const char *index_dir_key(const struct door *d, uint32_t j, uint32_t *len, uint32_t *first)
{
    struct monarch_index_header h = index_header(d->index.map);
    uint32_t count;
    return monarch_index_dir_files(d->index.map, &h, j, first, &count) && count
           ? monarch_index_dir_key(d->index.map, &h, *first, len) : NULL;
}

static uint32_t index_dirs(const struct door *d)
{
    return index_header(d->index.map).dirs;
}

static size_t index_entries(const struct door *d)
{
    struct monarch_index_header h = index_header(d->index.map);
    return (size_t)h.files + h.dirs;
}

/* A mapping of the whole index file (``n`` bytes): its tables, its stats' room among them, inside it. */
static int index_valid(const unsigned char *x, size_t n)
{
    if (n < sizeof(struct monarch_index_header))
        return 0;
    struct monarch_index_header h = index_header(x);
    return monarch_index_bounded(&h, n, h.files);
}

/* -- a file a listing-mode walk left undescribed, described by the door at its miss --------- */
static uint32_t index_listed(const struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    if (!d->index.borrowed || !__atomic_load_n(&d->steps.known, __ATOMIC_ACQUIRE))
        return 0;  /* a mapping of the file the door made itself is read-only */
    struct monarch_index_header h = index_header(d->index.map);
    uint32_t n = monarch_index_find(d->index.map, &h, key, len, hash);
    return monarch_index_undescribed(d->index.map, &h, n) ? n : 0;
}

static int index_listed_number(const struct door *d, uint32_t n)
{
    if (!d->index.borrowed || !__atomic_load_n(&d->steps.known, __ATOMIC_ACQUIRE))
        return 0;
    struct monarch_index_header h = index_header(d->index.map);
    return monarch_index_undescribed(d->index.map, &h, n);
}

/* File n described with ``f``, the stat its owner (another node) has in its index: the device this
 * node's (its directory's: a node's own device numbers), the rest as the owner's (the PFS's). */
static void index_describe_fields(struct door *d, uint32_t n, struct monarch_index_entry *f)
{
    struct monarch_route_steps t = {d->steps.smallest, d->steps.route, d->steps.nsteps, d->steps.nroots};
    if (!d->index.borrowed)
        return;
    struct monarch_index_header h = index_header(d->index.map);
    uint32_t m;
    const unsigned char *dir = index_dir_stat(d, n, &m);
    if (!dir)
        return;
    memcpy(&f->dev, dir + offsetof(struct monarch_index_entry, dev), sizeof f->dev);
    monarch_index_put_fields((unsigned char *)d->index.map, &h, n, f, &t);
}

/* File n described from ``st`` (the source's lstat) in its stat slot, as the daemon would describe
 * it (monarch_index_put_stat: nothing if it is described or being described meanwhile; its route
 * from its root's number). */
static void index_describe(struct door *d, uint32_t n, const struct stat *st)
{
    struct monarch_route_steps t = {d->steps.smallest, d->steps.route, d->steps.nsteps, d->steps.nroots};
    struct monarch_index_header h = index_header(d->index.map);
    if (d->index.borrowed)
        monarch_index_put_stat((unsigned char *)d->index.map, &h, n, st, &t);
}
