"""The next `monarch run` on a node publishes what a killed daemon left pending there (docs/
consistency.md, "Write-back", W8), as `monarch drain` would, before it starts its own daemon; it
says so in one line, and a drain that fails never fails the job (the area is kept for `monarch drain`)."""

import hashlib
import os
import shutil
import sys

import pytest

from support.harness import monarch
from support.writeback import writable_pfs_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KILL_DAEMON = """
import hashlib, os, random, signal, sys
data = random.Random(8).randbytes(4 << 20)
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
with open(sys.argv[1], "wb") as f:
    f.write(data)
print(hashlib.md5(data).hexdigest(), flush=True)
run_dir = os.path.dirname(os.environ["MONARCH_SOCKET"])
with open(os.path.join(run_dir, "daemon.pid")) as f:
    os.kill(int(f.read().split()[0]), signal.SIGKILL)  # closed, then the daemon lost mid-drain
"""


def areas(base):
    """The write-back areas left under the RAM tier's base (the first tier: write_config's)."""
    found = []
    for dp, dns, _ in os.walk(f"/dev/shm{base}"):
        found += [os.path.join(dp, d) for d in dns if d.startswith("writeback-")]
    return found


def killed_mid_drain(short_tmp, dataset, slow_pfs, name="model"):
    """A job whose daemon was SIGKILLed while a closed 4 MiB file (``ck/<name>``) drained to a
    2 MB/s PFS: (the configuration, the PFS's directory, the file's md5, its area)."""
    src, ck, cfg = writable_pfs_job(short_tmp, dataset(files=20).root, slow_pfs, mbps=2)
    r = monarch("run", "-c", cfg, "--no-progress", "--", sys.executable, "-c", KILL_DAEMON, os.path.join(ck, name))
    assert r.returncode == 3, r.stderr
    assert not os.path.exists(os.path.join(src, "ck", name))  # never short under its name
    (area,) = areas(short_tmp)
    return cfg, src, r.stdout.strip(), area


def test_the_next_run_publishes_what_a_killed_daemon_left_and_removes_its_area(dataset, short_tmp, slow_pfs):
    cfg, src, md5, area = killed_mid_drain(short_tmp, dataset, slow_pfs)
    r = monarch("run", "-c", cfg, "--no-progress", "--", sys.executable, "-c", "print('ran')")
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    with open(os.path.join(src, "ck", "model"), "rb") as f:
        assert hashlib.md5(f.read()).hexdigest() == md5  # byte for byte
    assert sorted(os.listdir(os.path.join(src, "ck"))) == ["model"]  # no temporary name left
    assert areas(short_tmp) == []
    said = [x for x in r.stderr.splitlines() if "a previous run left pending" in x]
    assert said == [f"monarch: published 1 file a previous run left pending (4.0 MiB in {said[0].split(' in ')[1]}"], \
        r.stderr
    assert said[0].endswith(f" s, from {area})")
    again = monarch("run", "-c", cfg, "--no-progress", "--", sys.executable, "-c", "print('ran')")
    assert again.returncode == 0 and "previous run" not in again.stderr  # nothing left: nothing said


def test_a_drain_the_pfs_refuses_is_said_and_the_job_runs_all_the_same_the_area_kept(dataset, short_tmp, slow_pfs):
    cfg, src, md5, area = killed_mid_drain(short_tmp, dataset, slow_pfs, name="step1/model")
    step = os.path.join(src, "ck", "step1")
    shutil.rmtree(step, ignore_errors=True)
    open(step, "w").close()  # a file where its directory was: the PFS refuses the publish (ENOTDIR)
    r = monarch("run", "-c", cfg, "--no-progress", "--", sys.executable, "-c", "print('ran')")
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr  # fail open: the job ran
    said = [x for x in r.stderr.splitlines() if "a previous run left pending" in x]
    assert len(said) == 1 and said[0].startswith("monarch: write-back a previous run left pending is not all "
                                                 "published (stopped at close "), r.stderr
    assert said[0].endswith(f"); kept in {area}: `monarch drain` publishes it; the job goes on")
    assert areas(short_tmp) == [area]
    os.unlink(step)
    os.mkdir(step)  # the PFS takes it now
    d = monarch("drain", "-c", cfg)
    assert d.returncode == 0, d.stdout + d.stderr
    with open(os.path.join(step, "model"), "rb") as f:
        assert hashlib.md5(f.read()).hexdigest() == md5
    assert areas(short_tmp) == []


KILL_THEN_COMMIT = KILL_DAEMON + """
import errno, time
time.sleep(0.5)  # the daemon is gone (its socket no longer answers)
try:
    with open(os.path.join(os.path.dirname(sys.argv[1]), "latest"), "w") as f:  # the commit file, after the shard
        f.write("model\\n")
    print("latest written", flush=True)
except OSError as e:
    print("latest refused", errno.errorcode[e.errno], flush=True)
"""


def test_a_commit_file_written_after_the_daemon_was_lost_never_reaches_the_pfs_before_its_shard(
        dataset, short_tmp, slow_pfs):
    """The job closes a 4 MiB shard (pending: the PFS takes 2 MB/s), its daemon is SIGKILLed, then
    the job writes its commit file: that create fails (EIO), said once with the fix, and the report
    lists it; nothing reaches the PFS before the shard, which `monarch drain` publishes. Before, the
    shim fell open and wrote the commit file straight to the PFS: a `latest` naming a shard that was
    not there."""
    src, ck, cfg = writable_pfs_job(short_tmp, dataset(files=20).root, slow_pfs, mbps=2)
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, "-c", KILL_THEN_COMMIT,
                os.path.join(ck, "model"))
    assert "latest refused EIO" in r.stdout, r.stdout + r.stderr
    assert "the node daemon was lost with writes of the job it took not all on the PFS" in r.stderr, r.stderr
    assert r.returncode == 3, r.stderr
    names = os.listdir(os.path.join(src, "ck"))  # (the shard's copy cut short, under its temporary name)
    assert "latest" not in names and "model" not in names, names
    import json
    with open(report) as f:
        assert "writeback-daemon-lost" in [x["reason"] for x in json.load(f)["fallbacks"]]
    drained = monarch("drain", "-c", cfg)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    with open(os.path.join(src, "ck", "model"), "rb") as f:
        assert hashlib.md5(f.read()).hexdigest() == r.stdout.split()[0]
    assert sorted(os.listdir(os.path.join(src, "ck"))) == ["model"]
