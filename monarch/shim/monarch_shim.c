/*
 * monarch_shim.c -- the Monarch LD_PRELOAD shim (libmonarch_shim.so).
 *
 * Redirects read-only opens of files under the dataset roots to a staged copy
 * (node-local tier or peer area), makes fstat of such a descriptor report the
 * source's stat, tells the daemon before the job changes a file under a root,
 * and counts opens and bytes per source. The contract with the node daemon
 * lives in monarch/protocol.py (framed socket messages, key format, counters
 * and snapshot index layouts); the constants below mirror it and
 * tests/unit/test_protocol.py checks they agree.
 *
 * Shape (after Darshan / libfaketime / GOTCHA):
 *   - every wrapped symbol is one line of MONARCH_WRAPPERS; the line names the
 *     symbol's family (open, openat, __open_2, fopen, byte-counting I/O, calls
 *     that change a path, stat of a descriptor) and the family macro generates
 *     the real_* pointer, the exported wrapper and its resolution;
 *   - real_* pointers are resolved once by the constructor (pthread_once) and
 *     lazily by any wrapper called before it, always through dlsym: a symbol
 *     this glibc lacks (statx before 2.28, fstat before 2.33 ...) still links,
 *     and its wrapper answers ENOSYS; nothing here ever calls exit();
 *   - the hot path (a non-managed open, every read, every fstat) takes no lock,
 *     allocates nothing and logs nothing: flag test, stack buffer, prefix match
 *     against a root table fixed at start-up, a load from the fd tables, one
 *     atomic add;
 *   - a __thread recursion guard; the shim's own file I/O goes through real_*
 *     (or raw syscalls), never through its own wrappers;
 *   - builds with -Werror against glibc 2.17 headers and imports no symbol
 *     newer than GLIBC_2.17 (tests/shim/test_glibc_compat.py checks it).
 *
 * Environment (see protocol.py): MONARCH_ROOTS, MONARCH_PROBE, MONARCH_SOCKET,
 * MONARCH_COUNTERS, MONARCH_INDEX, MONARCH_DISABLE, MONARCH_SHIM_DEBUG,
 * MONARCH_SHIM_TIMEOUT_MS, MONARCH_SHIM_INDEX_WAIT_MS. Missing or invalid settings degrade to
 * pass-through; nothing here may make the application fail: on any
 * Monarch-side failure the original is opened by the application's own call,
 * so the errors it sees are the original's.
 *
 * Paths: a managed path is one under a root once joined to the cwd or dirfd.
 * Without a ".." component it is matched lexically; with one, its directory is
 * resolved with realpath() first, because the kernel follows a symlink before
 * it applies "..": root/lnk/../x is not root/x when lnk points elsewhere.
 * O_NOFOLLOW opens are served only for snapshot files whose name is not a symlink
 * (the index says so); the rest are the kernel's.
 *
 * The snapshot index may appear after this process started (the daemon's walk overlaps
 * the application's start-up): the first call that needs it waits for it, once per
 * process (see "waiting for the snapshot index"); no tier is probed before it is there.
 *
 * The daemon: one connection per request; the daemon's uid (SO_PEERCRED) must
 * be ours. OPEN answers may be preceded by STATUS_PENDING heartbeats; silence
 * for HEARTBEAT_TIMEOUT_MS, or MONARCH_SHIM_TIMEOUT_MS in all, means PFS. An
 * OPEN answer is used only if it names a NUL-free path shorter than PATH_MAX
 * inside one of the MONARCH_PROBE directories: a forged or corrupt answer can
 * neither overflow a buffer nor send the application elsewhere.
 *
 * The job's own writes are read back exactly: before a write-open, creat,
 * rename, unlink, remove, rmdir or truncate of a managed path, the shim sends
 * INVALIDATE <key> and removes <probe dir>/<key> itself; if the daemon did not
 * confirm, this process stops probing tiers for good (later opens ask the
 * daemon or read the PFS), so it never reads stale bytes from a tier.
 *
 * What is counted:
 *   - opens of managed files, per slot (0 = PFS original, 1 = peer area,
 *     2.. = tiers);
 *   - bytes returned by read, pread(64), readv, preadv(64), preadv(64)v2,
 *     the fortified __read_chk / __pread(64)_chk, and the read side of
 *     sendfile(64) / copy_file_range, on descriptors the shim opened (and
 *     their dup/dup2/dup3 copies).
 * What is NOT counted (only the open is):
 *   - bytes read through stdio (fread, fgets, getc ...): glibc reads a FILE
 *     with its internal __read, which no preload can interpose;
 *   - bytes read through mmap (page faults are not calls);
 *   - descriptors duplicated with fcntl(F_DUPFD[_CLOEXEC]) (Python's os.dup
 *     uses it) or reopened through /proc/self/fd; freopen.
 * The same descriptors (dup'd by fcntl, reopened) also report the staged
 * copy's own stat, not the source's. The fd tables cover descriptors below
 * MONARCH_MAX_FDS; higher ones are read correctly but not counted.
 */
#undef _FORTIFY_SOURCE /* we define open, read ... ourselves */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>
#include <stddef.h>

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
/* gettid() is glibc 2.30; the shim only needs the number for its debug lines */
#define monarch_gettid() ((int)syscall(SYS_gettid))

/* ---- protocol mirror (monarch/protocol.py; checked by tests/unit/test_protocol.py) ---- */
#define MONARCH_COUNTERS_MAGIC 0x4D4F4E4152434801ULL
#define MONARCH_COUNTERS_VERSION 2
#define MONARCH_MAX_SLOTS 16
#define MONARCH_HEADER_WORDS 3
#define MONARCH_SLOT_PFS 0
#define MONARCH_SLOT_PEER 1
#define MONARCH_FIRST_TIER_SLOT 2
#define MONARCH_SHIM_TIMEOUT_MS_DEFAULT 60000
#define MONARCH_SHIM_INDEX_WAIT_MS_DEFAULT 600000
#define MONARCH_HEARTBEAT_MS 250
#define MONARCH_HEARTBEAT_TIMEOUT_MS 1500
#define MONARCH_VERB_OPEN 1
#define MONARCH_VERB_INVALIDATE 2
#define MONARCH_VERB_ATTACH 3
#define MONARCH_VERB_REPORT 4
#define MONARCH_VERB_STOP 5
#define MONARCH_VERB_INDEX 7
#define MONARCH_INDEX_READY 0
#define MONARCH_INDEX_NONE 1
#define MONARCH_STATUS_PENDING (-2)
#define MONARCH_STATUS_ERROR (-1)
/* OPEN answer flag: the copy is the descriptor passed with the frame, sealed with
 * F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE; room for MAX_PASSED_FDS
 * descriptors in one recvmsg (the extras are closed) */
#define MONARCH_ANSWER_FD 0x100
#define MONARCH_MEMFD_SEALS 0xf
#define MONARCH_MAX_PASSED_FDS 4
#define MONARCH_MAX_REQUEST 8192
#define MONARCH_MAX_ANSWER 1048576
#define MONARCH_REQUEST_HEADER_SIZE 8
#define MONARCH_ANSWER_HEADER_SIZE 8
#define MONARCH_INDEX_MAGIC 0x58444E4948434E4DULL
#define MONARCH_INDEX_VERSION 3
#define MONARCH_INDEX_HEADER_SIZE 72
#define MONARCH_INDEX_ENTRY_SIZE 112
#define MONARCH_INDEX_CHILD_SIZE 24
#define MONARCH_INDEX_FLAG_SYMLINK 1
#define MONARCH_INDEX_FLAG_LISTED 2
#define MONARCH_EXTRA_META_LOCAL 0
#define MONARCH_EXTRA_META_PFS 1
#define MONARCH_EXTRA_META_OFF 2
#define MONARCH_ENV_ROOTS "MONARCH_ROOTS"
#define MONARCH_ENV_PROBE "MONARCH_PROBE"
#define MONARCH_ENV_SOCKET "MONARCH_SOCKET"
#define MONARCH_ENV_COUNTERS "MONARCH_COUNTERS"
#define MONARCH_ENV_INDEX "MONARCH_INDEX"
#define MONARCH_ENV_ASK_FIRST "MONARCH_ASK_FIRST"
#define MONARCH_ENV_DISABLE "MONARCH_DISABLE"
#define MONARCH_ENV_DEBUG "MONARCH_SHIM_DEBUG"
#define MONARCH_ENV_TIMEOUT "MONARCH_SHIM_TIMEOUT_MS"
#define MONARCH_ENV_INDEX_WAIT "MONARCH_SHIM_INDEX_WAIT_MS"
#define MONARCH_SLOT_WORDS 3
#define MONARCH_EXTRA_WORDS 8
#define MONARCH_COUNTERS_WORDS (MONARCH_HEADER_WORDS + MONARCH_SLOT_WORDS * MONARCH_MAX_SLOTS + MONARCH_EXTRA_WORDS)
#define MONARCH_FD_UNCOUNTED 0x80 /* in monarch_fd_slot: this open's bytes were declared unknown */

/* The snapshot index (protocol.py, "Snapshot index"), little-endian like the host. */
struct monarch_index_header {
    uint64_t magic;
    uint32_t version, entries, buckets, reserved;
    uint64_t buckets_off, entries_off, keys_off, keys_size, children_off, children_count;
};
struct monarch_index_entry {
    uint32_t hash, key_len;
    uint64_t key_off, size;
    int64_t mtime_ns, atime_ns, ctime_ns;
    uint64_t ino, dev;
    uint32_t mode, uid, gid, nlink;
    uint32_t flags, link; /* link: entry + 1 of a symlink's own lstat record */
    uint64_t blocks;
    uint32_t blksize, nchildren; /* a listed directory's child records: "." "..", then sorted names */
    uint64_t children;
};
struct monarch_index_child {
    uint64_t d_ino, name_off;
    uint32_t entry; /* + 1; 0: a name the index does not describe */
    uint16_t name_len;
    uint8_t d_type, reserved;
};
_Static_assert(sizeof(struct monarch_index_header) == MONARCH_INDEX_HEADER_SIZE, "index header layout");
_Static_assert(sizeof(struct monarch_index_entry) == MONARCH_INDEX_ENTRY_SIZE, "index entry layout");
_Static_assert(sizeof(struct monarch_index_child) == MONARCH_INDEX_CHILD_SIZE, "index child layout");

/* ---- fixed tables ---- */
#define MONARCH_MAX_ROOTS 32 /* a root may appear twice: canonical and configured spelling */
#define MONARCH_MAX_FDS 65536
#define MONARCH_KEY_MAX (PATH_MAX + 16) /* "<k>/" + a path below PATH_MAX */

#define MONARCH_EXPORT __attribute__((visibility("default")))
#define MONARCH_UNLIKELY(x) __builtin_expect(!!(x), 0)

#ifndef __FILE_NAME__
#define __FILE_NAME__ __FILE__
#endif

struct monarch_root {
    char path[PATH_MAX]; /* normalized, no trailing '/'; "" for "/" */
    size_t len;
    unsigned index; /* k in the key "<k>/<rel>", as MONARCH_ROOTS names it */
};

struct monarch_probe {
    char dir[PATH_MAX];
    size_t len;
    unsigned slot;
};

static struct monarch_root monarch_roots[MONARCH_MAX_ROOTS];
static unsigned monarch_nroots;
static struct monarch_probe monarch_probes[MONARCH_MAX_SLOTS];
static unsigned monarch_nprobes;
static int monarch_probing;  /* 0 for good once an INVALIDATE went unconfirmed */
static struct sockaddr_un monarch_sockaddr;
static int monarch_have_socket;
static int monarch_timeout_ms = MONARCH_SHIM_TIMEOUT_MS_DEFAULT;
static uint64_t *monarch_counters; /* MAP_SHARED; NULL => counting off */
/*
 * The snapshot index: a read-only mapping, validated, published once (release) after its
 * header copy is written; NULL => no index (no fstat rewrite, metadata from the PFS).
 * The daemon writes it when its snapshot is ready, which may be after this process
 * started (the walk overlaps the application's start-up): then the first call that needs
 * it waits for it (monarch_index_ready), asking the daemon (INDEX) once per process.
 */
static const unsigned char *monarch_index;
static struct monarch_index_header monarch_index_hdr;
enum monarch_index_state {
    MONARCH_IX_UNKNOWN,    /* not there at start: ask the daemon at the first need */
    MONARCH_IX_INSTALLING, /* one thread maps it (a few microseconds); the others yield */
    MONARCH_IX_MAPPED,     /* mapped: metadata and fstat from it, tier probes allowed */
    MONARCH_IX_NONE,       /* none, or unusable, though the daemon is ready: as without an index */
    MONARCH_IX_OFF         /* the snapshot failed, or the daemon was lost before it: the PFS */
};
static int monarch_index_state = MONARCH_IX_NONE;
static char monarch_index_path[PATH_MAX];
static int monarch_index_wait_ms = MONARCH_SHIM_INDEX_WAIT_MS_DEFAULT;
static uint32_t monarch_crc_table[256];
static int monarch_enabled;
static int monarch_debug;
static int monarch_ready;  /* set (release) when init is complete */
static pid_t monarch_pid;  /* this process; a vfork child sees another pid */
static pthread_once_t monarch_once = PTHREAD_ONCE_INIT;
/* Per descriptor the shim opened: slot + 1 (0 = not ours), for counting; and the
 * index entry + 1 of its source when it is a staged copy (0 = stat passes through). */
static uint8_t monarch_fd_slot[MONARCH_MAX_FDS];
static uint32_t monarch_fd_entry[MONARCH_MAX_FDS];
static __thread int monarch_guard __attribute__((tls_model("initial-exec")));

static void monarch_ensure_init(void);

/* ---- debug: "[monarch pid/tid] file:line ..." on stderr, only when enabled ---- */
__attribute__((format(printf, 3, 4)))
static void monarch_log(const char *file, int line, const char *fmt, ...)
{
    char buf[1024];
    int saved = errno;
    int n = snprintf(buf, sizeof buf, "[monarch %d/%d] %s:%d ", (int)getpid(), monarch_gettid(), file, line);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf)
        n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof buf - 1)
        n = sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n); /* write is not wrapped */
    (void)w;
    errno = saved;
}

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

/* Functions the shim calls itself (tentative definitions: the family macros
 * below define their wrappers) or wraps by hand. */
static int (*real_openat)(int, const char *, int, ...);
static int (*real_unlink)(const char *);
static int (*real_close)(int);
static int (*real_fclose)(FILE *);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_close_range)(unsigned int, unsigned int, int);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off64_t);

/* The kernel's fstat, for the shim's own checks: never our wrapper, and no
 * fstat@GLIBC_2.33 import (64-bit Linux: struct stat is the kernel's). */
static int monarch_sys_fstat(int fd, struct stat *st)
{
    return (int)syscall(SYS_fstat, fd, st);
}

/* ---- counting and the fd tables (hot path: no lock, no allocation, no log) ---- */
static inline uint64_t *monarch_counter(unsigned slot, unsigned which)
{
    return &monarch_counters[MONARCH_HEADER_WORDS + MONARCH_SLOT_WORDS * slot + which];
}

/* This open's bytes go where the shim cannot see them (stdio's internal reads, mmap):
 * count it once as an open whose bytes are unknown. */
static inline void monarch_mark_uncounted(int fd)
{
    if ((unsigned)fd >= MONARCH_MAX_FDS)
        return;
    uint8_t s = __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED);
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (!s || (s & MONARCH_FD_UNCOUNTED) || getpid() != monarch_pid)
        return;
    __atomic_store_n(&monarch_fd_slot[fd], (uint8_t)(s | MONARCH_FD_UNCOUNTED), __ATOMIC_RELAXED);
    if (c)
        __atomic_fetch_add(monarch_counter(s - 1, 2), 1, __ATOMIC_RELAXED);
}

static inline void monarch_count_bytes(int fd, uint64_t n)
{
    if ((unsigned)fd < MONARCH_MAX_FDS) {
        unsigned s = __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED) & ~MONARCH_FD_UNCOUNTED;
        uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
        if (s && c)
            __atomic_fetch_add(monarch_counter(s - 1, 1), n, __ATOMIC_RELAXED);
        if (s)
            MONARCH_DEBUG(3, "fd %d: %llu bytes (slot %u)", fd, (unsigned long long)n, s - 1);
    }
}

/* Remember a managed fd (its slot, and its source's index entry + 1 or 0) and count its open. */
static void monarch_track(int fd, unsigned slot, uint32_t entry)
{
    if (fd < 0)
        return;
    if ((unsigned)fd < MONARCH_MAX_FDS) {
        __atomic_store_n(&monarch_fd_entry[fd], entry, __ATOMIC_RELAXED);
        __atomic_store_n(&monarch_fd_slot[fd], (uint8_t)(slot + 1), __ATOMIC_RELAXED);
    }
    if (monarch_counters)
        __atomic_fetch_add(monarch_counter(slot, 0), 1, __ATOMIC_RELAXED);
}

/* Forget a descriptor (closed, or reused by a pass-through open). A vfork child
 * shares our memory but not our descriptors: it must not touch the tables. */
static inline void monarch_forget(int fd)
{
    if ((unsigned)fd < MONARCH_MAX_FDS && __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED)
        && getpid() == monarch_pid) {
        __atomic_store_n(&monarch_fd_entry[fd], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&monarch_fd_slot[fd], 0, __ATOMIC_RELAXED);
    }
}

/* newfd now refers to oldfd's file. */
static inline void monarch_copy_slot(int oldfd, int newfd)
{
    if ((unsigned)newfd >= MONARCH_MAX_FDS)
        return;
    int ours = (unsigned)oldfd < MONARCH_MAX_FDS;
    uint8_t s = ours ? __atomic_load_n(&monarch_fd_slot[oldfd], __ATOMIC_RELAXED) : 0;
    uint32_t e = ours ? __atomic_load_n(&monarch_fd_entry[oldfd], __ATOMIC_RELAXED) : 0;
    if ((s || __atomic_load_n(&monarch_fd_slot[newfd], __ATOMIC_RELAXED)) && getpid() == monarch_pid) {
        __atomic_store_n(&monarch_fd_entry[newfd], e, __ATOMIC_RELAXED);
        __atomic_store_n(&monarch_fd_slot[newfd], s, __ATOMIC_RELAXED);
    }
}

/* ---- paths ---- */

/* Lexically normalize an absolute path in place ('.', '..', '//'); returns its length. */
static size_t monarch_normalize(char *p)
{
    size_t r = 0, w = 0;
    while (p[r]) {
        while (p[r] == '/')
            r++;
        if (!p[r])
            break;
        size_t s = r;
        while (p[r] && p[r] != '/')
            r++;
        size_t len = r - s;
        if (len == 1 && p[s] == '.')
            continue;
        if (len == 2 && p[s] == '.' && p[s + 1] == '.') {
            while (w > 0 && p[w - 1] != '/')
                w--;
            if (w > 0)
                w--;
            continue;
        }
        p[w++] = '/';
        memmove(p + w, p + s, len);
        w += len;
    }
    if (w == 0)
        p[w++] = '/';
    p[w] = '\0';
    return w;
}

/* Does the path have a ".." component? */
static int monarch_has_dotdot(const char *p)
{
    for (const char *c = strstr(p, ".."); c; c = strstr(c + 1, ".."))
        if ((c == p || c[-1] == '/') && (c[2] == '\0' || c[2] == '/'))
            return 1;
    return 0;
}

/*
 * The absolute form of (dirfd, path) into out[PATH_MAX], as the kernel will
 * look it up; -1 if unknown. Without "..": lexical. With "..": the directory
 * part through realpath() (symlinks followed, as the kernel does before it
 * applies ".."), then the last component unresolved (open follows it, unlink
 * and rename do not; either way the key names what the call names).
 */
static int monarch_abspath(int dirfd, const char *path, char *out, size_t *lenp)
{
    size_t n = 0;
    if (path[0] != '/') {
        if (dirfd == AT_FDCWD) {
            if (!getcwd(out, PATH_MAX))
                return -1;
            n = strlen(out);
        } else {
            char link[32] = "/proc/self/fd/";
            char digits[12];
            size_t d = 0, l = strlen(link);
            unsigned v = (unsigned)dirfd;
            if (dirfd < 0)
                return -1;
            do {
                digits[d++] = (char)('0' + v % 10);
                v /= 10;
            } while (v);
            while (d)
                link[l++] = digits[--d];
            link[l] = '\0';
            ssize_t k = readlink(link, out, PATH_MAX - 1);
            if (k <= 0 || out[0] != '/')
                return -1;
            n = (size_t)k;
        }
        out[n++] = '/';
    }
    size_t plen = strlen(path);
    if (n + plen >= PATH_MAX)
        return -1;
    memcpy(out + n, path, plen + 1);
    if (MONARCH_UNLIKELY(monarch_has_dotdot(out))) {
        char dir[PATH_MAX];
        size_t e = n + plen;
        while (e > 1 && out[e - 1] == '/') /* "d/" names d */
            e--;
        size_t s = e;
        while (s > 0 && out[s - 1] != '/')
            s--;
        const char *last = out + s;
        size_t llen = e - s;
        int whole = (llen == 2 && last[0] == '.' && last[1] == '.') || (llen == 1 && last[0] == '.');
        memcpy(dir, out, whole ? e : s);
        dir[whole ? e : s] = '\0';
        char resolved[PATH_MAX];
        if (!realpath(dir[0] ? dir : "/", resolved))
            return -1;
        size_t rl = strlen(resolved);
        if (!whole) {
            if (rl + 1 + llen >= PATH_MAX)
                return -1;
            resolved[rl++] = '/';
            memcpy(resolved + rl, last, llen);
            rl += llen;
            resolved[rl] = '\0';
        }
        memcpy(out, resolved, rl + 1);
    }
    *lenp = monarch_normalize(out);
    return 0;
}

/* A trailing "/", "/." or "/.." asks for a directory: leave such paths to the kernel. */
static int monarch_wants_dir(const char *path)
{
    size_t n = strlen(path);
    if (path[n - 1] == '/')
        return 1;
    if (path[n - 1] != '.')
        return 0;
    if (n == 1 || path[n - 2] == '/')
        return 1;
    return path[n - 2] == '.' && (n == 2 || path[n - 3] == '/');
}

/* The key "<k>/<rel>" of (dirfd, path) into key[MONARCH_KEY_MAX] when it lies under a
 * root (with allow_root, root k itself too: the key "<k>/"); 0, its length in *klp and k
 * in *kp, or -1 when not managed. The absolute path is left in abs[PATH_MAX]. */
static int monarch_key_abs(int dirfd, const char *path, int allow_root, char *key, size_t *klp, unsigned *kp,
                           char *abs)
{
    size_t len;
    if (monarch_abspath(dirfd, path, abs, &len) != 0)
        return -1;
    for (unsigned i = 0; i < monarch_nroots; i++) {
        const struct monarch_root *r = &monarch_roots[i];
        const char *rel;
        if (len < r->len || memcmp(abs, r->path, r->len) != 0)
            continue;
        if (len > r->len + 1 && abs[r->len] == '/')
            rel = abs + r->len + 1;
        else if (allow_root && (len == r->len || (r->len == 0 && len == 1)))
            rel = "";
        else
            continue;
        int kl = snprintf(key, MONARCH_KEY_MAX, "%u/%s", r->index, rel);
        if (kl <= 0 || kl >= MONARCH_KEY_MAX || kl > MONARCH_MAX_REQUEST)
            return -1;
        *klp = (size_t)kl;
        *kp = r->index;
        return 0;
    }
    return -1;
}

/* The key of a path strictly under a root (what opens and INVALIDATE name). */
static int monarch_key(int dirfd, const char *path, char *key, size_t *klp)
{
    char abs[PATH_MAX];
    unsigned k;
    return monarch_key_abs(dirfd, path, 0, key, klp, &k, abs);
}

/* <probe dir>/<key> into out[PATH_MAX]; -1 if too long. */
static int monarch_probe_path(const struct monarch_probe *pr, const char *key, size_t kl, char *out)
{
    if (pr->len + 1 + kl >= PATH_MAX)
        return -1;
    memcpy(out, pr->dir, pr->len);
    out[pr->len] = '/';
    memcpy(out + pr->len + 1, key, kl + 1);
    return 0;
}

static int monarch_is_regular(int fd)
{
    struct stat st;
    return monarch_sys_fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- the snapshot index: the source's stat of a key (slow path only) ---- */
static uint32_t monarch_crc32(const char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = monarch_crc_table[(c ^ (unsigned char)p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* The index mapping, or NULL: acquire, so that its header copy is seen with it. */
static inline const unsigned char *monarch_idx(void)
{
    return __atomic_load_n(&monarch_index, __ATOMIC_ACQUIRE);
}

static int monarch_index_settle(void);

/* The index's state for a call that needs it (under a root), waiting for it first if it
 * was not there when this process started: once settled, a single acquire load (a plain
 * load on x86-64). Call it with monarch_guard set (the wait makes calls of its own). */
static inline int monarch_index_ready(void)
{
    int s = __atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE);
    return MONARCH_UNLIKELY(s < MONARCH_IX_MAPPED) ? monarch_index_settle() : s;
}

/* Entry number n (from 1) into *e, if it is inside the mapping. */
static int monarch_index_entry(uint32_t n, struct monarch_index_entry *e)
{
    const unsigned char *m = monarch_idx();
    const struct monarch_index_header *h = &monarch_index_hdr;
    if (!m || n == 0 || n > h->entries)
        return -1;
    memcpy(e, m + h->entries_off + (uint64_t)(n - 1) * MONARCH_INDEX_ENTRY_SIZE, sizeof *e);
    return 0;
}

/* Entry number + 1 of key, or 0: protocol.index_lookup, bounded by the table size. */
static uint32_t monarch_index_lookup(const char *key, size_t kl)
{
    const unsigned char *m = monarch_idx();
    const struct monarch_index_header *h = &monarch_index_hdr;
    if (!m)
        return 0;
    uint32_t hash = monarch_crc32(key, kl), mask = h->buckets - 1;
    for (uint32_t i = 0, b = hash & mask; i < h->buckets; i++, b = (b + 1) & mask) {
        uint32_t n;
        memcpy(&n, m + h->buckets_off + 4 * (uint64_t)b, sizeof n);
        struct monarch_index_entry e;
        if (n == 0 || monarch_index_entry(n, &e) != 0)
            return 0;
        if (e.hash == hash && e.key_len == kl && e.key_off <= h->keys_size && kl <= h->keys_size - e.key_off
            && memcmp(m + h->keys_off + e.key_off, key, kl) == 0)
            return n;
    }
    return 0;
}

/* Is key a file of the snapshot whose name is not a symlink? (O_NOFOLLOW opens: only
 * then is the copy what the kernel would open; without an index, nobody can say.) */
static int monarch_is_plain_file(const char *key, size_t kl)
{
    struct monarch_index_entry e;
    uint32_t n = monarch_index_lookup(key, kl);
    return n && monarch_index_entry(n, &e) == 0 && !(e.flags & MONARCH_INDEX_FLAG_SYMLINK);
}

static void monarch_ns(int64_t ns, struct timespec *ts)
{
    int64_t s = ns / 1000000000, r = ns % 1000000000;
    if (r < 0) { /* before 1970: tv_nsec stays in [0, 1e9) */
        s -= 1;
        r += 1000000000;
    }
    ts->tv_sec = (time_t)s;
    ts->tv_nsec = (long)r;
}

/* stat and stat64 have the same field names: one body for both. */
#define MONARCH_FILL_STAT(st, e)                      \
    do {                                              \
        if ((e).blksize) {                            \
            (st)->st_blocks = (blkcnt_t)(e).blocks;   \
            (st)->st_blksize = (blksize_t)(e).blksize; \
        }                                             \
        (st)->st_size = (off_t)(e).size;              \
        (st)->st_mode = (mode_t)(e).mode;             \
        (st)->st_uid = (uid_t)(e).uid;                \
        (st)->st_gid = (gid_t)(e).gid;                \
        (st)->st_nlink = (nlink_t)(e).nlink;          \
        (st)->st_ino = (e).ino;                       \
        (st)->st_dev = (dev_t)(e).dev;                \
        monarch_ns((e).atime_ns, &(st)->st_atim);     \
        monarch_ns((e).mtime_ns, &(st)->st_mtim);     \
        monarch_ns((e).ctime_ns, &(st)->st_ctim);     \
    } while (0)

/* The source's stat for a staged descriptor; anything else is left as the kernel said. */
static inline int monarch_fd_source(int fd, struct monarch_index_entry *e)
{
    if ((unsigned)fd >= MONARCH_MAX_FDS)
        return 0;
    uint32_t n = __atomic_load_n(&monarch_fd_entry[fd], __ATOMIC_RELAXED);
    return n && monarch_index_entry(n, e) == 0;
}

static void monarch_fill_stat(int fd, struct stat *st)
{
    struct monarch_index_entry e;
    if (monarch_fd_source(fd, &e))
        MONARCH_FILL_STAT(st, e);
}

static void monarch_fill_stat64(int fd, struct stat64 *st)
{
    struct monarch_index_entry e;
    if (monarch_fd_source(fd, &e))
        MONARCH_FILL_STAT(st, e);
}

static void monarch_put_statx(const struct monarch_index_entry *ep, struct statx *st)
{
    struct monarch_index_entry e = *ep;
    struct timespec ts;
    if (e.blksize) {
        st->stx_blocks = e.blocks;
        st->stx_blksize = e.blksize;
        st->stx_mask |= STATX_BLOCKS;
    }
    st->stx_size = e.size;
    st->stx_mode = (uint16_t)e.mode;
    st->stx_uid = e.uid;
    st->stx_gid = e.gid;
    st->stx_nlink = e.nlink;
    st->stx_ino = e.ino;
    /* Linux's dev_t encoding (gnu_dev_major/minor), without the libc call */
    st->stx_dev_major = (uint32_t)(((e.dev >> 8) & 0xfff) | ((e.dev >> 32) & ~0xfffULL));
    st->stx_dev_minor = (uint32_t)((e.dev & 0xff) | ((e.dev >> 12) & ~0xffULL));
    monarch_ns(e.atime_ns, &ts);
    st->stx_atime.tv_sec = ts.tv_sec;
    st->stx_atime.tv_nsec = (uint32_t)ts.tv_nsec;
    monarch_ns(e.mtime_ns, &ts);
    st->stx_mtime.tv_sec = ts.tv_sec;
    st->stx_mtime.tv_nsec = (uint32_t)ts.tv_nsec;
    monarch_ns(e.ctime_ns, &ts);
    st->stx_ctime.tv_sec = ts.tv_sec;
    st->stx_ctime.tv_nsec = (uint32_t)ts.tv_nsec;
    st->stx_mask |= STATX_TYPE | STATX_MODE | STATX_NLINK | STATX_UID | STATX_GID | STATX_ATIME | STATX_MTIME
                    | STATX_CTIME | STATX_INO | STATX_SIZE;
}

static void monarch_fill_statx(int fd, struct statx *st)
{
    struct monarch_index_entry e;
    if (monarch_fd_source(fd, &e))
        monarch_put_statx(&e, st);
}

/* fstatat-like calls describe the descriptor itself only with AT_EMPTY_PATH and ""
 * (a function, not a test in the wrapper: glibc declares the path nonnull). */
static int monarch_on_fd(const char *path, int flags)
{
    return (flags & AT_EMPTY_PATH) && path && !path[0];
}
#define MONARCH_ON_FD(path, flags) monarch_on_fd(path, flags)


/* ---- metadata answered from the index (stat, access, directory listings) ----
 *
 * A metadata call on a path under a root is answered from the snapshot index when the
 * index describes it: a file or directory it has an entry for (lstat of a symlinked file
 * from its link record), or a name that does not exist (ENOENT) because its parent is a
 * directory listed whole whose listing lacks it. Anything else -- a name the listing has
 * but the index does not describe (a symlink to a directory, a special file), a path
 * below such a name, the root's own lstat, a statx asking for more than the basic stats,
 * flags the answer would have to interpret -- is the PFS's, as is everything once the
 * job has changed something under that root (EXTRA_META_OFF, set by monarch_invalidate
 * for every process of the job on the node: the answers never go stale).
 * The hot path (a path under no root) is the prefix match of monarch_key_abs and out.
 */
enum monarch_meta { MONARCH_META_NOT_OURS, MONARCH_META_PASS, MONARCH_META_FOUND, MONARCH_META_ABSENT };

static inline int monarch_start(void);
static int monarch_map_index(const char *path, int *missing);

static inline uint64_t *monarch_extra(uint64_t *c, unsigned which)
{
    return &c[MONARCH_HEADER_WORDS + MONARCH_SLOT_WORDS * MONARCH_MAX_SLOTS + which];
}

static inline uint64_t monarch_root_bit(unsigned k)
{
    return k < 63 ? 1ULL << k : 1ULL << 63;
}

/* May root k's metadata come from the index? Not without an index or a counters file
 * (the job-wide "changed" bits live there), nor once the job changed something under it. */
static inline int monarch_meta_on(unsigned k)
{
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    return c && monarch_idx()
           && !(__atomic_load_n(monarch_extra(c, MONARCH_EXTRA_META_OFF), __ATOMIC_ACQUIRE) & monarch_root_bit(k));
}

/* Count one managed metadata call: answered here (local) or sent to the PFS. */
static inline void monarch_meta_count(int how)
{
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && how != MONARCH_META_NOT_OURS)
        __atomic_fetch_add(monarch_extra(c, how == MONARCH_META_PASS ? MONARCH_EXTRA_META_PFS
                                                                     : MONARCH_EXTRA_META_LOCAL),
                           1, __ATOMIC_RELAXED);
}

/* Child record i into *c and its name, if both are inside the mapping. */
static int monarch_index_child(uint64_t i, struct monarch_index_child *c, const char **name)
{
    const unsigned char *m = monarch_idx();
    const struct monarch_index_header *h = &monarch_index_hdr;
    if (!m || i >= h->children_count)
        return -1;
    memcpy(c, m + h->children_off + i * MONARCH_INDEX_CHILD_SIZE, sizeof *c);
    if (c->name_off > h->keys_size || c->name_len > h->keys_size - c->name_off)
        return -1;
    *name = (const char *)m + h->keys_off + c->name_off;
    return 0;
}

/* Does listed directory d name `name`? 1 yes (or cannot tell), 0 no: a binary search of
 * its sorted names (after "." and ".."). */
static int monarch_child_named(const struct monarch_index_entry *d, const char *name, size_t nl)
{
    if (d->nchildren < 2 || d->children > monarch_index_hdr.children_count
        || d->nchildren > monarch_index_hdr.children_count - d->children)
        return 1;
    uint64_t lo = d->children + 2, hi = d->children + d->nchildren;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        struct monarch_index_child c;
        const char *cn;
        if (monarch_index_child(mid, &c, &cn) != 0)
            return 1;
        int cmp = memcmp(cn, name, c.name_len < nl ? c.name_len : nl);
        if (!cmp)
            cmp = (c.name_len > nl) - (c.name_len < nl);
        if (!cmp)
            return 1;
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* The index's answer for key (of root k): FOUND with the entry in *e, ABSENT, or PASS. */
static int monarch_meta_answer(const char *key, size_t kl, unsigned k, int nofollow, int wants_dir,
                               struct monarch_index_entry *e)
{
    if (!monarch_meta_on(k))
        return MONARCH_META_PASS;
    uint32_t n = monarch_index_lookup(key, kl);
    if (n) {
        if (monarch_index_entry(n, e) != 0)
            return MONARCH_META_PASS;
        if (e->flags & MONARCH_INDEX_FLAG_SYMLINK) {
            if (wants_dir || (nofollow && (!e->link || monarch_index_entry(e->link, e) != 0)))
                return MONARCH_META_PASS; /* "link/" is ENOTDIR; no link record: the kernel's */
        } else if (nofollow && key[kl - 1] == '/') {
            return MONARCH_META_PASS; /* the root's own spelling may be a symlink */
        } else if (wants_dir && !S_ISDIR(e->mode)) {
            return MONARCH_META_PASS;
        }
        return MONARCH_META_FOUND;
    }
    /* Not described: absent if its parent was listed whole without this name. */
    size_t p = kl;
    while (p > 0 && key[p - 1] != '/')
        p--;
    const char *slash = memchr(key, '/', kl);
    if (p == kl || !slash || kl - p > NAME_MAX)
        return MONARCH_META_PASS;
    size_t plen = (size_t)(slash - key) + 1 == p ? p : p - 1; /* a root's child: the parent is "<k>/" */
    struct monarch_index_entry d;
    uint32_t pn = monarch_index_lookup(key, plen);
    if (!pn || monarch_index_entry(pn, &d) != 0 || !(d.flags & MONARCH_INDEX_FLAG_LISTED)
        || (d.flags & MONARCH_INDEX_FLAG_SYMLINK) || monarch_child_named(&d, key + p, kl - p))
        return MONARCH_META_PASS;
    return MONARCH_META_ABSENT;
}

/* Look (dirfd, path) up: NOT_OURS (no root's), or the index's answer; abs[PATH_MAX] gets
 * the absolute path when abs is not NULL. errno is kept. */
static int monarch_meta_find(int dirfd, const char *path, int nofollow, struct monarch_index_entry *e, char *abs)
{
    if (monarch_guard || !path || !path[0] || !monarch_start())
        return MONARCH_META_NOT_OURS;
    char key[MONARCH_KEY_MAX], buf[PATH_MAX];
    size_t kl;
    unsigned k;
    int saved = errno, r = MONARCH_META_NOT_OURS;
    monarch_guard = 1;
    if (monarch_key_abs(dirfd, path, 1, key, &kl, &k, abs ? abs : buf) == 0) {
        monarch_index_ready(); /* started before the daemon's walk ended: the index, once there */
        r = monarch_meta_answer(key, kl, k, nofollow, monarch_wants_dir(path), e);
    }
    monarch_guard = 0;
    errno = saved;
    return r;
}

/* fstatat-style flags the index can answer for (the rest are the kernel's to judge). */
#define MONARCH_STAT_FLAGS (AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_EMPTY_PATH)

/* stat of a path from the index: 1 when answered (*r the result, errno set on failure),
 * 0 to make the real call. `type` is stat or stat64; ver is __xstat's version. */
#define MONARCH_META_STAT_FN(type)                                                           \
    static int monarch_meta_##type(int dirfd, const char *path, int flags, unsigned ver,     \
                                   struct type *buf, int *r)                                 \
    {                                                                                        \
        struct monarch_index_entry e;                                                        \
        int how = monarch_meta_find(dirfd, path, flags & AT_SYMLINK_NOFOLLOW, &e, NULL);     \
        if (how != MONARCH_META_NOT_OURS && ((int)ver != MONARCH_STAT_VER || (flags & ~MONARCH_STAT_FLAGS))) \
            how = MONARCH_META_PASS;                                                         \
        monarch_meta_count(how);                                                             \
        if (how == MONARCH_META_FOUND) {                                                     \
            memset(buf, 0, sizeof *buf);                                                     \
            MONARCH_FILL_STAT(buf, e);                                                       \
            *r = 0;                                                                          \
            return 1;                                                                        \
        }                                                                                    \
        if (how == MONARCH_META_ABSENT) {                                                    \
            errno = ENOENT;                                                                  \
            *r = -1;                                                                         \
            return 1;                                                                        \
        }                                                                                    \
        return 0;                                                                            \
    }
MONARCH_META_STAT_FN(stat)
MONARCH_META_STAT_FN(stat64)

static int monarch_meta_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *buf, int *r)
{
    struct monarch_index_entry e;
    int ok = !(flags & ~(MONARCH_STAT_FLAGS | AT_STATX_DONT_SYNC)) && !(mask & ~STATX_BASIC_STATS);
    int how = monarch_meta_find(dirfd, path, flags & AT_SYMLINK_NOFOLLOW, &e, NULL);
    if (!ok && how != MONARCH_META_NOT_OURS)
        how = MONARCH_META_PASS;
    monarch_meta_count(how);
    if (how == MONARCH_META_FOUND) {
        memset(buf, 0, sizeof *buf);
        buf->stx_blksize = 4096;
        monarch_put_statx(&e, buf);
        *r = 0;
        return 1;
    }
    if (how == MONARCH_META_ABSENT) {
        errno = ENOENT;
        *r = -1;
        return 1;
    }
    return 0;
}

/* access/faccessat from the index: existence always; permission bits only for the owner
 * (whose bits the kernel checks first, ACL or not) and not for root or W_OK (a read-only
 * mount, root squash and ACLs are the PFS's to say). */
static int monarch_meta_access(int dirfd, const char *path, int mode, int flags, int *r)
{
    struct monarch_index_entry e;
    int how = monarch_meta_find(dirfd, path, flags & AT_SYMLINK_NOFOLLOW, &e, NULL);
    if (how == MONARCH_META_FOUND && mode != F_OK) {
        uid_t uid = (flags & AT_EACCESS) ? geteuid() : getuid();
        if ((flags & ~(AT_EACCESS | AT_SYMLINK_NOFOLLOW)) || (mode & ~(R_OK | X_OK)) || uid == 0 || uid != e.uid)
            how = MONARCH_META_PASS;
    }
    monarch_meta_count(how);
    if (how == MONARCH_META_FOUND) {
        unsigned granted = (e.mode >> 6) & 7;
        *r = (mode == F_OK || !((unsigned)mode & ~granted)) ? 0 : -1;
        if (*r)
            errno = EACCES;
        return 1;
    }
    if (how == MONARCH_META_ABSENT) {
        errno = ENOENT;
        *r = -1;
        return 1;
    }
    return 0;
}

/* ---- directory listings from the index ----
 * An emulated DIR: opendir/fdopendir of a directory the index lists whole return one of
 * these; readdir & co. recognise it by its first two words (a magic and its own address:
 * a glibc DIR starts with a descriptor, a lock and a size, never that). */
#define MONARCH_DIR_MAGIC 0x4D4F4E4449523031ULL /* "MONDIR01" */
struct monarch_dir {
    uint64_t magic;
    struct monarch_dir *self;
    int fd;              /* fdopendir's descriptor, or dirfd()'s late open of path; -1: none yet */
    uint64_t first;      /* its child records: first, count; pos counts from 0 */
    uint32_t count;
    long pos;
    char path[PATH_MAX]; /* absolute, for dirfd() */
    union {
        struct dirent d;
        struct dirent64 d64;
    } ent;
};

static inline struct monarch_dir *monarch_dir_of(DIR *dirp)
{
    struct monarch_dir *m = (struct monarch_dir *)(void *)dirp;
    uint64_t magic;
    void *self;
    if (!dirp)
        return NULL;
    memcpy(&magic, m, sizeof magic);
    if (magic != MONARCH_DIR_MAGIC)
        return NULL;
    memcpy(&self, (char *)m + offsetof(struct monarch_dir, self), sizeof self);
    return self == (void *)m ? m : NULL;
}

/*
 * opendir (fd < 0) or fdopendir (fd) of (dirfd, path): 1 when answered from the index
 * (*out a new emulated DIR, or NULL with errno ENOENT), 0 to make the real call.
 */
static int monarch_meta_opendir(int dirfd, const char *path, int fd, DIR **out)
{
    struct monarch_index_entry e;
    char abs[PATH_MAX];
    if (fd >= 0) { /* what fdopendir refuses (O_PATH, write-only) it must refuse itself */
        long fl = syscall(SYS_fcntl, fd, F_GETFL);
        if (fl < 0 || (fl & O_PATH) || (fl & O_ACCMODE) == O_WRONLY)
            return 0;
    }
    int how = monarch_meta_find(dirfd, path, 0, &e, abs);
    if (how == MONARCH_META_FOUND && (!S_ISDIR(e.mode) || !(e.flags & MONARCH_INDEX_FLAG_LISTED)))
        how = MONARCH_META_PASS;
    if (how == MONARCH_META_ABSENT && fd >= 0)
        how = MONARCH_META_PASS; /* an open descriptor exists: the index is out of date */
    struct monarch_dir *m = NULL;
    if (how == MONARCH_META_FOUND && !(m = malloc(sizeof *m)))
        how = MONARCH_META_PASS;
    monarch_meta_count(how);
    if (how == MONARCH_META_ABSENT) {
        errno = ENOENT;
        *out = NULL;
        return 1;
    }
    if (how != MONARCH_META_FOUND)
        return 0;
    m->magic = MONARCH_DIR_MAGIC;
    m->self = m;
    m->fd = fd;
    m->first = e.children;
    m->count = e.nchildren;
    m->pos = 0;
    strcpy(m->path, abs);
    MONARCH_DEBUG(2, "opendir %s: %u names from the index", abs, e.nchildren);
    *out = (DIR *)(void *)m;
    return 1;
}

/* The next record of an emulated DIR into its dirent (dirent or dirent64: same fields). */
#define MONARCH_FILL_DIRENT(m, ent, ok)                                                       \
    do {                                                                                      \
        struct monarch_index_child c_;                                                        \
        const char *name_;                                                                    \
        ok = 0;                                                                               \
        while ((m)->pos >= 0 && (uint64_t)(m)->pos < (m)->count) {                            \
            long i_ = (m)->pos++;                                                             \
            if (monarch_index_child((m)->first + (uint64_t)i_, &c_, &name_) != 0)            \
                continue;                                                                     \
            size_t nl_ = i_ == 0 ? 1 : i_ == 1 ? 2 : c_.name_len;                             \
            if (nl_ >= sizeof (ent).d_name)                                                   \
                continue;                                                                     \
            memcpy((ent).d_name, i_ < 2 ? ".." : name_, nl_);                                 \
            (ent).d_name[nl_] = '\0';                                                         \
            (ent).d_ino = c_.d_ino;                                                           \
            (ent).d_off = i_ + 1;                                                             \
            (ent).d_type = c_.d_type;                                                         \
            (ent).d_reclen = (unsigned short)((offsetof(__typeof__(ent), d_name) + nl_ + 8) & ~(size_t)7); \
            ok = 1;                                                                           \
            break;                                                                            \
        }                                                                                     \
    } while (0)

/* ---- the daemon ---- */
static long monarch_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Keep the first descriptor a daemon passed (in *fdp, if wanted and still free) and close
 * every other one: nothing the daemon sends can leak descriptors into the application. */
static void monarch_take_fds(struct msghdr *m, int *fdp)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (fdp && *fdp < 0)
                *fdp = fd;
            else
                real_close(fd);
        }
    }
}

/* Exactly n bytes from s before deadline (ms, monotonic); -1 on timeout, error or EOF.
 * A descriptor passed with them (SCM_RIGHTS) goes to *fdp (see monarch_take_fds). */
static int monarch_recv_exact(int s, void *buf, size_t n, long deadline, int *fdp)
{
    size_t got = 0;
    while (got < n) {
        long left = deadline - monarch_now_ms();
        if (left <= 0)
            return -1;
        struct pollfd pfd = {s, POLLIN, 0};
        int pr = poll(&pfd, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue; /* timeout: the deadline check above ends the loop */
        union {
            struct cmsghdr align;
            char bytes[CMSG_SPACE(MONARCH_MAX_PASSED_FDS * sizeof(int))];
        } control;
        struct iovec iov = {(char *)buf + got, n - got};
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = control.bytes;
        m.msg_controllen = sizeof control.bytes;
        ssize_t r = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
        if (r >= 0)
            monarch_take_fds(&m, fdp);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0) {
            MONARCH_DEBUG(1, "daemon: %s", r == 0 ? "closed without answer" : strerror(errno));
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

static uint32_t monarch_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/*
 * One request to the daemon (verb, key) over a fresh connection. Heartbeats
 * (STATUS_PENDING, empty) are skipped, each one restarting the "alive" timer.
 * Returns the answer's status, with its body in body[bodymax] (NUL-terminated;
 * NULL: the body is not wanted and not read) and a descriptor the daemon passed
 * in *fdp (-1 if none; fdp NULL: any is closed), or INT_MIN when the daemon cannot
 * be asked, is not of our uid, goes silent, takes more than total_ms in all or breaks
 * the frame rules (an oversized body, a NUL in it, a heartbeat with a body).
 */
static int monarch_request(unsigned verb, const char *key, size_t kl, char *body, size_t bodymax, int *fdp,
                           int total_ms)
{
    unsigned char req[MONARCH_REQUEST_HEADER_SIZE + MONARCH_KEY_MAX];
    if (!monarch_have_socket || kl > MONARCH_MAX_REQUEST || kl > MONARCH_KEY_MAX)
        return INT_MIN;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return INT_MIN;
    int status = INT_MIN;
    long start = monarch_now_ms(), deadline = start + total_ms;
    int tmo = total_ms < MONARCH_HEARTBEAT_TIMEOUT_MS ? total_ms : MONARCH_HEARTBEAT_TIMEOUT_MS;
    struct timeval tv = {tmo / 1000, (tmo % 1000) * 1000};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect and send */
    if (connect(s, (const struct sockaddr *)&monarch_sockaddr, sizeof monarch_sockaddr) != 0) {
        MONARCH_DEBUG(1, "daemon %s: connect: %s", monarch_sockaddr.sun_path, strerror(errno));
        goto out;
    }
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || clen != sizeof cred || cred.uid != getuid()) {
        MONARCH_DEBUG(1, "daemon %s: peer uid %d is not ours (%d); not asking it", monarch_sockaddr.sun_path,
                      clen == sizeof cred ? (int)cred.uid : -1, (int)getuid());
        goto out;
    }
    req[0] = (unsigned char)verb;
    req[1] = req[2] = req[3] = 0;
    for (int i = 0; i < 4; i++)
        req[4 + i] = (unsigned char)(kl >> (8 * i));
    memcpy(req + MONARCH_REQUEST_HEADER_SIZE, key, kl);
    size_t len = MONARCH_REQUEST_HEADER_SIZE + kl;
    for (size_t off = 0; off < len;) {
        ssize_t w = send(s, req + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            MONARCH_DEBUG(1, "daemon: send: %s", strerror(errno));
            goto out;
        }
        off += (size_t)w;
    }
    for (;;) {
        unsigned char hdr[MONARCH_ANSWER_HEADER_SIZE];
        long alive = monarch_now_ms() + MONARCH_HEARTBEAT_TIMEOUT_MS;
        if (monarch_recv_exact(s, hdr, sizeof hdr, alive < deadline ? alive : deadline, fdp) != 0) {
            MONARCH_DEBUG(1, "daemon: no answer (silent for %d ms, or %d ms in all)", MONARCH_HEARTBEAT_TIMEOUT_MS,
                          total_ms);
            goto out;
        }
        int32_t st = (int32_t)monarch_le32(hdr);
        uint32_t blen = monarch_le32(hdr + 4);
        if (st == MONARCH_STATUS_PENDING) {
            if (blen) {
                MONARCH_DEBUG(1, "daemon: heartbeat with a %u-byte body", blen);
                goto out;
            }
            MONARCH_DEBUG(2, "daemon: pending (%ld ms)", monarch_now_ms() - start);
            continue;
        }
        if (body) {
            if (blen >= bodymax) {
                MONARCH_DEBUG(1, "daemon: answer of %u bytes refused (limit %zu)", blen, bodymax - 1);
                goto out;
            }
            alive = monarch_now_ms() + MONARCH_HEARTBEAT_TIMEOUT_MS;
            if (monarch_recv_exact(s, body, blen, alive < deadline ? alive : deadline, fdp) != 0)
                goto out;
            if (memchr(body, '\0', blen)) {
                MONARCH_DEBUG(1, "daemon: answer with a NUL byte refused");
                goto out;
            }
            body[blen] = '\0';
        }
        status = st;
        break;
    }
out:
    real_close(s);
    if (status == INT_MIN && fdp && *fdp >= 0) {
        real_close(*fdp);
        *fdp = -1;
    }
    return status;
}

/* Is an OPEN answer's path one we may open: absolute, inside a probe dir, no "..". */
static int monarch_answer_allowed(const char *path)
{
    if (path[0] != '/' || monarch_has_dotdot(path))
        return 0;
    for (unsigned i = 0; i < monarch_nprobes; i++) {
        const struct monarch_probe *pr = &monarch_probes[i];
        if (strncmp(path, pr->dir, pr->len) == 0 && path[pr->len] == '/' && path[pr->len + 1])
            return 1;
    }
    return 0;
}

/* ---- waiting for the snapshot index ----
 * A process started before the daemon's walk ended finds no index at start. Its first
 * call that needs one (a metadata call or a read-only open under a root) asks the daemon
 * INDEX, which holds the request until the index is written (heartbeats meanwhile) or
 * says the snapshot failed. The wait is bounded: MONARCH_SHIM_INDEX_WAIT_MS in all, and
 * HEARTBEAT_TIMEOUT_MS of silence. Then, once for the process:
 *   ready        map it (MAPPED), or NONE if it cannot be mapped (as without an index);
 *   failed, lost, silent, too long: OFF -- every call under a root goes to the PFS, and
 *                no tier is probed (kept copies are checked against the snapshot before
 *                the index appears: without it, nobody vouches for them).
 * Each waiting thread asks on its own connection (nothing shared is held while waiting:
 * a fork or a signal meanwhile cannot deadlock); the first answer installs the verdict,
 * one thread at a time (INSTALLING, a few microseconds), the later ones take it.
 * fstat of a staged descriptor never waits: a descriptor is a staged copy only through an
 * open that waited (the fd tables do not survive exec).
 */
static int monarch_index_settle(void)
{
    int s = __atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE);
    while (s < MONARCH_IX_MAPPED) {
        if (s == MONARCH_IX_INSTALLING) {
            sched_yield();
            s = __atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE);
            continue;
        }
        long t0 = monarch_now_ms();
        MONARCH_DEBUG(1, "index %s: not there yet; waiting for the daemon's snapshot", monarch_index_path);
        int answer = monarch_request(MONARCH_VERB_INDEX, "", 0, NULL, 0, NULL, monarch_index_wait_ms);
        int expected = MONARCH_IX_UNKNOWN;
        if (!__atomic_compare_exchange_n(&monarch_index_state, &expected, MONARCH_IX_INSTALLING, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            s = expected; /* another thread settled it meanwhile */
            continue;
        }
        int missing = 0;
        if (answer == INT_MIN || answer == MONARCH_INDEX_NONE)
            s = MONARCH_IX_OFF;
        else /* ready; or a daemon that does not know INDEX (it wrote its index before serving) */
            s = monarch_map_index(monarch_index_path, &missing) == 0 ? MONARCH_IX_MAPPED : MONARCH_IX_NONE;
        MONARCH_DEBUG(1, "index %s: %s after %ld ms (daemon %d)", monarch_index_path,
                      s == MONARCH_IX_MAPPED ? "mapped" : s == MONARCH_IX_NONE ? "unusable" : "none: the PFS",
                      monarch_now_ms() - t0, answer);
        __atomic_store_n(&monarch_index_state, s, __ATOMIC_RELEASE);
    }
    return s;
}

/* ---- the open decision ---- */

static int monarch_open_staged(const char *path, int flags)
{
    int fd = MONARCH_RESOLVE(openat)(AT_FDCWD, path, flags);
    if (fd >= 0 && !monarch_is_regular(fd)) {
        real_close(fd);
        fd = -1;
    }
    return fd;
}

/* A descriptor the daemon passed for key (a decompressed copy): a regular file, sealed
 * against any change (MONARCH_MEMFD_SEALS), of the snapshot's size; close-on-exec only
 * if the application asked for it (it arrived with FD_CLOEXEC set). */
static int monarch_passed_ok(int fd, const char *key, size_t kl, int flags)
{
    struct stat st;
    struct monarch_index_entry e;
    uint32_t n = monarch_index_lookup(key, kl);
    if (monarch_sys_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    long seals = syscall(SYS_fcntl, fd, F_GET_SEALS);
    if (seals < 0 || (seals & MONARCH_MEMFD_SEALS) != MONARCH_MEMFD_SEALS)
        return 0;
    if (n && monarch_index_entry(n, &e) == 0 && (uint64_t)st.st_size != e.size)
        return 0;
    if (!(flags & O_CLOEXEC) && syscall(SYS_fcntl, fd, F_SETFD, 0) != 0)
        return 0;
    return 1;
}

static inline int monarch_start(void)
{
    if (MONARCH_UNLIKELY(!__atomic_load_n(&monarch_ready, __ATOMIC_ACQUIRE)))
        monarch_ensure_init();
    return monarch_enabled;
}

/*
 * Before the application's open: -1 = not managed (pass through); 0 = managed,
 * open the PFS original with the application's own call (monarch_after counts
 * it); > 0 = a staged copy is open in *fdp, counted under the returned slot,
 * its source's index entry + 1 in *entryp.
 */
static int monarch_before(int dirfd, const char *path, int flags, int *fdp, uint32_t *entryp)
{
    if (monarch_guard || !path || !path[0])
        return -1;
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC | O_DIRECTORY | O_PATH)))
        return -1;
    if (!monarch_start() || monarch_wants_dir(path))
        return -1;
    char key[MONARCH_KEY_MAX];
    size_t kl;
    if (monarch_key(dirfd, path, key, &kl) != 0)
        return -1;

    /* Managed: from here on, the slow path. */
    int saved = errno;
    monarch_guard = 1;
    /* No tier copy before the snapshot is ready: kept copies are checked against it first. */
    int ix = monarch_index_ready();
    if (ix == MONARCH_IX_OFF || ((flags & O_NOFOLLOW) && !monarch_is_plain_file(key, kl))) {
        /* OFF: the PFS original, counted. O_NOFOLLOW of a name the index cannot vouch for:
         * the kernel's answer (ELOOP for a symlink) is the app's, uncounted. */
        monarch_guard = 0;
        errno = saved;
        return ix == MONARCH_IX_OFF ? MONARCH_SLOT_PFS : -1;
    }
    char staged[PATH_MAX];
    int slot = MONARCH_SLOT_PFS, fd = -1;
    int pflags = flags & ~(O_DIRECT | O_NOATIME); /* a tmpfs copy may refuse them */
    for (unsigned i = 0; i < monarch_nprobes && __atomic_load_n(&monarch_probing, __ATOMIC_RELAXED); i++) {
        const struct monarch_probe *pr = &monarch_probes[i];
        if (monarch_probe_path(pr, key, kl, staged) == 0 && (fd = monarch_open_staged(staged, pflags)) >= 0) {
            MONARCH_DEBUG(1, "open %s: hit slot %u %s (fd %d)", path, pr->slot, staged, fd);
            slot = (int)pr->slot;
            goto out;
        }
    }
    int passed = -1;
    int answer = monarch_request(MONARCH_VERB_OPEN, key, kl, staged, sizeof staged, &passed, monarch_timeout_ms);
    if (answer > 0 && (answer & MONARCH_ANSWER_FD) && passed >= 0) {
        int s = answer & ~MONARCH_ANSWER_FD;
        if (s > MONARCH_SLOT_PFS && s < MONARCH_MAX_SLOTS && monarch_passed_ok(passed, key, kl, flags)) {
            MONARCH_DEBUG(1, "open %s: daemon slot %d, a decompressed copy (fd %d)", path, s, passed);
            fd = passed;
            slot = s;
            goto out;
        }
        MONARCH_DEBUG(1, "open %s: daemon passed fd %d, which is not a sealed copy of the file: refused", path,
                      passed);
    }
    if (passed >= 0)
        real_close(passed);
    if (answer > MONARCH_SLOT_PFS && answer < MONARCH_MAX_SLOTS) {
        if (!monarch_answer_allowed(staged))
            MONARCH_DEBUG(1, "open %s: daemon named %.200s, outside the probe dirs: refused", path, staged);
        else if ((fd = monarch_open_staged(staged, pflags)) >= 0) {
            MONARCH_DEBUG(1, "open %s: daemon slot %d %s (fd %d)", path, answer, staged, fd);
            slot = answer;
            goto out;
        } else
            MONARCH_DEBUG(1, "open %s: daemon named %s, which does not open: %s", path, staged, strerror(errno));
    }
    MONARCH_DEBUG(1, "open %s: PFS (daemon %d)", path, answer);
out:
    if (slot > MONARCH_SLOT_PFS) {
        *fdp = fd;
        *entryp = monarch_index_lookup(key, kl);
    }
    monarch_guard = 0;
    errno = saved;
    return slot;
}

/* After the application's own open call (pass-through or PFS original). */
static inline void monarch_after(int fd, int how)
{
    struct stat st;
    if (how == MONARCH_SLOT_PFS && fd >= 0 && monarch_sys_fstat(fd, &st) == 0 && !S_ISREG(st.st_mode))
        monarch_forget(fd); /* a directory (tar, opendir without O_DIRECTORY): not a file open */
    else if (how == MONARCH_SLOT_PFS)
        monarch_track(fd, MONARCH_SLOT_PFS, 0);
    else if (fd >= 0)
        monarch_forget(fd); /* a stale entry from a close we did not see */
}

/*
 * Before a call that changes (dirfd, path) -- a write-open, creat, rename,
 * unlink, rmdir, truncate -- when it lies under a root: the daemon drops its
 * copies of the key (INVALIDATE) and we remove <probe dir>/<key> ourselves.
 * Without the daemon's confirmation this process stops probing tiers for good:
 * a copy we could not remove (a directory's files, another slot) is never read.
 */
static void monarch_invalidate_key(const char *key, size_t kl, unsigned k, const char *path)
{
    /* First, for every process of the job on this node: root k's metadata is the PFS's now. */
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && !(__atomic_fetch_or(monarch_extra(c, MONARCH_EXTRA_META_OFF), monarch_root_bit(k), __ATOMIC_ACQ_REL)
               & monarch_root_bit(k)))
        MONARCH_DEBUG(1, "metadata of root %u: from the PFS from now on (the job changes %s)", k, path);
    if (key[kl - 1] == '/') /* the root itself: no file key to invalidate */
        return;
    int status = monarch_request(MONARCH_VERB_INVALIDATE, key, kl, NULL, 0, NULL, monarch_timeout_ms);
    if (status != 0 && __atomic_load_n(&monarch_probing, __ATOMIC_RELAXED)) {
        __atomic_store_n(&monarch_probing, 0, __ATOMIC_RELAXED);
        MONARCH_DEBUG(1, "invalidate %s: daemon did not confirm (%d); no more tier probes in this process", path,
                      status);
    }
    char staged[PATH_MAX];
    for (unsigned i = 0; i < monarch_nprobes; i++)
        if (monarch_probe_path(&monarch_probes[i], key, kl, staged) == 0 && MONARCH_RESOLVE(unlink)(staged) == 0)
            MONARCH_DEBUG(1, "invalidate %s: removed %s", path, staged);
    /* a compressed copy (<probe dir>/.z/<key>) too, so no copy of the old bytes outlives the write */
    char zkey[MONARCH_KEY_MAX + 3];
    if (kl + 3 < sizeof zkey) {
        memcpy(zkey, ".z/", 3);
        memcpy(zkey + 3, key, kl + 1);
        for (unsigned i = 0; i < monarch_nprobes; i++)
            if (monarch_probe_path(&monarch_probes[i], zkey, kl + 3, staged) == 0
                && MONARCH_RESOLVE(unlink)(staged) == 0)
                MONARCH_DEBUG(1, "invalidate %s: removed %s", path, staged);
    }
    MONARCH_DEBUG(1, "invalidate %s: key %s, daemon %d", path, key, status);
}

/* abs with its symlinks resolved, as the kernel will follow them, into out[PATH_MAX]: the
 * whole path, or (a name not there yet) its directory and then the name; -1 if neither. */
static int monarch_resolved(const char *abs, char *out)
{
    if (realpath(abs, out))
        return 0;
    const char *slash = strrchr(abs, '/');
    if (!slash || !slash[1])
        return -1;
    char dir[PATH_MAX];
    size_t dl = (size_t)(slash - abs);
    memcpy(dir, abs, dl);
    dir[dl] = '\0';
    if (!realpath(dl ? dir : "/", out))
        return -1;
    size_t ol = strlen(out), nl = strlen(slash + 1);
    if (ol + 1 + nl >= PATH_MAX)
        return -1;
    if (ol > 1)
        out[ol++] = '/';
    memcpy(out + ol, slash + 1, nl + 1);
    return 0;
}

static void monarch_invalidate(int dirfd, const char *path)
{
    if (monarch_guard || !path || !path[0] || !monarch_start())
        return;
    char key[MONARCH_KEY_MAX], abs[PATH_MAX];
    size_t kl = 0;
    unsigned k;
    int saved = errno;
    monarch_guard = 1;
    int named = monarch_key_abs(dirfd, path, 1, key, &kl, &k, abs) == 0;
    if (named)
        monarch_invalidate_key(key, kl, k, path);
    /* A write through a symlink under a root changes its target: the target's key goes too
     * (a rename or unlink of the link itself then drops a copy it did not have to:
     * harmless). Only for names under a root: resolving costs lookups, and every write
     * elsewhere (checkpoints, logs) would pay them. */
    char resolved[PATH_MAX], rkey[MONARCH_KEY_MAX];
    size_t rkl;
    unsigned rk;
    if (named && monarch_resolved(abs, resolved) == 0 && strcmp(resolved, abs) != 0
        && monarch_key_abs(AT_FDCWD, resolved, 1, rkey, &rkl, &rk, abs) == 0
        && !(rkl == kl && memcmp(rkey, key, kl) == 0))
        monarch_invalidate_key(rkey, rkl, rk, path);
    monarch_guard = 0;
    errno = saved;
}

/* A change through a descriptor (fchmod, fchown, futimens): its path, as /proc names it. */
static void monarch_invalidate_fd(int fd)
{
    if (fd >= 0 && !monarch_guard && monarch_start())
        monarch_invalidate(fd, ".");
}

/* Both paths of a rename (or one: p2 NULL). */
static void monarch_invalidate2(int d1, const char *p1, int d2, const char *p2)
{
    monarch_invalidate(d1, p1);
    if (p2)
        monarch_invalidate(d2, p2);
}

/* fopen mode -> open flags when the mode is read-only, else -1. */
static int monarch_fopen_flags(const char *mode)
{
    if (!mode || mode[0] != 'r')
        return -1;
    int flags = O_RDONLY;
    for (const char *m = mode + 1; *m && *m != ','; m++) {
        if (*m == '+')
            return -1;
        if (*m == 'e')
            flags |= O_CLOEXEC;
    }
    return flags;
}

/* open flags that may change the file: the ones a staged copy would miss. */
#define MONARCH_WRITES(flags) (((flags) & O_ACCMODE) != O_RDONLY || ((flags) & (O_CREAT | O_TRUNC)))

/* ---- wrapper families: one macro shape per family ---- */
#define MONARCH_VA_MODE(flags)                                      \
    mode_t mode = 0;                                                \
    if (__OPEN_NEEDS_MODE(flags)) {                                 \
        va_list ap;                                                 \
        va_start(ap, flags);                                        \
        mode = (mode_t)va_arg(ap, int);                             \
        va_end(ap);                                                 \
    }

#define MONARCH_OPEN_BODY(name, dirfd, args)                         \
    MONARCH_REAL(name, -1)                                           \
    int fd_ = -1;                                                    \
    uint32_t entry_ = 0;                                             \
    if (MONARCH_WRITES(flags))                                       \
        monarch_invalidate(dirfd, path);                             \
    int how_ = monarch_before(dirfd, path, flags, &fd_, &entry_);    \
    if (how_ > MONARCH_SLOT_PFS) {                                   \
        monarch_track(fd_, (unsigned)how_, entry_);                  \
        return fd_;                                                  \
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
        MONARCH_OPEN_BODY(name, AT_FDCWD, (path, flags, mode))                    \
    }

/* int __open_2(const char *path, int flags)  (fortified, no mode) */
#define MONARCH_WRAP_OPEN_2(name)                                                 \
    static int (*real_##name)(const char *, int);                                \
    MONARCH_EXPORT int name(const char *path, int flags)                          \
    {                                                                             \
        MONARCH_OPEN_BODY(name, AT_FDCWD, (path, flags))                          \
    }

/* int openat(int dirfd, const char *path, int flags, ...) */
#define MONARCH_WRAP_OPENAT(name)                                                 \
    static int (*real_##name)(int, const char *, int, ...);                      \
    MONARCH_EXPORT int name(int dirfd, const char *path, int flags, ...)          \
    {                                                                             \
        MONARCH_VA_MODE(flags)                                                    \
        MONARCH_OPEN_BODY(name, dirfd, (dirfd, path, flags, mode))                \
    }

/* int __openat_2(int dirfd, const char *path, int flags)  (fortified) */
#define MONARCH_WRAP_OPENAT_2(name)                                               \
    static int (*real_##name)(int, const char *, int);                           \
    MONARCH_EXPORT int name(int dirfd, const char *path, int flags)               \
    {                                                                             \
        MONARCH_OPEN_BODY(name, dirfd, (dirfd, path, flags))                      \
    }

/* FILE *fopen(const char *path, const char *mode); modes w, a and + write. */
#define MONARCH_WRAP_FOPEN(name)                                                  \
    static FILE *(*real_##name)(const char *, const char *);                     \
    MONARCH_EXPORT FILE *name(const char *path, const char *mode)                 \
    {                                                                             \
        MONARCH_REAL(name, NULL)                                                  \
        int fd_ = -1, flags = monarch_fopen_flags(mode);                          \
        uint32_t entry_ = 0;                                                      \
        if (flags < 0 && mode)                                                    \
            monarch_invalidate(AT_FDCWD, path);                                   \
        int how_ = flags < 0 ? -1 : monarch_before(AT_FDCWD, path, flags, &fd_, &entry_); \
        if (how_ > MONARCH_SLOT_PFS) {                                            \
            int saved_ = errno;                                                   \
            FILE *fp_ = fdopen(fd_, mode);                                        \
            if (fp_) {                                                            \
                monarch_track(fd_, (unsigned)how_, entry_);                       \
                monarch_mark_uncounted(fd_); /* stdio reads with its own __read */ \
                return fp_;                                                       \
            }                                                                     \
            real_close(fd_);                                                      \
            errno = saved_;                                                       \
            how_ = MONARCH_SLOT_PFS;                                              \
        }                                                                         \
        FILE *fp_ = real_(path, mode);                                            \
        monarch_after(fp_ ? fileno(fp_) : -1, how_);                              \
        if (fp_ && how_ == MONARCH_SLOT_PFS)                                      \
            monarch_mark_uncounted(fileno(fp_));                                  \
        return fp_;                                                               \
    }

/* Byte-counting I/O: the result (> 0) is added to the slot of descriptor fd. */
#define MONARCH_WRAP_IO(name, ret, fd, params, args)                              \
    static ret(*real_##name) params;                                              \
    MONARCH_EXPORT ret name params                                                \
    {                                                                             \
        MONARCH_REAL(name, -1)                                                    \
        ret n_ = real_ args;                                                      \
        if (n_ > 0)                                                               \
            monarch_count_bytes(fd, (uint64_t)n_);                                \
        return n_;                                                                \
    }

/* Calls that change what a path names (creat, rename, unlink, rmdir, truncate):
 * invalidate (d1, p1) and (d2, p2) (p2 NULL: one path), then the real call. */
#define MONARCH_WRAP_CHANGE(name, params, args, d1, p1, d2, p2)                   \
    static int (*real_##name) params;                                             \
    MONARCH_EXPORT int name params                                                \
    {                                                                             \
        MONARCH_REAL(name, -1)                                                    \
        monarch_invalidate2(d1, p1, d2, p2);                                      \
        return real_ args;                                                        \
    }

/* stat of a descriptor: the real call, then the source's stat if fd is a staged
 * copy and the call is about fd itself (on_fd); `type` picks the fill. */
#define MONARCH_WRAP_STAT(name, type, fd, on_fd, params, args)                    \
    static int (*real_##name) params;                                             \
    MONARCH_EXPORT int name params                                                \
    {                                                                             \
        MONARCH_REAL(name, -1)                                                    \
        int r_ = real_ args;                                                      \
        if (r_ == 0 && (on_fd))                                                   \
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
        int r_;                                                                   \
        if (monarch_on_fd(path, flags)) {                                         \
            MONARCH_REAL(name, -1)                                                \
            r_ = real_ args;                                                      \
            if (r_ == 0)                                                          \
                monarch_fill_##type(dirfd, buf);                                  \
            return r_;                                                            \
        }                                                                         \
        if (monarch_meta_##type(dirfd, path, flags, ver, buf, &r_))               \
            return r_;                                                            \
        MONARCH_REAL(name, -1)                                                    \
        return real_ args;                                                        \
    }

/* access(2) and its relatives: existence (and the owner's bits) from the index. */
#define MONARCH_WRAP_ACCESS(name, dirfd, path, mode, flags, params, args)          \
    static int (*real_##name) params;                                             \
    MONARCH_EXPORT int name params                                                \
    {                                                                             \
        int r_;                                                                   \
        if (monarch_meta_access(dirfd, path, mode, flags, &r_))                   \
            return r_;                                                            \
        MONARCH_REAL(name, -1)                                                    \
        return real_ args;                                                        \
    }

/* opendir/fdopendir: a listed directory under a root is listed from the index. */
#define MONARCH_WRAP_OPENDIR(name, dirfd, path, fd, params, args)                 \
    static DIR *(*real_##name) params;                                            \
    MONARCH_EXPORT DIR *name params                                               \
    {                                                                             \
        DIR *d_;                                                                  \
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
                         OPENDIR, READDIR, READDIR_R)                                                   \
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
    IO(read, ssize_t, fd, (int fd, void *b, size_t n), (fd, b, n))                                      \
    IO(pread, ssize_t, fd, (int fd, void *b, size_t n, off_t o), (fd, b, n, o))                         \
    IO(pread64, ssize_t, fd, (int fd, void *b, size_t n, off64_t o), (fd, b, n, o))                     \
    IO(readv, ssize_t, fd, (int fd, const struct iovec *v, int c), (fd, v, c))                          \
    IO(preadv, ssize_t, fd, (int fd, const struct iovec *v, int c, off_t o), (fd, v, c, o))             \
    IO(preadv64, ssize_t, fd, (int fd, const struct iovec *v, int c, off64_t o), (fd, v, c, o))         \
    IO(preadv2, ssize_t, fd, (int fd, const struct iovec *v, int c, off_t o, int f), (fd, v, c, o, f))  \
    IO(preadv64v2, ssize_t, fd, (int fd, const struct iovec *v, int c, off64_t o, int f),               \
       (fd, v, c, o, f))                                                                                \
    IO(__read_chk, ssize_t, fd, (int fd, void *b, size_t n, size_t bl), (fd, b, n, bl))                 \
    IO(__pread_chk, ssize_t, fd, (int fd, void *b, size_t n, off_t o, size_t bl), (fd, b, n, o, bl))    \
    IO(__pread64_chk, ssize_t, fd, (int fd, void *b, size_t n, off64_t o, size_t bl),                   \
       (fd, b, n, o, bl))                                                                               \
    IO(sendfile, ssize_t, in, (int out, int in, off_t *o, size_t n), (out, in, o, n))                   \
    IO(sendfile64, ssize_t, in, (int out, int in, off64_t *o, size_t n), (out, in, o, n))               \
    IO(copy_file_range, ssize_t, in,                                                                    \
       (int in, off64_t *io, int out, off64_t *oo, size_t n, unsigned int f), (in, io, out, oo, n, f))  \
    CHANGE(creat, (const char *p, mode_t m), (p, m), AT_FDCWD, p, AT_FDCWD, NULL)                       \
    CHANGE(creat64, (const char *p, mode_t m), (p, m), AT_FDCWD, p, AT_FDCWD, NULL)                     \
    CHANGE(rename, (const char *o, const char *n), (o, n), AT_FDCWD, o, AT_FDCWD, n)                    \
    CHANGE(renameat, (int od, const char *o, int nd, const char *n), (od, o, nd, n), od, o, nd, n)      \
    CHANGE(renameat2, (int od, const char *o, int nd, const char *n, unsigned int f),                   \
           (od, o, nd, n, f), od, o, nd, n)                                                             \
    CHANGE(unlink, (const char *p), (p), AT_FDCWD, p, AT_FDCWD, NULL)                                   \
    CHANGE(unlinkat, (int d, const char *p, int f), (d, p, f), d, p, AT_FDCWD, NULL)                    \
    CHANGE(remove, (const char *p), (p), AT_FDCWD, p, AT_FDCWD, NULL)                                   \
    CHANGE(rmdir, (const char *p), (p), AT_FDCWD, p, AT_FDCWD, NULL)                                    \
    CHANGE(truncate, (const char *p, off_t l), (p, l), AT_FDCWD, p, AT_FDCWD, NULL)                     \
    CHANGE(truncate64, (const char *p, off64_t l), (p, l), AT_FDCWD, p, AT_FDCWD, NULL)                 \
    CHANGE(mkdir, (const char *p, mode_t m), (p, m), AT_FDCWD, p, AT_FDCWD, NULL)                       \
    CHANGE(mkdirat, (int d, const char *p, mode_t m), (d, p, m), d, p, AT_FDCWD, NULL)                  \
    CHANGE(mknod, (const char *p, mode_t m, dev_t v), (p, m, v), AT_FDCWD, p, AT_FDCWD, NULL)           \
    CHANGE(mknodat, (int d, const char *p, mode_t m, dev_t v), (d, p, m, v), d, p, AT_FDCWD, NULL)      \
    CHANGE(symlink, (const char *t, const char *p), (t, p), AT_FDCWD, p, AT_FDCWD, NULL)                \
    CHANGE(symlinkat, (const char *t, int d, const char *p), (t, d, p), d, p, AT_FDCWD, NULL)           \
    CHANGE(link, (const char *o, const char *n), (o, n), AT_FDCWD, o, AT_FDCWD, n)                      \
    CHANGE(linkat, (int od, const char *o, int nd, const char *n, int f), (od, o, nd, n, f), od, o, nd, n) \
    CHANGE(chmod, (const char *p, mode_t m), (p, m), AT_FDCWD, p, AT_FDCWD, NULL)                       \
    CHANGE(fchmodat, (int d, const char *p, mode_t m, int f), (d, p, m, f), d, p, AT_FDCWD, NULL)       \
    CHANGE(chown, (const char *p, uid_t u, gid_t g), (p, u, g), AT_FDCWD, p, AT_FDCWD, NULL)            \
    CHANGE(lchown, (const char *p, uid_t u, gid_t g), (p, u, g), AT_FDCWD, p, AT_FDCWD, NULL)           \
    CHANGE(fchownat, (int d, const char *p, uid_t u, gid_t g, int f), (d, p, u, g, f), d, p, AT_FDCWD, NULL) \
    CHANGE(utime, (const char *p, const struct utimbuf *t), (p, t), AT_FDCWD, p, AT_FDCWD, NULL)        \
    CHANGE(utimes, (const char *p, const struct timeval t[2]), (p, t), AT_FDCWD, p, AT_FDCWD, NULL)     \
    CHANGE(lutimes, (const char *p, const struct timeval t[2]), (p, t), AT_FDCWD, p, AT_FDCWD, NULL)    \
    CHANGE(futimesat, (int d, const char *p, const struct timeval t[2]), (d, p, t), d, p, AT_FDCWD, NULL) \
    CHANGE(utimensat, (int d, const char *p, const struct timespec t[2], int f), (d, p, t, f), d, p,      \
           AT_FDCWD, NULL)                                                                              \
    FDCHANGE(fchmod, fd, (int fd, mode_t m), (fd, m))                                                   \
    FDCHANGE(fchown, fd, (int fd, uid_t u, gid_t g), (fd, u, g))                                        \
    FDCHANGE(futimens, fd, (int fd, const struct timespec t[2]), (fd, t))                               \
    STAT(fstat, stat, fd, 1, (int fd, struct stat *buf), (fd, buf))                                     \
    STAT(fstat64, stat64, fd, 1, (int fd, struct stat64 *buf), (fd, buf))                               \
    STAT(__fxstat, stat, fd, 1, (int v, int fd, struct stat *buf), (v, fd, buf))                        \
    STAT(__fxstat64, stat64, fd, 1, (int v, int fd, struct stat64 *buf), (v, fd, buf))                  \
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
    OPENDIR(opendir, AT_FDCWD, p, -1, (const char *p), (p))                                             \
    OPENDIR(fdopendir, fd, ".", fd, (int fd), (fd))                                                     \
    READDIR(readdir, dirent, d)                                                                         \
    READDIR(readdir64, dirent64, d64)                                                                   \
    READDIR_R(readdir_r, dirent)                                                                        \
    READDIR_R(readdir64_r, dirent64)

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

MONARCH_WRAPPERS(MONARCH_WRAP_OPEN, MONARCH_WRAP_OPEN_2, MONARCH_WRAP_OPENAT, MONARCH_WRAP_OPENAT_2,
                 MONARCH_WRAP_FOPEN, MONARCH_WRAP_IO, MONARCH_WRAP_CHANGE, MONARCH_WRAP_STAT, MONARCH_WRAP_FDCHANGE,
                 MONARCH_WRAP_PSTAT, MONARCH_WRAP_ACCESS, MONARCH_WRAP_OPENDIR, MONARCH_WRAP_READDIR,
                 MONARCH_WRAP_READDIR_R)

/* freopen opens its path inside glibc (no open() of ours runs): a writing mode changes
 * the file, so its copies go first, as for fopen. A reading mode reads the PFS. */
static FILE *(*real_freopen)(const char *, const char *, FILE *);
static FILE *(*real_freopen64)(const char *, const char *, FILE *);
#define MONARCH_WRAP_FREOPEN(name)                                                \
    MONARCH_EXPORT FILE *name(const char *path, const char *mode, FILE *fp)       \
    {                                                                             \
        MONARCH_REAL(name, NULL)                                                  \
        if (path && mode && monarch_fopen_flags(mode) < 0)                        \
            monarch_invalidate(AT_FDCWD, path);                                   \
        return real_(path, mode, fp);                                             \
    }
MONARCH_WRAP_FREOPEN(freopen)
MONARCH_WRAP_FREOPEN(freopen64)

/* ---- emulated DIRs: the calls that take a DIR * ---- */
static int (*real_closedir)(DIR *);
static int (*real_dirfd)(DIR *);
static void (*real_rewinddir)(DIR *);
static long (*real_telldir)(DIR *);
static void (*real_seekdir)(DIR *, long);

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
/* mmap: page faults are not calls, so a mapped open's bytes are unknown (counted once). */
#define MONARCH_WRAP_MMAP(name, off_type)                                          \
    MONARCH_EXPORT void *name(void *addr, size_t len, int prot, int flags, int fd, off_type off) \
    {                                                                              \
        MONARCH_REAL(name, MAP_FAILED)                                             \
        void *p_ = real_(addr, len, prot, flags, fd, off);                         \
        if (p_ != MAP_FAILED && fd >= 0)                                           \
            monarch_mark_uncounted(fd);                                            \
        return p_;                                                                 \
    }
MONARCH_WRAP_MMAP(mmap, off_t)
MONARCH_WRAP_MMAP(mmap64, off64_t)

MONARCH_EXPORT int close(int fd)
{
    MONARCH_REAL(close, -1)
    monarch_forget(fd); /* before: once closed, another thread may reuse the number */
    return real_(fd);
}

MONARCH_EXPORT int fclose(FILE *fp)
{
    MONARCH_REAL(fclose, EOF)
    FILE *f = fp; /* glibc declares fp nonnull; callers still pass NULL */
    if (f)
        monarch_forget(fileno(f)); /* glibc closes the fd internally */
    return real_(fp);
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
    int fd = real_(oldfd, newfd);
    if (fd >= 0 && oldfd != newfd)
        monarch_copy_slot(oldfd, fd);
    return fd;
}

MONARCH_EXPORT int dup3(int oldfd, int newfd, int flags)
{
    MONARCH_REAL(dup3, -1)
    int fd = real_(oldfd, newfd, flags);
    if (fd >= 0)
        monarch_copy_slot(oldfd, fd);
    return fd;
}

MONARCH_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
    MONARCH_REAL(close_range, -1)
    int r = real_(first, last, flags);
    if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC) && getpid() == monarch_pid)
        for (unsigned long fd = first; fd <= last && fd < MONARCH_MAX_FDS; fd++) {
            __atomic_store_n(&monarch_fd_entry[fd], 0, __ATOMIC_RELAXED);
            __atomic_store_n(&monarch_fd_slot[fd], 0, __ATOMIC_RELAXED);
        }
    return r;
}

/* ---- start-up ---- */
#define MONARCH_RESOLVE_ONE(name, ...) (void)MONARCH_RESOLVE(name);

static void monarch_resolve_all(void)
{
    MONARCH_WRAPPERS(MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE,
                     MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE,
                     MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE,
                     MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE)
    MONARCH_RESOLVE_ONE(closedir)
    MONARCH_RESOLVE_ONE(dirfd)
    MONARCH_RESOLVE_ONE(rewinddir)
    MONARCH_RESOLVE_ONE(telldir)
    MONARCH_RESOLVE_ONE(seekdir)
    MONARCH_RESOLVE_ONE(close)
    MONARCH_RESOLVE_ONE(fclose)
    MONARCH_RESOLVE_ONE(dup)
    MONARCH_RESOLVE_ONE(dup2)
    MONARCH_RESOLVE_ONE(dup3)
    MONARCH_RESOLVE_ONE(close_range)
    MONARCH_RESOLVE_ONE(mmap)
    MONARCH_RESOLVE_ONE(mmap64)
}

/* Copy the next ':'-separated field of *s into out[PATH_MAX]; -1 at the end, 1 if too long. */
static int monarch_next_field(const char **s, char *out)
{
    if (!*s)
        return -1;
    const char *end = strchr(*s, ':');
    size_t n = end ? (size_t)(end - *s) : strlen(*s);
    int r = 0;
    if (n >= PATH_MAX)
        r = 1;
    else {
        memcpy(out, *s, n);
        out[n] = '\0';
    }
    *s = end ? end + 1 : NULL;
    return r;
}

/* "<number>=<absolute path>": the number (< limit) and the path (normalized, in
 * place); -1 if the field is not one. */
static long monarch_numbered_dir(char *field, long limit, char **dirp, size_t *lenp)
{
    char *eq = strchr(field, '=');
    char *end = NULL;
    long v = eq && eq > field ? strtol(field, &end, 10) : -1;
    if (!eq || end != eq || v < 0 || v >= limit || eq[1] != '/')
        return -1;
    *dirp = eq + 1;
    *lenp = monarch_normalize(eq + 1);
    return v;
}

static void monarch_parse_roots(const char *env)
{
    char field[PATH_MAX];
    int r;
    while ((r = monarch_next_field(&env, field)) >= 0) {
        char *dir;
        size_t len;
        long k = r ? -1 : monarch_numbered_dir(field, 1L << 20, &dir, &len);
        if (k < 0 || monarch_nroots == MONARCH_MAX_ROOTS) {
            MONARCH_DEBUG(1, "%s: entry '%.200s' ignored (expected <k>=<absolute dir>, at most %d)",
                          MONARCH_ENV_ROOTS, r ? "(too long)" : field, MONARCH_MAX_ROOTS);
            continue;
        }
        struct monarch_root *root = &monarch_roots[monarch_nroots++];
        root->len = len == 1 ? 0 : len; /* "/" */
        memcpy(root->path, dir, root->len);
        root->path[root->len] = '\0';
        root->index = (unsigned)k;
        MONARCH_DEBUG(1, "root %u: %s", root->index, root->len ? root->path : "/");
    }
}

static void monarch_parse_probe(const char *env)
{
    char field[PATH_MAX];
    int r;
    while ((r = monarch_next_field(&env, field)) >= 0) {
        char *dir;
        size_t len;
        long slot = r ? -1 : monarch_numbered_dir(field, MONARCH_MAX_SLOTS, &dir, &len);
        if (slot <= MONARCH_SLOT_PFS || monarch_nprobes == MONARCH_MAX_SLOTS) {
            MONARCH_DEBUG(1, "%s: entry '%.200s' ignored (expected <slot>=<absolute dir>)", MONARCH_ENV_PROBE,
                          r ? "(too long)" : field);
            continue;
        }
        struct monarch_probe *p = &monarch_probes[monarch_nprobes++];
        p->len = len == 1 ? 0 : len;
        memcpy(p->dir, dir, p->len);
        p->dir[p->len] = '\0';
        p->slot = (unsigned)slot;
        MONARCH_DEBUG(1, "probe slot %u: %s", p->slot, p->len ? p->dir : "/");
    }
}

/* Map a whole file; its size in *sizep. */
static void *monarch_map_file(const char *path, int writable, size_t minsize, size_t *sizep)
{
    int fd = MONARCH_RESOLVE(openat)(AT_FDCWD, path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *m = MAP_FAILED;
    if (monarch_sys_fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 0
        && (uint64_t)st.st_size >= minsize && (uint64_t)st.st_size <= SIZE_MAX) {
        *sizep = writable ? minsize : (size_t)st.st_size;
        m = mmap(NULL, *sizep, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    }
    real_close(fd);
    return m == MAP_FAILED ? NULL : m;
}

static uint64_t *monarch_map_counters(const char *path)
{
    size_t size = 8 * MONARCH_COUNTERS_WORDS;
    uint64_t *w = monarch_map_file(path, 1, size, &size);
    if (!w) {
        MONARCH_DEBUG(1, "%s=%s: missing, too small or not mappable; not counting", MONARCH_ENV_COUNTERS, path);
        return NULL;
    }
    if (w[0] != MONARCH_COUNTERS_MAGIC || w[1] != MONARCH_COUNTERS_VERSION || w[2] != MONARCH_MAX_SLOTS) {
        MONARCH_DEBUG(1, "%s=%s: not a version %d counters file; not counting", MONARCH_ENV_COUNTERS, path,
                      MONARCH_COUNTERS_VERSION);
        munmap(w, size);
        return NULL;
    }
    return w;
}

/* Map and check the snapshot index: every offset and count inside the file, so a
 * lookup never reads outside it, then publish it; 0 when done. A bad index only turns the
 * fstat rewrite and the metadata answers off; *missing says the file is not there (yet).
 * One caller at a time: the constructor, or the thread that won INSTALLING. */
static int monarch_map_index(const char *path, int *missing)
{
    size_t size = 0;
    errno = 0;
    const unsigned char *m = monarch_map_file(path, 0, MONARCH_INDEX_HEADER_SIZE, &size);
    struct monarch_index_header h;
    const char *why = "missing, too small or not mappable";
    *missing = !m && errno == ENOENT;
    if (*missing)
        return -1; /* the daemon's snapshot is not ready: the caller says what happens */
    if (!m)
        goto bad;
    memcpy(&h, m, sizeof h);
    why = "not a Monarch index of this version, or its tables are out of bounds";
    if (h.magic != MONARCH_INDEX_MAGIC || h.version != MONARCH_INDEX_VERSION || h.buckets == 0
        || (h.buckets & (h.buckets - 1)) || h.entries >= h.buckets || h.buckets_off > size
        || 4 * (uint64_t)h.buckets > size - h.buckets_off || h.entries_off > size
        || (uint64_t)MONARCH_INDEX_ENTRY_SIZE * h.entries > size - h.entries_off || h.keys_off > size
        || h.keys_size > size - h.keys_off || h.children_off > size
        || h.children_count > (size - h.children_off) / MONARCH_INDEX_CHILD_SIZE) {
        munmap((void *)m, size);
        goto bad;
    }
    monarch_index_hdr = h;
    __atomic_store_n(&monarch_index, m, __ATOMIC_RELEASE);
    MONARCH_DEBUG(1, "index %s: %u entries", path, h.entries);
    return 0;
bad:
    MONARCH_DEBUG(1, "%s=%s: %s; fstat of staged copies shows the copy", MONARCH_ENV_INDEX, path, why);
    return -1;
}

static void monarch_atfork_child(void)
{
    /* Per-process state: the pid (vfork detection, debug prefix) and the guard of
     * the forking thread. The counters and index mappings are inherited, the fd
     * tables are inherited with the descriptors they describe, a stop of probing
     * holds for the child too, and the daemon is asked over one fresh
     * connection per request: nothing else to reset. */
    monarch_pid = getpid();
    monarch_guard = 0;
    /* a thread of the parent was installing the index: it is not here to finish */
    if (__atomic_load_n(&monarch_index_state, __ATOMIC_ACQUIRE) == MONARCH_IX_INSTALLING)
        __atomic_store_n(&monarch_index_state, monarch_idx() ? MONARCH_IX_MAPPED : MONARCH_IX_UNKNOWN,
                         __ATOMIC_RELEASE);
    if (!__atomic_load_n(&monarch_ready, __ATOMIC_ACQUIRE)) {
        /* fork raced with start-up in another thread, which does not exist here */
        pthread_once_t fresh = PTHREAD_ONCE_INIT;
        monarch_once = fresh;
    }
}

/* A positive number of ms from the environment into *ms (kept when unset or invalid). */
static void monarch_env_ms(const char *name, int *ms)
{
    const char *v = getenv(name);
    if (!v || !v[0])
        return;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end == '\0' && n > 0 && n <= 24L * 3600 * 1000)
        *ms = (int)n;
    else
        MONARCH_DEBUG(1, "%s=%s: not a positive number of ms; using %d", name, v, *ms);
}

static void monarch_init(void)
{
    int saved = errno; /* init may run inside the application's first call */
    monarch_guard = 1;
    monarch_pid = getpid();
    const char *dbg = getenv(MONARCH_ENV_DEBUG);
    monarch_debug = dbg ? atoi(dbg) : 0;
    monarch_resolve_all();
    if (!real_close || !MONARCH_RESOLVE(openat)) {
        MONARCH_DEBUG(1, "libc symbols not found; passing through");
        goto done;
    }
    const char *disable = getenv(MONARCH_ENV_DISABLE);
    if (disable && disable[0] && strcmp(disable, "0") != 0) {
        MONARCH_DEBUG(1, "%s=%s: passing through", MONARCH_ENV_DISABLE, disable);
        goto done;
    }
    const char *roots = getenv(MONARCH_ENV_ROOTS);
    if (!roots || !roots[0]) {
        MONARCH_DEBUG(1, "%s not set: passing through", MONARCH_ENV_ROOTS);
        goto done;
    }
    monarch_parse_roots(roots);
    if (!monarch_nroots)
        goto done;
    const char *probe = getenv(MONARCH_ENV_PROBE);
    if (probe && probe[0])
        monarch_parse_probe(probe);
    const char *ask_first = getenv(MONARCH_ENV_ASK_FIRST);
    monarch_probing = !(ask_first && ask_first[0] && strcmp(ask_first, "0") != 0); /* validate: open */
    const char *sock = getenv(MONARCH_ENV_SOCKET);
    if (sock && sock[0] && strlen(sock) < sizeof monarch_sockaddr.sun_path) {
        monarch_sockaddr.sun_family = AF_UNIX;
        strcpy(monarch_sockaddr.sun_path, sock);
        monarch_have_socket = 1;
    } else if (sock && sock[0]) {
        MONARCH_DEBUG(1, "%s: path longer than %zu bytes; not asking the daemon", MONARCH_ENV_SOCKET,
                      sizeof monarch_sockaddr.sun_path - 1);
    }
    monarch_env_ms(MONARCH_ENV_TIMEOUT, &monarch_timeout_ms);
    monarch_env_ms(MONARCH_ENV_INDEX_WAIT, &monarch_index_wait_ms);
    const char *counters = getenv(MONARCH_ENV_COUNTERS);
    if (counters && counters[0])
        __atomic_store_n(&monarch_counters, monarch_map_counters(counters), __ATOMIC_RELEASE);
    for (uint32_t i = 0; i < 256; i++) { /* CRC-32 (zlib's, reflected 0xEDB88320) */
        uint32_t c = i;
        for (int b = 0; b < 8; b++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        monarch_crc_table[i] = c;
    }
    const char *index = getenv(MONARCH_ENV_INDEX);
    if (index && index[0] && strlen(index) < sizeof monarch_index_path) {
        int missing = 0;
        strcpy(monarch_index_path, index);
        if (monarch_map_index(monarch_index_path, &missing) == 0)
            monarch_index_state = MONARCH_IX_MAPPED;
        else if (missing && monarch_have_socket) /* the daemon's walk is under way: wait at the first need */
            monarch_index_state = MONARCH_IX_UNKNOWN;
    }
    monarch_enabled = 1;
    MONARCH_DEBUG(1, "enabled: %u roots, %u probe dirs, daemon %s, timeout %d ms, counters %s, index %s",
                  monarch_nroots, monarch_nprobes, monarch_have_socket ? monarch_sockaddr.sun_path : "(none)",
                  monarch_timeout_ms, monarch_counters ? "on" : "off",
                  monarch_index ? "on" : monarch_index_state == MONARCH_IX_UNKNOWN ? "pending" : "off");
done:
    monarch_guard = 0;
    errno = saved;
    __atomic_store_n(&monarch_ready, 1, __ATOMIC_RELEASE);
}

static void monarch_ensure_init(void)
{
    pthread_once(&monarch_once, monarch_init);
}

__attribute__((constructor)) static void monarch_constructor(void)
{
    pthread_atfork(NULL, NULL, monarch_atfork_child);
    monarch_ensure_init();
}
