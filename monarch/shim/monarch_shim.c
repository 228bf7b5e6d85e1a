/*
 * monarch_shim.c -- the Monarch LD_PRELOAD shim (libmonarch_shim.so).
 *
 * Redirects read-only opens of files under the dataset roots to a staged copy
 * (node-local tier or peer area) and counts opens and bytes per source.
 * The contract with the node daemon lives in monarch/protocol.py; the
 * constants below mirror it and tests/unit/test_protocol.py checks they agree.
 *
 * Shape (after Darshan / libfaketime / GOTCHA):
 *   - every wrapped symbol is one line of MONARCH_WRAPPERS; the line names the
 *     symbol's family (open, openat, __open_2, fopen, byte-counting I/O) and
 *     the family macro generates the real_* pointer, the exported wrapper and
 *     its resolution;
 *   - real_* pointers are resolved once by the constructor (pthread_once) and
 *     lazily by any wrapper called before it; a missing symbol passes through
 *     (ENOSYS only if libc really lacks it), never exit();
 *   - the hot path (a non-managed open, every read) takes no lock, allocates
 *     nothing and logs nothing: flag test, stack buffer, prefix match against
 *     a root table fixed at start-up, one byte of fd table, one atomic add;
 *   - a __thread recursion guard; the shim's own file I/O goes through real_*.
 *
 * Environment (see protocol.py): MONARCH_ROOTS, MONARCH_PROBE, MONARCH_SOCKET,
 * MONARCH_COUNTERS, MONARCH_DISABLE, MONARCH_SHIM_DEBUG, MONARCH_SHIM_TIMEOUT_MS.
 * Missing or invalid settings degrade to pass-through; nothing here may make
 * the application fail: on any Monarch-side failure the original is opened by
 * the application's own call, so the errors it sees are the original's.
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
 * The fd table covers descriptors below MONARCH_MAX_FDS; higher ones are read
 * correctly but not counted.
 */
#undef _FORTIFY_SOURCE /* we define open, read ... ourselves */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- protocol mirror (monarch/protocol.py; checked by tests/unit/test_protocol.py) ---- */
#define MONARCH_COUNTERS_MAGIC 0x4D4F4E4152434801ULL
#define MONARCH_COUNTERS_VERSION 1
#define MONARCH_MAX_SLOTS 16
#define MONARCH_HEADER_WORDS 3
#define MONARCH_SLOT_PFS 0
#define MONARCH_SLOT_PEER 1
#define MONARCH_FIRST_TIER_SLOT 2
#define MONARCH_SHIM_TIMEOUT_MS_DEFAULT 60000
#define MONARCH_ENV_ROOTS "MONARCH_ROOTS"
#define MONARCH_ENV_PROBE "MONARCH_PROBE"
#define MONARCH_ENV_SOCKET "MONARCH_SOCKET"
#define MONARCH_ENV_COUNTERS "MONARCH_COUNTERS"
#define MONARCH_ENV_DISABLE "MONARCH_DISABLE"
#define MONARCH_ENV_DEBUG "MONARCH_SHIM_DEBUG"
#define MONARCH_ENV_TIMEOUT "MONARCH_SHIM_TIMEOUT_MS"
#define MONARCH_COUNTERS_WORDS (MONARCH_HEADER_WORDS + 2 * MONARCH_MAX_SLOTS)

/* ---- fixed tables ---- */
#define MONARCH_MAX_ROOTS 16
#define MONARCH_MAX_FDS 65536

#define MONARCH_EXPORT __attribute__((visibility("default")))
#define MONARCH_UNLIKELY(x) __builtin_expect(!!(x), 0)

#ifndef __FILE_NAME__
#define __FILE_NAME__ __FILE__
#endif

struct monarch_root {
    char path[PATH_MAX]; /* normalized, no trailing '/'; "" for "/" */
    size_t len;
    unsigned index; /* k in the key "<k>/<rel>": position in MONARCH_ROOTS */
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
static struct sockaddr_un monarch_sockaddr;
static int monarch_have_socket;
static int monarch_timeout_ms = MONARCH_SHIM_TIMEOUT_MS_DEFAULT;
static uint64_t *monarch_counters; /* MAP_SHARED; NULL => counting off */
static int monarch_enabled;
static int monarch_debug;
static int monarch_ready;  /* set (release) when init is complete */
static pid_t monarch_pid;  /* this process; a vfork child sees another pid */
static pthread_once_t monarch_once = PTHREAD_ONCE_INIT;
/* slot + 1 of each descriptor the shim opened; 0 = not ours. Only counting uses it. */
static uint8_t monarch_fd_slot[MONARCH_MAX_FDS];
static __thread int monarch_guard __attribute__((tls_model("initial-exec")));

static void monarch_ensure_init(void);

/* ---- debug: "[monarch pid/tid] file:line ..." on stderr, only when enabled ---- */
__attribute__((format(printf, 3, 4)))
static void monarch_log(const char *file, int line, const char *fmt, ...)
{
    char buf[1024];
    int saved = errno;
    int n = snprintf(buf, sizeof buf, "[monarch %d/%d] %s:%d ", (int)getpid(), (int)gettid(), file, line);
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

/* Functions the shim calls itself (openat: a tentative definition, the family
 * macro below defines the wrapper) or wraps by hand. */
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static int (*real_fclose)(FILE *);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_close_range)(unsigned int, unsigned int, int);

/* ---- counting (hot path: no lock, no allocation, no log) ---- */
static inline uint64_t *monarch_counter(unsigned slot, unsigned which)
{
    return &monarch_counters[MONARCH_HEADER_WORDS + 2 * slot + which];
}

static inline void monarch_count_bytes(int fd, uint64_t n)
{
    if ((unsigned)fd < MONARCH_MAX_FDS) {
        unsigned s = __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED);
        uint64_t *c = __atomic_load_n(&monarch_counters, __ATOMIC_RELAXED);
        if (s && c)
            __atomic_fetch_add(monarch_counter(s - 1, 1), n, __ATOMIC_RELAXED);
        if (s)
            MONARCH_DEBUG(3, "fd %d: %llu bytes (slot %u)", fd, (unsigned long long)n, s - 1);
    }
}

/* Remember a managed fd and count its open. */
static void monarch_track(int fd, unsigned slot)
{
    if (fd < 0)
        return;
    if ((unsigned)fd < MONARCH_MAX_FDS)
        __atomic_store_n(&monarch_fd_slot[fd], (uint8_t)(slot + 1), __ATOMIC_RELAXED);
    if (monarch_counters)
        __atomic_fetch_add(monarch_counter(slot, 0), 1, __ATOMIC_RELAXED);
}

/* Forget a descriptor (closed, or reused by a pass-through open). A vfork child
 * shares our memory but not our descriptors: it must not touch the table. */
static inline void monarch_forget(int fd)
{
    if ((unsigned)fd < MONARCH_MAX_FDS && __atomic_load_n(&monarch_fd_slot[fd], __ATOMIC_RELAXED)
        && getpid() == monarch_pid)
        __atomic_store_n(&monarch_fd_slot[fd], 0, __ATOMIC_RELAXED);
}

/* newfd now refers to oldfd's file. */
static inline void monarch_copy_slot(int oldfd, int newfd)
{
    if ((unsigned)newfd >= MONARCH_MAX_FDS)
        return;
    uint8_t s = (unsigned)oldfd < MONARCH_MAX_FDS ? __atomic_load_n(&monarch_fd_slot[oldfd], __ATOMIC_RELAXED) : 0;
    if ((s || __atomic_load_n(&monarch_fd_slot[newfd], __ATOMIC_RELAXED)) && getpid() == monarch_pid)
        __atomic_store_n(&monarch_fd_slot[newfd], s, __ATOMIC_RELAXED);
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

/* The absolute, normalized form of (dirfd, path) into out[PATH_MAX]; -1 if unknown. */
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

static int monarch_is_regular(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- the daemon ---- */
static long monarch_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Ask the daemon for key; the answered path goes to path[PATH_MAX]. Returns the
 * slot (>= 0), or -1 when the daemon cannot be asked or answers nonsense. */
static int monarch_ask(const char *key, size_t keylen, char *path)
{
    char buf[PATH_MAX + 64];
    if (!monarch_have_socket || keylen + 7 > sizeof buf)
        return -1;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    int slot = -1;
    long deadline = monarch_now_ms() + monarch_timeout_ms;
    struct timeval tv = {monarch_timeout_ms / 1000, (monarch_timeout_ms % 1000) * 1000};
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(s, (const struct sockaddr *)&monarch_sockaddr, sizeof monarch_sockaddr) != 0) {
        MONARCH_DEBUG(1, "daemon %s: connect: %s", monarch_sockaddr.sun_path, strerror(errno));
        goto out;
    }
    size_t len = 0;
    memcpy(buf, "OPEN ", 5);
    memcpy(buf + 5, key, keylen);
    len = 5 + keylen;
    buf[len++] = '\n';
    for (size_t off = 0; off < len;) {
        ssize_t w = send(s, buf + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            MONARCH_DEBUG(1, "daemon: send: %s", strerror(errno));
            goto out;
        }
        off += (size_t)w;
    }
    size_t got = 0;
    char *nl = NULL;
    while (!nl && got < sizeof buf - 1) {
        long left = deadline - monarch_now_ms();
        if (left <= 0) {
            MONARCH_DEBUG(1, "daemon: no answer within %d ms", monarch_timeout_ms);
            goto out;
        }
        struct pollfd pfd = {s, POLLIN, 0};
        int pr = poll(&pfd, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue; /* timeout: the deadline check above ends the loop */
        ssize_t r = recv(s, buf + got, sizeof buf - 1 - got, 0);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0) {
            MONARCH_DEBUG(1, "daemon: %s", r == 0 ? "closed without answer" : strerror(errno));
            goto out;
        }
        got += (size_t)r;
        buf[got] = '\0';
        nl = memchr(buf, '\n', got);
    }
    if (!nl)
        goto out;
    *nl = '\0';
    /* "<slot> <path>" */
    char *p = buf;
    long v = 0;
    if (*p < '0' || *p > '9')
        goto bad;
    while (*p >= '0' && *p <= '9' && v < MONARCH_MAX_SLOTS)
        v = v * 10 + (*p++ - '0');
    if (*p != ' ' || v >= MONARCH_MAX_SLOTS)
        goto bad;
    p++;
    if (v > MONARCH_SLOT_PFS && (p[0] != '/' || strlen(p) >= PATH_MAX))
        goto bad;
    strcpy(path, p);
    slot = (int)v;
    goto out;
bad:
    MONARCH_DEBUG(1, "daemon: bad answer '%.200s'", buf);
out:
    real_close(s);
    return slot;
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

/*
 * Before the application's open: -1 = not managed (pass through); 0 = managed,
 * open the PFS original with the application's own call (monarch_after counts
 * it); > 0 = a staged copy is open in *fdp, counted under the returned slot.
 */
static int monarch_before(int dirfd, const char *path, int flags, int *fdp)
{
    if (monarch_guard || !path || !path[0])
        return -1;
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC | O_DIRECTORY | O_PATH)))
        return -1;
    if (MONARCH_UNLIKELY(!__atomic_load_n(&monarch_ready, __ATOMIC_ACQUIRE)))
        monarch_ensure_init();
    if (!monarch_enabled)
        return -1;

    char abs[PATH_MAX];
    size_t len;
    if (monarch_abspath(dirfd, path, abs, &len) != 0)
        return -1;
    const struct monarch_root *root = NULL;
    for (unsigned i = 0; i < monarch_nroots; i++) {
        const struct monarch_root *r = &monarch_roots[i];
        if (len > r->len + 1 && abs[r->len] == '/' && memcmp(abs, r->path, r->len) == 0) {
            root = r;
            break;
        }
    }
    if (!root || monarch_wants_dir(path))
        return -1;

    /* Managed: from here on, the slow path. */
    int saved = errno;
    monarch_guard = 1;
    char key[PATH_MAX], staged[PATH_MAX];
    const char *rel = abs + root->len + 1;
    int kl = snprintf(key, sizeof key, "%u/%s", root->index, rel);
    int slot = MONARCH_SLOT_PFS;
    int pflags = flags & ~(O_DIRECT | O_NOATIME); /* a tmpfs copy may refuse them */
    if (kl <= 0 || (size_t)kl >= sizeof key)
        goto out;
    for (unsigned i = 0; i < monarch_nprobes; i++) {
        const struct monarch_probe *pr = &monarch_probes[i];
        if (pr->len + 1 + (size_t)kl >= PATH_MAX)
            continue;
        memcpy(staged, pr->dir, pr->len);
        staged[pr->len] = '/';
        memcpy(staged + pr->len + 1, key, (size_t)kl + 1);
        int fd = monarch_open_staged(staged, pflags);
        if (fd >= 0) {
            MONARCH_DEBUG(1, "open %s: hit slot %u %s (fd %d)", path, pr->slot, staged, fd);
            *fdp = fd;
            slot = (int)pr->slot;
            goto out;
        }
    }
    int answer = monarch_ask(key, (size_t)kl, staged);
    if (answer > MONARCH_SLOT_PFS) {
        int fd = monarch_open_staged(staged, pflags);
        if (fd >= 0) {
            MONARCH_DEBUG(1, "open %s: daemon slot %d %s (fd %d)", path, answer, staged, fd);
            *fdp = fd;
            slot = answer;
            goto out;
        }
        MONARCH_DEBUG(1, "open %s: daemon named %s, which does not open: %s", path, staged, strerror(errno));
    }
    MONARCH_DEBUG(1, "open %s: PFS (key %s, daemon %d)", path, key, answer);
out:
    monarch_guard = 0;
    errno = saved;
    return slot;
}

/* After the application's own open call (pass-through or PFS original). */
static inline void monarch_after(int fd, int how)
{
    if (how == MONARCH_SLOT_PFS)
        monarch_track(fd, MONARCH_SLOT_PFS);
    else if (fd >= 0)
        monarch_forget(fd); /* a stale entry from a close we did not see */
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
    __typeof__(real_##name) real_ = MONARCH_RESOLVE(name);           \
    if (MONARCH_UNLIKELY(!real_)) {                                  \
        errno = ENOSYS;                                              \
        return -1;                                                   \
    }                                                                \
    int fd_ = -1;                                                    \
    int how_ = monarch_before(dirfd, path, flags, &fd_);             \
    if (how_ > MONARCH_SLOT_PFS) {                                   \
        monarch_track(fd_, (unsigned)how_);                          \
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

/* FILE *fopen(const char *path, const char *mode) */
#define MONARCH_WRAP_FOPEN(name)                                                  \
    static FILE *(*real_##name)(const char *, const char *);                     \
    MONARCH_EXPORT FILE *name(const char *path, const char *mode)                 \
    {                                                                             \
        __typeof__(real_##name) real_ = MONARCH_RESOLVE(name);                    \
        if (MONARCH_UNLIKELY(!real_)) {                                           \
            errno = ENOSYS;                                                       \
            return NULL;                                                          \
        }                                                                         \
        int fd_ = -1, flags = monarch_fopen_flags(mode);                          \
        int how_ = flags < 0 ? -1 : monarch_before(AT_FDCWD, path, flags, &fd_);  \
        if (how_ > MONARCH_SLOT_PFS) {                                            \
            int saved_ = errno;                                                   \
            FILE *fp_ = fdopen(fd_, mode);                                        \
            if (fp_) {                                                            \
                monarch_track(fd_, (unsigned)how_);                               \
                return fp_;                                                       \
            }                                                                     \
            real_close(fd_);                                                      \
            errno = saved_;                                                       \
            how_ = MONARCH_SLOT_PFS;                                              \
        }                                                                         \
        FILE *fp_ = real_(path, mode);                                            \
        monarch_after(fp_ ? fileno(fp_) : -1, how_);                              \
        return fp_;                                                               \
    }

/* Byte-counting I/O: the result (> 0) is added to the slot of descriptor fd. */
#define MONARCH_WRAP_IO(name, ret, fd, params, args)                              \
    static ret(*real_##name) params;                                              \
    MONARCH_EXPORT ret name params                                                \
    {                                                                             \
        __typeof__(real_##name) real_ = MONARCH_RESOLVE(name);                    \
        if (MONARCH_UNLIKELY(!real_)) {                                           \
            errno = ENOSYS;                                                       \
            return -1;                                                            \
        }                                                                         \
        ret n_ = real_ args;                                                      \
        if (n_ > 0)                                                               \
            monarch_count_bytes(fd, (uint64_t)n_);                                \
        return n_;                                                                \
    }

/* Every wrapped symbol, one line each. Instantiated twice: to define the
 * wrappers, and (MONARCH_RESOLVE_ALL) to resolve every real_* at start-up. */
#define MONARCH_WRAPPERS(OPEN, OPEN_2, OPENAT, OPENAT_2, FOPEN, IO)                                      \
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
       (int in, off64_t *io, int out, off64_t *oo, size_t n, unsigned int f), (in, io, out, oo, n, f))

/* glibc declares the fortified entry points only under _FORTIFY_SOURCE. */
ssize_t __read_chk(int fd, void *b, size_t n, size_t bl);
ssize_t __pread_chk(int fd, void *b, size_t n, off_t o, size_t bl);
ssize_t __pread64_chk(int fd, void *b, size_t n, off64_t o, size_t bl);
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);

MONARCH_WRAPPERS(MONARCH_WRAP_OPEN, MONARCH_WRAP_OPEN_2, MONARCH_WRAP_OPENAT, MONARCH_WRAP_OPENAT_2,
                 MONARCH_WRAP_FOPEN, MONARCH_WRAP_IO)

/* ---- descriptor lifecycle: close, fclose, dup* keep the fd table true ---- */
MONARCH_EXPORT int close(int fd)
{
    __typeof__(real_close) real_ = MONARCH_RESOLVE(close);
    if (MONARCH_UNLIKELY(!real_)) {
        errno = ENOSYS;
        return -1;
    }
    monarch_forget(fd); /* before: once closed, another thread may reuse the number */
    return real_(fd);
}

MONARCH_EXPORT int fclose(FILE *fp)
{
    __typeof__(real_fclose) real_ = MONARCH_RESOLVE(fclose);
    if (MONARCH_UNLIKELY(!real_)) {
        errno = ENOSYS;
        return EOF;
    }
    if (fp)
        monarch_forget(fileno(fp)); /* glibc closes the fd internally */
    return real_(fp);
}

MONARCH_EXPORT int dup(int oldfd)
{
    __typeof__(real_dup) real_ = MONARCH_RESOLVE(dup);
    if (MONARCH_UNLIKELY(!real_)) {
        errno = ENOSYS;
        return -1;
    }
    int fd = real_(oldfd);
    if (fd >= 0)
        monarch_copy_slot(oldfd, fd);
    return fd;
}

MONARCH_EXPORT int dup2(int oldfd, int newfd)
{
    __typeof__(real_dup2) real_ = MONARCH_RESOLVE(dup2);
    if (MONARCH_UNLIKELY(!real_)) {
        errno = ENOSYS;
        return -1;
    }
    int fd = real_(oldfd, newfd);
    if (fd >= 0 && oldfd != newfd)
        monarch_copy_slot(oldfd, fd);
    return fd;
}

MONARCH_EXPORT int dup3(int oldfd, int newfd, int flags)
{
    __typeof__(real_dup3) real_ = MONARCH_RESOLVE(dup3);
    if (MONARCH_UNLIKELY(!real_)) {
        errno = ENOSYS;
        return -1;
    }
    int fd = real_(oldfd, newfd, flags);
    if (fd >= 0)
        monarch_copy_slot(oldfd, fd);
    return fd;
}

MONARCH_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
    __typeof__(real_close_range) real_ = MONARCH_RESOLVE(close_range);
    if (MONARCH_UNLIKELY(!real_)) {
        errno = ENOSYS;
        return -1;
    }
    int r = real_(first, last, flags);
    if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC) && getpid() == monarch_pid)
        for (unsigned long fd = first; fd <= last && fd < MONARCH_MAX_FDS; fd++)
            __atomic_store_n(&monarch_fd_slot[fd], 0, __ATOMIC_RELAXED);
    return r;
}

/* ---- start-up ---- */
#define MONARCH_RESOLVE_ONE(name, ...) (void)MONARCH_RESOLVE(name);

static void monarch_resolve_all(void)
{
    MONARCH_WRAPPERS(MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE,
                     MONARCH_RESOLVE_ONE, MONARCH_RESOLVE_ONE)
    MONARCH_RESOLVE_ONE(close)
    MONARCH_RESOLVE_ONE(fclose)
    MONARCH_RESOLVE_ONE(dup)
    MONARCH_RESOLVE_ONE(dup2)
    MONARCH_RESOLVE_ONE(dup3)
    MONARCH_RESOLVE_ONE(close_range)
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

static void monarch_parse_roots(const char *env)
{
    char field[PATH_MAX];
    int r;
    for (unsigned k = 0; (r = monarch_next_field(&env, field)) >= 0; k++) {
        if (r || field[0] != '/' || monarch_nroots == MONARCH_MAX_ROOTS) {
            MONARCH_DEBUG(1, "%s: root %u ignored (not an absolute path, or too many roots)", MONARCH_ENV_ROOTS, k);
            continue;
        }
        struct monarch_root *root = &monarch_roots[monarch_nroots++];
        root->len = monarch_normalize(field);
        if (root->len == 1) /* "/" */
            root->len = 0;
        memcpy(root->path, field, root->len);
        root->path[root->len] = '\0';
        root->index = k;
        MONARCH_DEBUG(1, "root %u: %s", k, root->len ? root->path : "/");
    }
}

static void monarch_parse_probe(const char *env)
{
    char field[PATH_MAX];
    int r;
    while ((r = monarch_next_field(&env, field)) >= 0) {
        char *eq = strchr(field, '=');
        char *end = NULL;
        long slot = eq ? strtol(field, &end, 10) : -1;
        if (r || !eq || end != eq || slot <= MONARCH_SLOT_PFS || slot >= MONARCH_MAX_SLOTS || eq[1] != '/'
            || monarch_nprobes == MONARCH_MAX_SLOTS) {
            MONARCH_DEBUG(1, "%s: entry '%.200s' ignored (expected <slot>=<absolute dir>)", MONARCH_ENV_PROBE,
                          r ? "(too long)" : field);
            continue;
        }
        struct monarch_probe *p = &monarch_probes[monarch_nprobes++];
        p->len = monarch_normalize(eq + 1);
        memcpy(p->dir, eq + 1, p->len + 1);
        p->slot = (unsigned)slot;
        MONARCH_DEBUG(1, "probe slot %u: %s", p->slot, p->dir);
    }
}

static uint64_t *monarch_map_counters(const char *path)
{
    int fd = MONARCH_RESOLVE(openat)(AT_FDCWD, path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        MONARCH_DEBUG(1, "%s=%s: %s; not counting", MONARCH_ENV_COUNTERS, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    void *m = MAP_FAILED;
    size_t size = 8 * MONARCH_COUNTERS_WORDS;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= size)
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    real_close(fd);
    if (m == MAP_FAILED) {
        MONARCH_DEBUG(1, "%s=%s: too small or not mappable; not counting", MONARCH_ENV_COUNTERS, path);
        return NULL;
    }
    uint64_t *w = m;
    if (w[0] != MONARCH_COUNTERS_MAGIC || w[1] != MONARCH_COUNTERS_VERSION || w[2] != MONARCH_MAX_SLOTS) {
        MONARCH_DEBUG(1, "%s=%s: not a version %d counters file; not counting", MONARCH_ENV_COUNTERS, path,
                      MONARCH_COUNTERS_VERSION);
        munmap(m, size);
        return NULL;
    }
    return w;
}

static void monarch_atfork_child(void)
{
    /* Per-process state: the pid (vfork detection, debug prefix) and the guard of
     * the forking thread. The counters mapping is MAP_SHARED and inherited, the fd
     * table is inherited with the descriptors it describes, and the daemon is
     * asked over one fresh connection per request: nothing else to reset. */
    monarch_pid = getpid();
    monarch_guard = 0;
    if (!__atomic_load_n(&monarch_ready, __ATOMIC_ACQUIRE)) {
        /* fork raced with start-up in another thread, which does not exist here */
        pthread_once_t fresh = PTHREAD_ONCE_INIT;
        monarch_once = fresh;
    }
}

static void monarch_init(void)
{
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
    const char *sock = getenv(MONARCH_ENV_SOCKET);
    if (sock && sock[0] && strlen(sock) < sizeof monarch_sockaddr.sun_path) {
        monarch_sockaddr.sun_family = AF_UNIX;
        strcpy(monarch_sockaddr.sun_path, sock);
        monarch_have_socket = 1;
    } else if (sock && sock[0]) {
        MONARCH_DEBUG(1, "%s: path longer than %zu bytes; not asking the daemon", MONARCH_ENV_SOCKET,
                      sizeof monarch_sockaddr.sun_path - 1);
    }
    const char *tmo = getenv(MONARCH_ENV_TIMEOUT);
    if (tmo && tmo[0]) {
        char *end;
        long v = strtol(tmo, &end, 10);
        if (*end == '\0' && v > 0 && v <= 24L * 3600 * 1000)
            monarch_timeout_ms = (int)v;
        else
            MONARCH_DEBUG(1, "%s=%s: not a positive number of ms; using %d", MONARCH_ENV_TIMEOUT, tmo,
                          monarch_timeout_ms);
    }
    const char *counters = getenv(MONARCH_ENV_COUNTERS);
    if (counters && counters[0])
        __atomic_store_n(&monarch_counters, monarch_map_counters(counters), __ATOMIC_RELEASE);
    monarch_enabled = 1;
    MONARCH_DEBUG(1, "enabled: %u roots, %u probe dirs, daemon %s, timeout %d ms, counters %s", monarch_nroots,
                  monarch_nprobes, monarch_have_socket ? monarch_sockaddr.sun_path : "(none)", monarch_timeout_ms,
                  monarch_counters ? "on" : "off");
done:
    monarch_guard = 0;
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
