/* Part of front_door.c, one translation unit (what it gives the other parts: door_keys.h). Here:
 * the key table: every key the door has heard of, by hash while they are few against the index,
 * then the index's keys at their entries (struct door_keys). */
#include "door_keys.h"

/* Is ``key`` (``hash``) slot s's key: the index's number ``ref``, else the door's own copy? */
static int slot_is(const struct door *d, const struct key_slot *s, const char *key, uint32_t len, uint32_t hash)
{
    if (s->e.held == H_INDEX)
        return index_is_key(d, s->ref, key, len, hash);
    return d->keys.own[s->ref - 1].len == len && !memcmp(d->keys.own[s->ref - 1].key, key, len);
}

static struct entry *find(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    if (d->keys.dense) {                /* (a key asked before the index was open stays in the table) */
        uint32_t n = index_number(d, key, len, hash);
        if (n && d->keys.dense[n - 1].held)
            return &d->keys.dense[n - 1];
    }
    if (!d->keys.cap)
        return NULL;
    for (size_t i = hash & (d->keys.cap - 1);; i = (i + 1) & (d->keys.cap - 1)) {
        struct key_slot *s = &d->keys.tab[i];
        if (!s->ref)
            return NULL;
        if (s->hash == hash && slot_is(d, s, key, len, hash))
            return &s->e;
    }
}

/* The table remade with ``cap`` slots (0: none), its keys moved, the index's to ``dense`` where
 * it is made: 0, or -1 if there is no memory (nothing moved). */
static int remake_table(struct door *d, size_t cap)
{
    struct key_slot *tab = cap ? calloc(cap, sizeof *tab) : NULL;
    if (cap && !tab)
        return -1;
    size_t used = 0;
    for (size_t j = 0; j < d->keys.cap; j++) {
        struct key_slot s = d->keys.tab[j];
        if (!s.ref)
            continue;
        if (d->keys.dense && s.e.held == H_INDEX) {
            d->keys.dense[s.ref - 1] = s.e;
            continue;
        }
        size_t i = s.hash & (cap - 1);
        while (tab[i].ref)
            i = (i + 1) & (cap - 1);
        tab[i] = s;
        used++;
    }
    free(d->keys.tab);
    d->keys.tab = tab;
    d->keys.cap = cap;
    d->keys.used = used;
    return 0;
}

/* The index's keys moved to a record at each of its entries, the table left the door's own: 0,
 * or -1 if there is no memory (all stays in the table). */
static int make_dense(struct door *d)
{
    size_t entries = index_entries(d), own = 0, cap = 0;
    if (!(d->keys.dense = calloc(entries ? entries : 1, sizeof(struct entry))))
        return -1;
    d->keys.ndense = entries;
    for (size_t j = 0; j < d->keys.cap; j++)
        own += d->keys.tab[j].ref && d->keys.tab[j].e.held == H_OWN;
    if (own)
        for (cap = 1024; 2 * own > cap; cap *= 2)
            ;
    if (remake_table(d, cap) != 0) {
        free(d->keys.dense);
        d->keys.dense = NULL;
        d->keys.ndense = 0;
        return -1;
    }
    return 0;
}

/* Room in the table for ``keys`` keys, at most half its slots full: 0, or -1 if it could not be
 * made. Where the table would take more room than a record at every entry of the index (4 bytes
 * against 12 a slot), the index's keys go there instead. */
static int table_room(struct door *d, size_t keys)
{
    if (2 * keys <= d->keys.cap)
        return 0;
    size_t cap = d->keys.cap ? d->keys.cap : 1024;
    while (2 * keys > cap)
        cap *= 2;
    if (!d->keys.dense && d->index.map) {
        if (cap * sizeof(struct key_slot) > index_entries(d) * sizeof(struct entry) && make_dense(d) == 0)
            return 0;                   /* (the table is left its own keys, at most half full, or none) */
    }
    return remake_table(d, cap);
}

/* Room for ``keys`` keys (the table's and those about to come), before the workers start. */
static int reserve_keys(struct door *d, size_t keys)
{
    return d->keys.dense ? 0 : table_room(d, keys);  /* dense: every key of the index has its record */
}

static size_t key_room(const struct door *d)
{
    return d->keys.cap * sizeof(struct key_slot) + d->keys.ndense * sizeof(struct entry);
}

static struct entry *insert(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    /* a key of the index is its entry's number (the index is mapped until front_door_free) */
    uint32_t n = d->index.map ? index_number(d, key, len, hash) : 0;
    /* the table grown (doubled at least) past three quarters full: room reserved for the keys
     * expected stays half empty, and keys past them (another node's files read here) fill it
     * further first */
    if (!(n && d->keys.dense) && 4 * (d->keys.used + 1) > 3 * d->keys.cap && table_room(d, d->keys.used + 1) != 0)
        return NULL;
    if (n && d->keys.dense) {
        struct entry *e = &d->keys.dense[n - 1];
        *e = (struct entry){.state = K_FREE, .held = H_INDEX};
        return e;
    }
    if (4 * (d->keys.used + 1) > 3 * d->keys.cap && table_room(d, d->keys.used + 1) != 0)
        return NULL;                    /* (the table made dense just now may be left none) */
    if (!n) {
        if (d->keys.nown == d->keys.cap_own) {
            size_t cap = d->keys.cap_own ? 2 * d->keys.cap_own : 64;
            struct own_key *own = realloc(d->keys.own, cap * sizeof *own);
            if (!own)
                return NULL;
            d->keys.own = own;
            d->keys.cap_own = cap;
        }
        char *copy = malloc(len ? len : 1);
        if (!copy)
            return NULL;
        memcpy(copy, key, len);
        d->keys.own[d->keys.nown++] = (struct own_key){copy, len};
    }
    size_t i = hash & (d->keys.cap - 1);
    while (d->keys.tab[i].ref)
        i = (i + 1) & (d->keys.cap - 1);
    d->keys.tab[i] = (struct key_slot){.hash = hash, .ref = n ? n : (uint32_t)d->keys.nown,
                                       .e = {.state = K_FREE, .held = n ? H_INDEX : H_OWN}};
    d->keys.used++;
    return &d->keys.tab[i].e;
}

static struct entry *find_or_insert(struct door *d, const char *key, uint32_t len)
{
    uint32_t hash = monarch_crc32(key, len);
    struct entry *e = find(d, key, len, hash);
    return e ? e : insert(d, key, len, hash);
}
