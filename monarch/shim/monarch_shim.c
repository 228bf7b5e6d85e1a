/*
 * monarch_shim.c -- the Monarch LD_PRELOAD shim (libmonarch_shim.so).
 *
 * Redirects read-only opens of files under the dataset roots to a staged copy
 * (node-local tier or peer area), makes fstat of such a descriptor report the
 * source's stat, tells the daemon before the job changes a file under a root,
 * and counts opens and bytes per source. The contract with the node daemon
 * is documented in monarch/protocol.py (framed socket messages, key format,
 * counters and snapshot index layouts) and defined for C once, in
 * monarch/wire/monarch_wire.h, which the front door includes too;
 * tests/unit/test_wire.py checks the header against Python.
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
 * MONARCH_COUNTERS, MONARCH_INDEX, MONARCH_ROOT_IDS, MONARCH_PROBE_IDS (shim_view.c:
 * a root or tier folder is used only where it is the daemon's), MONARCH_DISABLE, MONARCH_SHIM_DEBUG,
 * MONARCH_SHIM_TIMEOUT_MS, MONARCH_SHIM_INDEX_WAIT_MS, MONARCH_SHIM_ZSTD, MONARCH_SHIM_MAP_GUARD.
 * Missing or invalid settings degrade to
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
 * the application's start-up): the first call that needs it waits for it, at most
 * MONARCH_SHIM_INDEX_WAIT_MS (a few hundred ms); until it is there calls under a root go
 * to the PFS, counted, and the process looks again, rate-limited, using the index as soon
 * as it is written (see "waiting for the snapshot index"); no tier is probed before then.
 *
 * The daemon: an OPEN on the connection this thread kept from its last OPEN (when
 * the front door kept it: REQUEST_KEEP, ANSWER_KEPT; see shim_daemon.c), anything
 * else on a fresh connection; the daemon's uid (SO_PEERCRED) must be ours. OPEN answers may be preceded by STATUS_PENDING heartbeats; silence
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
 *     sendfile(64) / copy_file_range, on descriptors the shim opened and
 *     every duplicate of them: dup/dup2/dup3, fcntl(64) F_DUPFD[_CLOEXEC]
 *     (Python's os.dup, numpy's np.load), and a fork child's inherited copy;
 *   - bytes delivered by fread / fread_unlocked / __fread(_unlocked)_chk from a
 *     FILE on such a descriptor (numpy's fromfile);
 *   - processes in which the shim is active (EXTRA_PROCESSES), so the launcher
 *     can tell "never loaded" (LD_PRELOAD dropped, a static binary) from "loaded,
 *     served nothing".
 * What is NOT counted, so the open is also counted as opens_uncounted (its bytes
 * then make a lower bound), once per descriptor:
 *   - a FILE made by fopen or fdopen on a managed descriptor: stdio may read it
 *     with glibc's internal __read (fgets, getc, fscanf ...), which no preload
 *     can interpose; its fread bytes are counted all the same; counted as
 *     opens_stdio too (no upper bound). Not a FILE of a file staged by blocks:
 *     the shim makes it (fopencookie, shim_stdio.c) and sees its every read;
 *   - a descriptor mapped with mmap (page faults are not calls); the lengths
 *     mapped are added to mapped_bytes (what the faults can read at most).
 * Not seen at all: descriptors reopened through /proc/self/fd, freopen, and a
 * managed descriptor a program inherits across exec (a new image starts with
 * empty tables): read correctly, their bytes are missing unmarked. The same
 * descriptors also report the staged copy's own stat, not the source's. The fd
 * tables cover descriptors below MONARCH_MAX_FDS; higher ones are read
 * correctly but not counted.
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
#include <signal.h>
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

#include "monarch_shim.h" /* what the core gives its parts: glibc 2.17 compatibility, the wire, the tables, macros */

/* ---- the core's state ---- */
static struct monarch_root monarch_roots[MONARCH_MAX_ROOTS];
static unsigned monarch_nroots;
/* Bit k: root k is served from a key-value store (MONARCH_STORE_ROOTS): no file on disk
 * behind it, so an open there the daemon cannot serve fails with EIO (MONARCH_HOW_EIO). */
static uint64_t monarch_store_roots;

/* Is the key ("<k>/...") under a root served from a key-value store? */
static int monarch_store_key(const char *key)
{
    if (!monarch_store_roots)
        return 0;
    unsigned long k = strtoul(key, NULL, 10);
    return k < 64 && ((monarch_store_roots >> k) & 1);
}
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
 * it waits for it a moment (monarch_index_ready), asking the daemon (INDEX), and later
 * calls look again now and then until it is there.
 */
static const unsigned char *monarch_index;
static struct monarch_index_header monarch_index_hdr;
static int monarch_index_state = MONARCH_IX_NONE;
static char monarch_index_path[PATH_MAX];
static int monarch_index_wait_ms = MONARCH_SHIM_INDEX_WAIT_MS_DEFAULT;
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
/* Why monarch_before sent this thread's open to the PFS, for monarch_after to count: an
 * EXTRA_* index (EXTRA_EARLY_OPENS, EXTRA_LOST_OPENS), or -1 (no reason counted apart). */
static __thread int monarch_pfs_why __attribute__((tls_model("initial-exec"))) = -1;


/* One line on stderr: `head`, then fmt's text, cut to the buffer (errno kept). */
static void monarch_stderr_line(const char *head, const char *fmt, va_list ap)
{
    char buf[1536];
    int saved = errno;
    int n = snprintf(buf, sizeof buf, "%s", head);
    if (n > 0 && (size_t)n < sizeof buf)
        n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof buf - 1)
        n = sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n); /* write is not wrapped */
    (void)w;
    errno = saved;
}

/* ---- debug: "[monarch pid/tid] file:line ..." on stderr, only when enabled ---- */
__attribute__((format(printf, 3, 4)))
static void monarch_log(const char *file, int line, const char *fmt, ...)
{
    char head[256];
    snprintf(head, sizeof head, "[monarch %d/%d] %s:%d ", (int)getpid(), monarch_gettid(), file, line);
    va_list ap;
    va_start(ap, fmt);
    monarch_stderr_line(head, fmt, ap);
    va_end(ap);
}


/* Functions the shim calls itself before their family's wrapper is defined (tentative
 * definitions: the family macros of shim_wrappers.c define them again). */
static int (*real_openat)(int, const char *, int, ...);
static int (*real_unlink)(const char *);


#define MONARCH_DECLARE_REAL(ret, name, params) static ret (*real_##name) params;
MONARCH_BY_HAND(MONARCH_DECLARE_REAL)

/* ---- what each part gives the others (its functions, its types, the state it shares), before
 * any part: the parts below call each other through these, in whatever order they come ---- */
#include "shim_paths.h"
#include "shim_index.h"
#include "shim_daemon.h"
#include "shim_zstd.h"
#include "shim_zpool.h"
#include "shim_blocks.h"
#include "shim_touched.h"
#include "shim_guard.h"
#include "shim_pages.h"
#include "shim_fill.h"
#include "shim_open.h"
#include "shim_stdio.h"
#include "shim_fork.h"
#include "shim_view.h"
#include "shim_writeback.h"
#include "shim_rawsys.h"
#include "shim_rawthreads.h"

/* The kernel's fstat, for the shim's own checks: never our wrapper, and no
 * fstat@GLIBC_2.33 import (64-bit Linux: struct stat is the kernel's). */
static int monarch_sys_fstat(int fd, struct stat *st)
{
    return (int)syscall(SYS_fstat, fd, st);
}

/* The same for a name, not followed if a symlink. */
static int monarch_sys_lstatat(int dirfd, const char *path, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, dirfd, path, st, AT_SYMLINK_NOFOLLOW);
}

/* ---- counting and the fd tables (hot path: no lock, no allocation, no log) ---- */
static inline uint64_t *monarch_counter(unsigned slot, unsigned which)
{
    return &monarch_counters[MONARCH_HEADER_WORDS + MONARCH_SLOT_WORDS * slot + which];
}

/* This open's bytes go where the shim cannot see them (mmap's page faults, stdio's internal
 * reads): count it once as an open whose bytes are not all seen, and once more as one read
 * through a FILE when that is why (its bytes have no upper bound). */
static inline void monarch_mark_uncounted(int fd, enum monarch_unseen why)
{
    if ((unsigned)fd >= MONARCH_MAX_FDS)
        return;
    uint8_t s = __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED);
    uint8_t flags = why == MONARCH_UNSEEN_STDIO ? (MONARCH_FD_UNCOUNTED | MONARCH_FD_STDIO) : MONARCH_FD_UNCOUNTED;
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (!s || (s & flags) == flags || getpid() != monarch_pid)
        return;
    __atomic_store_n(&monarch_fd_slot[fd], (uint8_t)(s | flags), __ATOMIC_RELAXED);
    if (!c)
        return;
    unsigned slot = (s & MONARCH_FD_SLOT_MASK) - 1u;
    if (!(s & MONARCH_FD_UNCOUNTED))
        __atomic_fetch_add(monarch_counter(slot, 2), 1, __ATOMIC_RELAXED);
    if ((flags & MONARCH_FD_STDIO) && !(s & MONARCH_FD_STDIO))
        __atomic_fetch_add(monarch_counter(slot, 3), 1, __ATOMIC_RELAXED);
}

/* A managed descriptor mapped: its open is uncounted, and the length mapped bounds what its page
 * faults can read (mapped_bytes). */
static inline void monarch_count_mapped(int fd, size_t len)
{
    if ((unsigned)fd >= MONARCH_MAX_FDS)
        return;
    unsigned s = __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED) & MONARCH_FD_SLOT_MASK;
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (!s || getpid() != monarch_pid)
        return;
    monarch_mark_uncounted(fd, MONARCH_UNSEEN_MAPPED);
    if (c)
        __atomic_fetch_add(monarch_counter(s - 1, 4), (uint64_t)len, __ATOMIC_RELAXED);
}

static inline void monarch_count_bytes(int fd, uint64_t n)
{
    if ((unsigned)fd < MONARCH_MAX_FDS) {
        unsigned s = __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED) & MONARCH_FD_SLOT_MASK;
        uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
        if (s && c)
            __atomic_fetch_add(monarch_counter(s - 1, 1), n, __ATOMIC_RELAXED);
        if (s)
            MONARCH_DEBUG(3, "fd %d: %llu bytes (slot %u)", fd, (unsigned long long)n, s - 1);
    }
}

/* Bytes a stdio call delivered from fp (fread): counted when fp reads a managed descriptor.
 * fileno takes no lock; a FILE without one (fmemopen, fopencookie) sets errno: restored. */
static inline void monarch_count_file(FILE *fp, uint64_t n)
{
    int saved = errno;
    int fd = fp ? fileno(fp) : -1;
    errno = saved;
    if (fd >= 0)
        monarch_count_bytes(fd, n);
}

/* The processes counter (EXTRA_PROCESSES): +1 when the shim starts counting in a process
 * (start-up, a fork child), -1 when that process replaces itself by exec, +1 again if the
 * exec failed. A vfork child (another pid in our memory) was never counted: untouched. */
static inline void monarch_count_process(int delta)
{
    uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
    if (c && monarch_enabled && getpid() == monarch_pid)
        __atomic_fetch_add(&c[MONARCH_HEADER_WORDS + MONARCH_SLOT_WORDS * MONARCH_MAX_SLOTS + MONARCH_EXTRA_PROCESSES],
                           (uint64_t)(int64_t)delta, __ATOMIC_RELAXED);
}

/* Remember a managed fd (its slot, and its source's index entry + 1 or 0) and count its open. */
static void monarch_track(int fd, unsigned slot, uint32_t entry)
{
    if (fd < 0)
        return;
    if ((unsigned)fd < MONARCH_MAX_FDS) {
        /* a descriptor just opened has no past: a part its number still names was left by a
         * close the shim did not see (its hold released now, its reads never the copy's) */
        if (MONARCH_UNLIKELY(monarch_part_of(fd)))
            monarch_part_drop(fd);
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
    /* the part is looked at apart from the slot: a fork can copy the process between the two
     * stores (the slot cleared, the part's drop waiting for the lock fork holds), and the
     * child's close of that descriptor must still drop the part its number names */
    if ((unsigned)fd < MONARCH_MAX_FDS
        && (__atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED) || monarch_part_of(fd))
        && getpid() == monarch_pid) {
        __atomic_store_n(&monarch_fd_entry[fd], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&monarch_fd_slot[fd], 0, __ATOMIC_RELAXED);
        monarch_part_drop(fd); /* a file staged by blocks: its copy and map */
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
        monarch_part_dup(oldfd, newfd);
    }
    monarch_wb_dup(oldfd, newfd);
}

/* ---- the parts, by concern (each declares what it gives the others in its shim_*.h, included
 * above; one translation unit: every function stays static, and build.py compiles this file alone) ---- */
#include "shim_paths.c"
#include "shim_index.c"
#include "shim_daemon.c"
#include "shim_zstd.c"
#include "shim_zpool.c"
#include "shim_blocks.c"
#include "shim_touched.c"
#include "shim_guard.c"
#include "shim_pages.c"
#include "shim_fill.c"
#include "shim_open.c"
#include "shim_stdio.c"
#include "shim_wrappers.c"
#include "shim_fork.c"
#include "shim_view.c"
#include "shim_writeback.c"
#include "shim_rawthreads.c"
#include "shim_rawsys.c"

/* ---- start-up ---- */
#define MONARCH_RESOLVE_ONE(name, ...) (void)MONARCH_RESOLVE(name);
#define MONARCH_RESOLVE_BY_HAND(ret, name, params) (void)MONARCH_RESOLVE(name);

static void monarch_resolve_all(void)
{
    MONARCH_WRAPPERS(MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE,
                     MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE,
                     MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE,
                     MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE)
    MONARCH_BY_HAND(MONARCH_RESOLVE_BY_HAND)
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
        root->kprefix_len = (size_t)snprintf(root->kprefix, sizeof root->kprefix, "%u/", root->index);
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
        p->fd = MONARCH_PROBE_UNOPENED;
        MONARCH_DEBUG(1, "probe slot %u: %s", p->slot, p->len ? p->dir : "/");
    }
}

/*
 * Map a whole file the daemon made (the index, the counters); its size in *sizep. NULL with
 * errno ENOENT when it is not there (yet), EPERM when something else is: it is opened
 * without following a symlink and without blocking (a FIFO planted there must not hang
 * every process in its constructor) and used only if it is a regular file of ours
 * (st_uid == getuid()) that no one else may write, of at least minsize bytes.
 * Why a mapping never shrinks under a reader (SIGBUS): the daemon writes the index and the
 * counters once, under a fresh temporary name renamed into place, and never truncates or
 * rewrites either in place (a later index is another file, another inode: this mapping
 * keeps the old one's pages); and no other user can truncate it: once the checks above
 * hold it is ours, not writable by group or others, in the run directory the daemon made
 * 0700 and checked (monarch/secure.py) -- only our own uid or root could.
 */
static void *monarch_map_file(const char *path, int writable, size_t minsize, size_t *sizep)
{
    int fd = MONARCH_RESOLVE(openat)(AT_FDCWD, path,
                                     (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *m = MAP_FAILED;
    int ok = monarch_sys_fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid()
             && !(st.st_mode & (S_IWGRP | S_IWOTH));
    if (ok && st.st_size >= 0 && (uint64_t)st.st_size >= minsize && (uint64_t)st.st_size <= SIZE_MAX) {
        *sizep = writable ? minsize : (size_t)st.st_size;
        m = mmap(NULL, *sizep, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    }
    real_close(fd);
    if (!ok) {
        MONARCH_DEBUG(1, "%s: not a regular file of uid %d that only it may write; not used", path, (int)getuid());
        errno = EPERM;
    }
    return m == MAP_FAILED ? NULL : m;
}

static uint64_t *monarch_map_counters(const char *path)
{
    size_t size = 8 * MONARCH_COUNTERS_WORDS;
    uint64_t *w = monarch_map_file(path, 1, size, &size);
    if (!w) {
        MONARCH_DEBUG(1, "%s=%s: missing, foreign, too small or not mappable; not counting", MONARCH_ENV_COUNTERS,
                      path);
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
    const char *why = "missing, foreign, not a regular file, too small or not mappable";
    *missing = !m && errno == ENOENT;
    if (*missing)
        return -1; /* the daemon's snapshot is not ready: the caller says what happens */
    if (!m)
        goto bad;
    memcpy(&h, m, sizeof h);
    why = "not a Monarch index of this version, or its tables are out of bounds";
    if (!monarch_index_bounded(&h, size, h.files)) { /* the whole file: every stat slot inside it */
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
    monarch_conn_init();
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
    const char *stores = getenv(MONARCH_ENV_STORE_ROOTS);
    for (const char *c = stores; c && *c;) {
        char *end;
        unsigned long k = strtoul(c, &end, 10);
        if (end == c)
            break;
        if (k < 64)
            monarch_store_roots |= 1ULL << k;
        c = *end == ',' ? end + 1 : end;
    }
    monarch_parse_shared(getenv(MONARCH_ENV_SHARED_SLOTS));
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
    if (monarch_have_socket) {
        monarch_wb_parse(getenv(MONARCH_ENV_WRITEBACK)); /* the daemon answers for them: shim_writeback.c */
        monarch_wb_map_marks(getenv(MONARCH_ENV_WRITEBACK_MARKS)); /* ... for the paths marked there */
        monarch_wb_parse_door(getenv(MONARCH_ENV_WRITEBACK_SOCKET)); /* ... on a socket of their own */
    }
    monarch_env_ms(MONARCH_ENV_TIMEOUT, &monarch_timeout_ms);
    monarch_env_ms(MONARCH_ENV_INDEX_WAIT, &monarch_index_wait_ms);
    monarch_view_parse();
    const char *counters = getenv(MONARCH_ENV_COUNTERS);
    if (counters && counters[0]) {
        __atomic_store_n(&monarch_counters, monarch_map_counters(counters), __ATOMIC_RELEASE);
        if (!monarch_counters && monarch_view_run_folder(counters) != 0)
            goto done; /* the daemon's run folder is not here, or not ours: pass-through, said */
    }
    monarch_crc_init(); /* CRC-32's table (monarch_native.h) */
    const char *index = getenv(MONARCH_ENV_INDEX);
    if (index && index[0] && strlen(index) < sizeof monarch_index_path) {
        int missing = 0;
        strcpy(monarch_index_path, index);
        if (monarch_map_index(monarch_index_path, &missing) == 0)
            monarch_index_state = MONARCH_IX_MAPPED;
        else if (missing && monarch_have_socket) /* the daemon's walk is under way: wait at the first need */
            monarch_index_state = MONARCH_IX_UNKNOWN;
    }
    if (monarch_nprobes)
        monarch_zstd_init();
    monarch_enabled = 1;
    monarch_count_process(1);
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

/* The marker (as Hermes' adapters expose is_intercepted): a program, or a test through
 * dlsym(RTLD_DEFAULT, "monarch_shim_loaded"), asks whether the shim is loaded (the symbol
 * exists) and active: 1 when it intercepts opens under the roots, 0 when it passes
 * everything through (MONARCH_DISABLE, no MONARCH_ROOTS, libc symbols not found). */
MONARCH_EXPORT int monarch_shim_loaded(void)
{
    monarch_ensure_init();
    return __atomic_load_n(&monarch_enabled, __ATOMIC_ACQUIRE);
}

__attribute__((constructor)) static void monarch_constructor(void)
{
    monarch_fork_handlers();
    monarch_ensure_init();
    monarch_raw_setup(); /* after init: the write-back paths are known, every real_* resolved */
}
