"""The peer layer's transfer counters: files (and large files' ranges) and bytes each way, failures by reason.

Filled from any thread (fetching threads, the serving pool), read by ``Cluster.counters()``
into the daemon's statistics. ``bytes_*`` are the files' bytes, ``wire_bytes_*`` what
crossed the network (a compressed copy as stored); ``after_loss`` counts again what was
moved once a node was lost (the report's "lost" section).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from ..errors import FailureReason, PeerError


class PeerCounters:
    """Thread-safe counters; ``lost`` is the liveness part's map of lost nodes (read only)."""

    def __init__(self, lost: Mapping[int, dict]):
        self._lost = lost
        self._lock = threading.Lock()
        self._counts: dict[str, Any] = {
            "bytes_sent": 0, "bytes_received": 0, "wire_bytes_sent": 0, "wire_bytes_received": 0,
            "files_sent": 0, "files_received": 0,
            "ranges_sent": 0, "ranges_received": 0,  # spans of large files' blocks (their bytes in bytes_*)
            "fetch_failures": {}, "serve_failures": {},
            "slow_fetches": 0,  # the owner answered pings but took over heartbeat_timeout: slow, not dead
            "after_loss": {"files_sent": 0, "bytes_sent": 0, "files_received": 0, "bytes_received": 0}}

    def fetch_failed(self, reason: FailureReason, message: str) -> PeerError:
        """Count a failed fetch; the PeerError to raise for it."""
        with self._lock:
            failures = self._counts["fetch_failures"]
            failures[reason.value] = failures.get(reason.value, 0) + 1
        return PeerError(message, reason)

    def serve_failed(self, why: str) -> None:
        """Count a request not served, by why (a ``provide.ServeFailure``)."""
        why = str(why)  # the plain value: counters are pickled to the coordinator and written as JSON
        with self._lock:
            failures = self._counts["serve_failures"]
            failures[why] = failures.get(why, 0) + 1

    def slow_fetch(self) -> None:
        with self._lock:
            self._counts["slow_fetches"] += 1

    def sent(self, size: int, wire_size: int | None = None, unit: str = "files") -> None:
        self._moved("sent", size, size if wire_size is None else wire_size, unit)

    def received(self, size: int, wire_size: int, unit: str = "files") -> None:
        self._moved("received", size, wire_size, unit)

    def _moved(self, way: str, size: int, wire_size: int, unit: str) -> None:
        with self._lock:
            self._counts[f"bytes_{way}"] += size
            self._counts[f"wire_bytes_{way}"] += wire_size
            self._counts[f"{unit}_{way}"] += 1
            if self._lost:
                self._counts["after_loss"][f"bytes_{way}"] += size
                if unit == "files":
                    self._counts["after_loss"][f"files_{way}"] += 1

    def snapshot(self) -> dict[str, Any]:
        """A copy of the counters (failures by reason)."""
        with self._lock:
            out = dict(self._counts)
            out["fetch_failures"] = dict(out["fetch_failures"])
            out["serve_failures"] = dict(out["serve_failures"])
            out["after_loss"] = dict(out["after_loss"])
        return out
