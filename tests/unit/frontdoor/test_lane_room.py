"""The peer read-ahead lane waiting for room wakes Python to lend more (door_peer_ahead.c), and
Python lends what it can at every drain: once the area is lent out, a wake-up brings nothing.
After each wake-up Python lent nothing for, the next waits twice as long (up to 320 ms); one
Python lent for brings them back to every 5 ms."""

from __future__ import annotations

import os
import select
import time
from array import array

import pytest

from monarch import frontdoor
from monarch.frontdoor import BOOKS, PEER_BOOKS
from support.sharded_door import link_flight, make_sharded_door

pytestmark = pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")


def wake_ups(door, seconds: float, lend: int = 0) -> int:
    """How often the door woke Python in ``seconds``, drained each time as Python does (lending
    ``lend`` bytes each time when not 0)."""
    n, until = 0, time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        if select.select([door.wake_fd], [], [], left)[0]:
            n += 1
            door.events(BOOKS)
            door.events(PEER_BOOKS)  # drained: the next wake-up can come
            if lend:
                door.grant(lend, PEER_BOOKS)
    return n


def test_a_lane_waiting_for_room_python_cannot_lend_wakes_it_less_and_less(short_tmp):
    gen = make_sharded_door(short_tmp, workers=2, files=60)
    d = next(gen)
    try:
        d.linked = link_flight(d, d.root, at_once=True)  # kept alive with the door
        order = sorted(d.sums, key=d.row)  # every other file is node 1's
        remote = [k for k in order if k not in d.mine]
        d.front_door.grant(2 * max(d.snap.files[k].size for k in remote), PEER_BOOKS)  # two copies' room
        d.front_door.peer_ahead(array("I", [d.row(k) + 1 for k in order]), len(order))
        deadline = time.monotonic() + 10
        while d.front_door.peer_ahead_state()["fetched"] < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        # no progress, nothing lent: the lane looks for room every 20 ms and finds none
        quiet = wake_ups(d.front_door, 1.0)
        assert 1 <= quiet <= 12, quiet  # 9: at once, then 5, 10, 20, ... 320 ms apart; not one a look (50)
        state = d.front_door.peer_ahead_state()
        assert state["room_waits"] >= 20 and state["fetched"] == 2, state
        # Python lends a little at each wake-up: the lane asks as often as before again
        small = min(d.snap.files[k].size for k in remote)
        d.front_door.grant(small // 4, PEER_BOOKS)
        lending = wake_ups(d.front_door, 0.3, lend=small // 4)
        assert lending >= 10, lending
    finally:
        gen.close()
