"""The end of a job (monarch/cluster/shutdown.py), with nodes in one process whose control messages
are delivered at once (no MPI): the coordinator gathers every node's statistics, a node that does
not finish is given up on with its reason, a lost coordinator is replaced by the lowest node left,
and the goodbye lets the others exit after the report."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from monarch.cluster import world
from monarch.cluster.control import Verb
from monarch.cluster.shutdown import Shutdown


class Net:
    """``size`` nodes whose control messages reach the addressee's handlers at once."""

    def __init__(self, size: int, lost: dict | None = None, silent: set[int] = frozenset(), peer_timeout=0.3):
        self.lost = lost or {}
        self.silent = silent  # nodes never heard from
        self.parts: list[Shutdown] = []
        for node in range(size):
            tuning = SimpleNamespace(node=node, nodes=size, peer_timeout=peer_timeout, finish_timeout=10.0,
                                     close_timeout=2.0)
            engine = SimpleNamespace(running=True, call=lambda fn: fn(), send_obj=self._sender(node))
            liveness = SimpleNamespace(lost=self.lost, ping=lambda k: None,
                                       last_heard=lambda k: 0.0 if k in self.silent else time.monotonic())
            provider = SimpleNamespace(stop_accepting=lambda: None, wait_idle=lambda timeout: True)
            self.parts.append(Shutdown(engine, liveness, provider, tuning))

    def _sender(self, src: int):
        def send_obj(obj, dest, on_sent=None):
            self.parts[dest].handlers()[Verb(obj[0])](src, *obj[1:])
            if on_sent:
                on_sent()
        return send_obj

    def finish_all(self, nodes) -> dict[int, object]:
        """``finish`` on each of ``nodes`` at once, each with its own statistics."""
        results: dict[int, object] = {}

        def run(k):
            results[k] = self.parts[k].finish(lambda: {"node": k, "files": 10 * k})

        threads = [threading.Thread(target=run, args=(k,)) for k in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads)
        return results


@pytest.fixture(autouse=True)
def no_failure_yet(monkeypatch):
    monkeypatch.setattr(world._state, "failure_seen", False)  # a node given up on marks the process


def test_the_coordinator_gathers_every_nodes_statistics_in_node_order():
    net = Net(3)
    results = net.finish_all([0, 1, 2])
    assert results[0] == [{"node": 0, "files": 0}, {"node": 1, "files": 10}, {"node": 2, "files": 20}]
    assert results[1] is None and results[2] is None and not world.failure_seen()


def test_a_node_that_never_finishes_is_given_up_on_after_its_silence():
    net = Net(3, silent={2})
    start = time.monotonic()
    results = net.finish_all([0, 1])
    assert results[0][:2] == [{"node": 0, "files": 0}, {"node": 1, "files": 10}]
    assert results[0][2] == {"node": 2, "missing": True, "reason": "no answer for 0.3s", "lost": None}
    assert time.monotonic() - start < 5 and world.failure_seen()


def test_a_lost_coordinator_is_replaced_by_the_lowest_node_left():
    lost = {0: {"node": 0, "at": 1.0, "why": "proc failed"}}
    net = Net(3, lost=lost)
    results = net.finish_all([1, 2])
    assert results[1] == [{"node": 0, "missing": True, "reason": "proc failed", "lost": lost[0]},
                          {"node": 1, "files": 10}, {"node": 2, "files": 20}]
    assert results[2] is None


def test_the_others_exit_only_after_the_coordinators_goodbye():
    net = Net(2)
    net.finish_all([0, 1])
    waiting = threading.Thread(target=net.parts[1].say_goodbye)
    waiting.start()
    time.sleep(0.3)
    assert waiting.is_alive()  # node 1 waits: the coordinator writes the report meanwhile
    net.parts[0].say_goodbye()
    waiting.join(5)
    assert not waiting.is_alive()
