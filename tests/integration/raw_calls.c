/* A program that reaches the kernel without libc's wrappers, as Rust's rustix and Go do: every
 * call on the files of directory argv[1] by a raw `syscall` instruction ("asm") or by libc's
 * syscall() ("libc"). It writes a temporary (opened through libc, as Rust's std opens it), fsyncs it, renames it over its final name, reads it
 * back, lists the directory, removes another file and makes a directory; any call that does not
 * give what the kernel gives directly exits 1, said. x86_64 (`syscall`) and aarch64 (`svc #0`). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int use_asm;

static long raw6(long nr, long a, long b, long c, long d, long e, long f)
{
    if (!use_asm) {
        long r = syscall(nr, a, b, c, d, e, f);
        return r == -1 ? -errno : r;
    }
#if defined(__x86_64__)
    long r;
    register long r10 __asm__("r10") = d, r8 __asm__("r8") = e, r9 __asm__("r9") = f;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return r;
#elif defined(__aarch64__) /* `svc #0`: the number in x8, the arguments and the result in x0.. */
    register long x8 __asm__("x8") = nr, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d, x4 __asm__("x4") = e, x5 __asm__("x5") = f;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
#else
#error "raw_calls: a raw system call instruction for this architecture"
#endif
}
#define raw(nr, ...) RAW_(nr, __VA_ARGS__, 0L, 0L, 0L, 0L, 0L, 0L)
#define RAW_(nr, a, b, c, d, e, f, ...) raw6(nr, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

#define CHECK(cond, ...)                                \
    do {                                                \
        if (!(cond)) {                                  \
            fprintf(stderr, "raw_calls: " __VA_ARGS__); \
            fprintf(stderr, "\n");                      \
            exit(1);                                    \
        }                                               \
    } while (0)

/* "read": each file named read whole by raw calls, a line "<FNV-1a 64 of its bytes> <size> <name>" */
static int read_files(int n, char **names)
{
    use_asm = 1;
    for (int i = 0; i < n; i++) {
        long fd = raw(SYS_openat, AT_FDCWD, names[i], O_RDONLY | O_CLOEXEC);
        CHECK(fd >= 0, "openat %s: %s", names[i], strerror((int)-fd));
        unsigned long long h = 1469598103934665603ULL, size = 0;
        char buf[65536];
        long got;
        while ((got = raw(SYS_read, fd, buf, sizeof buf)) > 0) {
            for (long k = 0; k < got; k++)
                h = (h ^ (unsigned char)buf[k]) * 1099511628211ULL;
            size += (unsigned long long)got;
        }
        CHECK(got == 0, "read %s: %s", names[i], strerror((int)-got));
        raw(SYS_close, fd);
        printf("%016llx %llu %s\n", h, size, names[i]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "read") == 0)
        return read_files(argc - 2, argv + 2);
    CHECK(argc == 4, "usage: raw_calls DIR asm|libc TAG | raw_calls read FILE...");
    use_asm = strcmp(argv[2], "asm") == 0;
    const char *tag = argv[3];
#ifdef SYS_open
    long dir = raw(SYS_open, argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
#else /* aarch64 has only the *at forms */
    long dir = raw(SYS_openat, AT_FDCWD, argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
#endif
    CHECK(dir >= 0, "open %s: %s", argv[1], strerror((int)-dir));
    char tmp[64], fin[64], gone[64], sub[64];
    snprintf(tmp, sizeof tmp, "%s.safetensors.tmpX1", tag);
    snprintf(fin, sizeof fin, "%s.safetensors", tag);
    snprintf(gone, sizeof gone, "%s.gone", tag);
    snprintf(sub, sizeof sub, "%s-dir", tag);
    char data[100000];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (char)(i * 7 + tag[0]);

    /* as safetensors' tempfile: the temporary opened through libc, renamed by a raw call */
    long fd = openat((int)dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    CHECK(fd >= 0, "openat %s: %s", tmp, strerror(errno));
    long n = raw(SYS_write, fd, data, sizeof data);
    CHECK(n == (long)sizeof data, "write: %ld", n);
    CHECK(raw(SYS_fsync, fd) == 0, "fsync");
    long r = raw(SYS_renameat, dir, tmp, dir, fin); /* tempfile's persist: still open */
    CHECK(r == 0, "renameat %s -> %s: %s", tmp, fin, strerror((int)-r));
    CHECK(raw(SYS_close, fd) == 0, "close");

    struct stat st;
    r = raw(SYS_newfstatat, dir, fin, &st, 0);
    CHECK(r == 0 && st.st_size == (off_t)sizeof data, "newfstatat %s: %ld, size %ld", fin, r, (long)st.st_size);
    r = raw(SYS_newfstatat, dir, tmp, &st, 0);
    CHECK(r == -ENOENT, "newfstatat of the renamed temporary: %ld (want ENOENT)", r);
    fd = raw(SYS_openat, dir, fin, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0, "openat %s to read: %s", fin, strerror((int)-fd));
    char back[sizeof data + 1];
    n = raw(SYS_pread64, fd, back, sizeof back, 0);
    CHECK(n == (long)sizeof data && memcmp(back, data, sizeof data) == 0, "pread64: %ld bytes, not the written", n);
    raw(SYS_close, fd);

    /* a file made through libc, removed by a raw unlinkat; a directory made raw */
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", argv[1], gone);
    FILE *f = fopen(path, "w");
    CHECK(f && fputs("x", f) >= 0 && fclose(f) == 0, "fopen %s", path);
    r = raw(SYS_unlinkat, dir, gone, 0);
    CHECK(r == 0, "unlinkat %s: %s", gone, strerror((int)-r));
    CHECK(access(path, F_OK) != 0 && errno == ENOENT, "%s still there after its unlinkat", gone);
    r = raw(SYS_mkdirat, dir, sub, 0755);
    CHECK(r == 0, "mkdirat %s: %s", sub, strerror((int)-r));
    snprintf(path, sizeof path, "%s/%s", argv[1], sub);
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode), "%s not a directory for libc's stat", sub);
    raw(SYS_close, dir);
    printf("raw_calls %s: ok\n", argv[2]);
    return 0;
}
