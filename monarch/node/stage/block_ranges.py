"""A cluster's large file by blocks: the blocks of other nodes' ranges fetched from their
owners, and the blocks of this node's ranges served to the others (``BlockStager``'s part).

Each 16 MiB range of a large file has an owner (``monarch/cluster/ranges.py``; the nodes as
sources: ``node/peer/block_peers.py``). Every node stages the file by blocks
(``blocks.py``): its own ranges first, from the PFS, then the others' blocks from their
owners, several consecutive blocks of one owner in a request. The owner's C data path answers a
request whose blocks it has all staged (``cluster/datapath_offers.c``: each block copy is offered
to it, its map read there), with no Python on either side; it hands any other back to Python's
protocol, where the owner reads the blocks it has not staged from the PFS on the asking peer's
serving thread, so each block is read from the PFS once for the cluster and a request never
waits on a read-ahead worker (which may itself wait on a peer). A block its owner cannot send is
read from the PFS (fail open).
"""

from __future__ import annotations

import logging
import mmap
import time
from typing import Protocol

from monarch.errors import PeerError
from monarch.node.stage.block_map import (BLOCK, BLOCK_ABSENT, BLOCK_FILLING, BLOCK_LENT, BLOCK_SHIFT,
                                          BLOCK_STAGED, BLOCK_WANTED, BlockFile)

log = logging.getLogger(__name__)

__all__ = ["PEER_RUN", "RangePeers", "RangeBlocks"]

PEER_RUN = 8  # blocks fetched from their owner in one request, at most (8 MiB: a round trip's cost spread)


class RangePeers(Protocol):
    """A cluster's nodes as the sources of a large file's ranges (``node/peer/block_peers.py``)."""

    node: int

    def owner(self, key: str, size: int, block: int) -> int:
        """The node that reads ``block``'s range from the PFS now (-1: none alive)."""

    def own_blocks(self, key: str, size: int) -> list[int]:
        """The blocks of the ranges this node owns first, ascending."""

    def fetch(self, owner: int, key: str, offset: int, length: int, fd: int, version: tuple[int, int]) -> int:
        """Those bytes of ``key`` (of ``version``: size, mtime_ns) from ``owner``'s staged blocks,
        written into ``fd`` at ``offset`` (PeerError when it cannot)."""

    def offer(self, key: str, slot: int) -> None:
        """``key`` is staged by blocks in tier ``slot`` here (-1: no longer): the peers' requests
        for its staged blocks may be answered without this stager (the C data path)."""

    def served_elsewhere(self) -> int:
        """Bytes of this node's staged blocks the peers were sent without this stager."""


class RangeBlocks:
    """``BlockStager``'s blocks from and to the other nodes (its ``peers``: None alone). A part
    of ``blocks.BlockStager``: its methods use the stager's books, workers and blocks."""

    peers: RangePeers | None = None

    def use_peers(self, peers: RangePeers) -> None:
        """From now on (before any file is attached) each large file's blocks are this node's
        own ranges (read from the PFS first) and other owners' (fetched from them)."""
        self.peers = peers

    def _join_ranges_locked(self, bf: BlockFile) -> None:
        """``bf`` is a cluster's: its own ranges first, each block's owner in its map (a shim's guarded
        fault asks it for its pages), and its staged blocks offered to the peers."""
        peers, key, size = self.peers, bf.key, bf.info.size
        bf.own_blocks(peers.own_blocks(key, size), [peers.owner(key, size, b) for b in range(bf.blocks)], peers.node)
        if not bf.borrowed:
            self.peers.offer(bf.key, bf.tier.slot)

    def reown(self) -> None:
        """A node was lost: each cluster file's owners in its map anew (a shim's faults ask the
        survivors that own their ranges now)."""
        if self.peers is None:
            return
        peers = self.peers
        with self.books.lock:
            for bf in self.files.values():
                if bf.own is not None and not bf.borrowed:
                    bf.write_owners([peers.owner(bf.key, bf.info.size, b) for b in range(bf.blocks)], peers.node)

    def _peer_stats_locked(self) -> dict:
        """The report's figures of the blocks to and from the other nodes."""
        return {"blocks_from_peers": self.from_peers["blocks"], "bytes_from_peers": self.from_peers["bytes"],
                "blocks_peer_failed": self.peer_failures,
                "blocks_left_window": sum(bf.evicted for bf in self.files.values()),
                "bytes_served": self.served["bytes"] + self.peers.served_elsewhere()}

    def _leave_ranges(self, bf: BlockFile) -> None:
        """``bf``'s files go: no longer offered."""
        if self.peers is not None and bf.own is not None and not bf.borrowed:
            self.peers.offer(bf.key, -1)

    def _lends_locked(self, bf: BlockFile, b: int) -> bool:
        """Is block ``b`` of ``bf``, once staged, lent (it may leave the window)? Not a block of a
        range this node owns, first or since its owner was lost: the others fetch it from here."""
        return bf.lends(b) and self.peers.owner(bf.key, bf.info.size, b) != self.peers.node

    def _peer_run_locked(self, bf: BlockFile, b: int) -> tuple[int, list[int]]:
        """Who sends block ``b`` (-1: the PFS, read here) and the blocks fetched with it in one
        request: the next ones of the same owner not staged nor under way, up to ``PEER_RUN``
        (each request costs a round trip through both daemons' Python, the bytes little)."""
        peers = self.peers
        owner = peers.owner(bf.key, bf.info.size, b) if peers is not None else -1
        if owner < 0 or owner == peers.node:
            return -1, [b]
        run = [b]
        states = bf.states
        while len(run) < PEER_RUN and (x := run[-1] + 1) < bf.blocks and x not in bf.in_flight \
                and states[x] in (BLOCK_ABSENT, BLOCK_WANTED) and peers.owner(bf.key, bf.info.size, x) == owner \
                and bf.room_for_wanted(x):
            states[x] = BLOCK_FILLING
            bf.take(x)
            run.append(x)
        return owner, run

    def _fetch_run(self, bf: BlockFile, run: list[int], owner: int, buf: mmap.mmap) -> list[tuple[int, bool]]:
        """Blocks ``run`` (consecutive) of ``bf`` from node ``owner``, into the copy; each from
        the PFS if the owner cannot send them (fail open). Each block and whether it is staged."""
        offset = run[0] * BLOCK
        length = sum(bf.length(x) for x in run)
        try:
            n = self.peers.fetch(owner, bf.key, offset, length, bf.copy_fd, (bf.info.size, bf.info.mtime_ns))
        except PeerError as e:
            log.debug("blocks %d-%d of %s from node %d: %s; read from the PFS", run[0], run[-1], bf.key, owner, e)
            with self.books.lock:
                self.peer_failures += len(run)
            return [(x, self._read_block(bf, x, buf)) for x in run]
        with self.books.lock:
            self.books.bytes_read["peer"] += n
            self.from_peers["blocks"] += len(run)
            self.from_peers["bytes"] += n
        return [(x, True) for x in run]

    def serve_range(self, key: str, offset: int, length: int, timeout: float) -> str | None:
        """A peer asks for bytes [offset, offset + length) of ``key`` (blocks of a range this
        node owns): the path of the copy once they are staged, None if they cannot be (no
        room, the file changed, ``timeout`` passed). Blocks not under way are read from the PFS
        here, on the asking peer's serving thread: never queued behind this node's own
        read-ahead, whose workers may themselves wait on peers."""
        info = self.books.snapshot.files.get(key)
        if info is None or offset < 0 or length <= 0 or offset + length > info.size:
            return None
        bf = self.attach(key, asked=False)
        if bf is None or bf.borrowed:
            return None
        first, last = offset >> BLOCK_SHIFT, (offset + length - 1) >> BLOCK_SHIFT
        deadline = time.monotonic() + timeout
        buf = None
        with self.books.lock:
            while True:
                if bf.dropped or bf.states is None or self.closed:
                    return None
                states = bf.states
                for b in range(first, last + 1):
                    if states[b] == BLOCK_LENT:  # a lost owner's block, in this node's range now: pinned
                        states[b] = BLOCK_STAGED  # (it can no longer leave the window while it is sent)
                missing = [b for b in range(first, last + 1) if states[b] != BLOCK_STAGED]
                if not missing:
                    self.served["bytes"] += length
                    return bf.path
                free = [b for b in missing if states[b] in (BLOCK_ABSENT, BLOCK_WANTED) and b not in bf.in_flight]
                if free:
                    b = free[0]
                    if bf.done or not bf.may_take(b, True):
                        return None
                    states[b] = BLOCK_FILLING
                    bf.take(b)
                    self._running += 1
                    buf = buf or mmap.mmap(-1, BLOCK)
                    self.books.lock.release()
                    ok = False
                    try:
                        ok = self._read_block(bf, b, buf)
                    finally:
                        self.books.lock.acquire()
                        self._ended_locked(bf, b, ok)
                    if not ok:
                        return None
                    continue
                left = deadline - time.monotonic()  # the rest is under way (a worker, a shim's fill)
                if left <= 0:
                    return None
                self._cv.wait(min(left, 0.05))  # (a shim's fill ends with no notice)
