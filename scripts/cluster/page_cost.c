/* What a remote file's bytes cost on this machine before any protocol: the floor under a remote
 * open's CPU. Each copy a node makes of another node's file lands in new page-cache
 * pages (a memfd passed to the application, or a file in the peer area), and on this VM
 * allocating, zeroing and later freeing those pages costs far more than copying the bytes.
 *
 *     cc -O2 -o /tmp/page_cost scripts/cluster/page_cost.c && /tmp/page_cost 16384 65536
 *
 * Prints per file size, in microseconds per file: a memfd made, written and sealed (the
 * transparent path's copy); the same with the pages of an existing file overwritten instead
 * (what reusing a consumed copy's pages would cost); a read of those bytes from the page cache
 * (the owner's side); and a plain memcpy of them. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const int n = 20000;
    for (int a = 1; a < (argc > 1 ? argc : 2); a++) {
        size_t size = argc > 1 ? strtoul(argv[a], NULL, 0) : 16384;
        char *src = malloc(size), *dst = malloc(size);
        memset(src, 7, size);
        double t = now();
        for (int i = 0; i < n; i++) {
            int fd = memfd_create("page-cost", MFD_CLOEXEC | MFD_ALLOW_SEALING);
            if (fd < 0 || pwrite(fd, src, size, 0) != (ssize_t)size ||
                fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK) != 0)
                return perror("memfd"), 1;
            close(fd);
        }
        double fresh = (now() - t) / n * 1e6;
        int fd = memfd_create("page-cost-kept", MFD_CLOEXEC);
        if (fd < 0 || pwrite(fd, src, size, 0) != (ssize_t)size)
            return perror("memfd"), 1;
        t = now();
        for (int i = 0; i < n; i++)
            if (pwrite(fd, src, size, 0) != (ssize_t)size)
                return perror("pwrite"), 1;
        double reused = (now() - t) / n * 1e6;
        t = now();
        for (int i = 0; i < n; i++)
            if (pread(fd, dst, size, 0) != (ssize_t)size)
                return perror("pread"), 1;
        double cached = (now() - t) / n * 1e6;
        t = now();
        for (int i = 0; i < n; i++) {
            memcpy(dst, src, size);
            src[i % size]++;
        }
        double copy = (now() - t) / n * 1e6;
        printf("%zu bytes: new memfd written and sealed %.1f us, existing pages overwritten %.1f us, "
               "read from the page cache %.1f us, memcpy %.2f us\n", size, fresh, reused, cached, copy);
        close(fd);
        free(src);
        free(dst);
    }
    return 0;
}
