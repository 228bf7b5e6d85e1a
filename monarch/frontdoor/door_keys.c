/* Part of front_door.c, one translation unit: included there, in order, after the types and the
 * parts before it. Here: the key table: every key the door has heard of, in one open-addressing
 * table. */

/* -- the key table (open addressing; entries change state, never go) ------------------- */
static const char *entry_key(const struct door *d, const struct entry *e, uint32_t *len)
{
    if (e->borrowed)
        return index_entry_key(d, e->ref, len);  /* checked when it was inserted */
    *len = d->own[e->ref - 1].len;
    return d->own[e->ref - 1].key;
}

static struct entry *find(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    if (!d->cap)
        return NULL;
    for (size_t i = hash & (d->cap - 1);; i = (i + 1) & (d->cap - 1)) {
        struct entry *e = &d->tab[i];
        if (!e->ref)
            return NULL;
        uint32_t elen;
        const char *ekey;
        if (e->hash == hash && (ekey = entry_key(d, e, &elen)) && elen == len && !memcmp(ekey, key, len))
            return e;
    }
}

/* Room for ``keys`` keys at most half the slots full; 0, or -1 if it could not be made. */
static int reserve_keys(struct door *d, size_t keys)
{
    if (2 * keys > d->cap) {
        size_t cap = d->cap ? d->cap : 1024;
        while (2 * keys > cap)
            cap *= 2;
        struct entry *tab = calloc(cap, sizeof *tab);
        if (!tab)
            return -1;
        for (size_t j = 0; j < d->cap; j++) {
            if (!d->tab[j].ref)
                continue;
            size_t i = d->tab[j].hash & (cap - 1);
            while (tab[i].ref)
                i = (i + 1) & (cap - 1);
            tab[i] = d->tab[j];
        }
        free(d->tab);
        d->tab = tab;
        d->cap = cap;
    }
    return 0;
}

static struct entry *insert(struct door *d, const char *key, uint32_t len, uint32_t hash)
{
    if (reserve_keys(d, d->used + 1) != 0)
        return NULL;
    size_t i = hash & (d->cap - 1);
    while (d->tab[i].ref)
        i = (i + 1) & (d->cap - 1);
    /* a key of the index is its entry's number (the index is mapped until front_door_free) */
    uint32_t elen, n = d->idx ? index_number(d, key, len, hash) : 0;
    if (n && !index_entry_key(d, n, &elen))
        n = 0;
    if (!n) {
        if (d->nown == d->cap_own) {
            size_t cap = d->cap_own ? 2 * d->cap_own : 64;
            struct own_key *own = realloc(d->own, cap * sizeof *own);
            if (!own)
                return NULL;
            d->own = own;
            d->cap_own = cap;
        }
        char *copy = malloc(len ? len : 1);
        if (!copy)
            return NULL;
        memcpy(copy, key, len);
        d->own[d->nown++] = (struct own_key){copy, len};
    }
    d->tab[i] = (struct entry){.hash = hash, .ref = n ? n : (uint32_t)d->nown, .state = K_FREE, .borrowed = n != 0};
    d->used++;
    return &d->tab[i];
}

static struct entry *find_or_insert(struct door *d, const char *key, uint32_t len)
{
    uint32_t hash = monarch_crc32(key, len);
    struct entry *e = find(d, key, len, hash);
    return e ? e : insert(d, key, len, hash);
}
