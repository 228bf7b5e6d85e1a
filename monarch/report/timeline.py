"""The job over time: the daemon's counters sampled on a timer in bounded memory; nodes' series on one grid.

Each point is one interval: how many opens and bytes each source served in it, how many
files and bytes were staged, how many bytes the stager read from the PFS (counts per
interval), and how full each tier was at its end (gauges). A long job never holds more
than ``max_points`` points: when the series is full, neighbours are merged in pairs (counts
summed, the later gauge kept) and the sampling interval doubles, so the points stay evenly
spaced and cover the whole job.

The exported form (``to_dict``) is the report's ``timeline`` (docs/report.md).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Mapping

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0
DEFAULT_MAX_POINTS = 3600
GAUGE_PREFIX = "used."  # series named so are levels at the interval's end, not counts in it


def is_gauge(name: str) -> bool:
    return name.startswith(GAUGE_PREFIX)


class Timeline:
    def __init__(self, start: float, interval: float = DEFAULT_INTERVAL, max_points: int = DEFAULT_MAX_POINTS):
        if max_points < 2:
            raise ValueError("a timeline needs room for at least 2 points")
        self.start = start
        self.interval = interval
        self.max_points = max_points
        self._lock = threading.Lock()
        self._t: list[float] = []            # end of each interval, seconds after start
        self._series: dict[str, list[int]] = {}
        self._last: dict[str, int] = {}      # cumulative counters at the previous sample
        self._last_t = start

    def add(self, now: float, counters: Mapping[str, int], gauges: Mapping[str, int]) -> None:
        """One sample at ``now`` (wall clock): ``counters`` are cumulative (their growth since the
        previous sample is stored), ``gauges`` are levels (stored as they are, named ``used.*``)."""
        with self._lock:
            if now <= self._last_t:
                return
            n = len(self._t)
            values = {name: value - self._last.get(name, 0) for name, value in counters.items()}
            values.update({f"{GAUGE_PREFIX}{name}": value for name, value in gauges.items()})
            for name, value in values.items():
                column = self._series.get(name)
                if column is None:  # a source that appeared late: zeros before
                    column = self._series[name] = [0] * n
                column.append(value)
            for name, column in self._series.items():
                if len(column) == n:  # a series this sample did not mention
                    column.append(column[-1] if is_gauge(name) and column else 0)
            self._t.append(round(now - self.start, 3))
            self._last = dict(counters)
            self._last_t = now
            if len(self._t) >= self.max_points - self.max_points % 2:  # an even count: whole pairs
                self._halve()

    def _halve(self) -> None:
        """Merge neighbours in pairs (an odd last point, after a partial sample, stays as it is);
        sample half as often from now on, so later points are as wide as the merged ones."""
        n = len(self._t)
        pairs = range(0, n - 1, 2)
        tail = [n - 1] if n % 2 else []
        self._t = [self._t[i + 1] for i in pairs] + [self._t[i] for i in tail]
        for name, column in self._series.items():
            if is_gauge(name):
                merged = [column[i + 1] for i in pairs]
            else:
                merged = [column[i] + column[i + 1] for i in pairs]
            self._series[name] = merged + [column[i] for i in tail]
        self.interval *= 2

    def __len__(self) -> int:
        return len(self._t)

    def to_dict(self) -> dict:
        with self._lock:
            return {"start": round(self.start, 3), "interval": self.interval, "t": list(self._t),
                    "series": {name: list(column) for name, column in sorted(self._series.items())}}


class Sampler:
    """A daemon thread that feeds ``timeline`` from ``read()`` -> (counters, gauges) every interval."""

    def __init__(self, timeline: Timeline, read: Callable[[], tuple[dict, dict]]):
        self.timeline = timeline
        self._read = read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monarch-timeline", daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def sample(self) -> None:
        counters, gauges = self._read()
        self.timeline.add(time.time(), counters, gauges)

    def _run(self) -> None:
        while not self._stop.wait(self.timeline.interval):
            try:
                self.sample()
            except Exception:  # a failed sample loses one point, never the daemon
                log.exception("timeline sample failed")

    def stop(self) -> None:
        self._stop.set()


def combine_timelines(timelines: list[dict]) -> dict:
    """The nodes' timelines on one grid of the coarsest interval, from the earliest start:
    counts summed, gauges (``used.*``) summed over nodes at each point's end."""
    if len(timelines) == 1:
        return timelines[0]
    step = max(tl["interval"] for tl in timelines)
    origin = min(tl["start"] for tl in timelines)
    end = max((tl["start"] + tl["t"][-1] for tl in timelines if tl["t"]), default=origin)
    n = max(1, int((end - origin) // step) + (1 if (end - origin) % step else 0))
    series: dict[str, list[int]] = {}
    for tl in timelines:
        levels: dict[str, list[int | None]] = {}
        for name, column in tl["series"].items():
            out = series.setdefault(name, [0] * n)
            level = levels.setdefault(name, [None] * n)
            for t, value in zip(tl["t"], column):
                slot = min(n - 1, max(0, int((tl["start"] + t - origin - 1e-9) // step)))
                if is_gauge(name):
                    level[slot] = value  # the node's last level in the slot
                else:
                    out[slot] += value
        for name, level in levels.items():
            if is_gauge(name):
                last = 0
                for i, value in enumerate(level):
                    last = value if value is not None else last
                    series[name][i] += last
    return {"start": round(origin, 3), "interval": step,
            "t": [round((i + 1) * step, 3) for i in range(n)], "series": series}
