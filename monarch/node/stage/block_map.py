"""A large file's copy by blocks and its map, as files: their format (the shim reads them too),
one file being staged (``BlockFile``: its copy, its map, which block to read next), what another
job finds of them in a shared set, and publishing a copy over another.

``<tier>/.blocks/<key>`` is the copy (the source's size, blocks filled in any order);
``<tier>/.blockmap/<key>`` its map: ``BLOCKMAP_HEADER``, a state byte per block, then (from
``owners_at``) each block's owner in a cluster, for the shim to ask for its pages. The job
staging a copy holds an ``flock`` on it (``blocks.BlockFile.create``) until it lets go of it,
so another job tells a copy being staged from one whose job is gone.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import fcntl
import logging
import mmap
import os
import stat
import struct
import threading

from monarch.node.snapshot.snapshot import FileInfo
from monarch.node.tiers.tiers import (BLOCKMAP_DIR, BLOCKMAP_MAGIC, BLOCKMAP_ROOM_OFFSET, BLOCKMAP_VERSION,  # noqa: F401
                                      BLOCKS_DIR, TMP_PREFIX, Tier, make_dirs_below)  # (the format: block_map.X too)
from monarch.secure import create_exclusive, owner_only, write_file_atomically

log = logging.getLogger(__name__)

__all__ = ["BLOCK", "BLOCK_SHIFT", "BLOCKMAP_HEADER", "BlockFile", "copy_state", "link_over", "staged_bytes"]

# The copy and its map, as the shim reads them (monarch/wire/monarch_wire.h: MONARCH_BLOCK*,
# struct monarch_blockmap_header; tests/unit/test_wire.py holds the two together).
# BLOCKS_DIR, BLOCKMAP_DIR (node/tiers/tiers.py): the copy, the source's size, blocks in any order;
# its map: BLOCKMAP_HEADER, then a state byte per block, padded to 8, then an int16 per block: its owner
# (a cluster's; -1: none to ask, this node's own or alone)
# magic, version, block_shift, size, mtime_ns, blocks, done, readaround, fill, wait_us, window, evictions, records,
# pfs_reads, mapped, room (BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCKMAP_ROOM_OFFSET: tiers.py's, for the ledger)
BLOCKMAP_HEADER = struct.Struct("<QIIQqQQQQQQQQQQQ")
BLOCKMAP_DONE_OFFSET = 40  # "done": nonzero once the daemon stages no more of the file
BLOCKMAP_READAROUND_OFFSET = 48  # "readaround": nonzero once the PFS's round trip is long (ReadPace.readaround)
BLOCKMAP_FILL_OFFSET = 56  # "fill": nonzero while a shim's large read may fill blocks (the file has room whole)
BLOCKMAP_WAIT_OFFSET = 64  # "wait_us" (a cluster's): a shim's large read waits this long for blocks from their owners
BLOCKMAP_WINDOW_OFFSET = 72  # "window" (a cluster's file larger than the room): other owners' blocks are LENT
BLOCKMAP_EVICTIONS_OFFSET = 80  # "evictions": LENT blocks that left, raised after the state, before the bytes go
BLOCKMAP_RECORDS_OFFSET = 88  # "records" (a shim's find): RECORDS_YES, a mapping's reader reads records of several
RECORDS_YES = 1  # pages at random; RECORDS_NO, pages or in order; 0: none yet
RECORDS_NO = 2
BLOCKMAP_PFS_READS_OFFSET = 96  # "pfs_reads": raised by a shim at each of the application's reads of the PFS's file
BLOCKMAP_MAPPED_OFFSET = 104  # "mapped": nonzero once a shim saw the PFS's file mapped (its faults read it unseen)
# BLOCKMAP_ROOM_OFFSET (112): "room", the bytes of a shared set's ledger the copy holds (the job's that took them; a
# gone job's are given back by the job that takes the copy up or removes it, and a recount of the set counts them)
PEER_WAIT_US = 1_000_000   # ... at most: an owner reads a run of blocks from the PFS first if need be (8 MiB: 20 ms at
# 400 MB/s, 160 ms at 50 MB/s; more when the link is shared): a read that waits longer reads the PFS
BLOCK_ABSENT = 0
BLOCK_WANTED = 1  # the shim read it from the PFS: staged next
BLOCK_STAGED = 2  # every byte in the copy: the shim reads it there
BLOCK_FILLING = 3  # being read into the copy: by this daemon, or by a shim from an application's large read
BLOCK_PLANNED = 4  # larger than the room: room held for it, read ahead next, or filled by a shim's read in order
BLOCK_PASSED = 5  # larger than the room: a shim's read in order read it from the PFS, unplanned (staged last)
BLOCK_LENT = 6  # a cluster's file larger than the room: another owner's block, here until the window needs its room
WINDOW_AHEAD = 16  # blocks wanted past a window's reader going in order (as the shim's guards want)
WINDOW_MIN = 2 * WINDOW_AHEAD  # blocks of room beside a node's own ranges for a window: the blocks ahead and
# those under way (a run is 8) with room to spare
OWNER_NONE = -1


def owners_at(blocks: int) -> int:
    """Where a map's owners start: after its header and state bytes, padded to 8 (MONARCH_BLOCKMAP_OWNERS_AT)."""
    return BLOCKMAP_HEADER.size + (blocks + 7) // 8 * 8


def map_size(blocks: int) -> int:
    return owners_at(blocks) + 2 * blocks


FILL_STALE = 10.0  # seconds a shim's fill may make no progress before its blocks are staged here instead

BLOCK_SHIFT = 20  # 1 MiB blocks: a block cache's usual page (Alluxio, mountpoint-s3); a mapping moves in these
BLOCK = 1 << BLOCK_SHIFT


class BlockFile:
    """One file being staged by blocks into ``tier``: its copy, its map (mapped here, shared
    with the shim), the blocks it has room for (``budget``) and which are under way."""

    def __init__(self, key: str, info: FileInfo, tier: Tier, budget: int, reserved: int):
        self.key, self.info, self.tier = key, info, tier
        self.blocks = -(-info.size // BLOCK)
        self.budget = budget        # blocks it has room for (all of them: the file fits)
        self.reserved = reserved    # room taken in the tier for them
        self.path = os.path.join(tier.path, BLOCKS_DIR, key)
        self.map_path = os.path.join(tier.path, BLOCKMAP_DIR, key)
        self.copy_fd = -1
        self.states: memoryview | None = None  # one byte per block, in the shared map
        self.owners: memoryview | None = None  # one int16 per block, after them (a cluster's)
        self._map: mmap.mmap | None = None
        self.taken = 0              # blocks staged or under way
        self.promised = 0           # larger than the room: blocks PLANNED (room held for them, ``plan``), and
        # those a shim took from the plan to fill (its room stays theirs); the read-ahead's own picks leave it
        self._passed_at = -1        # the last PASSED block the plan started after
        self._wanted_at = 0         # where the next look for a WANTED block starts
        self.staged = 0
        self.staged_bytes = 0
        self.in_flight: set[int] = set()
        self.ahead = 0              # where read-ahead looks next
        self.filled = 0             # blocks a shim staged from the application's large reads (``recount``)
        self._fills: tuple[int, float] | None = None  # others' FILLING blocks and since when (``recount``)
        self.asked = False          # opened by the application (its blocks go before read-ahead's)
        self.done = False           # nothing more will be staged (whole, out of budget, failed, dropped)
        self.whole = False          # every block staged and published as a plain copy
        self.dropped = False        # the job wrote to it: its files go once no block is under way
        self._pfs_reads = (0, float("-inf"))  # the map's pfs_reads as last seen, and when it moved
        self.stopped = False        # done because the stager stopped: blocks under way still end STAGED
        self.borrowed = False       # another job of the user stages it in a shared tier: served, not staged
        self.direct = False         # its source is read with O_DIRECT (past the client's page cache)
        self.source_fd = -1
        # in a cluster: this node's own blocks (those of the ranges it owns first: read ahead
        # first, from the PFS) and how many it may take of the others' (the room beside its own)
        self.own: list[int] | None = None   # None: every block is this node's (alone)
        self._own_at = 0                    # where the read-ahead looks next among them
        self.others_room = 0                # blocks of other owners it may take
        self.others_taken = 0
        # larger than the room (``window``): the others' blocks are lent (LENT), and the oldest of
        # them leaves when a block a reader in order wants has no room (``evict``)
        self.window = False
        self.lent: collections.deque[int] = collections.deque()  # LENT blocks, the oldest first
        self.evicted = 0
        self._last_wanted, self._in_order = -2, 0  # the window's last wanted block, wants in order in a row

    def own_blocks(self, own: list[int], owners: list[int] | None = None, node: int = -1) -> None:
        """This node (``node``) owns ``own`` (ascending): they go first and always have room; the
        others take the room left (``budget`` beyond them). ``owners``: each block's owner now."""
        self.own = own
        if owners is not None:
            self.write_owners(owners, node)
        self.others_room = max(0, self.budget - len(own)) if self.budget < self.blocks else self.blocks
        # a window only where it holds a reader's blocks ahead (the shim's and a run's) with room to spare
        self.window = self.budget < self.blocks and self.others_room >= WINDOW_MIN
        if self._map is not None:  # the shim: no fill (only a range's owner reads it from the PFS); a large
            # read of blocks not staged waits for them a moment (they come from their owners)
            self._map[BLOCKMAP_FILL_OFFSET:BLOCKMAP_FILL_OFFSET + 8] = bytes(8)
            self._map[BLOCKMAP_WAIT_OFFSET:BLOCKMAP_WAIT_OFFSET + 8] = PEER_WAIT_US.to_bytes(8, "little")
            self._map[BLOCKMAP_WINDOW_OFFSET:BLOCKMAP_WINDOW_OFFSET + 8] = int(self.window).to_bytes(8, "little")

    def write_owners(self, owners: list[int], node: int) -> None:
        """Each block's owner (``owners``) into the map, for a shim's fault to ask it for pages
        (-1 for this node's own: their faults wait for them here)."""
        if self.owners is not None:
            for b, owner in enumerate(owners[:self.blocks]):
                self.owners[b] = OWNER_NONE if owner < 0 or owner == node else owner

    def take(self, b: int) -> None:
        """Block ``b`` is under way (the caller holds the stager's lock)."""
        self.in_flight.add(b)
        self.taken += 1
        if self.own is not None and not self.is_own(b):
            self.others_taken += 1

    def untake(self, b: int) -> None:
        """Block ``b`` was not staged after all: its room is free again."""
        self.taken -= 1
        if self.own is not None and not self.is_own(b):
            self.others_taken -= 1

    def may_take(self, b: int, mine: bool) -> bool:
        """Is there room for block ``b`` (``mine``: this node's own)?"""
        if self.own is None or mine:
            return self.taken < self.budget
        return self.others_taken < self.others_room and self.taken < self.budget

    def room_for_wanted(self, b: int) -> bool:
        """Room for another owner's block ``b`` that a reader wants: in a window, the oldest
        LENT block leaves for it if need be (the caller holds the stager's lock)."""
        if self.may_take(b, False):
            return True
        return self.window and self.states[b] == BLOCK_WANTED and self.evict() and self.may_take(b, False)

    def lends(self, b: int) -> bool:
        """Is block ``b``, once staged, lent (it may leave) rather than pinned?"""
        return self.window and not self.is_own(b)

    def evict(self) -> bool:
        """The oldest LENT block leaves (False: none may): its state first (ABSENT), then the
        map's evictions raised, then its bytes dropped, so that a shim reading it sees the
        evictions change and reads the PFS instead (``MONARCH_BLOCK_LENT``). Under the stager's lock."""
        while self.lent:
            b = self.lent.popleft()
            if self.states[b] != BLOCK_LENT or b in self.in_flight:
                continue
            self.states[b] = BLOCK_ABSENT
            at = BLOCKMAP_EVICTIONS_OFFSET
            n = int.from_bytes(self._map[at:at + 8], "little") + 1
            self._map[at:at + 8] = n.to_bytes(8, "little")
            _punch(self.copy_fd, b * BLOCK, self.length(b))
            self.untake(b)
            self.staged -= 1
            self.staged_bytes -= self.length(b)
            self.evicted += 1
            return True
        return False

    def length(self, b: int) -> int:
        """Block ``b``'s bytes (the last one may be short)."""
        return min(BLOCK, self.info.size - b * BLOCK)

    def create(self) -> None:
        """The empty copy and its map (every block ABSENT), mapped here."""
        for path in (self.path, self.map_path):
            make_dirs_below(self.tier.path, os.path.dirname(path))
        fd = create_exclusive(self.path, owner_only(self.info.mode))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while this job may stage it (close)
            os.ftruncate(fd, self.info.size)
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        self.copy_fd = fd
        header = BLOCKMAP_HEADER.pack(BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCK_SHIFT, self.info.size,
                                      self.info.mtime_ns, self.blocks, 0, 0, int(self.budget >= self.blocks),
                                      0, 0, 0, 0, 0, 0, self.reserved)
        pad = owners_at(self.blocks) - BLOCKMAP_HEADER.size - self.blocks
        write_file_atomically(self.map_path, [header, bytes(self.blocks + pad), b"\xff\xff" * self.blocks], 0o600)
        mfd = os.open(self.map_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(mfd, map_size(self.blocks))
        finally:
            os.close(mfd)
        self.states = memoryview(self._map)[BLOCKMAP_HEADER.size:BLOCKMAP_HEADER.size + self.blocks]
        self.owners = memoryview(self._map)[owners_at(self.blocks):].cast("h")

    def resume(self) -> int | None:
        """Take up the copy and map a gone job left unfinished in a shared set (the key's claim
        held, no job staging it): locked as ``create`` locks a new one, its STAGED blocks kept,
        every other block ABSENT (what was under way, wanted or planned was that job's), the
        header's findings of that job's readers cleared. Returns how many blocks it holds staged;
        None if they are not this file's (its size, its mtime) or another job took them meanwhile."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.fstat(fd)
            mfd = os.open(self.map_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(st.st_mode) or st.st_size != self.info.size \
                        or os.fstat(mfd).st_size != map_size(self.blocks):
                    raise ValueError("not this file's copy")
                m = mmap.mmap(mfd, map_size(self.blocks))
            finally:
                os.close(mfd)
            magic, version, shift, size, mtime_ns, blocks, *_ = BLOCKMAP_HEADER.unpack_from(m)
            if (magic, version, shift, size, mtime_ns, blocks) != (BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCK_SHIFT,
                                                                   self.info.size, self.info.mtime_ns, self.blocks):
                m.close()
                raise ValueError("not this file's map")
        except (OSError, ValueError):
            os.close(fd)
            return None
        self.copy_fd, self._map = fd, m
        for at in (BLOCKMAP_DONE_OFFSET, BLOCKMAP_READAROUND_OFFSET, BLOCKMAP_WAIT_OFFSET, BLOCKMAP_WINDOW_OFFSET,
                   BLOCKMAP_RECORDS_OFFSET, BLOCKMAP_PFS_READS_OFFSET, BLOCKMAP_MAPPED_OFFSET):
            m[at:at + 8] = bytes(8)
        m[BLOCKMAP_FILL_OFFSET:BLOCKMAP_FILL_OFFSET + 8] = int(self.budget >= self.blocks).to_bytes(8, "little")
        m[BLOCKMAP_ROOM_OFFSET:BLOCKMAP_ROOM_OFFSET + 8] = self.reserved.to_bytes(8, "little")
        self.states = memoryview(m)[BLOCKMAP_HEADER.size:BLOCKMAP_HEADER.size + self.blocks]
        self.owners = memoryview(m)[owners_at(self.blocks):].cast("h")
        self.owners[:] = memoryview(b"\xff\xff" * self.blocks).cast("h")
        kept = bytes(self.states)
        self.states[:] = bytes(BLOCK_STAGED if s == BLOCK_STAGED else BLOCK_ABSENT for s in kept)
        self.staged = self.taken = kept.count(BLOCK_STAGED)
        short = BLOCK * self.blocks - self.info.size
        self.staged_bytes = self.staged * BLOCK - (short if kept[-1] == BLOCK_STAGED else 0)
        return self.staged

    def next_block(self, demand_only: bool) -> int | None:
        """The next block to read, marked FILLING (caller holds the stager's lock): one the shim
        WANTED, then (unless ``demand_only``) read-ahead's; None if none (or no room left for
        one). Read-ahead starts past the last block a shim is filling: a reader of large calls
        reads its next blocks itself, so the read-ahead goes ahead of it, not behind. A file
        larger than its room, once a reader goes through it in order: its PLANNED blocks
        (``plan``), then the blocks the reader PASSED, last."""
        b = self._next_block(demand_only)
        if b is not None:
            if self.states[b] == BLOCK_PLANNED:
                self.promised -= 1  # the read-ahead's own now (``take``)
            self.states[b] = BLOCK_FILLING  # (a shim's compare-and-swap from ABSENT fails from now on)
        return b

    def _want_ahead(self, b: int) -> None:
        """A window's wanted block ``b``: once a reader's wants go in order (the block after the
        last one wanted, twice in a row), the ``WINDOW_AHEAD`` blocks after it are wanted too, so
        they come before the reader gets there. A random reader's wants bring nothing more (a
        block each at most: the window's room is for what is read)."""
        self._in_order = self._in_order + 1 if b == self._last_wanted + 1 else 0
        self._last_wanted = b
        if self._in_order >= 2:
            for x in range(b + 1, min(b + 1 + WINDOW_AHEAD, self.blocks)):
                if self.states[x] == BLOCK_ABSENT:
                    self.states[x] = BLOCK_WANTED

    def planning(self) -> bool:
        """Is the room of this file planned in its reader's order (larger than its room, alone)?"""
        return self.own is None and self.budget < self.blocks

    def plan(self) -> None:
        """A file larger than its room read in order (the shim PASSED blocks it read from the PFS):
        the room left is held for the blocks after the reader's furthest, in order (PLANNED), so
        that the reader's reads fill those it reaches before the read-ahead, and no room is left
        for a block the reader has read (it would be read from the PFS twice in a one-pass job).
        The caller holds the stager's lock."""
        states = self._map
        start = BLOCKMAP_HEADER.size
        free = self.budget - self.taken - self.promised
        passed = states.rfind(bytes((BLOCK_PASSED,)), start, start + self.blocks) - start
        if free <= 0 or passed < 0 or passed == self._passed_at:
            return
        self._passed_at = passed
        for b in range(passed + 1, self.blocks):
            if free <= 0:
                break
            if self.states[b] in (BLOCK_ABSENT, BLOCK_WANTED) and b not in self.in_flight:
                self.states[b] = BLOCK_PLANNED
                self.promised += 1
                free -= 1

    def settled(self) -> bool:
        """Nothing of the plan left to read (no block PLANNED, none a shim is filling)."""
        if self.states is None:
            return True
        states = self._map
        start = BLOCKMAP_HEADER.size
        end = start + self.blocks
        return (states.find(bytes((BLOCK_PLANNED,)), start, end) < 0
                and states[start:end].count(BLOCK_FILLING) <= len(self.in_flight))

    def room_full(self) -> bool:
        """No room left for a block not yet held (``taken`` and ``promised`` are the room's)."""
        return self.taken + self.promised >= self.budget

    def _next_block(self, demand_only: bool) -> int | None:
        if self.done or self.states is None:
            return None
        planning = self.planning()
        if self.room_full() and not (planning and self.promised) and not self.window:
            return None  # (a window's room is full from its first blocks on: wanted ones take the oldest's)
        states = self._map  # searched in C (mmap.find), a byte per block
        start = BLOCKMAP_HEADER.size
        # the wanted blocks in turn, from the one after the last taken (then from the file's start):
        # a random reader's block waits for one turn over the others wanted, not for every wanted
        # block before it in the file (a reader in order wants a run ahead of it)
        for first, last in ((self._wanted_at, self.blocks), (0, self._wanted_at)):
            if self.room_full() and not self.window:
                break
            at = states.find(b"\x01", start + first, start + last)
            while at >= 0:
                b = at - start
                mine = self.is_own(b)
                if b not in self.in_flight and (self.own is None or self.may_take(b, mine)
                                                or (not mine and self.room_for_wanted(b))):
                    self.ahead = max(self.ahead, b + 1) if b + 1 < self.blocks else self.ahead
                    self._wanted_at = b + 1
                    if self.window:
                        self._want_ahead(b)
                    return b
                at = states.find(b"\x01", at + 1, start + last)
        if demand_only:
            return None
        if planning:  # the plan first, ahead of the reader, then the room not planned
            self.plan()
            filling = states.rfind(bytes((BLOCK_FILLING,)), start, start + self.blocks) - start  # a shim's read of the plan
            if filling >= 0 and filling not in self.in_flight and filling + 1 < self.blocks:
                self.ahead = max(self.ahead, filling + 1)
            for first, last in ((self.ahead, self.blocks), (0, self.ahead)):
                at = states.find(bytes((BLOCK_PLANNED,)), start + first, start + last)
                while at >= 0:
                    b = at - start
                    if b not in self.in_flight:
                        self.ahead = b + 1
                        return b
                    at = states.find(bytes((BLOCK_PLANNED,)), at + 1, start + last)
            if self.room_full():
                return None
        if self.own is not None:  # a cluster's: this node's own ranges first, from the PFS
            own = self.own
            while self._own_at < len(own):
                b = own[self._own_at]
                if self.states[b] == BLOCK_ABSENT and b not in self.in_flight:
                    return b
                self._own_at += 1
            if self.others_taken >= self.others_room:
                return None
        filling = states.rfind(bytes((BLOCK_FILLING,)), start, start + self.blocks) - start
        if filling >= 0 and filling not in self.in_flight and filling + 1 < self.blocks:
            self.ahead = max(self.ahead, filling + 1)
        for first, last in ((self.ahead, self.blocks), (0, self.ahead)):
            at = states.find(b"\x00", start + first, start + last)
            while at >= 0:
                b = at - start
                if b not in self.in_flight:
                    self.ahead = b + 1
                    return b
                at = states.find(b"\x00", at + 1, start + last)
        if planning:  # the blocks a reader passed in order: its pass is over, the room keeps them (pin)
            at = states.find(bytes((BLOCK_PASSED,)), start, start + self.blocks)
            while at >= 0:
                if at - start not in self.in_flight:
                    return at - start
                at = states.find(bytes((BLOCK_PASSED,)), at + 1, start + self.blocks)
        return None

    def is_own(self, b: int) -> bool:
        """Is block ``b`` of a range this node owns (alone: every block is)?"""
        if self.own is None:
            return True
        i = bisect.bisect_left(self.own, b)
        return i < len(self.own) and self.own[i] == b

    def recount(self, now: float) -> None:
        """The blocks a shim filled, counted as staged (caller holds the stager's lock). Blocks a
        shim claimed and made no progress on for ``FILL_STALE`` s (its process gone) go back to
        ABSENT: this daemon stages them (the same bytes, should the shim still write them)."""
        if self.states is None:
            return
        states = bytes(self.states)
        staged = states.count(BLOCK_STAGED)
        self.filled += staged - self.staged
        if staged != self.staged:
            self.staged = staged
            short = BLOCK * self.blocks - self.info.size
            self.staged_bytes = staged * BLOCK - (short if states[-1] == BLOCK_STAGED else 0)
        others = states.count(BLOCK_FILLING) - len(self.in_flight)
        if others <= 0:
            self._fills = None
        elif self._fills is None or self._fills[0] != staged:
            self._fills = (staged, now)
        elif now - self._fills[1] > FILL_STALE:
            back = BLOCK_PLANNED if self.planning() else BLOCK_ABSENT  # (a shim fills only planned blocks there)
            for b, s in enumerate(states):
                if s == BLOCK_FILLING and b not in self.in_flight:
                    self.states[b] = back
            self._fills = None

    def finish(self) -> None:
        """Nothing more of this file will be staged: said in the map too, so that the shim
        stops waiting to move its mappings' other blocks."""
        self.done = True
        if self._map is not None:  # no new fill (one under way ends STAGED or not at all: its CAS)
            self._map[BLOCKMAP_FILL_OFFSET:BLOCKMAP_FILL_OFFSET + 8] = bytes(8)
            self._map[BLOCKMAP_DONE_OFFSET:BLOCKMAP_DONE_OFFSET + 8] = (1).to_bytes(8, "little")

    def read_around(self) -> None:
        """Say in the map that a fault of a mapping of the PFS's file should read around
        (the shim lets the kernel's read-around be: a round trip costs more than its bytes)."""
        if self._map is not None:
            self._map[BLOCKMAP_READAROUND_OFFSET:BLOCKMAP_READAROUND_OFFSET + 8] = (1).to_bytes(8, "little")

    @property
    def records(self) -> bool:
        """A shim found a mapping's reader reading records of several pages at random (the map's
        ``records``): its faults read around, and the read-ahead yields the link to them."""
        m = self._map
        return (m is not None and not self.done
                and int.from_bytes(m[BLOCKMAP_RECORDS_OFFSET:BLOCKMAP_RECORDS_OFFSET + 8], "little") == RECORDS_YES)

    def read_on_pfs(self, now: float, quiet: float) -> bool:
        """Does the application read the PFS's file itself: mapped (its faults read it unseen),
        or a shim's read of it within the last ``quiet`` seconds (the map's ``pfs_reads`` moved)?"""
        m = self._map
        if m is None or self.done:
            return False
        if int.from_bytes(m[BLOCKMAP_MAPPED_OFFSET:BLOCKMAP_MAPPED_OFFSET + 8], "little"):
            return True
        reads = int.from_bytes(m[BLOCKMAP_PFS_READS_OFFSET:BLOCKMAP_PFS_READS_OFFSET + 8], "little")
        if reads != self._pfs_reads[0]:
            self._pfs_reads = (reads, now)
        return now - self._pfs_reads[1] < quiet

    def close(self) -> None:
        for fd in (self.copy_fd, self.source_fd):
            if fd >= 0:
                os.close(fd)
        self.copy_fd = self.source_fd = -1
        for view in (self.states, self.owners):
            if view is not None:
                view.release()
        self.states = self.owners = None
        if self._map is not None:
            self._map.close()
            self._map = None


_fallocate = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                              use_errno=True)(("fallocate", ctypes.CDLL(None, use_errno=True)))
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (linux/falloc.h)


def _punch(fd: int, offset: int, length: int) -> None:
    """The bytes [offset, offset + length) of ``fd`` dropped, their room given back (the size
    kept). Where the filesystem cannot, they stay: the tier holds more than its books say."""
    if _fallocate(fd, _PUNCH_HOLE, offset, length) != 0:
        e = ctypes.get_errno()
        log.warning("dropping a block that left the window failed (%s): its bytes stay", os.strerror(e))


def link_over(src: str, dest: str) -> os.stat_result | None:
    """``src`` linked at ``dest`` in place of any other file there (atomically: a reader finds
    one or the other); the stat of the file it replaced, None if none (or ``src`` itself)."""
    try:
        os.link(src, dest)
        return None
    except FileExistsError:
        pass
    old = os.lstat(dest)
    if os.path.samestat(old, os.lstat(src)):
        return None
    # a temporary's name, which a set's sweep removes should this process die before the rename
    tmp = os.path.join(os.path.dirname(dest), f"{TMP_PREFIX}link-{os.getpid()}-{threading.get_ident()}")
    os.link(src, tmp)
    try:
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return old if stat.S_ISREG(old.st_mode) else None


def copy_state(copy: str, bmap: str, info: FileInfo) -> tuple[str | None, bool, bool]:
    """A shared set's block copy of a file: (None: none; "same": of the file ``info``
    describes; "other": of another version; "broken": its map unreadable), whether every
    block is staged, whether a live job holds it to stage it."""
    try:
        fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, False, False
    except OSError:
        return "broken", False, False
    try:
        live = not _try_lock(fd)
    finally:
        os.close(fd)
    try:
        with open(bmap, "rb") as f:
            magic, version, shift, size, mtime_ns, blocks, *_ = BLOCKMAP_HEADER.unpack(f.read(BLOCKMAP_HEADER.size))
            states = f.read(blocks)
    except (OSError, struct.error):
        return "broken", False, live
    if (magic, version, shift) != (BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCK_SHIFT):
        return "broken", False, live
    complete = len(states) == blocks and states.count(BLOCK_STAGED) == blocks
    return "same" if (size, mtime_ns) == (info.size, info.mtime_ns) else "other", complete, live


def staged_bytes(bmap: str, info: FileInfo) -> int:
    """The bytes of the staged blocks a map says, if it is the map of the file ``info`` describes."""
    try:
        with open(bmap, "rb") as f:
            magic, version, shift, size, mtime_ns, blocks, *_ = BLOCKMAP_HEADER.unpack(f.read(BLOCKMAP_HEADER.size))
            states = f.read(blocks)
    except (OSError, struct.error):
        return 0
    if (magic, version, shift, size, mtime_ns) != (BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCK_SHIFT, info.size,
                                                   info.mtime_ns) or len(states) != blocks:
        return 0
    n = states.count(BLOCK_STAGED)
    short = BLOCK * blocks - size  # the last block's missing tail
    return n * BLOCK - (short if blocks and states[-1] == BLOCK_STAGED else 0)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
