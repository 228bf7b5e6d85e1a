"""The paths where the job's view differs from the PFS, published to the shim in shared memory.

A stat, an access or a read-only open under a write-back path is answered by the PFS itself
unless the job changed that path (or a directory above it) and the drain has not made the change
on the PFS yet. The shim asks the daemon only for those: the others cost no round trip. This
file tells it which, as a counting Bloom filter the shim maps read-only (shim_writeback.c):

    header: b"MNWBMRK1", u32 slots (a power of two), u32 0
    slots:  u8 counters

A path is marked at two counters chosen by its FNV-1a 64 hash (the low and the high 32 bits);
a listing's children are marked under the directory's path with a "/" appended (no normal path
ends so). A counter that reached 255 stays there: a path whose counters are not all zero is
asked for (a false positive costs one round trip, never a wrong answer). The daemon marks a path
before it answers the call that changed it, and unmarks it only once the PFS shows the change.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading

MAGIC = b"MNWBMRK1"
HEADER = struct.Struct("<8sII")
SLOTS = 1 << 20  # 1 MiB: thousands of pending paths leave nearly every counter zero
STICKY = 255
NAME = "marks"

log = logging.getLogger(__name__)


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class Marks:
    """The area's filter of changed paths, written by the daemon (every method thread-safe)."""

    def __init__(self, path: str, slots: int = SLOTS):
        assert slots & (slots - 1) == 0
        self.path, self._mask = path, slots - 1
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, HEADER.size + slots)
            self._map = mmap.mmap(fd, HEADER.size + slots)
        finally:
            os.close(fd)
        self._map[:HEADER.size] = HEADER.pack(MAGIC, slots, 0)
        self._lock = threading.Lock()

    @classmethod
    def made(cls, area_path: str) -> "Marks | None":
        """The marks of a run's area (None: they cannot be made, said: the shim asks for every path)."""
        try:
            return cls(os.path.join(area_path, NAME))
        except OSError as e:
            log.warning("write-back: no marks of the changed paths in %s (%s): every stat under the write-back "
                        "paths asks the daemon", area_path, e)
            return None

    def _slots(self, key: str) -> tuple[int, int]:
        h = fnv1a64(os.fsencode(key))
        return HEADER.size + (h & self._mask), HEADER.size + ((h >> 32) & self._mask)

    def _count(self, key: str, by: int) -> None:
        for i in set(self._slots(key)):
            v = self._map[i]
            if v != STICKY:
                self._map[i] = min(STICKY, max(0, v + by))

    def add(self, path: str) -> None:
        """``path`` differs from the PFS (and so does its directory's listing)."""
        with self._lock:
            self._count(path, 1)
            self._count(os.path.dirname(path) + "/", 1)

    def remove(self, path: str) -> None:
        """The PFS shows what the job made at ``path`` (each add has one remove)."""
        with self._lock:
            self._count(path, -1)
            self._count(os.path.dirname(path) + "/", -1)

    def marked(self, path: str, children: bool = False) -> bool:
        """Would the shim ask for ``path`` (its listing: ``children``)? (Tests: the shim's own check is in C.)"""
        return all(self._map[i] for i in self._slots(path + "/" if children else path))


class MarkedEntries(dict):
    """The view's entries (path -> entry): a path is marked while it has one."""

    def __init__(self, marks: Marks | None):
        super().__init__()
        self.marks = marks

    def __setitem__(self, path, entry):
        if self.marks is not None and path not in self:
            self.marks.add(path)
        super().__setitem__(path, entry)

    def __delitem__(self, path):
        super().__delitem__(path)
        if self.marks is not None:
            self.marks.remove(path)

    def pop(self, path, *default):
        if path in self:
            entry = super().pop(path)
            if self.marks is not None:
                self.marks.remove(path)
            return entry
        return super().pop(path, *default)


class MarkedDirs(set):
    """The directories the job made that the PFS does not hold yet: marked while here. Changed only
    by ``add``, ``discard`` and ``keep_only``."""

    def __init__(self, marks: Marks | None):
        super().__init__()
        self.marks = marks

    def add(self, path):
        if self.marks is not None and path not in self:
            self.marks.add(path)
        super().add(path)

    def discard(self, path):
        if path in self:
            super().discard(path)
            if self.marks is not None:
                self.marks.remove(path)

    def keep_only(self, paths) -> None:
        """Become ``paths`` (what is new marked, what is gone unmarked)."""
        paths = set(paths)
        for p in [p for p in self if p not in paths]:
            self.discard(p)
        for p in paths:
            self.add(p)
