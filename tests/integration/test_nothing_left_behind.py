"""Nothing left behind (DESIGN.md 6, 11): a run, a fast-exiting run and a run whose dataset
holds a FIFO leave nothing in the tier bases but what ``keep: true`` and the finished
runs' reports keep; and a run's report outlives the next run in a shared base."""

import os
import re
import sys

import pytest

from monarch.testing.harness import load, monarch

pytestmark = pytest.mark.integration

UID = os.getuid()


def shared_base_config(short_tmp, root, policy="read-ahead", threads="auto"):
    """The shipped defaults' shape in the test's own directories: run_dir and the SSD tier
    share one base (``${TMPDIR:-/tmp}``), the RAM tier has its own (``/dev/shm``)."""
    base, ram = os.path.join(short_tmp, "tmp"), f"/dev/shm{short_tmp}/shm"
    path = os.path.join(short_tmp, "monarch.yaml")
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_dir: "{base}"
tiers:
  - {{name: ram, path: "{ram}", capacity: 1GiB}}
  - {{name: ssd, path: "{base}", capacity: 1GiB}}
peer: {{path: "{base}", capacity: 1GiB}}
staging: {{policy: {policy}, threads: {threads}}}
""")
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
    for run in runs:
        assert sorted(os.listdir(os.path.join(base, f"monarch-{UID}", run))) == \
            [".monarch-run", "counters", "daemon.log", "report.json", "start.lock"]
