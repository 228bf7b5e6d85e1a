"""Nothing left behind (DESIGN.md 6, 11): a run, a fast-exiting run and a run whose dataset
holds a FIFO leave nothing in the tier bases but what ``keep: true`` and the finished
runs' reports keep; and a run's report outlives the next run in a shared base."""

import json
import os
import re
import sys

import pytest

from support.harness import NO_RESERVE, load, make_bases, monarch, monarch_env

pytestmark = pytest.mark.integration

UID = os.getuid()


def shared_base_config(short_tmp, root, policy="read-ahead", threads="auto"):
    """The shipped defaults' shape in the test's own directories: run_base and the SSD tier
    share one base (``${TMPDIR:-/tmp}``), the RAM tier has its own (``/dev/shm``)."""
    base, ram = os.path.join(short_tmp, "tmp"), f"/dev/shm{short_tmp}/shm"
    path = os.path.join(short_tmp, "monarch.yaml")
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{base}"
tiers:
  - {{name: ram, path: "{ram}", capacity: 1GiB}}
  - {{name: ssd, path: "{base}", capacity: 1GiB}}
peer: {{path: "{base}", capacity: 1GiB}}
staging: {{policy: {policy}, threads: {threads}, share: false}}
{NO_RESERVE}""")
    make_bases(path)  # as its user would: Monarch makes only its own monarch-<uid> inside a base
    return path, base, ram


def left_in(base):
    """What runs left in ``<base>/monarch-<uid>/``, but the run directories (their reports)
    and the kept snapshots of the dataset."""
    user = os.path.join(base, f"monarch-{UID}")
    if not os.path.isdir(user):
        return []
    return sorted(n for n in os.listdir(user) if n != "snapshots" and not re.fullmatch(r".+-node\d+", n))


def test_a_runs_report_outlives_the_next_run_in_a_shared_base(dataset, short_tmp):
    ds = dataset(files=20, size="4KiB")
    cfg, base, _ = shared_base_config(short_tmp, ds.root)
    reports = []
    for _ in range(2):
        r = monarch("run", "-c", cfg, "--", "true", timeout=120)
        assert r.returncode == 0, r.stderr
        reports.append(re.search(r"^report\s*: (.+)$", r.stderr, re.M).group(1))
    first, second = reports
    assert first != second and os.path.dirname(first).startswith(os.path.join(base, f"monarch-{UID}"))
    assert load(first)["dataset"]["files"] == 20  # not removed by the second run's tier clean-up
    r = monarch("report", first)
    assert r.returncode == 0 and "Monarch access report" in r.stdout, r.stderr
    assert left_in(base) == []


def everything_in(top):
    return sorted(os.path.join(d, n) for d, dirs, files in os.walk(top) for n in dirs + files)


FAST_EXITS = 6  # most runs left copies behind before the fix: six of them leave some, as a rule


@pytest.mark.parametrize("app", ["exit-at-once", "exit-at-once-slow-pfs", "read-some-then-exit"])
def test_fast_exiting_runs_leave_no_copies(dataset, short_tmp, slow_pfs, app):
    root = None
    if app.startswith("exit-at-once"):  # a script crashing at import: the read-ahead of large files is under way
        ds = dataset(files=40, size="2MiB")
        code = "raise SystemExit(3)"
        if app.endswith("slow-pfs"):  # the walk and the copies under way when the daemon closes
            root = slow_pfs(ds.root, open_latency_ms=2, read_latency_ms=5, lookup_latency_ms=2).mountpoint
    else:  # misses answered by the front door's and the stager's copies, then the exit
        ds = dataset(files=300, size="64KiB")
        code = ("import glob, sys\n"
                f"for p in sorted(glob.glob({ds.root!r} + '/*/*.bin'))[::7]: open(p, 'rb').read()\n"
                "raise SystemExit(3)")
    cfg, base, ram = shared_base_config(short_tmp, root or ds.root)
    for i in range(FAST_EXITS):
        r = monarch("run", "-c", cfg, "--", sys.executable, "-c", code, timeout=120)
        assert r.returncode == 3, r.stderr
        # the launcher has waited for the daemon's exit: what is there now stays for ever
        assert left_in(ram) == left_in(base) == [], f"run {i} left copies behind"
    assert everything_in(ram) == [os.path.join(ram, f"monarch-{UID}")]
    runs = [n for n in os.listdir(os.path.join(base, f"monarch-{UID}")) if n != "snapshots"]
    assert len(runs) == FAST_EXITS  # their reports stay (the 20 newest)
    for run in runs:  # what a finished run keeps: its log, report and counters (the instance's: counters-<id>)
        kept = sorted(os.listdir(os.path.join(base, f"monarch-{UID}", run)))
        assert [re.sub(r"^counters-\w+$", "counters-<id>", n) for n in kept] == \
            [".monarch-run", "counters-<id>", "daemon.lock", "daemon.log", "report.json", "start.lock"]


# After the snapshot, a file of the dataset becomes a FIFO: another process, not under the
# shim (another user who may write the directory), swaps it. The application opens it through
# the shim as a FIFO allows without a writer (O_NONBLOCK: the PFS behaviour), which asks the
# daemon for it first, then reads the other files and checks their bytes.
SWAP_FOR_FIFO = """
import json, os, subprocess, sys, time
from monarch.tools.workload import digest
root, manifest, victim = sys.argv[1:4]
deadline = time.monotonic() + 60
while not os.path.exists(os.environ["MONARCH_INDEX"]):  # the snapshot is taken (the file in it)
    assert time.monotonic() < deadline, "no snapshot"
    time.sleep(0.01)
path = os.path.join(root, victim)
swap = f"import os; os.unlink({path!r}); os.mkfifo({path!r}, 0o600)"
subprocess.run([sys.executable, "-c", swap], env=dict(os.environ, LD_PRELOAD="", MONARCH_DISABLE="1"), check=True)
print("daemon", open(os.path.join(os.path.dirname(os.environ["MONARCH_SOCKET"]), "daemon.pid")).read().strip())
sys.stdout.flush()
fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
os.close(fd)
files = json.load(open(manifest))["files"]
for rel, entry in files.items():
    if rel != victim:
        with open(os.path.join(root, rel), "rb") as f:
            assert digest(f.read()) == entry["xxh64"], rel
print("read", len(files) - 1)
"""


def exited(pid, timeout=60.0):
    """Wait (bounded) for the daemon ``pid`` to exit; kill it if it does not (this test's
    run started it), and say whether it exited by itself."""
    import signal
    import time

    def alive():
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False
    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not alive():
        return True
    os.kill(pid, signal.SIGKILL)
    return False


@pytest.mark.parametrize("door", ["front-door", "python-stager"])
def test_a_fifo_swapped_into_the_dataset_neither_blocks_the_daemon_nor_its_exit(dataset, short_tmp, door):
    ds = dataset(files=30, size="8KiB")
    victim = sorted(ds.files)[3]
    cfg, base, ram = shared_base_config(short_tmp, ds.root, policy="on-access")
    env = monarch_env(MONARCH_FRONT_DOOR="1" if door == "front-door" else "0")
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", sys.executable, "-c", SWAP_FOR_FIFO,
                ds.root, ds.manifest, victim, env=env, timeout=180)
    daemon = re.search(r"^daemon (\d+)$", r.stdout, re.M)
    assert daemon is not None, r.stderr
    assert exited(int(daemon.group(1))), "the daemon did not exit (blocked opening the FIFO)"
    assert r.returncode == 0, r.stderr
    assert "read 29" in r.stdout
    rep = load(report)
    # the FIFO was refused as a source (counted: the walk listed a file, and it was none when described
    # at its open), never copied; the others were staged
    assert rep["nodes"][0]["resolves"].get("pfs:changed_since_snapshot") == 1 and not rep["staging"]["failures"], \
        json.dumps(rep, indent=1)
    assert rep["staging"]["files"] == 29
    assert (rep["front_door"] is not None) == (door == "front-door")
    assert left_in(ram) == left_in(base) == []


SLOW_CLOSE = """
import os, time
from monarch.launch import service
service.TEARDOWN_SECONDS_PER_FILE = float(os.environ["TEST_TEARDOWN_PER_FILE"])
_serve = service.serve
def serve(*a, **kw):
    try:
        return _serve(*a, **kw)
    finally:  # after daemon.close(): a tear-down slower than the launcher's old fixed 10.5 s
        time.sleep(float(os.environ["TEST_SLOW_CLOSE"]))
        with open(os.environ["TEST_CLOSED_FLAG"], "w") as f:
            f.write("closed")
service.serve = serve
"""


def test_monarch_run_waits_for_a_slow_teardown_that_grows_with_the_staged_files(dataset, short_tmp):
    """`monarch run` does not exit before its daemon has removed its copies: its wait grows with
    the files staged. Here the daemon's close takes 12 s, and the launcher's per-file allowance
    is scaled up so that the 200 staged files stand for a large dataset."""
    ds = dataset(files=200, size="1KiB")
    cfg, base, ram = shared_base_config(short_tmp, ds.root)
    hooks = os.path.join(short_tmp, "hooks")
    os.makedirs(hooks)
    with open(os.path.join(hooks, "sitecustomize.py"), "w") as f:
        f.write(SLOW_CLOSE)
    flag = os.path.join(short_tmp, "closed")
    env = monarch_env(TEST_TEARDOWN_PER_FILE=0.05, TEST_SLOW_CLOSE=12, TEST_CLOSED_FLAG=flag)
    env["PYTHONPATH"] = os.pathsep.join([hooks, env["PYTHONPATH"]])
    r = monarch("run", "-c", cfg, "--", sys.executable, "-m", "monarch.tools.workload", "read", ds.root,
                "--epochs", "1", "--workers", "1", "--manifest", ds.manifest, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(flag), "monarch run exited before its daemon had finished its tear-down"
    assert "still tearing down" not in r.stderr
    assert left_in(ram) == left_in(base) == []
    assert everything_in(ram) == [os.path.join(ram, f"monarch-{UID}")]
