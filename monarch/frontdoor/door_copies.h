/* door_copies.h -- what door_copies.c gives the door's other parts: one copy from the PFS into the
 * copy tier, published atomically (a temporary name beside it, the source's mtime and an owner-only
 * mode, a rename), made by a worker or a copier with its own directories kept open (in struct
 * worker: door.h). It owns no state of the door's: the counters it adds to are d->count's, the
 * room it takes d->books'. Part of front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_COPIES_H
#define MONARCH_DOOR_COPIES_H

struct worker;
struct idx_file;
/* -- what the other parts call ---------------------------------------------------------- */
/* ``key`` (BUSY, its size taken from the lease) copied and published, or given to Python: the
 * slot it was published in (``dest``: its path), or -1 */
static int copy_and_publish(struct worker *w, const char *key, uint32_t len, uint32_t hash, const struct idx_file *f,
                            uint32_t kind, char *dest);
static void close_cached_dirs(struct worker *w);   /* the worker's directories, closed */
/* the worker's descriptor of ``key``'s directory (its first ``dlen`` bytes) as ``open_dir`` opens it, kept */
static int cached_dir(int *fd, char *for_key, uint32_t *for_len, const char *key, uint32_t dlen,
                      int (*open_dir)(struct worker *, const char *, uint32_t), struct worker *w);
/* entry ``n`` of ``key`` (index_listed) described from the PFS: 1, or 0 if it is no regular file now */
static int describe_listed(struct worker *w, const char *key, uint32_t len, uint32_t n, int in_order, int by_name);
/* the same by the name's lstat alone (a metadata call's DESCRIBE: nothing to copy) */
static int describe_named(struct worker *w, const char *key, uint32_t len, uint32_t n);
/* whom listed entry ``n``'s stat is asked of: another node that owns it (sharded), else none (the PFS) */
static struct owner_ask owner_ask_locked(const struct door *d, uint32_t n);
/* entry ``n`` described from its owner's index over the data path, with its next listed files of that
 * owner (DESCRIBE_AHEAD in all at most): 1, or 0 (the caller asks the PFS) */
#define DESCRIBE_AHEAD 32
/* an owner copying a file a worker waits on (DP_COMING) is asked again for this long at most: a
 * copy waits behind the lane's copies in flight, one open of the PFS each */
#define COMING_WAIT_MS 1000
static int described_when_copied(struct worker *w, const struct owner_ask *ask, const char *key, uint32_t len, uint32_t n);
static int describe_from_owner(struct worker *w, const struct owner_ask *ask, const char *key, uint32_t len, uint32_t n);

#endif /* MONARCH_DOOR_COPIES_H */
