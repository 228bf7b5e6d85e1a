/* shim_index.h -- what shim_index.c (the snapshot index: fstat of staged copies, metadata and
 * listings answered from it) gives the shim's other parts; it installs the core's monarch_index
 * (monarch_index_state). Part of monarch_shim.c's one translation unit. */
#ifndef MONARCH_SHIM_INDEX_H
#define MONARCH_SHIM_INDEX_H

/* fstatat-style flags the index can answer for (the rest are the kernel's to judge). */
#define MONARCH_STAT_FLAGS (AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_EMPTY_PATH)

#define MONARCH_DIR_MAGIC 0x4D4F4E4449523031ULL /* "MONDIR01" */
struct monarch_dir {
    uint64_t magic;
    struct monarch_dir *self;
    int fd;              /* fdopendir's descriptor, or dirfd()'s late open of path; -1: none yet */
    uint64_t first;      /* its child records: first, count */
    uint32_t count;
    uint32_t file0, files; /* its files: the first's number, how many */
    long pos;            /* the next child record (from 0) << 32 | the next of its files (from 0) */
    char path[PATH_MAX]; /* absolute, for dirfd() */
    char name[256];      /* the last file name given, whole (its prefix, middle and suffix) */
    union {
        struct dirent d;
        struct dirent64 d64;
    } ent;
};

/* The next name of an emulated DIR into its dirent (dirent or dirent64: same fields). */
#define MONARCH_FILL_DIRENT(m, ent, ok)                                                       \
    do {                                                                                      \
        const char *name_;                                                                    \
        size_t nl_;                                                                           \
        uint64_t ino_;                                                                        \
        unsigned char type_;                                                                  \
        ok = 0;                                                                               \
        while (monarch_dir_next((m), &name_, &nl_, &ino_, &type_)) {                          \
            if (nl_ >= sizeof (ent).d_name)                                                   \
                continue;                                                                     \
            memcpy((ent).d_name, name_, nl_);                                                 \
            (ent).d_name[nl_] = '\0';                                                         \
            (ent).d_ino = ino_;                                                               \
            (ent).d_off = (m)->pos;                                                           \
            (ent).d_type = type_;                                                             \
            (ent).d_reclen = (unsigned short)((offsetof(__typeof__(ent), d_name) + nl_ + 8) & ~(size_t)7); \
            ok = 1;                                                                           \
            break;                                                                            \
        }                                                                                     \
    } while (0)

/* how a path's metadata is answered (monarch_meta_count) */
enum monarch_meta { MONARCH_META_NOT_OURS, MONARCH_META_PASS, MONARCH_META_FOUND, MONARCH_META_ABSENT };

/* ---- what the other parts call ---- */
/* stat of a staged descriptor, and of a path, from the index (the stat and stat64 forms are made by
 * one macro each) */
static void monarch_fill_stat(int fd, struct stat *st);
static void monarch_fill_stat64(int fd, struct stat64 *st);
static void monarch_fill_statx(int fd, struct statx *st);
static int monarch_staged_stat(int fd, int ver, struct stat *st);
static int monarch_staged_stat64(int fd, int ver, struct stat64 *st);
static int monarch_staged_statx(int fd, int mask, struct statx *st);
static int monarch_meta_stat(int dirfd, const char *path, int flags, unsigned ver, struct stat *buf, int *r);
static int monarch_meta_stat64(int dirfd, const char *path, int flags, unsigned ver, struct stat64 *buf, int *r);
static int monarch_meta_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *buf, int *r);
static inline const unsigned char *monarch_idx(void);
static inline int monarch_index_ready(void);
static int monarch_index_entry(uint32_t n, struct monarch_index_entry *e);
static uint32_t monarch_index_lookup(const char *key, size_t kl);
static int monarch_is_plain_file(const char *key, size_t kl);
static int monarch_on_fd(const char *path, int flags);
static inline uint64_t *monarch_extra(uint64_t *c, unsigned which);
static inline uint64_t monarch_root_bit(unsigned k);
static inline void monarch_meta_count(int how);
static int monarch_meta_answer(const char *key, size_t kl, unsigned k, int nofollow, int wants_dir,
                               struct monarch_index_entry *e, uint32_t *number);
static int monarch_meta_access(int dirfd, const char *path, int mode, int flags, int *r);
static inline struct monarch_dir *monarch_dir_of(DIR *dirp);
static int monarch_meta_opendir(int dirfd, const char *path, int fd, DIR **out);
static int monarch_dir_next(struct monarch_dir *m, const char **name, size_t *nl, uint64_t *ino,
                            unsigned char *type);  /* MONARCH_FILL_DIRENT's */

#endif /* MONARCH_SHIM_INDEX_H */
