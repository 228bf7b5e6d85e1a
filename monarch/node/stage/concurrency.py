"""How many copies a Python lane keeps in flight toward its source: fixed, or found by measurement.

The rule is the front door's (``monarch/frontdoor/inflight.c``), one for every lane of whole
files, C or Python (design principle 14; a large file's blocks are paced in bytes by
``read_pace.py``): enough copies to hide the source's latency at the rate it
gives (Little's law), no more than help. A slow start doubles the limit each generation of
copies while their latency stays flat (50 ms a copy: 128 in flight after 0.2 s), then rounds
of measurement keep a doubling only if it pays (on a fast source of small files
every thread more is contention; 3,000 files/s at 256 threads against 4,100 at 4).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from monarch import frontdoor

log = logging.getLogger(__name__)

_warned = False


class Concurrency:
    """How many copies may be in flight: ``fixed``, or adaptive from ``start`` between ``low``
    and ``high`` (inflight.c's rule, measured on ``clock``). Call ``completed`` once per copy
    and ``starved`` whenever a slot was free with nothing to copy (under the caller's lock)."""

    START = 8

    def __init__(self, fixed: int | None = None, start: int = START, low: int = 4, high: int = 256,
                 clock: Callable[[], float] = time.monotonic):
        self.fixed = fixed
        self.low, self.high = low, max(low, high)
        self._clock = clock
        self.recent_seconds: float | None = None  # moving mean of a copy's time (weight 1/8)
        lib = frontdoor.library()
        self._flow = frontdoor.Flow(lib, fixed, start, low, self.high) if lib is not None else None
        if self._flow is None:
            _say_fixed(start)
        self._fixed_limit = fixed or min(max(start, low), self.high)

    @property
    def limit(self) -> int:
        return self._flow.limit if self._flow is not None else self._fixed_limit

    def starved(self) -> None:
        """A slot was free and there was nothing to copy: this window says nothing of the source."""
        if self._flow is not None:
            self._flow.starved()

    def completed(self, seconds: float) -> None:
        """One copy ended after ``seconds``; maybe move the limit."""
        r = self.recent_seconds
        self.recent_seconds = seconds if r is None else r + (seconds - r) / 8
        if self._flow is not None and not self.fixed:
            self._flow.completed(seconds, self._clock())

    def state(self) -> dict:
        """The measure's figures (limit, peak, phase, windows judged, mean copy time)."""
        if self._flow is None:
            return {"limit": self.limit, "peak": self.limit, "phase": "fixed (no C library)"}
        return self._flow.state()


def _say_fixed(start: int) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("the front door's library cannot be built here: the stager keeps %d copies in flight, "
                    "whatever the source's latency", start)
