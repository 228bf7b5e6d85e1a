"""How many copies the stager keeps in flight toward its sources: fixed, or found by climbing.

Deep enough to hide a high-latency PFS (tens to hundreds of copies at 20-100 ms per open),
no deeper than helps (fewer copies for the same rate spare the source).
"""

from __future__ import annotations

import time
from typing import Callable


class Concurrency:
    """How many copies may be in flight: fixed, or found by climbing while it pays.

    Adaptive (``fixed`` None): start at ``start``; over windows in which the limit was
    reached (there was work for every slot), measure completed copies per second; double
    the limit while that grows by more than ``GAIN``, go back to the best limit when it
    falls, and measure afresh every ``REPROBE`` windows (a source's latency changes).
    Only an increase that paid is kept: a limit that gives no more than the best so far
    goes back to the best one (fewer copies in flight for the same rate spare the source).
    A window lasts ``PERIOD`` seconds or three mean copy times, whichever is longer, so a
    100 ms source is judged on whole generations of copies.
    """

    START = 8
    PERIOD = 0.25
    GAIN = 1.15
    REPROBE = 16

    def __init__(self, fixed: int | None = None, start: int = START, low: int = 4, high: int = 256,
                 clock: Callable[[], float] = time.monotonic):
        self.fixed = fixed
        self.low, self.high = low, max(low, high)
        self.limit = fixed if fixed else min(max(start, low), self.high)
        self._clock = clock
        self._t0 = clock()
        self._done = 0
        self._seconds = 0.0
        self._saturated = True
        self._best: tuple[float, int] | None = None  # (rate, limit)
        self._windows = 0
        self.history: list[tuple[int, float]] = []  # (limit, copies/s) of every judged window
        self.recent_seconds: float | None = None  # moving mean of a copy's time (weight 1/8)

    def starved(self) -> None:
        """A slot was free and there was nothing to copy: this window says nothing of the source."""
        self._saturated = False

    def completed(self, seconds: float) -> None:
        """One copy ended after ``seconds``; maybe move the limit (call under the stager's lock)."""
        self._done += 1
        self._seconds += seconds
        r = self.recent_seconds
        self.recent_seconds = seconds if r is None else r + (seconds - r) / 8
        if self.fixed:
            return
        now = self._clock()
        span = now - self._t0
        mean = self._seconds / self._done
        if span < max(self.PERIOD, 3 * mean) or self._done < 4:
            return
        rate = self._done / span
        if self._saturated:
            self._judge(rate)
        self._t0, self._done, self._seconds, self._saturated = now, 0, 0.0, True

    def _judge(self, rate: float) -> None:
        self.history.append((self.limit, rate))
        self._windows += 1
        if self._windows % self.REPROBE == 0:
            self._best = None
        best = self._best
        if best is None or rate > best[0] * self.GAIN:
            self._best = (rate, self.limit)
            self.limit = min(self.high, self.limit * 2)
        elif self.limit > best[1]:
            self.limit = best[1]  # more copies at once did not pay: back to the fewest that gave the best
        # else: at the best limit; stay
