"""Where the dataset snapshot is (being walked, ready, failed), and what waits for it.

The daemon answers ATTACH while it walks; everything that needs the snapshot waits here:
the server holds OPEN, INDEX and full REPORTs until it settles (``when_settled``), and the
job's writes (INVALIDATE) and order hints (HINT) that arrive meanwhile are held and handed
back, in order, when the daemon is ready to apply them (``hold_write``, ``hold_hint``)."""

from __future__ import annotations

import enum
import threading
from typing import Callable


class SnapshotState(enum.Enum):
    """Where the daemon's snapshot is: being walked, ready (index written), or failed."""
    WALKING = "walking"
    READY = "ready"
    FAILED = "failed"


class SnapshotGate:
    """The snapshot's state and the work held until it settles. ``lock`` is only ever held
    for a moment (the event loop takes it); the daemon holds it while it swaps in the
    snapshot and stager, so that a held write is applied before anything is served."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state = SnapshotState.WALKING
        self.closing = False
        self._settled = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        # None once released: later ones go to the stager directly
        self._writes: list[str] | None = []
        self._hints: list[tuple] | None = []

    # -- waiting for it --------------------------------------------------------------
    @property
    def settled(self) -> bool:
        """Is the snapshot ready or failed (nothing to wait for any more)?"""
        return self._settled.is_set()

    def wait_settled(self, timeout: float | None = None) -> bool:
        return self._settled.wait(timeout)

    def when_settled(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the snapshot is ready or failed: now (on this thread) if it
        is, else on the walk's thread."""
        with self.lock:
            if not self._settled.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def settle(self) -> None:
        """The walk is over (``state`` says how): run what waited for it."""
        self._settled.set()
        with self.lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    # -- work held until then -----------------------------------------------------------
    def hold_write(self, key: str) -> bool:
        """Keep the job's write to ``key`` for the daemon to apply before it serves anything;
        False once that happened (the caller applies it now)."""
        with self.lock:
            if self._writes is None:
                return False
            self._writes.append(key)
            return True

    def release_writes_locked(self) -> list[str]:
        """The held writes, in order; later ones are not held (call with ``lock`` held)."""
        writes, self._writes = self._writes or [], None
        return writes

    def hold_hint(self, hint: tuple) -> bool:
        """Keep an order hint until the read-ahead has started; False once released."""
        with self.lock:
            if self._hints is None:
                return False
            self._hints.append(hint)
            return True

    def next_hints(self) -> list[tuple]:
        """The hints held so far (empty: none left, and none are held from now on)."""
        with self.lock:
            batch = self._hints
            self._hints = [] if batch else None
        return batch or []

    def ready(self) -> None:
        """The index is written: copies may be served from now on."""
        self.state = SnapshotState.READY

    def close_locked(self) -> None:
        """The daemon is closing: nothing made from now on copies (call with ``lock`` held)."""
        self.closing = True

    def fail_locked(self) -> None:
        """The snapshot failed: nothing is held any more (call with ``lock`` held)."""
        self._writes = self._hints = None
        self.state = SnapshotState.FAILED
