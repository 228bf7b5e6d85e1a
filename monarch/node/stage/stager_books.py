"""The stager's books: which copy is where, what is in flight or not to be tried, the counts, and who listens.

One lock (``lock``) guards all of it; the stager's scheduling (``stager_schedule.py``) and
copying (``stager_copy.py``) both work on these books, and so may a listener
(``StagerListener``: the front door's link, ``door_link.py``) that keeps books of its own
beside them. A listener is told of events; the stager never knows what it is.
"""

from __future__ import annotations

import collections
import os
import stat
import threading
from concurrent.futures import Future

from monarch.node.stage.concurrency import Concurrency
from monarch.node.snapshot.snapshot import FileInfo, Snapshot
from monarch.node.stage.sources import PeerSource
from monarch.node.stage.staged_table import StagedTable
from monarch.node.tiers.tiers import Tier
from monarch.routes import FileFacts, NodeFacts, Route, published, route_of, stepped

__all__ = ["Eviction", "Flight", "StagerBooks", "StagerListener"]


class StagerListener:
    """What the stager tells whoever keeps books beside its own. Every method is a no-op
    here: a listener overrides what it needs. Unless said otherwise a call is made under
    the books' lock (the listener may read and update the books, not take the lock)."""

    def published(self, key: str, tier: Tier) -> None:
        """A complete copy of ``key`` is in ``tier`` (copied here, or adopted from a kept one)."""

    def dropped(self, key: str) -> None:
        """The copy of ``key`` is about to go (the job wrote to it, or room is made): before
        its file is removed, so that nobody is told of it after."""

    def written(self, key: str) -> None:
        """The job writes to ``key`` (a file or a directory). Not under the lock: the
        listener may take it; the copies under ``key`` are dropped right after."""

    def claiming(self, key: str) -> bool:
        """The stager is about to copy ``key``: from now on only it does. True if a copy
        made elsewhere before this was entered into the books (the stager then uses it).
        Not under the lock: the listener may take it."""
        return False

    def room_wanted(self, tier: Tier) -> bool:
        """A copy does not fit in ``tier``: give back room lent out of it. True if some
        came back. Called with or without the lock (it must not take it)."""
        return False


class Eviction:
    """Which copy goes when a tier is full. The stager's books have none (pin, don't thrash:
    a full tier takes no more); an evicting cache's books do (the sharded cluster's peer
    area, ``peer_cache.py``). Called under the books' lock, which then drops the copy named."""

    def victim_locked(self, tier: Tier, size: int) -> str | None:
        """The key whose copy in ``tier`` is to go so that ``size`` bytes may fit, or None."""
        return None


class Flight:
    """One key's copy: asked for or scheduled, then running; its future is the tier (the
    peer cache's: its answer). One flight per key (``StagerBooks.flights``): entered and
    removed under the books' lock, its future resolved only after it was removed, outside
    the lock; whoever finds it in the table under the lock may still wait on its future."""
    __slots__ = ("future", "running", "peer_only", "replica")

    def __init__(self, peer_only: bool = False, replica: bool = False):
        self.future: Future = Future()
        self.running = False
        self.peer_only = peer_only  # read ahead from the owning peer: never from the PFS here
        self.replica = replica      # a second copy of a peer's file, from it into the tiers: never from the PFS


class StagerBooks:
    """The shared state of one stager (see the module's docstring)."""

    def __init__(self, snapshot: Snapshot, tiers: list[Tier], concurrency: Concurrency, *,
                 peers: PeerSource | None = None, peer_area: Tier | None = None, node: NodeFacts | None = None,
                 store_roots: frozenset[int] = frozenset()):
        self.snapshot = snapshot
        self.tiers = tiers
        self.node = node or NodeFacts()  # the node's facts a file's route depends on (monarch/routes.py)
        # each root's routes by size, decided once on the node's facts: what the index publishes
        # per file (the daemon writes these), and the same for the files another node owns
        self.routes = published(self.node, len(snapshot.roots), store_roots)
        self.routes_elsewhere = published(self.node, len(snapshot.roots), store_roots, elsewhere=True)
        self.peers = peers
        self.peer_area = peer_area
        self.concurrency = concurrency
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)
        self.listeners: list[StagerListener] = []  # see subscribe
        self.eviction: Eviction | None = None  # see reserve
        self.flights: dict[str, Flight] = {}
        self.running = 0  # copies under way (on a staging thread or inline in an asker)
        self.closed = False
        self.staged: StagedTable[Tier] = StagedTable(snapshot.files)  # key -> tier holding its complete copy
        self.failures: collections.Counter[str] = collections.Counter()
        self.unstageable: set[str] = set()  # answered "PFS" at once from now on, counted once
        self.no_room: set[str] = set()  # did not fit; tried again only once room was freed
        self.dirty: set[str] = set()  # keys (files or directories) the job wrote to
        self.files_read: collections.Counter[str] = collections.Counter()  # by source name
        self.bytes_read: collections.Counter[str] = collections.Counter()
        self.bytes_staged = 0
        self.files_staged = 0
        self.files_dropped = 0
        self.demand_copies = 0
        self.background_copies = 0
        # peer.replicas: 2 (a sharded cluster): where second copies come from, and those kept
        self.replica_source: PeerSource | None = None
        self.blocks = None  # a stager's large files, staged by blocks (blocks.BlockStager)
        self.replicas: set[str] = set()

    def route(self, key: str, info: FileInfo | None) -> Route | None:
        """How ``key`` is served when no copy of it is staged (None: not in the snapshot): the
        route the index publishes for it (``routes``, read by its root and size as the index
        writer reads them), or, when another node owns it (``peers`` says: the one fact that
        comes after the index), ``routes_elsewhere``'s."""
        if info is None:
            return None
        elsewhere = self.peers is not None and self.peers.owns_elsewhere(key)
        k = key.partition("/")[0]
        if not (stat.S_ISREG(info.mode) and k.isdigit() and int(k) < len(self.routes)):  # published for none
            return route_of(FileFacts(size=info.size, regular=stat.S_ISREG(info.mode), elsewhere=elsewhere), self.node)
        return stepped(info.size, (self.routes_elsewhere if elsewhere else self.routes)[int(k)])

    def subscribe(self, listener: StagerListener) -> None:
        """Tell ``listener`` of this stager's events: the copies so far first (``published``),
        then every event, none missed in between."""
        with self.lock:
            self.subscribe_locked(listener)

    def subscribe_locked(self, listener: StagerListener) -> None:
        for key, tier in self.staged.items():
            listener.published(key, tier)
        self.listeners.append(listener)

    def is_dirty(self, key: str) -> bool:
        """The job wrote to ``key`` or to a directory above it."""
        if not self.dirty:
            return False
        parts = key.split("/")
        return any("/".join(parts[:i]) in self.dirty for i in range(2, len(parts) + 1))

    def peer_places(self) -> list[Tier]:
        """Where a copy from a peer may go (a replicated cluster): the peer area, then
        the tiers (room this node's own share left: every node holds the whole dataset)."""
        return [self.peer_area, *self.tiers]

    def ask_room_back(self, tier: Tier) -> bool:
        """Room lent out of ``tier`` comes back (``StagerListener.room_wanted``); True if some did."""
        return any([listener.room_wanted(tier) for listener in self.listeners])

    def reserve(self, tier: Tier, size: int) -> bool:
        """Room for ``size`` bytes of allocation in ``tier`` (``Tier.allocated``), taken (False: none could be had). Room
        lent out of it comes back first; then, with an ``eviction`` policy, the copies it
        names are dropped until the room is there (none while one of them is too young: its
        policy says). Not under the lock."""
        if not tier.has_room(size):
            self.ask_room_back(tier)
        if self.eviction is None:
            return tier.reserve(size)
        while not tier.reserve(size, counted=False):  # an evicting cache's refusals are not the tier's
            with self.lock:
                if self.closed or tier.full_reason is not None:  # its filesystem is full: evicting would not help
                    return False
                victim = self.eviction.victim_locked(tier, size)
                if victim is None or self.staged.get(victim) is not tier:
                    return False
                self.drop_locked(victim)
        return True

    # -- entries -------------------------------------------------------------------------------
    def staged_locked(self, key: str, tier: Tier) -> None:
        """``key``'s complete copy is in ``tier``: booked, and the listeners told."""
        self.staged[key] = tier
        for listener in self.listeners:
            listener.published(key, tier)

    def count_read_locked(self, source: str, files: int, nbytes: int) -> None:
        self.files_read[source] += files
        self.bytes_read[source] += nbytes

    def enter_copies_locked(self, tier: Tier, copies: list[tuple[str, int, int]]) -> None:
        """``enter_copy_locked(key, tier, size, demanded=False)`` for each (key, size, row) of the
        front door's read-ahead lane: their room beyond their bytes taken at once, the tier's
        account updated once (a million small files: no per-file lock and call chain). ``row``:
        the key's entry in the snapshot's index, booked with no look-up (-1: not known)."""
        extra = sum(tier.allocated(size) - size for _, size, _ in copies)
        if extra and not tier.reserve(extra, counted=False, written=True):  # not all fit: one by one, as room allows
            for key, size, _ in copies:
                self.enter_copy_locked(key, tier, size, demanded=False)
            return
        total = sum(size for _, size, _ in copies)
        tier.committed_many(len(copies), total, extra + total)
        staged, flights = self.staged, self.flights
        for key, _, row in copies:
            if key not in flights:  # (a flight that found it counts itself)
                self.background_copies += 1
            if row < 0 or not staged.set_row(row, tier):
                staged[key] = tier
        self.bytes_staged += total
        self.files_staged += len(copies)

    def enter_copy_locked(self, key: str, tier: Tier, size: int, paid: int | None = None,
                          demanded: bool = True) -> bool:
        """A raw copy of ``key`` someone else made in ``tier`` for an asker (the front door's):
        booked as this stager's own. The listeners are not told: its maker knows.

        Its maker paid ``paid`` bytes out of room lent to it (default ``size``: the front
        door's copy lane counts the files' bytes; its peer lane pays their allocation); what
        the filesystem allocates beyond them is taken here, after
        room still lent comes back if need be; a filesystem found full since the copy was
        made refuses nothing (its bytes are there already). When the capacity leaves too
        little, the copy is removed (the listeners are told) and False is returned: the
        tier's capacity holds against its allocation, whoever copied into it. The key is
        left to the stager, whose next copy of it goes to a tier with room (it is not "no
        room" while another tier has some). ``demanded``: copied for an asker (else ahead of
        the reader: a background copy)."""
        extra = tier.allocated(size) - (size if paid is None else paid)
        if extra and not tier.reserve(extra, counted=False, written=True):
            self.ask_room_back(tier)
            if not tier.reserve(extra, counted=False, written=True):
                for listener in self.listeners:
                    listener.dropped(key)
                try:
                    os.unlink(tier.path_for(key))
                except OSError:
                    pass
                tier.release(size)
                return False
        tier.committed(size, size, key)
        self.staged[key] = tier
        self.bytes_staged += size
        self.files_staged += 1
        if key in self.flights:
            pass  # a flight of the stager's found it (a claim): it counted itself
        elif demanded:
            self.demand_copies += 1
        else:
            self.background_copies += 1
        return True

    def drop_locked(self, key: str) -> None:
        """Remove ``key``'s copy from its tier and the books (the listeners are told first)."""
        for listener in self.listeners:
            listener.dropped(key)  # before the file goes: nobody names it any more
        tier = self.staged.pop(key)
        self.replicas.discard(key)
        path = tier.copy_path(key)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
            tier.release(tier.allocated(size))
            info = self.snapshot.files.get(key)
            tier.forget(key, info.size if info is not None else size, size)
        except OSError:
            pass
        if tier.decoded is not None:
            # after the frame is gone: a decode that takes its token after this finds no frame,
            # one that took it before is refused (DecodedFiles.drop), so no file of the old bytes
            tier.decoded.drop(key)
        self.no_room.clear()  # room was freed: what did not fit may fit now
