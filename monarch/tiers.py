"""Node-local storage tiers: a directory with a capacity, and the accounts for it.

Space is reserved before a copy starts and released if it fails, so concurrent
stagers never overfill a tier. Nothing is ever evicted (pin, don't thrash).
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Callable

from monarch.config import TierConfig
from monarch.snapshot import FileInfo

TMP_PREFIX = ".monarch-tmp-"


class Tier:
    def __init__(self, name: str, path: str, capacity: int, slot: int, keep: bool = False):
        self.name, self.path, self.capacity, self.slot, self.keep = name, path, capacity, slot, keep
        self._used = 0
        self._lock = threading.Lock()
        self.files = 0
        self._created: list[str] = []  # directories prepare() made, deepest first, for remove()

    @classmethod
    def from_config(cls, cfg: TierConfig, slot: int) -> "Tier":
        return cls(cfg.name, cfg.path, cfg.capacity, slot, cfg.keep)

    @property
    def used(self) -> int:
        return self._used

    def path_for(self, key: str) -> str:
        return os.path.join(self.path, key)

    def reserve(self, size: int) -> bool:
        with self._lock:
            if self._used + size > self.capacity:
                return False
            self._used += size
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self._used -= size

    def committed(self) -> None:
        with self._lock:
            self.files += 1

    def prepare(self) -> None:
        missing, d = [], self.path
        while not os.path.exists(d):
            missing.append(d)
            d = os.path.dirname(d)
        os.makedirs(self.path, exist_ok=True)
        self._created = missing

    def adopt_existing(self, files: dict[str, FileInfo]) -> list[str]:
        """Count copies a kept tier holds from an earlier job; drop stale and partial ones."""
        adopted = []
        for dirpath, _, names in os.walk(self.path):
            for name in names:
                full = os.path.join(dirpath, name)
                key = os.path.relpath(full, self.path)
                info = files.get(key)
                try:
                    st = os.stat(full)
                    fresh = (info is not None and not name.startswith(TMP_PREFIX)
                             and st.st_size == info.size and st.st_mtime_ns == info.mtime_ns)
                    if fresh and self.reserve(info.size):
                        self.committed()
                        adopted.append(key)
                    else:
                        os.unlink(full)
                except OSError:
                    continue
        return adopted

    def remove(self) -> None:
        """Delete the tier and the empty directories prepare() made for it (one job, one namespace)."""
        shutil.rmtree(self.path, ignore_errors=True)
        for d in self._created[1:]:
            try:
                os.rmdir(d)
            except OSError:
                break  # not empty: another node's or job's tier lives there

    def describe(self) -> dict:
        return {"name": self.name, "path": self.path, "capacity": self.capacity,
                "used": self._used, "files": self.files}


def write_atomically(dest: str, fill: Callable[[str], int], mtime_ns: int) -> int:
    """Create ``dest`` through a temporary name in its directory, then rename it in place.

    ``fill(tmp_path)`` creates and writes the temporary file (making its directory if
    missing) and returns the bytes written; the copy
    gets the source's mtime so a kept tier can be checked against the next snapshot.
    A reader therefore sees the whole file or none of it.
    """
    directory = os.path.dirname(dest)
    tmp = os.path.join(directory, f"{TMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{os.path.basename(dest)}")
    try:
        n = fill(tmp)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, dest)
        return n
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
