"""A sharded node's front door told whose file is whose by the placement's ring (door_owners.c):
the bit it keeps an entry agrees with Python's ``Placement.owner`` for every key (XXH64 of the key's
bytes, long keys and bytes that are no UTF-8 among them), a bad ring is refused, and its lane
copies this node's files only and fetches another node's from the owner the ring names.

The door runs alone on a socket of its own (support.sharded_door): no daemon, no MPI."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from monarch import frontdoor, protocol
from monarch.cluster.placement import RING_SEED, Placement
from monarch.node.doorkeeper.entry_owners import EntryOwners
from support.sharded_door import ask_open, handed_over, make_sharded_door, wait_lane

pytestmark = pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")

FILES = 600


def name(i: int) -> str:
    """Names from 1 to 120 bytes (XXH64's paths below and above 32 bytes), one not UTF-8."""
    if i == 7:
        return os.fsdecode(b"\xff\xfe-not-utf8")
    return "n" * (i % 113) + f"-{i}"


@pytest.fixture
def door(short_tmp):
    yield from make_sharded_door(short_tmp, workers=2, dirs=5, files=FILES, size=lambda i: 512 + i, name=name)


def placements(files) -> dict[str, Placement]:
    return {
        "by count, 4 alike": Placement.build((), [1, 1, 1, 1]),
        "by count, a node of weight 0": Placement.build((), [3, 0, 5, 2]),
        "by bytes": Placement.build(((key, info.size) for key, info in files.items()), [1, 2, 1]),
    }


def mine_of(bits, entries: int) -> list[int]:
    return [at for at in range(entries) if bits[at >> 6] >> (at & 63) & 1]


@pytest.mark.parametrize("kind", ["by count, 4 alike", "by count, a node of weight 0", "by bytes"])
def test_the_doors_bits_are_the_placements_owners(door, kind):
    files = door.snap.files
    placement = placements(files)[kind]
    starts, nodes = placement.ring()
    seen = 0
    for node in range(placement.nodes):
        bits, own = door.front_door.ring(door.front_door.index, starts, nodes, RING_SEED, node, len(files))
        expected = sorted(door.row(key) for key in files if placement.owner(key) == node)
        assert mine_of(bits, len(files)) == expected and own == len(expected)
        assert placement.weights[node] == 0 or 0 < own < len(files)
        seen += own
    assert seen == len(files)  # every file is one node's


def test_a_bad_ring_is_refused(door):
    entries = len(door.snap.files)

    def ring(*args):
        return door.front_door.ring(door.front_door.index, *args)

    assert ring([5, 10], [0, 1], RING_SEED, 0, entries) is None  # the first part starts past 0
    assert ring([0, 10, 9], [0, 1, 2], RING_SEED, 0, entries) is None  # starts going back
    assert ring([], [], RING_SEED, 0, entries) is None
    assert ring([0], [0], RING_SEED, 0, entries + 1) is None  # more entries than the index's files
    assert door.front_door.ring(bytearray(4096), [0], [0], RING_SEED, 0, 1) is None  # not an index
    bits, own = ring([0], [0], RING_SEED, 0, entries)
    assert own == entries and mine_of(bits, entries) == list(range(entries))


def test_the_lane_copies_the_rings_own_files_and_fetches_the_others_from_their_owner(door):
    placement = Placement.build((), [1, 1, 1])
    files, node = door.snap.files, 1

    fd = door.front_door
    owners = EntryOwners(node, fd.index, len(files), placement.ring(), lambda: pytest.fail("a table was made"))
    assert fd.peers(*[ctypes.cast(c, ctypes.c_void_p).value for c in door.callbacks], None,
                    owners.give_to(fd), node, protocol.SLOT_PEER, 5.0)
    fd.peer_copying(True)
    mine = {key for key in files if placement.owner(key) == node}
    assert {key for key in files if not owners.remote(door.row(key))} == mine
    assert owners.stats() == {"by": "ring", "own": len(mine)}
    others = sorted(set(files) - mine)[:5]
    for key in others:  # another node's file: asked of the owner the ring names, never read from the PFS
        assert handed_over(door, key)
    assert door.fetched == others and door.asked == [placement.owner(key) for key in others]
    own = sorted(mine)[0]
    assert ask_open(door.socket, own) == (door.slot, os.fsencode(f"{door.tier}/{own}"))
    assert fd.read_ahead(FILES, 2)
    state = wait_lane(fd)
    assert state["through"] == FILES and state["copies"] == len(mine) - 1
    copied = {os.fsdecode(p.relative_to(door.tier)) for p in Path(door.tier).rglob("*") if p.is_file()}
    assert copied == mine and door.fetched == others


def test_without_a_ring_the_door_is_given_each_files_owner_by_python(door):
    """No placement yet (or a node lost, or a snapshot whose files are not an index's): the table
    of every file's owner, computed here, as before the ring."""
    placement = Placement.build((), [1, 1])
    files, node = door.snap.files, 0

    class Cluster:  # peer.Cluster with no ring to give
        owner = staticmethod(placement.owner)

        @staticmethod
        def ring():
            return None

    owners = EntryOwners.of(files, Cluster, node)
    assert owners.stats() == {"by": "none", "own": 0}
    table = owners.give_to(door.front_door)
    mine = {key for key in files if placement.owner(key) == node}
    assert [table[door.row(key)] < 0 for key in files] == [key in mine for key in files]
    assert owners.stats() == {"by": "table", "own": len(mine)}
    assert {key for key in files if not owners.remote(door.row(key))} == mine
