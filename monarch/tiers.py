"""Node-local storage tiers: a private directory with a capacity, and the accounts for it.

Space is reserved before a copy starts and released if it fails, so concurrent
stagers never overfill a tier. Nothing is ever evicted (pin, don't thrash). A tier whose
filesystem runs out of space (ENOSPC, EDQUOT) is marked full and not tried again.
"""

from __future__ import annotations

import errno
import os
import secrets
import threading
from typing import Callable

from monarch.config import TierConfig
from monarch.layout import MARKER, KEEP_LOCK, StorageDir
from monarch.secure import create_exclusive
from monarch.snapshot import FileInfo

TMP_PREFIX = ".monarch-tmp-"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class Tier:
    def __init__(self, name: str, storage: StorageDir, capacity: int, slot: int):
        self.name, self.storage, self.capacity, self.slot = name, storage, capacity, slot
        self.path = storage.path
        self._used = 0
        self._lock = threading.Lock()
        self.files = 0
        self.full_reason: str | None = None  # set once the filesystem refused a copy

    @classmethod
    def from_config(cls, cfg: TierConfig, slot: int, run_id: str, node: int, roots: tuple[str, ...]) -> "Tier":
        storage = StorageDir.create(cfg.path, run_id, node, keep_name=cfg.name if cfg.keep else None, roots=roots)
        return cls(cfg.name, storage, cfg.capacity, slot)

    @property
    def keep(self) -> bool:
        return self.storage.kept

    @property
    def used(self) -> int:
        return self._used

    def path_for(self, key: str) -> str:
        return os.path.join(self.path, key)

    def reserve(self, size: int) -> bool:
        with self._lock:
            if self.full_reason is not None or self._used + size > self.capacity:
                return False
            self._used += size
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self._used -= size

    def mark_full(self, reason: str) -> None:
        with self._lock:
            self.full_reason = reason

    def committed(self) -> None:
        with self._lock:
            self.files += 1

    def adopt_existing(self, files: dict[str, FileInfo]) -> list[str]:
        """Count the copies a kept tier holds from an earlier run of this dataset; remove
        the ones that no longer match the snapshot (size and mtime) and partial ones."""
        adopted = []
        for dirpath, _, names in os.walk(self.path):
            for name in names:
                full = os.path.join(dirpath, name)
                key = os.path.relpath(full, self.path)
                if key in (MARKER, KEEP_LOCK):
                    continue
                info = files.get(key)
                try:
                    st = os.lstat(full)
                    fresh = (info is not None and not name.startswith(TMP_PREFIX) and os.path.isfile(full)
                             and not os.path.islink(full) and info.same_content_as(st))
                    if fresh and self.reserve(info.size):
                        self.committed()
                        adopted.append(key)
                    else:
                        os.unlink(full)
                except OSError:
                    continue
        return adopted

    def remove(self) -> None:
        """Delete this run's copies (a kept tier stays for the next run of the dataset)."""
        self.storage.remove()

    def describe(self) -> dict:
        return {"name": self.name, "path": self.path, "capacity": self.capacity, "kept": self.keep,
                "used": self._used, "files": self.files, "full": self.full_reason}


def write_atomically(dest: str, fill: Callable[[int], int], mtime_ns: int, mode: int = 0o600,
                     publish: Callable[[str, str], None] = os.replace) -> int:
    """Create ``dest`` through a fresh temporary name in its directory, then rename it in place.

    ``fill(fd)`` writes the temporary file and returns the bytes written. The copy gets
    the source's mtime (a kept tier is checked against the next snapshot by it) and
    ``mode``. A reader sees the whole file or none of it; the temporary name is short, so a
    255-byte name still fits NAME_MAX. ``publish(tmp, dest)`` renames it into place (the
    stager's checks that the key is still wanted go there).
    """
    directory = os.path.dirname(dest)
    tmp = os.path.join(directory, f"{TMP_PREFIX}{secrets.token_hex(8)}")
    try:
        fd = create_exclusive(tmp, mode)
    except FileNotFoundError:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = create_exclusive(tmp, mode)
    try:
        try:
            n = fill(fd)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)
        publish(tmp, dest)
        return n
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
