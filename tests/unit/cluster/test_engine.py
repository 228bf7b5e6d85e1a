"""The MPI progress engine (monarch/cluster/engine.py) on its own thread over a fake MPI: closures
run there in order, control messages reach their handler, completed requests call back, timers
fire in time order, and neither a failing callback nor an MPI error stops it."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from monarch.cluster.engine import TAG_CTRL, Engine


class FakeMPI:
    ANY_SOURCE = -1

    class Exception(Exception):
        pass

    class Status:
        source = None

        def Get_source(self):
            return self.source

    class Request:
        @staticmethod
        def Testsome(reqs, statuses):
            if any(r.fails for r in reqs):
                raise FakeMPI.Exception("MPI_ERR_PROC_FAILED")
            return [i for i, r in enumerate(reqs) if r.done]


class Req:
    def __init__(self, done=False, fails=False):
        self.done, self.fails = done, fails

    def Test(self, status):
        if self.fails:
            raise FakeMPI.Exception("MPI_ERR_PROC_FAILED")
        return self.done


class Message:
    def __init__(self, obj):
        self.obj = obj

    def recv(self):
        return self.obj


class Comm:
    def __init__(self):
        self.inbox: collections.deque = collections.deque()  # (source, obj) of TAG_CTRL messages
        self.isent: list = []

    def improbe(self, source, tag, status):
        assert (source, tag) == (FakeMPI.ANY_SOURCE, TAG_CTRL)
        if not self.inbox:
            return None
        status.source, obj = self.inbox.popleft()
        return Message(obj)

    def isend(self, obj, dest, tag):
        self.isent.append((obj, dest, tag))
        return Req(done=True)


def wait_for(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within %gs" % seconds
        time.sleep(0.005)


@pytest.fixture
def engine():
    heard, errors = [], []
    e = Engine(FakeMPI, Comm(), lambda src, obj: heard.append((src, obj)), errors.append)
    e.heard, e.errors = heard, errors
    yield e
    e.stop()


def test_before_it_starts_run_calls_inline(engine):
    assert not engine.running and engine.run(lambda: threading.current_thread().name) == "MainThread"


def test_closures_run_on_the_engine_thread_in_order_and_run_hands_back_value_and_error(engine):
    engine.start()
    order = []
    for i in range(20):
        engine.call(lambda i=i: order.append((i, threading.current_thread().name)))
    assert engine.run(lambda: "value") == "value"
    assert order == [(i, "monarch-mpi") for i in range(20)]
    with pytest.raises(KeyError):
        engine.run(lambda: {}["missing"])
    assert engine.running  # an error handed back does not stop the engine


def test_control_messages_reach_their_handler_with_their_source(engine):
    engine.comm.inbox.extend([(2, ("ping",)), (1, ("req", 16, "0/a"))])
    engine.start()
    wait_for(lambda: len(engine.heard) == 2)
    assert engine.heard == [(2, ("ping",)), (1, ("req", 16, "0/a"))]


def test_a_request_calls_back_once_when_it_completes(engine):
    engine.start()
    req, done, sent = Req(), [], []
    engine.call(lambda: engine.post(req, done.append))
    engine.call(lambda: engine.send_obj(("pong",), 3, on_sent=lambda: sent.append(1)))
    wait_for(lambda: sent == [1])
    assert engine.comm.isent == [(("pong",), 3, TAG_CTRL)] and done == []
    req.done = True
    wait_for(lambda: len(done) == 1)
    time.sleep(0.05)
    assert len(done) == 1 and engine.run(lambda: engine._reqs) == []


def test_timers_fire_in_time_order(engine):
    engine.start()
    fired = []
    engine.call(lambda: engine.after(0.10, lambda: fired.append("late")))
    engine.call(lambda: engine.after(0.02, lambda: fired.append("soon")))
    wait_for(lambda: len(fired) == 2)
    assert fired == ["soon", "late"]


def test_a_failing_callback_or_an_mpi_error_does_not_stop_the_engine(engine):
    engine.start()
    engine.call(lambda: 1 / 0)
    engine.call(lambda: (_ for _ in ()).throw(FakeMPI.Exception("a send to a dead peer")))
    assert engine.run(lambda: "still here") == "still here"
    assert [str(e) for e in engine.errors] == ["a send to a dead peer"]


def test_a_failed_request_is_dropped_and_the_others_still_complete(engine):
    engine.start()
    ok, failed, pending, done = Req(done=True), Req(fails=True), Req(), []
    engine.call(lambda: [engine.post(r, lambda st, r=r: done.append(r)) for r in (ok, failed, pending)])
    wait_for(lambda: engine.errors)
    wait_for(lambda: done == [ok])
    assert engine.run(lambda: engine._reqs) == [pending]  # the failed one dropped, the pending one kept
    assert "MPI_ERR_PROC_FAILED" in str(engine.errors[0])


def test_what_was_handed_over_before_stop_still_happens(engine):
    engine.start()
    ran = threading.Event()

    def stop_then_hand_over():  # a timer: it runs after the loop's calls, so only the drain can run ran.set
        engine._stop = True
        engine.call(ran.set)

    engine.call(lambda: engine.after(0.0, stop_then_hand_over))
    wait_for(lambda: not engine.running)
    assert ran.is_set() and engine.error is None
