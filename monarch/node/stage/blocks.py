"""Large files staged by blocks: no open waits for a whole copy, and a file larger than the room is staged in part.

A file of at least ``BLOCKS_MIN`` bytes is not copied whole. Its copy in a raw tier
(``<tier>/.blocks/<key>``, the source's size) is filled block by block, ``BLOCK`` bytes
each, in the background; a map beside it (``<tier>/.blockmap/<key>``: a header, one
state byte per block, then each block's owner in a cluster: ``block_map.py``) says which blocks are in the copy. The shim
opens such a file on the PFS at once and reads its staged blocks from the copy (moving its
read-only mappings onto them too: ``shim_blocks.c``); it marks a block it had to read from
the PFS WANTED, and those go first. Then read-ahead: from the block after the last one the
reader wanted (a sequential reader), else in the file's order (a random reader).

Room is taken when a file is first asked for: the whole file's allocation in the first raw
tier that holds it, else as many blocks as the roomiest raw tier holds (the file is partly
staged, those blocks pinned like any copy). A whole file is published at the path the shim
probes (a hard link to the copy), so later opens are plain descriptors of it.

In a tier shared by the user's jobs (``shared_tier.py``) what the set holds of a file is
settled under the file's claim before a job stages it: a whole copy of this job's file is
booked; a block copy a live job stages is served as it fills (that job holds a lock on the
copy while it stages); a complete one a gone job left is published, an unfinished one is
staged on from its STAGED blocks; another version of the file, whole or by blocks, is
removed, its room given back, and the file staged anew.

Correct bytes first: a block is STAGED only once its bytes are in the copy; the source is
read only while it is the file the snapshot saw (size, mtime); each block is read from the
PFS once. How much is asked of the PFS at once is ``ReadPace``'s: a few milliseconds of the
link's measured rate, so an application's read queues behind little of the read-ahead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import stat
import threading
import time
from typing import TYPE_CHECKING

from monarch import protocol
from monarch.node.snapshot.pfsmeta import checked_stat
from monarch.node.snapshot.snapshot import FileInfo
from monarch.node.stage.block_map import (BLOCK, BLOCK_ABSENT, BLOCK_FILLING, BLOCK_LENT,  # noqa: F401 (the
                                          BLOCK_PASSED, BLOCK_PLANNED, BLOCK_SHIFT,  # map's format: blocks.X too)
                                          BLOCK_STAGED, BLOCK_WANTED, BLOCKMAP_DONE_OFFSET,
                                          BLOCKMAP_FILL_OFFSET, BLOCKMAP_HEADER, BLOCKMAP_MAGIC,
                                          BLOCKMAP_READAROUND_OFFSET, BLOCKMAP_VERSION, RECORDS_NO, RECORDS_YES,
                                          BlockFile, copy_state, link_over, staged_bytes)
from monarch.node.stage.block_ranges import RangeBlocks, RangePeers
from monarch.node.stage.read_pace import ALONE_QUIET, ReadPace
from monarch.routes import BLOCKS_MIN, Route
from monarch.node.stage.sources import PFSSource, SourceChanged
from monarch.node.tiers.shared_tier import SharedTier
from monarch.node.tiers.tiers import BLOCKMAP_DIR, BLOCKS_DIR, Tier, make_dirs_below

if TYPE_CHECKING:
    from monarch.node.stage.stager_books import StagerBooks

log = logging.getLogger(__name__)

__all__ = ["BLOCK", "BLOCKS_MIN", "BlockFile", "BlockStager"]

ANSWER_CLAIM_WAIT = 0.05  # seconds an open's answer waits for a large file's claim another job holds


class BlockStager(RangeBlocks):
    """The large files of one stager's books, staged by blocks on threads of their own: the
    blocks the shim wanted first (any file), then read-ahead, the files the application
    opened before the others. ``attach`` and ``stage`` are the stager's; the figures are the report's."""

    def __init__(self, books: "StagerBooks", pfs: PFSSource):
        self.books = books
        self.pfs = pfs
        self.files: dict[str, BlockFile] = {}
        self._active: list[BlockFile] = []  # files with blocks still to stage, in the order they came
        self.pace = ReadPace(BLOCK)  # the requests' size and how many blocks are read at once
        self._cv = threading.Condition(books.lock)  # the books' lock: room, publication and blocks agree
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._running = 0
        self.closed = False
        self.failures = 0
        self.peers: RangePeers | None = None  # a cluster's: other owners' blocks come from them
        self.from_pfs = {"blocks": 0, "bytes": 0}
        self.from_peers = {"blocks": 0, "bytes": 0}
        self.peer_failures = 0  # blocks asked of their owner and read from the PFS instead
        self.served = {"bytes": 0}  # of this node's blocks sent to peers by Python's protocol

    # -- asked by the stager and the resolver ---------------------------------------------------
    def eligible(self, key: str, info: FileInfo | None) -> bool:
        """Is ``key`` staged by blocks now (its route, ``monarch/routes.py``'s, and this stager open)?"""
        return not self.closed and self.books.route(key, info) is Route.BLOCKS

    def attach(self, key: str, asked: bool = True, wait: float | None = None) -> BlockFile | None:
        """``key``'s block file, made now with room for what fits (None: no room for a block,
        the job wrote to it, or it could not be made). ``asked``: the application opened it.
        ``wait``: the longest to wait for the key's claim in a shared tier (None: the set's)."""
        books = self.books
        with books.lock:
            bf = self.files.get(key)
            if bf is not None:
                if asked and not bf.asked:
                    bf.asked = True
                    self._cv.notify()
                return bf if bf.states is not None or bf.whole or bf.borrowed else None
            info = books.snapshot.files.get(key)
            if self.closed or books.closed or info is None or books.is_dirty(key) or key in books.staged:
                return None
        bf = self._make(key, info, wait)
        with books.lock:
            if bf is None or self.closed or books.is_dirty(key) or key in self.files:
                if bf is not None:
                    self._discard(bf)
                return self.files.get(key) if key in self.files else None
            bf.asked = asked
            if self.peers is not None and not bf.borrowed:
                self._join_ranges_locked(bf)
            self.files[key] = bf
            if self.pace.readaround:
                bf.read_around()
            self._active.append(bf)
            self._wake_locked()
        return bf

    def stage(self, key: str) -> bool:
        """The stager's copy of a large file: its blocks are staged from now on (the stager's
        thread does not wait for them). False if the file cannot be staged by blocks."""
        return self.attach(key, asked=False) is not None

    def answer(self, key: str) -> tuple[int, str] | None:
        """The shim's answer for an open of ``key``: (slot | ANSWER_BLOCKS, copy path), or None
        (then the stager's copy takes it up, waiting for the key's claim off the socket's thread)."""
        bf = self.attach(key, wait=ANSWER_CLAIM_WAIT)
        if bf is None or bf.whole:
            return None  # (a borrowed file another job published whole: the shim's probe finds it)
        return bf.tier.slot | protocol.ANSWER_BLOCKS, bf.path

    def invalidate(self, key: str) -> None:
        """The job writes to ``key`` (or a directory above it): its block files stop being
        served (every block ABSENT: the shim reads the PFS) and go."""
        prefix = key.rstrip("/") + "/"
        with self.books.lock:
            gone = [bf for k, bf in self.files.items() if k == key or k.startswith(prefix)]
            for bf in gone:
                del self.files[bf.key]
                if bf.states is not None:
                    bf.states[:] = bytes(bf.blocks)
                bf.finish()
                bf.dropped = True
                if not bf.in_flight:  # else the last block under way discards it (_ended_locked)
                    self._discard(bf)

    # -- the workers ---------------------------------------------------------------------------
    def _wake_locked(self) -> None:
        if self.closed:
            return
        if self._idle == 0 and len(self._workers) < self.pace.blocks:
            t = threading.Thread(target=self._work, name=f"monarch-block-{len(self._workers)}", daemon=True)
            self._workers.append(t)
            t.start()
        else:
            self._cv.notify()

    def _next_locked(self) -> tuple[BlockFile, int] | None:
        """The next block: one the shim wanted (only files it opened have such marks), then
        read-ahead's, the files the application opened before the others."""
        self._active = [bf for bf in self._active if not bf.done]
        asked = [bf for bf in self._active if bf.asked]
        for demand_only, files in ((True, asked), (False, asked), (False, self._active)):
            for bf in files:
                b = bf.next_block(demand_only)
                if b is not None:
                    return bf, b
        self._fills_locked()  # nothing left to read here: what shims filled may make a file whole
        return None

    def _fills_locked(self) -> None:
        """The blocks shims filled from the application's large reads, counted; a file they made
        whole is published (as the last block read here would), and one larger than its room
        whose plan they finished is done."""
        now = time.monotonic()
        for bf in self._active:
            if (bf.budget >= bf.blocks or bf.promised) and not bf.in_flight and not bf.done:
                bf.recount(now)
                if bf.staged == bf.blocks:
                    bf.finish()
                    self._publish_locked(bf)
                elif bf.promised and bf.room_full() and bf.settled():
                    bf.finish()  # the room it had is full: partly staged, pinned

    def _work(self) -> None:
        buf = mmap.mmap(-1, BLOCK)  # page-aligned, as a read with O_DIRECT wants
        with self.books.lock:
            while not self.closed:
                self._pace_locked()
                picked = self._next_locked() if self._running < self.pace.blocks else None
                if picked is None:
                    if not self._running:
                        self.pace.idle()
                    self._idle += 1  # a block's end, a new file or close wakes it (a WANTED mark
                    # needs no wake-up: it is looked for at every pick, within 0.1 s where a window's
                    # reader waits for its marks; a shim's fill is counted within 0.1 s while a file may have one)
                    self._cv.wait(0.1 if any(bf.budget >= bf.blocks or bf.promised or bf.window
                                             for bf in self._active) else 1.0)
                    self._idle -= 1
                    continue
                bf, b = picked
                bf.take(b)
                self._running += 1
                owner, run = self._peer_run_locked(bf, b)
                if self._running < self.pace.blocks and self._idle == 0:
                    self._wake_locked()
                self.books.lock.release()
                done: list[tuple[int, bool]] = []
                try:
                    if owner >= 0:
                        done = self._fetch_run(bf, run, owner, buf)
                    else:
                        done = [(b, self._read_block(bf, b, buf))]
                finally:
                    self.books.lock.acquire()
                    done += [(x, False) for x in run[len(done):]]  # (an exception: none of them staged)
                    for i, (x, ok) in enumerate(done):
                        self._ended_locked(bf, x, ok, running=i == 0)

    def _pace_locked(self) -> None:
        """What the read-ahead's pace minds now, looked at before each pick and request: a
        mapping's reader of records at random (a shim's find: the map's records) waits for its
        faults behind the read-ahead's queue, so the link is yielded while its file stages; and
        where no application reads the PFS's files (none mapped, no shim's read of them for a
        while), no read queues behind it: alone on the link."""
        staging = [bf for bf in self._active if not bf.done]
        if not staging:
            return  # (nothing staged: the pace stays as the last file left it, the report's)
        self.pace.yield_to_records(any(bf.records for bf in staging))
        now = time.monotonic()
        reading = [bf.read_on_pfs(now, ALONE_QUIET) for bf in staging]  # (each file's count seen)
        self.pace.alone_on_link(not any(reading))

    def _read_block(self, bf: BlockFile, b: int, buf: mmap.mmap) -> bool:
        """Read block ``b`` of ``bf`` from the PFS into the copy. False (the file is given up:
        it stays on the PFS) when its source is no longer the snapshot's or cannot be read."""
        try:
            src = self._source(bf)
            offset = b * BLOCK
            want = bf.length(b)
            view = memoryview(buf)
            got = 0
            while got < want:  # (lengths in whole pages: O_DIRECT; the file's end reads short)
                with self.books.lock:
                    self._pace_locked()
                    step = self.pace.request_bytes()
                    pause = self.pace.yield_pause()  # (0 unless it yields to a reader of records)
                if pause:
                    time.sleep(pause)
                t0 = time.monotonic()
                n = os.preadv(src, [view[got:got + min(step, -(-(want - got) // 4096) * 4096)]], offset + got)
                if n == 0:
                    raise SourceChanged(errno.ESTALE, f"ends at {offset + got} bytes, the snapshot saw {bf.info.size}")
                got += n
                with self.books.lock:
                    self.books.bytes_read["pfs"] += n
                    slow_before = self.pace.readaround
                    self.pace.delivered(n, time.monotonic() - t0)
                    if self.pace.readaround and not slow_before:
                        for other in self.files.values():
                            other.read_around()
            if got > want:
                raise SourceChanged(errno.ESTALE, f"longer than the {bf.info.size} bytes the snapshot saw")
            if not bf.direct:  # the client cached what was read: the node's memory is the tier's
                os.posix_fadvise(src, offset, want, os.POSIX_FADV_DONTNEED)
            view = view[:want]
            written = 0
            while written < want:
                written += os.pwrite(bf.copy_fd, view[written:], offset + written)
            with self.books.lock:
                self.from_pfs["blocks"] += 1
                self.from_pfs["bytes"] += want
            return True
        except (OSError, ValueError) as e:
            if not bf.done:
                log.warning("staging %s by blocks stopped at block %d: %s; the rest is read from the PFS",
                            bf.key, b, e)
            return False

    def _source(self, bf: BlockFile) -> int:
        """The PFS file, opened once and checked against the snapshot (size, mtime)."""
        if bf.source_fd >= 0:
            return bf.source_fd
        fd, fresh = self.pfs._open(bf.key)
        try:
            st = checked_stat(fd, fresh)
            if not stat.S_ISREG(st.st_mode) or not bf.info.same_content_as(st):
                raise SourceChanged(errno.ESTALE, "the file changed since the dataset snapshot")
            os.set_blocking(fd, True)
            # read past the client's page cache: the copy is the node's one copy of these bytes, and
            # a cached page would be found by the application's reads in place of the PFS's
            try:
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
                bf.direct = True
            except OSError:  # a filesystem without direct I/O: its pages are dropped after each block
                # the blocks are the read-ahead: the client's own would read past a block, and again
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        except BaseException:
            os.close(fd)
            raise
        with self.books.lock:
            if bf.source_fd < 0:
                bf.source_fd = fd
                self.books.files_read["pfs"] += 1
                return fd
        os.close(fd)  # another worker opened it meanwhile
        return bf.source_fd

    def _ended_locked(self, bf: BlockFile, b: int, ok: bool, running: bool = True) -> None:
        """Block ``b`` is staged (``ok``) or not; ``running``: it held one of the blocks under way
        (the first of a run fetched from a peer does, for the run)."""
        self._running -= running
        bf.in_flight.discard(b)
        if ok and (not bf.done or bf.stopped) and not bf.dropped and bf.states is not None:
            if self._lends_locked(bf, b):  # (a window's: it may leave for another the reader wants)
                bf.states[b] = BLOCK_LENT
                bf.lent.append(b)
            else:
                bf.states[b] = BLOCK_STAGED  # after its bytes: a reader that sees it reads them
            bf.staged += 1
            bf.staged_bytes += bf.length(b)
        elif not ok:
            if bf.states is not None and bf.states[b] == BLOCK_FILLING:
                bf.states[b] = BLOCK_ABSENT
            bf.untake(b)
            if not bf.done:
                bf.finish()
                self.failures += 1
        if bf.staged == bf.blocks and not bf.done:
            bf.finish()
            self._publish_locked(bf)
        elif bf.room_full() and not bf.in_flight and not bf.done and not bf.window and (not bf.promised or bf.settled()):
            bf.finish()  # the room it had is full: partly staged, pinned (a plan shims fill: _fills_locked)
        if bf.done and not bf.in_flight and bf.source_fd >= 0:
            os.close(bf.source_fd)
            bf.source_fd = -1
        if bf.dropped and not bf.in_flight:
            self._discard(bf)
        self._cv.notify_all()

    def _publish_locked(self, bf: BlockFile) -> None:
        """Every block staged: the copy is published where the shim probes (a plain
        descriptor from now on) and booked as the stager's copy."""
        books, tier, info = self.books, bf.tier, bf.info
        try:
            os.utime(bf.copy_fd, ns=(info.mtime_ns, info.mtime_ns))
            dest = tier.path_for(bf.key)
            make_dirs_below(tier.path, os.path.dirname(dest))
            replaced = link_over(bf.path, dest)
            if replaced is not None and isinstance(tier, SharedTier):  # another version, put there meanwhile
                tier.shared.give(tier.allocated(replaced.st_size))
        except OSError as e:
            log.warning("publishing %s (staged by blocks) failed: %s; its blocks are still served", bf.key, e)
            return
        bf.whole = True
        tier.committed(info.size, info.size, bf.key)
        books.bytes_staged += info.size
        books.files_staged += 1
        books.staged_locked(bf.key, tier)

    # -- room ----------------------------------------------------------------------------------
    def _make(self, key: str, info: FileInfo, wait: float | None = None) -> BlockFile | None:
        """``key``'s block file (None: none). In shared tiers, under the key's claim: what the
        set holds of it is settled first (``_settle``), then room is taken."""
        raw = [t for t in self.books.tiers if t.codec is None]
        shared = [t for t in raw if isinstance(t, SharedTier)]
        if not shared:
            return self._place(key, info, raw)
        with shared[0].shared.claim(key, wait) as held:  # the set's claims, as claim_for_copy's
            if not held:
                return None  # another job held it past the wait: this open reads the PFS
            for tier in shared:
                found = self._settle(tier, key, info)
                if found == "whole":
                    return None  # booked: the shim's probe finds the copy
                if found == "borrow":
                    bf = BlockFile(key, info, tier, 0, 0)
                    bf.borrowed, bf.done = True, True
                    return bf
                if found == "resume":
                    bf = self._resume(tier, key, info)
                    if bf is not None:
                        return bf
            return self._place(key, info, raw)

    def _settle(self, tier: SharedTier, key: str, info: FileInfo) -> str | None:
        """What the shared set in ``tier`` holds of ``key`` (its claim held): "whole" (a copy of
        this job's file at the key, booked now: published here if a gone job left it complete by
        blocks), "borrow" (a live job stages it by blocks: served as its blocks come, the shim
        checking the map against this job's snapshot), "resume" (a gone job left this file's
        blocks unfinished: ``_resume`` takes them up), None: stage it. What the set held of
        another version of the file, whole or by blocks, goes with its room (said as re-staged)."""
        dest = tier.path_for(key)
        copy, bmap = os.path.join(tier.path, BLOCKS_DIR, key), os.path.join(tier.path, BLOCKMAP_DIR, key)
        whole = tier.matching(key, info)
        blocks, complete, live = copy_state(copy, bmap, info)
        if whole or (blocks == "same" and complete and not live):
            if not whole:  # a gone job's complete blocks of this file: published in place of any other copy
                try:
                    os.utime(copy, ns=(info.mtime_ns, info.mtime_ns), follow_symlinks=False)
                    replaced = link_over(copy, dest)
                    if replaced is not None:
                        tier.shared.give(tier.allocated(replaced.st_size))
                except OSError as e:
                    log.warning("publishing %s (staged by blocks by another job) failed: %s", key, e)
                    return "borrow"
            with self.books.lock:
                if self.books.is_dirty(key) or self.books.closed:
                    return "whole"
                if self.books.staged.get(key) is not tier:
                    tier.found(info.size)
                    self.books.staged_locked(key, tier)
            return "whole"
        if live and (blocks == "same" or not complete):
            return "borrow"  # (another version still being staged: this job's shim reads the PFS)
        if blocks == "same" and whole is None:
            return "resume"
        tier.remove_copies(*([dest] if whole is False else []), *([copy] if blocks else []))
        if blocks:
            with contextlib.suppress(OSError):
                os.unlink(bmap)
        if whole is False or blocks == "other":
            tier.restaged(info.size)
            log.info("%s changed since the shared set's copy: staged anew", key)
        return None

    def _resume(self, tier: SharedTier, key: str, info: FileInfo) -> BlockFile | None:
        """The blocks of ``key`` a gone job left unfinished in ``tier``'s set, staged on from where
        they are (a chain of jobs each shorter than the copy would otherwise never finish it).
        The room it holds in the set's ledger (its map says: what the gone job took) is given
        back, then taken as for a new copy: the whole file's, else as many blocks as fit; a
        copy whose room holds no more than it has staged is done at once. None (its files gone,
        staged anew by the caller) when the room holds fewer blocks than it has staged, or its
        files are not this file's after all."""
        bf = None
        copy = os.path.join(tier.path, BLOCKS_DIR, key)
        try:
            tier.shared.give(tier.room_of(copy, os.lstat(copy)))
        except OSError:
            return None
        blocks, whole = -(-info.size // BLOCK), tier.allocated(info.size)
        if tier.has_room(whole) and self.books.reserve(tier, whole):
            bf = BlockFile(key, info, tier, blocks, whole)
        elif (n := self._room_for_blocks(tier, blocks)) > 0:
            bf = BlockFile(key, info, tier, n, n * BLOCK)
        staged = bf.resume() if bf is not None else None
        if staged is None or staged > bf.budget:
            if bf is not None:
                bf.close()
                tier.release(bf.reserved)
            for path in (copy, os.path.join(tier.path, BLOCKMAP_DIR, key)):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # (its room was given back above)
            return None
        tier.resumed(info.size, bf.staged_bytes)
        if bf.room_full():
            bf.finish()  # its room holds no more than it has: partly staged, pinned (no block will end to say so)
        log.info("%s: %d of its %d blocks were staged by a job that has gone; staging the rest", key, staged,
                 bf.blocks)
        return bf

    def _place(self, key: str, info: FileInfo, raw: list[Tier]) -> BlockFile | None:
        """``key``'s block file in the first raw tier that holds it, else in the raw tier
        with the most room for blocks; None if none has room for one."""
        for tier in raw:
            whole = tier.allocated(info.size)
            if tier.has_room(whole) and self.books.reserve(tier, whole):
                return self._made(key, info, tier, -(-info.size // BLOCK), whole)
        best = max(raw, key=lambda t: t.free_room() if t.full_reason is None else -1, default=None)
        if best is None:
            return None
        n = self._room_for_blocks(best, -(-info.size // BLOCK))
        return self._made(key, info, best, n, n * BLOCK) if n > 0 else None

    @staticmethod
    def _room_for_blocks(tier: Tier, blocks: int) -> int:
        """Room in ``tier`` for as many of a file's ``blocks`` as fit (fewer than all), taken: how many
        (in a shared tier, of the set's room: what other jobs' copies leave)."""
        n = min(blocks - 1, tier.free_room() // BLOCK)
        while n > 0 and not tier.reserve(n * BLOCK, counted=False):
            n //= 2  # the memory margin, or another copy took room meanwhile
        return n

    def _made(self, key: str, info: FileInfo, tier: Tier, budget: int, reserved: int) -> BlockFile | None:
        bf = BlockFile(key, info, tier, budget, reserved)
        try:
            bf.create()  # (in a shared tier, what was there was settled under the key's claim)
        except FileExistsError:
            tier.release(reserved)
            if not isinstance(tier, SharedTier) or not os.path.exists(bf.map_path):
                log.warning("cannot stage %s by blocks in tier %s: a copy is there already", key, tier.name)
                return None
            # another job of this user stages it in the shared set: its blocks are served (the shim
            # checks the map against this job's snapshot), it publishes the whole copy
            bf.borrowed, bf.done, bf.budget, bf.reserved = True, True, 0, 0
            return bf
        except OSError as e:
            log.warning("cannot stage %s by blocks in tier %s: %s; it is read from the PFS", key, tier.name, e)
            tier.release(reserved)
            bf.close()
            for path in (bf.path, bf.map_path):
                try:
                    os.unlink(path)
                except OSError:
                    pass
            return None
        if budget < bf.blocks:
            log.info("%s: %d of its %d blocks fit in tier %s; the rest is read from the PFS", key, budget,
                     bf.blocks, tier.name)
        return bf

    def _discard(self, bf: BlockFile) -> None:
        """Remove ``bf``'s files and give its room back (no block of it under way: nothing
        here reads or writes them any more; a shim's open descriptor keeps its inode)."""
        bf.close()
        self._leave_ranges(bf)
        if bf.borrowed:
            return  # another job's
        for path in (bf.path, bf.map_path):
            try:
                os.unlink(path)
            except OSError:
                pass
        if bf.whole:
            return  # its room is the published copy's: the stager's books drop it
        bf.tier.release(bf.reserved)

    # -- the end -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Nothing new starts; blocks under way finish (``drain`` waits for them). Returns at once."""
        with self.books.lock:
            self._fills_locked()  # a file the application's reads made whole is published
            self.closed = True
            for bf in self.files.values():
                bf.stopped = not bf.done  # (its blocks under way are kept: the next job in the set stages on)
                bf.finish()
            self._cv.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """After ``stop``: wait until no block is being copied, then let go of every file's
        descriptors and map (the files stay for the tier's removal). False at ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.books.lock:
            while self._running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
            for bf in self.files.values():
                bf.close()
        return True

    def held(self) -> dict[str, int]:
        """Per large file served by blocks and not published whole, the bytes of its staged
        blocks: this job's, and those another job stages in a shared set (from its map, when
        it is this job's file)."""
        with self.books.lock:
            files = [bf for bf in self.files.values() if not bf.whole and not bf.dropped]
            out = {bf.key: bf.staged_bytes for bf in files if not bf.borrowed}
        for bf in files:
            if bf.borrowed:
                out[bf.key] = staged_bytes(bf.map_path, bf.info)
        return {k: v for k, v in out.items() if v}

    def stats_locked(self) -> dict:
        """The report's figures (under the books' lock): files staged by blocks, those partly
        staged and their bytes, blocks staged, the read-ahead's pace."""
        self._fills_locked()
        own = [bf for bf in self.files.values() if not bf.borrowed]
        partial = [bf for bf in own if bf.budget < bf.blocks]
        return {"files": len(own), "from_other_jobs": len(self.files) - len(own),
                "whole_files": sum(bf.whole for bf in own),
                "partly_staged_files": len(partial),
                "partly_staged_bytes": sum(bf.staged_bytes for bf in partial),
                "partly_staged_of_bytes": sum(bf.info.size for bf in partial),
                "in_progress_files": sum(not bf.done for bf in own),
                "blocks_staged": sum(bf.staged for bf in own),
                "blocks_from_pfs": self.from_pfs["blocks"], "bytes_from_pfs": self.from_pfs["bytes"],
                **(self._peer_stats_locked() if self.peers is not None else {}),
                "blocks_filled_by_reads": sum(bf.filled for bf in own),
                "bytes_staged": sum(bf.staged_bytes for bf in own),
                "block_bytes": BLOCK, "pace": self.pace.state(), "failed_files": self.failures}

