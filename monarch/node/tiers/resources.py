"""What the node has: memory and free space, read when the daemon starts and while it runs.

A tier's ``capacity`` may be a share of the node (``50%``): of the available memory for a
tier on a memory-backed filesystem (tmpfs, ramfs: ``/dev/shm``), or of that filesystem's free
space where it has less (a container's 64 MiB ``/dev/shm``); of the free space of its
filesystem for a disk tier. A memory-backed tier never takes a file that would leave the
node less available memory than ``memory_margin`` (:class:`MemoryGuard`), and no tier takes
one that would leave its filesystem less free space than ``filesystem_reserve``
(:class:`FilesystemGuard`): the application and its framework need that room (their
semaphores and shared-memory batches live in ``/dev/shm``) more than a cache does.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from typing import Callable

import psutil

from monarch.sizes import allocated_size  # noqa: F401 (the tiers' and tests' name for it here)
from monarch.sizes import human

log = logging.getLogger(__name__)

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MEMORY_READING_MAX_AGE = 0.5  # seconds a psutil reading of available memory is reused
FILESYSTEM_READING_MAX_AGE = 0.5  # seconds a statvfs reading of a tier's free space is reused


def mount_of(path: str) -> tuple[str | None, str | None]:
    """The mount point holding ``path`` and its filesystem's type (``tmpfs``, ``ext4``...), None if unknown."""
    path = os.path.realpath(path)
    best, fstype = None, None
    try:
        partitions = psutil.disk_partitions(all=True)
    except (OSError, RuntimeError):
        return None, None
    for part in partitions:
        mount = part.mountpoint.rstrip("/") or "/"
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best or ""):
            best, fstype = mount, part.fstype
    return best, fstype


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem holding ``path`` (``tmpfs``, ``ext4``...), None if unknown."""
    return mount_of(path)[1]


def is_memory_backed(path: str) -> bool:
    """Do files under ``path`` live in the node's memory (tmpfs, ramfs)?"""
    return filesystem_type(path) in MEMORY_FILESYSTEMS


def available_memory() -> int:
    return int(psutil.virtual_memory().available)


def total_memory() -> int:
    return int(psutil.virtual_memory().total)


def free_space(path: str) -> int:
    """Bytes an unprivileged user may still write on the filesystem of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def filesystem_size(path: str) -> int:
    """The size of the filesystem of ``path`` (``df``'s size: a tmpfs's ``size=``)."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def allocation_unit(path: str) -> int:
    """The bytes a file on the filesystem of ``path`` is allocated in: its fundamental block
    size (``statvfs`` ``f_frsize``: 4 KiB on ext4 and XFS as made by default; the page size on
    tmpfs), or the page size when the filesystem does not say."""
    try:
        st = os.statvfs(path)
    except OSError:
        return mmap.PAGESIZE
    return st.f_frsize or st.f_bsize or mmap.PAGESIZE


def share_of_node(path: str, share: float) -> tuple[int, str]:
    """``share`` (0..1] of what the node has for a tier at ``path``, and what it was a share of.
    A tmpfs smaller than the node's memory (a container's ``/dev/shm``) holds no more than its
    own free space, whatever the memory."""
    if is_memory_backed(path):
        whole, what = available_memory(), "available memory"
        room = free_space(path)
        if room < whole:
            whole, what = room, f"free space on {path} (less than the available memory)"
    else:
        whole, what = free_space(path), f"free space on {path}"
    return int(whole * share), what


def reserve_bytes(path: str, size: int, share: float | None) -> tuple[int, str]:
    """The ``filesystem_reserve`` of the filesystem of ``path`` in bytes (a fixed size, or a
    share of the filesystem's size), and where it came from, for the report."""
    mount = mount_of(path)[0] or path
    if share is None:
        return size, f"{human(size)} (filesystem_reserve) on {mount}"
    total = filesystem_size(path)
    return int(total * share), f"{share:.0%} of the {human(total)} of {mount} (filesystem_reserve)"


def margin_bytes(size: int, share: float | None) -> int:
    """The memory margin in bytes: a fixed size, or a share of the node's total memory."""
    return size if share is None else int(total_memory() * share)


class RoomGuard:
    """Says whether ``size`` more bytes may be taken without leaving less than ``floor`` bytes
    of what ``read()`` says is left.

    A reading costs a system call or a file parse, so it is reused for ``max_age`` seconds;
    the bytes allowed since that reading are subtracted from it (copies in flight have not
    shown up in it yet), so a burst of reservations cannot overshoot. Room reserved before a
    reading and written only after it (room lent ahead to the front door) is not seen: at most
    a lease; on its own, a tier never takes more than its capacity, which the filesystem's
    reserve cuts to what the filesystem holds beside it.
    """

    def __init__(self, floor: int, read: Callable[[], int], max_age: float):
        self.floor = floor
        self.max_age = max_age
        self._read = read
        self._lock = threading.Lock()
        self._available = 0
        self._read_at = float("-inf")
        self._allowed_since = 0

    def _left_locked(self) -> int:
        now = time.monotonic()
        if now - self._read_at > self.max_age:
            self._available = self._read()
            self._read_at = now
            self._allowed_since = 0
        return self._available - self._allowed_since - self.floor

    def allows(self, size: int) -> bool:
        with self._lock:
            if self._left_locked() - size < 0:
                return False
            self._allowed_since += size
            return True

    def not_taken(self, size: int) -> None:
        """``size`` bytes just allowed were not taken after all (another guard refused them)."""
        with self._lock:
            self._allowed_since = max(0, self._allowed_since - size)

    def headroom(self) -> int:
        """The most ``allows`` would say yes to now."""
        with self._lock:
            return max(0, self._left_locked())


class MemoryGuard(RoomGuard):
    """Says whether a memory-backed tier may take ``size`` more bytes without leaving the node
    less than ``margin`` bytes of available memory (a reading is a ``/proc/meminfo`` parse)."""

    def __init__(self, margin: int, max_age: float = MEMORY_READING_MAX_AGE,
                 read_available: Callable[[], int] = available_memory):
        super().__init__(margin, read_available, max_age)

    @property
    def margin(self) -> int:
        return self.floor

    def describe(self) -> dict:
        with self._lock:
            return {"margin": self.floor, "available": self._available}


class FilesystemGuard(RoomGuard):
    """Says whether a tier may take ``size`` more bytes without leaving its filesystem less than
    ``reserve`` bytes free (``statvfs``: what an unprivileged user may still write), whoever
    fills it: the application, other jobs, other tiers. ``whence`` says where the reserve
    came from, for the report."""

    def __init__(self, path: str, reserve: int, whence: str = "", max_age: float = FILESYSTEM_READING_MAX_AGE,
                 read_free: Callable[[], int] | None = None):
        super().__init__(reserve, read_free or (lambda: _free_or_none(path)), max_age)
        self.path, self.whence = path, whence
        self.at_start: int | None = None  # the free space when the tier was made (read_at_start)

    @property
    def reserve(self) -> int:
        return self.floor

    def read_at_start(self, tier: str) -> int:
        """The filesystem's free space now, kept as ``at_start``: a tier whose filesystem has no
        more free than the reserve when it is made takes no file, and says so."""
        with self._lock:
            self._left_locked()
            self.at_start = self._available
        if self.at_start <= self.floor:
            log.warning("tier %s: takes no file: its filesystem has %d bytes free, within the application's "
                        "reserve of %d bytes, %s", tier, self.at_start, self.floor, self.whence)
        return self.at_start

    def describe(self) -> dict:
        with self._lock:
            return {"reserve": self.floor, "from": self.whence, "free": self._available}


def _free_or_none(path: str) -> int:
    """The free space on the filesystem of ``path``; none when it cannot be read (the tier's
    directory went, at the end): the tier then takes nothing more."""
    try:
        return free_space(path)
    except OSError:
        return 0
