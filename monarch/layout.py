"""Where one run keeps its things on this node: private, per run, cleaned up after a crash.

Every configured path (``run_base``, ``tiers[].path``, ``peer.path``) is a *base*: Monarch
makes ``<base>/monarch-<uid>/`` (0700, checked, see monarch/secure.py) and works only
inside it.

- The run directory ``<run base>/monarch-<uid>/<run id>-node<N>/`` is where the launchers
  of one run meet its daemon: socket, counters, snapshot index, daemon log, report.
- Each tier's copies live in a directory the daemon makes with an unpredictable name,
  ``<tier base>/monarch-<uid>/<run id>-node<N>-<random>/``, announced to the shim only
  through its own launcher's environment: no other run, job step or user can compute it,
  so a copy is only ever served to the run (and dataset) that staged it.
- A kept tier (``keep: true``) lives in ``<tier base>/monarch-<uid>/keep-<tier>-<dataset id>/``,
  where the dataset id hashes every root's canonical path and device: a copy is adopted
  only by a run of the same dataset, and only after its size and mtime match the snapshot.
  One run uses a kept directory at a time (a lock); a second one stages privately.

Each directory made for a run holds a marker (its pid, PID namespace, process start time,
host, kind -- ``run`` or ``tier`` -- and lock) and a lock file its maker holds (``flock``)
for its life: the run directory's ``daemon.lock`` (its daemon instance's, monarch/node/instance.py),
a tier directory's ``TIER_LOCK``. Whether the maker is gone is judged, on its host only (a base
may be shared by hosts), by its pid and start time in its own PID namespace; from another
namespace (a container sharing the host's /dev/shm or /tmp) its pid says nothing: there the
lock alone tells (held: alive; free: gone, the kernel released it), and a marker with no lock
is never judged. A lock held means alive, whatever the pid says.

The two kinds may share a base (the shipped defaults put ``run_base`` and the SSD tier in
``${TMPDIR:-/tmp}``) and are cleaned up differently:

- a tier directory whose maker is gone is a crashed run's left-over: the next run that
  makes a tier there removes it (``remove_leftovers``);
- a finished run directory is the run's record (daemon log, report): only the
  ``KEEP_FINISHED_RUNS`` newest are kept (``prune_finished_runs``).

A marker written before markers had a kind is told by the directory's name
(``<run>-node<N>``: a run; ``<run>-node<N>-<hex>``: a tier). Nothing without a marker is
ever removed.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import socket
import time

import xxhash

from monarch.secure import (check_private_dir, new_private_dir, open_private_file, private_dir, user_dir,
                            write_file_atomically)

log = logging.getLogger(__name__)

MARKER = ".monarch-run"
SOCKET = "daemon.sock"  # where launchers find a run's daemon: a second name of the live instance's socket
# held (flock) by the run's live daemon instance for its life (monarch/node/instance.py): the
# run directory's marker names it
DAEMON_LOCK = "daemon.lock"
# the run directory's other files that launchers and `monarch serve` name (the daemon instance's
# own ``-<id>`` files are named by monarch/node/instance.py)
PID_FILE = "daemon.pid"   # a standing or embedded daemon's pid, while it serves
DAEMON_LOG = "daemon.log"  # an embedded daemon's stdout and stderr
START_LOCK = "start.lock"  # held by the launcher that starts the run's embedded daemon
REPORT = "report.json"     # the report when neither the command line nor the configuration names one
REFUSED = "refused"        # a daemon's one-line reason it will not start (a wrong srun line), for its launchers
MPI_SHM = "mpi-shm"        # the MPI library's shared-memory files a standing daemon maps (monarch/launch/mpi_shm.py)
KEEP_LOCK = ".monarch-keep.lock"
TIER_LOCK = ".monarch-run.lock"  # held (flock) by the run that made a private tier directory, for its life
REMOVE_TRIES = 5  # a private directory still written into while removed (ENOTEMPTY) is removed again


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started; None if it is gone (a zombie is gone: it will never clean up)."""
    try:
        import psutil
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except Exception:  # gone, or psutil cannot say
        return None


KIND_RUN = "run"    # a run directory: socket, counters, daemon log, report
KIND_TIER = "tier"  # a tier's (or the peer area's) private directory of copies
_RUN_NAME = re.compile(r".+-node\d+")              # <run id>-node<N>
_TIER_NAME = re.compile(r".+-node\d+-[0-9a-f]+")   # <run id>-node<N>-<random>
_LOCK_OF = {KIND_RUN: DAEMON_LOCK, KIND_TIER: TIER_LOCK}  # what the maker of each kind holds for its life


def _pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[<inode>]``); None if /proc cannot say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def write_marker(directory: str, run_id: str, kind: str) -> None:
    """Mark ``directory`` as made by this process for run ``run_id``; the caller holds the
    kind's lock in it (``_LOCK_OF``) for as long as it lives."""
    me = os.getpid()
    write_file_atomically(os.path.join(directory, MARKER), json.dumps(
        {"pid": me, "pidns": _pid_namespace(), "started": _process_start(me), "host": socket.gethostname(),
         "run": run_id, "kind": kind, "lock": _LOCK_OF[kind], "created": time.time()}).encode())


def _read_marker(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, MARKER), "rb") as f:
            marker = json.loads(f.read(4096))
        return marker if isinstance(marker, dict) else None
    except (OSError, ValueError):
        return None


def _kind(directory: str, marker: dict) -> str | None:
    """What a marked directory is: its marker says; an older marker, its name (None: neither)."""
    kind = marker.get("kind")
    if kind in (KIND_RUN, KIND_TIER):
        return kind
    name = os.path.basename(directory)
    if _TIER_NAME.fullmatch(name):  # before the run pattern: a tier's name matches both
        return KIND_TIER
    return KIND_RUN if _RUN_NAME.fullmatch(name) else None


def _lock_held(directory: str, name) -> bool | None:
    """Does a process hold the lock file ``name`` in ``directory``? A missing one is not held
    (its maker made it before the marker: someone removed it since, tearing the directory
    down). None: not a maker's lock, or the filesystem cannot say."""
    if name not in _LOCK_OF.values():
        return None
    try:
        fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the maker's is exclusive; judges' shared ones pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)


def _owner_alive(marker: dict, directory: str | None = None) -> bool | None:
    """Is the maker of a marked directory still running? None: the marker is not valid."""
    try:
        pid, started, host = int(marker["pid"]), marker.get("started"), str(marker["host"])
    except (KeyError, TypeError, ValueError):
        return None
    if host != socket.gethostname():
        return True  # another host's directory on a shared base: not ours to judge
    lock = marker.get("lock") if directory is not None else None
    pidns = marker.get("pidns")
    if pidns is not None and pidns != _pid_namespace():
        # its pid is another namespace's: a number that may name any process here, or none
        return lock is None or _lock_held(directory, lock) is not False
    # the pid first: the maker itself never probes its own lock (where flock is emulated by
    # POSIX locks, NFS, closing the probe would release the maker's)
    now = _process_start(pid)
    if now is not None and (started is None or abs(now - float(started)) < 1.0):  # else the pid was reused
        return True
    return lock is not None and _lock_held(directory, lock) is True  # a child that inherited it lives on


def _finished(parent: str, kind: str, skip: str | None = None) -> list[str]:
    """The directories of ``kind`` in ``parent`` (not ``skip``, no symlink) whose marker names
    a process that is gone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    found = []
    for path in (os.path.join(parent, name) for name in names):
        if path == skip or os.path.islink(path) or not os.path.isdir(path):
            continue
        marker = _read_marker(path)
        if marker is not None and _kind(path, marker) == kind and _owner_alive(marker, path) is False:
            found.append(path)
    return found


def remove_leftovers(parent: str, keep: str | None = None) -> list[str]:
    """Remove the tier directories in ``parent`` whose marker names a process that is gone
    (never a run directory: a finished run's report stays, see ``prune_finished_runs``)."""
    removed = _finished(parent, KIND_TIER, keep)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed %s: left by a run that is gone", path)
    return removed


KEEP_FINISHED_RUNS = 20  # finished run directories (daemon log, report) kept per user and run base


def prune_finished_runs(parent: str, keep: int = KEEP_FINISHED_RUNS, spare: str | None = None) -> list[str]:
    """Remove all but the ``keep`` newest finished run directories in ``parent`` (marked, their
    daemon gone; newest by marker time), never ``spare``; the removed paths."""
    finished = []
    for path in _finished(parent, KIND_RUN, spare):
        try:
            finished.append((os.stat(os.path.join(path, MARKER)).st_mtime, path))
        except OSError:
            continue
    finished.sort(reverse=True)
    removed = [path for _, path in finished[keep:]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    if removed:
        log.info("removed %d finished run directories of %s (the %d newest are kept)", len(removed), parent, keep)
    return removed


def session_report(run_id: str) -> str:
    """The report of one run attached to a job's standing daemon, in the daemon's run directory
    (whose ``REPORT`` is the daemon's own, written at its stop)."""
    return f"report-{run_id}.json"


def run_name(run_id: str, node: int) -> str:
    """A run directory's name on node ``node``: ``<run id>-node<N>``."""
    return f"{run_id}-node{node}"


def run_dir(base: str, run_id: str, node: int) -> str:
    """The run's meeting point on this node (made private if missing)."""
    return private_dir(os.path.join(user_dir(base), run_name(run_id, node)))


def socket_path(base: str, run_id: str, node: int) -> str:
    """Where launchers find the daemon of run ``run_id`` on node ``node``:
    ``<base>/monarch-<uid>/<run id>-node<N>/daemon.sock`` (only ``monarch-<uid>`` is made, checked)."""
    return os.path.join(user_dir(base), run_name(run_id, node), SOCKET)


def dataset_id(roots: tuple[str, ...]) -> str:
    """The identity of a dataset's roots: canonical path and device of each."""
    h = xxhash.xxh64()
    for root in roots:
        st = os.stat(root)
        h.update(os.fsencode(root) + b"\0" + str(st.st_dev).encode() + b"\0")
    return h.hexdigest()


class StorageDir:
    """A directory of copies made for this run (private) or kept across runs; locked by this
    run either way (``TIER_LOCK``, ``KEEP_LOCK``) until it is removed or released."""

    def __init__(self, path: str, kept: bool, lock_fd: int | None = None):
        self.path, self.kept, self._lock_fd = path, kept, lock_fd

    @classmethod
    def create(cls, base: str, run_id: str, node: int, keep_name: str | None = None,
               roots: tuple[str, ...] = ()) -> "StorageDir":
        """A private directory for this run under ``base`` (kept: the dataset's kept one,
        if no other run holds it)."""
        parent = user_dir(base)
        remove_leftovers(parent)
        if keep_name is not None:
            kept = cls._kept(parent, keep_name, roots)
            if kept is not None:
                return kept
        path = new_private_dir(parent, f"{run_name(run_id, node)}-")
        fd = None
        try:
            # held for the run's life, taken before the marker is written: whoever reads the
            # marker finds it held while this process lives (in any PID namespace)
            fd = open_private_file(os.path.join(path, TIER_LOCK))
            fcntl.flock(fd, fcntl.LOCK_EX)
            write_marker(path, run_id, KIND_TIER)
        except BaseException:  # ENOSPC, say: an unmarked directory would never be cleaned up
            if fd is not None:
                os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(path, kept=False, lock_fd=fd)

    @classmethod
    def _kept(cls, parent: str, keep_name: str, roots: tuple[str, ...]) -> "StorageDir | None":
        path = private_dir(os.path.join(parent, f"keep-{keep_name}-{dataset_id(roots)}"))
        fd = open_private_file(os.path.join(path, KEEP_LOCK))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            log.warning("%s is in use by another run: this run stages into a private directory", path)
            return None
        return cls(path, kept=True, lock_fd=fd)

    def check(self) -> None:
        check_private_dir(self.path)

    def remove(self) -> None:
        """Delete a private directory (the run's own); a kept one is only unlocked. Called
        once every copy into it has stopped (``NodeDaemon.close``); should one still be
        writing (a PFS read that never returned), the removal is tried again: once the
        directory is gone, nothing re-creates it (``tiers.make_dirs_below``)."""
        if not self.kept:
            self.release()  # first: on NFS an open lock file, removed, stays (silly-renamed) and the directory with it
            for _ in range(REMOVE_TRIES):
                shutil.rmtree(self.path, ignore_errors=True)
                if not os.path.lexists(self.path):
                    break
            else:
                log.warning("%s could not be removed; the next run on this node removes it", self.path)
        self.release()

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
