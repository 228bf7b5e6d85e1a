"""What the cluster benchmarks (scripts/cluster/) share: mpiexec, the readers' environment and
command line, the daemons stopped, and waiting for the readers with a deadline."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchkit import checkout_env



def mpiexec(who: str) -> str:
    """MPICH's mpiexec beside this interpreter (the mpich wheel's), else the PATH's."""
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if not found:
        sys.exit(f"{who}: mpiexec not found (pip install mpich mpi4py)")
    return found


def stop_daemons(serve: subprocess.Popen) -> None:
    """Stop the job's daemons as a batch script ends: one SIGTERM to ``mpiexec``, which passes
    it to every daemon (hydra and Open MPI's mpiexec both do), then its end (killed with its
    group after 90 s). Each daemon finishes as under ``monarch stop``, node 0 writes the
    report; no interpreter per node is started to say so (docs/cluster.md, step 4)."""
    if serve.poll() is None:
        serve.send_signal(signal.SIGTERM)
    try:
        serve.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(serve.pid, signal.SIGKILL)
        serve.wait()


def bench_places(prefix: str) -> tuple[Path, Path, Path]:
    """A benchmark's (work, shm, src): its work directory under /tmp (short: Unix socket paths are
    bounded), its RAM directory under /dev/shm, and there what the emulated PFS keeps (in RAM: the
    emulator's caps, not a disk's write-back, set the pace), with a small dataset root (``data``:
    `monarch run` wants one)."""
    import tempfile
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm"))
    src = shm / "pfs-src"
    (src / "data").mkdir(parents=True)
    (src / "data" / "sample.bin").write_bytes(os.urandom(4096))
    return work, shm, src


def daemon_run_dir(work: Path, job: str, k: int) -> Path:
    """Node ``k``'s run directory of job ``job`` under the run base ``work/run<k>`` (its socket, its report)."""
    from monarch.layout import run_name
    return work / f"run{k}" / f"monarch-{os.getuid()}" / run_name(job, k)


def start_daemons(cfg: str, work: Path, nodes: int, job: str, deadline: float, log: Path):
    """``mpiexec -n N monarch serve -c CFG`` for job ``job`` (each node's run base ``work/run<k>``, its
    output to ``log``): (the mpiexec process, its launch, seconds until every node's socket answers);
    RuntimeError past ``deadline``, the daemons stopped."""
    from monarch.cluster.world import daemon_launch
    from monarch.layout import SOCKET
    launch = daemon_launch(nodes, one_host=True)
    t0 = time.monotonic()
    with open(log, "w") as out:
        serve = subprocess.Popen([*launch.argv, sys.executable, "-m", "monarch", "serve", "-c", cfg],
                                 env=bench_env(job, **launch.env), start_new_session=True, stdout=out,
                                 stderr=subprocess.STDOUT)
    socks = [daemon_run_dir(work, job, k) / SOCKET for k in range(nodes)]
    while not all(s.exists() for s in socks):
        if serve.poll() is not None or time.monotonic() > deadline:
            stop_daemons(serve)
            launch.close()
            raise RuntimeError(f"the daemons did not come up; see {log}")
        time.sleep(0.05)
    return serve, launch, time.monotonic() - t0


def bench_env(job: str, **extra) -> dict:
    """This checkout's monarch and test support, Monarch on, the job named ``job``."""
    e = checkout_env(tests=True)
    e.pop("MONARCH_DISABLE", None)
    e["MONARCH_JOB_ID"] = job
    e.update({k: str(v) for k, v in extra.items()})
    return e


def shard_reader(root: str, manifest: str, k: int, args, *more: str) -> list[str]:
    """Node ``k``'s reader of the sharded pattern (``args``: nodes, epochs, workers)."""
    return [sys.executable, "-m", "support.shard_reader", root, manifest, "--node", str(k),
            "--nodes", str(args.nodes), "--epochs", str(args.epochs), "--workers", str(args.workers), *more]


def wait_for(procs: list[subprocess.Popen], deadline: float) -> list[tuple[int, str, str]]:
    """Each process's exit code, stdout and stderr; one still running at ``deadline`` (a
    monotonic time) is killed with its process group."""
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            o, e = p.communicate()
            e = (e or "") + "\n[killed: the case's timeout]"
        out.append((p.returncode, o or "", e or ""))
    return out
