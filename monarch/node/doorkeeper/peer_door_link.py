"""The front door's peer lane beside the peer cache: other nodes' files fetched without Python.

In a sharded cluster most opens are of files another node owns. The front door fetches such
a miss itself through the C peer data path (``monarch/cluster/datapath.c``) into the peer
area and answers it, as it copies small PFS files on a single node. A ``PeerDoorLink`` keeps
the door's table and the peer cache's books one, as ``DoorLink`` does for the stager's:

* the door is told of every copy the cache publishes or drops (its LRU evicts), and a key
  the cache fetches itself is claimed first (a file is never fetched twice at once);
* the door's fetches enter the cache's books (``absorb``): booked in the area, in the LRU's
  order, counted as fetched;
* the room it fetches into is lent out of the peer area a chunk at a time, made by evicting
  the least recently used copies as the cache's own fetches do, and given back whenever the
  cache wants it; with none left the door answers a transient copy itself (a sealed memfd,
  the cache's own answer when it cannot make room), counted in the cache's ``transient``;
* a remote file the area would likely not serve again is answered as a sealed memfd: the
  door measures how often the area's copies are opened again (the shim's opens in the peer
  slot, ``counters_path``) and keeps every fetch there only while that pays (door_peer.c);
* the door's answers count as uses: a copy it answered less than GRACE ago is not evicted
  (checked and handed over in one step, ``FrontDoor.evict``), so an application it was
  answered to never finds it gone.

When the readers tell their order (``monarch.hints``), the door's peer read-ahead lane
(``door_peer_ahead.c``) fetches the other nodes' files of that order ahead of the reader, in
batches per owner at once, into room lent here as for its other fetches (``hint``): no more ahead
than WINDOW_SHARE of the area holds. The lane keeps its copies' books itself: it takes those the
reader has consumed away when it needs their room (their files written over for the next ones),
and gives its room back when the order ends; nothing of it enters the cache's LRU. Each order
is an epoch of the report's ``peer_ahead`` figures: its other nodes' files, how many of their
opens still had to be fetched (by the door, as a transient copy, or by Python), and how many
came while the read-ahead fetched their file (answered once it was there: not local hits). Its
reader's progress requests are answered by the door itself; the stager's share of them is
taken here when Python drains the door (``told``).

The door knows who owns a file from the placement's ring, or else from a table by index entry
(``entry_owners.py``), given once here. After a node is lost its files have new owners neither knows:
the door's fetches from the lost node end at once (the data path knows it is lost) and
those opens are handed over to Python, which asks the new owner.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from typing import Callable

from monarch import protocol
from monarch.cluster.datapath import DataPath
from monarch.frontdoor import EV_STAGED, EV_TRANSIENT, PEER_BOOKS, FrontDoor
from monarch.node.doorkeeper.door_link import LEASE_MAX, LEASE_SHARE
from monarch.node.doorkeeper.entry_owners import EntryOwners
from monarch.node.snapshot.index_writer import positions
from monarch.node.peer.peer_cache import GRACE, PeerCache
from monarch.node.stage.stager_books import StagerListener
from monarch.node.tiers.tiers import Tier

log = logging.getLogger(__name__)

LEASE_MIN = 64 << 10  # room lent to the door at a time, at least (a few small files)
# the GRACE of a copy answered while a hinted order steers: its reader opens it at once, and the
# read-ahead needs the room back within an epoch (a copy gone first is read from the PFS: fail open)
HINTED_GRACE = 0.05
# of the peer area, what the read-ahead may hold ahead of the reader's progress (the rest: the
# copies consumed but not yet told so, the sampler's lag). bench_cluster --hints, area in RAM:
# local hits 0.68 at 0.5, 0.75-0.78 at 0.8; beyond, the lag's copies leave the lane short of room
WINDOW_SHARE = 0.8
# an order's other nodes' files sized from a sample of at most this many (the window needs their mean)
SIZE_SAMPLES = 64


def extend_order(order: array, keys, position: Callable[[str], int | None], remote_at: Callable[[int], bool],
                 size_of: Callable[[str], int], samples: int = SIZE_SAMPLES) -> tuple[int, int]:
    """``keys``' index entries (from 1) appended to ``order``; returns how many of them are other
    nodes' files and their bytes, estimated from the sizes (``size_of``) of at most about ``samples``
    of them (a file's record costs ~2 us in Python, an order names every file of an epoch; the
    read-ahead's window needs their mean only)."""
    remote = sampled = sampled_bytes = 0
    every = max(1, len(keys) // samples)
    for key in keys:
        at = position(key)
        if at is not None:
            order.append(at + 1)
            if remote_at(at):
                remote += 1
                if (remote - 1) % every == 0:  # the first, then every ``every``-th
                    sampled += 1
                    sampled_bytes += size_of(key)
    return remote, sampled_bytes * remote // sampled if sampled else 0


class PeerDoorLink(StagerListener):
    """``front_door``'s peer lane kept with ``cache``'s books, fetching through ``datapath`` (the C
    peer data path: its functions are called by the door)."""

    def __init__(self, front_door: FrontDoor, cache: PeerCache, datapath: DataPath, owners: EntryOwners, node: int,
                 timeout: float, files=None, counters_path: str | None = None):
        """``files``: the snapshot's, for the hinted orders (None: hints steer no fetch);
        ``counters_path``: the shim's counters, whose opens in the peer slot measure which
        fetches the area keeps (None: every one while it has room)."""
        self.front_door = front_door
        self.owners = owners
        self._position = positions(files) if files is not None else None
        self._files = files
        self._order = array("I")        # the hinted order's index entries (the last stream's)
        self._stream: int | None = None
        self._remote = 0                # of which other nodes' files
        self._remote_bytes = 0          # their bytes, as the area allocates them
        self._epochs: list[dict] = []   # per order: its other nodes' files, those fetched at their open
        self._at_open_before = 0
        self._waited_before = 0         # opens that waited for the read-ahead's fetch, before this order
        self._hint_lock = threading.Lock()
        self.cache = cache
        self.area = cache.area
        books = cache.books
        with books.lock:  # the books so far, then every event: nothing is missed in between
            books.subscribe_locked(self)
            for key in books.flights:  # fetches under way are the cache's
                front_door.claim(key)
        if not front_door.peers(*datapath.fetch_function(), owners.give_to(front_door), node, self.area.slot,
                                timeout, self.area.unit,
                          datapath.fetch_many_function(), datapath.flight_functions()):
            raise OSError("the front door has no peer area to fetch into")
        front_door.peer_describe(*datapath.describe_functions())  # another node's listed file: its owner's stat
        # which fetches the area keeps: measured from the shim's opens there (the rest are memfds)
        if counters_path is not None and not front_door.peer_reuse(counters_path):
            log.warning("the shim's counters %s cannot be read: every remote file goes into the peer area",
                        counters_path)
        cache.ask_before_evicting(lambda key: front_door.evict(key, self._grace()))  # the door's answers count as uses
        self.tend()

    # -- the cache's events (StagerListener) -----------------------------------------------
    def published(self, key: str, tier: Tier) -> None:
        self.front_door.staged(key, tier.slot)

    def dropped(self, key: str) -> None:
        self.front_door.forget(key)
        if self._position is not None:  # gone from the area: the read-ahead may fetch it again
            self.front_door.peer_gone(key)

    def claiming(self, key: str) -> bool:
        if not self.front_door.claim(key):
            return False
        self.absorb()  # the door fetched it first
        return True

    def room_wanted(self, tier: Tier) -> bool:
        return tier is self.area and self.reclaim_lease()

    # -- the door's fetches ------------------------------------------------------------------
    def absorb(self) -> int:
        """Enter what the door fetched at an open into the cache's books; lend it room again.
        Returns how many opens it answered with a fetch. (The read-ahead lane's copies are
        its own books: door_peer_ahead.c.)"""
        books, lru, counts = self.cache.books, self.cache.lru, self.cache.counts
        fetched = 0
        with books.lock:  # drained under the lock: a claim that finds a fetch of the door's finds it here
            for ev in self.front_door.events(PEER_BOOKS):
                if ev.kind == EV_TRANSIENT:  # answered as a memfd: nothing to book
                    counts["transient"] += 1
                    counts["transient_bytes"] += ev.size
                if ev.kind != EV_STAGED:
                    continue  # a failed fetch: handed over, Python's protocol fetches it
                if books.enter_copy_locked(ev.key, self.area, ev.size, paid=self.area.allocated(ev.size)):
                    lru.published(ev.key, self.area)
                    counts["fetched"] += 1
                    counts["fetched_bytes"] += ev.size
                    fetched += 1  # an open answered so
                    if self._stream is not None:  # a hinted order: its reader opened it at once
                        lru.order[ev.key] = (ev.size, time.monotonic() - GRACE + HINTED_GRACE)
        self.tend()
        return fetched

    def tend(self) -> None:
        """Lend the door room when little is left of its lease (evicting as the cache does)."""
        books = self.cache.books
        allowed = not books.closed and not books.dirty and self.area.full_reason is None
        self.front_door.peer_copying(allowed)
        if not allowed:
            self.reclaim_lease()
            return
        chunk = self._chunk()
        if self.front_door.lease(PEER_BOOKS) < self._low_water() and books.reserve(self.area, chunk):
            self.front_door.grant(chunk, PEER_BOOKS)

    def _chunk(self) -> int:
        """Room lent at a time: a share of the area, never more than half of a small one (its LRU
        makes the room); with a hinted order, half the read-ahead's window."""
        chunk = min(LEASE_MAX, max(LEASE_MIN, self.area.capacity // LEASE_SHARE), self.area.capacity // 2)
        return max(chunk, min(LEASE_MAX, self.area.capacity // 4)) if self._stream is not None else chunk

    def _low_water(self) -> int:
        """Room lent is topped up below this (with a hinted order: kept at a whole chunk)."""
        return self._chunk() if self._stream is not None else self._chunk() // 2

    def reclaim_lease(self) -> bool:
        """Give the door's unused room back to the area. True if there was some."""
        left = self.front_door.reclaim(PEER_BOOKS)
        if left:
            self.area.release(left)
        return left > 0

    # -- the hinted order (door_peer_ahead.c) -------------------------------------------------
    def hint(self, op: int, stream: int, keys) -> None:
        """A hint (protocol.HINT_*) of stream ``stream``: an order (``keys``, the whole order,
        this node's own files too: the progress counts its positions), more of it, the
        reader's progress, or its end. The last stream to send an order steers the lane."""
        if self._position is not None:
            with self._hint_lock:
                self._hint_locked(op, stream, keys)

    def _hint_locked(self, op: int, stream: int, keys) -> None:
        if op in (protocol.HINT_ORDER, protocol.HINT_MORE):
            if op == protocol.HINT_ORDER or stream != self._stream:
                self._new_epoch()
                self._order, self._stream, self._remote, self._remote_bytes = array("I"), stream, 0, 0
            files, allocated = self._files, self.area.allocated
            remote, remote_bytes = extend_order(self._order, keys, self._position, self.owners.remote,
                                                lambda key: allocated(files[key].size))
            self._remote += remote
            self._remote_bytes += remote_bytes
            self.front_door.peer_ahead(self._order, self._window(), stream)
        elif stream != self._stream:
            return
        elif op == protocol.HINT_PROGRESS:
            self.front_door.peer_progress(int(keys))
            if self.front_door.lease(PEER_BOOKS) < self._low_water():  # lent before the lane waits for room
                self.absorb()
        else:
            self.front_door.peer_ahead(array("I"), 1)
            self._new_epoch()
            self._stream = None

    def told(self) -> tuple[tuple[int, int] | None, int]:
        """The last progress the reader told the door itself (HINT PROGRESS requests on a
        connection of their own: answered in C, no interpreter per frame), not taken before, as
        (stream, positions consumed), or None; and how many the door answered so far."""
        return self.front_door.peer_told()

    def _grace(self) -> float:
        return HINTED_GRACE if self._stream is not None else GRACE

    def _window(self) -> int:
        """How far ahead the lane fetches, in positions of the order: WINDOW_SHARE of the area,
        as positions go (this node's own files among them)."""
        if not self._remote:
            return 1
        per_position = self._remote_bytes / max(1, len(self._order))
        return max(4, int(self.area.capacity * WINDOW_SHARE // max(1.0, per_position)))

    def _fetched_at_open(self) -> int:
        """Other nodes' files fetched when they were opened (by the door, as a transient copy, or
        by Python): every fetch but the lane's."""
        self.absorb()
        counts = self.cache.counts
        return counts["fetched"] + counts["transient"]

    def _new_epoch(self) -> None:
        now, waited = self._fetched_at_open(), self.front_door.peer_ahead_state()["waited"]
        if self._stream is not None:
            self._epochs.append({"remote_opens": self._remote, "fetched_at_open": now - self._at_open_before,
                                 "waited_for_ahead": waited - self._waited_before})
        self._at_open_before, self._waited_before = now, waited

    def ahead_stats(self) -> dict:
        """The report's ``peer_ahead``: the lane's figures and, per hinted order (an epoch), its
        other nodes' files and how many of their opens had to fetch (the rest were local hits)."""
        with self._hint_lock:
            return self._ahead_stats_locked()

    def _ahead_stats_locked(self) -> dict:
        epochs = list(self._epochs)
        if self._stream is not None:
            epochs.append({"remote_opens": self._remote,
                           "fetched_at_open": self._fetched_at_open() - self._at_open_before,
                           "waited_for_ahead": self.front_door.peer_ahead_state()["waited"] - self._waited_before})
        return {"lane": self.front_door.peer_ahead_state(), "epochs": epochs}

    def stop(self) -> None:
        """The lane off (its fetches under way end first), its room given back."""
        if self._position is not None:
            self.front_door.peer_ahead(array("I"), 1)  # the read-ahead lane's batch under way ends first
        self.cache.ask_before_evicting(None)
        self.front_door.peer_reuse(None)
        self.front_door.peers(None, None, None, None, 0, self.area.slot, 0)
        self.front_door.peer_copying(False)
        self.reclaim_lease()
