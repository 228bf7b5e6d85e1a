/* Part of monarch_shim.c, one translation unit: included there, in order, after the
 * declarations it uses. Here: the exported wrappers: families by macro, emulated DIRs, descriptor lifecycle. */

/* ---- wrapper families: one macro shape per family ---- */

#define MONARCH_VA_MODE(flags)                                      \
    mode_t mode = 0;                                                \
    if (__OPEN_NEEDS_MODE(flags)) {                                 \
        va_list ap;                                                 \
        va_start(ap, flags);                                        \
        mode = (mode_t)va_arg(ap, int);                             \
        va_end(ap);                                                 \
    }

#define MONARCH_OPEN_BODY(name, dirfd, args, wbmode)                 \
    MONARCH_REAL(name, -1)                                           \
    monarch_blocks_resume();                                         \
    int fd_ = -1;                                                    \
    uint32_t entry_ = 0;                                             \
    if (MONARCH_UNLIKELY(monarch_nwb) && monarch_wb_open(dirfd, path, flags, wbmode, &fd_)) \
        return fd_;                                                  \
    if (MONARCH_WRITES(flags))                                       \
        monarch_invalidate(dirfd, path);                             \
    int how_ = monarch_before(dirfd, path, flags, &fd_, &entry_);    \
    if (how_ > MONARCH_SLOT_PFS) {                                   \
        monarch_track(fd_, (unsigned)how_, entry_);                  \
        return fd_;                                                  \
    }                                                                \
    if (how_ == MONARCH_HOW_EIO) {                                   \
        errno = EIO;                                                 \
        return -1;                                                   \
    }                                                                \
    fd_ = real_ args;                                                \
    monarch_after(fd_, how_);                                        \
    return fd_;

/* int open(const char *path, int flags, ...) */
#define MONARCH_WRAP_OPEN(name)                                                   \
    static int (*real_##name)(const char *, int, ...);                           \
    MONARCH_EXPORT int name(const char *path, int flags, ...)                     \
    {                                                                             \
        MONARCH_VA_MODE(flags)                                                    \
        MONARCH_OPEN_BODY(name, AT_FDCWD, (path, flags, mode), mode)              \
    }

/* int __open_2(const char *path, int flags)  (fortified, no mode) */
#define MONARCH_WRAP_OPEN_2(name)                                                 \
    static int (*real_##name)(const char *, int);                                \
    MONARCH_EXPORT int name(const char *path, int flags)                          \
    {                                                                             \
        MONARCH_OPEN_BODY(name, AT_FDCWD, (path, flags), 0)                       \
    }

/* int openat(int dirfd, const char *path, int flags, ...) */
#define MONARCH_WRAP_OPENAT(name)                                                 \
    static int (*real_##name)(int, const char *, int, ...);                      \
    MONARCH_EXPORT int name(int dirfd, const char *path, int flags, ...)          \
    {                                                                             \
        MONARCH_VA_MODE(flags)                                                    \
        MONARCH_OPEN_BODY(name, dirfd, (dirfd, path, flags, mode), mode)          \
    }

/* int __openat_2(int dirfd, const char *path, int flags)  (fortified) */
#define MONARCH_WRAP_OPENAT_2(name)                                               \
    static int (*real_##name)(int, const char *, int);                           \
    MONARCH_EXPORT int name(int dirfd, const char *path, int flags)               \
    {                                                                             \
        MONARCH_OPEN_BODY(name, dirfd, (dirfd, path, flags), 0)                   \
    }

/* FILE *fopen(const char *path, const char *mode); modes w, a and + write. */
#define MONARCH_WRAP_FOPEN(name)                                                  \
    static FILE *(*real_##name)(const char *, const char *);                     \
    MONARCH_EXPORT FILE *name(const char *path, const char *mode)                 \
    {                                                                             \
        MONARCH_REAL(name, NULL)                                                  \
        FILE *wbf_;                                                               \
        if (MONARCH_UNLIKELY(monarch_nwb) && monarch_wb_fopen(path, mode, &wbf_)) \
            return wbf_;                                                          \
        int fd_ = -1, flags = monarch_fopen_flags(mode);                          \
        uint32_t entry_ = 0;                                                      \
        if (flags < 0 && mode)                                                    \
            monarch_invalidate(AT_FDCWD, path);                                   \
        int how_ = flags < 0 ? -1 : monarch_before(AT_FDCWD, path, flags, &fd_, &entry_); \
        if (how_ == MONARCH_HOW_EIO) {                                            \
            errno = EIO;                                                          \
            return NULL;                                                          \
        }                                                                         \
        if (how_ > MONARCH_SLOT_PFS) {                                            \
            int saved_ = errno;                                                   \
            FILE *fp_ = MONARCH_RESOLVE(fdopen)(fd_, mode); /* not tracked yet */ \
            if (fp_) {                                                            \
                monarch_track(fd_, (unsigned)how_, entry_);                       \
                monarch_mark_uncounted(fd_, MONARCH_UNSEEN_STDIO); /* its own __read */ \
                return fp_;                                                       \
            }                                                                     \
            real_close(fd_);                                                      \
            errno = saved_;                                                       \
            how_ = MONARCH_SLOT_PFS;                                              \
        }                                                                         \
        if (how_ == MONARCH_SLOT_PFS && monarch_part_pending && !strchr(mode, ',')) { \
            /* staged by blocks: opened here, and a FILE reading through the shim */ \
            fd_ = MONARCH_RESOLVE(openat)(AT_FDCWD, path, flags);                 \
            monarch_after(fd_, how_);                                             \
            FILE *fp_ = fd_ < 0 ? NULL : monarch_stdio_file(fd_, mode);           \
            if (!fp_ && fd_ >= 0) {                                               \
                int saved_ = errno;                                               \
                close(fd_);                                                       \
                errno = saved_;                                                   \
            }                                                                     \
            return fp_;                                                           \
        }                                                                         \
        FILE *fp_ = real_(path, mode);                                            \
        monarch_after(fp_ ? fileno(fp_) : -1, how_);                              \
        if (fp_ && how_ == MONARCH_SLOT_PFS)                                      \
            monarch_mark_uncounted(fileno(fp_), MONARCH_UNSEEN_STDIO);            \
        return fp_;                                                               \
    }

/* Byte-counting I/O: the result (> 0) is added to the slot of descriptor fd. A descriptor of
 * a file staged by blocks is read from its copy where `local` (a monarch_part_* read, or 0)
 * serves the call, its result in l_ (shim_blocks.c). */
#define MONARCH_WRAP_IO(name, ret, fd, params, args, local)                       \
    static ret(*real_##name) params;                                              \
    MONARCH_EXPORT ret name params                                                \
    {                                                                             \
        MONARCH_REAL(name, -1)                                                    \
        ssize_t l_ = 0;                                                           \
        monarch_blocks_resume();                                                  \
        if (MONARCH_UNLIKELY(monarch_part_of(fd))) {                              \
            if (local)                                                            \
                return (ret)l_;                                                   \
            monarch_part_reads_pfs(fd);                                           \
        }                                                                         \
        ret n_ = real_ args;                                                      \
        if (n_ > 0) {                                                             \
            monarch_count_bytes(fd, (uint64_t)n_);                                \
            monarch_part_pfs_bytes(fd, (ssize_t)n_);                              \
        }                                                                         \
        return n_;                                                                \
    }

/* stdio reads that deliver a count of items: size * items returned are added to the slot
 * of the FILE's descriptor (the open is already uncounted: stdio may read it otherwise); a
 * FILE of the shim's (shim_stdio.c) counted its reads itself. */
#define MONARCH_WRAP_FREAD(name, size, fp, params, args)                          \
    static size_t(*real_##name) params;                                           \
    MONARCH_EXPORT size_t name params                                             \
    {                                                                             \
        MONARCH_REAL(name, 0)                                                     \
        size_t n_ = real_ args;                                                   \
        if (n_ > 0 && !monarch_stdio_of(fp))                                      \
            monarch_count_file(fp, (uint64_t)n_ * (size));                        \
        return n_;                                                                \
    }

/* Calls that change what a path names (creat, rename, unlink, rmdir, truncate): under a
 * write-back path, `wb` makes the change in the daemon's view (its result, or NOT_OURS: not such
 * a call, or no daemon); else invalidate (d1, p1) and (d2, p2) (p2 NULL: one path), then the
 * real call. */
#define MONARCH_WRAP_CHANGE(name, params, args, d1, p1, d2, p2, wb)               \
    static int (*real_##name) params;                                             \
    MONARCH_EXPORT int name params                                                \
    {                                                                             \
        MONARCH_REAL(name, -1)                                                    \
        MONARCH_WB_CHANGE(wb)                                                     \
        monarch_invalidate2(d1, p1, d2, p2);                                      \
        return real_ args;                                                        \
    }

/* stat of a descriptor: a staged copy's from the index alone (monarch_staged_<type>), else
 * the real call, then the source's stat if fd is a staged copy; `type` picks the fill, `ver`
 * is __fxstat's version. */
#define MONARCH_WRAP_STAT(name, type, fd, ver, params, args)                      \
    static int (*real_##name) params;                                             \
    MONARCH_EXPORT int name params                                                \
    {                                                                             \
        if (monarch_staged_##type(fd, ver, buf))                                  \
            return 0;                                                             \
        MONARCH_REAL(name, -1)                                                    \
        int r_ = real_ args;                                                      \
        if (r_ == 0)                                                              \
            monarch_fill_##type(fd, buf);                                         \
        return r_;                                                                \
    }

/* Calls that change a file through its descriptor (fchmod, fchown, futimens). */
#define MONARCH_WRAP_FDCHANGE(name, fd, params, args)                             \
    static int (*real_##name) params;                                             \
    MONARCH_EXPORT int name params                                                \
    {                                                                             \
        MONARCH_REAL(name, -1)                                                    \
        monarch_invalidate_fd(fd);                                                \
        return real_ args;                                                        \
    }

/* stat of a path, in every ABI form (stat, __xstat, fstatat, statx ...): from the index
 * when it answers (monarch_meta_<type>); with AT_EMPTY_PATH and "" the stat of dirfd
 * itself, the source's for a staged copy. `ver` is __xstat's version (statx: its mask). */
#define MONARCH_WRAP_PSTAT(name, type, dirfd, path, flags, ver, params, args)      \
    static int (*real_##name) params;                                             \
    MONARCH_EXPORT int name params                                                \
    {                                                                             \
        int r_, wbmode_ = -1, wbtries_ = 0;                                       \
        const char *wbpath_ = path;                                               \
    wbagain_:                                                                     \
        MONARCH_WB_VIEW(dirfd, path, 0, -1, &wbmode_)                             \
        if (monarch_on_fd(path, flags)) {                                         \
            if (!(flags & ~MONARCH_STAT_FLAGS) && monarch_staged_##type(dirfd, (int)(ver), buf)) \
                return 0;                                                         \
            MONARCH_REAL(name, -1)                                                \
            r_ = real_ args;                                                      \
            if (r_ == 0)                                                          \
                monarch_fill_##type(dirfd, buf);                                  \
            return r_;                                                            \
        }                                                                         \
        if (monarch_meta_##type(dirfd, path, flags, ver, buf, &r_))               \
            return r_;                                                            \
        MONARCH_REAL(name, -1)                                                    \
        r_ = real_ args;                                                          \
        if (MONARCH_UNLIKELY(wbmode_ >= 0) && r_ == 0) /* a pending file's mode */ \
            monarch_wb_mode_##type(buf, wbmode_);                                 \
        MONARCH_WB_AGAIN(r_, path, wbpath_, wbtries_, wbagain_, wbmode_ = -1)    \
        return r_;                                                                \
    }

/* access(2) and its relatives: existence (and the owner's bits) from the index. */
#define MONARCH_WRAP_ACCESS(name, dirfd, path, mode, flags, params, args)          \
    static int (*real_##name) params;                                             \
    MONARCH_EXPORT int name params                                                \
    {                                                                             \
        int r_, wbtries_ = 0;                                                     \
        const char *wbpath_ = path;                                               \
    wbagain_:                                                                     \
        MONARCH_WB_VIEW(dirfd, path, 0, -1, NULL)                                 \
        if (monarch_meta_access(dirfd, path, mode, flags, &r_))                   \
            return r_;                                                            \
        MONARCH_REAL(name, -1)                                                    \
        r_ = real_ args;                                                          \
        MONARCH_WB_AGAIN(r_, path, wbpath_, wbtries_, wbagain_, (void)0)          \
        return r_;                                                                \
    }

/* opendir/fdopendir: a listed directory under a root is listed from the index; one under a
 * write-back path as the job sees it (`wb`: the view's path for opendir's). */
#define MONARCH_WRAP_OPENDIR(name, dirfd, path, fd, params, args, wb)             \
    static DIR *(*real_##name) params;                                            \
    MONARCH_EXPORT DIR *name params                                               \
    {                                                                             \
        DIR *d_;                                                                  \
        wb                                                                        \
        if (monarch_meta_opendir(dirfd, path, fd, &d_))                           \
            return d_;                                                            \
        MONARCH_REAL(name, NULL)                                                  \
        return real_ args;                                                        \
    }

/* readdir/readdir64 (`member` picks the dirent of the emulated DIR). */
#define MONARCH_WRAP_READDIR(name, type, member)                                  \
    static struct type *(*real_##name)(DIR *);                                    \
    MONARCH_EXPORT struct type *name(DIR *dirp)                                   \
    {                                                                             \
        struct monarch_dir *m_ = monarch_dir_of(dirp);                            \
        if (m_) {                                                                 \
            int ok_;                                                              \
            MONARCH_FILL_DIRENT(m_, m_->ent.member, ok_);                         \
            return ok_ ? &m_->ent.member : NULL; /* end: errno untouched */       \
        }                                                                         \
        MONARCH_REAL(name, NULL)                                                  \
        return real_(dirp);                                                       \
    }

/* readdir_r/readdir64_r (deprecated, still called). */
#define MONARCH_WRAP_READDIR_R(name, type)                                        \
    static int (*real_##name)(DIR *, struct type *, struct type **);              \
    MONARCH_EXPORT int name(DIR *dirp, struct type *entry, struct type **result)  \
    {                                                                             \
        struct monarch_dir *m_ = monarch_dir_of(dirp);                            \
        if (m_) {                                                                 \
            int ok_;                                                              \
            MONARCH_FILL_DIRENT(m_, *entry, ok_);                                 \
            *result = ok_ ? entry : NULL;                                         \
            return 0;                                                             \
        }                                                                         \
        MONARCH_REAL(name, ENOSYS)                                                \
        return real_(dirp, entry, result);                                        \
    }

/* Every wrapped symbol, one line each. Instantiated twice: to define the
 * wrappers, and (MONARCH_RESOLVE_ALL) to resolve every real_* at start-up. */
#define MONARCH_WRAPPERS(OPEN, OPEN_2, OPENAT, OPENAT_2, FOPEN, IO, CHANGE, STAT, FDCHANGE, PSTAT, ACCESS,  \
                         OPENDIR, READDIR, READDIR_R, FREAD)                                            \
    OPEN(open)                                                                                          \
    OPEN(open64)                                                                                        \
    OPEN_2(__open_2)                                                                                    \
    OPEN_2(__open64_2)                                                                                  \
    OPENAT(openat)                                                                                      \
    OPENAT(openat64)                                                                                    \
    OPENAT_2(__openat_2)                                                                                \
    OPENAT_2(__openat64_2)                                                                              \
    FOPEN(fopen)                                                                                        \
    FOPEN(fopen64)                                                                                      \
    IO(read, ssize_t, fd, (int fd, void *b, size_t n), (fd, b, n), monarch_part_read(fd, b, n, &l_))     \
    IO(pread, ssize_t, fd, (int fd, void *b, size_t n, off_t o), (fd, b, n, o),                         \
       o >= 0 && monarch_part_pread(fd, b, n, o, &l_))                                                  \
    IO(pread64, ssize_t, fd, (int fd, void *b, size_t n, off64_t o), (fd, b, n, o),                     \
       o >= 0 && monarch_part_pread(fd, b, n, o, &l_))                                                  \
    IO(readv, ssize_t, fd, (int fd, const struct iovec *v, int c), (fd, v, c),                          \
       monarch_part_readv(fd, v, c, -1, &l_))                                                           \
    IO(preadv, ssize_t, fd, (int fd, const struct iovec *v, int c, off_t o), (fd, v, c, o),             \
       o >= 0 && monarch_part_readv(fd, v, c, o, &l_))                                                  \
    IO(preadv64, ssize_t, fd, (int fd, const struct iovec *v, int c, off64_t o), (fd, v, c, o),         \
       o >= 0 && monarch_part_readv(fd, v, c, o, &l_))                                                  \
    IO(preadv2, ssize_t, fd, (int fd, const struct iovec *v, int c, off_t o, int f), (fd, v, c, o, f),  \
       o >= -1 && monarch_part_readv(fd, v, c, o, &l_))                                                 \
    IO(preadv64v2, ssize_t, fd, (int fd, const struct iovec *v, int c, off64_t o, int f),               \
       (fd, v, c, o, f), o >= -1 && monarch_part_readv(fd, v, c, o, &l_))                               \
    IO(__read_chk, ssize_t, fd, (int fd, void *b, size_t n, size_t bl), (fd, b, n, bl),                 \
       n <= bl && monarch_part_read(fd, b, n, &l_))                                                     \
    IO(__pread_chk, ssize_t, fd, (int fd, void *b, size_t n, off_t o, size_t bl), (fd, b, n, o, bl),    \
       n <= bl && o >= 0 && monarch_part_pread(fd, b, n, o, &l_))                                       \
    IO(__pread64_chk, ssize_t, fd, (int fd, void *b, size_t n, off64_t o, size_t bl),                   \
       (fd, b, n, o, bl), n <= bl && o >= 0 && monarch_part_pread(fd, b, n, o, &l_))                    \
    IO(sendfile, ssize_t, in, (int out, int in, off_t *o, size_t n), (out, in, o, n), 0)                \
    IO(sendfile64, ssize_t, in, (int out, int in, off64_t *o, size_t n), (out, in, o, n), 0)            \
    IO(copy_file_range, ssize_t, in,                                                                    \
       (int in, off64_t *io, int out, off64_t *oo, size_t n, unsigned int f), (in, io, out, oo, n, f), 0) \
    FREAD(fread, s, fp, (void *b, size_t s, size_t n, FILE *fp), (b, s, n, fp))                        \
    FREAD(fread_unlocked, s, fp, (void *b, size_t s, size_t n, FILE *fp), (b, s, n, fp))               \
    FREAD(__fread_chk, s, fp, (void *b, size_t bl, size_t s, size_t n, FILE *fp), (b, bl, s, n, fp))   \
    FREAD(__fread_unlocked_chk, s, fp, (void *b, size_t bl, size_t s, size_t n, FILE *fp),             \
          (b, bl, s, n, fp))                                                                            \
    CHANGE(creat, (const char *p, mode_t m), (p, m), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_creat(p, m)) \
    CHANGE(creat64, (const char *p, mode_t m), (p, m), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_creat(p, m)) \
    CHANGE(rename, (const char *o, const char *n), (o, n), AT_FDCWD, o, AT_FDCWD, n, monarch_wb_rename(AT_FDCWD, o, AT_FDCWD, n, 0)) \
    CHANGE(renameat, (int od, const char *o, int nd, const char *n), (od, o, nd, n), od, o, nd, n, monarch_wb_rename(od, o, nd, n, 0)) \
    CHANGE(renameat2, (int od, const char *o, int nd, const char *n, unsigned int f), \
           (od, o, nd, n, f), od, o, nd, n, monarch_wb_rename(od, o, nd, n, f))                                                             \
    CHANGE(unlink, (const char *p), (p), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_unlink(AT_FDCWD, p, 0)) \
    CHANGE(unlinkat, (int d, const char *p, int f), (d, p, f), d, p, AT_FDCWD, NULL, monarch_wb_unlink(d, p, f)) \
    CHANGE(remove, (const char *p), (p), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_remove(p)) \
    CHANGE(rmdir, (const char *p), (p), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_unlink(AT_FDCWD, p, AT_REMOVEDIR)) \
    CHANGE(truncate, (const char *p, off_t l), (p, l), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_TRUNCATE, 0)) \
    CHANGE(truncate64, (const char *p, off64_t l), (p, l), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_TRUNCATE, 0)) \
    CHANGE(mkdir, (const char *p, mode_t m), (p, m), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_mkdir(AT_FDCWD, p, m)) \
    CHANGE(mkdirat, (int d, const char *p, mode_t m), (d, p, m), d, p, AT_FDCWD, NULL, monarch_wb_mkdir(d, p, m)) \
    CHANGE(mknod, (const char *p, mode_t m, dev_t v), (p, m, v), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(mknodat, (int d, const char *p, mode_t m, dev_t v), (d, p, m, v), d, p, AT_FDCWD, NULL, monarch_wb_settle(d, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(symlink, (const char *t, const char *p), (t, p), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(symlinkat, (const char *t, int d, const char *p), (t, d, p), d, p, AT_FDCWD, NULL, monarch_wb_settle(d, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(link, (const char *o, const char *n), (o, n), AT_FDCWD, o, AT_FDCWD, n, monarch_wb_settle(AT_FDCWD, &o, AT_FDCWD, n, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(linkat, (int od, const char *o, int nd, const char *n, int f), (od, o, nd, n, f), od, o, nd, n, monarch_wb_settle(od, &o, nd, n, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(chmod, (const char *p, mode_t m), (p, m), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_CHMOD, m)) \
    CHANGE(fchmodat, (int d, const char *p, mode_t m, int f), (d, p, m, f), d, p, AT_FDCWD, NULL, monarch_wb_settle(d, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_CHMOD, m)) \
    CHANGE(chown, (const char *p, uid_t u, gid_t g), (p, u, g), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(lchown, (const char *p, uid_t u, gid_t g), (p, u, g), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(fchownat, (int d, const char *p, uid_t u, gid_t g, int f), (d, p, u, g, f), d, p, AT_FDCWD, NULL, monarch_wb_settle(d, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(utime, (const char *p, const struct utimbuf *t), (p, t), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(utimes, (const char *p, const struct timeval t[2]), (p, t), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(lutimes, (const char *p, const struct timeval t[2]), (p, t), AT_FDCWD, p, AT_FDCWD, NULL, monarch_wb_settle(AT_FDCWD, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(futimesat, (int d, const char *p, const struct timeval t[2]), (d, p, t), d, p, AT_FDCWD, NULL, monarch_wb_settle(d, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0)) \
    CHANGE(utimensat, (int d, const char *p, const struct timespec t[2], int f), (d, p, t, f), d, p, \
           AT_FDCWD, NULL, monarch_wb_settle(d, &p, AT_FDCWD, NULL, MONARCH_WB_SETTLE_OTHER, 0))                                                                              \
    FDCHANGE(fchown, fd, (int fd, uid_t u, gid_t g), (fd, u, g))                                        \
    FDCHANGE(futimens, fd, (int fd, const struct timespec t[2]), (fd, t))                               \
    STAT(fstat, stat, fd, MONARCH_STAT_VER, (int fd, struct stat *buf), (fd, buf))                      \
    STAT(fstat64, stat64, fd, MONARCH_STAT_VER, (int fd, struct stat64 *buf), (fd, buf))                \
    STAT(__fxstat, stat, fd, v, (int v, int fd, struct stat *buf), (v, fd, buf))                        \
    STAT(__fxstat64, stat64, fd, v, (int v, int fd, struct stat64 *buf), (v, fd, buf))                  \
    PSTAT(stat, stat, AT_FDCWD, p, 0, MONARCH_STAT_VER, (const char *p, struct stat *buf), (p, buf))        \
    PSTAT(stat64, stat64, AT_FDCWD, p, 0, MONARCH_STAT_VER, (const char *p, struct stat64 *buf), (p, buf))  \
    PSTAT(lstat, stat, AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, MONARCH_STAT_VER, (const char *p, struct stat *buf), \
          (p, buf))                                                                                     \
    PSTAT(lstat64, stat64, AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, MONARCH_STAT_VER,                          \
          (const char *p, struct stat64 *buf), (p, buf))                                                \
    PSTAT(__xstat, stat, AT_FDCWD, p, 0, v, (int v, const char *p, struct stat *buf), (v, p, buf))       \
    PSTAT(__xstat64, stat64, AT_FDCWD, p, 0, v, (int v, const char *p, struct stat64 *buf), (v, p, buf)) \
    PSTAT(__lxstat, stat, AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, v, (int v, const char *p, struct stat *buf), \
          (v, p, buf))                                                                                  \
    PSTAT(__lxstat64, stat64, AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, v,                                      \
          (int v, const char *p, struct stat64 *buf), (v, p, buf))                                      \
    PSTAT(fstatat, stat, fd, p, f, MONARCH_STAT_VER, (int fd, const char *p, struct stat *buf, int f),   \
          (fd, p, buf, f))                                                                              \
    PSTAT(fstatat64, stat64, fd, p, f, MONARCH_STAT_VER, (int fd, const char *p, struct stat64 *buf, int f), \
          (fd, p, buf, f))                                                                              \
    PSTAT(newfstatat, stat, fd, p, f, MONARCH_STAT_VER, (int fd, const char *p, struct stat *buf, int f), \
          (fd, p, buf, f))                                                                              \
    PSTAT(__fxstatat, stat, fd, p, f, v, (int v, int fd, const char *p, struct stat *buf, int f),        \
          (v, fd, p, buf, f))                                                                           \
    PSTAT(__fxstatat64, stat64, fd, p, f, v, (int v, int fd, const char *p, struct stat64 *buf, int f),  \
          (v, fd, p, buf, f))                                                                           \
    PSTAT(statx, statx, fd, p, f, m, (int fd, const char *p, int f, unsigned int m, struct statx *buf),  \
          (fd, p, f, m, buf))                                                                           \
    ACCESS(access, AT_FDCWD, p, m, 0, (const char *p, int m), (p, m))                                   \
    ACCESS(euidaccess, AT_FDCWD, p, m, AT_EACCESS, (const char *p, int m), (p, m))                      \
    ACCESS(eaccess, AT_FDCWD, p, m, AT_EACCESS, (const char *p, int m), (p, m))                         \
    ACCESS(faccessat, d, p, m, f, (int d, const char *p, int m, int f), (d, p, m, f))                   \
    OPENDIR(opendir, AT_FDCWD, p, -1, (const char *p), (p), MONARCH_WB_VIEW(AT_FDCWD, p, 1, NULL, NULL))     \
    OPENDIR(fdopendir, fd, ".", fd, (int fd), (fd), )                                                   \
    READDIR(readdir, dirent, d)                                                                         \
    READDIR(readdir64, dirent64, d64)                                                                   \
    READDIR_R(readdir_r, dirent)                                                                        \
    READDIR_R(readdir64_r, dirent64)

MONARCH_WRAPPERS(MONARCH_WRAP_OPEN, MONARCH_WRAP_OPEN_2, MONARCH_WRAP_OPENAT, MONARCH_WRAP_OPENAT_2,
                 MONARCH_WRAP_FOPEN, MONARCH_WRAP_IO, MONARCH_WRAP_CHANGE, MONARCH_WRAP_STAT, MONARCH_WRAP_FDCHANGE,
                 MONARCH_WRAP_PSTAT, MONARCH_WRAP_ACCESS, MONARCH_WRAP_OPENDIR, MONARCH_WRAP_READDIR,
                 MONARCH_WRAP_READDIR_R, MONARCH_WRAP_FREAD)

/* freopen opens its path inside glibc (no open() of ours runs): a writing mode changes
 * the file, so its copies go first, as for fopen. A reading mode reads the PFS. A FILE of the
 * shim's lets its descriptor and cookie go (shim_stdio.c). */
static FILE *(*real_freopen)(const char *, const char *, FILE *);
static FILE *(*real_freopen64)(const char *, const char *, FILE *);
#define MONARCH_WRAP_FREOPEN(name)                                                \
    MONARCH_EXPORT FILE *name(const char *path, const char *mode, FILE *fp)       \
    {                                                                             \
        MONARCH_REAL(name, NULL)                                                  \
        if (path && mode && monarch_fopen_flags(mode) < 0)                        \
            monarch_invalidate(AT_FDCWD, path);                                   \
        struct monarch_stdio *s_ = monarch_stdio_of(fp);                          \
        if (s_) /* glibc's freopen readies a FILE's wide side, which a cookie's has not */ \
            fp->_wide_data = NULL;                                                \
        FILE *r_ = real_(path, mode, fp);                                         \
        if (s_)                                                                   \
            monarch_stdio_reopened(s_);                                           \
        return r_;                                                                \
    }
MONARCH_WRAP_FREOPEN(freopen)
MONARCH_WRAP_FREOPEN(freopen64)

/* Extended attributes under a root served from a key-value store (MONARCH_STORE_ROOTS): a
 * name the index describes has none (getxattr ENODATA, listxattr an empty list); an absent
 * one is ENOENT. There is nothing on disk to ask (`ls -l` asks every name). Elsewhere: the
 * kernel's. */
static int monarch_store_xattr(const char *path, int nofollow)
{
    if (!monarch_store_roots || monarch_guard || !path || !path[0] || !monarch_start())
        return MONARCH_META_NOT_OURS;
    char key[MONARCH_KEY_MAX], abs[PATH_MAX];
    size_t kl;
    unsigned k;
    int saved = errno, r = MONARCH_META_NOT_OURS;
    monarch_guard = 1;
    if (monarch_key_abs(AT_FDCWD, path, 1, key, &kl, &k, abs) == 0 && monarch_store_key(key)) {
        struct monarch_index_entry e;
        monarch_index_ready();
        r = monarch_meta_answer(key, kl, k, nofollow, monarch_wants_dir(path), &e, NULL);
    }
    monarch_guard = 0;
    errno = saved;
    return r;
}

#define MONARCH_WRAP_GETXATTR(name, nofollow)                                     \
    static ssize_t (*real_##name)(const char *, const char *, void *, size_t);   \
    MONARCH_EXPORT ssize_t name(const char *path, const char *attr, void *value, size_t size) \
    {                                                                             \
        int how_ = monarch_store_xattr(path, nofollow);                           \
        if (how_ == MONARCH_META_FOUND || how_ == MONARCH_META_ABSENT) {          \
            errno = how_ == MONARCH_META_FOUND ? ENODATA : ENOENT;                \
            return -1;                                                            \
        }                                                                         \
        MONARCH_REAL(name, -1)                                                    \
        return real_(path, attr, value, size);                                    \
    }
#define MONARCH_WRAP_LISTXATTR(name, nofollow)                                    \
    static ssize_t (*real_##name)(const char *, char *, size_t);                 \
    MONARCH_EXPORT ssize_t name(const char *path, char *list, size_t size)        \
    {                                                                             \
        int how_ = monarch_store_xattr(path, nofollow);                           \
        if (how_ == MONARCH_META_FOUND)                                           \
            return 0;                                                             \
        if (how_ == MONARCH_META_ABSENT) {                                        \
            errno = ENOENT;                                                       \
            return -1;                                                            \
        }                                                                         \
        MONARCH_REAL(name, -1)                                                    \
        return real_(path, list, size);                                           \
    }
MONARCH_WRAP_GETXATTR(getxattr, 0)
MONARCH_WRAP_GETXATTR(lgetxattr, 1)
MONARCH_WRAP_LISTXATTR(listxattr, 0)
MONARCH_WRAP_LISTXATTR(llistxattr, 1)

/* ---- emulated DIRs: the calls that take a DIR * (their real_* pointers: MONARCH_BY_HAND) ---- */

MONARCH_EXPORT int closedir(DIR *dirp)
{
    struct monarch_dir *m = monarch_dir_of(dirp);
    if (m) {
        int fd = m->fd;
        m->magic = 0;
        free(m);
        return fd >= 0 ? MONARCH_RESOLVE(close)(fd) : 0;
    }
    MONARCH_REAL(closedir, -1)
    return real_(dirp);
}

/* The descriptor of an emulated DIR: fdopendir's, or the directory opened now (on the PFS). */
MONARCH_EXPORT int dirfd(DIR *dirp)
{
    struct monarch_dir *m = monarch_dir_of(dirp);
    if (m) {
        if (m->fd < 0) {
            m->fd = MONARCH_RESOLVE(openat)(AT_FDCWD, m->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            monarch_meta_count(MONARCH_META_PASS);
        }
        return m->fd;
    }
    MONARCH_REAL(dirfd, -1)
    return real_(dirp);
}

MONARCH_EXPORT void rewinddir(DIR *dirp)
{
    struct monarch_dir *m = monarch_dir_of(dirp);
    if (m) {
        m->pos = 0;
        return;
    }
    __typeof__(real_rewinddir) real_ = MONARCH_RESOLVE(rewinddir);
    if (real_)
        real_(dirp);
}

MONARCH_EXPORT long telldir(DIR *dirp)
{
    struct monarch_dir *m = monarch_dir_of(dirp);
    if (m)
        return m->pos;
    MONARCH_REAL(telldir, -1)
    return real_(dirp);
}

MONARCH_EXPORT void seekdir(DIR *dirp, long loc)
{
    struct monarch_dir *m = monarch_dir_of(dirp);
    if (m) {
        m->pos = loc;
        return;
    }
    __typeof__(real_seekdir) real_ = MONARCH_RESOLVE(seekdir);
    if (real_)
        real_(dirp, loc);
}

/* ---- descriptor lifecycle: close, fclose, dup* keep the fd tables true ---- */
/* mmap: page faults are not calls, so a mapped open's bytes are not all seen (counted once);
 * the length mapped bounds them (mapped_bytes). A read-only mapping of a file staged by blocks
 * is moved onto the copy as its blocks come (shim_blocks.c); a MAP_FIXED mapping over one
 * being moved ends its moving first, under the registry's lock. */
#define MONARCH_WRAP_MMAP(name, off_type)                                          \
    MONARCH_EXPORT void *name(void *addr, size_t len, int prot, int flags, int fd, off_type off) \
    {                                                                              \
        MONARCH_REAL(name, MAP_FAILED)                                             \
        monarch_blocks_resume();                                                   \
        int held_ = (flags & MAP_FIXED) && __atomic_load_n(&monarch_nmappings, __ATOMIC_ACQUIRE); \
        sigset_t maps_held_;                                                       \
        if (held_) {                                                               \
            MONARCH_MAPS_LOCK(maps_held_);                                         \
            monarch_mappings_forget_locked((uintptr_t)addr, len);                  \
        }                                                                          \
        void *p_ = real_(addr, len, prot, flags, fd, off);                         \
        if (held_)                                                                 \
            MONARCH_MAPS_UNLOCK(maps_held_);                                       \
        if (p_ != MAP_FAILED && fd >= 0) {                                         \
            monarch_count_mapped(fd, len);                                         \
            monarch_wb_mapped(fd, p_, len, flags);                                 \
            if (MONARCH_UNLIKELY(monarch_part_of(fd)) && !monarch_guard)          \
                monarch_part_mapped(fd, p_, len, prot, flags, (uint64_t)off);      \
        }                                                                          \
        return p_;                                                                 \
    }
MONARCH_WRAP_MMAP(mmap, off_t)
MONARCH_WRAP_MMAP(mmap64, off64_t)

/* The application lets a range go: a mapping being moved onto a block copy there is moved no
 * more, and never again once the range is gone (the remapper holds the same lock). */
MONARCH_EXPORT int munmap(void *addr, size_t len)
{
    MONARCH_REAL(munmap, -1)
    monarch_wb_unmapped(addr, len);
    if (MONARCH_LIKELY(!__atomic_load_n(&monarch_nmappings, __ATOMIC_ACQUIRE)))
        return real_(addr, len);
    sigset_t maps_held_;
    MONARCH_MAPS_LOCK(maps_held_);
    monarch_mappings_forget_locked((uintptr_t)addr, len);
    int r = real_(addr, len);
    MONARCH_MAPS_UNLOCK(maps_held_);
    return r;
}

MONARCH_EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    void *new_addr = va_arg(ap, void *); /* read as glibc does; used with MREMAP_FIXED only */
    va_end(ap);
    MONARCH_REAL(mremap, MAP_FAILED)
    if (MONARCH_LIKELY(!__atomic_load_n(&monarch_nmappings, __ATOMIC_ACQUIRE)))
        return real_(old, old_len, new_len, flags, new_addr);
    sigset_t maps_held_;
    MONARCH_MAPS_LOCK(maps_held_);
    monarch_mappings_forget_locked((uintptr_t)old, old_len);
    if (flags & 2 /* MREMAP_FIXED */)
        monarch_mappings_forget_locked((uintptr_t)new_addr, new_len);
    void *r = real_(old, old_len, new_len, flags, new_addr);
    MONARCH_MAPS_UNLOCK(maps_held_);
    return r;
}

MONARCH_EXPORT int close(int fd)
{
    MONARCH_REAL(close, -1)
    monarch_forget(fd); /* before: once closed, another thread may reuse the number */
    monarch_zpool_release_fd(fd);
    monarch_probe_dir_closing((unsigned)fd, (unsigned)fd);
    monarch_part_copy_closing((unsigned)fd, (unsigned)fd);
    uint32_t wb = monarch_wb_closing(fd);
    int r = real_(fd);
    monarch_wb_closed(wb); /* after: the daemon looks whether any process still holds it */
    return r;
}

/* A descriptor the shim tracks is a regular file (a tier copy, or a PFS file found regular
 * when it opened), never a terminal: the ioctl isatty makes is not needed (Python's open
 * asks once per file to choose its buffering). */
MONARCH_EXPORT int isatty(int fd)
{
    if ((unsigned)fd < MONARCH_MAX_FDS && __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED)) {
        errno = ENOTTY;
        return 0;
    }
    MONARCH_REAL(isatty, 0)
    return real_(fd);
}

MONARCH_EXPORT int fclose(FILE *fp)
{
    MONARCH_REAL(fclose, EOF)
    FILE *f = fp; /* glibc declares fp nonnull; callers still pass NULL */
    uint32_t wb = 0;
    if (f) {
        int saved = errno, fd = fileno(f); /* a FILE without one (fmemopen) sets errno */
        errno = saved;
        monarch_forget(fd); /* glibc closes the fd internally */
        monarch_zpool_release_fd(fd);
        wb = monarch_wb_closing(fd);
    }
    int r = real_(fp);
    monarch_wb_closed(wb);
    return r;
}

MONARCH_EXPORT int dup(int oldfd)
{
    MONARCH_REAL(dup, -1)
    int fd = real_(oldfd);
    if (fd >= 0)
        monarch_copy_slot(oldfd, fd);
    return fd;
}

MONARCH_EXPORT int dup2(int oldfd, int newfd)
{
    MONARCH_REAL(dup2, -1)
    if (oldfd != newfd) { /* dup2 closes newfd */
        monarch_zpool_release_fd(newfd);
        monarch_probe_dir_closing((unsigned)newfd, (unsigned)newfd);
        monarch_part_copy_closing((unsigned)newfd, (unsigned)newfd);
    }
    int fd = real_(oldfd, newfd);
    if (fd >= 0 && oldfd != newfd)
        monarch_copy_slot(oldfd, fd);
    return fd;
}

MONARCH_EXPORT int dup3(int oldfd, int newfd, int flags)
{
    MONARCH_REAL(dup3, -1)
    if (oldfd != newfd) {
        monarch_zpool_release_fd(newfd);
        monarch_probe_dir_closing((unsigned)newfd, (unsigned)newfd);
        monarch_part_copy_closing((unsigned)newfd, (unsigned)newfd);
    }
    int fd = real_(oldfd, newfd, flags);
    if (fd >= 0)
        monarch_copy_slot(oldfd, fd);
    return fd;
}

/* fcntl's duplication (F_DUPFD, F_DUPFD_CLOEXEC: Python's os.dup, hence numpy's np.load) is a
 * dup like the others. fcntl is variadic: its third argument, when there is one, is an int
 * or a pointer, passed on as a pointer-sized word as glibc itself reads it. Programs built
 * with _FILE_OFFSET_BITS=64 on glibc >= 2.28 call fcntl64 (resolved by dlsym: never imported). */
#define MONARCH_WRAP_FCNTL(name)                                                   \
    MONARCH_EXPORT int name(int fd, int cmd, ...)                                  \
    {                                                                              \
        va_list ap;                                                                \
        va_start(ap, cmd);                                                         \
        void *arg = va_arg(ap, void *);                                            \
        va_end(ap);                                                                \
        MONARCH_REAL(name, -1)                                                     \
        int r_ = real_(fd, cmd, arg);                                              \
        if (r_ >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))                 \
            monarch_copy_slot(fd, r_);                                             \
        return r_;                                                                 \
    }
MONARCH_WRAP_FCNTL(fcntl)
MONARCH_WRAP_FCNTL(fcntl64)

/* A FILE on a managed descriptor (numpy's fromfile: os.dup, then fdopen and fread): fread
 * is counted, but stdio may read it with its internal __read too: its bytes are a bound. A
 * descriptor of a file staged by blocks gets a FILE reading through the shim (shim_stdio.c). */
MONARCH_EXPORT FILE *fdopen(int fd, const char *mode)
{
    MONARCH_REAL(fdopen, NULL)
    if (MONARCH_UNLIKELY(monarch_part_of(fd)))
        return monarch_stdio_file(fd, mode);
    FILE *fp = real_(fd, mode);
    if (fp)
        monarch_mark_uncounted(fd, MONARCH_UNSEEN_STDIO);
    return fp;
}

/* Unbuffering a FILE of the shim's (shim_stdio.c) is not done: a cookie's FILE refills its
 * buffer whole for every fread, so unbuffered it reads a byte per call (a 1 MiB fread: a
 * million reads); buffered, it reads the same bytes, its descriptor's offset ahead of it as
 * any buffered FILE's. A buffer the application gives is taken. */
MONARCH_EXPORT int setvbuf(FILE *fp, char *buf, int mode, size_t size)
{
    MONARCH_REAL(setvbuf, EOF)
    if (MONARCH_UNLIKELY(mode == _IONBF) && monarch_stdio_of(fp))
        return 0;
    return real_(fp, buf, mode, size);
}

MONARCH_EXPORT void setbuf(FILE *fp, char *buf)
{
    __typeof__(real_setbuf) real_ = MONARCH_RESOLVE(setbuf);
    if (real_ && (buf || !monarch_stdio_of(fp)))
        real_(fp, buf);
}

MONARCH_EXPORT void setbuffer(FILE *fp, char *buf, size_t size)
{
    __typeof__(real_setbuffer) real_ = MONARCH_RESOLVE(setbuffer);
    if (real_ && (buf || !monarch_stdio_of(fp)))
        real_(fp, buf, size);
}

/* ---- exec: this process stops being one with the shim (EXTRA_PROCESSES); the new program
 * counts itself if it loads the shim (a wrapper such as `env -u LD_PRELOAD` does not) ---- */
#define MONARCH_EXEC_BODY(name, args)                                              \
    MONARCH_REAL(name, -1)                                                         \
    monarch_count_process(-1);                                                     \
    int r_ = real_ args;                                                           \
    int saved_ = errno;                                                            \
    monarch_count_process(1); /* still here: the exec failed */                    \
    errno = saved_;                                                                \
    return r_;

MONARCH_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    MONARCH_EXEC_BODY(execve, (path, argv, envp))
}

MONARCH_EXPORT int execv(const char *path, char *const argv[])
{
    MONARCH_EXEC_BODY(execv, (path, argv))
}

MONARCH_EXPORT int execvp(const char *file, char *const argv[])
{
    MONARCH_EXEC_BODY(execvp, (file, argv))
}

MONARCH_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    MONARCH_EXEC_BODY(execvpe, (file, argv, envp))
}

MONARCH_EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
    MONARCH_EXEC_BODY(fexecve, (fd, argv, envp))
}

/* execl, execlp, execle: glibc turns them into execve internally (no wrapper of ours runs),
 * so they are rebuilt here as their v forms, the argument list on the stack as glibc does. */
#define MONARCH_ARGV_FROM_VA(arg0, argv, envp_out)                                  \
    va_list ap;                                                                    \
    size_t n_ = 1;                                                                 \
    va_start(ap, arg0);                                                            \
    while (va_arg(ap, const char *))                                               \
        n_++;                                                                      \
    va_end(ap);                                                                    \
    char *argv[n_ + 1];                                                            \
    argv[0] = (char *)arg0;                                                        \
    va_start(ap, arg0);                                                            \
    for (size_t i_ = 1; i_ <= n_; i_++)                                            \
        argv[i_] = va_arg(ap, char *); /* argv[n_]: the terminating NULL */        \
    envp_out;                                                                      \
    va_end(ap);

MONARCH_EXPORT int execl(const char *path, const char *arg, ...)
{
    MONARCH_ARGV_FROM_VA(arg, argv, (void)0)
    return execv(path, argv);
}

MONARCH_EXPORT int execlp(const char *file, const char *arg, ...)
{
    MONARCH_ARGV_FROM_VA(arg, argv, (void)0)
    return execvp(file, argv);
}

MONARCH_EXPORT int execle(const char *path, const char *arg, ...)
{
    char *const *envp;
    MONARCH_ARGV_FROM_VA(arg, argv, envp = va_arg(ap, char *const *))
    return execve(path, argv, envp);
}

MONARCH_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
    MONARCH_REAL(close_range, -1)
    if (!(flags & CLOSE_RANGE_CLOEXEC)) {
        monarch_zpool_release_range(first, last);
        monarch_probe_dir_closing(first, last);
        monarch_part_copy_closing(first, last);
    }
    int r = real_(first, last, flags);
    if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC) && getpid() == monarch_pid)
        for (unsigned long fd = first; fd <= last && fd < MONARCH_MAX_FDS; fd++) {
            __atomic_store_n(&monarch_fd_entry[fd], 0, __ATOMIC_RELAXED);
            __atomic_store_n(&monarch_fd_slot[fd], 0, __ATOMIC_RELAXED);
            monarch_part_drop((int)fd);
        }
    return r;
}
