"""One user's copies of one dataset in one tier base, shared by that user's jobs on the node.

A sweep's trials and a chain's jobs read the same dataset: one set of copies serves them
all, and each file is read from the PFS once. What is shared is files and locks, never a
process: every job's daemon dies with its job, and the kernel drops its locks then.

``<tier base>/monarch-<uid>/share-<dataset id>/`` (0700, owner checked; the dataset id hashes
each root's canonical path and device, in order, as a kept tier's does):

- ``<k>/<rel>``: the copies, named by key where each job's shim probes. A copy is written
  under a temporary name and renamed into place, with its source's size and mtime: a job
  serves it only if they are those of its own snapshot (the shim checks them at every
  probe of a shared slot; the daemon before booking it), else it reads the PFS.
- ``.monarch-share/leases/<run>-<pid>``: one per job using the set, locked (``flock``) by it
  for its life, and locked before it is seen there (made under another name, then renamed).
  A lease whose lock can be taken is a dead job's: removed by whoever finds it. No count, no
  heartbeat, no pid judged: the name only tells the jobs apart for people (a job in another
  PID namespace may have this one's run and pid: its live lease keeps its name, this job's
  takes a random suffix).
- ``.monarch-share/join.lock``: held a moment by a job joining or leaving, and while a set
  is removed, so that a job never joins a set being removed.
- ``.monarch-share/room``: the ledger, the bytes of the tier taken by copies and by copies
  under way, under a lock: the tier's capacity bounds the set, not each job. The first job
  in sets the capacity; a job that joins alone recounts it from the directory (what a
  killed job had reserved does not stay taken).
- ``.monarch-share/claims/<n>``: per-key staging locks (keys hashed onto a fixed number of
  files): the job that stages a key holds its lock for the copy; another job needing it
  waits (bounded) and then finds the copy. A killed job's lock goes with it; its temporary
  file, never served, is removed when a job joins alone or the set goes.
- ``.monarch-share/door.lock``: a job alone on the set may let its C front door copy
  without claims (the fast path for small files) while it holds this lock exclusively;
  every other job holds it shared before its first copy. A job that joins asks the lone
  one to stop (``door.stop``) and waits (bounded) until its door's copies under way are
  published and the lock released.
- ``.monarch-share/expiry``: written by the last job out (``linger`` seconds after its end).
  A set with no live lease and no expiry (its last job was killed) lingers from when that
  is noticed. ``drop_expired`` removes the sets whose time is over (each run does it for
  its own tier bases at start; ``monarch cache drop --expired`` for every base).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass

import xxhash

from monarch.layout import KEEP_LOCK, dataset_id
from monarch.node.tiers.tiers import BLOCKMAP_DIR, BLOCKMAP_MAGIC, BLOCKMAP_ROOM_OFFSET, BLOCKMAP_VERSION, BLOCKS_DIR
from monarch.secure import check_private_dir, open_private_file, private_dir, user_dir, write_file_atomically

log = logging.getLogger(__name__)

__all__ = ["SharedSet", "SetInfo", "set_dir", "list_sets", "drop_set", "drop_expired", "CONTROL", "PREFIX"]

PREFIX = "share-"
CONTROL = ".monarch-share"  # a key begins with its root's number ("<k>/..."): never this name
LEASES, CLAIMS, JOIN_LOCK, ROOM, EXPIRY, ABOUT = "leases", "claims", "join.lock", "room", "expiry", "set.json"
DOOR_LOCK, DOOR_STOP = "door.lock", "door.stop"  # a lone job's front door copying without claims; asked to stop
DOOR_POLL_SECONDS = 0.05  # how often a lone job's door looks whether another job asked it to stop
CLAIM_STRIPES = 1024  # per-key locks are this many files: two keys share one rarely, and only wait a copy's time
TMP_PREFIXES = (".monarch-tmp-",)  # a copy under way (tiers.write_atomically)
WAIT_FIRST, WAIT_MOST = 0.001, 0.02  # seconds between tries of a claim another job holds (doubling)
_ROOM = struct.Struct("<qq")  # capacity, bytes taken


def set_dir(base: str, roots: tuple[str, ...]) -> str:
    """Where this user's shared set of the dataset ``roots`` lives under ``base`` (not made)."""
    return os.path.join(user_dir(base), f"{PREFIX}{dataset_id(roots)}")


def _lock(fd: int, exclusive: bool = True, wait: bool = True) -> bool:
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return False


def _live_leases(control: str, mine: str | None = None) -> list[str]:
    """The names of the leases held by live jobs (``mine`` excepted); dead jobs' are removed."""
    leases = os.path.join(control, LEASES)
    try:
        names = os.listdir(leases)
    except FileNotFoundError:
        return []
    live = []
    for name in names:
        if name == mine:
            continue
        path = os.path.join(leases, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if _lock(fd, wait=False):
                os.unlink(path)  # its job is gone: the kernel dropped its lock
            else:
                live.append(name)
        finally:
            os.close(fd)
    return live


def _new_lease(control: str, name: str) -> int:
    """This job's lease ``name``, locked before it is in ``leases/``: a job counting the leases
    meanwhile (outside the join lock: ``others_live``, ``list_sets``) never takes it for a dead one's."""
    tmp = os.path.join(control, f".lease-{os.urandom(8).hex()}")
    fd = open_private_file(tmp, os.O_RDWR | os.O_CREAT)
    try:
        _lock(fd)
        os.rename(tmp, os.path.join(control, LEASES, name))
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd


@contextlib.contextmanager
def _joining(path: str):
    """The set's join lock, on the set still there (a set removed meanwhile: FileNotFoundError)."""
    control = os.path.join(path, CONTROL)
    lock = os.path.join(control, JOIN_LOCK)
    fd = open_private_file(lock)
    try:
        _lock(fd)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if not same:
            raise FileNotFoundError(errno.ENOENT, "the shared set was removed meanwhile", path)
        yield control
    finally:
        os.close(fd)


def held_room(set_path: str, path: str, size: int, allocated) -> int:
    """The room of the set's ledger its file ``path`` (``size`` bytes) holds: a copy's
    ``allocated(size)``; a copy by blocks (``.blocks/<key>``, one name: not published whole)
    what its map says its job took, which for a file larger than the room is some of its blocks'
    (``allocated(size)`` if its map is not of this format)."""
    blocks = os.path.join(set_path, BLOCKS_DIR) + os.sep
    if path.startswith(blocks):
        with contextlib.suppress(OSError):
            fd = os.open(os.path.join(set_path, BLOCKMAP_DIR, path[len(blocks):]),
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # (never a FIFO's wait)
            try:
                head = os.pread(fd, BLOCKMAP_ROOM_OFFSET + 8, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
            finally:
                os.close(fd)
            if len(head) == BLOCKMAP_ROOM_OFFSET + 8 \
                    and struct.unpack_from("<QI", head) == (BLOCKMAP_MAGIC, BLOCKMAP_VERSION):
                return min(struct.unpack_from("<Q", head, BLOCKMAP_ROOM_OFFSET)[0], allocated(size))
    return allocated(size)


def _sweep(path: str, allocated, remove_temporaries: bool = False) -> tuple[int, int]:
    """Files and the room (``held_room`` each) of the copies in the set; with
    ``remove_temporaries`` (no other job uses the set) copies left half-written go."""
    files = room = 0
    blocks = os.path.join(path, BLOCKS_DIR)
    for top, dirs, names in os.walk(path):
        if top == path:
            dirs[:] = [d for d in dirs if d not in (CONTROL, BLOCKMAP_DIR)]  # control files, block maps
        for name in names:
            with contextlib.suppress(OSError):
                if name.startswith(TMP_PREFIXES):
                    if remove_temporaries:
                        os.unlink(os.path.join(top, name))
                    continue
                st = os.lstat(os.path.join(top, name))
                if top.startswith(blocks + os.sep) and st.st_nlink > 1:
                    continue  # a large file staged by blocks, published whole: counted at its key
                if stat.S_ISREG(st.st_mode):
                    files += 1
                    room += held_room(path, os.path.join(top, name), st.st_size, allocated)
    return files, room


class SharedSet:
    """This job's membership of one shared set: its lease, the ledger, the claims."""

    def __init__(self, path: str, lease: str, lease_fd: int, room_fd: int, capacity: int, linger: float,
                 others: int, wait: float):
        self.path, self.lease, self._lease_fd, self._room_fd = path, lease, lease_fd, room_fd
        self.capacity, self.linger, self.others_at_join, self.wait = capacity, linger, others, wait
        self.control = os.path.join(path, CONTROL)
        self._room_lock = threading.Lock()  # flock excludes other jobs; this, this job's threads
        self.left: dict | None = None  # what the last job out left (leave)
        self.claims_waited = 0  # keys this job waited for while another job staged them
        self.claims_timed_out = 0
        self._door_fd = -1  # door.lock held exclusively: this job's door copies without claims
        self._door_stopped = False  # asked to stop: its door copies no more, for good
        self._copies_fd = -1  # door.lock held shared: no other job's door copies without claims
        self._copies_unheld = False  # a lone job's door did not stop within the wait: copy regardless
        self._hold_lock = threading.Lock()
        self._left = threading.Event()

    @classmethod
    def join(cls, base: str, roots: tuple[str, ...], run_id: str, capacity: int, linger: float, wait: float,
             allocated=lambda size: size) -> "SharedSet":
        """Join (or make) this user's set of ``roots`` under ``base``: a lease taken, the ledger
        opened (``capacity`` if this job makes it; else the set's), temporaries of killed
        jobs removed and the ledger recounted when no other job uses it."""
        for _ in range(10):
            path = private_dir(set_dir(base, roots))
            control = private_dir(os.path.join(path, CONTROL))
            private_dir(os.path.join(control, LEASES))
            private_dir(os.path.join(control, CLAIMS))
            try:
                with _joining(path):
                    others = _live_leases(control)
                    lease = f"{run_id}-{os.getpid()}"
                    if lease in others:
                        lease = f"{lease}-{os.urandom(4).hex()}"
                    lease_fd = _new_lease(control, lease)
                    room_fd = open_private_file(os.path.join(control, ROOM), os.O_RDWR | os.O_CREAT)
                    _lock(room_fd)
                    try:
                        old = os.pread(room_fd, _ROOM.size, 0)
                        set_capacity = _ROOM.unpack(old)[0] if len(old) == _ROOM.size and others else capacity
                        if not others:  # alone: what killed jobs left half-written goes, the room is recounted
                            os.pwrite(room_fd, _ROOM.pack(set_capacity, _sweep(path, allocated, True)[1]), 0)
                    finally:
                        fcntl.flock(room_fd, fcntl.LOCK_UN)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(control, EXPIRY))
                    if others:  # a lone job's door copying without claims stops for this one
                        write_file_atomically(os.path.join(control, DOOR_STOP), b"")
                    write_file_atomically(os.path.join(control, ABOUT), json.dumps(
                        {"roots": list(roots), "linger": linger, "host": socket.gethostname(),
                         "joined": time.time()}).encode())
            except FileNotFoundError:  # removed while we waited to join: make it anew
                continue
            return cls(path, lease, lease_fd, room_fd, set_capacity, linger, len(others), wait)
        raise OSError(errno.EAGAIN, "the shared set kept being removed while this job joined it", set_dir(base, roots))

    # -- the ledger ------------------------------------------------------------------------
    def _room_change(self, delta: int) -> bool:
        """Add ``delta`` to the bytes taken (a positive one only if it fits the capacity)."""
        with self._room_lock:
            _lock(self._room_fd)
            try:
                capacity, taken = _ROOM.unpack(os.pread(self._room_fd, _ROOM.size, 0).ljust(_ROOM.size, b"\0"))
                if delta > 0 and taken + delta > capacity:
                    return False
                os.pwrite(self._room_fd, _ROOM.pack(capacity, max(0, taken + delta)), 0)
                return True
            finally:
                fcntl.flock(self._room_fd, fcntl.LOCK_UN)

    def take(self, size: int) -> bool:
        return self._room_change(size)

    def give(self, size: int) -> None:
        self._room_change(-size)

    def taken(self) -> int:
        return _ROOM.unpack(os.pread(self._room_fd, _ROOM.size, 0).ljust(_ROOM.size, b"\0"))[1]

    # -- claims ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def claim(self, key: str, wait: float | None = None):
        """Hold ``key``'s staging lock (True), or give up after ``wait`` seconds (False): another
        job stages it and the caller looks for its copy rather than copying it again."""
        stripe = xxhash.xxh64_intdigest(os.fsencode(key)) % CLAIM_STRIPES
        fd = open_private_file(os.path.join(self.control, CLAIMS, str(stripe)), os.O_RDWR | os.O_CREAT)
        try:
            held = _lock(fd, wait=False)
            if not held:
                self.claims_waited += 1
                deadline, pause = time.monotonic() + (self.wait if wait is None else wait), WAIT_FIRST
                while not (held := _lock(fd, wait=False)) and time.monotonic() < deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, WAIT_MOST)
                if not held:
                    self.claims_timed_out += 1
            yield held
        finally:
            os.close(fd)  # the lock goes with it

    # -- the front door's copies, which take no claims -------------------------------------------
    def copy_alone(self, stop) -> bool:
        """May this job's front door copy into the set without claims? Only while no other job
        uses it (the door lock held exclusively); once another job joins, ``stop()`` is called
        (it returns when the door copies no more) and the lock released: False from then on."""
        if self._door_fd >= 0 or self._door_stopped:
            return not self._door_stopped
        try:
            with _joining(self.path) as control:  # no job joins meanwhile
                if _live_leases(control, self.lease):
                    return False
                fd = open_private_file(os.path.join(control, DOOR_LOCK))
                if not _lock(fd, wait=False):
                    os.close(fd)
                    return False
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(control, DOOR_STOP))  # asked of an earlier lone job
                self._door_fd = fd
        except FileNotFoundError:
            return False
        threading.Thread(target=self._watch_door, args=(stop,), name="monarch-share-door", daemon=True).start()
        return True

    def _watch_door(self, stop) -> None:
        asked = os.path.join(self.control, DOOR_STOP)
        while not self._left.wait(DOOR_POLL_SECONDS):
            if os.path.exists(asked):
                self._door_stopped = True  # first: a door linked meanwhile is told not to copy
                try:
                    stop()
                except Exception:
                    log.exception("stopping the front door's copies into %s failed", self.path)
                finally:
                    with self._hold_lock:
                        fd, self._door_fd = self._door_fd, -1
                        if fd >= 0:
                            os.close(fd)  # the joining jobs' copies may start
                return

    def hold_copies(self) -> None:
        """Before this job copies with claims: no other job's door copies without them (the
        door lock held shared; a lone job's door is asked to stop and waited for, at most
        ``wait`` seconds, then this job copies regardless, which may read a file twice)."""
        if self._copies_fd >= 0 or self._copies_unheld or self._door_fd >= 0:
            return
        with self._hold_lock:
            if self._copies_fd >= 0 or self._copies_unheld or self._door_fd >= 0:
                return
            fd = open_private_file(os.path.join(self.control, DOOR_LOCK))
            if not _lock(fd, exclusive=False, wait=False):
                write_file_atomically(os.path.join(self.control, DOOR_STOP), b"")
                deadline, pause = time.monotonic() + self.wait, WAIT_FIRST
                while not _lock(fd, exclusive=False, wait=False):
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        self._copies_unheld = True
                        log.warning("another job's front door did not stop copying into %s within %.0f s; this "
                                    "job copies regardless", self.path, self.wait)
                        return
                    time.sleep(pause)
                    pause = min(pause * 2, WAIT_MOST)
            self._copies_fd = fd

    # -- leaving ---------------------------------------------------------------------------
    def others_live(self) -> int:
        return len(_live_leases(self.control, self.lease))

    def leave(self) -> dict | None:
        """End this job's lease. The last job out leaves the copies ``linger`` seconds (the
        expiry written) or, with no linger, removes the set. What was left (path, bytes of
        room, until) is returned and kept in ``left``; None if other jobs still use it."""
        if self._lease_fd < 0:
            return self.left
        self._left.set()
        with self._hold_lock:
            for fd in (self._door_fd, self._copies_fd):
                if fd >= 0:
                    os.close(fd)
            self._door_fd = self._copies_fd = -1
        try:
            with _joining(self.path) as control:
                os.close(self._lease_fd)
                self._lease_fd = -1
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(control, LEASES, self.lease))
                if _live_leases(control):
                    return None
                taken = self.taken()  # the room the copies take: what the linger holds (no walk of the set)
                if self.linger <= 0 or not taken:
                    _remove(self.path)
                    return None
                until = time.time() + self.linger
                write_file_atomically(os.path.join(control, EXPIRY), json.dumps({"until": until}).encode())
                self.left = {"path": self.path, "bytes": taken, "until": until}
                return self.left
        except FileNotFoundError:  # removed already (monarch cache drop)
            return None
        finally:
            if self._lease_fd >= 0:
                os.close(self._lease_fd)
                self._lease_fd = -1
            if self._room_fd >= 0:
                os.close(self._room_fd)
                self._room_fd = -1


def _remove(path: str) -> None:
    """Remove a set (its join lock held by the caller, or no job on it): the copies, then the control."""
    for entry in os.scandir(path):
        if entry.name != CONTROL:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class SetInfo:
    """A shared set (or a kept tier) as ``monarch cache ls`` shows it."""
    path: str
    kind: str  # "shared" or "kept"
    files: int
    bytes: int
    jobs: int  # live jobs using it
    until: float | None  # the end of its linger (None: in use, or kept)
    roots: list


def _about(control: str) -> dict:
    try:
        with open(os.path.join(control, ABOUT), "rb") as f:
            about = json.loads(f.read(1 << 16))
        return about if isinstance(about, dict) else {}
    except (OSError, ValueError):
        return {}


def _until(control: str, jobs: int, about: dict, now: float, notice: bool) -> float | None:
    """When an unused set's linger ends. A set with no expiry (its last job was killed) lingers
    from now: written with ``notice``, so that the linger is counted once."""
    if jobs:
        return None
    try:
        with open(os.path.join(control, EXPIRY), "rb") as f:
            return float(json.loads(f.read(4096))["until"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    until = now + float(about.get("linger", 0) or 0)
    if notice:
        with contextlib.suppress(OSError):
            write_file_atomically(os.path.join(control, EXPIRY), json.dumps({"until": until}).encode())
    return until


def list_sets(parent: str, notice: bool = False, count: bool = True) -> list[SetInfo]:
    """This user's shared sets and kept tiers in ``parent`` (a ``<base>/monarch-<uid>``); their
    files and bytes counted (a walk of each) only with ``count``."""
    out = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return out
    now = time.time()
    for name in names:
        path = os.path.join(parent, name)
        if name.startswith(PREFIX):
            control = os.path.join(path, CONTROL)
            try:
                check_private_dir(path)
            except Exception:
                continue
            jobs = len(_live_leases(control))
            about = _about(control)
            files, nbytes = _sweep(path, lambda size: size) if count else (0, 0)
            out.append(SetInfo(path, "shared", files, nbytes, jobs, _until(control, jobs, about, now, notice),
                               about.get("roots", [])))
        elif name.startswith("keep-") and os.path.isdir(path) and not os.path.islink(path):
            jobs = 0
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(path, KEEP_LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    jobs = 0 if _lock(fd, wait=False) else 1
                finally:
                    os.close(fd)
            files, nbytes = _sweep(path, lambda size: size) if count else (0, 0)
            out.append(SetInfo(path, "kept", files, nbytes, jobs, None, []))
    return out


def drop_set(path: str) -> str | None:
    """Remove a shared set or kept tier no job uses; None, or why it stays."""
    name = os.path.basename(path)
    if name.startswith(PREFIX):
        try:
            with _joining(path) as control:
                jobs = _live_leases(control)
                if jobs:
                    return f"in use by {len(jobs)} running job(s) ({', '.join(sorted(jobs))})"
                _remove(path)
        except FileNotFoundError:
            return None
        return None
    fd = open_private_file(os.path.join(path, KEEP_LOCK))
    try:
        if not _lock(fd, wait=False):
            return "in use by a running job"
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)
    return None


def drop_expired(parent: str, skip: str | None = None) -> list[str]:
    """Remove the shared sets in ``parent`` whose linger is over (never ``skip``); their paths."""
    gone = []
    now = time.time()
    for info in list_sets(parent, notice=True, count=False):
        if info.kind == "shared" and info.path != skip and info.until is not None and info.until <= now:
            if drop_set(info.path) is None:
                gone.append(info.path)
                log.info("removed %s: its linger ended %s", info.path, time.ctime(info.until))
    return gone
