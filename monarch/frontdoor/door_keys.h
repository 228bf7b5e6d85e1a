/* door_keys.h -- what door_keys.c (the key table) gives the door's other parts: a key's states,
 * its slot, the table (struct door_keys, d->keys, under d->mu) and its look-ups. Part of
 * front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_KEYS_H
#define MONARCH_DOOR_KEYS_H

/* A key is in one state: absent (K_FREE, never asked: the door may copy it), BUSY (the door copies
 * or fetches it now), STAGED (answerable), or PYTHON (anything else: handed over). */
enum { K_FREE = 0, K_PYTHON = 1, K_BUSY = 2, K_STAGED = 3 };
#define ANSWERED_BITS 22
#define ANSWERED_MASK ((1u << ANSWERED_BITS) - 1)

/* One key the door has heard of: 4 bytes (at every entry of a large index, 4 bytes a file). Its
 * fields are bits of one word, written under d->mu only. */
struct entry {
    uint32_t state : 2;                /* K_* */
    uint32_t held : 2;                 /* H_NONE: no key here; H_INDEX: the index's entry; H_OWN: the door's copy */
    uint32_t ring : 1;                 /* ring: a STAGED copy of the peer read-ahead lane's (BUSY: on its way) */
    uint32_t slot : 5;                 /* the tier (or peer area) of a STAGED copy */
    uint32_t answered : ANSWERED_BITS; /* when the door last answered it: door_ms's low bits, 0 never */
};
_Static_assert(sizeof(struct entry) == 4, "a key's record");
_Static_assert(MONARCH_MAX_SLOTS <= 32, "a slot fits its 5 bits");
enum { H_NONE = 0, H_INDEX = 1, H_OWN = 2 };

/* ``answered`` keeps door_ms's low 22 bits (it wraps every 70 minutes): the graces it is compared
 * with are under a second, so an entry answered a multiple of 70 minutes ago looks fresh only
 * within such a grace of it (one eviction in about 8,000 put off, never a wrong answer). */
static inline void mark_answered(struct entry *e, uint32_t now_ms)
{
    uint32_t a = now_ms & ANSWERED_MASK;
    e->answered = a ? a : 1;           /* (0: never answered) */
}

static inline uint32_t answered_ago_ms(const struct entry *e, uint32_t now_ms)
{
    return (now_ms - e->answered) & ANSWERED_MASK;
}

struct key_slot {                      /* a slot of the table by hash: 12 bytes (a million keys, two million slots) */
    uint32_t hash;
    uint32_t ref;                      /* 0: a free slot; its key: the index's entry ``ref`` (from 1) when
                                          e.held is H_INDEX (a million staged files cost no copy of their
                                          keys), else the door's own copy, own[ref - 1] */
    struct entry e;
};
_Static_assert(sizeof(struct key_slot) == 12, "the key table's slot");

struct own_key {                       /* a key not in the index (asked before the index was open) */
    char *key;
    uint32_t len;
};

/* The keys: a table by hash (open addressing: entries change state, never go) while they are few
 * against the index; once the table would take more room than a record for every entry of the
 * index, the index's keys move to ``dense``, a record at each entry (4 bytes a file of the index,
 * its pages touched where keys are), and the table keeps the door's own keys only. */
struct door_keys {
    struct key_slot *tab;
    size_t cap, used;                  /* the table's slots, its keys */
    struct entry *dense;               /* by index entry - 1, or NULL (the table holds every key) */
    size_t ndense;                     /* its entries (the index's files and directories) */
    struct own_key *own;               /* the keys the table does not borrow from the index */
    size_t nown, cap_own;
};

struct door;
/* -- what the other parts call (under d->mu) --------------------------------------------- */
static struct entry *find(struct door *d, const char *key, uint32_t len, uint32_t hash);  /* NULL: never heard of */
static struct entry *insert(struct door *d, const char *key, uint32_t len, uint32_t hash); /* NULL: no memory */
static struct entry *find_or_insert(struct door *d, const char *key, uint32_t len);
static int reserve_keys(struct door *d, size_t keys);  /* room for this many keys, before the workers start */
static size_t key_room(const struct door *d);          /* the bytes the keys' records take (their slots) */

#endif /* MONARCH_DOOR_KEYS_H */
