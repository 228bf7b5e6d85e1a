/* door_keys.h -- what door_keys.c (the key table) gives the door's other parts: a key's states,
 * its slot, the table (struct door_keys, d->keys, under d->mu) and its look-ups. Part of
 * front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_KEYS_H
#define MONARCH_DOOR_KEYS_H

/* A key is in one state: absent (K_FREE, never asked: the door may copy it), BUSY (the door copies
 * or fetches it now), STAGED (answerable), or PYTHON (anything else: handed over). */
enum { K_FREE = 0, K_PYTHON = 1, K_BUSY = 2, K_STAGED = 3 };

struct entry {                         /* one key the door has heard of: 16 bytes (a million keys, two million slots) */
    uint32_t hash;
    uint32_t ref;                      /* 0: a free slot; its key: the index's entry ``ref`` (from 1) when
                                          borrowed (a million staged files cost no copy of their keys),
                                          else the door's own copy, own[ref - 1] */
    uint8_t state, slot, borrowed, ring;  /* ring: a STAGED copy of the peer read-ahead lane's (BUSY: on its way) */
    uint32_t answered;                 /* when the door last answered it: door_ms (front_door_evict), 0 never */
};
_Static_assert(sizeof(struct entry) == 16, "the key table's slot");

struct own_key {                       /* a key not in the index (asked before the index was open) */
    char *key;
    uint32_t len;
};

struct door_keys {                     /* the table: open addressing; entries change state, never go */
    struct entry *tab;
    size_t cap, used;
    struct own_key *own;               /* the keys the table does not borrow from the index */
    size_t nown, cap_own;
};

struct door;
/* -- what the other parts call (under d->mu) --------------------------------------------- */
static struct entry *find(struct door *d, const char *key, uint32_t len, uint32_t hash);  /* NULL: never heard of */
static struct entry *insert(struct door *d, const char *key, uint32_t len, uint32_t hash); /* NULL: no memory */
static struct entry *find_or_insert(struct door *d, const char *key, uint32_t len);
static int reserve_keys(struct door *d, size_t keys);  /* room for this many keys, before the workers start */
static int entry_is(const struct door *d, const struct entry *e, const char *key, uint32_t len, uint32_t hash);

#endif /* MONARCH_DOOR_KEYS_H */
