"""Node 0's walk streamed to every node as it goes, so that staging starts with the walk.

A sequence of broadcasts (each polled, as ``Cluster.share`` does): while node 0 walks,
``("files", {key: info})`` parts of what it found, at most every STREAM_EVERY seconds; at
the end ``("ok", value)`` (or ``("error", why)``). Every node sees every part in the same
order. Node 0's walk blocks only for the broadcast of a part (the other nodes are already
waiting for it), never for the other nodes' staging: their ``on_files`` runs after the
broadcast, on their own thread.
"""

from __future__ import annotations

import logging
import pickle
import time
from typing import Any, Callable, Protocol

from ..errors import FailureReason, PeerError

log = logging.getLogger(__name__)

STREAM_EVERY = 0.05   # seconds between parts (a broadcast of a part costs a few ms)
PART_FILES = 20_000   # or sooner when this many files are waiting


class Broadcaster(Protocol):
    """What a streamed share needs of the collectives (``collective.Collectives``)."""
    node: int

    def bcast_bytes(self, payload: bytes | None, deadline: float | None) -> bytes: ...


class StreamedShare:
    """One streamed ``share`` (see ``Cluster.share``)."""

    def __init__(self, cluster: Broadcaster, on_files: Callable[[dict], None], timeout: float | None):
        self.cluster = cluster
        self.on_files = on_files
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._pending: dict = {}
        self._last = 0.0  # the walk's first files go at once

    def run(self, take: Callable[[Callable[[dict], None]], Any]) -> Any:
        return self._lead(take) if self.cluster.node == 0 else self._follow()

    # -- node 0 ---------------------------------------------------------------------------
    def _lead(self, take: Callable[[Callable[[dict], None]], Any]) -> Any:
        try:
            value = take(self._publish)
        except Exception as exc:
            self._flush()
            self._send(("error", f"{type(exc).__name__}: {exc}"))
            raise
        self._flush()
        self._send(("ok", value))
        return value

    def _publish(self, files: dict) -> None:
        """On the walking thread: ``files`` found; this node stages from them at once, the
        others once their part is sent."""
        if not files:
            return
        self._tell(files)
        self._pending.update(files)
        if len(self._pending) >= PART_FILES or time.monotonic() - self._last >= STREAM_EVERY:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            part, self._pending = self._pending, {}
            self._send(("files", part))
        self._last = time.monotonic()

    def _send(self, message: tuple) -> None:
        self.cluster.bcast_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL), self.deadline)

    def _tell(self, files: dict) -> None:
        # staging early is a bonus: a failure here must not break the walk's broadcasts
        try:
            self.on_files(files)
        except Exception:
            log.exception("staging the files of node 0's walk as they come failed; they are staged after the walk")

    # -- the other nodes ------------------------------------------------------------------
    def _follow(self) -> Any:
        while True:
            kind, value = pickle.loads(self.cluster.bcast_bytes(None, self.deadline))
            if kind == "files":
                self._tell(value)
            elif kind == "ok":
                return value
            else:
                raise PeerError(f"node 0 could not take the dataset snapshot: {value}", FailureReason.FAILED)
