"""The write-back calls' own socket: each connection served by a thread of its own, and kept.

A write-back call (monarch/writeback/wire.py) is answered from the job's view in microseconds,
or waits for the drain (an fsync under ``fsync: pfs``, room). On the daemon's main socket each
call crossed three threads (the front door's accept, the loop, a request thread) and a connect:
about half a millisecond of the job's time, and a checkpoint library makes hundreds. Here each
thread of the application keeps one connection (shim_writeback.c), and the thread that accepted
it reads each call, answers it and waits for the next: one hand-over per call. A call that waits
holds its own thread only; a heartbeat thread sends the shim a heartbeat frame every
HEARTBEAT_MS meanwhile, as the main socket does, so that a slow drain is not taken for a lost
daemon. Only the daemon's own user is served (SO_PEERCRED); anything but a well-formed
write-back call closes its connection, counted. A shim that cannot reach this socket uses the
main one: the same calls, the same answers.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from typing import Callable

from monarch import protocol, secure
from monarch.protocol import ProtocolError

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4096  # application threads with a connection at once (beyond: closed; they use the main socket)
REQUEST_TIMEOUT = 5.0   # seconds a client has to send the rest of a call it began
HEARTBEAT = protocol.encode_answer(protocol.STATUS_PENDING)


class WritebackDoor:
    """Serves ``call`` (a call's body -> its answer frame) on a Unix socket at ``path`` until stopped."""

    def __init__(self, path: str, call: Callable[[bytes], bytes]):
        self.path, self._call = path, call
        self.refused: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._waiting: dict[socket.socket, tuple[float, threading.Lock]] = {}  # a call running: its next beat
        self._stop = threading.Event()
        old_umask = os.umask(0o177)  # the socket file is 0600 from the start
        try:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(path)
        finally:
            os.umask(old_umask)
        self._listener.listen(1024)

    def start(self) -> None:
        threading.Thread(target=self._accept, name="monarch-wb-door", daemon=True).start()
        threading.Thread(target=self._beat, name="monarch-wb-beat", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # a thread waiting for its connection's next call wakes and ends
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            os.unlink(self.path)
        except OSError:
            pass

    # -- accepting ---------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.01)  # (out of descriptors: the backlog waits)
                continue
            if not secure.peer_is_me(conn):
                self._refuse(conn, "other_user")
                continue
            with self._lock:
                if len(self._conns) >= MAX_CONNECTIONS:
                    full = True
                else:
                    full = False
                    self._conns.add(conn)
            if full:
                self._refuse(conn, "too_many_connections")
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="monarch-wb-call", daemon=True).start()
            except RuntimeError:  # no thread to be had: this one goes to the main socket
                with self._lock:
                    self._conns.discard(conn)
                self._refuse(conn, "no_thread")

    def _refuse(self, conn: socket.socket, why: str) -> None:
        self.refused[why] += 1
        if self.refused[why] == 1:
            log.warning("write-back door: a connection refused (%s)", why.replace("_", " "))
        conn.close()

    # -- one connection ----------------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        send_lock = threading.Lock()  # an answer is never cut by a heartbeat
        try:
            while not self._stop.is_set():
                header = _recv(conn, protocol.REQUEST_HEADER.size, None)  # the next call, whenever it comes
                if header is None:
                    return
                verb, length = protocol.decode_request_header(header)
                if verb != protocol.VERB_WB:
                    raise ProtocolError(f"{protocol.VERBS[verb]} on the write-back socket")
                body = _recv(conn, length, REQUEST_TIMEOUT) if length else b""
                if body is None:
                    raise ProtocolError("a call cut short")
                with self._lock:
                    self._waiting[conn] = (time.monotonic() + protocol.HEARTBEAT_MS / 1000, send_lock)
                try:
                    answer = self._call(body)
                finally:
                    with self._lock:
                        del self._waiting[conn]
                with send_lock:
                    conn.sendall(answer)
        except ProtocolError as e:
            self.refused["malformed"] += 1
            log.warning("write-back door: a malformed call refused: %s", e)
        except (OSError, TimeoutError):
            pass  # the application's thread or process went: its connection with it
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _beat(self) -> None:
        while not self._stop.wait(protocol.HEARTBEAT_MS / 2000):
            now = time.monotonic()
            with self._lock:
                due = [(c, lock) for c, (at, lock) in self._waiting.items() if at <= now]
                for c, lock in due:
                    self._waiting[c] = (now + protocol.HEARTBEAT_MS / 1000, lock)
            for c, lock in due:
                with lock:  # (one that lands after its answer is skipped by the shim's next call)
                    try:
                        c.send(HEARTBEAT, socket.MSG_DONTWAIT)
                    except OSError:
                        pass


def _recv(conn: socket.socket, n: int, timeout: float | None) -> bytes | None:
    """Exactly ``n`` bytes, or None at the end of the stream before the first of them."""
    conn.settimeout(timeout)
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            if data:
                raise ProtocolError("a frame cut short")
            return None
        data += chunk
    return bytes(data)
