"""The embedded daemon forked from its launcher: no second interpreter to start.

``monarch run`` started its node daemon as ``python -c ... serve --embedded``: a new interpreter
and the imports again, 0.12 s of the 0.25 s before the command started (the launcher's own start
0.11). The launcher has the interpreter and most of the imports already: forked, the daemon
imports only its own modules (0.02 s) and serves the configuration the launcher checked, handed
over as it is. The child is made what the spawned daemon was: a session of its own, standard
input /dev/null and its output the daemon's log, no descriptor of the launcher's (its start
lock, an MPI launcher's sockets, the command's pipes), the environment ``service.start`` gives
it, its logging at the level ``-vv`` gave it; it leaves by ``os._exit``, never back into the
launcher's frames.

Not where a fork could carry what the daemon must not have: another thread in the launcher,
Python's or a native library's (a lock it holds would stay held in the child), a dataset in a
store (the launcher checked it with the store's client, whose native runtime keeps descriptors
the child closes: obstore's panicked), the shim loaded in the launcher (a ``monarch run`` under
another run's command: the daemon reads the PFS itself, never through the shim), or MPI. There
``service.start`` spawns the interpreter, as before.
"""

from __future__ import annotations

import logging
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Callable, Union

from monarch import topology
from monarch.config import Config
from monarch.errors import MonarchError
from monarch.launch import logs

SHIM_NAME = "libmonarch_shim"


def can_fork(config: Config) -> bool:
    """Is this launcher a safe parent for ``config``'s daemon (one thread, no store, no shim,
    no MPI loaded)?"""
    try:
        threads = len(os.listdir("/proc/self/task"))  # (native threads too)
    except OSError:
        return False
    return (threads == 1 and threading.active_count() == 1 and not config.dataset.stores
            and SHIM_NAME not in os.environ.get("LD_PRELOAD", "") and "mpi4py.MPI" not in sys.modules)


def fork_daemon(serve: Callable[[], int], env: dict[str, str], log_fd: int) -> "ForkedDaemon":
    """The run's daemon on this node, forked: ``serve()`` (its exit code) with ``env`` as its
    environment and ``log_fd`` as its output. Returns its handle, as ``subprocess.Popen``'s."""
    verbose = 2 if logging.getLogger().isEnabledFor(logging.DEBUG) else 0  # (as -vv passed it on)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # (else the child writes what the launcher had buffered once more)
    pid = os.fork()
    if pid == 0:
        _serve_in_child(serve, env, log_fd, verbose)  # never returns
    return ForkedDaemon(pid)


def _serve_in_child(serve: Callable[[], int], env: dict[str, str], log_fd: int, verbose: int) -> None:
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        _close_inherited()
        os.environ.clear()
        os.environ.update(env)
        logs.setup(verbose, str(topology.node_index()))
        code = serve()
    except MonarchError as e:
        print(f"monarch: error: {e}", file=sys.stderr)
        code = 2
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _close_inherited() -> None:
    """Every descriptor but 0, 1 and 2, listed (closing the limit's whole range is a million
    calls where the kernel or Python has no close_range)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        return
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass  # (the listing's own, closed already)


class ForkedDaemon:
    """A forked daemon as the launcher waits for it: ``subprocess.Popen``'s ``pid``,
    ``returncode`` (-N: ended by signal N), ``poll``, ``wait`` and ``kill``."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)  # (its exit wakes a wait at once)
        except (AttributeError, OSError):
            self._pidfd = -1

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone, its status unknown (as Popen says it)
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                if self._pidfd >= 0:
                    os.close(self._pidfd)
                    self._pidfd = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"monarch daemon (pid {self.pid})", timeout)
            if self._pidfd >= 0:
                select.select([self._pidfd], [], [], left)
            else:
                time.sleep(0.01 if left is None else min(0.01, left))
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


Daemon = Union[subprocess.Popen, ForkedDaemon]  # an embedded daemon as its launcher holds it
