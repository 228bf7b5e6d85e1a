/* The least CPU a remote file can cost the two daemons on this machine: two MPI ranks
 * of one host (each a node, the network emulated by MPI's shared-memory transport), the owner
 * holding its files open and mapped, the requester asking for them in batches of files it knows
 * ahead (the hinted lane's shape), and nothing else: no names, no Python, no index, no shim.
 *
 *     python scripts/cluster/bench_peer_floor.py      (builds it, runs the cases of its targets)
 *     $PREFIX/bin/mpiexec -n 2 /tmp/peer_floor [direct|packed] [batch] [size] [files] [rate] [sleep_us]
 *
 * (PREFIX: the interpreter's, where the mpich wheel puts MPICH; ``rate``: files a second a reader
 * consumes, the requester never further ahead of it than its batches in flight, 0 for flat out;
 * ``sleep_us``: the longest sleep between looks at MPI.) Two layouts of the bytes:
 * - direct: one message a file, sent from the owner's mapping of its copy and received straight
 *   into the requester's kept mapping of a spare (the page cache write is MPI's copy);
 * - packed: one message a batch, the owner copying each file into it and the requester copying
 *   each out into its spare's mapping (today's lane and data path).
 * The requester also takes and lets go a write lease on each spare before it is written over and
 * sets its times after, as the lane must (a reader may hold it). Both sides sleep between looks
 * at MPI as the daemons do (MPI offers nothing to sleep on), from 20 us doubling to ``sleep_us``
 * (0.5 ms by default), with 1 us of timer slack. Printed: each rank's CPU and wake-ups per file, and files a second. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FLIGHT 8                       /* batches in flight at once */
#define OWNED 256                      /* the owner's files: 16 MiB of 64 KiB ones, beyond the caches */
#define TAG_REQ 1
#define TAG_DATA 16

static double now_s(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static long wakes(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_nvcsw + r.ru_nivcsw;
}

static long nap_max_ns = 500000;       /* the longest sleep between looks at MPI */

static void nap(long *ns)
{
    struct timespec t = {*ns / 1000000000, *ns % 1000000000};
    nanosleep(&t, NULL);
    *ns = *ns * 2 > nap_max_ns ? nap_max_ns : *ns * 2;
}

/* ``n`` files of ``size`` bytes in a new directory under /dev/shm, each open and mapped. */
static char **make_files(const char *who, int n, int size, int *fds, int writable)
{
    char dir[256], path[320];
    snprintf(dir, sizeof dir, "/dev/shm/peer_floor.%s.%d", who, (int)getpid());
    mkdir(dir, 0700);
    char **maps = calloc(n, sizeof *maps), *bytes = malloc(size);
    for (int i = 0; i < n; i++) {
        memset(bytes, i + 1, size);
        snprintf(path, sizeof path, "%s/f%d", dir, i);
        fds[i] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fds[i] < 0 || pwrite(fds[i], bytes, size, 0) != size) {
            perror(path);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        maps[i] = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED | MAP_POPULATE, fds[i], 0);
        unlink(path);                  /* gone with the process */
    }
    rmdir(dir);
    free(bytes);
    return maps;
}

static void owner(int direct, int batch, int size)
{
    int fds[OWNED], want[65], busy[FLIGHT] = {0};
    char **maps = make_files("owner", OWNED, size, fds, 0);
    char *packs = malloc((size_t)FLIGHT * batch * size);
    MPI_Request ask, sends[FLIGHT][64];
    MPI_Barrier(MPI_COMM_WORLD);
    double cpu = now_s(CLOCK_PROCESS_CPUTIME_ID);
    long w0 = wakes(), ns = 20000;
    MPI_Irecv(want, batch + 1, MPI_INT, 0, TAG_REQ, MPI_COMM_WORLD, &ask);
    for (;;) {
        int worked = 0, got = 0;
        MPI_Test(&ask, &got, MPI_STATUS_IGNORE);
        if (got) {
            if (want[0] < 0)
                break;                 /* the end */
            int s = want[batch], tag = TAG_DATA + s * 64;  /* the requester's slot: its receives' tags */
            if (direct) {
                for (int i = 0; i < batch; i++)
                    MPI_Isend(maps[want[i] % OWNED], size, MPI_BYTE, 0, tag + i, MPI_COMM_WORLD, &sends[s][i]);
            } else {
                char *pack = packs + (size_t)s * batch * size;
                for (int i = 0; i < batch; i++)
                    memcpy(pack + (size_t)i * size, maps[want[i] % OWNED], size);
                MPI_Isend(pack, batch * size, MPI_BYTE, 0, tag, MPI_COMM_WORLD, &sends[s][0]);
            }
            busy[s] = 1;
            MPI_Irecv(want, batch + 1, MPI_INT, 0, TAG_REQ, MPI_COMM_WORLD, &ask);
            worked = 1;
        }
        for (int s = 0; s < FLIGHT; s++) {
            int ok = 0;
            if (busy[s])
                MPI_Testall(direct ? batch : 1, sends[s], &ok, MPI_STATUSES_IGNORE);
            if (ok)
                busy[s] = 0, worked = 1;
        }
        if (worked)
            ns = 20000;
        else
            nap(&ns);
    }
    double mine[2] = {now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu, (double)(wakes() - w0)};
    for (int s = 0; s < FLIGHT; s++)
        if (busy[s])
            MPI_Waitall(direct ? batch : 1, sends[s], MPI_STATUSES_IGNORE);
    MPI_Send(mine, 2, MPI_DOUBLE, 0, 99, MPI_COMM_WORLD);
}

static int requester(int direct, int batch, int size, int files, double rate)
{
    int nspares = FLIGHT * batch, *fds = calloc(nspares, sizeof *fds);
    char **maps = make_files("requester", nspares, size, fds, 1);
    char *packs = malloc((size_t)FLIGHT * batch * size);
    int want[FLIGHT][65];
    MPI_Request reqs[FLIGHT][64];
    int posted[FLIGHT] = {0}, next = 0, done = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double wall = now_s(CLOCK_MONOTONIC), cpu = now_s(CLOCK_PROCESS_CPUTIME_ID);
    long w0 = wakes(), ns = 20000, leases_refused = 0, wrong = 0;
    while (done < files) {
        int worked = 0;
        for (int s = 0; s < FLIGHT; s++) {
            int *spare = fds + s * batch;
            char **spare_at = maps + s * batch;
            /* paced: no further ahead of a reader consuming ``rate`` files a second than the batches in flight */
            int allowed = rate <= 0 || next + batch <= (now_s(CLOCK_MONOTONIC) - wall) * rate + (FLIGHT - 1) * batch;
            if (!posted[s] && next < files && allowed) {  /* gathered and posted: a lease on each spare, then the receives */
                for (int i = 0; i < batch; i++) {
                    if (fcntl(spare[i], F_SETLEASE, F_WRLCK) == 0)
                        fcntl(spare[i], F_SETLEASE, F_UNLCK);
                    else
                        leases_refused++;
                    want[s][i] = (next + i) * 7;
                }
                want[s][batch] = s;
                if (direct)
                    for (int i = 0; i < batch; i++)
                        MPI_Irecv(spare_at[i], size, MPI_BYTE, 1, TAG_DATA + s * 64 + i, MPI_COMM_WORLD, &reqs[s][i]);
                else
                    MPI_Irecv(packs + (size_t)s * batch * size, batch * size, MPI_BYTE, 1, TAG_DATA + s * 64, MPI_COMM_WORLD,
                              &reqs[s][0]);
                MPI_Send(want[s], batch + 1, MPI_INT, 1, TAG_REQ, MPI_COMM_WORLD);
                posted[s] = 1;
                next += batch;
                worked = 1;
            }
        }
        for (int s = 0; s < FLIGHT; s++) {
            int ok = 0;
            if (!posted[s])
                continue;
            MPI_Testall(direct ? batch : 1, reqs[s], &ok, MPI_STATUSES_IGNORE);
            if (!ok)
                continue;
            for (int i = 0; i < batch; i++) {
                char *at = maps[s * batch + i], b = (char)(want[s][i] % OWNED + 1);
                if (!direct)
                    memcpy(at, packs + ((size_t)s * batch + i) * size, size);
                futimens(fds[s * batch + i], NULL);
                wrong += at[0] != b || at[size / 2] != b || at[size - 1] != b;  /* the owner's file's bytes */
            }
            posted[s] = 0;
            done += batch;
            worked = 1;
        }
        if (worked)
            ns = 20000;
        else
            nap(&ns);
    }
    cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu;
    wall = now_s(CLOCK_MONOTONIC) - wall;
    long w = wakes() - w0;
    int end[65];
    for (int i = 0; i < 65; i++)
        end[i] = -1;
    MPI_Send(end, batch + 1, MPI_INT, 1, TAG_REQ, MPI_COMM_WORLD);
    double theirs[2];
    MPI_Recv(theirs, 2, MPI_DOUBLE, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    printf("%-6s %2d files a batch, %6d B: requester %6.2f us %5.2f wake-ups, owner %6.2f us %5.2f wake-ups"
           " a file; together %6.2f us; %8.0f files/s; %s%s\n",
           direct ? "direct" : "packed", batch, size, cpu / done * 1e6, (double)w / done, theirs[0] / done * 1e6,
           theirs[1] / done, (cpu + theirs[0]) / done * 1e6, done / wall, wrong ? "BYTES WRONG" : "bytes OK",
           leases_refused ? " (leases refused)" : "");
    return wrong ? 1 : 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, failed = 0, direct = argc > 1 ? strcmp(argv[1], "packed") != 0 : 1;
    int batch = argc > 2 ? atoi(argv[2]) : 16, size = argc > 3 ? atoi(argv[3]) : 65536;
    int files = argc > 4 ? atoi(argv[4]) : 40000;
    double rate = argc > 5 ? atof(argv[5]) : 0;  /* files a second the reader consumes; 0: as fast as it goes */
    if (argc > 6)
        nap_max_ns = atol(argv[6]) * 1000L;
    if (batch < 1 || batch > 64) batch = 16;
    files -= files % batch;
    prctl(PR_SET_TIMERSLACK, 1000UL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        failed = requester(direct, batch, size, files, rate);
    } else if (rank == 1) {
        owner(direct, batch, size);
    }
    MPI_Finalize();
    return failed;
}
