"""Where staged bytes come from: one small interface, and the PFS and a peer node behind it.

"Source" means only this: where a copy is copied from. Where an application's open was
served from (a tier, a peer's copy, the PFS) is ``opened_from`` (the shim's counters, the report).

A source copies one key's bytes into a descriptor the stager opened (a temporary file that
``tiers.write_atomically`` publishes) and returns the number of bytes it wrote. Everything
else — priorities, concurrency, single flight, reservations, the atomic publish, the checks
against the job's writes and the byte accounting — lives once, in the stager, for every
source. A source reports what it reads through a ``Tally`` so the stager can count it even
when the copy fails half-way (the PFS bytes are the number Monarch exists to minimise).

Correct bytes first: the PFS source copies a file only if its open descriptor still has the
size and mtime the snapshot saw, and reads exactly that size (else ``SourceChanged``). It
opens each file relative to its directory and, where the filesystem refreshes attributes
at open, checks those (monarch/node/snapshot/pfsmeta.py): one metadata operation per file, not one per
path component plus a getattr.
"""

from __future__ import annotations

import abc
import errno
import logging
import os
import stat
import threading
import time
from typing import Protocol

from monarch.errors import PeerError
from monarch.node.snapshot.pfsmeta import DirFds, checked_stat
from monarch.node.snapshot.snapshot import FileInfo, Snapshot
from monarch.routes import read_in_ranges

log = logging.getLogger(__name__)

CHUNK = 4 << 20  # bytes per read
OPEN_SOURCE = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY  # see PFSSource._open

# A large file is copied in ranges read at once, so that one file is not bound by the
# latency of one read after another (a PFS serves a single stream far below its bandwidth).
RANGE = 8 << 20       # bytes per range
RANGES_AT_ONCE = 8    # ranges of one file in flight, the copying thread included
# the node's extra range readers at once (each holds a RANGE buffer: 128 MiB in all)
_range_readers = threading.BoundedSemaphore(16)


class SourceChanged(OSError):
    """The source is no longer the file the snapshot saw."""


class Tally(Protocol):
    """What a source tells the stager while it copies (thread-safe on the stager's side)."""

    def opened(self) -> None: ...          # one more file read from this source
    def read(self, nbytes: int) -> None: ...  # bytes read from this source


class Source(abc.ABC):
    """A place the stager copies a key from."""

    name: str = "source"

    def available(self, key: str) -> str | None:
        """None if this source may be asked for ``key`` now, else why not (a short reason)."""
        return None

    @abc.abstractmethod
    def copy(self, key: str, info: FileInfo, out, tally: Tally) -> int:
        """Write ``key``'s bytes into ``out``, a descriptor (or, for the PFS, a writable
        buffer such as ``io.BytesIO``: the stager compresses from it); return how many. Raises
        ``SourceChanged``, ``PeerError`` or ``OSError`` when it cannot."""


class PFSSource(Source):
    """The dataset's own files, where the snapshot found them."""

    name = "pfs"

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self.dirs = DirFds(snapshot)

    def _open(self, key: str) -> tuple[int, bool]:
        """The source's descriptor, and whether its attributes are fresh from the open.

        Opened O_NONBLOCK: a FIFO (or a device) swapped in for the file opens at once
        instead of blocking the copy, and the daemon's exit, for ever; ``copy`` refuses
        anything but a regular file, and reads a regular one as any reader would."""
        with self.dirs.parent_of(key) as (dir_fd, name, fresh):
            if dir_fd is None:
                return os.open(self.snapshot.source_path(key), OPEN_SOURCE), False
            return os.open(name, OPEN_SOURCE, dir_fd=dir_fd), fresh

    def forget(self, key: str) -> None:
        """The job changed ``key``: directory descriptors under it are opened afresh."""
        self.dirs.forget(key)

    def close(self) -> None:
        self.dirs.close()

    def copy(self, key: str, info: FileInfo, out: int, tally: Tally) -> int:
        src, fresh = self._open(key)
        try:
            st = checked_stat(src, fresh)
            if not stat.S_ISREG(st.st_mode):
                raise SourceChanged(errno.ESTALE, "no longer a regular file (a FIFO, a device?) since the dataset "
                                                  "snapshot; it is read from the PFS")
            if not info.same_content_as(st):
                raise SourceChanged(errno.ESTALE, "the file changed since the dataset snapshot; it is read from the PFS")
            os.set_blocking(src, True)
            tally.opened()
            if isinstance(out, int) and read_in_ranges(info.size):
                n = _copy_ranges(src, out, info.size, tally)
            else:
                n = _copy_stream(src, out, info.size, tally)
        finally:
            os.close(src)
        if n != info.size:
            raise SourceChanged(errno.ESTALE, f"read {n} bytes, the snapshot saw {info.size}")
        return n


def _write_at(out: int, view: memoryview, offset: int | None) -> None:
    written = 0
    while written < len(view):
        rest = view[written:]
        written += os.write(out, rest) if offset is None else os.pwrite(out, rest, offset + written)


def _copy_stream(src: int, out, size: int, tally: Tally) -> int:
    """Read ``src`` to its end into ``out`` (a descriptor, or a buffer the stager compresses
    from); ``size`` is what the snapshot saw (a file found longer is read on, and refused
    by the caller). Read, then write: every byte read is counted, even when the write fails
    (a full tier); sendfile would hide what it read before failing."""
    buf = bytearray(min(CHUNK, size + 1))
    view = memoryview(buf)
    n = 0
    while True:
        got = os.readv(src, [buf])
        if got == 0:
            return n
        tally.read(got)
        n += got
        if isinstance(out, int):
            _write_at(out, view[:got], None)
        else:
            out.write(view[:got])
        if n == size and got < len(buf):
            return n  # a short read at the expected size is the end: no read round trip to see 0


def _copy_ranges(src: int, out: int, size: int, tally: Tally) -> int:
    """Copy ``size`` bytes of ``src`` into ``out`` in RANGE-sized ranges, up to
    RANGES_AT_ONCE read at once (the calling thread always, the others as the node's
    range readers allow); then check that the file ends there. Returns the bytes read."""
    offsets = iter(range(0, size, RANGE))
    lock = threading.Lock()
    total = [0]
    failed: list[BaseException] = []

    def reader() -> None:
        buf = bytearray(min(RANGE, size))
        while True:
            with lock:
                offset = None if failed else next(offsets, None)
            if offset is None:
                return
            want = min(RANGE, size - offset)
            view = memoryview(buf)[:want]
            got = 0
            try:
                while got < want:
                    n = os.preadv(src, [view[got:]], offset + got)
                    if n == 0:
                        break  # shorter than the snapshot said: counted, then refused below
                    tally.read(n)
                    got += n
                _write_at(out, view[:got], offset)
            except BaseException as e:
                with lock:
                    failed.append(e)
                return
            with lock:
                total[0] += got

    def helper() -> None:
        try:
            reader()
        finally:
            _range_readers.release()

    threads = []
    for _ in range(min(RANGES_AT_ONCE, -(-size // RANGE)) - 1):
        if not _range_readers.acquire(blocking=False):
            break
        t = threading.Thread(target=helper, name="monarch-range", daemon=True)
        t.start()
        threads.append(t)
    reader()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    extra = len(os.pread(src, 1, size))  # a file that grew is not the snapshot's
    if extra:
        tally.read(extra)
    return total[0] + extra


class PeerSource(Source):
    """The node that owns a key (``cluster.owner``), through the cluster's ``fetch``.

    A peer that timed out once is not asked again this job (its keys come from the PFS
    here instead); a peer that refused or failed quickly is asked again for other keys.
    ``timeout`` None (a sharded cluster's peer cache): no peer is given up here, nor its
    failure logged (a lost owner's keys get a new owner from the cluster; the caller says why).
    """

    name = "peer"

    def __init__(self, cluster, timeout: float | None):
        self.cluster = cluster
        self.timeout = timeout
        self._down: set[int] = set()
        self._lock = threading.Lock()

    def owns_elsewhere(self, key: str) -> bool:
        """Is ``key`` owned by another node (so that this source is the first to try)?"""
        return self.cluster.owner(key) != self.cluster.node

    def available(self, key: str) -> str | None:
        return "peer_down" if self.cluster.owner(key) in self._down else None

    def copy(self, key: str, info: FileInfo, out: int, tally: Tally) -> int:
        owner = self.cluster.owner(key)
        t0 = time.monotonic()
        try:
            n = self.cluster.fetch(owner, key, out, info.size)
        except PeerError as e:
            if self.timeout is None:
                raise
            if time.monotonic() - t0 >= self.timeout:
                with self._lock:
                    self._down.add(owner)
                log.warning("node %d timed out: its files are staged locally from now on (%s)", owner, e)
            else:
                log.warning("fetching %s from node %d failed: %s", key, owner, e)
            raise
        tally.opened()
        tally.read(n)
        if n != info.size:
            raise SourceChanged(errno.ESTALE, f"node {owner} sent {n} bytes, the snapshot saw {info.size}")
        return n
