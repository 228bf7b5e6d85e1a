"""Where staged bytes come from: one small interface, and the PFS and a peer node behind it.

A source copies one key's bytes into a descriptor the stager opened (a temporary file that
``tiers.write_atomically`` publishes) and returns the number of bytes it wrote. Everything
else — priorities, concurrency, single flight, reservations, the atomic publish, the checks
against the job's writes and the byte accounting — lives once, in the stager, for every
source. A source reports what it reads through a ``Tally`` so the stager can count it even
when the copy fails half-way (the PFS bytes are the number Monarch exists to minimise).

Correct bytes first: the PFS source copies a file only if its open descriptor still has the
size and mtime the snapshot saw, and reads exactly that size (else ``SourceChanged``). It
opens each file relative to its directory and checks the attributes the open fetched
(monarch/pfsmeta.py): one metadata operation per file, not one per path component plus a
getattr.
"""

from __future__ import annotations

import abc
import errno
import logging
import os
import threading
import time
from typing import Protocol

from monarch.errors import PeerError
from monarch.pfsmeta import DirFds, opened_stat
from monarch.snapshot import FileInfo, Snapshot

log = logging.getLogger(__name__)

CHUNK = 4 << 20  # bytes per read


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

    def _open(self, key: str) -> int:
        with self.dirs.parent_of(key) as (dir_fd, name):
            if dir_fd is None:
                return os.open(self.snapshot.source_path(key), os.O_RDONLY | os.O_CLOEXEC)
            return os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)

    def forget(self, key: str) -> None:
        """The job changed ``key``: directory descriptors under it are opened afresh."""
        self.dirs.forget(key)

    def close(self) -> None:
        self.dirs.close()

    def copy(self, key: str, info: FileInfo, out: int, tally: Tally) -> int:
        src = self._open(key)
        try:
            if not info.same_content_as(opened_stat(src)):
                raise SourceChanged(errno.ESTALE, "the file changed since the dataset snapshot; it is read from the PFS")
            tally.opened()
            # read, then write: every byte read is counted, even when the write fails (a full
            # tier); sendfile would hide what it read before failing
            buf = bytearray(min(CHUNK, info.size + 1))
            view = memoryview(buf)
            n = 0
            while True:
                got = os.readv(src, [buf])
                if got == 0:
                    break
                tally.read(got)
                n += got
                if not isinstance(out, int):  # a buffer the stager compresses from
                    out.write(view[:got])
                    continue
                written = 0
                while written < got:
                    written += os.write(out, view[written:got])
        finally:
            os.close(src)
        if n != info.size:
            raise SourceChanged(errno.ESTALE, f"read {n} bytes, the snapshot saw {info.size}")
        return n


class PeerSource(Source):
    """The node that owns a key (``cluster.owner``), through the cluster's ``fetch``.

    A peer that timed out once is not asked again this job (its keys come from the PFS
    here instead); a peer that refused or failed quickly is asked again for other keys.
    """

    name = "peer"

    def __init__(self, cluster, timeout: float):
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
            n = self.cluster.fetch(owner, key, out)
        except PeerError as e:
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
