"""The MPI progress engine: one thread per daemon that makes every MPI call.

Other threads never touch MPI: they hand the engine closures (``call``) and wait on their
own queues. So MPI_THREAD_SERIALIZED is enough, no MPI lock is contended, and a blocked
or dead peer can only ever stall a request, never a thread inside MPI.

MPICH's blocking waits spin a core, so the engine polls with nonblocking calls and sleeps
between rounds: 50 us doubling up to 1 ms while transfers are moving, 5 ms when idle
(~200 wake-ups/s, well under 1% of a core), and wakes at once when a thread hands it work.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

TAG_CTRL = 1          # pickled control messages (control.py): requests, cancels, pings, finish
IDLE_MIN = 50e-6
IDLE_MAX_ACTIVE = 1e-3
IDLE_MAX = 5e-3
ACTIVE_WINDOW = 0.05  # "recent activity" keeps the short sleep this long


class Engine:
    """Owns ``comm`` once started; dispatches control messages to ``on_ctrl(source, obj)``.

    An MPI error (with Open MPI's ULFM: MPI_ERR_PROC_FAILED when a peer died) never stops
    the engine: the request that failed is dropped and ``on_mpi_error(exc)`` is called on the
    engine thread, which finds out who failed (``Liveness.check_failed``) and fails the
    transfers that involved them.
    """

    def __init__(self, MPI: Any, comm: Any, on_ctrl: Callable[[int, Any], None],
                 on_mpi_error: Callable[[Exception], None] | None = None):
        self.MPI = MPI
        self.comm = comm
        self._on_ctrl = on_ctrl
        self._on_mpi_error = on_mpi_error
        self._calls: collections.deque[Callable[[], Any]] = collections.deque()
        self._wake = threading.Event()
        self._reqs: list[Any] = []
        self._cbs: list[Callable[[Any], Any] | None] = []
        self._timers: list[tuple[float, int, Callable[[], Any]]] = []
        self._seq = itertools.count()
        self._stop = False
        self._thread = None
        self.error: BaseException | None = None  # the exception that stopped the engine, if any

    # -- any thread ---------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="monarch-mpi", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` on the engine thread, soon, in submission order."""
        self._calls.append(fn)
        self._wake.set()

    def run(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn()`` on the engine thread (inline if it is not running) and return its result."""
        if not self.running:
            return fn()
        done = threading.Event()
        box = {}

        def wrapper() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed back to the caller
                box["error"] = exc
            done.set()

        self.call(wrapper)
        while not done.wait(0.1):
            if not self.running:
                raise RuntimeError("MPI engine stopped") from self.error
            if timeout is not None:
                timeout -= 0.1
                if timeout <= 0:
                    raise TimeoutError("MPI engine did not answer")
        if "error" in box:
            raise box["error"]
        return box["value"]

    # -- engine thread only ----------------------------------------------------------
    def post(self, req: Any, callback: Callable[[Any], Any] | None = None) -> None:
        """Watch ``req``; call ``callback(status)`` on the engine thread when it completes."""
        self._reqs.append(req)
        self._cbs.append(callback)
        self._active = time.monotonic()

    def send_obj(self, obj: Any, dest: int, tag: int = TAG_CTRL, on_sent: Callable[[], Any] | None = None) -> None:
        self.post(self.comm.isend(obj, dest, tag), on_sent and (lambda st: on_sent()))

    def after(self, delay: float, fn: Callable[[], Any]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), fn))

    def _main(self) -> None:
        try:
            self._loop()
            while self._calls:          # what was handed over before stop() still happens
                self._safe(self._calls.popleft())
        except BaseException as exc:  # an engine bug must not take the daemon down: fail open
            self.error = exc
            log.exception("MPI engine stopped; peers are unavailable from now on")

    def _loop(self) -> None:
        MPI, comm = self.MPI, self.comm
        status = MPI.Status()
        sleep = IDLE_MIN
        self._active = time.monotonic()
        while not self._stop:
            busy = False
            while self._calls:
                self._safe(self._calls.popleft())
                busy = True
            for _ in range(64):
                try:
                    msg = comm.improbe(MPI.ANY_SOURCE, TAG_CTRL, status)
                except MPI.Exception as exc:  # ULFM: a peer died; acknowledged there, then probing works again
                    self._mpi_error(exc)
                    break
                if msg is None:
                    break
                self._safe(self._on_ctrl, status.Get_source(), msg.recv())
                busy = True
            if self._reqs and self._test():
                busy = True
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                self._safe(heapq.heappop(self._timers)[2])
            if busy:
                self._active = now
                sleep = IDLE_MIN
                continue
            cap = IDLE_MAX_ACTIVE if now - self._active < ACTIVE_WINDOW else IDLE_MAX
            if self._timers:
                cap = max(0.0, min(cap, self._timers[0][0] - now))
            self._wake.wait(min(sleep, cap))
            self._wake.clear()
            sleep = min(sleep * 2, IDLE_MAX)

    def _test(self) -> bool:
        MPI = self.MPI
        statuses = [MPI.Status() for _ in self._reqs]
        try:
            done = MPI.Request.Testsome(self._reqs, statuses)
        except MPI.Exception as exc:
            return self._test_each(exc)
        if not done:
            return False
        finished = [(self._cbs[i], statuses[k]) for k, i in enumerate(done)]  # statuses in `done` order
        keep = set(range(len(self._reqs))) - set(done)
        self._reqs = [self._reqs[i] for i in sorted(keep)]
        self._cbs = [self._cbs[i] for i in sorted(keep)]
        for cb, st in finished:
            if cb is not None:
                self._safe(cb, st)
        return True

    def _test_each(self, exc: Exception) -> bool:
        """Testsome failed (a request with a dead peer): test one by one, drop the failed ones."""
        MPI = self.MPI
        keep_reqs, keep_cbs, finished = [], [], []
        for req, cb in zip(self._reqs, self._cbs):
            status = MPI.Status()
            try:
                if req.Test(status):
                    finished.append((cb, status))
                    continue
            except MPI.Exception:
                continue  # completed in error: freed by MPI; the transfer is failed by on_mpi_error
            keep_reqs.append(req)
            keep_cbs.append(cb)
        self._reqs, self._cbs = keep_reqs, keep_cbs
        self._mpi_error(exc)
        for cb, status in finished:
            if cb is not None:
                self._safe(cb, status)
        return True

    def _mpi_error(self, exc: Exception) -> None:
        log.debug("MPI error on the engine thread: %s", exc)
        if self._on_mpi_error is not None:
            try:
                self._on_mpi_error(exc)
            except Exception:
                log.exception("MPI engine: handling %s failed", exc)

    def _safe(self, fn: Callable[..., Any], *args: Any) -> None:
        # One transfer's bug must not stop the engine for every other transfer; an MPI error
        # (a send to a dead peer) is a failure to look into, not a bug.
        try:
            fn(*args)
        except self.MPI.Exception as exc:
            self._mpi_error(exc)
        except Exception:
            log.exception("MPI engine: callback %r failed", fn)
