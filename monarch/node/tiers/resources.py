"""What the node has: memory and free space, read when the daemon starts and while it runs.

A tier's ``capacity`` may be a share of the node (``50%``): of the available memory for a
tier on a memory-backed filesystem (tmpfs, ramfs: ``/dev/shm``), of the free space of its
filesystem for a disk tier. And a memory-backed tier never takes a file that would leave
the node less available memory than ``memory_margin`` (:class:`MemoryGuard`): the
application and its framework need that memory more than a cache does.
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

log = logging.getLogger(__name__)

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MEMORY_READING_MAX_AGE = 0.5  # seconds a psutil reading of available memory is reused


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem holding ``path`` (``tmpfs``, ``ext4``...), None if unknown."""
    path = os.path.realpath(path)
    best, fstype = "", None
    try:
        partitions = psutil.disk_partitions(all=True)
    except (OSError, RuntimeError):
        return None
    for part in partitions:
        mount = part.mountpoint.rstrip("/") or "/"
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, fstype = mount, part.fstype
    return fstype


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
    """``share`` (0..1] of what the node has for a tier at ``path``, and what it was a share of."""
    if is_memory_backed(path):
        whole, what = available_memory(), "available memory"
    else:
        whole, what = free_space(path), f"free space on {path}"
    return int(whole * share), what


def margin_bytes(size: int, share: float | None) -> int:
    """The memory margin in bytes: a fixed size, or a share of the node's total memory."""
    return size if share is None else int(total_memory() * share)


class MemoryGuard:
    """Says whether a memory-backed tier may take ``size`` more bytes without leaving the node
    less than ``margin`` bytes of available memory.

    Reading the node's memory costs a ``/proc/meminfo`` parse, so a reading is reused for
    ``max_age`` seconds; the bytes allowed since that reading are subtracted from it (copies
    in flight have not shown up in it yet), so a burst of reservations cannot overshoot.
    """

    def __init__(self, margin: int, max_age: float = MEMORY_READING_MAX_AGE,
                 read_available: Callable[[], int] = available_memory):
        self.margin = margin
        self.max_age = max_age
        self._read = read_available
        self._lock = threading.Lock()
        self._available = 0
        self._read_at = float("-inf")
        self._allowed_since = 0

    def allows(self, size: int) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at > self.max_age:
                self._available = self._read()
                self._read_at = now
                self._allowed_since = 0
            if self._available - self._allowed_since - size < self.margin:
                return False
            self._allowed_since += size
            return True

    def describe(self) -> dict:
        with self._lock:
            return {"margin": self.margin, "available": self._available}
