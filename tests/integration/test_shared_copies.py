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
import sys
import time

import pytest

from support.harness import NO_RESERVE, finish_group, load, make_bases, monarch, monarch_env, reader, start_group

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(600)]


def shared_config(base: str, root: str, linger: float = 0, share: bool = True, name: str = "shared.yaml",
                  ram: str = "1GiB", policy: str = "read-ahead") -> str:
    """Both tiers in bases of the test's own; read-ahead; sharing as asked."""
    path = os.path.join(base, name)
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{base}/run"
tiers:
  - {{name: ram, path: "/dev/shm{base}/ram", capacity: {ram}}}
  - {{name: ssd, path: "{base}/ssd", capacity: 1GiB}}
staging: {{policy: {policy}, share: {str(share).lower()}, linger: {linger}}}
{NO_RESERVE}""")
    make_bases(path)
    return path


# a job's command waits at a barrier of files until ``$3`` jobs are there: jobs that overlap by construction
BARRIER = 'touch "$1/$2"; until [ "$(ls "$1" | wc -l)" -ge "$3" ]; do sleep 0.01; done; shift 3; exec "$@"'


def job(cfg: str, ds, job_id: str, report: str, epochs: int = 2, barrier: tuple[str, int] | None = None, **env):
    """One job: ``monarch run`` with a run identity of its own, reading ``ds`` (every digest
    checked by the reader) in a forked pool; ``barrier`` (a directory, how many jobs): the reader
    starts once that many jobs' commands are running, each under its own `monarch run`."""
    command = reader(ds, epochs=epochs, workers=2)
    if barrier is not None:
        command = ["bash", "-c", BARRIER, "bash", barrier[0], job_id, str(barrier[1]), *command]
    return start_group([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", report, "--", *command],
                       env=monarch_env(MONARCH_JOB_ID=job_id, MONARCH_PROGRESS="0", **env))


def leftovers(base: str) -> list[str]:
    """Whatever of the user's remains in the tier bases (copies, sets), the run base aside."""
    uid = os.getuid()
    return sorted(glob.glob(f"/dev/shm{base}/ram/monarch-{uid}/*") + glob.glob(f"{base}/ssd/monarch-{uid}/*"))


def gone(pid: int) -> None:
    """Wait until ``pid`` is dead (a zombie is: its locks are released)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not die")


def through_pfs(slow_pfs, ds, **latency):
    return ds.__class__(str(slow_pfs(ds.root, **latency).mountpoint), ds.manifest, ds.files, ds.total)


def test_two_concurrent_jobs_read_the_pfs_once(dataset, short_tmp, slow_pfs):
    ds = dataset(files=200, size="16KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=2)
    ds = ds.__class__(pfs.mountpoint, ds.manifest, ds.files, ds.total)
    cfg = shared_config(short_tmp, ds.root)
    reports = [os.path.join(short_tmp, f"r{i}.json") for i in range(2)]
    barrier = os.path.join(short_tmp, "barrier")
    os.mkdir(barrier)  # both jobs running before either reads: on a loaded machine the second once started late
    jobs = [job(cfg, ds, f"sweep-{i}", reports[i], barrier=(barrier, 2)) for i in range(2)]
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


def test_a_job_joining_a_lone_jobs_set_stops_its_front_door_and_no_file_is_read_twice(dataset, short_tmp, slow_pfs):
    """The first job, alone, lets its C front door copy the small files (no claims, the fast
    path); the second joins while it copies: the first job's door stops, its copies under
    way are published, and from then on both stagers take claims: the PFS is read once."""
    raw = dataset(files=300, size="32KiB")
    # 5 MB/s: the first job copies for about 2 s, longer than the second takes to start and join
    pfs = slow_pfs(raw.root, open_latency_ms=10, bandwidth_mbps=5)
    ds = raw.__class__(pfs.mountpoint, raw.manifest, raw.files, raw.total)
    cfg = shared_config(short_tmp, ds.root)
    reports = [os.path.join(short_tmp, f"r{i}.json") for i in range(2)]
    first = job(cfg, ds, "alone", reports[0])
    ram = f"/dev/shm{short_tmp}/ram/monarch-{os.getuid()}"
    deadline = time.monotonic() + 60
    while len(glob.glob(os.path.join(ram, "share-*", "0", "*", "*.bin"))) < 10:
        assert time.monotonic() < deadline, "the first job staged nothing within 60 s"
        time.sleep(0.02)
    second = job(cfg, ds, "joins", reports[1])
    for j in (first, second):
        r = finish_group(j)
        assert r.returncode == 0, r.stderr  # every digest checked
    read = pfs.counters()["bytes"]
    assert ds.total <= read <= 1.05 * ds.total, (read, ds.total)
    alone, joined = (load(r) for r in reports)
    assert alone["front_door"]["copies"] > 0  # the lone job's door copied
    shared = [t["shared"] for t in joined["nodes"][0]["tiers"] if "shared" in t]
    assert max(s["jobs_at_join"] for s in shared) >= 1, shared  # it joined while the first job ran
    assert sum(s["from_others_files"] for s in shared) > 0
    assert leftovers(short_tmp) == []


def test_a_job_killed_while_staging_leaves_nothing_the_other_trusts(dataset, short_tmp, slow_pfs):
    """The first job is SIGKILLed (daemon, launcher and readers) while its read-ahead copies
    from a slow PFS; the second, started meanwhile, reads every file with the right bytes,
    stages what the dead one had not, and leaves nothing behind."""
    ds = through_pfs(slow_pfs, dataset(files=300, size="64KiB"), open_latency_ms=20, bandwidth_mbps=20)
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
    with open(os.path.join(short_tmp, "run", f"monarch-{os.getuid()}", "killed-node0", ".monarch-run")) as f:
        daemon = int(json.load(f)["pid"])
    os.kill(daemon, signal.SIGKILL)  # every process of the job, as Slurm ends one (its cgroup)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    gone(daemon)
    report = os.path.join(short_tmp, "alive.json")
    r = finish_group(job(cfg, ds, "alive", report))
    assert r.returncode == 0, r.stderr  # every digest checked
    rep = load(report)
    found = sum(t.get("shared", {}).get("from_others_files", 0) for t in rep["nodes"][0]["tiers"])
    assert found >= 5 and found + rep["staging"]["files"] == len(ds.files), (found, rep["staging"])
    assert rep["staging"]["files"] > 0  # the first job was killed with copies still to make
    assert leftovers(short_tmp) == []  # the dead job's lease went with it, and its half-written copies

PLAIN_READER = r"""
import hashlib, json, os, sys
root, out = sys.argv[1:3]
got = {}
for d, _, names in os.walk(root):
    for n in names:
        p = os.path.join(d, n)
        with open(p, "rb") as f:
            got[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
json.dump(got, open(out, "w"))
"""


def test_a_file_changed_between_two_jobs_is_read_from_the_pfs_by_the_second(dataset, short_tmp, slow_pfs):
    raw = dataset(files=40, size="8KiB")
    pfs = slow_pfs(raw.root, open_latency_ms=0)
    cfg = shared_config(short_tmp, pfs.mountpoint, linger=600)
    out = os.path.join(short_tmp, "digests.json")
    cmd = [sys.executable, "-c", PLAIN_READER, str(pfs.mountpoint), out]
    r = monarch("run", "-c", cfg, "--", *cmd, env=monarch_env(MONARCH_JOB_ID="first", MONARCH_PROGRESS="0"))
    assert r.returncode == 0, r.stderr
    changed = sorted(raw.files)[7]
    src = os.path.join(raw.root, changed)
    with open(src, "r+b") as f:  # same size, other bytes, a later mtime
        f.write(b"NEW" * 100)
    os.utime(src, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    pfs.reset_counters()
    report = os.path.join(short_tmp, "second.json")
    # on access: the stale copy is still in the set when the reader opens the file, and the
    # shim's check of a shared copy against this job's snapshot is what keeps it from being served
    cfg = shared_config(short_tmp, pfs.mountpoint, linger=600, policy="on-access", name="on-access.yaml")
    r = monarch("run", "-c", cfg, "--report", report, "--", *cmd,
                env=monarch_env(MONARCH_JOB_ID="second", MONARCH_PROGRESS="0"))
    assert r.returncode == 0, r.stderr
    import hashlib
    with open(src, "rb") as f:
        assert json.load(open(out))[changed] == hashlib.sha256(f.read()).hexdigest()
    files = pfs.counters()["files"]
    assert set(files) == {changed}, files  # the changed file alone came from the PFS
    r = monarch("cache", "drop", "-c", cfg)
    assert r.returncode == 0, r.stderr
    assert leftovers(short_tmp) == []


LARGE = "large/tokens.bin"  # 16 MiB or more: staged by blocks, published whole once every block is


def write_large(ds, seed: int, size: int | None = None) -> None:
    """``ds``'s large file written (anew: same size, other bytes, an mtime a second later), and
    its manifest with it: each job's reader checks every byte against the manifest."""
    import random
    from monarch.tools.workload import digest
    path = os.path.join(ds.root, LARGE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    before = os.stat(path).st_mtime_ns if os.path.exists(path) else None
    data = random.Random(seed).randbytes(size or os.path.getsize(path))
    with open(path, "r+b" if before else "wb") as f:
        f.write(data)
    if before:
        os.utime(path, ns=(before + 10**9, before + 10**9))
    with open(ds.manifest) as f:
        doc = json.load(f)
    doc["files"][LARGE] = {"size": len(data), "xxh64": digest(data)}
    with open(ds.manifest, "w") as f:
        json.dump(doc, f)


def test_a_large_file_changed_between_jobs_is_staged_anew_once_and_the_next_job_starts_warm(dataset, short_tmp,
                                                                                              slow_pfs):
    """A chain of three jobs over a large file (staged by blocks) rewritten after the first:
    the second job replaces the set's stale copy (its report says so) and publishes the new one
    whole; the third reads next to nothing from the PFS. Every job's reader checks every byte."""
    raw = dataset(files=60, size="8KiB")
    write_large(raw, seed=1, size=24 << 20)
    total = raw.total + (24 << 20)
    pfs = slow_pfs(raw.root, open_latency_ms=0)
    ds = raw.__class__(str(pfs.mountpoint), raw.manifest, raw.files, total)
    cfg = shared_config(short_tmp, ds.root, linger=600)
    read, reports = [], []
    for i in range(3):
        if i == 1:
            write_large(raw, seed=2)
        pfs.reset_counters()
        reports.append(os.path.join(short_tmp, f"chain-{i + 1}.json"))
        r = finish_group(job(cfg, ds, f"chain-{i + 1}", reports[-1]))
        assert r.returncode == 0, r.stdout + r.stderr  # a wrong byte fails the reader
        read.append(pfs.counters()["bytes"])
    assert read[2] <= 0.05 * total, [x / total for x in read]
    second, third = load(reports[1]), load(reports[2])
    restaged = [t["shared"].get("restaged_files") for t in second["nodes"][0]["tiers"] if t.get("shared")]
    assert sum(restaged) == 1, second["nodes"][0]["tiers"]
    assert third["pfs"]["reads_of_dataset"] <= 0.05, third["pfs"]
    printed = monarch("report", reports[1]).stdout
    assert "re-staged: changed since the set's copy: 1 file (24.0 MiB)" in printed, printed
    r = monarch("cache", "drop", "-c", cfg)
    assert r.returncode == 0, r.stderr
    assert leftovers(short_tmp) == []


def test_cache_ls_and_drop_expired_free_a_lingering_set(dataset, short_tmp):
    ds = dataset(files=30, size="4KiB")
    cfg = shared_config(short_tmp, ds.root, linger=1)
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=1),
                env=monarch_env(MONARCH_JOB_ID="chain-1", MONARCH_PROGRESS="0"))
    assert r.returncode == 0, r.stderr
    assert "monarch cache drop" in r.stdout + r.stderr  # the last job says what it left and how to free it
    assert leftovers(short_tmp)  # lingering
    listed = monarch("cache", "ls", "-c", cfg)
    assert listed.returncode == 0 and "share-" in listed.stdout and "30 files" in listed.stdout, listed.stdout
    early = monarch("cache", "drop", "--expired", "-c", cfg)
    assert early.returncode == 0, early.stderr
    assert leftovers(short_tmp)  # its linger is not over yet
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and leftovers(short_tmp):
        time.sleep(0.5)
        r = monarch("cache", "drop", "--expired", "-c", cfg)
        assert r.returncode == 0, r.stderr
    assert leftovers(short_tmp) == []


NOBODY_PLANTS = r"""
import json, os, sys
ours, theirs, keys = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for path in (ours, os.path.dirname(ours)):
    try:
        os.listdir(path)
        print("LISTED", path)
    except PermissionError:
        pass
os.makedirs(theirs, mode=0o700)
for key in keys:  # the other user's own set of the same dataset, poisoned
    p = os.path.join(theirs, key)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(b"POISON")
print("PLANTED", len(keys))
"""


def test_another_users_copies_of_the_same_dataset_are_never_served(dataset, short_tmp, as_other_user):
    """``nobody`` makes a set of the same dataset under the same tier base (poisoned copies
    at every key) while this user's first job holds its set, and cannot list this user's. The
    second job of this user reads its first job's copies (right bytes, checked) and nothing
    of nobody's, whose files stay. (A job of nobody's own cannot run here: the test's
    interpreter is out of its reach; what keeps users apart is the per-user directory, and
    that is what is planted against.)"""
    ds = dataset(files=40, size="8KiB")
    base = os.path.join(short_tmp, "shared-bases")
    ram = f"/dev/shm{base}/ram"
    for d in (ram, f"{base}/ssd"):
        os.makedirs(d)
        os.chmod(d, 0o1777)  # like /dev/shm and /tmp
    for d in (base, short_tmp):
        os.chmod(d, 0o755)
    path = os.path.dirname(f"/dev/shm{base}")
    while path != "/dev/shm":
        os.chmod(path, 0o755)
        path = os.path.dirname(path)
    cfg = shared_config(base, ds.root, linger=600)
    r = monarch("run", "-c", cfg, "--", *reader(ds, epochs=1), env=monarch_env(MONARCH_JOB_ID="first",
                                                                              MONARCH_PROGRESS="0"))
    assert r.returncode == 0, r.stderr
    (ours,) = glob.glob(f"{ram}/monarch-{os.getuid()}/share-*")
    theirs = os.path.join(ram, "monarch-65534", os.path.basename(ours))
    planted = as_other_user(["-c", NOBODY_PLANTS, ours, theirs, json.dumps([f"0/{k}" for k in ds.files])])
    assert planted.returncode == 0, planted.stderr
    assert "LISTED" not in planted.stdout and f"PLANTED {len(ds.files)}" in planted.stdout, planted.stdout
    report = os.path.join(short_tmp, "second.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=2),
                env=monarch_env(MONARCH_JOB_ID="second", MONARCH_PROGRESS="0"))
    assert r.returncode == 0, r.stderr  # every digest checked: no POISON read
    rep = load(report)
    found = sum(t.get("shared", {}).get("from_others_files", 0) for t in rep["nodes"][0]["tiers"])
    assert found == len(ds.files) and rep["opened_from"]["pfs"]["opens"] == 0, (found, rep["opened_from"])
    assert len(glob.glob(f"{theirs}/0/*/*.bin")) == len(ds.files)  # nobody's files are nobody's to remove
    assert monarch("cache", "drop", "-c", cfg).returncode == 0
    assert not os.path.exists(ours)
