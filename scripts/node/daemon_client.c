/* Load generator for scripts/node/bench_daemon.py: THREADS threads ask the daemon for the keys
 * of KEYFILE (one per line, thread i takes lines i, i+THREADS, ...) as the shim does: one
 * connection per request, an OPEN frame, answers read until one that is not a heartbeat.
 * Prints one line: answers errors pfs_answers seconds p50_ms p99_ms.
 *
 *   cc -O2 -pthread -o daemon_client daemon_client.c
 *   daemon_client SOCKET KEYFILE THREADS
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define STATUS_PENDING (-2)

static struct sockaddr_un addr;
static char **keys;
static size_t nkeys;
static int nthreads;

struct result {
    double *lat;
    size_t n, errors, pfs;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int recv_exact(int s, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = recv(s, (char *)buf + got, n - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static int ask(const char *key)
{
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return INT32_MIN;
    int status = INT32_MIN;
    size_t kl = strlen(key);
    unsigned char req[8 + 4096];
    if (kl > 4096 || connect(s, (struct sockaddr *)&addr, sizeof addr) != 0)
        goto out;
    req[0] = 1; /* VERB_OPEN */
    req[1] = req[2] = req[3] = 0;
    for (int i = 0; i < 4; i++)
        req[4 + i] = (unsigned char)(kl >> (8 * i));
    memcpy(req + 8, key, kl);
    if (send(s, req, 8 + kl, MSG_NOSIGNAL) != (ssize_t)(8 + kl))
        goto out;
    for (;;) {
        unsigned char hdr[8], body[4096];
        if (recv_exact(s, hdr, 8) != 0)
            goto out;
        int32_t st = (int32_t)(hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (uint32_t)hdr[3] << 24);
        uint32_t blen = hdr[4] | hdr[5] << 8 | hdr[6] << 16 | (uint32_t)hdr[7] << 24;
        if (blen > sizeof body || (blen && recv_exact(s, body, blen) != 0))
            goto out;
        if (st != STATUS_PENDING) {
            status = st;
            break;
        }
    }
out:
    close(s);
    return status;
}

static void *run(void *arg)
{
    long t = (long)arg;
    struct result *r = calloc(1, sizeof *r);
    r->lat = malloc(sizeof(double) * (nkeys / nthreads + 1));
    for (size_t i = (size_t)t; i < nkeys; i += (size_t)nthreads) {
        double t0 = now();
        int st = ask(keys[i]);
        if (st == INT32_MIN) {
            r->errors++;
            continue;
        }
        r->lat[r->n++] = now() - t0;
        r->pfs += st == 0;
    }
    return r;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return fprintf(stderr, "usage: daemon_client SOCKET KEYFILE THREADS\n"), 2;
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, argv[1], sizeof addr.sun_path - 1);
    nthreads = atoi(argv[3]);
    FILE *f = fopen(argv[2], "r");
    if (!f || nthreads < 1)
        return perror(argv[2]), 2;
    size_t cap = 1024;
    keys = malloc(cap * sizeof *keys);
    char line[4200];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (nkeys == cap)
            keys = realloc(keys, (cap *= 2) * sizeof *keys);
        keys[nkeys++] = strdup(line);
    }
    fclose(f);
    pthread_t *th = malloc(sizeof *th * nthreads);
    double t0 = now();
    for (long i = 0; i < nthreads; i++)
        pthread_create(&th[i], NULL, run, (void *)i);
    double *all = malloc(sizeof(double) * (nkeys + 1));
    size_t n = 0, errors = 0, pfs = 0;
    for (int i = 0; i < nthreads; i++) {
        struct result *r;
        pthread_join(th[i], (void **)&r);
        memcpy(all + n, r->lat, r->n * sizeof(double));
        n += r->n;
        errors += r->errors;
        pfs += r->pfs;
    }
    double secs = now() - t0;
    qsort(all, n, sizeof(double), cmp);
    printf("%zu %zu %zu %.6f %.4f %.4f\n", n, errors, pfs, secs, n ? all[n / 2] * 1e3 : 0.0,
           n ? all[(size_t)(n * 0.99) < n ? (size_t)(n * 0.99) : n - 1] * 1e3 : 0.0);
    return 0;
}
