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

The door knows who owns a file from an array by index entry (the snapshot's order of files),
computed once here. After a node is lost its files have new owners the array does not know:
the door's fetches from the lost node end at once (the data path knows it is lost) and
those opens are handed over to Python, which asks the new owner.
"""

from __future__ import annotations

import logging
from array import array
from typing import Callable

from monarch.cluster.datapath import DataPath
from monarch.frontdoor import EV_STAGED, EV_TRANSIENT, PEER_BOOKS, FrontDoor
from monarch.node.door.door_link import LEASE_MAX, LEASE_SHARE
from monarch.node.snapshot.index_writer import positions
from monarch.node.peer.peer_cache import GRACE, PeerCache
from monarch.node.stage.stager_books import StagerListener
from monarch.node.tiers.tiers import Tier

log = logging.getLogger(__name__)

OWNER_NONE = -1
LEASE_MIN = 64 << 10  # room lent to the door at a time, at least (a few small files)


def owners_by_entry(files, owner: Callable[[str], int], node: int) -> array:
    """The owner of each of ``files`` (a snapshot's) at its entry in the index (index_writer's
    positions); OWNER_NONE for this node's own."""
    position = positions(files)
    out = array("h", [OWNER_NONE]) * len(files)
    for key in files:
        who = owner(key)
        if who != node:
            out[position(key)] = who
    return out


class PeerDoorLink(StagerListener):
    """``door``'s peer lane kept with ``cache``'s books, fetching through ``datapath`` (the C
    peer data path: its functions are called by the door)."""

    def __init__(self, door: FrontDoor, cache: PeerCache, datapath: DataPath, owners: array, node: int,
                 timeout: float, counters_path: str | None = None):
        self.door = door
        self.cache = cache
        self.area = cache.area
        books = cache.books
        with books.lock:  # the books so far, then every event: nothing is missed in between
            books.subscribe_locked(self)
            for key in books.flights:  # fetches under way are the cache's
                door.claim(key)
        if not door.peers(*datapath.fetch_function(), owners, node, self.area.slot, timeout, self.area.unit,
                          datapath.fetch_many_function()):
            raise OSError("the front door has no peer area to fetch into")
        # which fetches the area keeps: measured from the shim's opens there (the rest are memfds)
        if counters_path is not None and not door.peer_reuse(counters_path):
            log.warning("the shim's counters %s cannot be read: every remote file goes into the peer area", counters_path)
        cache.ask_before_evicting(lambda key: door.evict(key, GRACE))  # the door's answers count as uses
        self.tend()

    # -- the cache's events (StagerListener) -----------------------------------------------
    def published(self, key: str, tier: Tier) -> None:
        self.door.staged(key, tier.slot)

    def dropped(self, key: str) -> None:
        self.door.forget(key)

    def claiming(self, key: str) -> bool:
        if not self.door.claim(key):
            return False
        self.absorb()  # the door fetched it first
        return True

    def room_wanted(self, tier: Tier) -> bool:
        return tier is self.area and self.reclaim_lease()

    # -- the door's fetches ------------------------------------------------------------------
    def absorb(self) -> int:
        """Enter what the door fetched into the cache's books; lend it room again. Returns
        how many files it fetched."""
        books, lru, counts = self.cache.books, self.cache.lru, self.cache.counts
        fetched = 0
        with books.lock:  # drained under the lock: a claim that finds a fetch of the door's finds it here
            for ev in self.door.events(PEER_BOOKS):
                if ev.kind == EV_TRANSIENT:  # answered as a memfd: nothing to book
                    counts["transient"] += 1
                    counts["transient_bytes"] += ev.size
                if ev.kind != EV_STAGED:
                    continue  # a failed fetch: handed over, Python's protocol fetches it
                if books.enter_copy_locked(ev.key, self.area, ev.size, paid=self.area.allocated(ev.size)):
                    lru.published(ev.key, self.area)
                    counts["fetched"] += 1
                    counts["fetched_bytes"] += ev.size
                    fetched += 1
        self.tend()
        return fetched

    def tend(self) -> None:
        """Lend the door room when little is left of its lease (evicting as the cache does)."""
        books = self.cache.books
        allowed = not books.closed and not books.dirty and self.area.full_reason is None
        self.door.peer_copying(allowed)
        if not allowed:
            self.reclaim_lease()
            return
        # a share of the area, but never more than half of a small one: its LRU makes the room
        chunk = min(LEASE_MAX, max(LEASE_MIN, self.area.capacity // LEASE_SHARE), self.area.capacity // 2)
        if self.door.lease(PEER_BOOKS) < chunk // 2 and books.reserve(self.area, chunk):
            self.door.grant(chunk, PEER_BOOKS)

    def reclaim_lease(self) -> bool:
        """Give the door's unused room back to the area. True if there was some."""
        left = self.door.reclaim(PEER_BOOKS)
        if left:
            self.area.release(left)
        return left > 0

    def stop(self) -> None:
        """The lane off (its fetches under way end first), its room given back."""
        self.cache.ask_before_evicting(None)
        self.door.peer_reuse(None)
        self.door.peers(None, None, None, None, 0, self.area.slot, 0)
        self.door.peer_copying(False)
        self.reclaim_lease()
