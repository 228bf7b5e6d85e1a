"""Who is alive: heartbeats, pings, nodes down and nodes lost (docs/cluster.md, "A node dies").

* A node is **heard** whenever any message of it arrives (a control message, a header, a chunk).
* A node we wait on that stays silent is pinged; one silent for ``heartbeat_timeout`` (no
  chunk, no pong) is **down**: fetches from it fail at once until it answers again.
* A node is **lost** for the rest of the job when MPI names it failed (ULFM), or, with
  MPICH (no failure notices), when it stays silent for ``peer_timeout`` after hydra
  signalled a death. What waits on a lost node is failed at once; its keys are re-owned;
  every loss listener hears of it (engine thread).

Everything here runs on the engine thread, but ``suspect`` (any thread) and the look-ups
(``is_lost``, ``last_heard``, ...: atomic dict reads).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping

from . import world
from .control import Handler, Verb, message
from .engine import TAG_CTRL, Engine
from .tuning import Tuning

log = logging.getLogger(__name__)

# why a node is lost, in the report: MPI told us (ULFM), it stopped answering, or it left finish()
PROC_FAILED, NO_HEARTBEAT, NO_FINISH = "proc failed", "no heartbeat", "did not finish"

LossListener = Callable[[int, str], None]  # (node, why), on the engine thread


class Liveness:
    """This node's view of which peers are alive, down or lost."""

    def __init__(self, MPI: Any, comm: Any, engine: Engine, tuning: Tuning):
        self.MPI = MPI
        self.comm = comm
        self.engine = engine
        self.tuning = tuning
        self.lost: dict[int, dict] = {}     # node -> {"node", "at" (time.time()), "why"}: dead for the rest of the job
        self.down: dict[int, float] = {}    # node -> monotonic time it stopped answering
        self._heard: dict[int, float] = {}  # node -> monotonic time of its last message
        self._pinging: set[int] = set()
        self._listeners: list[tuple[str, LossListener]] = []
        self._failure_notices = True        # does this MPI name failed ranks (MPI_Comm_get_failed)?

    def on_loss(self, callback: LossListener, name: str | None = None) -> None:
        """Call ``callback(node, why)`` (engine thread) when a node is lost; listeners are
        called in the order they registered, and one that raises does not stop the others."""
        self._listeners.append((name or getattr(callback, "__qualname__", repr(callback)), callback))

    def handlers(self) -> Mapping[Verb, Handler]:
        """The control verbs this part serves."""
        return {Verb.PING: self._on_ping, Verb.PONG: self._on_pong}

    # -- look-ups (any thread) -------------------------------------------------------------
    def is_lost(self, node: int) -> bool:
        return node in self.lost

    def why_lost(self, node: int) -> str:
        return self.lost[node]["why"]

    def is_down(self, node: int) -> bool:
        return node in self.down

    def last_heard(self, node: int) -> float:
        """The monotonic time ``node`` was last heard from (0.0: never)."""
        return self._heard.get(node, 0.0)

    def lost_list(self) -> list[dict]:
        """The nodes lost so far, each ``{"node", "at" (time.time()), "why"}``, by node."""
        return [dict(v) for _, v in sorted(self.lost.items())]

    # -- engine thread ---------------------------------------------------------------------
    def heard(self, node: int) -> None:
        """A message of ``node`` arrived: it is alive (a down node is up again)."""
        self._heard[node] = time.monotonic()
        if node not in self.lost and self.down.pop(node, None) is not None:
            log.info("node %d answers again", node)

    def _on_ping(self, src: int) -> None:
        self.engine.send_obj(message(Verb.PONG), src)

    def _on_pong(self, src: int) -> None:
        pass  # being heard was the point (ControlTable notes it)

    def start(self) -> None:
        """Start the periodic check (engine thread, once the engine runs)."""
        self.engine.call(self._tick)

    def _tick(self) -> None:
        # Periodic: re-ping peers that stopped answering; with MPICH (no failure notice) a
        # node silent for peer_timeout after hydra signalled a death is lost.
        self.check_failed()
        now = time.monotonic()
        peer_timeout = self.tuning.peer_timeout
        for node, since in list(self.down.items()):
            if node in self.lost:
                continue
            if world.failure_seen() and now - max(since, self._heard.get(node, 0.0)) > peer_timeout:
                self.lose(node, NO_HEARTBEAT)
            else:
                self.ping(node)
        self.engine.after(max(0.25, min(1.0, peer_timeout / 2)), self._tick)

    def ping(self, node: int) -> None:
        if node in self._pinging or node in self.lost:  # the last ping has not even left: do not pile up
            return
        self._pinging.add(node)
        req = self.comm.isend(message(Verb.PING), node, TAG_CTRL)
        self.engine.post(req, lambda st: self._pinging.discard(node))

    def on_mpi_error(self, exc: Exception) -> None:
        """An MPI call failed: with ULFM a peer died (MPI_ERR_PROC_FAILED). Acknowledge the
        failures (wildcard receives work again) and lose the nodes MPI names."""
        MPI = self.MPI
        cls = exc.Get_error_class() if hasattr(exc, "Get_error_class") else None
        ft = {getattr(MPI, n, None) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")} - {None}
        if cls not in ft:
            log.warning("MPI error on the peer layer: %s", exc)
        self.check_failed()

    def check_failed(self) -> None:
        """Lose every node MPI knows has failed (ULFM's Get_failed; MPICH 5 answers an empty
        group). An MPI or mpi4py without these calls is asked once: the heartbeats then
        detect a lost node alone."""
        if not self._failure_notices:
            return
        comm, MPI = self.comm, self.MPI
        try:
            comm.Ack_failed()
            group = comm.Get_failed()
            try:
                ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), comm.Get_group())
            finally:
                group.Free()
        except (NotImplementedError, AttributeError) as exc:  # an MPI library without them (mpi4py raises), mpi4py < 4
            self._failure_notices = False
            log.info("this MPI does not name failed ranks (%s): lost nodes are found by heartbeats", exc)
            return
        except MPI.Exception as exc:  # e.g. MPI_ERR_UNSUPPORTED_OPERATION: the same, once said
            if exc.Get_error_class() == getattr(MPI, "ERR_UNSUPPORTED_OPERATION", None):
                self._failure_notices = False
                log.info("this MPI does not name failed ranks (%s): lost nodes are found by heartbeats", exc)
            return
        for node in ranks:
            if node not in (None, MPI.UNDEFINED, self.tuning.node):
                self.lose(node, PROC_FAILED)

    def lose(self, node: int, why: str) -> None:
        """``node`` is gone for the rest of the job: tell every listener (they fail what waits
        on it, re-own its keys)."""
        if node in self.lost or node == self.tuning.node:
            return
        self.lost[node] = {"node": node, "at": round(time.time(), 3), "why": why}
        self.down.setdefault(node, time.monotonic())
        log.warning("node %d is lost (%s): its files are owned by the survivors from now on", node, why)
        world.note_failure(f"node {node} lost: {why}")
        for name, listener in self._listeners:
            try:
                listener(node, why)
            except Exception:
                log.exception("%s(%d), told of the loss, failed", name, node)

    # -- any thread ------------------------------------------------------------------------
    def suspect(self, node: int) -> None:
        """Later fetches from ``node`` fail at once until it answers a ping."""
        if node not in self.down:
            log.warning("node %d did not answer in time: using the PFS instead until it does", node)
            self.down[node] = time.monotonic()
        self.engine.call(lambda: self.ping(node))
