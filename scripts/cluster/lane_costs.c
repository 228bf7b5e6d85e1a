/* What the kernel calls of the hinted read-ahead lane cost on this machine, per 64 KiB remote
 * file (wake_cost.c gives the sleeps', page_cost.c a fresh page's). Each figure is
 * the CPU of the calling thread, side by side in one run, on a directory of your choice (the
 * peer area's filesystem: /dev/shm for tmpfs, /tmp for this VM's ext4):
 *
 *     cc -O2 -o /tmp/lane_costs scripts/cluster/lane_costs.c && /tmp/lane_costs /dev/shm && /tmp/lane_costs /tmp
 *
 * - the bytes: a memcpy of 64 KiB; a pwrite of them over a file's pages; a memcpy into a kept
 *   shared mapping of a file's pages (how the lane writes a fetch over a spare); a pread; and
 *   process_vm_readv from another process (the single copy MPI's shared-memory transport makes
 *   between two ranks of one host: the emulated network);
 * - the names: a consumed copy renamed aside and a spare renamed into place (the alternative),
 *   against its key's name unlinked and the next key's linked to the file's own name (what the
 *   lane does), over ten class directories as bench_cluster's dataset has;
 * - the rest of a file's calls: a write lease taken and let go, futimens.
 * The sum of the ones a design cannot do without is the floor under the daemons' CPU per
 * remote file, before any wake-up, request or book-keeping. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SIZE (64 * 1024)
#define RING 256                       /* source buffers: 16 MiB, more than the caches hold */
#define FILES 64                       /* files written over in turn */
#define DIRS 10
#define KEYS 300
#define N 20000

static double cpu_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void say(const char *what, double total)
{
    printf("  %-58s %6.2f us\n", what, total / N);
}

int main(int argc, char **argv)
{
    const char *base = argc > 1 ? argv[1] : "/dev/shm";
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/lane_costs.%d", base, (int)getpid());
    if (mkdir(dir, 0700) != 0) {
        perror(dir);
        return 1;
    }
    char *src = malloc((size_t)SIZE * RING), *dst = malloc((size_t)SIZE * RING);
    memset(src, 1, (size_t)SIZE * RING);
    memset(dst, 2, (size_t)SIZE * RING);
    int top = open(dir, O_DIRECTORY | O_RDONLY), fds[FILES], dirs[DIRS];
    char *maps[FILES];
    for (int i = 0; i < FILES; i++) {
        snprintf(path, sizeof path, "%s/f%d", dir, i);
        fds[i] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fds[i] < 0 || pwrite(fds[i], src, SIZE, 0) != SIZE) {
            perror(path);
            return 1;
        }
        maps[i] = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
    }
    printf("%s, 64 KiB files, CPU of the calling thread a file:\n", base);
    double t = cpu_us();
    for (int i = 0; i < N; i++)
        memcpy(dst + (size_t)(i % RING) * SIZE, src + (size_t)(i * 7 % RING) * SIZE, SIZE);
    say("memcpy", cpu_us() - t);
    t = cpu_us();
    for (int i = 0; i < N; i++)
        if (pwrite(fds[i % FILES], src + (size_t)(i * 7 % RING) * SIZE, SIZE, 0) != SIZE)
            return 1;
    say("pwrite over the file's pages", cpu_us() - t);
    t = cpu_us();
    for (int i = 0; i < N; i++)
        memcpy(maps[i % FILES], src + (size_t)(i * 7 % RING) * SIZE, SIZE);
    say("memcpy into a kept mapping of the file's pages", cpu_us() - t);
    t = cpu_us();
    for (int i = 0; i < N; i++)
        if (pread(fds[i % FILES], dst + (size_t)(i % RING) * SIZE, SIZE, 0) != SIZE)
            return 1;
    say("pread", cpu_us() - t);
    pid_t child = fork();
    if (child == 0) {                  /* holds ``src`` at the same addresses */
        pause();
        _exit(0);
    }
    t = cpu_us();
    for (int i = 0; i < N; i++) {
        struct iovec local = {dst + (size_t)(i % RING) * SIZE, SIZE};
        struct iovec remote = {src + (size_t)(i * 7 % RING) * SIZE, SIZE};
        if (process_vm_readv(child, &local, 1, &remote, 1, 0) != SIZE) {
            perror("process_vm_readv");
            break;
        }
    }
    say("process_vm_readv from another process", cpu_us() - t);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);

    for (int i = 0; i < DIRS; i++) {
        snprintf(path, sizeof path, "%s/class_%03d", dir, i);
        mkdir(path, 0700);
        dirs[i] = open(path, O_DIRECTORY | O_RDONLY);
    }
    char a[64], b[64], own[64];
    for (int k = 0; k < 57; k++) {     /* bench_cluster's peer area: ~57 copies */
        snprintf(a, sizeof a, "sample_%06d", k);
        close(openat(dirs[k % DIRS], a, O_CREAT | O_WRONLY, 0600));
    }
    t = cpu_us();
    for (int i = 0; i < N; i++) {      /* the copy the reader is past goes aside; a spare takes the next key */
        int from = i % KEYS, to = (i + 57) % KEYS;
        snprintf(a, sizeof a, "sample_%06d", from);
        snprintf(b, sizeof b, "sample_%06d", to);
        snprintf(own, sizeof own, ".spare-%d", i);
        renameat(dirs[from % DIRS], a, top, own);
        renameat(top, own, dirs[to % DIRS], b);
    }
    say("names: renamed aside, then into place", cpu_us() - t);
    for (int i = N; i < N + 57; i++) {
        snprintf(a, sizeof a, "sample_%06d", i % KEYS);
        unlinkat(dirs[i % KEYS % DIRS], a, 0);
    }
    for (int k = 0; k < 57; k++) {
        snprintf(a, sizeof a, "sample_%06d", k);
        snprintf(own, sizeof own, ".own-%d", k);
        close(openat(top, own, O_CREAT | O_WRONLY, 0600));
        linkat(top, own, dirs[k % DIRS], a, 0);
    }
    t = cpu_us();
    for (int i = 0; i < N; i++) {      /* its key's name unlinked; the next key's linked to the file's own */
        int from = i % KEYS, to = (i + 57) % KEYS;
        snprintf(a, sizeof a, "sample_%06d", from);
        snprintf(b, sizeof b, "sample_%06d", to);
        snprintf(own, sizeof own, ".own-%d", i % 57);
        unlinkat(dirs[from % DIRS], a, 0);
        linkat(top, own, dirs[to % DIRS], b, 0);
    }
    say("names: key's unlinked, next key's linked to its own", cpu_us() - t);

    signal(SIGURG, SIG_IGN);
    t = cpu_us();
    for (int i = 0; i < N; i++) {
        fcntl(fds[i % FILES], F_SETLEASE, F_WRLCK);
        fcntl(fds[i % FILES], F_SETLEASE, F_UNLCK);
    }
    say("a write lease taken and let go", cpu_us() - t);
    t = cpu_us();
    for (int i = 0; i < N; i++) {
        struct timespec times[2] = {{i, 0}, {i, 0}};
        futimens(fds[i % FILES], times);
    }
    say("futimens", cpu_us() - t);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    return system(path) == 0 ? 0 : 1;
}
