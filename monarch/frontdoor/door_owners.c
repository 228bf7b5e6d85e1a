/* Part of front_door.c, one translation unit (what it gives the other parts: door_owners.h).
 * Here: whose file each index entry is, from Python's table or from the placement's ring. */
#include "door_owners.h"

/* The ring part holding ``h``: the last whose start is at most ``h`` (equal starts are empty
 * parts: the last of them holds it, as placement.py's bisect_right). */
static int ring_node(const struct entry_owners *o, uint64_t h)
{
    uint32_t lo = 0, hi = o->parts;    /* starts[lo] <= h < starts[hi] (starts[parts]: the ring's end) */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (o->starts[mid] <= h)
            lo = mid;
        else
            hi = mid;
    }
    return o->nodes[lo];
}

static int entry_owner(const struct door *d, const struct entry_owners *o, uint32_t entry)
{
    if (entry == 0 || entry > o->n)
        return -1;
    if (o->table)
        return o->table[entry - 1] < 0 ? o->self : o->table[entry - 1];
    if (!o->mine)
        return -1;
    if (entry_is_mine(o, entry))
        return o->self;
    char key[INDEX_KEY_MAX];
    uint32_t len = index_key(d, entry, key);
    return len ? ring_node(o, monarch_xxh64(key, len, o->seed)) : -1;
}

static int entry_is_mine(const struct entry_owners *o, uint32_t entry)
{
    if (entry == 0 || entry > o->n)
        return 0;
    if (o->table)
        return o->table[entry - 1] < 0;
    return o->mine && (o->mine[(entry - 1) >> 6] >> ((entry - 1) & 63) & 1);
}

static uint32_t entries_mine(const struct entry_owners *o, uint32_t n)
{
    uint32_t count = 0, upto = n < o->n ? n : o->n;
    if (o->table) {
        for (uint32_t e = 1; e <= upto; e++)
            count += o->table[e - 1] < 0;
        return count;
    }
    if (!o->mine)
        return 0;
    for (uint32_t w = 0; w < upto / 64; w++)
        count += (uint32_t)__builtin_popcountll(o->mine[w]);
    if (upto % 64)
        count += (uint32_t)__builtin_popcountll(o->mine[upto / 64] & ((1ULL << (upto % 64)) - 1));
    return count;
}

static void ring_bits(const unsigned char *index, const struct entry_owners *o, uint64_t *bits)
{
    memset(bits, 0, ((size_t)o->n + 63) / 64 * 8);
    struct monarch_index_header h = index_header(index);
    char key[INDEX_KEY_MAX];
    for (uint32_t e = 1; e <= o->n; e++) {
        uint32_t len = monarch_index_key(index, &h, e, key, INDEX_KEY_MAX);
        if (len && ring_node(o, monarch_xxh64(key, len, o->seed)) == o->self)
            bits[(e - 1) >> 6] |= 1ULL << ((e - 1) & 63);
    }
}
