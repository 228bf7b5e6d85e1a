"""The cold path's overlap, end to end: ``monarch run`` starts the command while the daemon
still walks the dataset (a slow walk: the emulated PFS with a lookup latency). The command's
metadata answers and bytes equal the direct run's. By default a call made before the index
exists waits for it a moment only (MONARCH_SHIM_INDEX_WAIT_MS, 300 ms), then goes to the PFS
and is counted (a million-file walk must not hold the command's first stat); with
the wait raised, its metadata comes from the snapshot once it is ready (the PFS sees one walk,
not two). A daemon whose walk fails or that is killed during the walk leaves the command
reading the PFS, correctly."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from support.harness import load, monarch, monarch_env, run_dirs, write_config

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(300)]

DIRS, PER_DIR, SIZE = 4, 40, 3000
WAIT_FOR_THE_INDEX = {"MONARCH_SHIM_INDEX_WAIT_MS": "600000"}  # the opt-in: one walk, not two
LOOKUP_MS = 20  # the daemon's walk (8 threads at once) takes a second or two

# The command (a loader's start, as torchvision's ImageFolder): its start time, the listing
# of the root and of each class directory, then (8 threads at once, as a loader's workers)
# the stat of every file and of a name that does not exist, and (mode "read") every file's
# checksum; everything it saw, as JSON. (No access(): as root, the shim leaves it to the
# PFS by rule.)
APP = r"""
import hashlib, json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
started = time.time()
out, root, mode = sys.argv[1:4]
first_call = time.time()
classes = sorted(os.listdir(root))
pool = ThreadPoolExecutor(8)
listings = {".": classes} | dict(zip(classes, pool.map(lambda c: sorted(os.listdir(os.path.join(root, c))), classes)))
files = [(f"{c}/{name}", os.path.join(root, c, name)) for c in classes for name in listings[c]]
after_walk = time.time()
def look(item):
    rel, p = item
    s = os.stat(p)
    row = [s.st_size, s.st_mode, s.st_mtime_ns, s.st_nlink, s.st_uid, s.st_gid, os.path.isfile(p),
           os.path.exists(p + ".nope")]
    if mode != "read":
        return rel, row, None
    with open(p, "rb") as f:
        return rel, row, hashlib.sha256(f.read()).hexdigest()
stats, sums = {}, {}
for rel, row, digest in pool.map(look, files):
    stats[rel] = row
    if digest:
        sums[rel] = digest
json.dump({"started": started, "first_call": first_call, "after_walk": after_walk, "listings": listings,
           "stats": stats, "sums": sums}, open(out, "w"))
"""


def make_source(tmp_path):
    src = tmp_path / "src"
    for d in range(DIRS):
        for i in range(PER_DIR):
            p = src / f"class{d}" / f"img{i:03d}.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(SIZE + 17 * i))
    return src


@pytest.fixture
def slow_dataset(slow_pfs, tmp_path):
    """The dataset through the emulated PFS twice: with a lookup latency (Monarch's runs: a
    slow walk), and without (the direct runs that say what the command must see, and how
    many metadata operations it makes: the same count at any latency)."""
    src = make_source(tmp_path)
    return slow_pfs(src, open_latency_ms=1, lookup_latency_ms=LOOKUP_MS), slow_pfs(src, open_latency_ms=0)


def metadata_ops(pfs) -> int:
    c = pfs.counters()
    return c["lookups"] + c["readdirs"] + c["accesses"]


def app_cmd(out, root, mode):
    return [sys.executable, "-c", APP, str(out), str(root), mode]


def direct(pfs, short_tmp, mode):
    """What the command sees without Monarch (the tree relative to the mount point), and the
    metadata operations it makes."""
    out = os.path.join(short_tmp, f"direct-{mode}.json")
    pfs.reset_counters()
    subprocess.run(app_cmd(out, pfs.mountpoint, mode), check=True, timeout=120, env=monarch_env())
    return load(out), metadata_ops(pfs)


def forget_kept_snapshots(short_tmp):
    """Every run walks (the cold path): no snapshot kept by an earlier run is reused."""
    for kept in glob.glob(os.path.join(short_tmp, "run0", "monarch-*", "snapshots")):
        shutil.rmtree(kept)


def monarch_run(pfs, short_tmp, cmd, name, policy="on-access", **env):
    config = write_config(short_tmp, pfs.mountpoint, policy=policy)
    forget_kept_snapshots(short_tmp)
    report = os.path.join(short_tmp, f"{name}.report.json")
    pfs.reset_counters()
    proc = monarch("run", "-c", config, "--no-progress", "--report", report, "--", *cmd,
                   env=monarch_env(MONARCH_JOB_ID=name, **env), timeout=240)
    return proc, report, metadata_ops(pfs)


def same_answers(got, want):
    assert got["listings"] == want["listings"]
    assert got["stats"] == want["stats"]
    assert got["sums"] == want["sums"]
    assert len(got["stats"]) == DIRS * PER_DIR


def test_the_command_starts_during_the_walk_and_its_early_calls_go_to_the_pfs_counted(slow_dataset, short_tmp):
    pfs, fast = slow_dataset
    want, _ = direct(fast, short_tmp, "read")
    out = os.path.join(short_tmp, "monarch-early.json")
    proc, report_path, _ = monarch_run(pfs, short_tmp, app_cmd(out, pfs.mountpoint, "read"), "ovearly")
    assert proc.returncode == 0, proc.stderr
    report = load(report_path)
    got, node = load(out), report["nodes"][0]
    same_answers(got, want)
    assert got["first_call"] < node["snapshot_ready_at"]
    early = report["pfs_before_index"]
    assert early["metadata"] > 0  # not held for the walk: answered by the PFS, and counted
    # every stat and open of the command counted once: from the index, or from the PFS before it
    assert node["metadata"]["local"] + early["metadata"] >= DIRS * PER_DIR
    assert node["opened_from"]["ram"]["opens"] + node["opened_from"]["pfs"]["opens"] == DIRS * PER_DIR
    assert node["opened_from"]["pfs"]["opens"] == early["opens"]
    assert "before the index was ready" in proc.stderr


def test_the_command_that_waits_for_the_index_sees_what_it_would_see_directly(slow_dataset, short_tmp):
    pfs, fast = slow_dataset
    want, _ = direct(fast, short_tmp, "read")
    out = os.path.join(short_tmp, "monarch-read.json")
    proc, report_path, _ = monarch_run(pfs, short_tmp, app_cmd(out, pfs.mountpoint, "read"), "ovread",
                                       **WAIT_FOR_THE_INDEX)
    assert proc.returncode == 0, proc.stderr
    got, node = load(out), load(report_path)["nodes"][0]
    same_answers(got, want)
    # it started before the walk ended, and its first call under the root waited for the snapshot
    assert got["started"] < node["snapshot_ready_at"], (got["started"], node["snapshot_ready_at"])
    assert got["first_call"] < node["snapshot_ready_at"] <= got["after_walk"]
    assert node["snapshot"].startswith("walked") and node["snapshot_seconds"] > 0.3
    assert node["requests_held_for_snapshot"].get("INDEX", 0) >= 1
    assert node["metadata"]["local"] >= DIRS * PER_DIR  # from the index, though it started before it existed
    assert node["opened_from"]["ram"]["opens"] == DIRS * PER_DIR  # every byte through the tier copies


def test_the_pfs_sees_one_walk_not_two_when_the_command_waits_for_the_index(slow_dataset, short_tmp):
    pfs, fast = slow_dataset
    want, app_alone = direct(fast, short_tmp, "meta")
    _, _, walk_alone = monarch_run(pfs, short_tmp, [sys.executable, "-c", "pass"], "ovwalk")
    out = os.path.join(short_tmp, "monarch-meta.json")
    proc, report_path, together = monarch_run(pfs, short_tmp, app_cmd(out, pfs.mountpoint, "meta"), "ovmeta",
                                              **WAIT_FOR_THE_INDEX)
    assert proc.returncode == 0, proc.stderr
    got, node = load(out), load(report_path)["nodes"][0]
    same_answers(got, want)
    assert got["first_call"] < node["snapshot_ready_at"]  # the app's walk raced the daemon's
    assert app_alone > DIRS * PER_DIR and walk_alone > DIRS * PER_DIR
    # the app's own metadata went to the index, not to the PFS: one walk, not two
    assert together - walk_alone < 0.1 * app_alone, (walk_alone, app_alone, together)


def test_a_walk_that_fails_leaves_the_command_on_the_pfs(slow_dataset, short_tmp):
    pfs, fast = slow_dataset
    want, _ = direct(fast, short_tmp, "read")
    out = os.path.join(short_tmp, "monarch-fail.json")
    # the command, started during the walk, makes the index impossible to write (a directory
    # where the daemon instance will rename it: its name is known only from the environment)
    block = [sys.executable, "-c", "import os, sys\nos.makedirs(os.path.join(os.environ['MONARCH_INDEX'], 'b'))\n"
             f"sys.argv = ['app', *sys.argv[1:]]\nexec(compile({APP!r}, 'app', 'exec'))", out, pfs.mountpoint, "read"]
    proc, report_path, _ = monarch_run(pfs, short_tmp, block, "ovfail")
    assert proc.returncode == 0, proc.stderr
    got, node = load(out), load(report_path)["nodes"][0]
    same_answers(got, want)
    assert node["snapshot"].startswith("failed"), node["snapshot"]
    assert node["opened_from"]["pfs"]["opens"] == DIRS * PER_DIR and node["staging"]["files"] == 0
    assert node["metadata"]["local"] == 0


def test_a_daemon_killed_during_the_walk_leaves_the_command_on_the_pfs(slow_pfs, short_tmp, tmp_path):
    src = make_source(tmp_path)
    pfs = slow_pfs(src, open_latency_ms=1, lookup_latency_ms=25)  # a walk of a second or two
    want, _ = direct(slow_pfs(src, open_latency_ms=0), short_tmp, "read")
    gate = os.path.join(short_tmp, "go")
    out = os.path.join(short_tmp, "monarch-killed.json")
    # the command waits for the test's go (the daemon is killed meanwhile), then reads
    cmd = [sys.executable, "-c", f"import os, time, runpy, sys\nopen({gate!r} + '.started', 'w').close()\n"
           f"while not os.path.exists({gate!r}): time.sleep(0.02)\n"
           f"sys.argv = ['app', *sys.argv[1:]]\nexec(compile({APP!r}, 'app', 'exec'))",
           out, pfs.mountpoint, "read"]
    config = write_config(short_tmp, pfs.mountpoint, policy="read-ahead")
    launcher = subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", config, "--no-progress", "--", *cmd],
                                env=monarch_env(MONARCH_JOB_ID="ovkill"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(gate + ".started"):
            assert time.monotonic() < deadline and launcher.poll() is None
            time.sleep(0.02)
        (run_dir,) = run_dirs(short_tmp)
        assert not glob.glob(os.path.join(run_dir, "index-*")), "the walk ended too soon to test this"
        pid = int(open(os.path.join(run_dir, "daemon.pid")).read())
        os.kill(pid, signal.SIGKILL)
        open(gate, "w").close()
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, err
    got = load(out)
    same_answers(got, want)
    assert "lost" in err  # the report says what happened
