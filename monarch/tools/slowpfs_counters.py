"""The emulated PFS's books and links (:mod:`monarch.tools.slowpfs`): the counters it keeps of every
call, in total and per file (flushed as JSON by a thread of their own), and the shared links that
cap its read and write bandwidth. Nothing here needs FUSE.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from typing import Any

# opens: every open, for reading or writing, creates included; each costs the open latency
# truncates: truncate and ftruncate calls and opens with O_TRUNC
WRITE_KEYS = ("writes", "bytes_written", "creates", "fsyncs", "renames", "unlinks", "mkdirs", "rmdirs", "truncates")
COUNTER_KEYS = ("opens", "reads", "bytes", "lookups", "readdirs", "accesses", "opendirs", "statfs", *WRITE_KEYS)
BYTES_OF = {"reads": "bytes", "writes": "bytes_written"}  # a call's counter -> its bytes' counter
# the metadata server's work: getattr (every kernel LOOKUP and GETATTR), readdir, access;
# each costs the lookup latency
METADATA_KEYS = ("lookups", "readdirs", "accesses")
FLUSH_INTERVAL_S = 0.01
# a writer's requests come one after the other, with the emulator's own work between them (~1 ms a
# 1 MiB request): a gap that short leaves the write link's time to the writer, else one stream got 164 of 200 MB/s
WRITE_IDLE_CREDIT_S = 0.010
OPS_KEPT = 10_000  # the namespace operations kept, the last ones: the list cannot grow without bound


class Counters:
    """Thread-safe counters, flushed as JSON (atomically) by a background thread; per file too unless
    ``per_file`` is False (a generated tree of millions: its totals only)."""

    def __init__(self, path: str, interval: float = FLUSH_INTERVAL_S, per_file: bool = True) -> None:
        self.path = path
        self.interval = interval
        self.per_file = per_file
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(COUNTER_KEYS, 0)
        self._files: dict[str, list[int]] = {}  # rel path -> [opens, reads, bytes, bytes_written]
        self._ops: deque[str] = deque(maxlen=OPS_KEPT)
        self._ops_total = 0  # every op ever, kept or not: a later snapshot's new ones are its last (difference)
        self._opening = 0
        self.opening_peak = 0  # the most opens under way at once (how much the emulator serves in parallel)
        self.opening_first = 0.0  # when the first open began (time.time())
        self.opening_peaks: list[tuple[float, int]] = []  # (seconds after the first open, the new peak), as it rose
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, key: str | None, path: str | None = None, n: int = 1, nbytes: int = 0,
            op: str | None = None) -> None:
        """Count ``n`` of ``key`` (and ``nbytes`` of its bytes), for ``path`` too; ``op``: appended to ops."""
        with self._lock:
            if key is not None:  # None: an op alone (a link)
                self._totals[key] += n
            if nbytes:
                self._totals[BYTES_OF[key]] += nbytes
            if path is not None and self.per_file:
                per = self._files.setdefault(path, [0, 0, 0, 0])
                if key == "opens":
                    per[0] += n
                elif key == "reads":
                    per[1] += n
                    per[2] += nbytes
                elif key == "writes":
                    per[3] += nbytes
            if op is not None:
                self._ops.append(op)
                self._ops_total += 1
        self._dirty.set()

    def opening(self, delta: int) -> None:
        with self._lock:
            self._opening += delta
            if not self.opening_first:
                self.opening_first = time.time()
            if self._opening > self.opening_peak:
                self.opening_peak = self._opening
                self.opening_peaks.append((round(time.time() - self.opening_first, 4), self._opening))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            data: dict[str, Any] = dict(self._totals)
            data["opening_peak"] = self.opening_peak
            data["opening_peaks"] = list(self.opening_peaks)
            # bytes_written only where written: a read-only mount's figures stay as they were
            data["files"] = {p: {"opens": o, "reads": r, "bytes": b, **({"bytes_written": w} if w else {})}
                             for p, (o, r, b, w) in self._files.items()}
            data["ops"] = list(self._ops)
            data["ops_total"] = self._ops_total
        data["pid"] = os.getpid()
        data["time"] = time.time()
        return data

    def flush(self) -> None:
        self._dirty.clear()
        data = self.snapshot()
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w", opener=lambda path, flags: os.open(path, flags, 0o644)) as f:  # whatever the umask
            json.dump(data, f)
        os.replace(tmp, self.path)

    def start(self) -> None:
        self.flush()
        self._thread = threading.Thread(target=self._run, name="slowpfs-counters", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.flush()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            self.flush()
            time.sleep(self.interval)


class Throttle:
    """A shared link of fixed bandwidth: each read (or write) waits for its turn on the wire; a
    turn may begin up to ``idle_credit`` seconds before it was asked for if the link was idle then."""

    def __init__(self, bandwidth: float, idle_credit: float = 0.0) -> None:
        self.bandwidth = bandwidth
        self.idle_credit = idle_credit
        self._lock = threading.Lock()
        self._free_at = 0.0

    def wait(self, nbytes: int) -> None:
        if self.bandwidth <= 0 or nbytes <= 0:
            return
        with self._lock:
            start = max(time.monotonic() - self.idle_credit, self._free_at)
            self._free_at = start + nbytes / self.bandwidth
            done = self._free_at
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)
