"""The stager: copies dataset files from the PFS into the fastest tier with room.

A pool of I/O threads; one flight per file (concurrent requests share one copy);
space reserved before the copy; nothing evicted. It counts every byte it reads
from the PFS, because that is the number Monarch exists to minimise.

Correct bytes first: a source is copied only if it is still the file the snapshot saw
(size and mtime of the open descriptor); a key the job wrote to (``invalidate``) is never
staged or served again this run; a file that failed once is not retried on every open;
a tier whose filesystem is full is marked so and the next one is tried.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from monarch.secure import owner_only
from monarch.snapshot import Snapshot
from monarch.tiers import NO_SPACE, Tier, write_atomically

log = logging.getLogger(__name__)

CHUNK = 4 << 20


class SourceChanged(OSError):
    """The source is no longer the file the snapshot saw."""


class Invalidated(Exception):
    """The job wrote to the key while it was being copied: the copy is dropped."""


class Stager:
    def __init__(self, snapshot: Snapshot, tiers: list[Tier], threads: int):
        self.snapshot = snapshot
        self.tiers = tiers
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="monarch-stage")
        self._lock = threading.Lock()
        self._flights: dict[str, Future] = {}
        self.staged: dict[str, Tier] = {}  # key -> tier holding its complete copy
        self.failures: collections.Counter[str] = collections.Counter()
        self._unstageable: set[str] = set()  # answered "PFS" at once from now on, counted once
        self._dirty: set[str] = set()  # keys (files or directories) the job wrote to
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
            if tier is not None or flight is not None or key in self._unstageable or self._is_dirty(key):
                if flight is None:
                    flight = Future()
                    flight.set_result(tier)
                return flight
            flight = self._pool.submit(self._stage, key)
            self._flights[key] = flight
            return flight

    # -- the job's writes ------------------------------------------------------------------
    def _is_dirty(self, key: str) -> bool:
        if not self._dirty:
            return False
        parts = key.split("/")
        return any("/".join(parts[:i]) in self._dirty for i in range(2, len(parts) + 1))

    def invalidate(self, key: str) -> int:
        """The job writes to ``key`` (a file, or a directory and all under it): drop its
        copies now and never stage it again this run. Returns how many copies went."""
        prefix = key.rstrip("/") + "/"
        with self._lock:
            self._dirty.add(key.rstrip("/"))
            gone = [k for k in self.staged if k == key or k.startswith(prefix)] if len(self.staged) else []
            for k in gone:
                tier = self.staged.pop(k)
                path = tier.path_for(k)
                try:
                    size = os.stat(path).st_size
                    os.unlink(path)
                    tier.release(size)
                except OSError:
                    pass
        return len(gone)

    def mark_changed(self, key: str) -> None:
        """The source changed since the snapshot (found by a check at open): drop the copy."""
        self.invalidate(key)
        with self._lock:
            self.failures["changed_since_snapshot"] += 1

    # -- copying -------------------------------------------------------------------------------
    def _stage(self, key: str) -> Tier | None:
        try:
            return self._copy(key)
        except Invalidated:
            with self._lock:
                self.failures["written_by_job"] += 1
            return None
        except Exception as e:  # a failed copy leaves the file on the PFS, never fails the app
            reason = "changed_since_snapshot" if isinstance(e, SourceChanged) else f"io_error:{type(e).__name__}"
            log.warning("staging %s failed: %s", key, e)
            with self._lock:
                self.failures[reason] += 1
                self._unstageable.add(key)
            return None
        finally:
            with self._lock:
                self._flights.pop(key, None)

    def _copy(self, key: str) -> Tier | None:
        info = self.snapshot.get(key)
        if info is None:
            return self._give_up(key, "not_in_snapshot")
        for tier in self.tiers:
            if not tier.reserve(info.size):
                continue
            try:
                n = write_atomically(tier.path_for(key), lambda fd: self._read_pfs(key, fd), info.mtime_ns,
                                     owner_only(info.mode), publish=lambda tmp, dest: self._publish(key, tmp, dest))
            except OSError as e:
                tier.release(info.size)
                if e.errno in NO_SPACE:
                    tier.mark_full(f"{errno.errorcode.get(e.errno, e.errno)} after {tier.used} bytes")
                    log.warning("tier %s is full (%s); staging goes to the next tier", tier.name, e.strerror)
                    continue
                raise
            except BaseException:
                tier.release(info.size)
                raise
            tier.committed()
            with self._lock:
                self.staged[key] = tier
                self.bytes_staged += n
                self.files_staged += 1
            return tier
        return self._give_up(key, "no_room")

    def _give_up(self, key: str, reason: str) -> None:
        with self._lock:
            self.failures[reason] += 1
            self._unstageable.add(key)
        return None

    def _publish(self, key: str, tmp: str, dest: str) -> None:
        with self._lock:  # invalidate() holds it too: a copy never appears after a write
            if self._is_dirty(key):
                raise Invalidated(key)
            os.replace(tmp, dest)

    def _read_pfs(self, key: str, out: int) -> int:
        """Copy the source into ``out``, counting every byte read from the PFS as it is read
        (sendfile would hide what it read before a failed write, e.g. on a full tier)."""
        n = 0
        info = self.snapshot.get(key)
        src = os.open(self.snapshot.source_path(key), os.O_RDONLY | os.O_CLOEXEC)
        try:
            if not info.same_content_as(os.fstat(src)):
                raise SourceChanged(errno.ESTALE, "the file changed since the dataset snapshot; it is read from the PFS")
            with self._lock:
                self.pfs_files += 1
            buf = bytearray(min(CHUNK, max(info.size, 1) + 1))
            view = memoryview(buf)
            while True:
                got = os.readv(src, [buf])
                if got == 0:
                    break
                with self._lock:
                    self.pfs_bytes += got
                n += got
                written = 0
                while written < got:
                    written += os.write(out, view[written:got])
        finally:
            os.close(src)
        if n != info.size:
            raise SourceChanged(errno.ESTALE, f"read {n} bytes, the snapshot saw {info.size}")
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
