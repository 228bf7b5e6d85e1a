"""The stager: copies dataset files from their sources into the fastest tier with room.

One place for everything a copy needs, whatever the source (``monarch/node/sources.py``: the
PFS, a peer node): priorities, bounded concurrency, one flight per file (concurrent
requests share one copy), space reserved before the copy, the atomic publish, and the
count of every byte read from each source — the PFS bytes are the number Monarch exists
to minimise.

Scheduling, in this order (the cold path counts):
  1. demand: a file the application is waiting for goes first, into slots background
     copies may not take (``background_slots``), so it starts at once; one already being
     copied is waited for, never read twice;
  2. order hints (``monarch.hints``): the coming epoch's order, staged just ahead of the
     reader; files this epoch has consumed are dropped when room is needed for ones it
     has not (clairvoyant: a file is read from the PFS at most once per epoch);
  3. read-ahead (``staging.policy: read-ahead``): the rest of the dataset in the
     background while it fits, pinned (nothing is evicted for it).
Concurrency toward the sources adapts to what they give (``Concurrency``): deep enough to
hide a high-latency PFS, no deeper than helps.

Correct bytes first: a source is copied only if it is still the file the snapshot saw
(size and mtime of the open descriptor); a key the job wrote to (``invalidate``) is never
staged or served again this run; a file that failed once is not retried on every open;
a tier whose filesystem is full is marked so and the next one is tried.
"""

from __future__ import annotations

import collections
import errno
import io
import logging
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from monarch.node.concurrency import Concurrency
from monarch.errors import PeerError
from monarch.frontdoor import EV_SLOW, EV_STAGED
from monarch.secure import owner_only
from monarch.node.snapshot import Snapshot
from monarch.node.sources import PeerSource, PFSSource, Source, SourceChanged
from monarch.node.tiers import NO_SPACE, Tier, write_all, write_atomically

log = logging.getLogger(__name__)

__all__ = ["Stager", "SourceChanged", "Invalidated", "Closed"]

SCAN_STEP = 512        # read-ahead keys examined per turn under the lock
PEER_AHEAD = 8         # read-ahead copies from peers at once: an owner answers each within its timeout
INLINE_SECONDS = 0.0005   # a PFS this fast (recent mean per copy) is copied by the asker itself ...
INLINE_BYTES = 256 << 10  # ... for files this small: no thread hand-off (see ensure)
DOOR_LEASE_MAX = 16 << 20  # tier room lent to the front door at a time, at most ...
DOOR_LEASE_SHARE = 32      # ... and at most this share of the tier's capacity


def background_slots(limit: int) -> int:
    """Of ``limit`` copies in flight, how many background copies may take: the rest stay
    free for copies the application waits for, so those start at once."""
    return max(1, limit - max(1, limit // 4))


class Invalidated(Exception):
    """The job wrote to the key while it was being copied: the copy is dropped."""


class Closed(Exception):
    """The stager is shutting down: a copy under way stops at its next read, unpublished."""


# -- order hints ---------------------------------------------------------------------------
@dataclass
class _Order:
    """One reader's order for its current epoch (``monarch.hints``)."""
    keys: list[str] = field(default_factory=list)
    cursor: int = 0      # next position the stager looks at
    blocked: bool = False  # the key at the cursor waits for room (for the reader to consume)
    consumed: int = 0    # positions below this the reader is done with
    evict_at: int = 0    # next consumed position to look at for a copy to drop


class _Flight:
    __slots__ = ("future", "running", "peer_only")

    def __init__(self, peer_only: bool = False):
        self.future: Future = Future()
        self.running = False
        self.peer_only = peer_only  # read ahead from the owning peer: never from the PFS here


class _SourceTally:
    __slots__ = ("stager", "name")

    def __init__(self, stager: "Stager", name: str):
        self.stager, self.name = stager, name

    def opened(self) -> None:
        with self.stager._lock:
            self.stager.files_read[self.name] += 1

    def read(self, nbytes: int) -> None:
        """Counted; then a copy under way stops here if the stager is shutting down (every
        source reads through this, the ranges of a large file included)."""
        with self.stager._lock:
            self.stager.bytes_read[self.name] += nbytes
            if self.stager._closed:
                raise Closed()


class Stager:
    def __init__(self, snapshot: Snapshot, tiers: list[Tier], threads: int = 0, *,
                 peers: PeerSource | None = None, peer_area: Tier | None = None,
                 on_fallback: Callable[[str], None] | None = None, max_threads: int = 256):
        """``threads``: copies in flight at most (0: adaptive, up to ``max_threads``).
        ``peers``: keys another node owns are fetched from it into ``peer_area`` first;
        ``on_fallback(reason)`` is told each time that did not work and the PFS was used."""
        self.snapshot = snapshot
        self.tiers = tiers
        self.pfs = PFSSource(snapshot)
        self.peers = peers
        self.peer_area = peer_area
        self._on_fallback = on_fallback
        self.inline_seconds = INLINE_SECONDS
        self.concurrency = Concurrency(fixed=threads or None, high=max_threads)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._flights: dict[str, _Flight] = {}
        self._demand: collections.deque[str] = collections.deque()
        self._orders: dict[int, _Order] = {}
        self._hinted_pos: dict[str, tuple[int, int]] = {}  # key -> (stream, position) in its order
        self._ahead: Iterator[str] | None = None
        self._ahead_held: str | None = None  # the read-ahead's next key, waiting for a peer slot
        self._feed: collections.deque[str] = collections.deque()  # read_ahead_more's keys
        self._peer_ahead = 0  # read-ahead copies from peers running
        self._workers: list[threading.Thread] = []
        self._idle = 0
        self._running = 0
        self._closed = False
        self.staged: dict[str, Tier] = {}  # key -> tier holding its complete copy
        self.failures: collections.Counter[str] = collections.Counter()
        self._unstageable: set[str] = set()  # answered "PFS" at once from now on, counted once
        self._no_room: set[str] = set()  # did not fit; tried again only once room was freed
        self._dirty: set[str] = set()  # keys (files or directories) the job wrote to
        self.files_read: collections.Counter[str] = collections.Counter()  # by source name
        self.bytes_read: collections.Counter[str] = collections.Counter()
        self.bytes_staged = 0
        self.files_staged = 0
        self.files_dropped = 0
        self.demand_copies = 0
        self.background_copies = 0
        self.door = None  # the daemon's C front door (monarch.frontdoor), once attached
        self._door_may_copy = False

    def adopt(self, key: str, tier: Tier) -> None:
        with self._lock:
            self.staged[key] = tier
            if self.door is not None:
                self._tell_door_locked(key, tier)

    def where(self, key: str) -> Tier | None:
        return self.staged.get(key)

    # -- asking ------------------------------------------------------------------------
    def ensure(self, key: str, inline: bool = False) -> Future:
        """A future of the tier that holds ``key`` (None: it stays on the PFS). The key
        goes ahead of every background copy.

        ``inline``: the caller may copy it itself, before returning, when that is cheaper
        than handing it to a thread — a small file from a PFS whose recent copies took
        under INLINE_SECONDS (local disk, a warm cache). One slow copy raises the moving
        mean past that at once, and the copies go back to the threads."""
        with self._lock:
            tier = self.staged.get(key)
            if self._closed:  # shutting down: no new copy (what is staged may still be answered)
                done: Future = Future()
                done.set_result(tier)
                return done
            flight = self._flights.get(key)
            if flight is not None:
                if not flight.running:
                    self._demand.append(key)  # queued in the background: promote it
                    self._wake_locked()
                return flight.future
            if tier is not None or key in self._unstageable or key in self._no_room or self._is_dirty(key):
                if key in self._no_room and tier is None:
                    pass  # counted when it first did not fit
                done = Future()
                done.set_result(tier)
                return done
            flight = self._flights[key] = _Flight()
            recent = self.concurrency.recent_seconds
            info = self.snapshot.files.get(key)
            if (inline and recent is not None and recent < self.inline_seconds and info is not None
                    and info.size <= INLINE_BYTES and self._running < self.concurrency.limit
                    and not (self.peers is not None and self.peers.owns_elsewhere(key))):
                flight.running = True
                self._running += 1
                self.demand_copies += 1
            else:
                self._demand.append(key)
                self._wake_locked()
                return flight.future
        self._run(key, flight)
        return flight.future

    def read_ahead(self, keys: Iterable[str]) -> None:
        """Stage ``keys`` in the background, in this order, after demand and hints, while
        they fit (nothing is evicted for them)."""
        with self._lock:
            self._ahead = iter(keys)
            self._ahead_held = None
            self._wake_locked()

    def read_ahead_more(self, keys: Iterable[str]) -> None:
        """Stage ``keys`` in the background as well, before the read-ahead's own order: the
        files of a walk still under way, as it finds them (what fits; nothing evicted)."""
        with self._lock:
            self._feed.extend(keys)
            self._wake_locked()

    # -- order hints -------------------------------------------------------------------------
    def hint_order(self, stream: int, keys: list[str], begin: bool) -> None:
        """Reader ``stream`` will read ``keys`` next, in this order (``begin``: a new epoch's
        order starts with them; else they extend the current one)."""
        with self._lock:
            order = self._orders.get(stream)
            if begin or order is None:
                if order is not None:
                    for k in order.keys:
                        if self._hinted_pos.get(k, (None,))[0] == stream:
                            del self._hinted_pos[k]
                order = self._orders[stream] = _Order()
            base = len(order.keys)
            order.keys.extend(keys)
            for i, k in enumerate(keys):
                self._hinted_pos[k] = (stream, base + i)
            self._wake_locked()

    def hint_progress(self, stream: int, consumed: int) -> None:
        """Reader ``stream`` is done with the first ``consumed`` keys of its order."""
        with self._lock:
            order = self._orders.get(stream)
            if order is not None and consumed > order.consumed:
                order.consumed = min(consumed, len(order.keys))
                order.cursor = max(order.cursor, order.consumed)
                order.blocked = False
                self._wake_locked()

    def hint_end(self, stream: int) -> None:
        """Reader ``stream`` has gone: its order no longer steers anything."""
        with self._lock:
            order = self._orders.pop(stream, None)
            if order is not None:
                for k in order.keys:
                    if self._hinted_pos.get(k, (None,))[0] == stream:
                        del self._hinted_pos[k]

    # -- the job's writes ------------------------------------------------------------------
    def _is_dirty(self, key: str) -> bool:
        if not self._dirty:
            return False
        parts = key.split("/")
        return any("/".join(parts[:i]) in self._dirty for i in range(2, len(parts) + 1))

    def invalidate(self, key: str) -> int:
        """The job writes to ``key`` (a file, or a directory and all under it): drop its
        copies now and never stage it again this run. Returns how many copies went."""
        prefix = key.rstrip("/") + "/"
        self.pfs.forget(key)
        if self.door is not None:  # no copy of the door's after this one; those made are dropped below
            self.door.disable()
            self.absorb_front_door()
        with self._lock:
            self._dirty.add(key.rstrip("/"))
            gone = [k for k in self.staged if k == key or k.startswith(prefix)] if len(self.staged) else []
            for k in gone:
                self._drop_locked(k)
        return len(gone)

    def _drop_locked(self, key: str) -> None:
        if self.door is not None:
            self.door.forget(key)  # before the file goes: the door no longer names it
        tier = self.staged.pop(key)
        path = tier.copy_path(key)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
            tier.release(size)
            info = self.snapshot.files.get(key)
            tier.forget(key, info.size if info is not None else size, size)
        except OSError:
            pass
        if tier.decoded is not None:
            # after the frame is gone: a decode that takes its token after this finds no frame,
            # one that took it before is refused (DecodedFiles.drop), so no file of the old bytes
            tier.decoded.drop(key)
        self._no_room.clear()  # room was freed: what did not fit may fit now

    def mark_changed(self, key: str) -> None:
        """The source changed since the snapshot (found by a check at open): drop the copy."""
        self.invalidate(key)
        with self._lock:
            self.failures["changed_since_snapshot"] += 1

    # -- the workers ----------------------------------------------------------------------------
    def _wake_locked(self) -> None:
        if self._closed:
            return
        if self._idle == 0 and len(self._workers) < self.concurrency.limit:
            t = threading.Thread(target=self._work, name=f"monarch-stage-{len(self._workers)}", daemon=True)
            self._workers.append(t)
            t.start()
        else:
            self._cv.notify()

    def _work(self) -> None:
        with self._lock:
            while not self._closed:
                key, demanded = self._next_locked()
                if key is None:
                    self._idle += 1
                    self._cv.wait(1.0)
                    self._idle -= 1
                    continue
                if key == "":
                    continue  # scanned a stretch of read-ahead; let others in
                flight = self._flights[key]
                flight.running = True
                self._running += 1
                if demanded:
                    self.demand_copies += 1
                else:
                    self.background_copies += 1
                if self._demand or self._orders or self._ahead is not None or self._feed:
                    self._wake_locked()  # more work: another worker (maybe a new one) looks
                self._lock.release()
                try:
                    self._run(key, flight)
                finally:
                    self._lock.acquire()

    def _run(self, key: str, flight: _Flight) -> None:
        """Copy ``key`` (its flight already counted as running), then resolve its future."""
        t0 = time.monotonic()
        try:
            tier = self._stage(key, flight.peer_only)
        finally:
            with self._lock:
                self._running -= 1
                self._peer_ahead -= flight.peer_only
                self._flights.pop(key, None)
                self.concurrency.completed(time.monotonic() - t0)
                if self._closed and not self._running:
                    self._cv.notify_all()  # drain() waits for this
        flight.future.set_result(tier)  # callbacks run here, outside the lock

    def _next_locked(self) -> tuple[str | None, bool]:
        """The next key to copy and whether it was demanded; (None, _) when there is none
        (or no free slot); ("", _) after a fruitless stretch of read-ahead."""
        limit = self.concurrency.limit
        if self._running >= limit:
            return None, False
        while self._demand:
            key = self._demand.popleft()
            flight = self._flights.get(key)
            if flight is not None and not flight.running:
                return key, True
        if self._running >= background_slots(limit):
            return None, False
        for stream, order in list(self._orders.items()):
            key = self._next_hinted_locked(order)
            if key is not None:
                return key, False
        while self._feed:
            key = self._feed.popleft()
            if (self._wanted_locked(key) and not (self.peers is not None and self.peers.owns_elsewhere(key))
                    and self._fits(self.snapshot.files[key].size)):
                self._flights[key] = _Flight()
                return key, False
        if self._ahead is not None:
            for _ in range(SCAN_STEP):
                key, self._ahead_held = self._ahead_held or next(self._ahead, None), None
                if key is None:
                    self._ahead = None
                    break
                if not self._wanted_locked(key):
                    continue
                size = self.snapshot.files[key].size
                if self.peers is not None and self.peers.owns_elsewhere(key):
                    if self.peer_area is None or not self._peer_fits(size) or self.peers.available(key):
                        continue
                    if self._peer_ahead >= PEER_AHEAD:  # its turn comes when one of those ends
                        self._ahead_held = key
                        return None, False
                    self._peer_ahead += 1
                    self._flights[key] = _Flight(peer_only=True)
                    return key, False
                if self._fits(size):
                    self._flights[key] = _Flight()
                    return key, False
            else:
                return "", False
        self.concurrency.starved()
        return None, False

    def _wanted_locked(self, key: str) -> bool:
        return (key not in self.staged and key not in self._flights and key not in self._unstageable
                and key not in self._no_room and key in self.snapshot.files and not self._is_dirty(key))

    def _next_hinted_locked(self, order: _Order) -> str | None:
        while order.cursor < len(order.keys):
            key = order.keys[order.cursor]
            if not self._wanted_locked(key):
                order.cursor += 1
                continue
            if not self._make_room_locked(self.snapshot.files[key].size):
                order.blocked = True
                return None  # wait until the reader consumes more
            order.blocked = False
            order.cursor += 1
            self._flights[key] = _Flight()
            return key
        return None

    def _fits(self, size: int) -> bool:
        return any(t.fits(size) for t in self.tiers) or (self.reclaim_front_door_lease() and self.tiers[0].fits(size))

    def _make_room_locked(self, size: int) -> bool:
        """Room for ``size`` bytes in some tier, dropping copies hinted readers have
        consumed if need be (oldest consumed first). False if there is none to drop."""
        while not self._fits(size):
            victim = None
            for order in self._orders.values():
                while order.evict_at < order.consumed:
                    k = order.keys[order.evict_at]
                    order.evict_at += 1
                    if k in self.staged and self.staged[k] in self.tiers:
                        victim = k
                        break
                if victim is not None:
                    break
            if victim is None:
                return False
            self._drop_locked(victim)
            self.files_dropped += 1
        return True

    # -- copying -------------------------------------------------------------------------------
    def _stage(self, key: str, peer_only: bool = False) -> Tier | None:
        try:
            return self._copy(key, peer_only)
        except Closed:  # stopped by shutdown(): not a failure of the file
            return None
        except Invalidated:
            with self._lock:
                self.failures["written_by_job"] += 1
            return None
        except Exception as e:  # a failed copy leaves the file on the PFS, never fails the app
            reason = "changed_since_snapshot" if isinstance(e, SourceChanged) else f"io_error:{type(e).__name__}"
            log.warning("staging %s failed: %s", key, e)
            with self._lock:
                self.failures[reason] += 1
                self._unstageable.add(key)
            return None

    def _copy(self, key: str, peer_only: bool = False) -> Tier | None:
        """``peer_only``: a read-ahead of a key another node owns, which gives up (and leaves
        the key to a later demand) rather than read the PFS a second time for the cluster."""
        info = self.snapshot.get(key)
        if info is None:
            return self._give_up(key, "not_in_snapshot")
        if self.door is not None and self.door.claim(key):  # the door copied it first
            self.absorb_front_door()
            if (tier := self.staged.get(key)) is not None:
                return tier
        if self.peers is not None and self.peers.owns_elsewhere(key):
            tier, why = self._from_peer(key, info)
            if tier is not None:
                return tier
            if peer_only:
                with self._lock:
                    self.failures[f"read_ahead_from_peer:{why}"] += 1
                return None
            if self._on_fallback is not None:
                self._on_fallback(why)
        for attempt in (0, 1):
            tier = self._copy_into(self.pfs, key, info, self.tiers)
            if tier is not None:
                return tier
            with self._lock:  # no tier had room: hinted readers may have consumed copies to drop
                if attempt or key not in self._hinted_pos or not self._make_room_locked(info.size):
                    break
        with self._lock:
            self.failures["no_room"] += 1
            self._no_room.add(key)
        return None

    def _from_peer(self, key: str, info) -> tuple[Tier | None, str]:
        if self.peer_area is None:
            return None, "peer_area_unusable"
        why = self.peers.available(key)
        if why is not None:
            return None, why
        try:
            tier = self._copy_into(self.peers, key, info, self._peer_places())
        except PeerError:
            return None, "peer_failed"
        except (OSError, SourceChanged) as e:
            log.warning("writing %s into the peer area failed: %s", key, e)
            return None, "peer_area_error"
        return (tier, "fetched") if tier is not None else (None, "peer_area_full")

    def _peer_places(self) -> list[Tier]:
        """Where a copy from a peer may go (a replicated cluster, issue 20): the peer area, then
        the tiers (room this node's own share left: every node holds the whole dataset)."""
        return [self.peer_area, *self.tiers]

    def _peer_fits(self, size: int) -> bool:
        return any(t.fits(size) for t in self._peer_places())

    def _copy_into(self, source: Source, key: str, info, tiers: list[Tier]) -> Tier | None:
        """Copy ``key`` from ``source`` into the first of ``tiers`` with room (None: none had).

        A tier that compresses (``tier.codec``) needs the file's bytes in memory: they are
        read from the source once, into a buffer, and every later tier tried is written from
        that buffer (never a second read). What a copy takes in the tier is its stored size."""
        tally = _SourceTally(self, source.name)
        if source is self.pfs:
            stream = lambda fd: self._read_pfs(key, fd)  # noqa: E731
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
                expected = tier.codec.estimate(info.size)
                if not tier.reserve(expected):
                    continue
                try:
                    if held is None:
                        buf = io.BytesIO()
                        self._read_pfs(key, buf)
                        held = buf.getbuffer()
                    frame = codec.encode(held)  # None: it does not shrink enough, kept raw
                except BaseException:
                    tier.release(expected)
                    raise
                stored = len(frame) if frame is not None else info.size
                if stored <= expected:
                    tier.release(expected - stored)
                elif not tier.reserve(stored - expected):
                    tier.release(expected)
                    continue  # the bytes are held: the next tier takes them without a second read
            else:
                stored = info.size
                if tier is self.tiers[0] and not tier.fits(stored):
                    self.reclaim_front_door_lease()  # the room lent to the door comes back first
                if not tier.reserve(stored):
                    continue
            data = frame if frame is not None else held
            fill = stream if data is None else (lambda fd, data=data: write_all(fd, data))
            dest = tier.compressed_path_for(key) if frame is not None else tier.path_for(key)
            try:
                n = write_atomically(dest, fill, info.mtime_ns, owner_only(info.mode),
                                     publish=lambda tmp, d, t=tier, z=frame is not None: self._publish(key, t, tmp, d, z),
                                     root=tier.path)
            except OSError as e:
                tier.release(stored)
                if e.errno in NO_SPACE:
                    tier.mark_full(f"{errno.errorcode.get(e.errno, e.errno)} after {tier.used} bytes")
                    log.warning("tier %s is full (%s); staging goes to the next tier", tier.name, e.strerror)
                    continue
                raise
            except BaseException:
                tier.release(stored)
                raise
            with self._lock:
                self.bytes_staged += info.size if frame is not None else n
                self.files_staged += 1
            return tier
        return None

    def _read_pfs(self, key: str, out: int) -> int:
        """Copy ``key`` from the PFS into ``out``, counted (the one seam tests wrap)."""
        return self.pfs.copy(key, self.snapshot.files[key], out, _SourceTally(self, "pfs"))

    def _give_up(self, key: str, reason: str) -> None:
        with self._lock:
            self.failures[reason] += 1
            self._unstageable.add(key)
        return None

    def _publish(self, key: str, tier: Tier, tmp: str, dest: str, compressed: bool = False) -> None:
        with self._lock:  # invalidate() holds it too: a copy never appears after a write
            if self._closed:  # nor after shutdown(): the tier's directory is about to go
                raise Closed()
            if self._is_dirty(key):
                raise Invalidated(key)
            os.replace(tmp, dest)
            tier.committed(self.snapshot.files[key].size, os.stat(dest).st_size, key, compressed)
            self.staged[key] = tier
            if self.door is not None:
                self._tell_door_locked(key, tier)

    # -- the front door (monarch.frontdoor) -------------------------------------------------------
    def use_front_door(self, door, may_copy: bool) -> None:
        """Keep ``door`` told of every copy made or dropped here, and claim every key before
        copying it (a file is never copied twice). With ``may_copy`` the door copies small
        files itself while the PFS is fast, into the first tier, within room lent to it."""
        with self._lock:
            self.door = door
            self._door_may_copy = (may_copy and self.peers is None and bool(self.tiers)
                                   and self.tiers[0].codec is None and door.copy_slot == self.tiers[0].slot)
            for key, tier in self.staged.items():
                self._tell_door_locked(key, tier)
            for key in self._flights:  # copies under way are this stager's
                door.claim(key)
            if self._dirty:
                door.disable()
            self._tend_door_locked()

    def _tell_door_locked(self, key: str, tier: Tier) -> None:
        if tier.is_compressed(key):
            self.door.forget(key)  # a compressed copy is answered by Python (decoded or a memfd)
        else:
            self.door.staged(key, tier.slot)

    def absorb_front_door(self) -> int:
        """Enter what the door copied into the books, lend it room. Returns how many files
        it staged."""
        door = self.door
        if door is None:
            return 0
        staged = 0
        with self._lock:  # drained under the lock: a claim that finds a copy of the door's finds it here
            for ev in door.events():
                if ev.kind == EV_SLOW:
                    log.info("the PFS is slow for the front door (a copy's read took %.1f ms): its misses go "
                             "to the staging threads for a while", ev.seconds * 1e3)
                    continue
                self.files_read["pfs"] += ev.kind == EV_STAGED or ev.bytes_read > 0
                self.bytes_read["pfs"] += ev.bytes_read
                if ev.kind == EV_STAGED:
                    tier = next(t for t in self.tiers if t.slot == ev.slot)
                    tier.committed(ev.size, ev.size, ev.key)
                    self.staged[ev.key] = tier
                    self.bytes_staged += ev.size
                    self.files_staged += 1
                    self.demand_copies += 1
                    staged += 1
            self._tend_door_locked()
        return staged

    def _tend_door_locked(self) -> None:
        allowed = (self._door_may_copy and not self._dirty and not self._closed
                   and self.tiers[0].full_reason is None)  # a full filesystem: the stager finds out
        self.door.copying(allowed)  # whether the PFS is fast enough for it, the door finds out itself
        if not allowed:
            self.reclaim_front_door_lease()
        else:
            tier = self.tiers[0]
            chunk = max(INLINE_BYTES, min(DOOR_LEASE_MAX, tier.capacity // DOOR_LEASE_SHARE))
            if self.door.lease() < chunk // 2 and tier.reserve(chunk, counted=False):
                self.door.grant(chunk)

    def reclaim_front_door_lease(self) -> bool:
        """Give the door's unused room back to its tier: for a true report, and whenever
        the stager finds no room (the next ``absorb_front_door`` lends again what is free).
        True if there was some."""
        if self.door is None or not self._door_may_copy:
            return False
        left = self.door.reclaim()
        if left:
            self.tiers[0].release(left)
        return left > 0

    # -- state ---------------------------------------------------------------------------------
    def in_flight(self) -> int:
        with self._lock:
            return len(self._flights)

    def idle(self) -> bool:
        """Nothing queued or running, nothing left to read ahead, every hinted order done or
        waiting for its reader (for tests and benchmarks)."""
        with self._lock:
            return not self._flights and self._ahead is None and all(
                o.cursor >= len(o.keys) or o.blocked for o in self._orders.values())

    def shutdown(self) -> None:
        """Stop: nothing new starts, queued copies are cancelled, copies under way stop at
        their next read and publish nothing. Returns at once: ``drain`` waits for them."""
        with self._lock:
            self._closed = True
            flights = [f for f in self._flights.values() if not f.running]
            self._flights = {k: f for k, f in self._flights.items() if f.running}
            self._demand.clear()
            self._feed.clear()
            self._ahead = None
            self._cv.notify_all()
        for f in flights:
            f.future.cancel()
        self.pfs.close()

    def drain(self, timeout: float | None = None) -> bool:
        """After ``shutdown``: wait until no copy is under way (on a staging thread, inline
        in an asker, or the ranges of a large file), so that the tiers' directories can be
        removed with nothing writing into them. False if some were still running at
        ``timeout`` (a PFS read that does not return)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def stats(self) -> dict:
        with self._lock:
            return {"files": self.files_staged, "bytes": self.bytes_staged,
                    "pfs_files_read": self.files_read["pfs"], "pfs_bytes_read": self.bytes_read["pfs"],
                    "peer_files_read": self.files_read["peer"], "peer_bytes_read": self.bytes_read["peer"],
                    "demand_copies": self.demand_copies, "background_copies": self.background_copies,
                    "dropped": self.files_dropped, "concurrency": self.concurrency.limit,
                    "failures": dict(self.failures)}
