"""The owner's side of the peer protocol (``Provider``): answer other nodes' requests for files we own.

The engine thread receives ``("req", tag, key)``; a pool thread calls ``provide(key)``
(which may stage the file from the PFS first), then reads the staged file chunk by chunk
(a compressed copy as it is stored: see transfer.py)
and hands each chunk to the engine to send, at most ``window`` chunks in flight.
``("range", tag, key, offset, length)`` asks for a span of a large file's blocks:
``provide_range`` (which may stage those blocks first) names the block copy that holds them,
and the span is sent as a file of its own, the same way. A
requester that stops receiving (dead, hung) stalls the window: after ``peer_timeout``
without progress the pool thread gives up, so a dead peer costs one pool thread for one
timeout, never forever.

Why a request was not served is counted in ``serve_failures`` (``ServeFailure``).
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Callable, Mapping, NamedTuple, Union

from . import transfer
from .control import Handler, Verb
from .counters import PeerCounters
from .engine import Engine
from .tuning import Tuning

log = logging.getLogger(__name__)


class Compressed(NamedTuple):
    """A copy sent to a peer as stored (``provide``'s answer): its zstd frame's path and the file's size."""
    path: str
    size: int


# what ``provide(key)`` answers: a staged file's path, a compressed copy, a file object, or None (cannot)
Provided = Union[str, Compressed, IO[bytes], None]
Provide = Callable[[str], Provided]
# what ``provide_range(key, offset, length)`` answers: the path of a copy whose bytes at
# [offset, offset + length) are the file's (staged blocks), or None (cannot)
ProvideRange = Callable[[str, int, int], Union[str, None]]


class ServeFailure(str, enum.Enum):
    """Why a peer's request was not served (the keys of ``serve_failures``, by value)."""

    ERROR = "error"            # a bug while serving (logged)
    LOST = "lost"              # the requester is lost
    CANCELLED = "cancelled"    # the requester gave up first
    REFUSED = "refused"        # provide() could not stage the file
    OPEN = "open"              # the staged copy could not be opened
    STALLED = "stalled"        # the requester took nothing for peer_timeout
    SHORT_READ = "short_read"  # the staged copy was shorter than it said

    def __str__(self) -> str:
        return self.value


class Outgoing:
    __slots__ = ("src", "tag", "key", "span", "cancelled", "lost")

    def __init__(self, src: int, tag: int, key: str, span: tuple[int, int] | None = None):
        self.src, self.tag, self.key = src, tag, key
        self.span = span  # (offset, length) of a range request
        self.cancelled = False
        self.lost = False   # the requester is lost: stop sending at once


class Provider:
    """Provides this node's files to the peers that ask, once started (a request that comes before is dropped: the
    requester's timeout answers it)."""

    def __init__(self, engine: Engine, counters: PeerCounters, tuning: Tuning):
        self.engine = engine
        self.counters = counters
        self.tuning = tuning            # peer_timeout, chunk_size, window
        self.provide: Provide | None = None
        self.provide_range: ProvideRange | None = None
        self.accepting = True
        self._started = False
        self._active: dict[tuple[int, int], Outgoing] = {}
        self._lock = threading.Condition()
        self._pool: ThreadPoolExecutor | None = None

    def start(self, provide: Provide | None, threads: int, provide_range: ProvideRange | None = None) -> None:
        """Serve with ``provide`` (and ``provide_range``) on ``threads`` pool threads (before
        the engine starts)."""
        self.provide, self.provide_range = provide, provide_range
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="monarch-peer")
        self._started = True

    def handlers(self) -> Mapping[Verb, Handler]:
        """The control verbs this part serves (engine thread)."""
        return {Verb.REQ: self.on_request, Verb.RANGE: self.on_range, Verb.CANCEL: self.on_cancel}

    # -- engine thread ---------------------------------------------------------------
    def on_range(self, src: int, tag: int, key: str, offset: int, length: int) -> None:
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0):
            self._post_header(src, tag, transfer.encode_refusal(f"bad range {offset!r}+{length!r}"))
            return
        self._accept(src, tag, key, (offset, length))

    def on_request(self, src: int, tag: int, key: str) -> None:
        self._accept(src, tag, key, None)

    def _accept(self, src: int, tag: int, key: str, span: tuple[int, int] | None) -> None:
        if not self._started:
            return  # not serving yet: the requester's timeout answers it
        if not self.accepting or (self.provide if span is None else self.provide_range) is None:
            self._post_header(src, tag, transfer.encode_refusal("node is not serving"))
            return
        out = Outgoing(src, tag, key, span)
        with self._lock:
            self._active[(src, tag)] = out
        self._pool.submit(self._serve, out)

    def on_lost(self, src: int, why: str = "") -> None:
        """Node ``src`` is lost: its transfers stop at their next chunk, without a timeout."""
        with self._lock:
            for out in self._active.values():
                if out.src == src:
                    out.lost = True
                    out.cancelled = True

    def on_cancel(self, src: int, tag: int) -> None:
        out = self._active.get((src, tag))
        if out is not None:
            out.cancelled = True

    def _post_header(self, src: int, tag: int, data: bytes) -> None:
        MPI = self.engine.MPI
        self.engine.post(self.engine.comm.Isend([data, MPI.BYTE], src, tag))

    # -- any thread --------------------------------------------------------------------
    def stop_accepting(self) -> None:
        self.accepting = False

    def wait_idle(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: not self._active, timeout)

    def shutdown(self) -> None:
        self.accepting = False
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- pool thread -----------------------------------------------------------------
    def _send(self, out: Outgoing, data: bytes, on_sent: Callable[[], object] | None = None,
              header: bytes | None = None) -> None:
        """Hand ``data`` to the engine to send (``header`` first, in the same hand-over: one
        wake-up of the engine for a small file's two messages; MPI keeps them in order)."""
        MPI, engine = self.engine.MPI, self.engine

        def post() -> None:
            if header is not None:
                engine.post(engine.comm.Isend([header, MPI.BYTE], out.src, out.tag))
            engine.post(engine.comm.Isend([data, MPI.BYTE], out.src, out.tag), on_sent and (lambda st: on_sent()))
        engine.call(post)

    def _serve(self, out: Outgoing) -> None:
        try:
            self._serve_one(out)
        except Exception:
            log.exception("serving %r to node %d failed", out.key, out.src)
            self.counters.serve_failed(ServeFailure.ERROR)
        finally:
            with self._lock:
                self._active.pop((out.src, out.tag), None)
                self._lock.notify_all()

    def _refuse(self, out: Outgoing, reason: str, why: ServeFailure) -> None:
        self.counters.serve_failed(why)
        self._send(out, transfer.encode_refusal(reason))

    def _serve_one(self, out: Outgoing) -> None:
        if out.span is not None:
            return self._serve_range(out, *out.span)
        try:
            path = self.provide(out.key)
        except Exception as exc:
            log.warning("provide(%r) for node %d raised %s: %s", out.key, out.src, type(exc).__name__, exc)
            path, reason = None, f"provide failed: {type(exc).__name__}: {exc}"
        else:
            reason = "owner could not stage the file"
        if out.lost:
            return self.counters.serve_failed(ServeFailure.LOST)
        if out.cancelled:
            return self._refuse(out, "cancelled by the requester", ServeFailure.CANCELLED)
        if path is None:
            return self._refuse(out, reason, ServeFailure.REFUSED)
        compressed = isinstance(path, Compressed)
        try:  # a file object: a copy decompressed for the wire
            f = path if hasattr(path, "read") else open(path.path if compressed else path, "rb")
        except OSError as exc:
            return self._refuse(out, f"owner cannot open its staged copy: {exc}", ServeFailure.OPEN)
        with f:
            size = os.fstat(f.fileno()).st_size
            file_size = path.size if compressed else size
            header = transfer.encode_ok(size, file_size, transfer.ZSTD if compressed else transfer.RAW)
            if size == 0:
                self._send(out, header)
            sent = self._stream(out, f, size, header)
        if sent == size:
            self.counters.sent(file_size, size)

    def _serve_range(self, out: Outgoing, offset: int, length: int) -> None:
        """A span of a large file's staged blocks, from the copy ``provide_range`` names."""
        try:
            path = self.provide_range(out.key, offset, length)
        except Exception as exc:
            log.warning("provide_range(%r) for node %d raised %s: %s", out.key, out.src, type(exc).__name__, exc)
            path = None
        if out.lost:
            return self.counters.serve_failed(ServeFailure.LOST)
        if out.cancelled:
            return self._refuse(out, "cancelled by the requester", ServeFailure.CANCELLED)
        if path is None:
            return self._refuse(out, "owner does not hold those blocks", ServeFailure.REFUSED)
        try:
            f = open(path, "rb")
        except OSError as exc:
            return self._refuse(out, f"owner cannot open its block copy: {exc}", ServeFailure.OPEN)
        with f:
            f.seek(offset)
            header = transfer.encode_ok(length, length, transfer.RAW)
            if length == 0:
                self._send(out, header)
            sent = self._stream(out, f, length, header)
        if sent == length:
            self.counters.sent(length, length, unit="ranges")

    def _stream(self, out: Outgoing, f: IO[bytes], size: int, header: bytes) -> int:
        """Send ``header`` with the first chunk, then the rest with a bounded window; return
        bytes sent, or -1 if abandoned."""
        chunk, window = self.tuning.chunk_size, self.tuning.window
        slots = threading.Semaphore(window)
        sent = 0
        for idx in range(transfer.chunk_count(size, chunk)):
            if not self._slot(slots, out):
                log.warning("node %d stopped receiving %r: giving up", out.src, out.key)
                self.counters.serve_failed(ServeFailure.LOST if out.lost else ServeFailure.STALLED)
                return -1
            n = transfer.chunk_len(idx, size, chunk)
            try:
                data = f.read(n)
            except OSError as exc:
                log.warning("reading staged %r failed: %s", out.key, exc)
                data = b""
            first = header if idx == 0 else None
            if len(data) != n:           # empty chunk = "owner aborted" for the requester
                self._send(out, b"", header=first)
                self.counters.serve_failed(ServeFailure.SHORT_READ)
                return -1
            self._send(out, data, slots.release, header=first)
            sent += n
        for _ in range(window):         # wait until the last chunks are out
            if not self._slot(slots, out):
                self.counters.serve_failed(ServeFailure.LOST if out.lost else ServeFailure.STALLED)
                return -1
        return sent

    def _slot(self, slots: threading.Semaphore, out: Outgoing) -> bool:
        """A window slot, or False when the requester is lost or has taken nothing for peer_timeout."""
        waited = 0.0
        while not slots.acquire(timeout=0.25):
            waited += 0.25
            if out.lost or waited >= self.tuning.peer_timeout:
                return False
        return True
