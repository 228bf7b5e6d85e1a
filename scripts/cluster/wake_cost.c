/* What a thread's sleep and wake-up cost on this machine: the other floor under a remote
 * open's CPU (page_cost.c is the bytes'). MPI gives nothing to sleep on, so the
 * peer data path's threads poll with sleeps, and every hand-off between the shim, the front
 * door and the data path is a wake-up; on this VM (Firecracker) each costs far more CPU than
 * the work it hands over.
 *
 *     cc -O2 -pthread -o /tmp/wake_cost scripts/cluster/wake_cost.c && /tmp/wake_cost
 *
 * Prints, in microseconds: a nanosleep of 1 to 256 us (timer slack 1 us, as the data path's
 * threads) as wall time and as the CPU it costs the sleeper; a round trip between two threads
 * over a Unix socket (a request and its answer: two wake-ups) as wall time and as CPU of
 * both; and a sched_yield, what a look that does not sleep costs. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int pair[2];

static void *echo(void *arg)
{
    (void)arg;
    char c;
    while (read(pair[1], &c, 1) == 1 && write(pair[1], &c, 1) == 1)
        ;
    return NULL;
}

int main(void)
{
    prctl(PR_SET_TIMERSLACK, 1000UL);
    for (long ns = 1000; ns <= 256000; ns *= 4) {
        int n = ns < 64000 ? 20000 : 3000;
        struct timespec ts = {0, ns};
        double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; i < n; i++)
            nanosleep(&ts, NULL);
        printf("nanosleep %4ld us: wall %6.1f us, CPU %5.1f us a sleep\n", ns / 1000,
               (now(CLOCK_MONOTONIC) - t0) / n * 1e6, (now(CLOCK_PROCESS_CPUTIME_ID) - c0) / n * 1e6);
    }
    pthread_t t;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0 || pthread_create(&t, NULL, echo, NULL) != 0)
        return 1;
    int n = 50000;
    char c = 1;
    double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < n; i++)
        if (write(pair[0], &c, 1) != 1 || read(pair[0], &c, 1) != 1)
            return 1;
    printf("socket round trip between two threads: wall %5.1f us, CPU %5.1f us (two wake-ups)\n",
           (now(CLOCK_MONOTONIC) - t0) / n * 1e6, (now(CLOCK_PROCESS_CPUTIME_ID) - c0) / n * 1e6);
    n = 1000000;
    c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < n; i++)
        sched_yield();
    printf("sched_yield: CPU %.2f us\n", (now(CLOCK_PROCESS_CPUTIME_ID) - c0) / n * 1e6);
    return 0;
}
