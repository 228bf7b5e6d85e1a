"""Where this process sits in an MPI job, and the few process-wide MPI settings Monarch needs.

Nothing here reads the environment or imports mpi4py at import time.
"""

import atexit
import logging
import os
import signal
import sys
import threading
import time

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


def mpi_world_rank(environ=None):
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


def load_mpi():
    """Import mpi4py.MPI (initialising MPI) with the settings Monarch relies on.

    - ``rc.finalize = False``: Monarch finalises MPI itself at exit, and only when no peer
      failed (after a failure MPICH's MPI_Finalize makes hydra kill every survivor).
    - ``rc.thread_level = "serialized"``: one thread at a time calls MPI (the engine thread
      once started, the caller's thread before).
    - SIGUSR1 is caught: hydra run with ``-disable-auto-cleanup`` signals every survivor when
      a rank dies, and the default action of SIGUSR1 is to terminate.
    """
    if _state.mpi is not None:
        return _state.mpi
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        mpi4py.rc.finalize = False
        mpi4py.rc.thread_level = "serialized"
    else:
        log.debug("mpi4py.MPI was imported before Monarch: keeping its settings")
    from mpi4py import MPI

    _state.mpi = MPI
    _install_sigusr1()
    if not _state.finalize_registered:
        atexit.register(_finalize_at_exit)
        _state.finalize_registered = True
    return MPI


def note_failure(why):
    """Record that a peer failed: MPI must not be finalised at exit."""
    if not _state.failure_seen:
        log.warning("peer failure (%s): MPI_Finalize will be skipped at exit", why)
    _state.failure_seen = True


def track_engine(engine):
    _state.engines.append(engine)


def failure_seen():
    return _state.failure_seen


def _on_sigusr1(signum, frame):
    # hydra (-disable-auto-cleanup) tells survivors that a rank died. Just remember it.
    _state.failure_seen = True


def _install_sigusr1():
    if threading.current_thread() is not threading.main_thread():
        log.warning("MPI loaded outside the main thread: SIGUSR1 from hydra not handled")
        return
    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGUSR1, _on_sigusr1)


def _finalize_at_exit():
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


def abort_on_unhandled_exception():
    """Make an uncaught exception in any thread abort MPI_COMM_WORLD (one rank cannot hang the job)."""
    MPI = load_mpi()

    def _abort(exc_type, exc, tb):
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
