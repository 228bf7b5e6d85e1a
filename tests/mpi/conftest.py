"""Helpers for the MPI tests: run a small program under mpiexec, always with a timeout."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent


@pytest.fixture(autouse=True)
def _remove_mpich_shared_memory_left_by_killed_ranks():
    """A rank killed on purpose cannot unlink MPICH's /dev/shm segments: remove the ones a
    test leaves, so repeated runs do not fill the node's shared memory."""
    import glob
    before = set(glob.glob("/dev/shm/mpich_shm_*"))
    yield
    for path in set(glob.glob("/dev/shm/mpich_shm_*")) - before:
        try:
            os.unlink(path)
        except OSError:
            pass


def _mpiexec():
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def _have_mpi():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return _mpiexec() is not None


def run_mpi(n, script, *args, flags=(), timeout=90):
    """Run ``mpiexec [flags] -n N python script args``; kill the whole process group on timeout."""
    return run_mpi_with(_mpiexec(), n, script, *args, flags=flags, timeout=timeout)


def run_mpi_with(mpiexec, n, script, *args, flags=(), timeout=90, env=None):
    """``run_mpi`` with another ``mpiexec`` (Open MPI's) and ``env`` added to the environment."""
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]))
    cmd = [mpiexec, *flags, "-n", str(n), sys.executable, str(HERE / script), *map(str, args)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} hung for {timeout}s\n{out}\n{err}")
    proc.elapsed = time.monotonic() - t0
    proc.out, proc.err = out, err
    return proc


@pytest.fixture
def mpi():
    if not _have_mpi():
        pytest.skip("mpi4py or mpiexec not available")
    return run_mpi


@pytest.fixture
def mpi_with():
    """``run_mpi_with``: another mpiexec (Open MPI's), extra environment."""
    if not _have_mpi():
        pytest.skip("mpi4py or mpiexec not available")
    return run_mpi_with


@pytest.fixture
def mpiexec():
    """The path of mpiexec, for tests that place it themselves in a command line."""
    if not _have_mpi():
        pytest.skip("mpi4py or mpiexec not available")
    return _mpiexec()


@pytest.fixture
def pfs(tmp_path):
    """A small dataset: edge sizes around the 64 KiB test chunk, random sizes, one 9 MiB file,
    and files whose provide() refuses, raises or is slow."""
    root = tmp_path / "pfs"
    rng = random.Random(7)
    sizes = [0, 1, 1000, 65535, 65536, 65537, 3 * 65536 + 5] + [rng.randrange(300_000) for _ in range(24)]
    for i, size in enumerate(sizes):
        path = root / "0" / "train" / f"c{i % 4}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
    (root / "0" / "val").mkdir(parents=True)
    (root / "0" / "val" / "big.bin").write_bytes(rng.randbytes(9 * (1 << 20) + 123))
    for i in range(4):
        for kind in ("deny", "boom", "slow"):
            (root / "0" / "val" / f"{kind}{i}.bin").write_bytes(rng.randbytes(5000))
    return root
