/* The C reader of scripts/cluster/bench_peer.py: THREADS threads open, read and close every file of
 * LIST (lines "CRC32 SIZE PATH"; thread i takes lines i, i+THREADS, ...) as a C application
 * does, each file's bytes checked against its CRC-32 (zlib's, as Python's zlib.crc32). Beside
 * the Python reader it shows what the peer path sustains when the reader itself costs little.
 * Prints one line of JSON: seconds, cpu (the process's CPU-seconds), files, ok.
 *
 *   cc -O2 -pthread -o peer_reader peer_reader.c
 *   peer_reader LIST THREADS
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct file { uint32_t crc; size_t size; char *path; };

static struct file *files;
static size_t nfiles;
static int nthreads;
static uint32_t table[8][256];

/* slicing by 8 (little-endian): the check costs the reader little beside the bytes it reads */
static uint32_t crc32_of(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
            table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^ table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
    }
    while (n--)
        c = table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static double now(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *reader(void *arg)
{
    size_t first = (size_t)(intptr_t)arg, bad = 0, cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    for (size_t i = first; buf && i < nfiles; i += (size_t)nthreads) {
        int fd = open(files[i].path, O_RDONLY | O_CLOEXEC);
        size_t got = 0;
        ssize_t r = 0;
        while (fd >= 0 && got < cap && (r = read(fd, buf + got, cap - got)) > 0)
            got += (size_t)r;
        if (fd < 0 || r < 0 || got != files[i].size || crc32_of(buf, got) != files[i].crc) {
            fprintf(stderr, "peer_reader: %s: %s\n", files[i].path, fd < 0 || r < 0 ? "unreadable" : "wrong bytes");
            bad++;
        }
        if (fd >= 0)
            close(fd);
    }
    free(buf);
    return (void *)(intptr_t)(buf ? bad : 1);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (nthreads = atoi(argv[2])) < 1) {
        fprintf(stderr, "usage: peer_reader LIST THREADS\n");
        return 2;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
    FILE *in = fopen(argv[1], "r");
    char line[8192];
    size_t cap = 0;
    while (in && fgets(line, sizeof line, in)) {
        unsigned long crc;
        size_t size;
        int at = 0;
        if (sscanf(line, "%lu %zu %n", &crc, &size, &at) != 2 || !at)
            continue;
        line[strcspn(line, "\n")] = 0;
        if (nfiles == cap && !(files = realloc(files, (cap = cap ? 2 * cap : 4096) * sizeof *files)))
            return 2;
        files[nfiles++] = (struct file){(uint32_t)crc, size, strdup(line + at)};
    }
    if (!in || !nfiles) {
        fprintf(stderr, "peer_reader: %s: no files listed\n", argv[1]);
        return 2;
    }
    fclose(in);
    pthread_t *t = calloc((size_t)nthreads, sizeof *t);
    double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, reader, (void *)(intptr_t)i);
    size_t bad = 0;
    for (int i = 0; i < nthreads; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (size_t)(intptr_t)r;
    }
    printf("{\"seconds\": %.6f, \"cpu\": %.6f, \"files\": %zu, \"ok\": %s}\n", now(CLOCK_MONOTONIC) - t0,
           now(CLOCK_PROCESS_CPUTIME_ID) - c0, nfiles, bad ? "false" : "true");
    return bad ? 1 : 0;
}
