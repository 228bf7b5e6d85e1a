"""The end of a job: ``finish`` (who is done, every node's statistics to one node) and the
goodbye before ``close`` (docs/cluster.md, "Shutdown").

The coordinator is node 0, or the lowest node not lost: it gathers the statistics and
writes the report. Its control messages: ``done`` and ``stats`` (to the coordinator),
``release`` and ``bye`` (from it).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Mapping

from . import world
from .control import Handler, Verb, message
from .engine import Engine
from .liveness import Liveness
from .provide import Provider
from .tuning import Tuning

log = logging.getLogger(__name__)


class Shutdown:
    """This node's part in finishing the job together."""

    def __init__(self, engine: Engine, liveness: Liveness, provider: Provider, tuning: Tuning):
        self._engine = engine
        self._liveness = liveness
        self._provider = provider
        self._tuning = tuning
        self._done: dict[int, bool] = {}   # coordinator: nodes that called finish
        self._stats: dict[int, Any] = {}   # coordinator: node -> its stats
        self._released = threading.Event()
        self._bye = threading.Event()
        self._finished: dict[int, str] | None = None  # after finish(): the nodes given up on, and why
        self._coord = 0                               # after finish(): the node that gathered the stats

    def handlers(self) -> Mapping[Verb, Handler]:
        """The control verbs this part serves (engine thread)."""
        return {Verb.DONE: self._on_done, Verb.STATS: self._on_stats, Verb.RELEASE: self._on_release,
                Verb.BYE: self._on_bye}

    def _on_done(self, src: int) -> None:
        self._done[src] = True

    def _on_stats(self, src: int, stats: Any) -> None:
        self._stats[src] = stats

    def _on_release(self, src: int) -> None:
        self._released.set()

    def _on_bye(self, src: int) -> None:
        self._bye.set()

    # -- the caller's thread -----------------------------------------------------------------
    def finish(self, local_stats: Any, timeout: float | None = None) -> list[dict | None] | None:
        """See ``Cluster.finish``."""
        node, nodes, lost = self._tuning.node, self._tuning.nodes, self._liveness.lost
        limit = self._tuning.finish_timeout if timeout is None else timeout
        started = time.monotonic()
        while True:
            coord = self._coordinator()
            if coord == node:
                self._done[node] = True
                missing = self._await(started, limit, lambda: [k for k in self._live() if k not in self._done])
                alive = [k for k in self._live() if k != node and k not in missing]
                self._send_wait((message(Verb.RELEASE), k) for k in alive)
                break
            self._send_wait([(message(Verb.DONE), coord)])
            missing = self._await(started, limit, lambda c=coord: [] if self._released.is_set()
                                  or self._coordinator() != c else [c])
            if self._released.is_set() or self._coordinator() == coord:
                break
            log.warning("finish(): coordinator node %d is lost; telling node %d", coord, self._coordinator())
        peer_timeout = self._tuning.peer_timeout
        self._provider.stop_accepting()
        if not self._provider.wait_idle(peer_timeout):
            log.warning("finish(): transfers to peers still running after %gs", peer_timeout)
        stats = local_stats() if callable(local_stats) else local_stats
        result = None
        if coord == node:
            self._stats[node] = stats
            missing.update(self._await(time.monotonic(), limit,
                                       lambda: [k for k in alive if k not in self._stats and k not in lost]))
            result = [self._stats.get(k) for k in range(nodes)]
            missing.update({k: lost[k]["why"] for k in lost if result[k] is None})
            for k, reason in missing.items():
                result[k] = {"node": k, "missing": True, "reason": reason, "lost": lost.get(k)}
        elif not missing:
            self._send_wait([(message(Verb.STATS, stats), coord)])
        if missing:
            world.note_failure(f"finish(): nodes {sorted(missing)} did not finish")
        self._finished = missing
        self._coord = coord
        return result

    def say_goodbye(self) -> None:
        """Before close(), after finish(): the coordinator tells the others they may exit; the
        others wait for that (at most close_timeout). After a peer failure hydra kills every
        survivor as soon as one exits, and the coordinator writes the report in between."""
        if self._finished is None or not self._engine.running:
            return
        node, lost = self._tuning.node, self._liveness.lost
        coord = self._coord
        if coord == node:
            self._send_wait([(message(Verb.BYE), k) for k in range(self._tuning.nodes) if k != node
                             and k not in self._finished and k not in lost])
        elif coord not in self._finished:
            close_timeout = self._tuning.close_timeout
            deadline = time.monotonic() + close_timeout
            while not self._bye.wait(0.1):
                if coord in lost or time.monotonic() > deadline:
                    log.warning("close(): node %d did not say goodbye (%s)", coord,
                                "lost" if coord in lost else f"{close_timeout:g}s")
                    break

    # -- helpers -------------------------------------------------------------------------------
    def _coordinator(self) -> int:
        """The node that gathers the stats and writes the report: the lowest node not lost."""
        node, lost = self._tuning.node, self._liveness.lost
        return min(k for k in range(self._tuning.nodes) if k not in lost or k == node)

    def _live(self) -> list[int]:
        lost = self._liveness.lost
        return [k for k in range(self._tuning.nodes) if k not in lost]

    def _send_wait(self, messages: Iterable[tuple[tuple, int]]) -> bool:
        """Send control messages and wait (at most peer_timeout) until they have left."""
        engine, lost = self._engine, self._liveness.lost
        sent = []
        for obj, dest in messages:
            if dest in lost:
                continue
            done = threading.Event()
            sent.append((dest, done))
            engine.call(lambda obj=obj, dest=dest, done=done: engine.send_obj(obj, dest, on_sent=done.set))
        deadline = time.monotonic() + self._tuning.peer_timeout
        ok = True
        for dest, done in sent:
            while not done.wait(0.1):
                if dest in lost or time.monotonic() > deadline:  # a send to a lost node may never complete
                    ok = False
                    break
        return ok

    def _await(self, started: float, limit: float, waiting_for: Callable[[], list[int]]) -> dict[int, str]:
        """Wait until ``waiting_for()`` is empty; return {node: reason} for nodes given up on."""
        peer_timeout, live = self._tuning.peer_timeout, self._liveness
        ping_every = max(0.1, min(1.0, peer_timeout / 4))
        next_ping = 0.0
        while True:
            pending = waiting_for()
            if not pending:
                return {}
            now = time.monotonic()
            silent = [k for k in pending if now - max(live.last_heard(k), started) > peer_timeout]
            if len(silent) == len(pending):
                return {k: f"no answer for {peer_timeout:g}s" for k in pending}
            if now - started > limit:
                return {k: ("no answer" if k in silent else f"did not finish within {limit:g}s")
                        for k in pending}
            if now >= next_ping:
                self._engine.call(lambda p=pending: [live.ping(k) for k in p])
                next_ping = now + ping_every
            time.sleep(0.02)
