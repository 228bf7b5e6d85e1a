/* shim_touched.h -- what shim_touched.c (a mapping's reader, seen through the pages its faults
 * brought in: where it is, and whether it reads records) gives the shim's other parts. Part of
 * monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_TOUCHED_H
#define MONARCH_SHIM_TOUCHED_H

struct monarch_mapping;
struct monarch_part;
/* a cluster's mapping: the blocks where its reader is, and ahead of it, marked WANTED */
static void monarch_mapping_want_touched_locked(struct monarch_mapping *m, struct monarch_part *pt);
/* one node's mapping: is its reader a random reader of records (the map's records)? */
static void monarch_mapping_records_locked(struct monarch_mapping *m, struct monarch_part *pt);
/* a reader is being told apart: the remapper looks again within MONARCH_RECORDS_EVERY_NS
 * (under the registry's lock) */
static int monarch_records_looking;
#define MONARCH_RECORDS_EVERY_NS 10000000ULL

#endif /* MONARCH_SHIM_TOUCHED_H */
