"""What the tests/slurm tests share: the batch script of docs/cluster.md (as is), a job's
directory (job.yaml, train.py, the dataset behind the emulated PFS), running it by sbatch or
salloc, and what a finished job must have left: its readers' digests, its report, nothing in
its bases."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from support.harness import REPO, load, sharded_config
from support.slurm import KnownSlurmBug, known_bug

JOB_TIMEOUT = 240.0   # a job of a few hundred small files: ~10-30 s here, bounded generously
MARKER = "<!-- slurm batch script:"


def batch_script() -> str:
    """The batch script of docs/cluster.md, the fenced block after its marker, as is."""
    with open(os.path.join(REPO, "docs", "cluster.md")) as f:
        text = f.read()
    start = text.index("```sh\n", text.index(MARKER)) + len("```sh\n")
    return text[start:text.index("\n```", start)] + "\n"


TRAIN = """import os, sys
from support.shard_reader import main
# one shard per task of the step: SLURM_PROCID of SLURM_NTASKS, digests checked (exit 1 on a mismatch)
sys.exit(main([{root!r}, {manifest!r}, "--node", os.environ["SLURM_PROCID"], "--nodes",
               os.environ["SLURM_NTASKS"], "--epochs", "2", "--workers", "2"]))
"""


@dataclass
class Job:
    dir: str
    base: str
    nodes: int
    files: int
    total: int
    pfs: object

    def out(self) -> str:
        try:
            with open(os.path.join(self.dir, "job.out"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def readers(self) -> list[dict]:
        return [json.loads(line.split(" ", 1)[1]) for line in self.out().splitlines()
                if line.startswith("shard_reader ")]

    def report(self, job_id: str) -> dict:
        return load(self.report_path(job_id))

    def report_path(self, job_id: str) -> str:
        return os.path.join(self.base, "run0", f"monarch-{os.getuid()}", f"{job_id}-node0", "report.json")


def make_job(short_tmp: str, dataset, slow_pfs, nodes: int, files: int = 120) -> Job:
    """A job's directory: the dataset behind the emulated PFS (it counts the bytes read), a
    job.yaml whose nodes hold ~2/3 of it each (the peers in use), a train.py that reads its shard."""
    ds = dataset(files=files, size="16KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=1)
    cfg = sharded_config(short_tmp, str(pfs.mountpoint), ds.allocated * 2 // 3, nodes, name="job.yaml")
    with open(os.path.join(short_tmp, "train.py"), "w") as f:
        f.write(TRAIN.format(root=str(pfs.mountpoint), manifest=ds.manifest))
    with open(os.path.join(short_tmp, "job.sh"), "w") as f:
        f.write(batch_script())
    assert os.path.dirname(cfg) == short_tmp
    return Job(short_tmp, short_tmp, nodes, files, ds.total, pfs)


def job_env(slurm, **extra) -> dict:
    """The submitting shell's environment: this checkout's monarch and the test support first
    (the job's steps inherit it: srun --export=ALL)."""
    env = dict(slurm.env)
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "tests"), env.get("PYTHONPATH", "")])
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("MONARCH_DISABLE", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def sbatch(slurm, job: Job, ntasks_per_node: int, env: dict) -> str:
    res = slurm.run(["sbatch", "--parsable", f"--nodes={job.nodes}", f"--ntasks-per-node={ntasks_per_node}",
                     "-t", "5", "-o", os.path.join(job.dir, "job.out"), "-D", job.dir, "job.sh"],
                    env=env, cwd=job.dir)
    return res.stdout.strip().split(";")[0]


def submit(slurm, job: Job, ntasks_per_node: int, env: dict, timeout: float = JOB_TIMEOUT) -> tuple[str, str]:
    """sbatch the job and wait for its end: (job id, final state). A job that met a known bug
    of Slurm (``KNOWN_BUGS``: its daemons never got past MPI_Init, so nothing was read or
    staged) is submitted once more; a second time, the test is skipped with the reason."""
    for attempt in (1, 2):
        job_id = sbatch(slurm, job, ntasks_per_node, env)
        try:
            return job_id, slurm.wait_job(job_id, timeout, output=job.out)
        except KnownSlurmBug as e:
            if attempt == 2:
                pytest.skip(str(e))
    raise AssertionError("unreachable")


def salloc(slurm, job: Job, ntasks_per_node: int, env: dict) -> tuple[str, subprocess.CompletedProcess]:
    """``salloc -N.. --ntasks-per-node=.. bash job.sh`` (the script runs here, in the allocation);
    the job id and what it printed (into job.out, as sbatch would). Bounded; run once more if
    it met a known bug of Slurm (as ``submit``), then skipped."""
    try:
        return _salloc(slurm, job, ntasks_per_node, env)
    except KnownSlurmBug:
        pass
    try:
        return _salloc(slurm, job, ntasks_per_node, env)
    except KnownSlurmBug as e:
        pytest.skip(str(e))


def _salloc(slurm, job: Job, ntasks_per_node: int, env: dict) -> tuple[str, subprocess.CompletedProcess]:
    with open(os.path.join(job.dir, "job.out"), "w") as out:
        proc = subprocess.Popen(["salloc", f"--nodes={job.nodes}", f"--ntasks-per-node={ntasks_per_node}", "-t",
                                 "5", "bash", "job.sh"], env=env, cwd=job.dir, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + JOB_TIMEOUT
    try:
        while proc.poll() is None:
            why = known_bug(job.out())
            if why is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGTERM)  # salloc relinquishes the allocation: its steps end
                proc.wait(timeout=60)
                if why is not None:
                    raise KnownSlurmBug(why)
                raise AssertionError(f"salloc ran more than {JOB_TIMEOUT:.0f} s:\n{job.out()}")
            time.sleep(0.3)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    text = job.out()
    granted = [line for line in text.splitlines() if "Granted job allocation" in line]
    assert granted, text
    return granted[0].split()[-1], subprocess.CompletedProcess(proc.args, proc.returncode, text, "")


def wait_job(slurm, job: Job, job_id: str, timeout: float = JOB_TIMEOUT) -> str:
    """The job's final state; a known bug of Slurm in its output skips the test."""
    try:
        return slurm.wait_job(job_id, timeout, output=job.out)
    except KnownSlurmBug as e:
        pytest.skip(str(e))


def wait_for(job: Job, text: str, timeout: float = 120.0) -> None:
    """Until the job's output holds ``text`` (bounded; a known bug of Slurm skips the test)."""
    deadline = time.monotonic() + timeout
    while text not in job.out():
        why = known_bug(job.out())
        if why is not None:
            pytest.skip(why)
        assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f} s:\n{job.out()}"
        time.sleep(0.3)


def check_finished(job: Job, job_id: str, ntasks: int) -> dict:
    """Every reader's digests right, the PFS read once, the cluster report by node 0 with every
    node, nothing left in the bases (no copies, no socket). The report."""
    out = job.out()
    readers = job.readers()
    assert len(readers) == ntasks, out
    assert all(r["ok"] for r in readers), out
    assert sum(e["files"] for r in readers for e in r["epochs"]) == 2 * job.files, out
    counted = job.pfs.counters()
    assert job.total <= counted["bytes"] <= 1.05 * job.total, (counted, out)  # each byte once, for the cluster
    rep = job.report(job_id)
    assert (rep["nodes_reporting"], rep["nodes_lost"]) == (job.nodes, []), out
    assert rep["pfs"]["reads_of_dataset"] <= 1.05, rep["pfs"]
    check_nothing_left(job)
    return rep


def left_in_bases(job: Job) -> list[str]:
    """Tier or peer-area directories of copies, daemon sockets: what a stopped job must not
    leave (only the run directories, their logs and the report, stay)."""
    uid = os.getuid()
    left = []
    for node in range(job.nodes):
        for tier in (f"/dev/shm{job.base}/ram{node}", f"{job.base}/ssd{node}", f"{job.base}/peer{node}"):
            left += [p for p in glob.glob(os.path.join(tier, f"monarch-{uid}", "*")) if os.path.isdir(p)]
        left += glob.glob(os.path.join(job.base, f"run{node}", f"monarch-{uid}", "*", "daemon.sock"))
        # the MPI library's shared-memory files each daemon noted it mapped (monarch/launch/mpi_shm.py)
        for note in glob.glob(os.path.join(job.base, f"run{node}", f"monarch-{uid}", "*", "mpi-shm")):
            with open(note) as f:
                noted = f.read().split()
            left += [path for path in noted if os.path.exists(path)]
    return left


def check_nothing_left(job: Job, timeout: float = 60.0) -> None:
    """Nothing left in the bases, once the daemons have exited (the report is written before
    they remove their tiers: a bounded wait for that, not a timing)."""
    deadline = time.monotonic() + timeout
    while left_in_bases(job) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert left_in_bases(job) == [], job.out()
