/* door_dirs.h -- what door_dirs.c gives the door's other parts: a thread's directories of one
 * tier, kept open by their path (struct dir_cache: each thread's own, no lock). Part of
 * front_door.c's one translation unit. */
#ifndef MONARCH_DOOR_DIRS_H
#define MONARCH_DOOR_DIRS_H

#define DIR_CACHE 32                   /* directories a thread keeps open */
struct dir_slot {
    int fd, pins;                      /* pins: its users now (dirs_get, dirs_put) */
    int orphan;                        /* not looked up any more: closed once no one holds it */
    uint32_t len;
    uint64_t used;                     /* when last asked for: the least recent goes first */
    char *key;                         /* its path under the tier ("0/d"; "": the tier itself) */
};
struct dir_cache {                     /* one thread's directories of one tier, kept open by path */
    char *tier;
    uint64_t clock;
    int n;
    struct dir_slot s[DIR_CACHE];
};

/* -- what the other parts call ---------------------------------------------------------- */
static int dirs_get(struct dir_cache *c, const char *tier, const char *key, uint32_t len);  /* pinned, or -1 */
static void dirs_put(struct dir_cache *c, int fd);   /* unpinned */
static void dirs_forget_all(struct dir_cache *c);    /* none looked up again (a tier emptied) */
static void dirs_close(struct dir_cache *c);

#endif /* MONARCH_DOOR_DIRS_H */
