"""The peer read-ahead lane's files (door_peer_ahead.c): each has a name of its own in the peer
area's top directory, and its key's name linked to it once its bytes are in; a consumed copy's
key name is unlinked and its file written over for the next key (a link and an unlink, not two
renames). A fetch is written over a spare through the spare's kept mapping (pa_write) where the
file holds the pages and the area is in RAM: a memcpy instead of a pwrite."""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import subprocess
import time
from array import array

import pytest

from monarch import frontdoor, protocol
from monarch.frontdoor import PEER_BOOKS
from monarch.node.tiers.tiers import TMP_PREFIX
from support.sharded_door import link_flight, make_sharded_door

pytestmark = pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")

SIZES = (3 * 4096, 8192 + 100, 4096 + 7, 5 * 4096, 2 * 4096 - 1, 4096)  # whole pages and not, up and down


def area_mappings(area: str) -> list[str]:
    """This process's mappings of files under ``area`` (the door runs in it)."""
    with open("/proc/self/maps") as f:
        return [line for line in f if area + "/" in line]


def settled(d, want: int) -> dict:
    deadline = time.monotonic() + 10
    while d.front_door.peer_ahead_state()["fetched"] < want and time.monotonic() < deadline:
        time.sleep(0.005)
    return d.front_door.peer_ahead_state()


def in_area(area: str, own: bool = False) -> list[str]:
    """The copies in the area by key (``own``: and the lane's files' own names)."""
    return [os.path.relpath(os.path.join(dirpath, name), area) for dirpath, _, names in os.walk(area)
            for name in names if own or not name.startswith(TMP_PREFIX)]


def in_ram(path: str) -> bool:
    return subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True).stdout.strip() == "tmpfs"


def test_the_lane_writes_over_its_spares_through_their_kept_mappings(short_tmp):
    """A peer area in RAM, files of sizes up and down, so spares are written over both ways:
    through the mapping (no larger than what the file held) and by pwrite (larger: its new pages
    allocated as a write does, never by a store that could fault). Every copy's bytes are
    checked, a reader's open or mapped copy is never written over, and at the order's end no
    mapping of the area is left."""
    gen = make_sharded_door(short_tmp, workers=2, files=120, size=lambda i: SIZES[(i // 2) % len(SIZES)],
                            area_in_ram=True)
    d = next(gen)
    try:
        area = d.area
        assert in_ram(area)
        d.linked = link_flight(d, d.root, at_once=True)  # kept alive with the door
        order = sorted(d.sums, key=d.row)  # every other file is node 1's
        remote = [k for k in order if k not in d.mine]
        room = 6 * max(d.snap.files[k].size for k in remote)
        d.front_door.grant(room, PEER_BOOKS)
        d.front_door.peer_ahead(array("I", [d.row(k) + 1 for k in order]), len(order))

        settled(d, 6)
        held = os.open(os.path.join(area, remote[0]), os.O_RDONLY)  # a reader has it open ...
        with open(os.path.join(area, remote[1]), "rb") as f:  # ... and this one mapped, its file closed
            mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        for consumed in range(2, len(order) + 1, 2):
            d.front_door.peer_progress(consumed)
            state = settled(d, min(len(remote), consumed // 2 + 6))
            for k in in_area(area):
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
        d.front_door.peer_ahead(array("I"), 1)  # the order's end: its copies and spares go, and their mappings
        assert d.front_door.peer_ahead_state()["copies"] == 0
        assert area_mappings(area) == []
    finally:
        gen.close()


def test_a_lane_copy_is_its_files_second_name_and_none_is_left_behind(short_tmp):
    """A copy of the lane's is its file's key name linked to the file's own name in the area's
    top; written over for the next key, the same file takes that key's name. A copy another path
    took (Python staged the key anew) leaves the lane's books with its file's own name unlinked,
    its key's name and bytes the other path's; at the order's end nothing of the lane's is left.
    An area on disk is never written through a mapping (a page whose read fails would be SIGBUS,
    not EIO)."""
    gen = make_sharded_door(short_tmp, workers=2, files=60)
    d = next(gen)
    try:
        area = d.area
        d.linked = link_flight(d, d.root, at_once=True)  # kept alive with the door
        order = sorted(d.sums, key=d.row)  # every other file is node 1's
        remote = [k for k in order if k not in d.mine]
        d.front_door.grant(6 * max(d.snap.files[k].size for k in remote), PEER_BOOKS)
        d.front_door.peer_ahead(array("I", [d.row(k) + 1 for k in order]), len(order))
        settled(d, 6)
        own = {os.stat(os.path.join(area, name)).st_ino: name for name in os.listdir(area)
               if name.startswith(TMP_PREFIX)}
        first = {}
        for k in remote[:6]:
            st = os.stat(os.path.join(area, k))
            assert st.st_nlink == 2 and st.st_ino in own, (k, st, own)  # its key's name and its own
            first[k] = st.st_ino
        # Python's copy of the third one replaces the lane's under its key's name
        taken = remote[2]
        tmp = os.path.join(area, os.path.dirname(taken), "python-copy")
        shutil.copyfile(os.path.join(d.root, taken.split("/", 1)[1]), tmp)
        os.replace(tmp, os.path.join(area, taken))
        d.front_door.staged(taken, protocol.SLOT_PEER)
        reused = set()
        for consumed in range(2, len(order) + 1, 2):
            d.front_door.peer_progress(consumed)
            state = settled(d, min(len(remote), consumed // 2 + 6))
            reused |= {os.stat(os.path.join(area, k)).st_ino for k in in_area(area) if k != taken} & set(first.values())
            # the lane's files' own names: its copies' and its spares', no more
            assert len([n for n in os.listdir(area) if n.startswith(TMP_PREFIX)]) <= state["copies"] + 64
        assert reused, "a consumed copy's file is written over and linked to a next key"
        assert state["fetched"] == len(remote), state
        assert in_ram(area) or state["written_mapped"] == 0, state
        d.front_door.peer_ahead(array("I"), 1)  # the order's end
        assert in_area(area, own=True) == [taken], in_area(area, own=True)
        with open(os.path.join(area, taken), "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == d.sums[taken]
    finally:
        gen.close()
