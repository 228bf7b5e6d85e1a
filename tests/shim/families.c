/*
 * families OPEN READ PATH [AFTER]
 *
 * Opens PATH with one glibc open family, reads it to the end with one read
 * family and writes the bytes to stdout (the test compares checksums and the
 * shim's counters). AFTER: "dup" / "dup2" / "fcntl" (F_DUPFD_CLOEXEC) read through a duplicate after
 * closing the original; "reuse=OTHER" closes PATH (close or fclose), opens
 * OTHER by raw syscall on the same number and reads it (must not be counted).
 * On an open failure it prints "errno=N" on stderr and exits 3.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* fortified entry points, called directly (what _FORTIFY_SOURCE would emit) */
int __open_2(const char *, int);
int __open64_2(const char *, int);
int __openat_2(int, const char *, int);
int __openat64_2(int, const char *, int);
ssize_t __read_chk(int, void *, size_t, size_t);
ssize_t __pread_chk(int, void *, size_t, off_t, size_t);
ssize_t __pread64_chk(int, void *, size_t, off64_t, size_t);

static FILE *fp;
static int sent_to_stdout;

static int at(const char *path, int (*fn)(int, const char *, int))
{
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s", path);
    snprintf(b, sizeof b, "%s", path);
    int dfd = open(dirname(a), O_RDONLY | O_DIRECTORY);
    if (dfd < 0)
        return -1;
    int fd = fn(dfd, basename(b), O_RDONLY);
    int e = errno;
    close(dfd);
    errno = e;
    return fd;
}
static int openat_v(int d, const char *p, int f) { return openat(d, p, f); }
static int openat64_v(int d, const char *p, int f) { return openat64(d, p, f); }

static int open_family(const char *name, const char *path)
{
    volatile int rd = O_RDONLY; /* non-constant flags, as fortified code passes them */
    if (!strcmp(name, "open")) return open(path, O_RDONLY);
    if (!strcmp(name, "open64")) return open64(path, O_RDONLY);
    if (!strcmp(name, "__open_2")) return __open_2(path, rd);
    if (!strcmp(name, "__open64_2")) return __open64_2(path, rd);
    if (!strcmp(name, "openat")) return at(path, openat_v);
    if (!strcmp(name, "openat64")) return at(path, openat64_v);
    if (!strcmp(name, "__openat_2")) return at(path, __openat_2);
    if (!strcmp(name, "__openat64_2")) return at(path, __openat64_2);
    if (!strcmp(name, "fopen") || !strcmp(name, "fopen64")) {
        fp = !strcmp(name, "fopen") ? fopen(path, "rb") : fopen64(path, "re");
        return fp ? fileno(fp) : -1;
    }
    fprintf(stderr, "unknown open family %s\n", name);
    exit(2);
}

static ssize_t read_family(const char *name, int fd, char *buf, size_t n, off_t off)
{
    struct iovec v[2] = {{buf, n / 2}, {buf + n / 2, n - n / 2}};
    if (!strcmp(name, "read")) return read(fd, buf, n);
    if (!strcmp(name, "__read_chk")) return __read_chk(fd, buf, n, n);
    if (!strcmp(name, "pread")) return pread(fd, buf, n, off);
    if (!strcmp(name, "pread64")) return pread64(fd, buf, n, off);
    if (!strcmp(name, "__pread_chk")) return __pread_chk(fd, buf, n, off, n);
    if (!strcmp(name, "__pread64_chk")) return __pread64_chk(fd, buf, n, off, n);
    if (!strcmp(name, "readv")) return readv(fd, v, 2);
    if (!strcmp(name, "preadv")) return preadv(fd, v, 2, off);
    if (!strcmp(name, "preadv64")) return preadv64(fd, v, 2, off);
    if (!strcmp(name, "preadv2")) return preadv2(fd, v, 2, off, 0);
    if (!strcmp(name, "preadv64v2")) return preadv64v2(fd, v, 2, off, 0);
    if (!strcmp(name, "fread")) return (ssize_t)fread(buf, 1, n, fp);
    if (!strcmp(name, "sendfile")) {
        sent_to_stdout = 1;
        return sendfile(STDOUT_FILENO, fd, NULL, n);
    }
    fprintf(stderr, "unknown read family %s\n", name);
    exit(2);
}

static void out(const char *buf, size_t n)
{
    while (n) {
        ssize_t w = write(STDOUT_FILENO, buf, n);
        if (w <= 0)
            exit(4);
        buf += w;
        n -= (size_t)w;
    }
}

static void drain(const char *family, int fd, int to_stdout)
{
    char buf[3000]; /* odd size: many calls per file */
    off_t off = 0;
    ssize_t n;
    while ((n = read_family(family, fd, buf, sizeof buf, off)) > 0) {
        if (to_stdout && !sent_to_stdout)
            out(buf, (size_t)n);
        off += n;
    }
    if (n < 0) {
        perror(family);
        exit(5);
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: families OPEN READ PATH [dup|dup2|fcntl|reuse=OTHER]\n");
        return 2;
    }
    const char *after = argc > 4 ? argv[4] : "";
    int fd = open_family(argv[1], argv[3]);
    if (fd < 0) {
        fprintf(stderr, "errno=%d\n", errno);
        return 3;
    }
    if (!strcmp(after, "dup") || !strcmp(after, "dup2") || !strcmp(after, "fcntl")) {
        int copy = !strcmp(after, "dup") ? dup(fd) : !strcmp(after, "dup2") ? dup2(fd, 100)
                                                                             : fcntl(fd, F_DUPFD_CLOEXEC, 50);
        close(fd);
        fd = copy;
    }
    drain(argv[2], fd, 1);
    if (!strncmp(after, "reuse=", 6)) {
        if (fp)
            fclose(fp);
        else
            close(fd);
        int other = (int)syscall(SYS_openat, AT_FDCWD, after + 6, O_RDONLY);
        if (other != fd) {
            fprintf(stderr, "reuse: got fd %d, wanted %d\n", other, fd);
            return 6;
        }
        drain("read", other, 0);
    }
    return 0;
}
