"""The peer layer's transfer counters (monarch/cluster/counters.py): bytes each way as files and
as wire bytes, failures by reason, and what moved after a node was lost."""

from __future__ import annotations

import json
import pickle
import threading

from monarch.cluster.counters import PeerCounters
from monarch.errors import FailureReason, PeerError


def test_files_and_bytes_each_way_and_what_crossed_the_wire():
    c = PeerCounters({})
    c.sent(1000)                  # sent as stored: the wire carries the file's bytes
    c.sent(1000, wire_size=300)   # a compressed copy crosses as stored
    c.received(500, 200)
    s = c.snapshot()
    assert (s["files_sent"], s["bytes_sent"], s["wire_bytes_sent"]) == (2, 2000, 1300)
    assert (s["files_received"], s["bytes_received"], s["wire_bytes_received"]) == (1, 500, 200)
    assert s["after_loss"] == {"files_sent": 0, "bytes_sent": 0, "files_received": 0, "bytes_received": 0}


def test_what_moves_after_a_loss_is_counted_again_apart():
    lost: dict[int, dict] = {}
    c = PeerCounters(lost)  # the liveness part's map, read as it is when a file moves
    c.received(100, 100)
    lost[2] = {"node": 2, "at": 0.0, "why": "no heartbeat"}
    c.received(40, 10)
    c.sent(7)
    s = c.snapshot()
    assert s["bytes_received"] == 140 and s["files_received"] == 2
    assert s["after_loss"] == {"files_sent": 1, "bytes_sent": 7, "files_received": 1, "bytes_received": 40}


def test_failures_are_counted_by_reason_and_a_fetch_failure_is_the_error_to_raise():
    c = PeerCounters({})
    e = c.fetch_failed(FailureReason.TIMEOUT, "fetch '0/a': node 1 timed out")
    c.fetch_failed(FailureReason.TIMEOUT, "again")
    c.fetch_failed(FailureReason.REFUSED, "no")
    assert isinstance(e, PeerError) and e.reason is FailureReason.TIMEOUT and "timed out" in str(e)
    c.serve_failed("not_here")
    c.serve_failed("not_here")
    c.slow_fetch()
    s = c.snapshot()
    assert s["fetch_failures"] == {"timeout": 2, "refused": 1}
    assert s["serve_failures"] == {"not_here": 2} and s["slow_fetches"] == 1
    json.dumps(s)  # written as JSON in the report, pickled to the coordinator: plain values only
    assert pickle.loads(pickle.dumps(s)) == s


def test_a_snapshot_is_a_copy_later_counts_do_not_change():
    c = PeerCounters({})
    c.fetch_failed(FailureReason.FAILED, "x")
    c.sent(1)
    before = c.snapshot()
    before["fetch_failures"]["failed"] = 99
    before["after_loss"]["bytes_sent"] = 99
    c.fetch_failed(FailureReason.FAILED, "y")
    c.sent(1)
    after = c.snapshot()
    assert after["fetch_failures"] == {"failed": 2} and after["after_loss"]["bytes_sent"] == 0
    assert before["bytes_sent"] == 1 and after["bytes_sent"] == 2


def test_counts_from_many_threads_add_up():
    c = PeerCounters({})

    def work():
        for _ in range(2000):
            c.sent(3, 1)
            c.serve_failed("busy")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = c.snapshot()
    assert (s["files_sent"], s["bytes_sent"], s["wire_bytes_sent"]) == (8000, 24000, 8000)
    assert s["serve_failures"] == {"busy": 8000}
