"""The MPI library's shared-memory files a daemon leaves when it is killed.

MPICH (``/dev/shm/mpich_shm_*``) and Open MPI (``/dev/shm/sm_segment.*``) make them in
MPI_Init for the ranks of one host and remove them in MPI_Finalize: a SIGKILLed daemon (or
one that skips MPI_Finalize after a peer failed, monarch/cluster/world.py) leaves them,
megabytes each, in a node's memory until reboot. So a standing daemon notes in its run
directory the ones it has mapped once MPI is up (``record``), and every standing daemon that
starts on the node removes what a dead one noted (``remove_dead``): the files still there
that no live process maps or holds open (a name that came back with another job is in use,
so it stays), and its socket when it was another job's (a directory of this job may be
claimed by its new daemon this very moment, which replaces the socket itself). Its copies
are removed by the next tier made on the node (``layout.remove_leftovers``).

A run directory's daemon is dead when nothing holds its lock (monarch/node/instance.py).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat

from monarch import layout, secure

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIXES = ("mpich_shm_", "sm_segment.", "vader_segment.")  # MPICH ch4 posix, Open MPI 5 sm, Open MPI 4 vader


def _mapped(pid: str = "self", proc: str = "/proc", deleted: bool = True) -> set[str]:
    """The /dev/shm files process ``pid`` maps (``deleted``: also those already unlinked)."""
    try:
        with open(f"{proc}/{pid}/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return set()
    if not deleted:
        paths = {p for p in paths if not p.endswith(" (deleted)")}
    return {p.removesuffix(" (deleted)") for p in paths if p.startswith(SHM_DIR + "/")}


def mpi_files(paths) -> list[str]:
    return sorted(p for p in paths if os.path.dirname(p) == SHM_DIR and os.path.basename(p).startswith(PREFIXES))


def record(run_dir: str) -> list[str]:
    """Note the MPI shared-memory files this process maps (after MPI_Init) in ``run_dir``
    (none: the note is written all the same, it also marks the run directory as a standing
    daemon's, whose socket a later job's daemon may remove once it is dead)."""
    files = mpi_files(_mapped(deleted=False))  # MPICH unlinks some once every local rank has them
    secure.write_file_atomically(os.path.join(run_dir, layout.MPI_SHM), "".join(f + "\n" for f in files).encode())
    return files


def _lock_free(run_dir: str) -> bool:
    from monarch.node.instance import LOCK  # the instance's own name (a light module)
    try:
        fd = os.open(os.path.join(run_dir, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True  # never claimed
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _in_use(proc: str = "/proc") -> set[str]:
    """Every /dev/shm path a live process maps or holds open (read once, only when needed)."""
    used: set[str] = set()
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        used |= _mapped(pid, proc)
        try:
            for fd in os.listdir(f"{proc}/{pid}/fd"):
                target = os.readlink(f"{proc}/{pid}/fd/{fd}")
                if target.startswith(SHM_DIR + "/"):
                    used.add(target.removesuffix(" (deleted)"))
        except OSError:
            continue
    return used


def remove_dead(user_dir: str, job: str | None = None) -> list[str]:
    """Remove the MPI shared-memory files dead daemons noted in the run directories of
    ``user_dir`` that nobody uses, and the sockets of those of other jobs than ``job`` (a
    directory of this job may be claimed by its new daemon this very moment: that one
    replaces the socket itself); the paths removed."""
    try:
        names = os.listdir(user_dir)
    except OSError:
        return []
    noted = [os.path.join(user_dir, n) for n in names if os.path.exists(os.path.join(user_dir, n, layout.MPI_SHM))]
    dead = [d for d in noted if _lock_free(d)]
    if not dead:
        return []
    used = _in_use()
    removed = []
    for run_dir in dead:
        note = os.path.join(run_dir, layout.MPI_SHM)
        try:
            with open(note) as f:
                files = mpi_files(line.strip() for line in f)
        except OSError:
            continue
        for path in [p for p in files if p not in used and os.path.lexists(p)]:
            try:
                if stat.S_ISREG(os.lstat(path).st_mode) and os.lstat(path).st_uid == os.getuid():
                    os.unlink(path)
                    removed.append(path)
            except OSError:
                pass
        sock = os.path.join(run_dir, layout.SOCKET)
        if job is None or not os.path.basename(run_dir).startswith(f"{job}-node"):
            try:
                if stat.S_ISSOCK(os.lstat(sock).st_mode):
                    os.unlink(sock)
                    removed.append(sock)
            except OSError:
                pass
        try:
            os.unlink(note)
        except OSError:
            pass
    if removed:
        log.warning("removed what killed daemons left: %s", ", ".join(removed))
    return removed
