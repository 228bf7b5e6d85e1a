/* Part of walker.c, one translation unit. Here: the index written from a finished walk
 * (walk_index_size, walk_counts, walk_build: the layout walk_run chose). It gives walker.c
 * nothing; its exports are declared in walker.py. */

EXPORT uint64_t walk_index_size(struct walk *w) { return w->size; }

EXPORT void walk_counts(struct walk *w, uint64_t *out)
{
    out[0] = w->nfiles;
    out[1] = w->ndirs;
    out[2] = w->nlinked;
}

static void place(uint32_t *buckets, uint32_t nbuckets, uint32_t hash, uint32_t number)
{
    uint32_t b = monarch_index_bucket(hash, nbuckets);
    while (buckets[b])
        b = b + 1 == nbuckets ? 0 : b + 1;
    buckets[b] = number + 1;
}

/* Write the index into ``out`` (walk_index_size bytes, any content; ``zeroed``: its room for the
 * shorts is zeros already, a fresh file's): every byte but the stats slots no file takes and the
 * shorts' room (written zeros where it is not zeroed and a slot is taken: a copy writes it out) is
 * written, in the order it fills, so that its pages are touched only as the walk's records are
 * freed and the unused stats' pages never; each directory's records freed once
 * written (the walk can only be freed after). The files the walk described take slots 1.. in their
 * order. */
EXPORT int walk_build(struct walk *w, unsigned char *out, uint64_t size, int zeroed)
{
    if (size != w->size)
        return -1;
    uint32_t nbuckets = (uint32_t)w->nbuckets;
    uint32_t *buckets = (uint32_t *)(out + MONARCH_INDEX_HEADER_SIZE);
    struct monarch_index_file *files = (struct monarch_index_file *)(out + w->files_off);
    uint32_t *ranges = (uint32_t *)(out + w->ranges_off);
    uint64_t *inos = w->inos_off ? (uint64_t *)(out + w->inos_off) : NULL;
    struct monarch_index_entry *fixed = (struct monarch_index_entry *)(out + w->entries_off);  /* number m: m - files - 1 */
    struct monarch_index_entry *stats = (struct monarch_index_entry *)(out + w->stats_off);
    char *keys = (char *)(out + w->keys_off);
    struct monarch_index_child *child = (struct monarch_index_child *)(out + w->children_off);
    uint64_t spare_base = w->keys_size - w->affix_size - w->spare_size, nchild = 0, freed = 0;  /* freed: since the last trim */
    uint32_t n = 0, name_off = 0, linked = 0, slots = 0;  /* files, name bytes, link records, stats slots written */
    struct monarch_index_affix *affix = (struct monarch_index_affix *)(out + w->affixes_off);
    uint64_t affix_base = w->keys_size - w->affix_size;
    memset(ranges + w->ndirs + 1, 0, 4 * ((w->ndirs + 1) % 2));  /* to a multiple of 8 (ranges_off is one) */
    memset(keys + w->keys_size, 0, (size_t)(w->children_off - w->keys_off - w->keys_size));
    memset(child + w->nchildren, 0, (size_t)(w->shapes_off - w->children_off - MONARCH_INDEX_CHILD_SIZE * w->nchildren));
    memset(out + w->shapes_off, 0, MONARCH_INDEX_ENTRY_SIZE * w->ndirs);  /* no shape yet */

    for (size_t j = 0; j < w->ndirs; j++) {
        struct dir *d = w->dirs[j];
        struct monarch_index_entry *r = &fixed[j];
        *r = d->self;
        r->hash = monarch_crc32(d->key, d->key_len);
        r->key_len = d->key_len;
        r->key_off = w->names_size + d->key_off;
        memcpy(keys + r->key_off, d->key, d->key_len);
        r->children = nchild;
        if (!d->unlisted) {
            r->flags = MONARCH_INDEX_FLAG_LISTED;
            child[nchild++] = (struct monarch_index_child){.d_ino = d->self.ino, .d_type = DT_DIR};
            child[nchild++] = (struct monarch_index_child){.d_ino = d->parent_ino, .d_type = DT_DIR};
        }
        ranges[j] = n;
        affix[j] = (struct monarch_index_affix){(uint32_t)(affix_base + d->affix_off), d->prefix, d->suffix};
        uint32_t subs = 0, spares = 0, affixed = d->prefix + d->suffix;
        for (uint32_t i = 0; i < d->n; i++) {
            struct ent *e = &d->ents[i];
            const char *name = d->names + e->name_off;
            if (e->kind == K_FILE || e->kind == K_LINKED_FILE) {  /* name, record, inode, stat if described */
                const struct stated want = {e->name_off, NULL}, *st = !d->nstated ? NULL :  /* none: a listing's */
                    bsearch(&want, d->stated, d->nstated, sizeof *st, by_name_off);  /* (bsearch may be a macro) */
                const struct monarch_index_entry *desc = d->recs ? &d->recs[i] : st ? st->e : NULL;
                uint32_t mid_len = e->name_len;  /* its middle: its own bytes (keep_middles) */
                if (n == ranges[j] && affixed)  /* the directory's prefix and suffix, once */
                    memcpy(keys + affix[j].off, d->names + d->affix_at, affixed);
                memcpy(keys + name_off, name, mid_len);
                files[n] = (struct monarch_index_file){.name_off = name_off};
                if (inos)  /* a listing that failed names nothing */
                    inos[w->one_ino ? 0 : n] = d->unlisted ? 0 : e->d_ino;
                if (desc) {
                    struct monarch_index_entry *s = &stats[slots];
                    *s = *desc;  /* (its flags, link, nchildren 0) */
                    s->hash = 0, s->key_len = mid_len, s->key_off = name_off, s->children = n + 1;
                    if (e->kind == K_LINKED_FILE)
                        s->flags = MONARCH_INDEX_FLAG_SYMLINK, s->link = (uint32_t)(w->nfiles + w->ndirs + linked + 1);
                    files[n].stat = ++slots;
                }
                if (e->kind == K_LINKED_FILE) {  /* its own lstat, after the directories */
                    struct monarch_index_entry *l = &fixed[w->ndirs + linked++];
                    *l = d->recs ? *st->e : st->e[1];
                    l->hash = 0, l->key_len = mid_len, l->key_off = name_off, l->children = n + 1;
                }
                name_off += mid_len;
                n++;
            } else if (!d->unlisted) {  /* a child record: a subdirectory, or a name no entry has */
                struct monarch_index_child *c = &child[nchild++];
                *c = (struct monarch_index_child){.d_ino = e->d_ino, .name_len = e->name_len, .d_type = e->d_type};
                if (e->kind == K_DIR) {  /* its name: its key's tail */
                    struct dir *sub = d->subs[subs++];
                    c->name_off = w->names_size + sub->key_off + sub->key_len - e->name_len;
                    c->entry = (uint32_t)(w->nfiles + 1 + sub->number);
                } else {  /* written by each directory that has it: the same bytes */
                    c->name_off = spare_base + d->spare[spares++];
                    memcpy(keys + c->name_off, name, e->name_len);
                }
            }
        }
        r->nchildren = (uint32_t)(nchild - r->children);
        freed += drop_names(d);  /* the rest of d stays: its key, its number (a parent's child record's) */
        if (freed >= TRIM_BYTES) {     /* given back as the index takes its place: the peak stays the index */
            malloc_trim(0);
            freed = 0;
        }
    }
    ranges[w->ndirs] = n;
    if (!zeroed && slots)  /* the shorts' room lies inside the used end, which a copy writes out */
        memset(out + w->shapes_off + MONARCH_INDEX_ENTRY_SIZE * w->ndirs, 0, 8 * MONARCH_INDEX_SHORT_ROOM * w->nfiles);
    /* the buckets last (the directories': a file is found by name in its directory's range) */
    malloc_trim(0);
    memset(buckets, 0, 4 * w->nbuckets);
    for (size_t j = 0; j < w->ndirs; j++)
        place(buckets, nbuckets, fixed[j].hash, (uint32_t)(w->nfiles + j));
    *(struct monarch_index_header *)out = (struct monarch_index_header){  /* sizes_off 0: a size is its stat's */
        .magic = MONARCH_INDEX_MAGIC, .version = MONARCH_INDEX_VERSION, .entries = (uint32_t)w->total,
        .buckets = (uint32_t)w->nbuckets, .reserved = (!w->describe && !w->described ? MONARCH_INDEX_LISTING : 0)
                                                    | (w->one_ino ? MONARCH_INDEX_INOS_ONE : 0),
        .buckets_off = MONARCH_INDEX_HEADER_SIZE, .entries_off = w->entries_off, .keys_off = w->keys_off,
        .keys_size = w->keys_size, .children_off = w->children_off, .children_count = nchild,
        .files = (uint32_t)w->nfiles, .stats_used = slots, .files_off = w->files_off, .stats_off = w->stats_off,
        .size = w->size, .dirs = (uint32_t)w->ndirs, .names_size = w->names_size, .ranges_off = w->ranges_off,
        .inos_off = w->inos_off};
    return 0;
}
