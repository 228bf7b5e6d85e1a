/*
 * monarch_shim.h -- what the shim's core (monarch_shim.c) gives its parts (shim_*.c): the
 * compatibility with glibc 2.17's headers, the wire and the shared native code, the fixed tables'
 * sizes, the root and probe tables' types, the debug and real_* resolution macros, the symbols
 * wrapped by hand, and the calls every part uses (counting and the fd tables). One translation
 * unit: monarch_shim.c includes this, defines the core's state, includes every part's header
 * (shim_*.h: what that part gives the others), then the parts, in any order.
 *
 * The core's state (monarch_shim.c, set at start-up unless said): the roots (monarch_roots,
 * monarch_store_roots), the probe directories (monarch_probes), the daemon's socket address,
 * the counters' mapping (monarch_counters), the snapshot index (monarch_index,
 * monarch_index_state: shim_index.c installs it), the fd tables (monarch_fd_slot,
 * monarch_fd_entry: changed through monarch_track, monarch_forget, monarch_copy_slot), the
 * per-thread guard (monarch_guard) and the PFS reason of this thread's open (monarch_pfs_why).
 */
#ifndef MONARCH_SHIM_H
#define MONARCH_SHIM_H

/* ---- glibc 2.17 compatibility: what older headers lack ---- */
#ifndef __OPEN_NEEDS_MODE /* glibc < 2.19 */
#ifdef __O_TMPFILE
#define __OPEN_NEEDS_MODE(flags) (((flags) & O_CREAT) != 0 || ((flags) & __O_TMPFILE) == __O_TMPFILE)
#else
#define __OPEN_NEEDS_MODE(flags) (((flags) & O_CREAT) != 0)
#endif
#endif
#ifndef AT_EMPTY_PATH
#define AT_EMPTY_PATH 0x1000
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef F_GET_SEALS /* glibc 2.17's headers predate memfd */
#define F_GET_SEALS 1034
#endif
#ifndef MSG_CMSG_CLOEXEC
#define MSG_CMSG_CLOEXEC 0x40000000
#endif
#ifndef STATX_TYPE /* glibc < 2.28: the kernel's struct statx */
#define STATX_TYPE 0x0001U
#define STATX_MODE 0x0002U
#define STATX_NLINK 0x0004U
#define STATX_UID 0x0008U
#define STATX_GID 0x0010U
#define STATX_ATIME 0x0020U
#define STATX_MTIME 0x0040U
#define STATX_CTIME 0x0080U
#define STATX_INO 0x0100U
#define STATX_SIZE 0x0200U
#define STATX_BLOCKS 0x0400U
#define STATX_BASIC_STATS 0x07ffU
struct statx_timestamp {
    int64_t tv_sec;
    uint32_t tv_nsec;
    int32_t statx_reserved;
};
struct statx {
    uint32_t stx_mask, stx_blksize;
    uint64_t stx_attributes;
    uint32_t stx_nlink, stx_uid, stx_gid;
    uint16_t stx_mode, statx_spare0[1];
    uint64_t stx_ino, stx_size, stx_blocks, stx_attributes_mask;
    struct statx_timestamp stx_atime, stx_btime, stx_ctime, stx_mtime;
    uint32_t stx_rdev_major, stx_rdev_minor, stx_dev_major, stx_dev_minor;
    uint64_t statx_spare2[14];
};
#endif
#ifndef AT_NO_AUTOMOUNT
#define AT_NO_AUTOMOUNT 0x800
#endif
#ifndef AT_STATX_DONT_SYNC
#define AT_STATX_DONT_SYNC 0x4000
#endif
/* __xstat's version argument for the struct stat of this ABI (others pass through) */
#if defined(__x86_64__)
#define MONARCH_STAT_VER 1
#elif defined(__aarch64__) || defined(__riscv)
#define MONARCH_STAT_VER 0
#else
#define MONARCH_STAT_VER (-1)
#endif
/* memfds (shim_zstd.c, shim_zpool.c) and populated mappings (shim_blocks.c) */
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#endif
#ifndef SYS_memfd_create
#if defined(__x86_64__)
#define SYS_memfd_create 319
#elif defined(__aarch64__) || defined(__riscv)
#define SYS_memfd_create 279
#elif defined(__powerpc64__)
#define SYS_memfd_create 360
#endif
#endif
#ifndef MAP_POPULATE
#define MAP_POPULATE 0x08000
#endif
/* The shim's own system calls: libc's syscall(), never the application's wrapper of it that
 * shim_rawsys.c exports under that name (its definition is spelt `(syscall)`). */
static long monarch_libc_syscall(long nr, ...);
#define syscall(...) monarch_libc_syscall(__VA_ARGS__)
/* gettid() is glibc 2.30; the shim only needs the number for its debug lines */
#define monarch_gettid() ((int)syscall(SYS_gettid))

/* ---- the wire: frames, counters, index, environment (one definition for C, checked against
 * Python by tests/unit/test_wire.py) ---- */
#include "../wire/monarch_wire.h"
/* the export marker, the clock, CRC-32 and the index look-up, shared with the other libraries */
#include "../native/monarch_native.h"
/* room for MAX_PASSED_FDS descriptors in one recvmsg (the extras are closed) */
#define MONARCH_MAX_PASSED_FDS 4
/* in monarch_fd_slot, beside the slot + 1: this open's bytes were declared not all seen (mapped
 * or read through a FILE), and a FILE reads it (its bytes have no bound) */
#define MONARCH_FD_UNCOUNTED 0x80
#define MONARCH_FD_STDIO 0x40
#define MONARCH_FD_SLOT_MASK 0x3f
_Static_assert(MONARCH_MAX_SLOTS <= MONARCH_FD_SLOT_MASK, "a slot + 1 fits below the flags");
/* how an open's bytes escape the byte counts: pages mapped (bounded by the lengths mapped, counted
 * as mapped_bytes), or a FILE's own reads (glibc's internal __read: no bound) */
enum monarch_unseen { MONARCH_UNSEEN_MAPPED, MONARCH_UNSEEN_STDIO };

/* ---- fixed tables ---- */
#define MONARCH_MAX_ROOTS 32 /* a root may appear twice: canonical and configured spelling */
#define MONARCH_MAX_FDS 65536
#define MONARCH_KEY_MAX (PATH_MAX + 16) /* "<k>/" + a path below PATH_MAX */

#define MONARCH_EXPORT EXPORT /* monarch_native.h */
#define MONARCH_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define MONARCH_LIKELY(x) __builtin_expect(!!(x), 1)

#ifndef __FILE_NAME__
#define __FILE_NAME__ __FILE__
#endif

struct monarch_root {
    char path[PATH_MAX]; /* normalized, no trailing '/'; "" for "/" */
    size_t len;
    unsigned index; /* k in the key "<k>/<rel>", as MONARCH_ROOTS names it */
    char kprefix[12]; /* "<k>/" */
    size_t kprefix_len;
    int view;         /* MONARCH_VIEW_*: is it the daemon's root here (shim_view.c) */
    dev_t id_dev;     /* the daemon's identity of it, when published */
    ino_t id_ino;
};

struct monarch_probe {
    char dir[PATH_MAX];
    size_t len;
    unsigned slot;
    int fd;         /* the dir, opened once (shim_paths.c: probe directories); MONARCH_PROBE_* below 0 */
    dev_t dev;      /* and its identity, written before fd is published */
    ino_t ino;
    int shared;     /* shared with the user's other jobs (MONARCH_SHARED_SLOTS): a copy must match the index */
    int has_id;     /* the daemon published its identity (MONARCH_PROBE_IDS): probed only if it is that dir */
    dev_t id_dev;
    ino_t id_ino;
};

/* the snapshot index's state in this process (monarch_index_state) */
enum monarch_index_state {
    MONARCH_IX_UNKNOWN,    /* not there at start: ask the daemon at the first need */
    MONARCH_IX_INSTALLING, /* one thread maps it (a few microseconds); the others yield */
    MONARCH_IX_EARLY,      /* not ready within the wait, the daemon alive: the PFS, counted; look again */
    MONARCH_IX_LOST,       /* the daemon unreachable or silent: the PFS, counted; look again */
    MONARCH_IX_MAPPED,     /* mapped: metadata and fstat from it, tier probes allowed */
    MONARCH_IX_NONE,       /* none, or unusable, though the daemon is ready: as without an index */
    MONARCH_IX_OFF         /* the snapshot failed, or the daemon was lost before it: the PFS */
};

/* ---- debug: "[monarch pid/tid] file:line ..." on stderr, only when enabled (monarch_debug) ---- */
__attribute__((format(printf, 3, 4)))
static void monarch_log(const char *file, int line, const char *fmt, ...);
static void monarch_stderr_line(const char *head, const char *fmt, va_list ap); /* one line, errno kept */
#define MONARCH_DEBUG(level, ...)                                         \
    do {                                                                  \
        if (MONARCH_UNLIKELY(monarch_debug >= (level)))                   \
            monarch_log(__FILE_NAME__, __LINE__, __VA_ARGS__);            \
    } while (0)

/* ---- real_* resolution ---- */
#define MONARCH_RESOLVE(name)                                                       \
    __extension__({                                                                 \
        __typeof__(real_##name) p_ = __atomic_load_n(&real_##name, __ATOMIC_ACQUIRE); \
        if (MONARCH_UNLIKELY(!p_)) {                                                \
            p_ = (__typeof__(real_##name))dlsym(RTLD_NEXT, #name);                  \
            __atomic_store_n(&real_##name, p_, __ATOMIC_RELEASE);                   \
        }                                                                           \
        p_;                                                                         \
    })

/* The real function, or ENOSYS (and `fail`) when this libc lacks it. */
#define MONARCH_REAL(name, fail)                                                    \
    __typeof__(real_##name) real_ = MONARCH_RESOLVE(name);                          \
    if (MONARCH_UNLIKELY(!real_)) {                                                 \
        errno = ENOSYS;                                                             \
        return fail;                                                                \
    }

/* What glibc declares only under _FORTIFY_SOURCE, or no longer (the __fxstat
 * family left the headers in 2.33), or not yet (2.17 headers). */
ssize_t __read_chk(int fd, void *b, size_t n, size_t bl);
ssize_t __pread_chk(int fd, void *b, size_t n, off_t o, size_t bl);
ssize_t __pread64_chk(int fd, void *b, size_t n, off64_t o, size_t bl);
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);
int __fxstat(int v, int fd, struct stat *buf);
int __fxstat64(int v, int fd, struct stat64 *buf);
int __xstat(int v, const char *p, struct stat *buf);
int __xstat64(int v, const char *p, struct stat64 *buf);
int __lxstat(int v, const char *p, struct stat *buf);
int __lxstat64(int v, const char *p, struct stat64 *buf);
int euidaccess(const char *p, int m);
int eaccess(const char *p, int m);
int mknod(const char *p, mode_t m, dev_t v);
int mknodat(int d, const char *p, mode_t m, dev_t v);
int futimesat(int d, const char *p, const struct timeval t[2]);
int lutimes(const char *p, const struct timeval t[2]);
int __fxstatat(int v, int fd, const char *p, struct stat *buf, int f);
int __fxstatat64(int v, int fd, const char *p, struct stat64 *buf, int f);
int newfstatat(int fd, const char *p, struct stat *buf, int f);
int statx(int fd, const char *p, int f, unsigned int m, struct statx *buf);
int renameat2(int od, const char *o, int nd, const char *n, unsigned int f);
ssize_t copy_file_range(int in, off64_t *io, int out, off64_t *oo, size_t n, unsigned int f);
ssize_t preadv2(int fd, const struct iovec *v, int c, off_t o, int f);
ssize_t preadv64v2(int fd, const struct iovec *v, int c, off64_t o, int f);
int close_range(unsigned int first, unsigned int last, int flags);
#undef fread_unlocked /* a macro of bits/stdio.h when optimizing */
size_t __fread_chk(void *b, size_t bl, size_t s, size_t n, FILE *fp);
size_t __fread_unlocked_chk(void *b, size_t bl, size_t s, size_t n, FILE *fp);
int fcntl64(int fd, int cmd, ...);
int execvpe(const char *file, char *const argv[], char *const envp[]);


/* Every symbol wrapped by hand (its wrapper in shim_wrappers.c: no family fits it), one line
 * each, beside MONARCH_WRAPPERS' families: expanded into its real_* pointer here and into
 * monarch_resolve_all, so that no pointer is declared and left unresolved. */
#define MONARCH_BY_HAND(X)                                                          \
    X(int, closedir, (DIR *))                                                       \
    X(int, dirfd, (DIR *))                                                          \
    X(void, rewinddir, (DIR *))                                                     \
    X(long, telldir, (DIR *))                                                       \
    X(void, seekdir, (DIR *, long))                                                 \
    X(int, close, (int))                                                            \
    X(int, isatty, (int))                                                           \
    X(int, fclose, (FILE *))                                                        \
    X(int, fsync, (int))                                                            \
    X(int, fdatasync, (int))                                                        \
    X(int, sync_file_range, (int, off64_t, off64_t, unsigned int))                  \
    X(int, msync, (void *, size_t, int))                                            \
    X(int, fchmod, (int, mode_t))                                                   \
    X(int, dup, (int))                                                              \
    X(int, dup2, (int, int))                                                        \
    X(int, dup3, (int, int, int))                                                   \
    X(int, close_range, (unsigned int, unsigned int, int))                          \
    X(void *, mmap, (void *, size_t, int, int, int, off_t))                         \
    X(void *, mmap64, (void *, size_t, int, int, int, off64_t))                     \
    X(int, munmap, (void *, size_t))                                                \
    X(void *, mremap, (void *, size_t, size_t, int, ...))                           \
    X(int, fcntl, (int, int, ...))                                                  \
    X(int, fcntl64, (int, int, ...))                                                \
    X(FILE *, fdopen, (int, const char *))                                          \
    X(int, setvbuf, (FILE *, char *, int, size_t))                                  \
    X(void, setbuf, (FILE *, char *))                                               \
    X(void, setbuffer, (FILE *, char *, size_t))                                    \
    X(int, execve, (const char *, char *const[], char *const[]))                    \
    X(int, execv, (const char *, char *const[]))                                    \
    X(int, execvp, (const char *, char *const[]))                                   \
    X(int, execvpe, (const char *, char *const[], char *const[]))                   \
    X(int, fexecve, (int, char *const[], char *const[]))                            \
    X(int, mprotect, (void *, size_t, int))                                         \
    X(int, madvise, (void *, size_t, int))                                          \
    X(int, posix_madvise, (void *, size_t, int))                                    \
    X(int, sigaction, (int, const struct sigaction *, struct sigaction *))          \
    X(int, sigprocmask, (int, const sigset_t *, sigset_t *))                        \
    X(int, pthread_sigmask, (int, const sigset_t *, sigset_t *))                    \
    X(int, pthread_create, (pthread_t *, const pthread_attr_t *, void *(*)(void *), void *)) \
    X(long, syscall, (long, ...))                                                   \
    X(sighandler_t, signal, (int, sighandler_t))                                    \
    X(sighandler_t, bsd_signal, (int, sighandler_t))                                \
    X(sighandler_t, sysv_signal, (int, sighandler_t))                               \
    X(ssize_t, write, (int, const void *, size_t))                                  \
    X(ssize_t, pwrite, (int, const void *, size_t, off_t))                          \
    X(ssize_t, pwrite64, (int, const void *, size_t, off64_t))                      \
    X(ssize_t, writev, (int, const struct iovec *, int))                            \
    X(ssize_t, pwritev, (int, const struct iovec *, int, off_t))                    \
    X(ssize_t, pwritev64, (int, const struct iovec *, int, off64_t))                \
    X(ssize_t, send, (int, const void *, size_t, int))                              \
    X(ssize_t, sendto, (int, const void *, size_t, int, const struct sockaddr *, socklen_t)) \
    X(ssize_t, sendmsg, (int, const struct msghdr *, int))                          \
    X(size_t, fwrite, (const void *, size_t, size_t, FILE *))                       \
    X(size_t, fwrite_unlocked, (const void *, size_t, size_t, FILE *))

#define MONARCH_HOW_EIO (-2) /* monarch_before: fail the open with EIO */

/* ---- what the core gives the parts (monarch_shim.c) ---- */
static int monarch_store_key(const char *key);  /* a key under a root served from a key-value store */
static int monarch_sys_fstat(int fd, struct stat *st);  /* the kernel's, never our wrapper */
static int monarch_sys_lstatat(int dirfd, const char *path, struct stat *st);
static int monarch_map_index(const char *path, int *missing);  /* the index mapped and validated */
static void *monarch_map_file(const char *path, int writable, size_t minsize, size_t *sizep); /* ours alone */
static void monarch_ensure_init(void);
/* counting and the fd tables (hot path: no lock, no allocation, no log) */
static inline uint64_t *monarch_counter(unsigned slot, unsigned which);
static inline void monarch_mark_uncounted(int fd, enum monarch_unseen why);
static inline void monarch_count_mapped(int fd, size_t len);
static inline void monarch_count_bytes(int fd, uint64_t n);
static inline void monarch_count_file(FILE *fp, uint64_t n);
static inline void monarch_count_process(int delta);
static void monarch_track(int fd, unsigned slot, uint32_t entry);  /* a managed fd, its open counted */
static inline void monarch_forget(int fd);
static inline void monarch_copy_slot(int oldfd, int newfd);

#endif /* MONARCH_SHIM_H */
