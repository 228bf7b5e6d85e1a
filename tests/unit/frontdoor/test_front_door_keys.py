"""The front door's key table (16 bytes a slot): a key of the index is its entry's number, any
other key a copy of the door's own; both are answered, survive the table's growth, and keep
when the door last answered them (an evicting cache's grace)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from monarch import frontdoor, protocol
from monarch.node.snapshot.snapshot import take_snapshot
from support.harness import door_on_socket, unix_connect as connect

pytestmark = pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")


def ask_open(path: str, key: str) -> tuple[int, bytes]:
    with connect(path) as s:
        s.sendall(protocol.encode_request(protocol.VERB_OPEN, key.encode()))
        return protocol.recv_answer(s)


@pytest.fixture
def door_on(short_tmp):
    """A door on a socket of its own, over a dataset of 1,500 files (its index not open yet)."""
    root = os.path.join(short_tmp, "pfs")
    for i in range(1500):
        os.makedirs(os.path.join(root, f"d{i % 5}"), exist_ok=True)
        with open(os.path.join(root, f"d{i % 5}", f"f{i}"), "wb") as f:
            f.write(b"x")
    tier = os.path.join(short_tmp, "tier")
    os.mkdir(tier)
    path = os.path.join(short_tmp, "door.sock")
    slot = protocol.tier_slot(0)
    with door_on_socket(path, [root], {slot: tier}, slot) as d:
        yield SimpleNamespace(front_door=d, socket=path, tier=tier, slot=slot,
                              index=bytearray(take_snapshot((root,)).index_bytes()))


def test_keys_staged_before_and_after_the_index_opened_are_answered_through_growth(door_on):
    door = door_on.front_door
    before = [f"0/d{i % 5}/f{i}" for i in range(0, 1500, 2)]   # the door's own copies
    after = [f"0/d{i % 5}/f{i}" for i in range(1, 1500, 2)]    # the index's entries
    for key in before:
        door.staged(key, door_on.slot)
    assert door.open("unused", door_on.index)
    for key in after + ["0/not/in/the/index"]:                 # the table grows past 1,024 slots meanwhile
        door.staged(key, door_on.slot)
    for key in before[::37] + after[::37] + ["0/not/in/the/index"]:
        status, body = ask_open(door_on.socket, key)
        assert (status, body) == (door_on.slot, os.fsencode(f"{door_on.tier}/{key}"))
    assert door.counts()["hits_by_slot"] == {door_on.slot: len(before[::37]) + len(after[::37]) + 1}
    assert door.claim(after[0]) and door.claim(before[0])  # staged: the stager finds the copies made


def test_a_key_answered_within_the_grace_is_not_evicted(door_on):
    door = door_on.front_door
    assert door.open("unused", door_on.index)
    answered, quiet = "0/d0/f0", "0/d1/f1"
    for key in (answered, quiet):
        door.staged(key, door_on.slot)
    assert ask_open(door_on.socket, answered)[0] == door_on.slot
    assert not door.evict(answered, 30.0)    # answered a moment ago: kept
    assert door.evict(quiet, 30.0)           # never answered: it may go
    time.sleep(0.05)
    assert door.evict(answered, 0.01)        # answered longer ago than its grace
