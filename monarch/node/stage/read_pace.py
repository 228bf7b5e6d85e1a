"""How much of the PFS the block stager keeps asked for at once: a few milliseconds of the link's measured rate.

An application's read of the PFS (a page fault of a mapping, a read of a block not staged yet)
queues behind the requests the read-ahead has already made: on a link of rate R, behind the
read-ahead's bytes in flight / R. So the read-ahead keeps ``WAIT`` of R in flight, in
``REQUESTS`` requests at once (one per block in flight), each as large as that allows:

- ``WAIT`` (3 ms) bounds what an application's read pays for the read-ahead: a reader's step
  of 32 faults pays at most 0.1 s more than alone.
- ``REQUESTS`` (4) keeps the link busy across the time between one request's end and the next
  one's start (the client's and the server's work per request): one block at a time leaves the
  link idle part of the time (docs/large-files.md has the figures).
- Each request is as large as that allows: every request costs CPU on both sides, and many
  small ones in flight cost the copy both its pace and the application's CPU.

R is measured, not configured: the bytes the read-ahead's requests delivered in each window of
0.1 s while it had work, the most of the last 2 s. The most, because the application's own
reads take part of the link for a while, and a rate measured through small requests would size
smaller ones; a link that stays slower for 2 s is measured slower. Before the first window the
requests are ``READ_MIN``: yield first. On a link faster than ``REQUESTS`` blocks at a time
cover, more blocks are read at once (up to ``MAX_BLOCKS``), each in requests of about a block.
Its weak case is a source whose every request costs a round trip: the rate measured is then the
latency's, and 3 ms of it does not hide the latency (docs/large-files.md has the figures).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

WAIT = 0.003        # an application's read queues behind at most this much of the read-ahead
REQUESTS = 4        # requests in flight at once (blocks read at once, one request each)
MAX_BLOCKS = 32     # blocks read at once at most (each holds a block's buffer)
READ_MIN = 32 << 10  # a request before the link is measured (and the smallest: a FUSE request's order)
WINDOW = 0.1        # the rate's measuring window
KEPT = 20           # windows whose most is the rate: the last 2 s


class ReadPace:
    """The block stager's requests: their size and how many blocks are read at once, from the
    rate its requests were delivered at. ``delivered`` after each request, ``idle`` when no
    block is being read (under the stager's lock)."""

    def __init__(self, block: int, clock: Callable[[], float] = time.monotonic):
        self.block = block
        self._clock = clock
        self._windows: deque[float] = deque(maxlen=KEPT)
        self._start: float | None = None  # the open window's start (None: idle)
        self._bytes = 0
        self.rate: float | None = None    # bytes/s: the most of the kept windows
        self.peak_blocks = REQUESTS

    def delivered(self, nbytes: int, seconds: float) -> None:
        """A request of the read-ahead returned ``nbytes`` after ``seconds``."""
        now = self._clock()
        if self._start is None:
            self._start = now - seconds  # the read-ahead was idle: the window opens with this request
        self._bytes += nbytes
        if now - self._start >= WINDOW:
            self._windows.append(self._bytes / (now - self._start))
            self.rate = max(self._windows)
            self._start, self._bytes = now, 0
            self.peak_blocks = max(self.peak_blocks, self.blocks)

    def idle(self) -> None:
        """No block is being read: the time until the next one says nothing of the link."""
        self._start, self._bytes = None, 0

    @property
    def in_flight_bytes(self) -> int:
        return int(WAIT * self.rate) if self.rate else REQUESTS * READ_MIN

    @property
    def blocks(self) -> int:
        """Blocks read at once."""
        return min(MAX_BLOCKS, max(REQUESTS, -(-self.in_flight_bytes // self.block)))

    def request_bytes(self) -> int:
        """The next request's size: the bytes in flight shared by the blocks read at once, in
        whole pages (a read with O_DIRECT wants them)."""
        share = self.in_flight_bytes // self.blocks // 4096 * 4096
        return max(READ_MIN, min(self.block, share))

    def state(self) -> dict:
        return {"rate_mb_s": round(self.rate / 1e6, 1) if self.rate else None,
                "request_bytes": self.request_bytes(), "blocks": self.blocks, "peak_blocks": self.peak_blocks}
