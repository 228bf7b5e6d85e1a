"""Which of a run's launchers on a node is the last to leave (and prints the node's report)."""

from __future__ import annotations

import fcntl
import logging
import os

from monarch import secure

log = logging.getLogger(__name__)


class RunLaunchers:
    """The launchers of one run on one node (one per rank under ``mpiexec -n R monarch run``):
    each holds a shared lock on one file of the daemon's directory while its command runs. The
    one that can take it exclusively when leaving is the last to leave: it prints the node's
    report, whose totals then hold every rank's reads; the others print one line. The last
    removes the file (a launcher that joins later starts a group of its own). Any trouble with
    the file: this launcher counts as the last (the report is printed, as before)."""

    def __init__(self, run_dir: str | None, run: str):
        self.fd: int | None = None
        self.path = os.path.join(run_dir, f"launchers-{run}.lock") if run_dir else None
        if self.path is None:
            return
        try:
            fd = secure.open_private_file(self.path)
        except OSError as e:
            log.debug("launchers of run %s: %s: %s", run, self.path, e)
            return
        try:  # never waits: an exclusive holder has unlinked its file (a group of its own)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            self.fd = fd
        except OSError:
            os.close(fd)

    def last_to_leave(self) -> bool:
        """Is this the run's last launcher on the node? (the lock is kept until the process exits)"""
        if self.fd is None:
            return True
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        try:
            os.unlink(self.path)
        except OSError:
            pass
        return True
