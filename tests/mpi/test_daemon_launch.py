"""The daemons' launch line (monarch.cluster.world.daemon_launch).

After an Open MPI job was SIGKILLed on the node: the killed mpiexec leaves its session
directory, ``$TMPDIR/ompi.<pid>``, and once pids wrap a new mpiexec given that pid could not
bind its PMIx rendezvous socket ("The PMIx server's listener thread failed to start": a CI run
failed so, 4 nodes that never came up). The launch now keeps its session in a directory of its own.

A configuration error the daemons find once MPI runs is said as itself, with either engine."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from monarch.cluster.world import MPICH, ULFM, daemon_launch, openmpi_prefix
from support.harness import monarch_env

pytestmark = pytest.mark.mpi

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
ALLREDUCE = "from mpi4py import MPI; print('sum', MPI.COMM_WORLD.allreduce(1))"


def killed_openmpi_job(prefix, tmp_path) -> int:
    """Run a plain Open MPI job, as a user would, and SIGKILL its mpiexec and its rank once the
    rank runs: the pid whose session directory it leaves behind."""
    started = tmp_path / "started"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # not a session leader of its own: a session (or group) keeps its leader's pid taken while
    # any member lives, zombies included, and that pid is the one to hand on
    proc = subprocess.Popen([os.path.join(prefix, "bin", "mpiexec"), *root, "-n", "1", "sh", "-c",
                             f"touch {started}; sleep 60"], env={**os.environ, "OPAL_PREFIX": prefix},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (started.exists() and os.path.isdir(session_dir(proc.pid))):
            assert proc.poll() is None and time.monotonic() < deadline, "a plain Open MPI job did not start"
            time.sleep(0.05)
    finally:
        # its rank runs in a process group of its own: killed apart, or it would outlive the test
        for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
            p.kill()
        proc.wait()
    return proc.pid


def session_dir(pid):
    """Where Open MPI's mpiexec (PRRTE) keeps its session by default."""
    return os.path.join(tempfile.gettempdir(), f"ompi.{pid}")


def launch_with_pid(pid, argv, env):
    """Start ``argv`` as process ``pid`` (the kernel's next pid set just before the fork)."""
    with open(NS_LAST_PID, "w") as f:
        f.write(str(pid - 1))
    return subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(180)
def test_a_launch_given_a_killed_jobs_pid_still_starts(tmp_path):
    prefix = openmpi_prefix()
    if prefix is None:
        pytest.skip("no Open MPI installed (scripts/install.sh installs it)")
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip(f"cannot choose the next pid: {NS_LAST_PID} is not writable (needs root)")
    for attempt in range(5):
        pid = killed_openmpi_job(prefix, tmp_path)
        assert os.path.isdir(session_dir(pid)), "the killed mpiexec left no session directory to collide with"
        launch = daemon_launch(2, one_host=True, environ={**os.environ, "MONARCH_MPI_ENGINE": ULFM})
        try:
            proc = launch_with_pid(pid, [*launch.argv, sys.executable, "-c", ALLREDUCE], monarch_env(**launch.env))
            try:
                out, _ = proc.communicate(timeout=90)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        finally:
            launch.close()
            shutil.rmtree(session_dir(pid), ignore_errors=True)
        if proc.pid == pid:
            break
    else:
        pytest.skip("another process took the chosen pid five times")
    assert proc.returncode == 0 and out.count("sum 2") == 2, out
    assert launch.scratch is None


@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine", [MPICH, ULFM])
def test_a_tier_path_missing_on_every_node_is_said_and_nothing_else(engine, short_tmp):
    """A run base that does not exist is found after MPI_Init, once the peers' threads run. The
    daemons used to exit with it still polling a finalised MPI: MPICH's hydra printed "BAD
    TERMINATION ... Floating point exception (signal 8)", Open MPI an abort per rank from
    MPI_Improbe; the error itself was lost among them. Each rank now says it and exits 2."""
    if engine == ULFM and openmpi_prefix() is None:
        pytest.skip("no Open MPI installed (scripts/install.sh installs it)")
    ds = os.path.join(short_tmp, "ds")
    os.makedirs(ds)
    with open(os.path.join(ds, "a"), "wb") as f:
        f.write(b"x" * 100)
    cfg = os.path.join(short_tmp, "monarch.yaml")
    with open(cfg, "w") as f:
        f.write(f'dataset: {{roots: ["{ds}"]}}\nrun_base: "{short_tmp}/missing${{MONARCH_NODE}}"\n'
                f'tiers:\n  - {{name: ram, path: "{short_tmp}/ram${{MONARCH_NODE}}", capacity: 64MiB}}\n')
    launch = daemon_launch(2, one_host=True, environ={**os.environ, "MONARCH_MPI_ENGINE": engine})
    try:
        proc = subprocess.run([*launch.argv, sys.executable, "-m", "monarch", "serve", "-c", cfg],
                              env=monarch_env(**launch.env), capture_output=True, text=True, timeout=180)
    finally:
        launch.close()
    out = proc.stdout + proc.stderr
    for k in range(2):
        assert f"monarch: error: {short_tmp}/missing{k} does not exist; create it or fix the path" in out, out
    assert proc.returncode == 2, out
    for noise in ("BAD TERMINATION", "signal", "MPI_ERRORS_ARE_FATAL", "An error occurred"):
        assert noise not in out, out
