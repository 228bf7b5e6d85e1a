/* door_owners.h -- what door_owners.c gives the door's other parts: whose file each index entry
 * is on a sharded node (struct entry_owners, d->peer.owners, set by front_door_peers or
 * front_door_ring, under d->mu), and its look-ups. Part of front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_OWNERS_H
#define MONARCH_DOOR_OWNERS_H

/* Either Python's table, the owner of every entry, or the placement's ring, from which the door
 * finds an entry's owner itself: a bit an entry says which are this node's (8 million files: 1 MB,
 * not a table's 16 MB), another node's file is looked up on the ring when it is fetched. Both are
 * the caller's memory, read until the next front_door_peers or front_door_ring. */
struct entry_owners {
    const int16_t *table;              /* by index entry - 1: the owning node, -1 this node's; or NULL */
    const uint64_t *mine;              /* or by the ring: a bit an entry (entry - 1) set where it is this node's */
    const uint64_t *starts;            /* ring part i: hashes [starts[i], starts[i + 1]), starts[0] 0 ... */
    const int16_t *nodes;              /* ... owned by nodes[i] */
    uint32_t parts;
    uint64_t seed;                     /* the ring hash's seed (placement.py: RING_SEED) */
    uint32_t n;                        /* the entries the table or the bits cover */
    int self;                          /* this node */
};

struct door;
/* -- what the other parts call ---------------------------------------------------------- */
/* The node owning index entry ``entry`` (``o->self`` for this node's own), or -1: not known (no
 * table or ring, or not one of the entries they cover). A ring's look-up hashes the entry's key;
 * it reads the index and ``o`` only (under the lock, or on a copy of d->peer.owners). */
static int entry_owner(const struct door *d, const struct entry_owners *o, uint32_t entry);
static int entry_is_mine(const struct entry_owners *o, uint32_t entry);  /* 1: this node's own */
static uint32_t entries_mine(const struct entry_owners *o, uint32_t n);  /* of entries 1..n, this node's */
/* ``bits`` for entries 1..o->n of ``index`` (a valid one's bytes): set where the entry's key
 * hashes into a part of ``o->self``'s on ``o``'s ring. */
static void ring_bits(const unsigned char *index, const struct entry_owners *o, uint64_t *bits);

#endif /* MONARCH_DOOR_OWNERS_H */
