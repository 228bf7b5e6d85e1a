"""Wire protocol of one file transfer between two daemons, and its receiving side.

A requester picks a reply tag unique among its outstanding requests and sends
``("req", tag, key)`` on the control tag, or ``("range", tag, key, offset, length)`` for a span
of a large file's staged blocks (answered as a file of ``length`` bytes). The owner answers on
that tag, to that requester:

  header   8-byte little-endian size of what follows on the wire; a negative size is a
           refusal, followed by a UTF-8 reason. An accepted file's header goes on with the
           file's own size (8 bytes) and its encoding (1 byte): RAW, or ZSTD when the owner
           holds the file compressed (a plain zstd frame, no dictionary), which crosses the
           network as it is stored and is decompressed by the requester as it arrives.
  chunks   ceil(size / chunk) raw messages of ``chunk`` bytes (the last one shorter)

MPI keeps messages with the same (source, tag, communicator) in order, so the chunks need
no sequence numbers. An owner that fails mid-file sends an empty chunk instead of the next
one: the requester sees the short count and gives up. A requester that gives up (timeout,
local error) sends ``("cancel", tag)`` and keeps receiving what is already under way into
scratch buffers ("drain"), so no message is left unmatched and the tag can be reused.
"""

from __future__ import annotations

import queue
import struct
from typing import TYPE_CHECKING, Any, Callable

from .control import Verb, message

if TYPE_CHECKING:
    from .engine import Engine

HEADER = struct.Struct("<q")
OK = struct.Struct("<qqB")  # bytes on the wire, bytes of the file, encoding
HEADER_MAX = 4096
FIRST_REPLY_TAG = 16
RAW, ZSTD = 0, 1


def encode_ok(size: int, file_size: int | None = None, encoding: int = RAW) -> bytes:
    return OK.pack(size, size if file_size is None else file_size, encoding)


def decode_ok(buf: bytes | bytearray, count: int) -> tuple[int, int, int]:
    """``(wire size, file size, encoding)`` of an accepted file's header."""
    if count < OK.size:
        (size,) = HEADER.unpack_from(buf)
        return size, size, RAW
    return OK.unpack_from(buf)


def encode_refusal(reason: str) -> bytes:
    return HEADER.pack(-1) + reason.encode("utf-8", "replace")[: HEADER_MAX - HEADER.size]


def decode_header(buf: bytes | bytearray, count: int) -> tuple[int | None, str | None]:
    (size,) = HEADER.unpack_from(buf)
    if size >= 0:
        return size, None
    return None, bytes(buf[HEADER.size:count]).decode("utf-8", "replace")


def chunk_count(size: int, chunk: int) -> int:
    return (size + chunk - 1) // chunk


def chunk_len(idx: int, size: int, chunk: int) -> int:
    return min(chunk, size - idx * chunk)


class Incoming:
    """One file being received. Engine-thread methods are marked; ``events`` feeds the fetcher.

    Events: ("header", size, file size, encoding) | ("refused", reason) | ("chunk", idx, buf, count).
    """

    def __init__(self, engine: Engine, owner: int, key: str, chunk: int, window: int,
                 on_done: Callable[[Incoming], None], on_heard: Callable[[int], None],
                 span: tuple[int, int] | None = None):
        self.engine, self.owner, self.key = engine, owner, key
        self.span = span  # (offset, length): a range of the file, not the whole file
        self.tag: int | None = None  # the reply tag, from begin()
        self.chunk, self.window = chunk, window
        self.events = queue.SimpleQueue()
        self.size: int | None = None
        self.nchunks = 0
        self.next_idx = 0
        self.in_flight: dict[int, Any] = {}  # idx -> request of a posted chunk receive
        self.abandoned = False
        self.aborted = False
        self.done = False
        self._on_done = on_done   # engine thread: the tag is free again
        self._on_heard = on_heard  # engine thread: the owner is alive

    # -- engine thread ---------------------------------------------------------------
    def begin(self, tag: int) -> None:
        """Ask the owner for the file, its answer on reply tag ``tag``."""
        self.tag = tag
        MPI, comm = self.engine.MPI, self.engine.comm
        buf = bytearray(HEADER_MAX)
        req = comm.Irecv([buf, MPI.BYTE], self.owner, self.tag)
        self.engine.post(req, lambda st: self._on_header(buf, st))
        ask = message(Verb.REQ, self.tag, self.key) if self.span is None else \
            message(Verb.RANGE, self.tag, self.key, *self.span)
        self.engine.send_obj(ask, self.owner)

    def credit(self) -> None:
        """The fetcher wrote a chunk: one more receive may be posted."""
        self._post_next()

    def abandon(self) -> None:
        """The fetcher gave up: tell the owner, swallow whatever still arrives."""
        if self.abandoned:
            return
        self.abandoned = True
        if self.done:
            return
        self.engine.send_obj(message(Verb.CANCEL, self.tag), self.owner)
        if self.size is not None:
            while len(self.in_flight) < self.window and self._post_next():
                pass

    def lost(self, why: str) -> None:
        """The owner is lost: the fetcher stops waiting at once; nothing more will come, so the
        tag is free (receives still posted to the dead owner complete in error or never)."""
        if self.done:
            return
        self.aborted = True
        self.events.put(("lost", why))
        self.in_flight.clear()
        self._finish()

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            self._on_done(self)

    def _on_header(self, buf: bytearray, status: Any) -> None:
        self._on_heard(self.owner)
        size, reason = decode_header(buf, status.Get_count(self.engine.MPI.BYTE))
        if size is None:
            self.events.put(("refused", reason))
            self._finish()
            return
        self.size = size
        self.nchunks = chunk_count(size, self.chunk)
        _, file_size, encoding = decode_ok(buf, status.Get_count(self.engine.MPI.BYTE))
        self.events.put(("header", size, file_size, encoding))
        if self.nchunks == 0:
            self._finish()
            return
        while len(self.in_flight) < self.window and self._post_next():
            pass

    def _post_next(self) -> bool:
        if self.done or self.aborted or self.size is None or self.next_idx >= self.nchunks:
            return False
        idx = self.next_idx
        self.next_idx += 1
        MPI = self.engine.MPI
        buf = bytearray(chunk_len(idx, self.size, self.chunk))
        req = self.engine.comm.Irecv([buf, MPI.BYTE], self.owner, self.tag)
        self.in_flight[idx] = req
        self.engine.post(req, lambda st: self._on_chunk(idx, buf, st))
        return True

    def _on_chunk(self, idx: int, buf: bytearray, status: Any) -> None:
        self.in_flight.pop(idx, None)
        if not status.Is_cancelled():
            self._on_heard(self.owner)
            count = status.Get_count(self.engine.MPI.BYTE)
            if not (self.abandoned or self.aborted):
                self.events.put(("chunk", idx, buf, count))
            if count != len(buf) and not self.aborted:
                # The owner aborted; nothing more will come. Cancel the receives already
                # posted and free the tag only once they are gone.
                self.aborted = True
                for req in list(self.in_flight.values()):
                    req.Cancel()
            elif self.abandoned and not self.aborted:
                self._post_next()
        if self.aborted:
            if not self.in_flight:
                self._finish()
        elif idx == self.nchunks - 1:
            self._finish()
