"""A run killed with SIGKILL -- its daemon alone (the OOM killer's way) or the daemon and its
launcher -- leaves its state in the run directory. The next run of the same run identity
(a batch script's second command: the same SLURM_JOB_ID, no step) on another dataset with
the same relative names and other sizes must read its own bytes through every reader, a
forked pool included: nothing of the dead daemon instance (index, counters, socket) is
trusted. Before, its shim mapped the dead run's index (about one try in two): fstat gave the
old sizes, pread loops stopped short, mmap readers died of SIGBUS and a pool hung."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support.harness import monarch_env, run_dirs, write_config

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(600)]

REPEATS = 3  # the race a kill can hit is timing-dependent: each try is another chance to hit it
JOB = "77"

# Every file's sha256 by each mode, in this process and in a forked pool (a worker that dies
# of SIGBUS loses its task: the pool's result never comes, hence the timeout), as JSON.
READER = r"""
import hashlib, json, mmap, multiprocessing, os, sys

def digest(item):
    path, mode = item
    if mode == "open":
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if mode == "mmap":
            with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m:
                return hashlib.sha256(m[:]).hexdigest()
        data = b""
        while len(data) < size:
            chunk = os.pread(fd, size - len(data), len(data))
            if not chunk:
                break
            data += chunk
        return hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)

root, out = sys.argv[1:3]
paths = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n.endswith(".bin"))
rel = lambda p: os.path.relpath(p, root)
got = {}
with multiprocessing.get_context("fork").Pool(4) as pool:
    for mode in ("open", "pread", "mmap"):
        items = [(p, mode) for p in paths]
        got["pool-" + mode] = dict(zip(map(rel, paths), pool.map_async(digest, items).get(timeout=30)))
for mode in ("open", "pread", "mmap"):
    got[mode] = {rel(p): digest((p, mode)) for p in paths}
json.dump(got, open(out, "w"))
"""


def _env(tmp: str, dataset: str) -> dict[str, str]:
    """A batch script's environment: Slurm's job id and no step, nothing of Monarch's."""
    env = monarch_env()
    for var in [v for v in env if v.startswith(("MONARCH_", "SLURM_", "PMI_", "PMIX_", "OMPI_", "TORCHELASTIC_"))]:
        del env[var]
    env.update(SLURM_JOB_ID=JOB, TMPDIR=tmp, MONARCH_DATASET=dataset, PYTHONFAULTHANDLER="1",
               MONARCH_PROGRESS="0")
    return env


def _sha256s(root: str) -> dict[str, str]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(".bin"):
                with open(os.path.join(d, n), "rb") as f:
                    out[os.path.relpath(os.path.join(d, n), root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _gone(pid: int, timeout: float = 30) -> None:
    """Wait until ``pid`` is dead (a zombie is: its descriptors and locks are released)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not die")


def _killed_run(cfg: str, a, short_tmp: str, kill: str) -> subprocess.Popen:
    """Run A: read every file (the index and copies exist), then SIGKILL its daemon (and its
    launcher); the command itself sleeps on. Returns the launcher (its session holds the command)."""
    ready = os.path.join(short_tmp, "a-read")
    if os.path.exists(ready):
        os.unlink(ready)
    script = (f"import os, sys\n"
              f"for d, _, names in os.walk({a.root!r}):\n"
              f"    for n in names: open(os.path.join(d, n), 'rb').read()\n"
              f"open({ready!r}, 'w').close()\n"
              f"import time; time.sleep(120)\n")
    launcher = subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--", sys.executable, "-c", script],
                                env=_env(short_tmp, a.root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(ready):
        assert launcher.poll() is None, "run A ended early"
        assert time.monotonic() < deadline, "run A did not read its dataset"
        time.sleep(0.05)
    (run_dir,) = run_dirs(short_tmp)
    assert os.path.basename(run_dir) == f"{JOB}-node0"  # the run's identity is the Slurm job's
    with open(os.path.join(run_dir, ".monarch-run")) as f:
        daemon = int(json.load(f)["pid"])
    os.kill(daemon, signal.SIGKILL)
    if kill == "daemon+launcher":
        os.kill(launcher.pid, signal.SIGKILL)
        _gone(launcher.pid)
    _gone(daemon)
    return launcher


@pytest.mark.parametrize("kill", ["daemon", "daemon+launcher"])
def test_the_next_run_of_the_same_job_reads_its_own_bytes(dataset, short_tmp, slow_pfs, kill):
    a = dataset(files=120, size="16KiB", name="A", seed=0)
    b = dataset(files=120, size="16KiB", name="B", seed=1)
    want = _sha256s(b.root)
    # B on a PFS whose lookups are slow (a real one's, on a busy day): its walk outlasts the
    # reader's start, which is when the shim maps an index it finds
    b = b.__class__(str(slow_pfs(b.root, lookup_latency_ms=15).mountpoint), b.manifest, b.files, b.total)
    assert sorted(a.files) == sorted(b.files)
    assert sum(a.files[k]["size"] != b.files[k]["size"] for k in a.files) > 100  # other sizes
    cfg = write_config(short_tmp, "${MONARCH_DATASET}")
    out = os.path.join(short_tmp, "b.json")
    for attempt in range(REPEATS):
        first = _killed_run(cfg, a, short_tmp, kill)
        try:
            r = subprocess.run([sys.executable, "-m", "monarch", "run", "-c", cfg, "--",
                                sys.executable, "-c", READER, b.root, out],
                               env=_env(short_tmp, b.root), capture_output=True, text=True, timeout=180)
            assert r.returncode == 0, f"attempt {attempt}: run B exited {r.returncode}\n{r.stderr[-3000:]}"
            with open(out) as f:
                got = json.load(f)
            for mode, sums in got.items():
                wrong = sorted(p for p in want if sums.get(p) != want[p])
                assert not wrong, f"attempt {attempt}, {mode}: {len(wrong)} of {len(want)} files read wrong bytes"
            assert sorted(got) == ["mmap", "open", "pool-mmap", "pool-open", "pool-pread", "pread"]
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
            else:
                try:
                    os.killpg(first.pid, signal.SIGKILL)  # the command, left by its killed launcher
                except ProcessLookupError:
                    pass
            first.wait(timeout=30)
