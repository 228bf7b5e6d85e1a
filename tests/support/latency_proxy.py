"""A TCP link with a round trip added, for the store and S3 tests and benchmarks.

Each request (client -> server) is held a whole round trip before it is passed on, in order;
answers (server -> client, the bulk: the values) are passed on at once, spliced in the kernel
(os.splice), so the proxy costs the machine little CPU and every request/answer exchange takes
one round trip more, as over a link with that RTT. Pipelined requests stay pipelined. The
callers count what crosses (``seen`` and ``sent``), each in its own protocol.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from typing import Callable


def forward_delayed(src: socket.socket, dst: socket.socket, delay: float,
                    seen: Callable[[bytes], None] | None = None) -> None:
    """Client -> server until the client closes: each chunk passed on ``delay`` s after it came
    (``seen`` is shown it first)."""
    queue: collections.deque = collections.deque()
    cv = threading.Condition()

    def sender() -> None:
        while True:
            with cv:
                while not queue:
                    cv.wait()
                due, data = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return

    threading.Thread(target=sender, daemon=True).start()
    while True:
        try:
            data = src.recv(1 << 16)
        except OSError:
            data = b""
        with cv:
            queue.append((time.monotonic() + delay, data))
            cv.notify()
        if not data:
            return
        if seen is not None:
            seen(data)


def splice_answers(src: socket.socket, dst: socket.socket, sent: Callable[[int], None] | None = None) -> None:
    """Server -> client until the server closes: spliced in the kernel at once (``sent`` told
    each run of bytes)."""
    r, w = os.pipe()
    try:
        while True:
            n = os.splice(src.fileno(), w, 1 << 20)
            if n == 0:
                break
            if sent is not None:
                sent(n)
            while n:
                n -= os.splice(r, dst.fileno(), n)
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
