/* Part of front_door.c, one translation unit (what it gives the other parts: door_keys.h). Here:
 * the key table: every key the door has heard of, in one open-addressing table. */
#include "door_keys.h"

/* -- the key table (open addressing; entries change state, never go) ------------------- */
/* Is ``key`` (``hash``) entry e's key: the index's number ``ref`` when borrowed, else its own copy? */
static int entry_is(const struct door *d, const struct entry *e, const char *key, uint32_t len, uint32_t hash)
{
    if (e->borrowed)
        return index_is_key(d, e->ref, key, len, hash);
    return d->keys.own[e->ref - 1].len == len && !memcmp(d->keys.own[e->ref - 1].key, key, len);
}

static struct entry *find(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    if (!d->keys.cap)
        return NULL;
    for (size_t i = hash & (d->keys.cap - 1);; i = (i + 1) & (d->keys.cap - 1)) {
        struct entry *e = &d->keys.tab[i];
        if (!e->ref)
            return NULL;
        if (e->hash == hash && entry_is(d, e, key, len, hash))
            return e;
    }
}

/* Room for ``keys`` keys at most half the slots full; 0, or -1 if it could not be made. */
static int reserve_keys(struct door *d, size_t keys)
{
    if (2 * keys > d->keys.cap) {
        size_t cap = d->keys.cap ? d->keys.cap : 1024;
        while (2 * keys > cap)
            cap *= 2;
        struct entry *tab = calloc(cap, sizeof *tab);
        if (!tab)
            return -1;
        for (size_t j = 0; j < d->keys.cap; j++) {
            if (!d->keys.tab[j].ref)
                continue;
            size_t i = d->keys.tab[j].hash & (cap - 1);
            while (tab[i].ref)
                i = (i + 1) & (cap - 1);
            tab[i] = d->keys.tab[j];
        }
        free(d->keys.tab);
        d->keys.tab = tab;
        d->keys.cap = cap;
    }
    return 0;
}

static struct entry *insert(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    /* grown (doubled at least) past three quarters full: room reserved for the keys expected stays
     * half empty, and keys past them (another node's files read here) fill it further first */
    if (4 * (d->keys.used + 1) > 3 * d->keys.cap && reserve_keys(d, d->keys.used + 1) != 0)
        return NULL;
    size_t i = hash & (d->keys.cap - 1);
    while (d->keys.tab[i].ref)
        i = (i + 1) & (d->keys.cap - 1);
    /* a key of the index is its entry's number (the index is mapped until front_door_free) */
    uint32_t n = d->index.map ? index_number(d, key, len, hash) : 0;
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
    d->keys.tab[i] = (struct entry){.hash = hash, .ref = n ? n : (uint32_t)d->keys.nown, .state = K_FREE, .borrowed = n != 0};
    d->keys.used++;
    return &d->keys.tab[i];
}

static struct entry *find_or_insert(struct door *d, const char *key, uint32_t len)
{
    uint32_t hash = monarch_crc32(key, len);
    struct entry *e = find(d, key, len, hash);
    return e ? e : insert(d, key, len, hash);
}
