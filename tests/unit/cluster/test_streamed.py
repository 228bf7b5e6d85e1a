"""Node 0's walk streamed to every node (monarch/cluster/streamed.py), over a fake broadcast that
records what node 0 sends and replays it to the others: every node gets every file, in order,
with node 0's value at the end or its error."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from monarch.cluster import streamed
from monarch.cluster.streamed import StreamedShare
from monarch.errors import FailureReason, PeerError


class Broadcast:
    """One broadcast channel: node 0 appends, every other node reads from its own position."""

    def __init__(self):
        self.payloads: list[bytes] = []
        self.deadlines: list = []

    def node(self, n: int):
        channel, position = self, iter(range(10 ** 9))

        class Node:
            node = n

            def bcast_bytes(self, payload, deadline):
                channel.deadlines.append(deadline)
                if n == 0:
                    channel.payloads.append(payload)
                    return payload
                return channel.payloads[next(position)]

        return Node()


def walk(parts, value="snapshot", fail=None):
    """A walk that finds ``parts`` one after the other, then returns ``value`` (or raises ``fail``)."""
    def take(publish):
        for part in parts:
            publish(part)
        publish({})  # nothing new: nothing sent
        if fail:
            raise fail
        return value
    return take


PARTS = [{f"0/a{i}": i} for i in range(5)] + [{"0/b": 9, "0/c": 10}]
EVERY_FILE = {k: v for part in PARTS for k, v in part.items()}


def share(channel, node, seen, timeout=None):
    return StreamedShare(channel.node(node), lambda files: seen.append(dict(files)), timeout)


def test_every_node_stages_every_file_of_the_walk_and_gets_its_value():
    channel = Broadcast()
    lead_seen, follow_seen = [], []
    assert share(channel, 0, lead_seen, timeout=30).run(walk(PARTS)) == "snapshot"
    assert lead_seen == PARTS  # node 0 stages each part as it is found
    assert share(channel, 1, follow_seen).run(None) == "snapshot"
    assert {k: v for part in follow_seen for k, v in part.items()} == EVERY_FILE
    assert list({k: v for part in follow_seen for k, v in part.items()}) == list(EVERY_FILE)  # in order
    assert None not in channel.deadlines[:len(channel.payloads)]  # node 0's timeout bounds every broadcast


def test_parts_go_when_enough_files_wait_and_the_first_at_once(monkeypatch):
    monkeypatch.setattr(streamed, "time", SimpleNamespace(monotonic=lambda: 1e6))  # a clock that stands still:
    monkeypatch.setattr(streamed, "PART_FILES", 3)                                # later parts go by count
    channel = Broadcast()
    share(channel, 0, []).run(walk(PARTS))
    kinds = [pickle.loads(p) for p in channel.payloads]
    assert kinds[0] == ("files", PARTS[0])  # the walk's first files go at once
    sizes = [len(v) for k, v in kinds if k == "files"]
    assert sizes == [1, 3, 3] and kinds[-1] == ("ok", "snapshot")  # 1 + 3 + the rest at the end


def test_a_failed_walk_reaches_every_node_as_an_error_after_what_was_found():
    channel = Broadcast()
    with pytest.raises(OSError, match="gone"):
        share(channel, 0, []).run(walk(PARTS[:2], fail=OSError("gone")))
    seen = []
    with pytest.raises(PeerError, match="node 0 could not take the dataset snapshot: OSError: gone") as e:
        share(channel, 2, seen).run(None)
    assert e.value.reason is FailureReason.FAILED
    assert {k for part in seen for k in part} == {"0/a0", "0/a1"}


def test_staging_that_fails_does_not_stop_the_walks_broadcasts():
    channel = Broadcast()

    def failing(files):
        raise RuntimeError("no room")

    assert StreamedShare(channel.node(0), failing, None).run(walk(PARTS)) == "snapshot"
    assert StreamedShare(channel.node(1), failing, None).run(None) == "snapshot"
