"""Where one run keeps its write-back on a node: ``<tier base>/monarch-<uid>/writeback-<run>-node<N>/``,
0700, holding ``journal`` (docs: journal.py), ``data/<seq>`` (each pending file's bytes, 0600)
and ``owner.lock``.

The area's owner (the run's daemon) holds ``owner.lock`` locked (``flock``) for its life: a lock
is held across PID namespaces and containers on one kernel, and is gone with the process however
it ends. A drain of a run that is gone (``monarch drain``, the next run on the node) takes the
same lock first: never while the owner lives, never two at once. The name is the run's, not a
random one, so that a drain after a crash or a reboot finds it; nothing in it is ever served to
another run (the data files are read only by the drain).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal

from monarch.errors import MonarchError
from monarch.secure import check_private_dir, open_private_file, private_dir, user_dir

log = logging.getLogger(__name__)

PREFIX = "writeback-"
JOURNAL, DATA, LOCK = "journal", "data", "owner.lock"
# beside a cluster run's area its daemon removed, all published: how far its journal went and what it
# heard of the other nodes' (across.py), for a drain of another node's area its killed daemon left
DONE = ".done"
F_SETLEASE, F_SETSIG = getattr(fcntl, "F_SETLEASE", 1024), getattr(fcntl, "F_SETSIG", 10)


def run_and_node(name: str) -> tuple[str, str]:
    """The run and the node an area's name (``writeback-<run>-node<N>``) gives: ("", "") when it
    is not such a name (the node: digits, when it is)."""
    if not name.startswith(PREFIX):
        return "", ""
    run, _, node = name[len(PREFIX):].rpartition("-node")
    return (run, node) if run and node.isdigit() else ("", "")


class Area:
    """One run's write-back area on a node, held (locked) by this process while it is open."""

    def __init__(self, path: str, lock_fd: int):
        self.path, self._lock_fd = path, lock_fd

    @property
    def journal_path(self) -> str:
        return os.path.join(self.path, JOURNAL)

    def data_path(self, seq: int) -> str:
        return os.path.join(self.path, DATA, str(int(seq)))

    @classmethod
    def create(cls, base: str, run_id: str, node: int) -> "Area":
        """The run's area under ``base`` (made private if missing), held by this process."""
        path = private_dir(os.path.join(user_dir(base), f"{PREFIX}{run_id}-node{node}"))
        private_dir(os.path.join(path, DATA))
        area = cls._hold(path, blocking=False)
        if area is None:
            raise BlockingIOError(f"{path} is held by another live process of the run")
        try:  # what an earlier run of the same name left when it finished: not this run's
            os.unlink(path + DONE)
        except FileNotFoundError:
            pass
        return area

    @classmethod
    def orphans(cls, base: str, but_run: str | None = None) -> list["Area"]:
        """The areas under ``base`` whose owner is gone, each now held by this process (sorted by
        name); ``but_run``: never that run's (its daemon may be making its area at this moment)."""
        try:
            parent = user_dir(base)
            names = sorted(n for n in os.listdir(parent)
                           if n.startswith(PREFIX) and (but_run is None or run_and_node(n)[0] != but_run))
        except (OSError, MonarchError):  # no folder of this user's there: nothing of theirs to drain
            return []
        found = []
        for name in names:
            path = os.path.join(parent, name)
            if os.path.islink(path) or not os.path.isdir(path):
                continue
            try:
                check_private_dir(path)
            except MonarchError as e:  # not a private folder of this user's: never read, said
                log.warning("%s", e)
                continue
            area = cls._hold(path, blocking=False)
            if area is not None:
                found.append(area)
        return found

    @classmethod
    def _hold(cls, path: str, blocking: bool) -> "Area | None":
        fd = open_private_file(os.path.join(path, LOCK))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        return cls(path, fd)

    def pending_data(self) -> list[int]:
        """The sequence numbers of the files whose bytes are still here."""
        try:
            return sorted(int(n) for n in os.listdir(os.path.join(self.path, DATA)) if n.isdigit())
        except OSError:
            return []

    def remove(self, done: dict | None = None) -> None:
        """Remove the area: only once nothing in it is unpublished (the drain's caller checks).
        ``done``: left beside it first (``<area>.done``, one line of JSON), what a drain on another
        node may need of this one's (monarch/writeback/across.py)."""
        if done is not None:
            try:
                fd = open_private_file(self.path + DONE + ".tmp", os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, json.dumps(done, separators=(",", ":")).encode() + b"\n")
                finally:
                    os.close(fd)
                os.replace(self.path + DONE + ".tmp", self.path + DONE)
            except (OSError, MonarchError) as e:  # a later drain then knows less, and keeps more
                log.warning("write-back: cannot leave what %s published beside it: %s", self.path, e)
        shutil.rmtree(self.path, ignore_errors=True)
        self.release()

    def release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def sole_opener(path: str) -> bool:
    """Is no descriptor or mapping of the file at ``path`` open anywhere? (A write lease is
    granted only then; it is given back at once.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        # an open meanwhile (the job's, the partner copy's) breaks it: SIGURG (ignored), not SIGIO (the end)
        fcntl.fcntl(fd, F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_WRLCK)
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
