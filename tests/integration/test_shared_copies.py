"""One user's concurrent jobs on one node share one set of copies of their dataset.

Two jobs (each its own ``monarch run``, its own run identity) read one dataset behind the
emulated PFS at once: the PFS's own count says each file was read about once for both,
and each reader checked every byte against the dataset's manifest. A job SIGKILLed while
staging leaves nothing the other trusts; another user's job shares nothing; a file changed
between two jobs is read from the PFS by the second; nothing is left once the last job
ends with no linger, or once ``monarch cache drop --expired`` finds the linger over.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support.harness import finish_group, load, make_bases, monarch, monarch_env, reader, start_group

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(600)]


def shared_config(base: str, root: str, linger: float = 0, share: bool = True, name: str = "shared.yaml",
                  ram: str = "1GiB") -> str:
    """Both tiers in bases of the test's own; read-ahead; sharing as asked."""
    path = os.path.join(base, name)
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{base}/run"
tiers:
  - {{name: ram, path: "/dev/shm{base}/ram", capacity: {ram}}}
  - {{name: ssd, path: "{base}/ssd", capacity: 1GiB}}
staging: {{policy: read-ahead, share: {str(share).lower()}, linger: {linger}}}
""")
    make_bases(path)
    return path


def job(cfg: str, ds, job_id: str, report: str, epochs: int = 2, **env):
    """One job: ``monarch run`` with a run identity of its own, reading ``ds`` (every digest
    checked by the reader) in a forked pool."""
    return start_group([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", report, "--",
                        *reader(ds, epochs=epochs, workers=2)],
                       env=monarch_env(MONARCH_JOB_ID=job_id, MONARCH_PROGRESS="0", **env))


def leftovers(base: str) -> list[str]:
    """Whatever of the user's remains in the tier bases (copies, sets), the run base aside."""
    uid = os.getuid()
    return sorted(glob.glob(f"/dev/shm{base}/ram/monarch-{uid}/*") + glob.glob(f"{base}/ssd/monarch-{uid}/*"))


def through_pfs(slow_pfs, ds, **latency):
    return ds.__class__(str(slow_pfs(ds.root, **latency).mountpoint), ds.manifest, ds.files, ds.total)


def test_two_concurrent_jobs_read_the_pfs_once(dataset, short_tmp, slow_pfs):
    ds = dataset(files=200, size="16KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=2)
    ds = ds.__class__(pfs.mountpoint, ds.manifest, ds.files, ds.total)
    cfg = shared_config(short_tmp, ds.root)
    reports = [os.path.join(short_tmp, f"r{i}.json") for i in range(2)]
    jobs = [job(cfg, ds, f"sweep-{i}", reports[i]) for i in range(2)]
    for j in jobs:
        r = finish_group(j)
        assert r.returncode == 0, r.stderr
    read = pfs.counters()["bytes"]
    assert ds.total <= read <= 1.05 * ds.total, (read, ds.total)
    reps = [load(r) for r in reports]
    from_others = [sum(t.get("shared", {}).get("from_others_files", 0) for t in rep["nodes"][0]["tiers"])
                   for rep in reps]
    staged = [rep["staging"]["files"] for rep in reps]
    assert sum(staged) <= len(ds.files) and sum(from_others) > 0, (staged, from_others)
    assert leftovers(short_tmp) == []  # no linger: the last job out removed the set


def test_a_job_killed_while_staging_leaves_nothing_the_other_trusts(dataset, short_tmp, slow_pfs):
    """The first job is SIGKILLed (daemon, launcher and readers) while its read-ahead copies
    from a slow PFS; the second, started meanwhile, reads every file with the right bytes,
    stages what the dead one had not, and leaves nothing behind."""
    ds = through_pfs(slow_pfs, dataset(files=120, size="64KiB"), open_latency_ms=20)
    cfg = shared_config(short_tmp, ds.root)
    first = job(cfg, ds, "killed", os.path.join(short_tmp, "dead.json"), epochs=1)
    ram = f"/dev/shm{short_tmp}/ram/monarch-{os.getuid()}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # staging under way: some copies published
        if len(glob.glob(os.path.join(ram, "share-*", "0", "*", "*.bin"))) >= 5:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the first job staged nothing within 60 s")
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    report = os.path.join(short_tmp, "alive.json")
    r = finish_group(job(cfg, ds, "alive", report))
    assert r.returncode == 0, r.stderr  # every digest checked
    rep = load(report)
    found = sum(t.get("shared", {}).get("from_others_files", 0) for t in rep["nodes"][0]["tiers"])
    assert found >= 5 and found + rep["staging"]["files"] == len(ds.files), (found, rep["staging"])
    assert leftovers(short_tmp) == []  # the dead job's lease went with it, and its half-written copies
