/* door_index.h -- what door_index.c (the snapshot's index, read in place) gives the door's other
 * parts: a file's facts as the door needs them, the mapping (struct door_index, d->index: set
 * once by front_door_open / front_door_open_memory, read without the lock after) and its
 * look-ups. Part of front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_INDEX_H
#define MONARCH_DOOR_INDEX_H

struct idx_file {                      /* what the door needs of a described number's stat */
    uint64_t size;
    int64_t mtime;
    uint32_t mode, flags;              /* flags: the entry's, its route among them (monarch_wire.h) */
    uint32_t entry;                    /* its number, from 1 (files first, in the snapshot's order) */
};

struct door_index {                    /* the snapshot's index (the file the shim maps: protocol.build_index) */
    const unsigned char *map;          /* NULL until it is opened */
    size_t len;
    int borrowed;                      /* the daemon's own copy (front_door_open_memory): not unmapped here */
};

#define INDEX_KEY_MAX MONARCH_INDEX_KEY_MAX  /* a key built from the index: "<k>/" and a path */

struct door;
/* -- what the other parts call ---------------------------------------------------------- */
static uint32_t index_number(const struct door *d, const char *key, uint32_t len, uint32_t hash);  /* 0: none */
/* a described number's facts, its key built into ``key`` (INDEX_KEY_MAX bytes; NULL: not wanted) */
static int index_entry(const struct door *d, uint32_t n, struct idx_file *out, char *key, uint32_t *len);
static int index_file(const struct door *d, const char *key, uint32_t len, struct idx_file *out);
static int index_is_key(const struct door *d, uint32_t n, const char *key, uint32_t len, uint32_t hash);
static uint32_t index_key(const struct door *d, uint32_t n, char *key);  /* its length; 0: no such key */
static int index_valid(const unsigned char *x, size_t n);  /* a mapping's tables lie inside it */
static struct monarch_index_header index_header(const unsigned char *x);  /* a valid one's */
/* file ``n``'s directory: its number in *m, and its stat, or NULL if the index describes none */
static const unsigned char *index_dir_stat(const struct door *d, uint32_t n, uint32_t *m);
/* directory ``j`` (from 0, of index_dirs): its key and its first file, or NULL if it holds none */
static const char *index_dir_key(const struct door *d, uint32_t j, uint32_t *len, uint32_t *first);
static uint32_t index_dirs(const struct door *d);
static size_t index_entries(const struct door *d);  /* its files and directories: the numbers index_number gives */
/* the number (from 1) of ``key`` if it is a file not described yet and the door may describe it (the
 * index is the daemon's own, the routes known), else 0; and that description (its stat slot) */
static uint32_t index_listed(const struct door *d, const char *key, uint32_t len, uint32_t hash);
static int index_listed_number(const struct door *d, uint32_t n);  /* the same test, by number */
static void index_describe(struct door *d, uint32_t n, const struct stat *st);
static void index_describe_fields(struct door *d, uint32_t n, struct monarch_index_entry *f);  /* another node's stat */

#endif /* MONARCH_DOOR_INDEX_H */
