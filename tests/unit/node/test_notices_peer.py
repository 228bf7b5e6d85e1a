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
    assert stager.calls[-1] == ("progress", 2, 0)  # none of that order's keys is this node's


def test_the_stager_hears_the_progress_in_positions_of_its_own_keys():
    # the stager's order holds this node's keys only; the reader counts the whole order's: told
    # 5 of "mine, b, c, mine, d, mine" read, it had read 2 of the stager's 3 (it was told 5: its
    # third own key, not yet read, counted consumed and dropped first when room was short)
    n, stager = notices()
    n.apply_hint(protocol.HINT_ORDER, 1, ["0/1-mine", "0/b", "0/c", "0/2-mine"])
    n.apply_hint(protocol.HINT_MORE, 1, ["0/d", "0/3-mine"])
    assert [c for c in stager.calls if c[0] == "order"] == [("order", 1, ["0/1-mine", "0/2-mine"], True),
                                                           ("order", 1, ["0/3-mine"], False)]
    for done, own in ((0, 0), (1, 1), (3, 1), (4, 2), (5, 2), (6, 3)):
        n.apply_hint(protocol.HINT_PROGRESS, 1, done)
        assert stager.calls[-1] == ("progress", 1, own)
    n.apply_hint(protocol.HINT_ORDER, 1, ["0/e", "0/4-mine"])  # the next epoch counts afresh
    n.apply_hint(protocol.HINT_PROGRESS, 1, 1)
    assert stager.calls[-1] == ("progress", 1, 0)


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
