"""A cluster node's hints: the whole order also goes to the peer read-ahead (notices.py)."""

from __future__ import annotations

from types import SimpleNamespace

from monarch import protocol
from monarch.node.notices import JobNotices


class Stager:
    def __init__(self):
        self.calls = []

    def hint_order(self, stream, keys, begin):
        self.calls.append(("order", stream, list(keys), begin))

    def hint_progress(self, stream, n):
        self.calls.append(("progress", stream, n))

    def hint_end(self, stream):
        self.calls.append(("end", stream))


def notices(peer=True):
    stager = Stager()
    current = SimpleNamespace(stager=stager)
    return JobNotices(current, lambda key: key.endswith("mine"), lambda outcome: None, peer=peer), stager


def test_the_hints_before_the_lane_comes_are_kept_then_given_in_order():
    n, stager = notices()
    n.apply_hint(protocol.HINT_ORDER, 1, iter(["0/a-mine", "0/b"]))
    for done in (1, 2):
        n.apply_hint(protocol.HINT_PROGRESS, 1, done)
    got = []
    assert n.attach_peer(lambda *hint: got.append(hint))
    # the whole order (others' files too) and only the last progress; the stager only its own files
    assert got == [(protocol.HINT_ORDER, 1, ["0/a-mine", "0/b"]), (protocol.HINT_PROGRESS, 1, 2)]
    assert stager.calls[0] == ("order", 1, ["0/a-mine"], True)
    n.apply_hint(protocol.HINT_END, 1, None)
    assert got[-1] == (protocol.HINT_END, 1, None) and stager.calls[-1] == ("end", 1)


def test_a_new_order_replaces_what_was_kept_and_a_failing_lane_fails_open():
    n, stager = notices()
    n.apply_hint(protocol.HINT_ORDER, 1, ["0/a"])
    n.apply_hint(protocol.HINT_ORDER, 2, ["0/b"])

    def broken(*hint):
        raise OSError("the lane is gone")

    n.attach_peer(broken)  # logged, not raised
    n.apply_hint(protocol.HINT_PROGRESS, 2, 1)
    assert stager.calls[-1] == ("progress", 2, 1)


def test_a_single_node_keeps_nothing_for_a_lane():
    n, _ = notices(peer=False)
    n.apply_hint(protocol.HINT_ORDER, 1, ["0/a"])
    got = []
    n.attach_peer(lambda *hint: got.append(hint))
    assert got == []


def test_a_node_that_does_not_fetch_ahead_gives_the_peer_lane_no_hint():
    # peer.fetch_ahead off (the default): hints steer this node's stager only
    n, stager = notices(peer=False)
    got = []
    n.apply_hint(protocol.HINT_ORDER, 1, ["0/a-mine", "0/b"])
    assert n.attach_peer(lambda *hint: got.append(hint)) is True
    n.apply_hint(protocol.HINT_PROGRESS, 1, 1)
    assert got == [] and n.peer_hint is None
    assert stager.calls[0] == ("order", 1, ["0/a-mine"], True)
