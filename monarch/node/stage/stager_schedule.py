"""The stager's scheduling: which key to copy next, and room made for the keys a reader will want.

In this order (the cold path counts):
  1. demand: a file the application is waiting for goes first, into slots background
     copies may not take (``background_slots``), so it starts at once;
  2. order hints (``monarch.hints``): the coming epoch's order, staged just ahead of the
     reader; files this epoch has consumed are dropped when room is needed for ones it
     has not (clairvoyant: a file is read from the PFS at most once per epoch);
  3. read-ahead (``staging.policy: read-ahead``): the files of a walk still under way as it
     finds them, then the rest of the dataset, in the background while it fits, pinned
     (nothing is evicted for it); another node's files only from that node;
  4. second copies (``peer.replicas: 2``, sharded): other nodes' files from their owners,
     once the read-ahead is done and nothing else copies, in the room it left, pinned.
Every method ending in ``_locked`` is called under the books' lock.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from monarch.node.snapshot.indextable import listed_only
from monarch.node.stage.stager_books import Flight, StagerBooks
from monarch.routes import Route

__all__ = ["Schedule", "background_slots"]

SCAN_STEP = 512        # read-ahead keys examined per turn under the lock
PEER_AHEAD = 8         # read-ahead copies from peers at once: an owner answers each within its timeout
REPLICAS_AT_ONCE = 4   # second copies fetched at once (background: the owners serve their readers first)


def background_slots(limit: int) -> int:
    """Of ``limit`` copies in flight, how many background copies may take: the rest stay
    free for copies the application waits for, so those start at once."""
    return max(1, limit - max(1, limit // 4))


@dataclass
class Order:
    """One reader's order for its current epoch (``monarch.hints``)."""
    keys: list[str] = field(default_factory=list)
    cursor: int = 0      # next position the stager looks at
    blocked: bool = False  # the key at the cursor waits for room (for the reader to consume)
    consumed: int = 0    # positions below this the reader is done with
    evict_at: int = 0    # next consumed position to look at for a copy to drop


class Schedule:
    """The queues of one stager's books: demand, hinted orders, read-ahead."""

    def __init__(self, books: StagerBooks):
        self.books = books
        self.demand: collections.deque[str] = collections.deque()
        self.orders: dict[int, Order] = {}
        self.hinted_pos: dict[str, tuple[int, int]] = {}  # key -> (stream, position) in its order
        self.ahead: Iterator[str] | None = None
        self.ahead_held: str | None = None  # the read-ahead's next key, waiting for a peer slot
        self.feed: collections.deque[str] = collections.deque()  # read_ahead_more's keys
        self.peer_ahead = 0  # read-ahead copies from peers running
        self.replicas: Iterator[str] | None = None  # second copies still to consider (keep_replicas)
        self.replicas_running = 0
        self.replicas_no_room = 0  # second copies the tiers had no room for
        self.no_fit = 1  # the smallest file the read-ahead found no room for (1: none yet)

    # -- what is asked for ---------------------------------------------------------------------
    def read_ahead_locked(self, keys: Iterable[str]) -> None:
        self.ahead = iter(keys)
        self.ahead_held = None

    def replicas_locked(self, keys: Iterable[str]) -> None:
        self.replicas = iter(keys)

    def hint_order_locked(self, stream: int, keys: list[str], begin: bool) -> None:
        order = self.orders.get(stream)
        if begin or order is None:
            if order is not None:
                self._forget_positions_locked(stream, order)
            order = self.orders[stream] = Order()
        base = len(order.keys)
        order.keys.extend(keys)
        for i, k in enumerate(keys):
            self.hinted_pos[k] = (stream, base + i)

    def hint_progress_locked(self, stream: int, consumed: int) -> bool:
        """True if the order's copy that waited for room may go now (else no worker need look:
        a progress frame comes every few files, and each wake-up costs the daemon's interpreter)."""
        order = self.orders.get(stream)
        if order is None or consumed <= order.consumed:
            return False
        order.consumed = min(consumed, len(order.keys))
        order.cursor = max(order.cursor, order.consumed)
        blocked, order.blocked = order.blocked, False
        return blocked

    def hint_end_locked(self, stream: int) -> None:
        order = self.orders.pop(stream, None)
        if order is not None:
            self._forget_positions_locked(stream, order)

    def _forget_positions_locked(self, stream: int, order: Order) -> None:
        for k in order.keys:
            if self.hinted_pos.get(k, (None,))[0] == stream:
                del self.hinted_pos[k]

    def clear_locked(self) -> None:
        """Shutting down: nothing queued is copied."""
        self.demand.clear()
        self.feed.clear()
        self.ahead = None
        self.replicas = None

    # -- state -----------------------------------------------------------------------------------
    def has_work_locked(self) -> bool:
        return bool(self.demand or self.orders or self.ahead is not None or self.feed or self.replicas is not None)

    def idle_locked(self) -> bool:
        """Nothing left to read ahead, every hinted order done or waiting for its reader."""
        return (self.ahead is None and self.replicas is None
                and all(o.cursor >= len(o.keys) or o.blocked for o in self.orders.values()))

    def ended_locked(self, flight: Flight) -> bool:
        """``flight`` ended: a read-ahead from a peer, or a second copy, frees its slot (True)."""
        self.peer_ahead -= flight.peer_only
        self.replicas_running -= flight.replica
        return flight.peer_only or flight.replica

    # -- the pick ------------------------------------------------------------------------------
    def next_locked(self) -> tuple[str | None, bool]:
        """The next key to copy and whether it was demanded; (None, _) when there is none
        (or no free slot); ("", _) after a fruitless stretch of read-ahead."""
        books = self.books
        limit = books.concurrency.limit
        if books.running >= limit:
            return None, False
        while self.demand:
            key = self.demand.popleft()
            flight = books.flights.get(key)
            if flight is not None and not flight.running:
                return key, True
        if books.running >= background_slots(limit):
            return None, False
        for order in list(self.orders.values()):
            key = self._next_hinted_locked(order)
            if key is not None:
                return key, False
        while self.feed:
            key = self.feed.popleft()
            if self._wanted_locked(key) and not self._from_peer(key) and self._room_for(key):
                books.flights[key] = Flight()
                return key, False
        if self.ahead is not None:
            return self._next_ahead_locked()
        if self.replicas is not None:
            return self._next_replica_locked()
        books.concurrency.starved()
        return None, False

    def _next_replica_locked(self) -> tuple[str | None, bool]:
        """The next second copy to fetch. Only once nothing but second copies is copying: a
        copy of this node's own share under way has not reserved its room yet."""
        books = self.books
        source = books.replica_source
        if books.running > self.replicas_running or self.replicas_running >= REPLICAS_AT_ONCE or source is None:
            return None, False  # its turn comes when those end
        for _ in range(SCAN_STEP):
            key = next(self.replicas, None)
            if key is None:
                self.replicas = None
                return None, False
            if not self._wanted_locked(key) or not source.owns_elsewhere(key) or source.available(key):
                continue  # held already, this node's own now (its owner lost), or its owner is down
            if not any(t.fits(books.snapshot.files[key].size) for t in books.tiers):
                self.replicas_no_room += 1
                continue
            self.replicas_running += 1
            books.flights[key] = Flight(replica=True)
            return key, False
        return "", False

    def _next_ahead_locked(self) -> tuple[str | None, bool]:
        books = self.books
        for _ in range(SCAN_STEP):
            key, self.ahead_held = self.ahead_held or next(self.ahead, None), None
            if key is None:
                self.ahead = None
                break
            if not self._wanted_locked(key):
                continue
            if listed_only(books.snapshot.files, key) and not self._fits(self.no_fit):
                continue  # the tiers are full: not described (a stat on the PFS) only to find it does not fit
            size = books.snapshot.files[key].size
            if self._from_peer(key):
                if (books.peer_area is None or not any(t.fits(size) for t in books.peer_places())
                        or books.peers.available(key)):
                    continue
                if self.peer_ahead >= PEER_AHEAD:  # its turn comes when one of those ends
                    self.ahead_held = key
                    return None, False
                self.peer_ahead += 1
                books.flights[key] = Flight(peer_only=True)
                return key, False
            if self._room_for(key):
                books.flights[key] = Flight()
                return key, False
            self.no_fit = max(1, size if self.no_fit == 1 else min(self.no_fit, size))
        else:
            return "", False
        books.concurrency.starved()
        return None, False

    def _wanted_locked(self, key: str) -> bool:
        books = self.books
        return (key not in books.staged and key not in books.flights and key not in books.unstageable
                and key not in books.no_room and key in books.snapshot.files and not books.is_dirty(key))

    def _next_hinted_locked(self, order: Order) -> str | None:
        while order.cursor < len(order.keys):
            key = order.keys[order.cursor]
            if not self._wanted_locked(key):
                order.cursor += 1
                continue
            if not self.make_room_locked(self.books.snapshot.files[key].size):
                order.blocked = True
                return None  # wait until the reader consumes more
            order.blocked = False
            order.cursor += 1
            self.books.flights[key] = Flight()
            return key
        return None

    # -- room ------------------------------------------------------------------------------------
    def _from_peer(self, key: str) -> bool:
        """Is ``key`` copied whole from the node that owns it (its route, on a replicating node)?"""
        books = self.books
        return books.peers is not None and books.peers.owns_elsewhere(key) and \
            books.route(key, books.snapshot.files[key]) in (Route.PEER, Route.PEER_LANE)

    def _room_for(self, key: str) -> bool:
        """Room for ``key``: its size, or, for a large file of a cluster, some of its blocks
        (each node stages the ranges it owns first, in the room it has: ``blocks.py``)."""
        info = self.books.snapshot.files[key]
        blocks = self.books.blocks
        if blocks is not None and blocks.peers is not None and blocks.eligible(key, info):
            return True
        return self._fits(info.size)

    def _fits(self, size: int) -> bool:
        """Room for ``size`` bytes in some tier, room lent out of the tiers taken back if need be."""
        tiers = self.books.tiers
        return any(t.fits(size) for t in tiers) or any(self.books.ask_room_back(t) and t.fits(size) for t in tiers)

    def room_for_hinted_locked(self, key: str, size: int) -> bool:
        """Room for a hinted ``key`` that found none (``make_room_locked``); False for others."""
        return key in self.hinted_pos and self.make_room_locked(size)

    def make_room_locked(self, size: int) -> bool:
        """Room for ``size`` bytes in some tier, dropping copies hinted readers have
        consumed if need be (oldest consumed first). False if there is none to drop."""
        books = self.books
        while not self._fits(size):
            victim = None
            for order in self.orders.values():
                while order.evict_at < order.consumed:
                    k = order.keys[order.evict_at]
                    order.evict_at += 1
                    if k in books.staged and books.staged[k] in books.tiers:
                        victim = k
                        break
                if victim is not None:
                    break
            if victim is None:
                return False
            books.drop_locked(victim)
            books.files_dropped += 1
        return True
