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

from monarch.codecs import Codec, make_codec
from monarch.config import TierConfig
from monarch.layout import MARKER, KEEP_LOCK, StorageDir
from monarch.secure import create_exclusive
from monarch.snapshot import FileInfo

TMP_PREFIX = ".monarch-tmp-"
COMPRESSED_DIR = ".z"  # compressed copies: <tier>/.z/<key>, where the shim's probe of <tier>/<key> does not look
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class Tier:
    """Capacity is accounted in stored bytes (what the copies take); ``logical`` counts the
    bytes they hold for the application (a compressed copy stores fewer)."""

    def __init__(self, name: str, storage: StorageDir, capacity: int, slot: int, codec: Codec | None = None):
        self.name, self.storage, self.capacity, self.slot = name, storage, capacity, slot
        self.path = storage.path
        self.codec = codec
        self._used = 0
        self._lock = threading.Lock()
        self.files = 0
        self.logical = 0
        self.stored = 0
        self._compressed: set[str] = set()  # keys whose copy is a zstd frame under COMPRESSED_DIR
        self.full_reason: str | None = None  # set once the filesystem refused a copy

    @classmethod
    def from_config(cls, cfg: TierConfig, slot: int, run_id: str, node: int, roots: tuple[str, ...],
                    pfs_rate=lambda: None) -> "Tier":
        storage = StorageDir.create(cfg.path, run_id, node, keep_name=cfg.name if cfg.keep else None, roots=roots)
        return cls(cfg.name, storage, cfg.capacity, slot, make_codec(getattr(cfg, "compression", "off"), pfs_rate))

    @property
    def keep(self) -> bool:
        return self.storage.kept

    @property
    def used(self) -> int:
        return self._used

    def path_for(self, key: str) -> str:
        """Where a raw copy of ``key`` is (the path the shim probes)."""
        return os.path.join(self.path, key)

    def compressed_path_for(self, key: str) -> str:
        return os.path.join(self.path, COMPRESSED_DIR, key)

    def is_compressed(self, key: str) -> bool:
        return key in self._compressed

    def copy_path(self, key: str) -> str:
        """Where the copy of ``key`` this tier holds is, compressed or raw."""
        return self.compressed_path_for(key) if key in self._compressed else self.path_for(key)

    def fits(self, size: int) -> bool:
        """Could a file of ``size`` logical bytes fit now (compressed tiers: as expected from
        the ratio so far)?"""
        need = self.codec.estimate(size) if self.codec is not None and self.codec.wants(size) else size
        return self.full_reason is None and self._used + need <= self.capacity

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

    def committed(self, logical: int = 0, stored: int = 0, key: str | None = None, compressed: bool = False) -> None:
        """A copy of ``logical`` bytes, taking ``stored`` bytes, was published (under the
        stager's lock when ``key`` is given: ``is_compressed`` must agree with the file)."""
        with self._lock:
            self.files += 1
            self.logical += logical
            self.stored += stored
            if compressed and key is not None:
                self._compressed.add(key)

    def forget(self, key: str, logical: int, stored: int) -> None:
        """The copy of ``key`` was deleted (its stored bytes are released separately)."""
        with self._lock:
            self.files -= 1
            self.logical -= logical
            self.stored -= stored
            self._compressed.discard(key)

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
                        self.committed(info.size, info.size)
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
        with self._lock:
            out = {"name": self.name, "path": self.path, "capacity": self.capacity, "kept": self.keep,
                   "used": self._used, "files": self.files, "full": self.full_reason,
                   "logical_bytes": self.logical, "stored_bytes": self.stored,
                   "ratio": round(self.logical / self.stored, 3) if self.stored else 1.0,
                   "compressed_files": len(self._compressed)}
        out["compression"] = self.codec.describe() if self.codec is not None else {"mode": "off"}
        return out


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
