"""One live daemon instance per run directory; nothing of a dead one is trusted.

A run directory (``layout.run_dir``) is where the launchers of a run meet its daemon. A
daemon that dies without closing (SIGKILL, the OOM killer, a node's reboot of the job) leaves
its state there: the snapshot index, the counters, the socket. The next daemon of the same
run identity -- a batch script's second command under the same ``SLURM_JOB_ID`` -- may serve
another dataset with the same relative names; had its shim mapped the dead index, fstat
would report the old sizes (short reads, SIGBUS past the end of an mmap). So:

- a daemon claims the run directory with an exclusive ``flock`` on ``daemon.lock``, held for
  its life and released by the kernel however it dies: a second live daemon is refused
  before it touches anything, and whatever the holder finds of an earlier instance is
  a dead one's. The lock is also how others tell the run is alive, from any PID namespace
  (monarch/layout.py, monarch/launch/mpi_shm.py): they hold it shared for a moment, which a
  claim waits out;
- that dead state (index, counters, socket, pid file, their temporary files) is removed
  before anything of the new instance is published;
- every file the shim trusts carries the instance's random id in its name (``index-<id>``,
  ``counters-<id>``, ``sock-<id>``, ``wbsock-<id>``) and reaches the shim only through its launcher's
  environment (the ATTACH answer): a process of the new run never maps a dead instance's
  index, and a process left over from the killed run is never answered by the new
  instance (its socket name is gone) nor reads its counters or index;
- ``daemon.sock``, the name launchers look for, is a second name (a hard link) of the live
  instance's socket, replaced atomically once the instance listens.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import stat
import time

from monarch.errors import DaemonError
from monarch.layout import DAEMON_LOCK, SOCKET
from monarch.secure import open_private_file

log = logging.getLogger(__name__)

LOCK = DAEMON_LOCK
CLAIM_WAIT = 0.5  # seconds a claim waits out the lock held by others judging whether the run is alive
# what an instance leaves in the run directory: removed when a new instance takes over
# (the plain "index" and "counters" are the names of daemons from before instances)
_STATE = re.compile(r"(index|counters|sock|wbsock)(-[0-9a-f]+)?(\.tmp-[0-9a-f]+)?|daemon\.(sock|pid)(\.tmp-[0-9a-f]+)?")


class Instance:
    """This daemon's claim on a run directory and the names of its files there."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self._lock_fd: int | None = _claim(run_dir)
        self.id = os.urandom(4).hex()
        for name in remove_dead_state(run_dir):
            log.info("removed %s of a daemon of this run that is gone", os.path.join(run_dir, name))

    def _path(self, name: str) -> str:
        return os.path.join(self.run_dir, f"{name}-{self.id}")

    @property
    def index_path(self) -> str:
        return self._path("index")

    @property
    def counters_path(self) -> str:
        return self._path("counters")

    @property
    def socket_path(self) -> str:
        """The socket the instance listens on, as the shim knows it."""
        return self._path("sock")

    @property
    def writeback_socket_path(self) -> str:
        """The socket of the shim's write-back calls (node/writeback_door.py)."""
        return self._path("wbsock")

    @property
    def public_socket_path(self) -> str:
        """The run's socket, as launchers find it: a second name of ``socket_path``."""
        return os.path.join(self.run_dir, SOCKET)

    def publish_socket(self) -> None:
        """Name the listening socket ``daemon.sock`` (atomically: a launcher finds either the
        dead instance's name, which refuses it, or this one)."""
        tmp = f"{self.public_socket_path}.tmp-{os.urandom(6).hex()}"
        os.link(self.socket_path, tmp)
        try:
            os.replace(tmp, self.public_socket_path)
        except BaseException:
            _unlink(tmp)
            raise

    def unpublish_socket(self) -> None:
        """Remove both names of this instance's socket (``daemon.sock`` only if still ours)."""
        try:
            mine = os.stat(self.socket_path)
            public = os.stat(self.public_socket_path)
            if (public.st_dev, public.st_ino) == (mine.st_dev, mine.st_ino):
                _unlink(self.public_socket_path)
        except OSError:
            pass
        _unlink(self.socket_path)

    def release(self) -> None:
        """The instance is done (its files removed by their owners): another may claim the directory."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _claim(run_dir: str) -> int:
    fd = open_private_file(os.path.join(run_dir, LOCK))
    deadline = time.monotonic() + CLAIM_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)
    os.close(fd)
    raise DaemonError(f"a Monarch daemon already serves {run_dir}; stop it (monarch stop) "
                      "or give this job its own MONARCH_JOB_ID")


def remove_dead_state(run_dir: str) -> list[str]:
    """Remove what a dead instance left in ``run_dir`` (call it holding the lock); the names removed.
    A directory of such a name is left alone (nothing Monarch makes): the new instance's
    names differ from it anyway."""
    removed = []
    try:
        names = os.listdir(run_dir)
    except OSError:
        return removed
    for name in names:
        if not _STATE.fullmatch(name):
            continue
        path = os.path.join(run_dir, name)
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            os.unlink(path)
            removed.append(name)
        except OSError:
            pass
    return removed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
