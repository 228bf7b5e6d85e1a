/* Part of monarch_shim.c, one translation unit (what it gives the other parts: shim_rawsys.h).
 * Here: the system calls a library makes without libc (Rust's rustix in safetensors' tempfile,
 * Go's runtime, hand-written `syscall` instructions), which no preload can interpose. Where
 * Monarch changes what a path means (a write-back file lives in the node's tier until it is
 * drained), such a call would reach the PFS and miss it: a rename of a temporary the job just
 * wrote fails with ENOENT. Linux's syscall user dispatch (PR_SET_SYSCALL_USER_DISPATCH, 5.11 and
 * later, x86_64) lets a thread name one range of its code whose system calls go to the kernel at
 * once; every other `syscall` instruction raises SIGSYS on the calling thread instead, the call
 * not made. The range is libc's text: every call made through libc (and so through the shim's
 * wrappers) costs nothing more; a raw call is answered here by the same wrapper libc's call
 * would have met (rename through monarch_wb_rename, open through the write-back view ...), or
 * made by libc's syscall() when no wrapper of the shim's has anything to do with it. Its result
 * goes back in the caller's rax, as the kernel's would have.
 *
 * What the kernel does not carry, done here:
 *   - dispatch is per thread and reset by fork, clone and execve: the constructor watches the
 *     first thread, pthread_create's trampoline each new one, the fork handler (and a raw fork's
 *     child, here) the child; a new image loads the shim again;
 *   - a blocked SIGSYS would end the process at its next raw call: sigprocmask, pthread_sigmask
 *     and a raw rt_sigprocmask never block it; sigaction of SIGSYS (libc's or raw) is kept as the
 *     application's disposition, to which a SIGSYS that is not a dispatch (seccomp's, kill's) goes;
 *   - a raw rt_sigreturn (a handler installed with its own restorer: Go) is made again at a
 *     `syscall` instruction inside libc, with the caller's stack: the kernel restores its frame;
 *   - a raw clone that shares memory or switches stacks (a thread made without pthread_create,
 *     vfork) is made again at its own instruction with this thread's dispatch paused: the thread
 *     is watched again at its next call into the shim's write-back hooks;
 *   - calls from the dynamic loader and glibc's other libraries (libpthread before glibc 2.34)
 *     are made as they are.
 * Where the kernel has no dispatch (older than 5.11, or not x86_64), the launcher has the whole job
 * write through and says so (monarch/writeback/rawsys.py); a program that loads no shim
 * at all (a static binary) is not watched either (docs/consistency.md, "Calls Monarch cannot see").
 */
#include "shim_rawsys.h"

#if defined(__x86_64__)
#include <link.h>
#include <sys/prctl.h>
#include <ucontext.h>

#ifndef PR_SET_SYSCALL_USER_DISPATCH
#define PR_SET_SYSCALL_USER_DISPATCH 59
#endif
#define MONARCH_SUD_ON 1
#ifndef SYS_USER_DISPATCH
#define SYS_USER_DISPATCH 2 /* si_code of a dispatch's SIGSYS */
#endif
#define MONARCH_CLONE_VM 0x00000100UL
#define MONARCH_CLONE_VFORK 0x00004000UL
#define MONARCH_RAW_SYSTEM_MAX 4 /* glibc's other objects whose calls are made as they are */

static uintptr_t monarch_raw_lo, monarch_raw_len; /* libc's text: its calls go to the kernel at once */
static uintptr_t monarch_raw_gadget;               /* a syscall instruction in it */
static struct { uintptr_t lo, hi; } monarch_raw_system[MONARCH_RAW_SYSTEM_MAX];
static unsigned monarch_raw_nsystem;
static struct sigaction monarch_app_sigsys; /* the application's SIGSYS, while the handler is ours */
static int monarch_sigsys_mu;

static void monarch_sigsys_lock(void)
{
    while (__atomic_exchange_n(&monarch_sigsys_mu, 1, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void monarch_sigsys_unlock(void)
{
    __atomic_store_n(&monarch_sigsys_mu, 0, __ATOMIC_RELEASE);
}

/* libc's executable segment (the one holding its syscall()), and those of the loader and glibc's other
 * libraries. */
static int monarch_raw_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    uintptr_t in_libc = (uintptr_t)real_syscall; /* (the name is the shim's own wrapper here) */
    const char *name = strrchr(info->dlpi_name, '/');
    name = name ? name + 1 : info->dlpi_name;
    int glibc = !strncmp(name, "ld-linux", 8) || !strncmp(name, "libpthread.", 11) || !strncmp(name, "librt.", 6)
                || !strncmp(name, "libdl.", 6);
    for (int k = 0; k < info->dlpi_phnum; k++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[k];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (in_libc >= lo && in_libc < hi) {
            monarch_raw_lo = lo;
            monarch_raw_len = hi - lo;
        } else if (glibc && monarch_raw_nsystem < MONARCH_RAW_SYSTEM_MAX) {
            monarch_raw_system[monarch_raw_nsystem].lo = lo;
            monarch_raw_system[monarch_raw_nsystem++].hi = hi;
        }
    }
    return 0;
}

static int monarch_raw_setup_pointer(char *sel)
{
    return prctl(PR_SET_SYSCALL_USER_DISPATCH, MONARCH_SUD_ON, monarch_raw_lo, monarch_raw_len, sel);
}

static void monarch_raw_watch_thread(void)
{
    if (!__atomic_load_n(&monarch_raw_on, __ATOMIC_ACQUIRE))
        return;
    char *sel = monarch_raw_selector();
    __atomic_store_n(sel, MONARCH_SUD_BLOCK, __ATOMIC_RELAXED);
    if (monarch_raw_setup_pointer(sel))
        MONARCH_DEBUG(1, "syscall user dispatch refused for this thread: %s", strerror(errno));
}

static void monarch_raw_atfork_child(void)
{
    monarch_raw_threads_atfork_child();
    monarch_raw_watch_thread();
}

/* A thread paused (a raw clone, a compute runtime's wait): watched again (at a write-back hook). */
static inline void monarch_raw_rearm(void)
{
    char *sel = monarch_raw_selector_if_any();
    if (MONARCH_UNLIKELY(monarch_raw_on) && sel && *sel == MONARCH_SUD_ALLOW)
        __atomic_store_n(sel, MONARCH_SUD_BLOCK, __ATOMIC_RELAXED);
}

/* A SIGSYS that is not a dispatch (seccomp's trap, kill): the application's disposition. */
static void monarch_raw_chain(int sig, siginfo_t *si, void *ctx)
{
    monarch_sigsys_lock();
    struct sigaction app = monarch_app_sigsys;
    monarch_sigsys_unlock();
    if (monarch_app_handler(&app, sig, si, ctx) || app.sa_handler == SIG_IGN)
        return;
    struct sigaction dfl; /* the default (a core dump): as without the shim */
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(SIGSYS, &dfl, NULL);
    syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), SIGSYS);
}

/* The kernel's struct sigaction (rt_sigaction's), and SIGSYS's kept in glibc's form. */
struct monarch_ksigaction {
    void *handler;
    unsigned long flags;
    void *restorer;
    uint64_t mask;
};

static long monarch_raw_rt_sigaction(long sig, const struct monarch_ksigaction *act, struct monarch_ksigaction *old,
                                     long size)
{
    if (sig != SIGSYS)
        return syscall(SYS_rt_sigaction, sig, act, old, size) == 0 ? 0 : -errno;
    struct monarch_ksigaction copy;
    if (act)
        memcpy(&copy, act, sizeof copy);
    monarch_sigsys_lock();
    if (old) {
        memset(old, 0, sizeof *old);
        old->handler = (void *)monarch_app_sigsys.sa_handler;
        old->flags = (unsigned long)(unsigned)monarch_app_sigsys.sa_flags;
        memcpy(&old->mask, &monarch_app_sigsys.sa_mask, sizeof old->mask);
    }
    if (act) {
        memset(&monarch_app_sigsys, 0, sizeof monarch_app_sigsys);
        monarch_app_sigsys.sa_handler = (sighandler_t)copy.handler;
        monarch_app_sigsys.sa_flags = (int)copy.flags;
        memcpy(&monarch_app_sigsys.sa_mask, &copy.mask, sizeof copy.mask);
    }
    monarch_sigsys_unlock();
    return 0;
}

static int monarch_raw_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (sig != SIGSYS || !__atomic_load_n(&monarch_raw_on, __ATOMIC_ACQUIRE))
        return 0;
    struct sigaction copy;
    if (act)
        copy = *act;
    monarch_sigsys_lock();
    if (old)
        *old = monarch_app_sigsys;
    if (act)
        monarch_app_sigsys = copy;
    monarch_sigsys_unlock();
    return 1;
}

static const sigset_t *monarch_raw_unblock(int how, const sigset_t *set, sigset_t *copy)
{
    if (!set || how == SIG_UNBLOCK || !__atomic_load_n(&monarch_raw_on, __ATOMIC_RELAXED) || !sigismember(set, SIGSYS))
        return set;
    *copy = *set;
    sigdelset(copy, SIGSYS);
    return copy;
}

/* A call's result as the kernel gives it: the value, or -errno. */
#define MONARCH_RAW_RESULT(call)                                      \
    do {                                                              \
        long r_ = (long)(call);                                       \
        return r_ == -1 ? -(long)errno : r_;                          \
    } while (0)
#define P(i) ((const char *)a[i])
#define I(i) ((int)a[i])

static __thread int monarch_raw_depth __attribute__((tls_model("initial-exec")));

/* Raw call nr with arguments a[6], answered by the shim's wrapper of libc's call where it has one.
 * Memory calls never are: they are what other interposers (UCX's memory hooks, allocators) hook and
 * make again by syscall() as their original. Nor is a call made while the wrapper answering one
 * runs: an interposer after the shim whose own wrapper ends in syscall() gets the kernel's. */
static long monarch_raw_wrapped(long nr, const long *a);

static long monarch_raw_call(long nr, const long *a)
{
    if (monarch_raw_depth)
        MONARCH_RAW_RESULT(syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]));
    monarch_raw_depth = 1;
    long r = monarch_raw_wrapped(nr, a);
    monarch_raw_depth = 0;
    return r;
}

static long monarch_raw_wrapped(long nr, const long *a)
{
    switch (nr) {
    case SYS_open: MONARCH_RAW_RESULT(open(P(0), I(1), (mode_t)a[2]));
    case SYS_openat: MONARCH_RAW_RESULT(openat(I(0), P(1), I(2), (mode_t)a[3]));
    case SYS_creat: MONARCH_RAW_RESULT(creat(P(0), (mode_t)a[1]));
    case SYS_close: MONARCH_RAW_RESULT(close(I(0)));
    case SYS_close_range: MONARCH_RAW_RESULT(close_range((unsigned)a[0], (unsigned)a[1], I(2)));
    case SYS_read: MONARCH_RAW_RESULT(read(I(0), (void *)a[1], (size_t)a[2]));
    case SYS_pread64: MONARCH_RAW_RESULT(pread64(I(0), (void *)a[1], (size_t)a[2], (off64_t)a[3]));
    case SYS_readv: MONARCH_RAW_RESULT(readv(I(0), (const struct iovec *)a[1], I(2)));
    case SYS_preadv: MONARCH_RAW_RESULT(preadv64(I(0), (const struct iovec *)a[1], I(2), (off64_t)a[3]));
    case SYS_write: MONARCH_RAW_RESULT(write(I(0), (const void *)a[1], (size_t)a[2]));
    case SYS_pwrite64: MONARCH_RAW_RESULT(pwrite64(I(0), (const void *)a[1], (size_t)a[2], (off64_t)a[3]));
    case SYS_writev: MONARCH_RAW_RESULT(writev(I(0), (const struct iovec *)a[1], I(2)));
    case SYS_pwritev: MONARCH_RAW_RESULT(pwritev64(I(0), (const struct iovec *)a[1], I(2), (off64_t)a[3]));
    case SYS_stat: MONARCH_RAW_RESULT(stat(P(0), (struct stat *)a[1]));
    case SYS_lstat: MONARCH_RAW_RESULT(lstat(P(0), (struct stat *)a[1]));
    case SYS_fstat: MONARCH_RAW_RESULT(fstat(I(0), (struct stat *)a[1]));
    case SYS_newfstatat: MONARCH_RAW_RESULT(fstatat(I(0), P(1), (struct stat *)a[2], I(3)));
    case SYS_statx: MONARCH_RAW_RESULT(statx(I(0), P(1), I(2), (unsigned)a[3], (struct statx *)a[4]));
    case SYS_access: MONARCH_RAW_RESULT(access(P(0), I(1)));
    case SYS_faccessat: MONARCH_RAW_RESULT(faccessat(I(0), P(1), I(2), 0));
    case 439 /* faccessat2 */: MONARCH_RAW_RESULT(faccessat(I(0), P(1), I(2), I(3)));
    case SYS_rename: MONARCH_RAW_RESULT(rename(P(0), P(1)));
    case SYS_renameat: MONARCH_RAW_RESULT(renameat(I(0), P(1), I(2), P(3)));
    case SYS_renameat2: MONARCH_RAW_RESULT(renameat2(I(0), P(1), I(2), P(3), (unsigned)a[4]));
    case SYS_unlink: MONARCH_RAW_RESULT(unlink(P(0)));
    case SYS_unlinkat: MONARCH_RAW_RESULT(unlinkat(I(0), P(1), I(2)));
    case SYS_rmdir: MONARCH_RAW_RESULT(rmdir(P(0)));
    case SYS_mkdir: MONARCH_RAW_RESULT(mkdir(P(0), (mode_t)a[1]));
    case SYS_mkdirat: MONARCH_RAW_RESULT(mkdirat(I(0), P(1), (mode_t)a[2]));
    case SYS_link: MONARCH_RAW_RESULT(link(P(0), P(1)));
    case SYS_linkat: MONARCH_RAW_RESULT(linkat(I(0), P(1), I(2), P(3), I(4)));
    case SYS_symlink: MONARCH_RAW_RESULT(symlink(P(0), P(1)));
    case SYS_symlinkat: MONARCH_RAW_RESULT(symlinkat(P(0), I(1), P(2)));
    case SYS_chmod: MONARCH_RAW_RESULT(chmod(P(0), (mode_t)a[1]));
    case SYS_fchmodat: MONARCH_RAW_RESULT(fchmodat(I(0), P(1), (mode_t)a[2], 0));
    case SYS_fchmod: MONARCH_RAW_RESULT(fchmod(I(0), (mode_t)a[1]));
    case SYS_chown: MONARCH_RAW_RESULT(chown(P(0), (uid_t)a[1], (gid_t)a[2]));
    case SYS_lchown: MONARCH_RAW_RESULT(lchown(P(0), (uid_t)a[1], (gid_t)a[2]));
    case SYS_fchownat: MONARCH_RAW_RESULT(fchownat(I(0), P(1), (uid_t)a[2], (gid_t)a[3], I(4)));
    case SYS_truncate: MONARCH_RAW_RESULT(truncate(P(0), (off_t)a[1]));
    case SYS_utimensat:
        if (!a[1]) /* futimens: a descriptor's, libc's wrapper refuses a NULL path */
            break;
        MONARCH_RAW_RESULT(utimensat(I(0), P(1), (const struct timespec *)a[2], I(3)));
    case SYS_mknod: MONARCH_RAW_RESULT(mknod(P(0), (mode_t)a[1], (dev_t)a[2]));
    case SYS_mknodat: MONARCH_RAW_RESULT(mknodat(I(0), P(1), (mode_t)a[2], (dev_t)a[3]));
    case SYS_fsync: MONARCH_RAW_RESULT(fsync(I(0)));
    case SYS_fdatasync: MONARCH_RAW_RESULT(fdatasync(I(0)));
    case SYS_sync_file_range:
        MONARCH_RAW_RESULT(sync_file_range(I(0), (off64_t)a[1], (off64_t)a[2], (unsigned)a[3]));
    case SYS_msync: MONARCH_RAW_RESULT(msync((void *)a[0], (size_t)a[1], I(2)));
    case SYS_dup: MONARCH_RAW_RESULT(dup(I(0)));
    case SYS_dup2: MONARCH_RAW_RESULT(dup2(I(0), I(1)));
    case SYS_dup3: MONARCH_RAW_RESULT(dup3(I(0), I(1), I(2)));
    case SYS_fcntl: MONARCH_RAW_RESULT(fcntl(I(0), I(1), a[2]));
    case SYS_execve: MONARCH_RAW_RESULT(execve(P(0), (char *const *)a[1], (char *const *)a[2]));
    case SYS_rt_sigaction:
        if (!__atomic_load_n(&monarch_raw_on, __ATOMIC_RELAXED))
            break;
        return monarch_raw_rt_sigaction(a[0], (const struct monarch_ksigaction *)a[1],
                                        (struct monarch_ksigaction *)a[2], a[3]);
    case SYS_rt_sigprocmask: {
        uint64_t mask;
        const uint64_t *set = (const uint64_t *)a[1];
        if (set && a[0] != SIG_UNBLOCK && __atomic_load_n(&monarch_raw_on, __ATOMIC_RELAXED)) {
            mask = *set & ~(1ULL << (SIGSYS - 1));
            set = &mask;
        }
        MONARCH_RAW_RESULT(syscall(SYS_rt_sigprocmask, a[0], set, a[2], a[3]));
    }
    default:
        break;
    }
    MONARCH_RAW_RESULT(syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]));
}
#undef P
#undef I

static void monarch_raw_on_sigsys(int sig, siginfo_t *si, void *ctx)
{
    if (si->si_code != SYS_USER_DISPATCH) {
        monarch_raw_chain(sig, si, ctx);
        return;
    }
    int saved = errno;
    greg_t *g = ((ucontext_t *)ctx)->uc_mcontext.gregs;
    long nr = g[REG_RAX], a[6] = {g[REG_RDI], g[REG_RSI], g[REG_RDX], g[REG_R10], g[REG_R8], g[REG_R9]};
    uintptr_t at = (uintptr_t)g[REG_RIP];
    int system = 0;
    for (unsigned i = 0; i < monarch_raw_nsystem; i++)
        system |= at >= monarch_raw_system[i].lo && at < monarch_raw_system[i].hi;
    if (nr == SYS_rt_sigreturn) {
        /* made again inside libc, the caller's stack unchanged: the kernel finds its frame there */
        g[REG_RIP] = (greg_t)monarch_raw_gadget;
        return;
    }
    if (nr == SYS_vfork || nr == SYS_clone3
        || (nr == SYS_clone && ((a[0] & (MONARCH_CLONE_VM | MONARCH_CLONE_VFORK)) || a[1]))) {
        /* the child would start in this handler, on another stack: made again where it was */
        monarch_raw_pause();
        g[REG_RIP] -= 2; /* `syscall` is 0f 05 */
        errno = saved;
        return;
    }
    MONARCH_DEBUG(2, "raw system call %ld at %p", nr, (void *)at);
    int64_t t0 = monarch_now_ns();
    /* a compute runtime's own call (an OpenMP barrier's futex): this thread paused until it is watched again */
    int paused = !system && monarch_raw_in_runtime(at);
    if (paused)
        monarch_raw_pause();
    long r;
    if ((system || paused) && nr != SYS_rt_sigprocmask && nr != SYS_rt_sigaction) {
        long v = syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
        r = v == -1 ? -(long)errno : v;
    } else {
        r = monarch_raw_call(nr, a);
    }
    if (r == 0 && (nr == SYS_fork || nr == SYS_clone)) { /* a fork's child: watched too, and the shim's own */
        monarch_atfork_child();
    } else {
        monarch_raw_count(nr, (uint64_t)(monarch_now_ns() - t0), paused);
    }
    g[REG_RAX] = r;
    errno = saved;
}

static void monarch_raw_setup(void)
{
    const char *v = getenv(MONARCH_ENV_RAW_SYSCALLS);
    int want = v && v[0] ? strcmp(v, "0") != 0 : monarch_nwb > 0;
    if (!want || !real_sigaction || !MONARCH_RESOLVE(syscall))
        return;
    dl_iterate_phdr(monarch_raw_object, NULL);
    for (uintptr_t p = monarch_raw_lo; monarch_raw_len && p + 1 < monarch_raw_lo + monarch_raw_len; p++)
        if (((const unsigned char *)p)[0] == 0x0f && ((const unsigned char *)p)[1] == 0x05) {
            monarch_raw_gadget = p;
            break;
        }
    if (!monarch_raw_gadget) {
        MONARCH_DEBUG(1, "libc's text not found: raw system calls not watched");
        return;
    }
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = monarch_raw_on_sigsys;
    /* NODEFER: a raw call inside another signal's handler, or inside an application's SIGSYS
     * handler, is dispatched too; ONSTACK: Go's small stacks have an alternate one */
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (real_sigaction(SIGSYS, &sa, &old) != 0)
        return;
    monarch_app_sigsys = old;
    __atomic_store_n(&monarch_raw_on, 1, __ATOMIC_RELEASE);
    sigset_t sys;
    sigemptyset(&sys);
    sigaddset(&sys, SIGSYS);
    pthread_sigmask(SIG_UNBLOCK, &sys, NULL);
    monarch_raw_threads_setup();
    char *sel = monarch_raw_selector();
    __atomic_store_n(sel, MONARCH_SUD_BLOCK, __ATOMIC_RELAXED);
    if (monarch_raw_setup_pointer(sel)) {
        /* no dispatch here (a kernel before 5.11, a seccomp filter): said once, as without it */
        const char *why = strerror(errno);
        __atomic_store_n(&monarch_raw_on, 0, __ATOMIC_RELEASE);
        real_sigaction(SIGSYS, &old, NULL);
        if (monarch_nwb)
            monarch_say(MONARCH_FALLBACK_RAW_UNWATCHED, "this process's raw system calls cannot be watched (syscall user dispatch: %s): "
                        "a library that renames or opens a write-back file without libc may not find it",
                        why);
        return;
    }
    MONARCH_DEBUG(1, "raw system calls watched: libc's text %p+%lx", (void *)monarch_raw_lo,
                  (unsigned long)monarch_raw_len);
}

/* ---- new threads: watched from their first instruction of the application's ---- */
struct monarch_raw_start {
    void *(*fn)(void *);
    void *arg;
};

static void *monarch_raw_thread(void *p)
{
    struct monarch_raw_start s = *(struct monarch_raw_start *)p;
    free(p);
    monarch_raw_watch_thread();
    return s.fn(s.arg);
}

MONARCH_EXPORT int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    __typeof__(real_pthread_create) real_ = MONARCH_RESOLVE(pthread_create);
    if (!real_)
        return EAGAIN;
    struct monarch_raw_start *s = __atomic_load_n(&monarch_raw_on, __ATOMIC_ACQUIRE) ? malloc(sizeof *s) : NULL;
    if (!s)
        return real_(t, attr, fn, arg);
    s->fn = fn;
    s->arg = arg;
    int r = real_(t, attr, monarch_raw_thread, s);
    if (r)
        free(s);
    return r;
}

#else /* no syscall user dispatch on this architecture: nothing watched (the launcher says so) */
static void monarch_raw_setup(void) {}
static inline void monarch_raw_watch_thread(void) {}
static void monarch_raw_atfork_child(void) {}
static inline void monarch_raw_rearm(void) {}
static int monarch_raw_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    (void)sig, (void)act, (void)old;
    return 0;
}
static const sigset_t *monarch_raw_unblock(int how, const sigset_t *set, sigset_t *copy)
{
    (void)how, (void)copy;
    return set;
}
#endif

/* ---- syscall(): libc's own door to any system call, wrapped as a preload can ---- */
/* syscall()'s six arguments after `last` into a[6] (as libc's reads them: whatever the caller gave) */
#define MONARCH_SIX_ARGS(last, a)                 \
    do {                                          \
        va_list ap_;                              \
        va_start(ap_, last);                      \
        for (int i_ = 0; i_ < 6; i_++)            \
            (a)[i_] = va_arg(ap_, long);          \
        va_end(ap_);                              \
    } while (0)

static long monarch_libc_syscall(long nr, ...)
{
    long a[6];
    MONARCH_SIX_ARGS(nr, a);
    __typeof__(real_syscall) real_ = MONARCH_RESOLVE(syscall);
    if (MONARCH_UNLIKELY(!real_)) {
        errno = ENOSYS;
        return -1;
    }
    return real_(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* A program's syscall(SYS_renameat, ...) is answered as its renameat() would be (x86_64's numbers;
 * the calls no wrapper of the shim's has anything to do with go to libc's at once). */
MONARCH_EXPORT long(syscall)(long nr, ...)
{
    long a[6];
    MONARCH_SIX_ARGS(nr, a);
#if defined(__x86_64__)
    if (!monarch_guard && nr != SYS_rt_sigreturn && __atomic_load_n(&monarch_enabled, __ATOMIC_RELAXED)) {
        long r = monarch_raw_call(nr, a);
        if (r < 0 && r > -4096) {
            errno = (int)-r;
            return -1;
        }
        return r;
    }
#endif
    return monarch_libc_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* ---- SIGSYS never blocked while raw calls are watched ---- */
MONARCH_EXPORT int sigprocmask(int how, const sigset_t *set, sigset_t *old)
{
    MONARCH_REAL(sigprocmask, -1)
    sigset_t copy;
    return real_(how, monarch_raw_unblock(how, set, &copy), old);
}

MONARCH_EXPORT int pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
    __typeof__(real_pthread_sigmask) real_ = MONARCH_RESOLVE(pthread_sigmask);
    if (!real_)
        return ENOSYS;
    sigset_t copy;
    return real_(how, monarch_raw_unblock(how, set, &copy), old);
}
