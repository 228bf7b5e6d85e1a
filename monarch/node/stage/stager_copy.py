"""The stager's copying: one key from its source (the PFS, a peer) into the first tier with room, published atomically.

Whatever the source (``monarch/node/stage/sources.py``): space reserved before the copy, a
compressing tier fed from one read of the PFS, the copy written under a temporary name and
published by a rename under the books' lock, and every byte read from each source counted
(the PFS bytes are the number Monarch exists to minimise). A source is copied only if it
is still the file the snapshot saw; a key the job wrote to is never published; a tier
whose filesystem is full is marked so and the next one is tried.
"""

from __future__ import annotations

import errno
import io
import logging
import os
from typing import Callable

from monarch.errors import PeerError
from monarch.node.stage.sources import PFSSource, Source, SourceChanged
from monarch.node.stage.stager_books import StagerBooks
from monarch.node.stage.stager_recode import start_recode
from monarch.node.tiers.shared_tier import COPY, claim_for_copy
from monarch.node.tiers.tiers import NO_SPACE, Tier, write_all, write_atomically
from monarch.routes import Route
from monarch.secure import owner_only

log = logging.getLogger(__name__)

__all__ = ["Copier", "Invalidated", "Closed", "SourceTally"]


class Invalidated(Exception):
    """The job wrote to the key while it was being copied: the copy is dropped."""


class Closed(Exception):
    """The stager is shutting down: a copy under way stops at its next read, unpublished."""


class SourceTally:
    """What one copy read from its source, counted in the books as it goes."""
    __slots__ = ("books", "name")

    def __init__(self, books: StagerBooks, name: str):
        self.books, self.name = books, name

    def opened(self) -> None:
        with self.books.lock:
            self.books.files_read[self.name] += 1

    def read(self, nbytes: int) -> None:
        """Counted; then a copy under way stops here if the stager is shutting down (every
        source reads through this, the ranges of a large file included)."""
        with self.books.lock:
            self.books.bytes_read[self.name] += nbytes
            if self.books.closed:
                raise Closed()


class Copier:
    """Copies keys into the tiers of one set of books (a stager's; the sharded peer cache's
    area, ``peer_cache.py``). ``room_for_hinted(key, size)``
    (under the lock) makes room for a hinted key that found none; ``on_fallback(reason)``
    is told each time a peer could not help and the PFS was used."""

    def __init__(self, books: StagerBooks, room_for_hinted: Callable[[str, int], bool] = lambda key, size: False,
                 on_fallback: Callable[[str], None] | None = None,
                 pfs_source: Callable[[Source], Source] | None = None):
        self.books = books
        pfs = PFSSource(books.snapshot)
        self.pfs = pfs_source(pfs) if pfs_source is not None else pfs
        self._room_for_hinted = room_for_hinted
        self._on_fallback = on_fallback

    def stage(self, key: str, peer_only: bool = False, replica: bool = False) -> Tier | None:
        """Copy ``key``: the tier that holds it, or None (it stays on the PFS, counted why).
        ``replica``: a second copy, from its owner into the tiers or not at all."""
        try:
            return self._replica(key) if replica else self._copy(key, peer_only)
        except Closed:  # stopped by shutdown(): not a failure of the file
            return None
        except Invalidated:
            with self.books.lock:
                self.books.failures["written_by_job"] += 1
            return None
        except Exception as e:  # a failed copy leaves the file on the PFS, never fails the app
            reason = "changed_since_snapshot" if isinstance(e, SourceChanged) else f"io_error:{type(e).__name__}"
            log.warning("staging %s failed: %s", key, e)
            with self.books.lock:
                self.books.failures[reason] += 1
                self.books.unstageable.add(key)
            return None

    def _copy(self, key: str, peer_only: bool = False) -> Tier | None:
        """``peer_only``: a read-ahead of a key another node owns, which gives up (and leaves
        the key to a later demand) rather than read the PFS a second time for the cluster."""
        books = self.books
        info = books.snapshot.get(key)
        if info is None:
            return self._give_up(key, "not_in_snapshot")
        route = books.route(key, info)
        if route is Route.BLOCKS and not books.blocks.closed and books.blocks.stage(key):
            return None  # its blocks are staged from now on; the whole copy is published when they are
        claimed = [listener.claiming(key) for listener in books.listeners]
        if any(claimed) and (tier := books.staged.get(key)) is not None:  # copied elsewhere first
            return tier
        if route in (Route.PEER, Route.PEER_LANE):
            tier, why = self._from_peer(key, info)
            if tier is not None:
                return tier
            if peer_only:
                with books.lock:
                    books.failures[f"read_ahead_from_peer:{why}"] += 1
                return None
            if self._on_fallback is not None:
                self._on_fallback(why)
        with claim_for_copy(books, key, info) as found:  # a shared tier: another job's copy, or this job's claim
            if found is not COPY:
                return found
            for attempt in (0, 1):
                tier = self.copy_into(self.pfs, key, info, books.tiers)
                if tier is not None:
                    return tier
                with books.lock:  # no tier had room: hinted readers may have consumed copies to drop
                    if attempt or not self._room_for_hinted(key, info.size):
                        break
        with books.lock:
            books.failures["no_room"] += 1
            books.no_room.add(key)
        return None

    def _replica(self, key: str) -> Tier | None:
        """A second copy of another node's file from its owner, into the tiers; never the PFS
        (the PFS stays read once). A failure is counted, and leaves the key to whoever owns it
        later (it is not marked unstageable)."""
        books = self.books
        try:
            tier = self.copy_into(books.replica_source, key, books.snapshot.files[key], books.tiers)
        except PeerError:
            why = "peer_failed"
            tier = None
        except (OSError, SourceChanged) as e:
            log.warning("keeping a second copy of %s failed: %s", key, e)
            why = "io_error"
            tier = None
        else:
            why = "no_room"
        if tier is None:
            with books.lock:
                books.failures[f"replica:{why}"] += 1
        return tier

    def _from_peer(self, key: str, info) -> tuple[Tier | None, str]:
        if self.books.peer_area is None:
            return None, "peer_area_unusable"
        why = self.books.peers.available(key)
        if why is not None:
            return None, why
        try:
            tier = self.copy_into(self.books.peers, key, info, self.books.peer_places())
        except PeerError:
            return None, "peer_failed"
        except (OSError, SourceChanged) as e:
            log.warning("writing %s into the peer area failed: %s", key, e)
            return None, "peer_area_error"
        return (tier, "fetched") if tier is not None else (None, "peer_area_full")

    def copy_into(self, source: Source, key: str, info, tiers: list[Tier]) -> Tier | None:
        """Copy ``key`` from ``source`` into the first of ``tiers`` with room (None: none had).

        A tier that compresses (``tier.codec``) needs the file's bytes in memory: they are
        read from the source once, into a buffer, and every later tier tried is written from
        that buffer (never a second read). What a copy takes in the tier is what its
        filesystem allocates for its stored size (``Tier.allocated``: blocks, tmpfs pages),
        reserved before the copy (``StagerBooks.reserve``: room lent out comes back, or is
        evicted, first)."""
        tally = SourceTally(self.books, source.name)
        if source is self.pfs:
            stream = lambda fd: self.read_pfs(key, fd)  # noqa: E731
        else:
            stream = lambda fd: source.copy(key, info, fd, tally)  # noqa: E731
        held: memoryview | None = None  # the file's bytes, once read for a compressing tier
        for tier in tiers:
            frame = None
            codec = tier.codec if source is self.pfs else None  # the peer area keeps raw copies
            if codec is not None and codec.wants(info.size):
                # room for the expected stored size before the read, so that a file read for
                # a trial compression is not, as a rule, left without a tier (the application
                # would then read it a second time); the reservation is trued up after encoding
                expected = tier.allocated(tier.codec.estimate(info.size))
                if not tier.reserve(expected):
                    continue
                try:
                    if held is None:
                        buf = io.BytesIO()
                        self.read_pfs(key, buf)
                        held = buf.getbuffer()
                    frame = codec.encode(held, key)  # None: it does not shrink enough, kept raw
                    if early := codec.take_early():  # the level was just chosen: the earlier frames follow it
                        start_recode(self.books, tier, early)
                except BaseException:
                    tier.release(expected)
                    raise
                stored = len(frame) if frame is not None else info.size
                room = tier.allocated(stored)
                if room <= expected:
                    tier.release(expected - room)
                elif not tier.reserve(room - expected):
                    tier.release(expected)
                    continue  # the bytes are held: the next tier takes them without a second read
            else:
                room = tier.allocated(info.size)
                if not self.books.reserve(tier, room):  # room lent out of it comes back, or is evicted, first
                    continue
            data = frame if frame is not None else held
            fill = stream if data is None else (lambda fd, data=data: write_all(fd, data))
            dest = tier.compressed_path_for(key) if frame is not None else tier.path_for(key)
            try:
                n = write_atomically(dest, fill, info.mtime_ns, owner_only(info.mode),
                                     publish=lambda tmp, d, t=tier, z=frame is not None: self._publish(key, t, tmp, d, z),
                                     root=tier.path, size=len(data) if data is not None else info.size)
            except OSError as e:
                tier.release(room)
                if e.errno in NO_SPACE:
                    tier.mark_full(f"{errno.errorcode.get(e.errno, e.errno)} after {tier.used} bytes")
                    log.warning("tier %s is full (%s); staging goes to the next tier", tier.name, e.strerror)
                    continue
                raise
            except BaseException:
                tier.release(room)
                raise
            with self.books.lock:
                self.books.bytes_staged += info.size if frame is not None else n
                self.books.files_staged += 1
            return tier
        return None

    def read_pfs(self, key: str, out) -> int:
        """Copy ``key`` from the PFS into ``out`` (a descriptor or a buffer), counted (the one
        seam tests wrap)."""
        return self.pfs.copy(key, self.books.snapshot.files[key], out, SourceTally(self.books, "pfs"))

    def _give_up(self, key: str, reason: str) -> None:
        with self.books.lock:
            self.books.failures[reason] += 1
            self.books.unstageable.add(key)
        return None

    def _publish(self, key: str, tier: Tier, tmp: str, dest: str, compressed: bool = False) -> None:
        books = self.books
        with books.lock:  # invalidate() holds it too: a copy never appears after a write
            if books.closed:  # nor after shutdown(): the tier's directory is about to go
                raise Closed()
            if books.is_dirty(key):
                raise Invalidated(key)
            os.replace(tmp, dest)
            tier.committed(books.snapshot.files[key].size, os.stat(dest).st_size, key, compressed)
            books.staged_locked(key, tier)
