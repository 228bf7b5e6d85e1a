"""Who is alive (monarch/cluster/liveness.py): heard, down, pinged and lost, over a fake engine and
communicator (no MPI). A down node is up again when it answers; a lost one is lost for good,
every listener hears of it once, and without failure notices silence decides only after a death."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from monarch.cluster import world
from monarch.cluster.control import Verb
from monarch.cluster.engine import TAG_CTRL
from monarch.cluster.liveness import NO_HEARTBEAT, PROC_FAILED, Liveness


class FakeMPI:
    UNDEFINED = -32766

    class Exception(Exception):
        def Get_error_class(self):
            return 0

    class Group:
        @staticmethod
        def Translate_ranks(group, ranks, other):
            return group.ranks


class Group:
    def __init__(self, ranks):
        self.ranks = ranks

    def Get_size(self):
        return len(self.ranks)

    def Free(self):
        pass


class Comm:
    """An MPI that names the failed ranks it is given (ULFM), or none."""

    def __init__(self, failed=()):
        self.failed = list(failed)
        self.isent: list[tuple] = []

    def Ack_failed(self):
        pass

    def Get_failed(self):
        return Group(self.failed)

    def Get_group(self):
        return None

    def isend(self, msg, dest, tag):
        self.isent.append((msg, dest, tag))
        return ("isend", dest)


class Engine:
    """What liveness asks of the engine: calls and timers on its thread, requests, sends."""

    def __init__(self):
        self.posted: list = []
        self.sent: list = []
        self.timers: list = []

    def call(self, fn):
        fn()  # the test runs as the engine thread

    def after(self, seconds, fn):
        self.timers.append(seconds)

    def post(self, req, on_done):
        self.posted.append((req, on_done))

    def send_obj(self, msg, dest):
        self.sent.append((msg, dest))


@pytest.fixture
def no_failure_yet(monkeypatch):
    monkeypatch.setattr(world._state, "failure_seen", False)  # a loss marks the process: undone after


def liveness(comm=None, peer_timeout=1.0, node=0):
    tuning = SimpleNamespace(node=node, nodes=4, peer_timeout=peer_timeout)
    engine = Engine()
    return Liveness(FakeMPI, comm or Comm(), engine, tuning), engine


def test_a_suspected_node_is_down_until_it_is_heard_and_is_pinged_once_at_a_time(no_failure_yet):
    live, engine = liveness()
    live.suspect(2)
    live.suspect(2)
    assert live.is_down(2) and not live.is_lost(2)
    assert live.comm.isent == [(("ping",), 2, TAG_CTRL)]  # the first ping has not left: no second
    req, on_sent = engine.posted[0]
    on_sent(None)
    live.ping(2)
    assert len(live.comm.isent) == 2
    before = time.monotonic()
    live.heard(2)
    assert not live.is_down(2) and live.last_heard(2) >= before and live.last_heard(3) == 0.0


def test_a_ping_is_answered_with_a_pong_to_its_sender():
    live, engine = liveness()
    handlers = live.handlers()
    assert set(handlers) == {Verb.PING, Verb.PONG}
    handlers[Verb.PING](3)
    handlers[Verb.PONG](3)
    assert engine.sent == [(("pong",), 3)]


def test_a_lost_node_stays_lost_every_listener_hears_once_and_this_node_is_never_lost(no_failure_yet):
    live, _ = liveness(node=0)
    heard = []
    live.on_loss(lambda node, why: heard.append(("a", node, why)))
    live.on_loss(lambda node, why: 1 / 0)  # a listener that fails does not stop the others
    live.on_loss(lambda node, why: heard.append(("b", node, why)))
    live.lose(0, PROC_FAILED)  # this node itself
    live.lose(1, NO_HEARTBEAT)
    live.lose(1, PROC_FAILED)
    live.heard(1)  # a late message does not bring a lost node back
    assert heard == [("a", 1, NO_HEARTBEAT), ("b", 1, NO_HEARTBEAT)]
    assert live.is_lost(1) and live.is_down(1) and live.why_lost(1) == NO_HEARTBEAT and not live.is_lost(0)
    assert [n["node"] for n in live.lost_list()] == [1] and world.failure_seen()
    live.ping(1)
    assert live.comm.isent == []  # nobody pings the dead


def test_the_nodes_mpi_names_failed_are_lost_but_never_this_one_or_an_undefined_rank(no_failure_yet):
    live, _ = liveness(Comm(failed=[2, FakeMPI.UNDEFINED, 0, 3]), node=0)
    live.check_failed()
    assert sorted(live.lost) == [2, 3] and {v["why"] for v in live.lost.values()} == {PROC_FAILED}


def test_silence_loses_a_down_node_only_after_a_death_was_signalled(no_failure_yet):
    live, engine = liveness(peer_timeout=1.0)
    live.down[2] = time.monotonic() - 5.0  # silent for 5 s, over peer_timeout
    live._tick()
    assert not live.is_lost(2) and live.comm.isent == [(("ping",), 2, TAG_CTRL)]  # no death seen: pinged
    world.note_failure("hydra signalled a death")
    live._tick()
    assert live.is_lost(2) and live.why_lost(2) == NO_HEARTBEAT
    assert engine.timers == [0.5, 0.5]  # each tick schedules the next, at half the peer timeout


@pytest.mark.parametrize("peer_timeout, every", [(0.1, 0.25), (1.0, 0.5), (30.0, 1.0)])
def test_the_check_runs_every_half_peer_timeout_within_a_quarter_second_and_a_second(peer_timeout, every):
    live, engine = liveness(peer_timeout=peer_timeout)
    live.start()
    assert engine.timers == [every]
