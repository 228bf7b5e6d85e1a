"""Jobs in containers (each its own PID namespace) share the host's /dev/shm and /tmp: no job
judges another live one dead by a pid, which in another namespace names any process here or
none. A run's copies, run directory and lease stay while it runs, and go once it is killed.

Each "container" is ``unshare --pid --fork --mount-proc`` (root needed): its first process is
pid 1 there, a pid that on the host is init's, with another start time."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from monarch import layout
from monarch.node.tiers.shared_set import list_sets
from support.harness import load, monarch, monarch_env, reader, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


@pytest.fixture(scope="module")
def container():
    """The command line that runs a command in a new PID namespace; skipped where not permitted."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    try:
        r = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"unshare --pid is not permitted here: {e}")
    if r.returncode != 0:
        pytest.skip(f"unshare --pid is not permitted here (root, or CAP_SYS_ADMIN, needed): {r.stderr.strip()}")
    return UNSHARE


def _start(container, cmd: list[str], err, **env) -> subprocess.Popen:
    """``cmd`` as pid 1 of a new PID namespace, in a session of its own; its lines through ``_line``."""
    proc = subprocess.Popen([*container, *cmd], env=monarch_env(**env), stdout=subprocess.PIPE, stderr=err,
                            text=True, start_new_session=True)
    proc.lines = queue.Queue()
    threading.Thread(target=lambda: [*map(proc.lines.put, proc.stdout), proc.lines.put(None)], daemon=True).start()
    return proc


def _line(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """The next line ``proc`` prints, within ``timeout`` seconds."""
    try:
        line = proc.lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"the contained process said nothing within {timeout:.0f} s") from None
    if line is None:
        raise AssertionError(f"the contained process ended ({proc.wait()})")
    return line.strip()


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the container (unshare and its pid 1, which takes the namespace with it): nothing cleaned."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # its pid 1, reparented, is gone once nothing of its session is
        if subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True).returncode != 0:
            return
        time.sleep(0.05)
    raise AssertionError("the contained process outlived SIGKILL")


STORAGE = """
import os, sys, time
from monarch import layout
from monarch.node.instance import Instance
base = sys.argv[1]
tier = layout.StorageDir.create(base, "ctr", 0)
os.makedirs(os.path.join(tier.path, "0"))
with open(os.path.join(tier.path, "0", "copy"), "wb") as f:
    f.write(b"staged")
run_dir = layout.run_dir(base, "ctr", 0)
instance = Instance(run_dir)
layout.write_marker(run_dir, "ctr", layout.KIND_RUN)
print(os.getpid(), tier.path, run_dir, flush=True)
time.sleep(600)
"""


def test_a_live_runs_tier_and_run_directory_stay_until_it_is_killed(container, tmp_path):
    base = str(tmp_path)
    first = _start(container, [sys.executable, "-c", STORAGE, base], None)
    try:
        pid, tier, run_dir = _line(first).split()
        assert pid == "1"  # its pid there: the host's init, started long before
        assert json.loads(open(os.path.join(tier, layout.MARKER)).read())["pid"] == 1
        second = layout.StorageDir.create(base, "host", 0)  # remove_leftovers of the user's directory
        assert os.path.isdir(tier) and open(os.path.join(tier, "0", "copy"), "rb").read() == b"staged"
        assert layout.prune_finished_runs(os.path.dirname(run_dir), keep=0) == []
        assert os.path.isdir(run_dir)
    finally:
        _kill(first)
    third = layout.StorageDir.create(base, "host2", 0)
    assert not os.path.exists(tier)  # a killed run's copies go with the next run's start
    assert layout.prune_finished_runs(os.path.dirname(run_dir), keep=0) == [run_dir]
    for s in (second, third):
        s.remove()


LEASE = """
import os, sys, time
from monarch.node.tiers.shared_set import SharedSet
s = SharedSet.join(sys.argv[1], (sys.argv[2],), "train", 1 << 20, 0.0, 1.0)
print(os.getpid(), s.lease, s.others_at_join, flush=True)
time.sleep(600)
"""


def test_two_containers_jobs_of_one_run_id_and_pid_share_a_set_side_by_side(container, tmp_path):
    base, root = tmp_path / "base", tmp_path / "root"
    base.mkdir()
    root.mkdir()
    jobs, said = [], []
    try:
        for _ in range(2):
            jobs.append(_start(container, [sys.executable, "-c", LEASE, str(base), str(root)], None))
            said.append(_line(jobs[-1]).split())  # (the second one could wait forever for the first's lease)
        (pid1, lease1, others1), (pid2, lease2, others2) = said
        assert pid1 == pid2 == "1" and lease1 == "train-1" and lease2.startswith("train-1-")
        assert (others1, others2) == ("0", "1")
        (info,) = list_sets(layout.user_dir(str(base)), count=False)
        assert info.jobs == 2
    finally:
        for job in jobs:
            _kill(job)
    (info,) = list_sets(layout.user_dir(str(base)), count=False)
    assert info.jobs == 0


def test_a_contained_jobs_copies_serve_it_while_a_host_job_starts_beside_it(container, dataset, short_tmp):
    """`monarch run` end to end: the contained job's private tiers (staging.share: false) on the
    bases a job on the host starts on; its second epoch still reads its own copies."""
    ds = dataset(files=40, size="8KiB")
    cfg = write_config(short_tmp, ds.root)
    go, report = os.path.join(short_tmp, "go"), os.path.join(short_tmp, "contained.json")
    epoch = " ".join(reader(ds, epochs=1, workers=1))
    script = f"{epoch} && echo epoch-done && while [ ! -e {go} ]; do sleep 0.1; done && {epoch}"
    with open(os.path.join(short_tmp, "contained.err"), "w+") as err:
        first = _start(container, [sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", report, "--",
                                   "sh", "-c", script], err, MONARCH_JOB_ID="contained")
        try:
            while _line(first, 120) != "epoch-done":
                pass
            time.sleep(1)  # its last copies of the first epoch land
            r = monarch("run", "-c", cfg, "--", "true", env=monarch_env(MONARCH_JOB_ID="host"))
            assert r.returncode == 0, r.stderr
            open(go, "w").close()
            first.wait(120)
        finally:
            if first.poll() is None:
                _kill(first)
        err.seek(0)
        assert first.returncode == 0, err.read()  # the reader checked every file's digest
    opened = load(report)["opened_from"]
    tiers = sum(v["opens"] for k, v in opened.items() if k in ("ram", "ssd"))
    assert opened["pfs"]["opens"] == 0 and tiers == 2 * len(ds.files), opened  # both epochs from its copies
