"""The requesting side of the peer protocol: copy a file from the node that owns it.

A fetching thread asks for a key (a reply tag of its own, ``transfer.Incoming`` on the
engine thread) and writes what comes into its destination, decompressing a compressed
copy as it comes. It waits at most ``peer_timeout`` for a slow owner (one that answers
pings), ``heartbeat_timeout`` for a silent one, not at all for one down or lost; every
failure is a ``PeerError`` with its ``FailureReason``, counted in ``fetch_failures``.
"""

from __future__ import annotations

import os
import queue
import time
from typing import Callable

import zstandard

from ..errors import FailureReason, PeerError
from . import datapath as dp
from . import transfer
from .counters import PeerCounters
from .engine import Engine
from .liveness import Liveness
from .transfer import FIRST_REPLY_TAG, Incoming
from .tuning import HEARTBEAT, REOWNED_WAIT, Tuning



class Fetcher:
    """This node's fetches: reply tags (engine thread) and the fetching threads' waits."""

    def __init__(self, engine: Engine, tag_ub: int, liveness: Liveness, counters: PeerCounters, tuning: Tuning,
                 reowned: Callable[[str], bool], datapath: dp.DataPath | None = None):
        self._engine = engine
        self._liveness = liveness
        self._counters = counters
        self._tuning = tuning
        self._reowned = reowned      # was the key's first owner lost (a survivor stages it now)?
        self.datapath = datapath     # the C data path: small staged files are fetched through it first
        self._closed = False
        # engine thread
        self._tags: dict[int, Incoming] = {}
        self._next_tag = FIRST_REPLY_TAG
        self._tag_ub = tag_ub

    def close(self) -> None:
        """Later fetches fail at once (not_running)."""
        self._closed = True

    # -- fetching thread ---------------------------------------------------------------
    def _check(self, owner: int, key: str) -> None:
        """Raise the PeerError that a fetch from ``owner`` meets at once (not a peer, not
        running, the owner lost or down)."""
        node, nodes, live = self._tuning.node, self._tuning.nodes, self._liveness
        if not (0 <= owner < nodes) or owner == node:
            raise PeerError(f"fetch {key!r}: node {owner} is not a peer of node {node} of {nodes}",
                            FailureReason.FAILED)
        if not self._engine.running or self._closed:
            raise self._failure(FailureReason.NOT_RUNNING, f"fetch {key!r}: the peer layer is not running")
        if live.is_lost(owner):
            raise self._failure(FailureReason.PEER_LOST, f"fetch {key!r}: node {owner} is lost ({live.why_lost(owner)})")
        if live.is_down(owner):
            raise self._failure(FailureReason.PEER_DOWN, f"fetch {key!r}: node {owner} is not answering")

    def fetch(self, owner: int, key: str, dest: str | int, size: int | None = None) -> int:
        """See ``Cluster.fetch``."""
        self._check(owner, key)
        live = self._liveness
        timeout = self._tuning.peer_timeout
        if self.datapath is not None and size is not None and size <= dp.ONE_MESSAGE_MAX:
            written = self._fetch_direct(owner, key, dest, size)
            if written is not None:
                return written
        if live.lost and self._reowned(key):  # its new owner stages it now, behind its own share: do not wait long
            timeout = min(timeout, REOWNED_WAIT)
        xfer = Incoming(self._engine, owner, key, self._tuning.chunk_size, self._tuning.window,
                        self._release_tag, live.heard)
        asked = time.monotonic()
        self._engine.call(lambda: self._begin(xfer))
        try:
            kind, *rest = self._next_event(xfer, timeout, "the file header")
            if time.monotonic() - asked > self._tuning.heartbeat_timeout:
                self._counters.slow_fetch()
            if kind == "refused":
                raise self._failure(FailureReason.REFUSED, f"fetch {key!r}: node {owner} refused: {rest[0]}")
            size, file_size, encoding = rest
            written = self._receive(xfer, size, dest, timeout, file_size, encoding)
        except BaseException:
            self._engine.call(xfer.abandon)
            raise
        self._counters.received(written, size)
        return written

    def fetch_range(self, owner: int, key: str, offset: int, length: int, fd: int, timeout: float,
                    version: tuple[int, int] | None = None) -> int:
        """See ``Cluster.fetch_range``."""
        self._check(owner, key)
        if self.datapath is not None and version is not None and length <= dp.RANGE_MAX:
            written = self._fetch_range_direct(owner, key, version, offset, length, fd)
            if written is not None:
                return written
        xfer = Incoming(self._engine, owner, key, self._tuning.chunk_size, self._tuning.window,
                        self._release_tag, self._liveness.heard, span=(offset, length))
        self._engine.call(lambda: self._begin(xfer))
        what = f"{key!r} [{offset}, +{length})"
        try:
            kind, *rest = self._next_event(xfer, timeout, "the range's header")
            if kind == "refused":
                raise self._failure(FailureReason.REFUSED, f"fetch {what}: node {owner} refused: {rest[0]}")
            size, file_size, encoding = rest
            if (size, file_size, encoding) != (length, length, transfer.RAW):
                raise self._failure(FailureReason.CORRUPT, f"fetch {what}: node {owner} announced {size} bytes "
                                    f"(encoding {encoding})")
            written = 0
            for _ in range(xfer.nchunks if size else 0):
                kind, idx, buf, count = self._next_event(xfer, timeout, "the next chunk")
                if count != len(buf):
                    raise self._failure(FailureReason.ABORTED, f"fetch {what}: node {owner} aborted the "
                                        f"transfer at {written} of {size} bytes")
                view = memoryview(buf)
                at = idx * xfer.chunk
                while view:  # (chunks arrive in order: MPI keeps one tag's messages in order)
                    n = os.pwrite(fd, view, offset + at)
                    view, at, written = view[n:], at + n, written + n
                if xfer.next_idx < xfer.nchunks:
                    self._engine.call(xfer.credit)
        except OSError as exc:
            self._engine.call(xfer.abandon)
            raise self._failure(FailureReason.LOCAL_IO, f"fetch {what}: writing fd {fd}: {exc}") from exc
        except BaseException:
            self._engine.call(xfer.abandon)
            raise
        self._counters.received(written, written, unit="ranges")
        return written

    def _fetch_range_direct(self, owner: int, key: str, version: tuple[int, int], offset: int, length: int,
                            fd: int) -> int | None:
        """A span through the C data path, answered by the owner's C thread when every block of it
        is staged there: the bytes written, or None (handed back: Python's protocol, whose owner
        reads the blocks from the PFS first)."""
        size, mtime_ns = version
        n = self.datapath.fetch_range(owner, key, size, mtime_ns, offset, length, fd,
                                      min(self._tuning.peer_timeout, self._tuning.heartbeat_timeout))
        if n >= 0:  # counted by the data path (Cluster.counters)
            return n
        return self._direct_failure(n, owner, f"{key!r} [{offset}, +{length})", f"the {length} bytes asked", fd)

    def _fetch_direct(self, owner: int, key: str, dest: str | int, size: int) -> int | None:
        """Through the C data path: the bytes written, or None when the owner or the path
        hands the file back (not staged there yet, compressed, an MPI error, no answer within a
        heartbeat timeout): Python's protocol then does it all, with its liveness checks."""
        fd = dest if isinstance(dest, int) else os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            n = self.datapath.fetch(owner, key, size, fd, min(self._tuning.peer_timeout, self._tuning.heartbeat_timeout))
        finally:
            if fd is not dest:
                os.close(fd)
        if n >= 0:  # counted by the data path (Cluster.counters), with what the front door fetched through it
            return n
        return self._direct_failure(n, owner, repr(key), f"the {size} bytes of the snapshot", dest)

    def _direct_failure(self, n: int, owner: int, what: str, expected: str, dest: str | int) -> None:
        """The PeerError of the C data path's answer ``n``; None for those Python's protocol
        tries again (HANDED_BACK, TIMEOUT, MPI_ERROR)."""
        if n == dp.LOST:
            raise self._failure(FailureReason.PEER_LOST, f"fetch {what}: node {owner} is lost")
        if n == dp.CORRUPT:
            raise self._failure(FailureReason.CORRUPT, f"fetch {what}: node {owner} sent another size than {expected}")
        if n == dp.LOCAL_IO:
            raise self._failure(FailureReason.LOCAL_IO, f"fetch {what}: writing {dest} failed")
        if n == dp.STOPPED:
            raise self._failure(FailureReason.NOT_RUNNING, f"fetch {what}: the peer layer is not running")
        return None

    def _receive(self, xfer: Incoming, size: int, dest: str | int, timeout: float, file_size: int,
                 encoding: int) -> int:
        """Write the file's chunks into ``dest`` (a compressed file decompressed as it comes,
        never beyond the size its header announced); the file's bytes written."""
        corrupt = FailureReason.CORRUPT
        if encoding not in (transfer.RAW, transfer.ZSTD):
            raise self._failure(corrupt, f"fetch {xfer.key!r}: node {xfer.owner} sent encoding {encoding}")
        inflate = zstandard.ZstdDecompressor().decompressobj() if encoding == transfer.ZSTD else None
        written = received = 0
        try:
            with open(dest, "wb", closefd=not isinstance(dest, int)) as f:
                for _ in range(xfer.nchunks if size else 0):
                    kind, idx, buf, count = self._next_event(xfer, timeout, "the next chunk")
                    if count != len(buf):
                        raise self._failure(FailureReason.ABORTED, f"fetch {xfer.key!r}: node {xfer.owner} "
                                            f"aborted the transfer at {received} of {size} bytes")
                    received += count
                    data = buf if inflate is None else inflate.decompress(buf)
                    if written + len(data) > file_size:
                        raise self._failure(corrupt, f"fetch {xfer.key!r}: node {xfer.owner} sent more "
                                            f"than the {file_size} bytes it announced")
                    f.write(data)
                    written += len(data)
                    if xfer.next_idx < xfer.nchunks:  # (set on the engine thread; a stale read only credits once too often)
                        self._engine.call(xfer.credit)  # room for the next receive
        except zstandard.ZstdError as exc:
            raise self._failure(corrupt, f"fetch {xfer.key!r}: node {xfer.owner}'s frame: {exc}") from exc
        except OSError as exc:
            raise self._failure(FailureReason.LOCAL_IO, f"fetch {xfer.key!r}: writing fd {dest}: {exc}") from exc
        if written != file_size:
            raise self._failure(corrupt, f"fetch {xfer.key!r}: node {xfer.owner} sent {written} of the "
                                f"{file_size} bytes it announced")
        return written

    def _next_event(self, xfer: Incoming, timeout: float, what: str) -> tuple:
        """The transfer's next event. Waits at most ``timeout`` for a slow owner (one that
        answers pings), ``heartbeat_timeout`` for a silent one, not at all for a lost one."""
        live, heartbeat_timeout = self._liveness, self._tuning.heartbeat_timeout
        started = time.monotonic()
        deadline = started + timeout
        owner = xfer.owner
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                if now - live.last_heard(owner) > heartbeat_timeout:
                    live.suspect(owner)  # silent too: down; one that answers pings is only slow
                raise self._failure(FailureReason.TIMEOUT, f"fetch {xfer.key!r}: node {owner} did not send "
                                    f"{what} within {timeout:g}s")
            silent = now - max(live.last_heard(owner), started)
            if silent > heartbeat_timeout:
                live.suspect(owner)
                raise self._failure(FailureReason.NO_HEARTBEAT, f"fetch {xfer.key!r}: node {owner} answered "
                                    f"nothing, not even a ping, for {silent:.1f}s (waiting for {what})")
            if silent > HEARTBEAT:
                self._engine.call(lambda: live.ping(owner))
            try:
                event = xfer.events.get(timeout=min(left, HEARTBEAT / 2))
            except queue.Empty:
                if live.is_lost(owner):
                    raise self._failure(FailureReason.PEER_LOST, f"fetch {xfer.key!r}: node {owner} is lost "
                                        f"({live.why_lost(owner)})") from None
                if not self._engine.running:
                    raise self._failure(FailureReason.NOT_RUNNING, f"fetch {xfer.key!r}: the MPI engine stopped")
                continue
            if event[0] == "lost":
                raise self._failure(FailureReason.PEER_LOST, f"fetch {xfer.key!r}: node {owner} is lost ({event[1]})")
            return event

    def _failure(self, reason: FailureReason, message: str) -> PeerError:
        return self._counters.fetch_failed(reason, message)

    # -- engine thread -------------------------------------------------------------------
    def _begin(self, xfer: Incoming) -> None:
        tag = self._next_tag
        while tag in self._tags:
            tag = tag + 1 if tag < self._tag_ub else FIRST_REPLY_TAG
        self._next_tag = tag + 1 if tag < self._tag_ub else FIRST_REPLY_TAG
        self._tags[tag] = xfer
        xfer.begin(tag)

    def _release_tag(self, xfer: Incoming) -> None:
        self._tags.pop(xfer.tag, None)

    def on_lost(self, node: int, why: str) -> None:
        """Node ``node`` is lost: the fetches waiting on it stop at once."""
        for xfer in [x for x in self._tags.values() if x.owner == node]:
            xfer.lost(why)
