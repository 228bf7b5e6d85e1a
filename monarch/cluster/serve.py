"""The serving side of the peer protocol: answer other nodes' requests for files we own.

The engine thread receives ``("req", tag, key)``; a pool thread calls ``provide(key)``
(which may stage the file from the PFS first), then reads the staged file chunk by chunk
(a compressed copy as it is stored: see transfer.py)
and hands each chunk to the engine to send, at most ``window`` chunks in flight. A
requester that stops receiving (dead, hung) stalls the window: after ``peer_timeout``
without progress the pool thread gives up, so a dead peer costs one pool thread for one
timeout, never forever.
"""

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from ..node.codecs import Compressed
from . import transfer

log = logging.getLogger(__name__)


class Outgoing:
    __slots__ = ("src", "tag", "key", "cancelled", "lost")

    def __init__(self, src, tag, key):
        self.src, self.tag, self.key = src, tag, key
        self.cancelled = False
        self.lost = False   # the requester is lost: stop sending at once


class Server:
    def __init__(self, engine, provide, cluster, threads):
        self.engine = engine
        self.provide = provide
        self.cluster = cluster          # peer_timeout, chunk_size, window, counters
        self.accepting = True
        self._active = {}
        self._lock = threading.Condition()
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="monarch-peer")

    # -- engine thread ---------------------------------------------------------------
    def on_request(self, src, tag, key):
        if not self.accepting or self.provide is None:
            self._post_header(src, tag, transfer.encode_refusal("node is not serving"))
            return
        out = Outgoing(src, tag, key)
        with self._lock:
            self._active[(src, tag)] = out
        self._pool.submit(self._serve, out)

    def on_lost(self, src):
        """Node ``src`` is lost: its transfers stop at their next chunk, without a timeout."""
        with self._lock:
            for out in self._active.values():
                if out.src == src:
                    out.lost = True
                    out.cancelled = True

    def on_cancel(self, src, tag):
        out = self._active.get((src, tag))
        if out is not None:
            out.cancelled = True

    def _post_header(self, src, tag, data):
        MPI = self.engine.MPI
        self.engine.post(self.engine.comm.Isend([data, MPI.BYTE], src, tag))

    # -- any thread --------------------------------------------------------------------
    def stop_accepting(self):
        self.accepting = False

    def wait_idle(self, timeout):
        with self._lock:
            return self._lock.wait_for(lambda: not self._active, timeout)

    def shutdown(self):
        self.accepting = False
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- pool thread -----------------------------------------------------------------
    def _send(self, out, data, on_sent=None, header=None):
        """Hand ``data`` to the engine to send (``header`` first, in the same hand-over: one
        wake-up of the engine for a small file's two messages; MPI keeps them in order)."""
        MPI, engine = self.engine.MPI, self.engine

        def post():
            if header is not None:
                engine.post(engine.comm.Isend([header, MPI.BYTE], out.src, out.tag))
            engine.post(engine.comm.Isend([data, MPI.BYTE], out.src, out.tag), on_sent and (lambda st: on_sent()))
        engine.call(post)

    def _serve(self, out):
        try:
            self._serve_one(out)
        except Exception:
            log.exception("serving %r to node %d failed", out.key, out.src)
            self.cluster._count_serve_failure("error")
        finally:
            with self._lock:
                self._active.pop((out.src, out.tag), None)
                self._lock.notify_all()

    def _refuse(self, out, reason, why):
        self.cluster._count_serve_failure(why)
        self._send(out, transfer.encode_refusal(reason))

    def _serve_one(self, out):
        try:
            path = self.provide(out.key)
        except Exception as exc:
            log.warning("provide(%r) for node %d raised %s: %s", out.key, out.src, type(exc).__name__, exc)
            path, reason = None, f"provide failed: {type(exc).__name__}: {exc}"
        else:
            reason = "owner could not stage the file"
        if out.lost:
            return self.cluster._count_serve_failure("lost")
        if out.cancelled:
            return self._refuse(out, "cancelled by the requester", "cancelled")
        if path is None:
            return self._refuse(out, reason, "refused")
        compressed = isinstance(path, Compressed)
        try:  # a file object: a copy decompressed for the wire
            f = path if hasattr(path, "read") else open(path.path if compressed else path, "rb")
        except OSError as exc:
            return self._refuse(out, f"owner cannot open its staged copy: {exc}", "open")
        with f:
            size = os.fstat(f.fileno()).st_size
            file_size = path.size if compressed else size
            header = transfer.encode_ok(size, file_size, transfer.ZSTD if compressed else transfer.RAW)
            if size == 0:
                self._send(out, header)
            sent = self._stream(out, f, size, header)
        if sent == size:
            self.cluster._count_sent(file_size, size)

    def _stream(self, out, f, size, header):
        """Send ``header`` with the first chunk, then the rest with a bounded window; return
        bytes sent, or -1 if abandoned."""
        chunk, window = self.cluster.chunk_size, self.cluster.window
        slots = threading.Semaphore(window)
        sent = 0
        for idx in range(transfer.chunk_count(size, chunk)):
            if not self._slot(slots, out):
                log.warning("node %d stopped receiving %r: giving up", out.src, out.key)
                self.cluster._count_serve_failure("lost" if out.lost else "stalled")
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
                self.cluster._count_serve_failure("short_read")
                return -1
            self._send(out, data, slots.release, header=first)
            sent += n
        for _ in range(window):         # wait until the last chunks are out
            if not self._slot(slots, out):
                self.cluster._count_serve_failure("lost" if out.lost else "stalled")
                return -1
        return sent

    def _slot(self, slots, out):
        """A window slot, or False when the requester is lost or has taken nothing for peer_timeout."""
        waited = 0.0
        while not slots.acquire(timeout=0.25):
            waited += 0.25
            if out.lost or waited >= self.cluster.peer_timeout:
                return False
        return True
