"""How many copies the stager keeps in flight toward its sources: fixed, or found by measurement.

Deep enough to hide a high-latency PFS (tens to hundreds of copies at 20-100 ms per open),
no deeper than helps (fewer copies for the same rate spare the source, and on a fast source
of small files every thread more is contention: issue 32 measured 3,000 files/s at the 256
threads the old rule climbed to, against 4,100 at 4).
"""

from __future__ import annotations

import enum
import time
from typing import Callable


class _Phase(enum.Enum):
    MEASURE = "measure"  # the current limit, afresh: the base the neighbours are compared with
    UP = "up"            # twice the base limit
    DOWN = "down"        # half the base limit
    SETTLED = "settled"  # at the base limit until the next round


class Concurrency:
    """How many copies may be in flight: fixed, or found by measuring neighbouring limits.

    Adaptive (``fixed`` None): start at ``start``. A round measures the current limit (its
    base rate: completed copies per second), then twice as many: kept while each doubling
    gives more than ``GAIN`` times the rate of the limit below it; when the first doubling
    of a round does not pay, half as many is measured and taken when the limit above it does
    not give ``GAIN`` times its rate, and so on down to ``low``. One rule both ways: the
    higher of two limits is kept only if it pays, so the limit stops where the rate stops
    growing and comes back down when more copies stopped paying. After ``REPROBE`` windows
    at the result a new round starts from it (a source's latency changes).

    Each limit is judged on ``WINDOWS`` windows pooled, after ``WARMUP`` windows in which
    the copies started under the previous limit end; only windows in which the limit was
    reached (there was work for every slot) count. A window lasts ``PERIOD`` seconds or
    three mean copy times, whichever is longer, so a 100 ms source is judged on whole
    generations of copies. The old rule compared one window with the best single window
    seen and only ever probed upward: every lucky window (other processes, the walk, a
    collection pause) was a doubling kept for good, up to the cap (issue 32).
    """

    START = 8
    PERIOD = 0.25
    GAIN = 1.15
    WARMUP = 1
    WINDOWS = 2
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
        self.history: list[tuple[int, float]] = []  # (limit, copies/s) of every judged window
        self.recent_seconds: float | None = None  # moving mean of a copy's time (weight 1/8)
        # the round under way: the base limit and its rate, what is measured now, the pool
        self._phase = _Phase.MEASURE
        self._base: tuple[int, float] | None = None  # (limit, copies/s)
        self._climbed = False  # the base was reached by a doubling that paid, this round
        self._seen = 0         # judged windows at the current limit (the warm-up ones included)
        self._pool = (0, 0.0)  # copies and seconds of the counted windows at the current limit

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
        if self._saturated:
            self._judge(self._done, span)
        self._t0, self._done, self._seconds, self._saturated = now, 0, 0.0, True

    # -- the rule ---------------------------------------------------------------------------
    def _judge(self, copies: int, span: float) -> None:
        self.history.append((self.limit, copies / span))
        self._seen += 1
        if self._phase is _Phase.SETTLED:
            if self._seen >= self.REPROBE:
                self._move(self.limit, _Phase.MEASURE)
            return
        if self._seen <= self.WARMUP:
            return
        self._pool = (self._pool[0] + copies, self._pool[1] + span)
        if self._seen < self.WARMUP + self.WINDOWS:
            return
        rate = self._pool[0] / self._pool[1]
        if self._phase is _Phase.MEASURE:
            self._base, self._climbed = (self.limit, rate), False
            self._up_or_down()
        elif self._phase is _Phase.UP:
            base_limit, base_rate = self._base
            if rate > base_rate * self.GAIN:  # the doubling paid: keep it, try the next
                self._base, self._climbed = (self.limit, rate), True
                self._up_or_down()
            elif self._climbed:  # the base itself paid over the limit below it: the top
                self._move(base_limit, _Phase.SETTLED)
            else:
                self._down_or_settle(base_limit)
        else:  # DOWN
            base_limit, base_rate = self._base
            if base_rate > rate * self.GAIN:  # the base pays over half as many: it stays
                self._move(base_limit, _Phase.SETTLED)
            else:  # half as many copies give as much: take it, try fewer still
                self._base = (self.limit, rate)
                self._down_or_settle(self.limit)

    def _up_or_down(self) -> None:
        base_limit = self._base[0]
        if base_limit * 2 <= self.high:
            self._move(base_limit * 2, _Phase.UP)
        elif self._climbed:
            self._move(base_limit, _Phase.SETTLED)
        else:
            self._down_or_settle(base_limit)

    def _down_or_settle(self, base_limit: int) -> None:
        if base_limit // 2 >= self.low:
            self._move(base_limit // 2, _Phase.DOWN)
        else:
            self._move(base_limit, _Phase.SETTLED)

    def _move(self, limit: int, phase: _Phase) -> None:
        self.limit, self._phase, self._seen, self._pool = limit, phase, 0, (0, 0.0)
