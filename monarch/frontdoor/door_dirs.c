/* Part of front_door.c, one translation unit (what it gives the other parts: door_dirs.h). Here: a
 * thread's directories of a tier kept open by their path (struct dir_cache). The peer lanes write
 * files across a dataset's directories in a shuffled order: with only the last directory kept, most
 * files cost a walk from the tier's top (three opens, two closes for "0/class_007/x"); kept by
 * path, a file costs none, and a directory not kept one open from its parent's (kept too). Each
 * cache is its thread's alone: no lock. */
#include "door_dirs.h"


/* The slot of the directory named by ``key``'s first ``len`` bytes, or -1. */
static int dirs_find(const struct dir_cache *c, const char *key, uint32_t len)
{
    for (int i = 0; i < c->n; i++)
        if (!c->s[i].orphan && c->s[i].len == len && !memcmp(c->s[i].key, key, len))
            return i;
    return -1;
}

/* Slot ``i`` closed and forgotten. */
static void dirs_evict(struct dir_cache *c, int i)
{
    close(c->s[i].fd);
    free(c->s[i].key);
    c->s[i] = c->s[--c->n];
}

/* A free slot: a new one, or the least recently used of those not pinned (closed); -1 if every
 * one is pinned. */
static int dirs_slot(struct dir_cache *c)
{
    if (c->n < DIR_CACHE)
        return c->n++;
    int lru = -1;
    for (int i = 0; i < c->n; i++)
        if (!c->s[i].pins && (lru < 0 || c->s[i].used < c->s[lru].used))
            lru = i;
    if (lru < 0)
        return -1;
    close(c->s[lru].fd);
    free(c->s[lru].key);
    return lru;
}

/* A directory went meanwhile (a file's create in it found none): every one kept is opened afresh
 * by the next dirs_get (its parents may have gone too); those pinned are closed when let go. */
static void dirs_forget_all(struct dir_cache *c)
{
    for (int i = c->n; i-- > 0;)
        if (c->s[i].pins)
            c->s[i].orphan = 1;
        else
            dirs_evict(c, i);
}

/* The directory of ``tier`` that ``key``'s first ``len`` bytes name ("0/d": "<tier>/0/d"; 0: the
 * tier itself), opened one component at a time with O_NOFOLLOW from its parent, each made 0700 if
 * missing (os.makedirs under a tier): a symlink planted inside the tier cannot send a file
 * elsewhere. Kept, and pinned until dirs_put: its descriptor, or -1. */
static int dirs_get(struct dir_cache *c, const char *tier, const char *key, uint32_t len)
{
    const int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    if (!c->tier || strcmp(c->tier, tier) != 0) {  /* another tier: what is kept is not its */
        dirs_forget_all(c);
        free(c->tier);
        if (!(c->tier = strdup(tier)))
            return -1;
    }
    int i = dirs_find(c, key, len);
    if (i >= 0) {
        c->s[i].pins++;
        c->s[i].used = ++c->clock;
        return c->s[i].fd;
    }
    int fd = -1;
    if (!len) {
        fd = open(tier, flags);
    } else {
        const char *slash = memrchr(key, '/', len);
        uint32_t plen = slash ? (uint32_t)(slash - key) : 0;
        const char *name = slash ? slash + 1 : key;
        size_t n = len - (size_t)(name - key);
        char part[NAME_MAX + 1];
        int parent = n > 0 && n <= NAME_MAX ? dirs_get(c, tier, key, plen) : -1;  /* valid_key: no "." or ".." */
        if (parent < 0)
            return -1;
        memcpy(part, name, n);
        part[n] = 0;
        fd = openat(parent, part, flags);
        if (fd < 0 && errno == ENOENT && (mkdirat(parent, part, 0700) == 0 || errno == EEXIST))
            fd = openat(parent, part, flags);
        dirs_put(c, parent);
    }
    char *copy = fd >= 0 ? malloc(len + 1) : NULL;
    int slot = copy ? dirs_slot(c) : -1;
    if (slot < 0) {                    /* not kept (every slot pinned, no memory): closed by dirs_put */
        free(copy);
        return fd;
    }
    memcpy(copy, key, len);
    copy[len] = 0;
    c->s[slot] = (struct dir_slot){.fd = fd, .pins = 1, .len = len, .used = ++c->clock, .key = copy};
    return fd;
}

/* A descriptor from dirs_get let go: unpinned (closed if it was not kept, or forgotten since). */
static void dirs_put(struct dir_cache *c, int fd)
{
    if (fd < 0)
        return;
    for (int i = 0; i < c->n; i++)
        if (c->s[i].fd == fd) {
            if (--c->s[i].pins == 0 && c->s[i].orphan)
                dirs_evict(c, i);
            return;
        }
    close(fd);
}

/* Everything kept closed (the thread is done: nothing pinned). */
static void dirs_close(struct dir_cache *c)
{
    while (c->n)
        dirs_evict(c, c->n - 1);
    free(c->tier);
    c->tier = NULL;
}
