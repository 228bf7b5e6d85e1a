"""The stager: copies dataset files from the PFS into the fastest tier with room.

A pool of I/O threads; one flight per file (concurrent requests share one copy);
space reserved before the copy; nothing evicted. It counts every byte it reads
from the PFS, because that is the number Monarch exists to minimise.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from monarch.snapshot import Snapshot
from monarch.tiers import Tier, write_atomically

log = logging.getLogger(__name__)

CHUNK = 4 << 20


class Stager:
    def __init__(self, snapshot: Snapshot, tiers: list[Tier], threads: int):
        self.snapshot = snapshot
        self.tiers = tiers
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="monarch-stage")
        self._lock = threading.Lock()
        self._flights: dict[str, Future] = {}
        self.staged: dict[str, Tier] = {}  # key -> tier holding its complete copy
        self.failures: collections.Counter[str] = collections.Counter()
        self._unstageable: set[str] = set()  # no room or unknown: answered at once, counted once
        self.pfs_bytes = 0
        self.pfs_files = 0
        self.bytes_staged = 0
        self.files_staged = 0

    def adopt(self, key: str, tier: Tier) -> None:
        with self._lock:
            self.staged[key] = tier

    def where(self, key: str) -> Tier | None:
        return self.staged.get(key)

    def ensure(self, key: str) -> Future:
        """A future of the tier that holds ``key`` (None: it stays on the PFS)."""
        with self._lock:
            tier = self.staged.get(key)
            flight = self._flights.get(key)
            if tier is not None or flight is not None or key in self._unstageable:
                if flight is None:
                    flight = Future()
                    flight.set_result(tier)
                return flight
            flight = self._pool.submit(self._stage, key)
            self._flights[key] = flight
            return flight

    def _stage(self, key: str) -> Tier | None:
        try:
            return self._copy(key)
        except Exception as e:  # a failed copy leaves the file on the PFS, never fails the app
            reason = f"io_error:{type(e).__name__}"
            log.warning("staging %s failed: %s", key, e)
            with self._lock:
                self.failures[reason] += 1
            return None
        finally:
            with self._lock:
                self._flights.pop(key, None)

    def _copy(self, key: str) -> Tier | None:
        info = self.snapshot.get(key)
        tier = None if info is None else next((t for t in self.tiers if t.reserve(info.size)), None)
        if tier is None:
            with self._lock:
                self.failures["not_in_snapshot" if info is None else "no_room"] += 1
                self._unstageable.add(key)
            return None
        try:
            n = write_atomically(tier.path_for(key), lambda tmp: self._read_pfs(key, tmp), info.mtime_ns)
        except BaseException:
            tier.release(info.size)
            raise
        if n != info.size:  # the file changed since the snapshot: keep the accounts honest
            tier.release(info.size - n)
        tier.committed()
        with self._lock:
            self.staged[key] = tier
            self.bytes_staged += n
            self.files_staged += 1
        return tier

    def _read_pfs(self, key: str, dest: str) -> int:
        """Copy the source into ``dest`` in the kernel (sendfile), counting every byte read."""
        n = 0
        src = os.open(self.snapshot.source_path(key), os.O_RDONLY | os.O_CLOEXEC)
        try:
            with self._lock:
                self.pfs_files += 1
            out = _create(dest)
            try:
                while True:
                    sent = os.sendfile(out, src, None, CHUNK)
                    if sent == 0:
                        break
                    n += sent
                    with self._lock:
                        self.pfs_bytes += sent
            finally:
                os.close(out)
        finally:
            os.close(src)
        return n

    def prestage(self, keys) -> None:
        """Queue ``keys`` in the background (largest files are not favoured: order is the caller's)."""
        for key in keys:
            self.ensure(key)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._flights)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict:
        with self._lock:
            return {"files": self.files_staged, "bytes": self.bytes_staged,
                    "pfs_files_read": self.pfs_files, "pfs_bytes_read": self.pfs_bytes,
                    "failures": dict(self.failures)}


def _create(path: str) -> int:
    """Open a new file for writing, making its directory only when it is missing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, flags, 0o644)
