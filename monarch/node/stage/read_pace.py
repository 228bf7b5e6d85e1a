"""How much of the PFS the block stager keeps asked for at once: the link's round trip and a few milliseconds of its measured rate.

An application's read of the PFS (a page fault of a mapping, a read of a block not staged yet)
waits behind the read-ahead's bytes that are queued at the link, not behind those still on their
round trip: on a link of rate R and base latency L, the read-ahead's bytes in flight beyond
R x L (Little's law) are a queue of (in flight - R x L) / R seconds. So the read-ahead keeps
R x (L + ``WAIT``) in flight: the link full, and an application's read queued behind at most
about ``WAIT`` of it, at any rate and any latency.

- ``WAIT`` (3 ms) bounds what an application's read pays for the read-ahead: a reader's step
  of 32 faults pays at most 0.1 s more than alone. On a slow link (under ``SLOW_RATE``, 100
  MB/s) it is half that, in two requests (``SLOW_REQUESTS``) of the same time each: there the
  bytes, not the requests' overheads, set what a fault costs, and direct's fault reads 128 KiB
  around (2.6 ms at 50 MB/s) where a page fault behind 3 ms of read-ahead, twice for a window
  across two pages, cost more (a Megatron-style reader's first quarter at 0.77-0.87x direct's
  pace); two requests keep a slow link full (46 of 50 MB/s), where on a quick one the copy
  slows by a third.
- R is measured: the bytes the read-ahead's requests delivered in each window of 0.1 s (at
  least one request) while it had work, the most of the last 2 s. The most, because the
  application's own reads take part of the link for a while; a link that stays slower for 2 s
  is measured slower.
- L is the quickest request yet, less its bytes' time at R: a request alone takes the round
  trip and its bytes' time, and one queued behind others takes longer. Only the quickest is
  free of the read-ahead's own queue, so any later, longer measure would let the queue grow
  itself. A link whose latency rises later is then under-filled: the safe side. (Its bytes'
  time at the R of now: R measured early, through few bytes in flight, is too low.)
- While nothing queues, the link has room for more: the bytes in flight double every window
  (``GROWTH``, as a TCP slow start does; ``PROBE``, a quarter more, once the link was found
  full). R measured on a link not yet full is the round trip's, not the link's, and
  R x (L + WAIT) of it would grow by only WAIT / L a window. "Nothing queues": the window's
  requests waited behind others, on the mean, less than half of what holding would make them
  wait (WAIT, less a request's own bytes' time). The window after the read-ahead asked less
  says nothing: its pause drains the queue.
- The bytes in flight are read as ``REQUESTS`` blocks at once (more on a link whose bytes in
  flight are more than that many blocks, up to ``MAX_BLOCKS``), each in requests as large as
  that allows: four keep the link busy across the time between one request's end and the next
  one's start, and every request costs CPU on both sides.

Before the first window the requests are ``READ_MIN``: yield first.

The queue bound is for the application's own reads of the PFS; where there are none, it only
slows the copy. A whole-file reader in small calls (``md5sum``, ``cat``) reads the blocks from the
copy as they land, waiting for the read-ahead, and at 50 MB/s two requests of 40 KiB kept the link
at 46.9-49 of its 50 MB/s (the time from one request's end to the next one's start, a daemon's and
a FUSE server's threads on a busy node, is about a request's time there): 1.01-1.10x direct's
time. So while the read-ahead is ``alone`` on the link (no file of it mapped, whose faults read the
PFS unseen, and no shim's read of the PFS for ``ALONE_QUIET``: the map's ``mapped`` and
``pfs_reads``, ``blocks.py`` looks) it keeps ``REQUESTS`` requests and ``ALONE_WAIT`` of the link in
flight (four of 128 KiB at 50 MB/s, of 1 MiB at 400): the same reader at 0.99-1.00x. An
application's first read of the PFS after a quiet second waits behind at most that, 1% of it.

A reader of records (an LMDB's values of 64 KiB, read at random through a mapping: the shim tells
it by the runs of pages its faults bring in, and says so in the block map's ``records``) waits
for its faults one after another, each a read-around of 128 KiB; behind the read-ahead's queue
its first gets, while the copy runs, went at 0.46x direct's pace, and beside one stream of 304 KiB
requests alone (no Monarch) at 0.59x: it is the link's queue, not its bytes (direct used 223 of
400 MB/s). So while such a reader's file is being staged the read-ahead yields (``yielding``):
one request at a time of ``YIELD_REQUEST``, which a fault waits behind at most. Measured beside
direct's gets, one stream of 32, 64 or 128 KiB requests kept them at 0.88x, 0.96x and 0.88x of
their pace alone. And where the application's reads fill the link themselves (LMDB's gets at 50
MB/s read 47 MB/s direct), any bytes of the copy are the job's time: a request the application's
reads held back more than ``YIELD_TARGET`` is followed by a pause ``YIELD_GAIN`` times that
excess (LEDBAT's rule for a background transfer, its delay measured against the quickest
yielding request): at 50 MB/s the job went from 1.19x direct's time to 1.02-1.04x, at 400 MB/s
(faults rarely hold a request 1 ms) it stays 0.91-0.96x.

The round trip also decides how an application's fault of a mapping of the PFS's file reads
(``readaround``): one page (the shim's MADV_RANDOM: the read-ahead is the daemon's) or the
kernel's read-around of 128 KiB. A 2 KiB window straddles two pages half the time, so reading
pages costs half a round trip more per window on the mean; reading around costs 124 KiB more of
the link, at most 2.5 ms at 50 MB/s. From a round trip of ``READAROUND`` (5 ms), reading around
is the quicker; it is said once the first window measured the rate (a request's time on a slow
link is its bytes', not a round trip).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

WAIT = 0.003        # an application's read queues behind at most this much of the read-ahead
REQUESTS = 4        # requests in flight at once (blocks read at once, one request each)
SLOW_RATE = 100e6   # bytes/s under which the read-ahead holds half of it, in SLOW_REQUESTS requests
SLOW_REQUESTS = 2
MAX_BLOCKS = 32     # blocks read at once at most (each holds a block's buffer)
READ_MIN = 32 << 10  # a request before the link is measured (and the smallest: a FUSE request's order)
WINDOW = 0.1        # the rate's measuring window
KEPT = 20           # windows whose most is the rate: the last 2 s
GROWTH = 2          # bytes in flight, times, each window nothing queues until the link was first full
PROBE = 1.25        # the same once it was: more than the round trip's worth queues for a window
READAROUND = 0.005  # a round trip from which an application's fault reads around (the kernel's 128 KiB)
YIELD_REQUEST = 64 << 10  # yielding to a reader of records: one request at a time, of this (half a read-around)
YIELD_TARGET = 0.001  # ... held back by the application's reads up to this, it goes on at once
YIELD_GAIN = 16       # ... beyond it, it waits this many times as long before its next request
YIELD_PAUSE_MAX = 0.05
ALONE_WAIT = 0.010  # alone on the link: the link's time in flight beyond the round trip
ALONE_QUIET = 1.0   # ... once no application's read of the PFS came for this long


class ReadPace:
    """The block stager's requests: their size and how many blocks are read at once, from the
    rate and the round trip its requests were delivered at. ``delivered`` after each request,
    ``idle`` when no block is being read (under the stager's lock)."""

    def __init__(self, block: int, clock: Callable[[], float] = time.monotonic):
        self.block = block
        self._clock = clock
        self._windows: deque[float] = deque(maxlen=KEPT)
        self._start: float | None = None  # the open window's start (None: idle)
        self._bytes = 0
        self._requests = 0
        self._queued = 0.0                # the open window's requests' waits behind others, summed
        self.rate: float | None = None    # bytes/s: the most of the kept windows
        self._quickest: tuple[float, int] | None = None  # the quickest request yet: seconds, bytes
        self.in_flight_bytes = REQUESTS * READ_MIN
        self._full = False                # a window's requests queued: the link was full once
        self._draining = False            # the last window asked less than before
        self.peak_blocks = REQUESTS
        self.yielding = False             # to a reader of records (``yield_to_records``)
        self._yield_base: float | None = None  # the quickest yielding request: its time alone on the link
        self._yield_excess = 0.0          # the last one's time beyond it: the application's bytes ahead of it
        self.alone = False                # no application's read of the PFS queues behind it (``alone_on_link``)

    def yield_to_records(self, on: bool) -> None:
        """While ``on``, one request at a time of YIELD_REQUEST: a reader of records' faults
        wait behind little of the read-ahead. Its requests then say nothing of the link."""
        if on != self.yielding:
            self.yielding = on
            self.idle()

    def alone_on_link(self, on: bool) -> None:
        """While ``on`` no application's read of the PFS queues behind the read-ahead: it keeps
        ``REQUESTS`` requests and ``ALONE_WAIT`` of the link in flight (from the next window).
        Off it, the bytes in flight drop to the bound at once (the first request asked after an
        application's read is small already), once the link was found full: before, they are
        a slow start's probe, which a rate measured on a long round trip's first requests would
        cut short (at 50 ms per read call the copy took 8.1-8.6 s where it took 6.1)."""
        if on == self.alone:
            return
        self.alone = on
        if not on and self._full and self.rate:
            hold = int(self.rate * (self.latency + self.wait))
            if hold < self.in_flight_bytes:
                self.in_flight_bytes = hold
                self.idle()

    def yield_pause(self) -> float:
        """Seconds to wait before the next yielding request: the time the application's reads
        held the last one back, beyond YIELD_TARGET, YIELD_GAIN times (a background transfer's
        rule, as LEDBAT's): where they fill the link the read-ahead takes about nothing of it,
        where they leave it room it goes on."""
        if not self.yielding:
            return 0.0
        return min(YIELD_PAUSE_MAX, YIELD_GAIN * max(0.0, self._yield_excess - YIELD_TARGET))

    def delivered(self, nbytes: int, seconds: float) -> None:
        """A request of the read-ahead returned ``nbytes`` after ``seconds``."""
        if self.yielding:  # (the link is left to the application on purpose: its rate is not measured so)
            if nbytes == YIELD_REQUEST:  # (a file's short last request is no measure of the others)
                self._yield_base = seconds if self._yield_base is None else min(self._yield_base, seconds)
                self._yield_excess = seconds - self._yield_base
            return
        now = self._clock()
        if self._start is None:
            self._start = now - seconds  # the read-ahead was idle: the window opens with this request
        self._bytes += nbytes
        self._requests += 1
        if self._quickest is None or seconds < self._quickest[0]:
            self._quickest = (seconds, nbytes)
        if self.rate:  # its wait behind others: beyond the round trip and its own bytes' time
            self._queued += seconds - self.latency - nbytes / self.rate
        if now - self._start >= WINDOW:
            self._measured(self._bytes / (now - self._start))
            self.idle()
            self._start = now

    def _measured(self, rate: float) -> None:
        """A window's end: its rate, and its requests' mean wait behind others."""
        queued = self._queued / self._requests if self.rate else 0.0  # (the first window: not known)
        self._windows.append(rate)
        self.rate = max(self._windows)
        wait = self.wait
        hold = self.rate * (self.latency + wait)
        # holding, a request's time at the link is the wait: its own bytes' and its wait behind others
        if queued > max(0.0, wait - self.request_bytes() / self.rate) / 2:
            self._full = True
        elif not self._draining and self._requests >= self.blocks:  # nothing queued, and the bytes were asked
            hold = max(hold, (PROBE if self._full else GROWTH) * self.in_flight_bytes)
        hold = int(min(hold, MAX_BLOCKS * self.block))
        self._draining = hold < self.in_flight_bytes  # the next window's pause says nothing of the link
        self.in_flight_bytes = hold
        self.peak_blocks = max(self.peak_blocks, self.blocks)

    def idle(self) -> None:
        """No block is being read: the time until the next one says nothing of the link."""
        self._start, self._bytes, self._requests, self._queued = None, 0, 0, 0.0

    @property
    def requests(self) -> int:
        """Requests at once at the least: fewer on a slow link, unless alone on it."""
        slow = self.rate is not None and self.rate < SLOW_RATE and not self.alone
        return SLOW_REQUESTS if slow else REQUESTS

    @property
    def wait(self) -> float:
        """Seconds of the read-ahead an application's read queues behind at most."""
        return ALONE_WAIT if self.alone else WAIT * self.requests / REQUESTS

    @property
    def latency(self) -> float | None:
        """Seconds: the link's round trip, the quickest request yet less its bytes' time."""
        if self._quickest is None:
            return None
        seconds, nbytes = self._quickest
        return max(0.0, seconds - nbytes / self.rate) if self.rate else seconds

    @property
    def readaround(self) -> bool:
        """Is the round trip long enough that a fault of a mapping should read around?"""
        return self.rate is not None and self.latency >= READAROUND  # (a slow link's bytes are not a round trip)

    @property
    def blocks(self) -> int:
        """Blocks read at once."""
        if self.yielding:
            return 1
        return min(MAX_BLOCKS, max(self.requests, -(-self.in_flight_bytes // self.block)))

    def request_bytes(self) -> int:
        """The next request's size: the bytes in flight shared by the blocks read at once, in
        whole pages (a read with O_DIRECT wants them)."""
        if self.yielding:
            return min(self.block, YIELD_REQUEST)
        share = self.in_flight_bytes // self.blocks // 4096 * 4096
        return max(READ_MIN, min(self.block, share))

    def state(self) -> dict:
        """The report's ``staging.blocks.pace`` (``describe`` says it in a line)."""
        return {"rate_mb_s": round(self.rate / 1e6, 1) if self.rate else None,
                "latency_ms": round(self.latency * 1e3, 2) if self.latency is not None else None,
                "readaround": self.readaround,
                "request_bytes": self.request_bytes(), "blocks": self.blocks, "peak_blocks": self.peak_blocks,
                "yielding": self.yielding, "alone": self.alone}


def describe(state: dict) -> str:
    """A pace as ``state`` gave it, in a line: the rate and round trip measured, the requests'
    size x the blocks read at once (the most at once)."""
    return (f"{state['rate_mb_s']} MB/s, {state['latency_ms']} ms, {state['request_bytes'] >> 10} KiB"
            f" x {state['blocks']} ({state['peak_blocks']})"
            + (", yielding to a reader of records" if state.get("yielding") else "")
            + (", alone on the link" if state.get("alone") else ""))
