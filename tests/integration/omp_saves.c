/* A training loop's shape in C: an OpenMP team (libgomp makes its futex waits and wakes with an
 * inline `syscall`, not through libc) runs many parallel regions, and every so often a checkpoint
 * is saved as safetensors saves it: another thread creates and writes a temporary through libc, then
 * this (the team's master) thread renames it over its final name by a raw `syscall` instruction and
 * stats it the same way. argv: DIR ROUNDS REGIONS BYTES. Any call that does not give what the
 * kernel gives directly exits 1, said. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static long raw4(long nr, long a, long b, long c, long d)
{
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}

struct save {
    char tmp[4096];
    long bytes;
    int err;
};

static void *write_temporary(void *p)
{
    struct save *s = p;
    int fd = open(s->tmp, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s->err = errno;
        return NULL;
    }
    char *buf = malloc((size_t)s->bytes);
    memset(buf, 'c', (size_t)s->bytes);
    if (write(fd, buf, (size_t)s->bytes) != s->bytes)
        s->err = errno ? errno : EIO;
    free(buf);
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: omp_saves DIR ROUNDS REGIONS BYTES\n");
        return 2;
    }
    const char *dir = argv[1];
    int rounds = atoi(argv[2]), regions = atoi(argv[3]);
    omp_set_num_threads(2);
    double sum = 0;
    for (int round = 0; round < rounds; round++) {
        for (int k = 0; k < regions; k++) {
#pragma omp parallel reduction(+ : sum)
            for (int i = 0; i < 2000; i++)
                sum += (double)(i ^ omp_get_thread_num()) * 1e-9;
        }
        struct save s = {.bytes = atol(argv[4])};
        char final[4096];
        snprintf(s.tmp, sizeof s.tmp, "%s/ck-%d.tmp", dir, round);
        snprintf(final, sizeof final, "%s/ck-%d", dir, round);
        pthread_t t;
        pthread_create(&t, NULL, write_temporary, &s);
        pthread_join(t, NULL);
        if (s.err) {
            fprintf(stderr, "omp_saves: %s: %s\n", s.tmp, strerror(s.err));
            return 1;
        }
        long r = raw4(SYS_renameat, AT_FDCWD, (long)s.tmp, AT_FDCWD, (long)final);
        if (r != 0) {
            fprintf(stderr, "omp_saves: renameat %s -> %s: %s\n", s.tmp, final, strerror((int)-r));
            return 1;
        }
        struct stat st;
        r = raw4(SYS_newfstatat, AT_FDCWD, (long)final, (long)&st, 0);
        if (r != 0 || st.st_size != s.bytes) {
            fprintf(stderr, "omp_saves: stat %s: %s (size %ld)\n", final, strerror((int)-r), (long)st.st_size);
            return 1;
        }
    }
    printf("omp_saves: ok %d rounds (%.3f)\n", rounds, sum);
    return 0;
}
