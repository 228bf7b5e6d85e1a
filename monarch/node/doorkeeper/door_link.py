"""The front door's book-keeping beside a stager: told of the stager's copies, and the door's copies booked in the stager's.

The C front door (``monarch.frontdoor``) answers OPENs of staged files from a table of its
own and copies small files itself while the PFS is fast. A ``DoorLink`` subscribes to one
stager's events (``StagerListener``) and keeps the two sets of books one: the door is told
of every copy published or dropped, every key is claimed before the stager copies it (a
file is never copied twice), the door's copies enter the stager's books (``absorb``), and
the room the door copies into is lent out of the first tier, a chunk at a time, and given
back whenever the stager wants it. Neither the stager nor the door knows the other.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from typing import Callable, Iterable

from monarch import frontdoor, protocol
from monarch.frontdoor import EV_AHEAD, EV_STAGED, FrontDoor
from monarch.node.stage.current import Current
from monarch.node.snapshot.index_writer import route_tables
from monarch.node.snapshot.indextable import IndexTable, LargerDescribed, larger_than
from monarch.node.snapshot.key_order import in_order
from monarch.node.outcomes import Outcome
from monarch.node.stage.stager import Stager
from monarch.routes import INLINE_MAX, ROWS, Route
from monarch.node.stage.stager_books import StagerListener
from monarch.node.tiers.tiers import Tier

log = logging.getLogger(__name__)

__all__ = ["DoorLink", "DoorKeeper"]

LEASE_MAX = 16 << 20  # tier room lent to the front door at a time, at most ...
LEASE_SHARE = 32      # ... and at most this share of the tier's capacity
LEASE_SHARE_IN_FLIGHT = 8  # ... or this share, for the read-ahead lane's copies in flight (the rest of a
                           # tight tier stays for the stager's copies: a sharded node's second copies)
PEER_WORKERS = 8      # a cluster daemon's door threads: each waits on the network while it fetches a peer's file
# The door's read-ahead lane starts with this many copies in flight, and its measure of the
# source (inflight.c) takes it from there, up while the latency stays flat, down where more
# copies stop paying; a sharded node, whose share every other node waits for, starts deeper.
AHEAD_START = 8
AHEAD_START_SHARDED = 16
AHEAD_POLL_SECONDS = 0.05  # how often the stager looks whether the lane is through
COPY_SIZE_GUESS = 64 << 10  # a door copy's size before any was made (room lent for the copies in flight)


class DoorLink(StagerListener):
    """``front_door`` kept told of ``stager``'s copies. With ``may_copy`` the door copies small files
    itself while the PFS is fast, into the first tier, then, once it is full, the next raw
    one, within room lent to it (only when the first tier is raw and the tier the door
    copies to; a sharded node's door copies its own files only, ``FrontDoor.own_only``)."""

    def __init__(self, front_door: FrontDoor, stager: Stager, may_copy: bool):
        self.front_door = front_door
        self.stager = stager
        tiers = stager.tiers
        self.may_copy = (may_copy and bool(tiers) and tiers[0].codec is None
                         and front_door.copy_slot == tiers[0].slot)
        self.tier = tiers[0] if tiers else None  # the tier the door copies into, its room lent there
        self.tiers_full = False  # it stopped copying for want of room in every raw tier
        self._copy_size = COPY_SIZE_GUESS  # a door copy's size, as its copies go (moving mean)
        with stager.lock:  # the books so far, then every event: nothing is missed in between
            stager.subscribe_locked(self)
            for key in stager.flights:  # copies under way are the stager's
                front_door.claim(key)
            if stager.dirty:
                front_door.disable()
            self._tend_locked()

    # -- the stager's events (StagerListener) ------------------------------------------------
    def published(self, key: str, tier: Tier) -> None:
        if tier.is_compressed(key):
            self.front_door.forget(key)  # a compressed copy is answered by Python (decoded or a memfd)
        else:
            self.front_door.staged(key, tier.slot)

    def dropped(self, key: str) -> None:
        self.front_door.forget(key)

    def written(self, key: str) -> None:
        self.front_door.disable()  # no copy of the door's after this one; those made are dropped by the stager
        self.absorb()

    def claiming(self, key: str) -> bool:
        if not self.front_door.claim(key):
            return False
        self.absorb()  # the door copied it first
        return True

    def room_wanted(self, tier: Tier) -> bool:
        return self.may_copy and tier is self.tier and self.reclaim_lease()

    def stop_copying(self) -> None:
        """The door copies nothing more (another job came to share the tiers, and the door's
        copies take no claims); those under way still publish. The room lent comes back."""
        with self.stager.lock:
            self.may_copy = False
            self._tend_locked()

    # -- the door's copies -------------------------------------------------------------------
    def absorb(self) -> int:
        """Enter what the door copied into the stager's books, lend it room. Returns how
        many files it staged."""
        books = self.stager
        staged = 0
        tiers = {t.slot: t for t in books.tiers}
        index = books.snapshot.files
        by_entry = isinstance(index, IndexTable) and index.data is self.front_door.index  # its entries are the books' rows
        with books.lock:  # drained under the lock: a claim that finds a copy of the door's finds it here
            ahead: dict[int, list[tuple[str, int, int]]] = {}  # the read-ahead lane's copies, booked per tier at once
            files = nbytes = 0
            for ev in self.front_door.events():
                copied = ev.kind in (EV_STAGED, EV_AHEAD)
                if copied:
                    self._copy_size += (ev.size - self._copy_size) / 64
                files += copied or ev.bytes_read > 0
                nbytes += ev.bytes_read
                if ev.kind == EV_AHEAD:
                    ahead.setdefault(ev.slot, []).append((ev.key, ev.size, ev.entry - 1 if by_entry else -1))
                elif copied and books.enter_copy_locked(ev.key, tiers[ev.slot], ev.size):  # False: no room, removed
                    staged += 1  # an open answered
            books.count_read_locked("pfs", files, nbytes)
            for slot, copies in ahead.items():
                books.enter_copies_locked(tiers[slot], copies)
            self._tend_locked()
        return staged

    def _tend_locked(self) -> None:
        books, tier = self.stager, self.tier
        allowed = self.may_copy and not books.dirty and not books.closed
        if allowed and (tier.full_reason is not None  # its filesystem is full: the stager found out
                        or self.front_door.lease() < self._chunk(tier) // 2 and not self._lend(tier)
                        and self.front_door.lease() < INLINE_MAX):  # a lease, not a file: room for one inline copy
            # the tier is full (pin, don't thrash: nothing is evicted for the door): the next raw
            # tier with room, as the stager spills; with none the door's misses and the lane's
            # list go to the stager now, rather than once the lane has waited for room
            allowed = self._move_on()
            self.tiers_full = not allowed
        self.front_door.copying(allowed)  # whether the PFS is fast enough for it, the door finds out itself
        if not allowed:
            self.reclaim_lease()

    @staticmethod
    def _kept_back(tier: Tier) -> int:  # a budget of bytes, not a file's route: one inline copy's at least
        return max(INLINE_MAX, min(LEASE_MAX, tier.capacity // LEASE_SHARE))

    def _chunk(self, tier: Tier) -> int:
        """Room lent at a time: a share of the tier and, while the read-ahead lane runs, at least
        twice what its copies in flight take (its measure of a slow source keeps a hundred or
        more in flight: lent less, they would wait on Python to lend again, a few at a time)."""
        if not self.front_door.read_ahead_state()["running"]:
            return self._kept_back(tier)
        in_flight = 2 * self.front_door.inflight()["limit"] * int(self._copy_size)
        return max(self._kept_back(tier), min(LEASE_MAX, tier.capacity // LEASE_SHARE_IN_FLIGHT, in_flight))

    def _room(self, tier: Tier) -> int:
        """Reserve in ``tier`` room to lend: a chunk, or less (at least one small file's worth)
        where the tier has little left: its last share is never lent, so that a copy of the
        stager's (a large file, a miss, the books' room for allocations) finds room without
        waiting for the door's to come back. 0 if there is not that much."""
        left = min(self._chunk(tier), tier.capacity - tier.room - self._kept_back(tier))  # INLINE_MAX below: a budget
        return left if tier.full_reason is None and left >= INLINE_MAX and tier.reserve(left, counted=False) else 0

    def _lend(self, tier: Tier) -> bool:
        """Lend the door room in ``tier`` (its copy tier). True if some was lent."""
        room = self._room(tier)
        if room:
            self.front_door.grant(room)
        return room > 0

    def _move_on(self) -> bool:
        """The door's tier is full: it copies into the next raw tier with room from now on, its
        room left in the full one given back. False if there is none."""
        tiers = self.stager.tiers
        for tier in tiers[tiers.index(self.tier) + 1:]:
            if tier.codec is not None:
                return False  # a compressing tier's copies are the stager's (and so are all below it)
            room = self._room(tier)
            if room:
                left = self.front_door.copy_to(tier.slot, room)
                if left < 0:
                    tier.release(room)
                    return False
                self.tier.release(left)
                self.tier = tier
                return True
        return False

    def reclaim_lease(self) -> bool:
        """Give the door's unused room back to its tier: for a true report, and whenever
        the stager finds no room (the next ``absorb`` lends again what is free). True if
        there was some."""
        if not self.may_copy:
            return False
        left = self.front_door.reclaim()
        if left:
            self.tier.release(left)
        return left > 0


class DoorKeeper:
    """The daemon's front door over its life: started on the socket's listener, linked to
    whichever stager serves now (``relink_locked`` at each swap), opened once the index is
    written, its copies absorbed into the books, its counts reported, stopped at close."""

    def __init__(self, front_door: FrontDoor, current: Current, may_copy: Callable[[], bool], own_only: bool = False,
                 fixed_depth: int = 0):
        self.front_door = front_door
        self._current = current
        self._lane_start = AHEAD_START_SHARDED if own_only else AHEAD_START
        self._lane_fixed = fixed_depth  # staging.threads: that many copies in flight (0: measured)
        self._may_copy = may_copy  # asked at each link: a cluster's layout is known once the walk ends
        self.link: DoorLink | None = None  # linked by its holder, under the gate's lock (relink_locked)
        self.peer_link = None  # the peer lane's (PeerDoorLink), sharded with the C data path (link_peers)
        self._told: Callable[[], int] | None = None  # the stager's share of the progress the door answered
        self._lane_lock = threading.Lock()
        self._lane_asked = False  # the read-ahead lane was asked for (read_ahead)

    @classmethod
    def start(cls, listen_fd: int, roots: list[str], tiers: list[Tier], peer_area: Tier | None,
              current: Current, may_copy: Callable[[], bool], workers: int = 0,
              own_only: bool = False, fixed_depth: int = 0) -> "DoorKeeper | None":
        """A door on ``listen_fd`` answering from ``tiers`` (and the peer area), or None when
        it cannot start (the Python server then answers everything). ``may_copy``: whether
        the door may copy files from the PFS (asked whenever it is linked to a stager);
        ``own_only``: a cluster's node, whose door copies only files the node owns;
        ``fixed_depth``: copies in flight (staging.threads), else measured."""
        if not tiers or not frontdoor.wanted() or frontdoor.library() is None:
            return None
        dirs = {t.slot: t.path for t in tiers}
        if peer_area is not None:
            dirs[protocol.SLOT_PEER] = peer_area.path
        try:
            front_door = FrontDoor(listen_fd, roots, dirs, tiers[0].slot, workers)
        except OSError as e:
            log.warning("the daemon's C front door did not start (%s); the Python server answers every request", e)
            return None
        front_door.own_only(own_only)
        return cls(front_door, current, may_copy, own_only, fixed_depth)

    def relink_locked(self) -> None:
        """The door kept told of the current stager's copies, its copies booked there (under
        the gate's lock, where the stager is swapped)."""
        self.link = DoorLink(self.front_door, self._current.stager, self._may_copy())

    def unlink_locked(self) -> None:
        """The snapshot failed: the door never opens, nothing of it to book."""
        self.link = None

    def open(self, index_path: str) -> None:
        """The snapshot is ready: the door answers from now on (never before the index is), and, where
        it copies misses from the PFS, keeps their directories open from the first (door_sources.c)."""
        files = self._current.snapshot.files
        index = files.data if isinstance(files, IndexTable) and isinstance(files.data, (bytearray, mmap.mmap)) else None
        if index is not None and self._current.ready and self._current.stager.routes:
            self.front_door.describe_with(route_tables(self._current.stager.routes))  # it writes the daemon's own index
        if self._current.ready and not self.front_door.open(index_path, index):
            log.warning("the front door could not map the index %s; the Python server answers every request",
                        index_path)
        elif self._current.ready and self.link is not None and self.link.may_copy:
            self.front_door.keep_sources()

    def read_ahead(self, files, stager: Stager, sample: Callable[[], None] | None,
                   closing: Callable[[], bool], absorb: Callable[[], None],
                   order: Callable[[Iterable[str]], Iterable[str]] = iter) -> bool:
        """The door's C lane copies the small files of ``files`` (the snapshot's, in their index
        order; a sharded node's own only) ahead of the reader, many at once, no interpreter per
        file, where the door may copy misses itself (a raw first tier); ``stager`` copies the
        large ones meanwhile and, if the lane ends before its list does (a write by the job, no
        room), every key left, each time in ``order`` (a cluster node's: its own
        files). ``sample`` stages the compressing tiers' sample first.
        Asked where the table of modes names the door's lane (``monarch/node/read_ahead.py``).
        Once per door (the walk's thread and a door attached after the walk may both ask):
        True if the lane started now or was asked for before; False if the stager reads ahead
        alone."""
        with self._lane_lock:
            if self._lane_asked:
                return True
            self._lane_asked = True
        link = self.link
        # a copy takes a page of its tier at least: the most files the raw tiers can hold
        most = sum(t.capacity for t in stager.tiers if t.codec is None) // mmap.PAGESIZE + 1
        if link is None or not link.may_copy or not self.front_door.read_ahead(len(files), self._lane_fixed,
                                                                          self._lane_start, most):
            return False
        found = LargerDescribed(files, ROWS[Route.DOOR].max_size)  # (first: none described meanwhile is missed)
        stager.read_ahead(order(larger_than(files, ROWS[Route.DOOR].max_size)))  # what the DOOR row does not take
        threading.Thread(target=self._after_the_lane, args=(files, stager, sample, closing, absorb, order, found),
                         name="monarch-ahead-rest", daemon=True).start()
        return True

    def _after_the_lane(self, files, stager: Stager, sample, closing, absorb, order, found: LargerDescribed) -> None:
        if sample is not None:
            sample()
        while self.front_door.read_ahead_state()["running"] and not closing():
            if large := found.new():  # a listed file the lane opened and found past its row: the stager's
                stager.read_ahead_more(order(large))
            time.sleep(AHEAD_POLL_SECONDS)
        if closing():
            return
        if large := found.new():
            stager.read_ahead_more(order(large))
        absorb()  # the lane's last copies in the books first
        link = self.link
        if link is not None and link.reclaim_lease():  # lent for the lane's copies in flight: the misses
            absorb()  # left want a share of the tier, no more (the rest is room for second copies)
        ended = self.front_door.read_ahead_state()["ended_because"]
        if ended:  # before its list's end: the stager goes over every key (those staged are skipped)
            log.info("the front door's read-ahead ended early (%s); the staging threads take the rest", ended)
            full = ended == "no_room" or (link is not None and link.tiers_full)
            if full and isinstance(files, IndexTable) and files.undescribed():
                # the tiers are full: only what is described is looked at (a file not described yet
                # would be described, a stat on the PFS each, to learn it does not fit)
                stager.read_ahead(order(files.key(n) for n in sorted(n for n, _ in files.described_sizes())))
            else:
                stager.read_ahead(order(in_order(files)))  # no list of a million keys
        # else every small file was copied, is being copied, or is the stager's (a claim, a
        # failed copy left to its asker): the large ones are the stager's already

    def use_peer_link(self, link, told: Callable[[], int]) -> None:
        """From now on the door also fetches other nodes' files itself (a ``PeerDoorLink``);
        ``told`` hands the stager the progress the readers told the door (JobNotices.take_told)."""
        self.peer_link, self._told = link, told

    def absorb(self) -> dict[Outcome, int]:
        """What the door copied or fetched, into the books: how many opens it answered so (and
        how many readers' progress requests it answered itself, counted as hints)."""
        link = self.link  # a sharded node's door copies its own files and fetches the others'
        return {Outcome.STAGED: link.absorb() if link is not None else 0,
                Outcome.FETCHED: self.peer_link.absorb() if self.peer_link is not None else 0,
                Outcome.HINTS: self._told() if self.peer_link is not None else 0}

    def stats(self) -> dict:
        """The report's ``front_door`` entry (its unused lent room given back first, for a
        true tier occupancy, unless the read-ahead lane runs: taken back at each progress
        poll, the room left the lane's copies waiting for Python to lend it again, and its
        measure of the source took those waits for want of work)."""
        lane = self.front_door.read_ahead_state()
        for link in (self.link, self.peer_link):
            if link is not None and not (lane["running"] and link is self.link):
                link.reclaim_lease()
        counts = self.front_door.counts()
        counts["answered_staged"] = sum(counts["hits_by_slot"].values())
        counts["read_ahead"] = lane
        counts["in_flight"] = self.front_door.inflight()
        if self.peer_link is not None:  # the hinted orders' other nodes' files, fetched ahead
            counts["peer_ahead"] = self.peer_link.ahead_stats()
            counts["peer_owners"] = self.peer_link.owners.stats()
        return counts

    def stop(self) -> None:
        if self.peer_link is not None:
            self.peer_link.stop()
        self.front_door.stop()  # no-op after the server's; joins the door's threads, copies and all
