"""The peer read-ahead lane writes a fetch over a consumed copy (a spare) through the spare's
kept mapping (door_peer_ahead.c: pa_write), where the file holds the pages: a memcpy instead of
a pwrite. Files of sizes up and down, so spares are written over both ways: through the mapping
(no larger than what the file held) and by pwrite (larger: its new pages allocated as a write
does, never by a store that could fault). Every copy's bytes are checked, a reader's open or
mapped copy is never written over, and at the order's end no mapping of the area is left."""

from __future__ import annotations

import hashlib
import mmap
import os
import time
from array import array

import pytest

from monarch import frontdoor
from monarch.frontdoor import PEER_BOOKS
from monarch.node.tiers.tiers import TMP_PREFIX
from support.sharded_door import link_flight, make_sharded_door

pytestmark = pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")

SIZES = (3 * 4096, 8192 + 100, 4096 + 7, 5 * 4096, 2 * 4096 - 1, 4096)  # whole pages and not, up and down


def area_mappings(area: str) -> list[str]:
    """This process's mappings of files under ``area`` (the door runs in it)."""
    with open("/proc/self/maps") as f:
        return [line for line in f if area + "/" in line]


def test_the_lane_writes_over_its_spares_through_their_kept_mappings(short_tmp):
    gen = make_sharded_door(short_tmp, workers=2, files=120, size=lambda i: SIZES[(i // 2) % len(SIZES)])
    d = next(gen)
    try:
        area = os.path.join(short_tmp, "area")
        d.linked = link_flight(d, d.root, at_once=True)  # kept alive with the door
        order = sorted(d.sums, key=d.row)  # every other file is node 1's
        remote = [k for k in order if k not in d.mine]
        room = 6 * max(d.snap.files[k].size for k in remote)
        d.door.grant(room, PEER_BOOKS)
        d.door.peer_ahead(array("I", [d.row(k) + 1 for k in order]), len(order))

        def settled(want: int) -> dict:
            deadline = time.monotonic() + 10
            while (state := d.door.peer_ahead_state())["fetched"] < want and time.monotonic() < deadline:
                time.sleep(0.005)
            return d.door.peer_ahead_state()

        def copies() -> list[str]:
            return [os.path.relpath(os.path.join(dirpath, name), area) for dirpath, _, names in os.walk(area)
                    for name in names if not name.startswith(TMP_PREFIX)]

        settled(6)
        held = os.open(os.path.join(area, remote[0]), os.O_RDONLY)  # a reader has it open ...
        with open(os.path.join(area, remote[1]), "rb") as f:  # ... and this one mapped, its file closed
            mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        for consumed in range(2, len(order) + 1, 2):
            d.door.peer_progress(consumed)
            state = settled(min(len(remote), consumed // 2 + 6))
            for k in copies():
                try:
                    with open(os.path.join(area, k), "rb") as f:  # a name is always its whole file
                        assert hashlib.md5(f.read()).hexdigest() == d.sums[k], (consumed, k)
                except FileNotFoundError:
                    pass  # consumed and gone meanwhile
            # its mappings go with its files: at most the copies' and the spares'
            assert len(area_mappings(area)) <= state["copies"] + 64, area_mappings(area)
        assert state["fetched"] == len(remote), state
        # written over through the mapping when no larger than the spare was, by pwrite when larger
        assert 0 < state["written_mapped"] < state["reused"], state
        assert hashlib.md5(os.pread(held, 1 << 20, 0)).hexdigest() == d.sums[remote[0]]
        assert hashlib.md5(mapped[:]).hexdigest() == d.sums[remote[1]]
        os.close(held)
        mapped.close()
        d.door.peer_ahead(array("I"), 1)  # the order's end: its copies and spares go, and their mappings
        assert d.door.peer_ahead_state()["copies"] == 0
        assert area_mappings(area) == []
    finally:
        gen.close()
