"""Every process shape a job has, under ``monarch run``: the same output and exit code as without it.

A job is bash (``$(...)``, pipelines, ``make``, ``xargs``), forks of forks, pools inside processes,
``posix_spawn``, ``vfork``, daemons and setuid programs. Each shape runs once directly and once
under ``monarch run``, each in its own process group with a time bound (a shape that deadlocks in
the shim fails by its bound, its group killed), and the two outputs and exit codes must match.
The stress test forks and double-forks while other threads map, unmap and read files staged
whole and by blocks behind the emulated PFS, every byte checked.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from support.harness import load, monarch_env, run_group, write_config

pytestmark = pytest.mark.integration

BOUND_S = 60  # each shape takes well under a second without the shim

# bash, as launch scripts write it: $F is a dataset file, $D the dataset's root
SLURM_MASTER_ADDR = 'MASTER_ADDR=$(printf "node1\\nnode2\\n" | head -n 1); echo "$MASTER_ADDR"; ' \
                    'x=$(md5sum "$F" | head -1); echo "$x"'
NESTED = 'echo $(echo $(echo $(md5sum "$F" | cut -c1-12 | cat) | cat) | cat); ' \
         '( ( ( cat "$F" | md5sum ) | cat ) ); y=$( (x=$(head -c 5 "$F" | od -An -tx1 | tr -d " "); echo "$x") ); echo "$y"'
XARGS = 'ls "$D"/class_000 | head -30 | xargs -P 4 -I{} sh -c \'md5sum "$D/class_000/{}" | cut -c1-32\' | sort | md5sum'
SHELL_IN_CHILD = 'x=$(md5sum "$F" | cut -c1-32 | head -1); echo "sub $x"'

PY_FORK_IN_FORK = """
import hashlib, os, sys
f = os.environ["F"]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    pid2 = os.fork()
    if pid2 == 0:
        os.write(w, hashlib.md5(open(f, "rb").read()).hexdigest().encode())
        os._exit(0)
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid2, 0)[1]))
os.close(w)
status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(os.read(r, 100).decode(), status)
"""

PY_POOL_IN_PROCESS = """
import hashlib, multiprocessing as mp, os, sys
def digest(p):
    return hashlib.md5(open(p, "rb").read()).hexdigest()
def work(q):
    d = os.path.join(os.environ["D"], "class_000")
    with mp.Pool(2) as pool:
        q.put(sorted(pool.map(digest, sorted(os.path.join(d, n) for n in os.listdir(d))[:20])))
if __name__ == "__main__":
    mp.set_start_method("fork")
    q = mp.Queue()
    p = mp.Process(target=work, args=(q,))
    p.start()
    out = q.get(timeout=50)
    p.join()
    print(hashlib.md5("".join(out).encode()).hexdigest(), p.exitcode)
"""

PY_FORK_WHILE_MAPPING = """
import glob, hashlib, mmap, os, threading
files = sorted(glob.glob(os.path.join(os.environ["D"], "*", "*.bin")))[:40]
stop = threading.Event()
def mapper():
    while not stop.is_set():
        for p in files:
            with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                m[:64]
threads = [threading.Thread(target=mapper) for _ in range(2)]
for t in threads:
    t.start()
codes = []
for i in range(30):
    pid = os.fork()
    if pid == 0:
        pid2 = os.fork()
        if pid2 == 0:
            os._exit(0 if len(open(files[i], "rb").read()) > 0 else 1)
        os._exit(os.waitstatus_to_exitcode(os.waitpid(pid2, 0)[1]))
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
stop.set()
for t in threads:
    t.join()
print(codes.count(0), "of", len(codes))
"""

PY_POSIX_SPAWN = """
import os, sys
r, w = os.pipe()
pid = os.posix_spawn("/bin/bash", ["bash", "-c", os.environ["SHELL_LINE"]], os.environ,
                     file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
os.close(w)
status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(os.read(r, 1000).decode().strip(), status)
"""

PY_PREEXEC = """
import os, subprocess
r = subprocess.run(["bash", "-c", os.environ["SHELL_LINE"]], preexec_fn=lambda: os.setpgid(0, 0),
                   capture_output=True, text=True)
print(r.stdout.strip(), r.returncode)
"""

PY_DAEMONIZED = """
import os, sys, time
out = os.environ["OUT"]
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() > 0:
        os._exit(0)  # the daemon is the grandchild, reparented
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # as daemons do: nothing of the caller's held
        os.dup2(null, fd)
    import subprocess
    line = subprocess.run(["bash", "-c", os.environ["SHELL_LINE"]], capture_output=True, text=True).stdout
    with open(out + ".tmp", "w") as f:
        f.write(line)
    os.rename(out + ".tmp", out)
    os._exit(0)
os.waitpid(pid, 0)
for _ in range(500):
    if os.path.exists(out):
        break
    time.sleep(0.02)
print(open(out).read().strip())
os.unlink(out)
"""

VFORK_C = r"""
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    pid_t p = vfork();
    if (p == 0) {
        execl("/bin/bash", "bash", "-c", argv[1], (char *)0);
        _exit(127);
    }
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) != p)
        return 99;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
"""

MAKEFILE = "".join(f"t{i}:\n\t@echo t{i} $$(md5sum $(D)/class_00{i % 4}/sample_00000{i % 4}.bin | cut -c1-12 | cat)\n"
                   for i in range(8)) + "all: " + " ".join(f"t{i}" for i in range(8)) + "\n"

SHAPES = {
    "slurm_master_addr": ["bash", "-c", SLURM_MASTER_ADDR],
    "nested_subshells": ["bash", "-c", NESTED],
    "xargs_parallel": ["bash", "-c", XARGS],
    "make_jobs": ["bash", "-c", 'make -s -j4 -f "$MK" D="$D" all | sort'],
    "python_fork_in_fork": [sys.executable, "-c", PY_FORK_IN_FORK],
    "pool_inside_process": [sys.executable, "-c", PY_POOL_IN_PROCESS],
    "fork_while_threads_map": [sys.executable, "-c", PY_FORK_WHILE_MAPPING],
    "posix_spawn_shell": [sys.executable, "-c", PY_POSIX_SPAWN],
    "subprocess_preexec_fn": [sys.executable, "-c", PY_PREEXEC],
    "vfork_exec_shell": ["{vfork}", SHELL_IN_CHILD],
    "daemonized_double_fork": [sys.executable, "-c", PY_DAEMONIZED],
    "setuid_program_as_other_user": ["runuser", "-u", "nobody", "--", "bash", "-c",
                                     'x=$(/usr/bin/su --version | head -1); echo "$x"; id -un'],
}


def run_both(short_tmp, ds, argv, extra_env):
    """The command directly and under ``monarch run``: (direct, monarch) CompletedProcess."""
    env = monarch_env(D=ds.root, F=os.path.join(ds.root, "class_000", "sample_000000.bin"),
                      SHELL_LINE=SHELL_IN_CHILD, **extra_env)
    direct = run_group(argv, env=env, timeout=BOUND_S)
    report = os.path.join(short_tmp, "report.json")
    cfg = write_config(short_tmp, ds.root)
    under = run_group([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--report", report,
                       "--", *argv], env=env, timeout=BOUND_S)
    return direct, under, load(report)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_process_shape_gives_the_same_result_under_monarch_run(shape, dataset, short_tmp):
    ds = dataset(files=40, size="8KiB")
    argv = list(SHAPES[shape])
    extra = {"OUT": os.path.join(short_tmp, "daemon.out")}
    if shape == "make_jobs":
        if not shutil.which("make"):
            pytest.skip("make is not installed")
        extra["MK"] = os.path.join(short_tmp, "Makefile")
        with open(extra["MK"], "w") as f:
            f.write(MAKEFILE)
    if shape == "vfork_exec_shell":
        exe = os.path.join(short_tmp, "vfork_shell")
        subprocess.run(["cc", "-x", "c", "-o", exe, "-"], input=VFORK_C, text=True, check=True)
        argv[0] = exe
    if shape == "setuid_program_as_other_user" and (os.getuid() != 0 or not shutil.which("runuser")):
        pytest.skip("acting as another user needs root and runuser")
    direct, under, rep = run_both(short_tmp, ds, argv, extra)
    assert direct.returncode == 0 and direct.stdout.strip(), direct.stderr
    assert under.returncode == direct.returncode, under.stderr
    assert under.stdout == direct.stdout, (under.stdout, direct.stdout)
    # the command and its children carried the shim (another user's processes cannot count)
    assert rep["processes_with_shim"] >= (1 if shape.endswith("other_user") else 2)


STRESS = r"""
import hashlib, json, mmap, os, random, sys, threading, time
large, large_src, root, src_root = sys.argv[1:5]
want = open(large_src, "rb").read()
size = len(want)
small = sorted(os.path.join(d, n)[len(root) + 1:] for d, _, ns in os.walk(root) for n in ns if n.endswith(".bin"))
digests = {rel: hashlib.md5(open(os.path.join(src_root, rel), "rb").read()).digest() for rel in small}
bad = []
stop = threading.Event()
counts = {"maps": 0, "small": 0}

def check_window(m, rng):
    o = rng.randrange(0, size - 4096)
    if m[o:o + 4096] != want[o:o + 4096]:
        bad.append(("window", o))

def mapper(seed):
    rng = random.Random(seed)
    while not stop.is_set():
        fd = os.open(large, os.O_RDONLY)
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
            for _ in range(8):
                check_window(m, rng)
        o = rng.randrange(0, size - 65536)
        if os.pread(fd, 65536, o) != want[o:o + 65536]:
            bad.append(("pread", o))
        os.close(fd)
        counts["maps"] += 1

def small_reader(seed):
    rng = random.Random(seed)
    while not stop.is_set():
        rel = rng.choice(small)
        if hashlib.md5(open(os.path.join(root, rel), "rb").read()).digest() != digests[rel]:
            bad.append(("small", rel))
        counts["small"] += 1

fd0 = os.open(large, os.O_RDONLY)
m0 = mmap.mmap(fd0, 0, prot=mmap.PROT_READ)  # made before its blocks: inherited by every child
threads = [threading.Thread(target=mapper, args=(i,)) for i in range(2)]
threads.append(threading.Thread(target=small_reader, args=(9,)))
for t in threads:
    t.start()
codes = []
for i in range(int(sys.argv[5])):
    pid = os.fork()
    if pid == 0:
        rng = random.Random(i)
        try:
            if i % 3 == 0:  # a daemon's shape: its own session, the caller's output let go, a second fork
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 1)
                os.dup2(null, 2)
                os.setsid()
            pid2 = os.fork()
        except BaseException as e:
            print("child:", repr(e), file=sys.stderr)
            os._exit(8)
        if pid2 == 0:
            code = 0
            try:
                for _ in range(4):
                    o = rng.randrange(0, size - 4096)
                    code |= 1 if m0[o:o + 4096] != want[o:o + 4096] else 0
                rel = rng.choice(small)
                with open(os.path.join(root, rel), "rb") as f:
                    data = f.read()
                    if hashlib.md5(data).digest() != digests[rel]:
                        print("grandchild: wrong bytes of", rel, len(data), "fd", f.fileno(),
                              os.readlink(f"/proc/self/fd/{f.fileno()}"), file=sys.stderr)
                        code |= 2
            except BaseException as e:
                print("grandchild:", repr(e), file=sys.stderr)
                code = 4
            os._exit(code)
        os._exit(os.waitstatus_to_exitcode(os.waitpid(pid2, 0)[1]))
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
stop.set()
for t in threads:
    t.join()
rng = random.Random(1)
for _ in range(64):
    check_window(m0, rng)
m0.close()
print(json.dumps({"bad": bad[:5], "codes_ok": codes.count(0), "forks": len(codes),
                  "codes_failed": sorted(set(codes) - {0}), **counts}))
"""


@pytest.mark.fuse
def test_forks_and_double_forks_beside_threads_that_map_and_read_staged_and_block_staged_files(short_tmp, slow_pfs):
    src = os.path.join(short_tmp, "src", "data")
    os.makedirs(os.path.join(src, "small"))
    with open(os.path.join(src, "tok.bin"), "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    for i in range(200):
        with open(os.path.join(src, "small", f"s{i:03d}.bin"), "wb") as f:
            f.write(os.urandom(4096 + 37 * i))
    # 20 MB/s: the 64 MiB copy by blocks takes about 3 s, while the forks run beside it
    pfs = slow_pfs(os.path.dirname(src), open_latency_ms=2, bandwidth_mbps=20, page_cache=True)
    root = os.path.join(str(pfs.mountpoint), "data")
    cfg = write_config(short_tmp, root)
    script = os.path.join(short_tmp, "stress.py")
    with open(script, "w") as f:
        f.write(STRESS)
    report = os.path.join(short_tmp, "report.json")
    forks = 300
    r = run_group([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--report", report, "--",
                   sys.executable, script, os.path.join(root, "tok.bin"), os.path.join(src, "tok.bin"), root, src,
                   str(forks)], timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    said = [line for line in r.stderr.splitlines() if "child:" in line][:5]
    assert out["bad"] == [] and out["codes_ok"] == out["forks"] == forks, (out, said)
    assert out["maps"] > 0 and out["small"] > 0, out
    rep = load(report)
    assert rep["blocks"]["files"] == 1 and rep["blocks"]["read"]["opens"] >= 1, rep["blocks"]
    # a child per fork and a grandchild per child carried the shim, and the readers were served
    assert rep["processes_with_shim"] >= 1 + 2 * forks
    assert rep["opened_from"]["ram"]["opens"] > 0


SIGNALS_C = textwrap.dedent(r"""
    #include <fcntl.h>
    #include <signal.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <sys/mman.h>
    #include <sys/stat.h>
    #include <sys/time.h>
    #include <time.h>
    #include <unistd.h>
    static volatile int target = -1;
    static volatile long handled;
    /* dup and close are async-signal-safe: a handler may use them on the file the thread reads */
    static void on_alarm(int sig)
    {
        (void)sig;
        int d = target >= 0 ? dup(target) : -1;
        if (d >= 0)
            close(d);
        handled++;
    }
    int main(int argc, char **argv)
    {
        int src = open(argv[2], O_RDONLY);
        struct stat st;
        fstat(src, &st);
        char *want = malloc(st.st_size), a[65536], b[65536];
        if (!want || pread(src, want, st.st_size, 0) != st.st_size)
            return 2;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sigaction(SIGALRM, &sa, NULL); /* no SA_RESTART: the shim's own calls see EINTR */
        struct itimerval it = {{0, 200}, {0, 200}};
        setitimer(ITIMER_REAL, &it, NULL);
        srand(7);
        time_t end = time(NULL) + atoi(argv[3]);
        long rounds = 0, bad = 0;
        while (time(NULL) < end) {
            int fd = open(argv[1], O_RDONLY);
            if (fd < 0)
                continue; /* EINTR: the application's own to retry */
            target = fd;
            for (int i = 0; i < 16; i++) {
                off_t o = (off_t)(rand() % (int)(st.st_size - sizeof a));
                ssize_t n = pread(fd, a, sizeof a, o);
                if (n > 0 && memcmp(a, want + o, (size_t)n) != 0)
                    bad++;
            }
            char *m = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) {
                off_t o = (off_t)(rand() % (int)(st.st_size - sizeof b));
                memcpy(b, m + o, sizeof b);
                bad += memcmp(b, want + o, sizeof b) != 0;
                munmap(m, st.st_size);
            }
            target = -1;
            close(fd);
            rounds++;
        }
        printf("%ld %ld %ld\n", rounds, bad, handled);
        return bad != 0;
    }
""")


@pytest.mark.fuse
def test_signals_whose_handlers_dup_and_close_arrive_during_the_shims_calls(short_tmp, slow_pfs):
    src = os.path.join(short_tmp, "src", "data")
    os.makedirs(src)
    with open(os.path.join(src, "tok.bin"), "wb") as f:
        for _ in range(32):
            f.write(os.urandom(1 << 20))
    pfs = slow_pfs(os.path.dirname(src), open_latency_ms=2, bandwidth_mbps=20, page_cache=True)
    root = os.path.join(str(pfs.mountpoint), "data")
    exe = os.path.join(short_tmp, "sigreader")
    subprocess.run(["cc", "-O1", "-x", "c", "-o", exe, "-"], input=SIGNALS_C, text=True, check=True)
    r = run_group([sys.executable, "-m", "monarch", "run", "-c", write_config(short_tmp, root), "--no-progress",
                   "--", exe, os.path.join(root, "tok.bin"), os.path.join(src, "tok.bin"), "4"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rounds, bad, handled = map(int, r.stdout.split())
    assert bad == 0 and rounds > 10 and handled > 100, r.stdout
