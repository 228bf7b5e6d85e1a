"""The stager: copies dataset files from their sources into the fastest tier with room, on threads of its own.

The public face of three rooms: its books (``stager_books.py``: which copy is where, what
is in flight, the counts, who listens), its scheduling (``stager_schedule.py``: demand
first, then order hints, then read-ahead) and its copying (``stager_copy.py``: from the
PFS or a peer into a tier, published atomically). Here: the asking (``ensure``, the
read-ahead, the hints), the job's writes, the staging threads, shutdown and the figures.

Concurrency toward the sources adapts to what they give (``Concurrency``): deep enough to
hide a high-latency PFS, no deeper than helps. One flight per file: concurrent requests
share one copy, and one already being copied is waited for, never read twice.

Correct bytes first: a key the job wrote to (``invalidate``) is never staged or served
again this run; a file that failed once is not retried on every open.

Whoever keeps books beside the stager's (the front door's link, ``door_link.py``)
subscribes to its events (``StagerListener``): the stager knows no listener by name.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Iterable

from monarch.node.stage.blocks import BlockStager
from monarch.node.stage.concurrency import Concurrency
from monarch.node.snapshot.snapshot import Snapshot
from monarch.node.stage.sources import PeerSource, Source, SourceChanged
from monarch.node.stage.stager_books import Flight, StagerBooks, StagerListener
from monarch.node.stage.stager_copy import Closed, Copier, Invalidated
from monarch.node.stage.stager_schedule import Schedule
from monarch.node.tiers.tiers import Tier
from monarch.routes import NodeFacts, Route, allows, copied_inline

log = logging.getLogger(__name__)

__all__ = ["Stager", "StagerListener", "SourceChanged", "Invalidated", "Closed"]

INLINE_SECONDS = 0.0005   # a PFS this fast (recent mean per copy) is copied by the asker itself (see ensure)


class Stager(StagerBooks):
    """One snapshot's stager: its books (inherited), a ``schedule`` and a ``copier`` working
    on them, and the staging threads that take the schedule's next key to the copier."""

    def __init__(self, snapshot: Snapshot, tiers: list[Tier], threads: int = 0, *,
                 peers: PeerSource | None = None, peer_area: Tier | None = None,
                 on_fallback: Callable[[str], None] | None = None, max_threads: int = 256,
                 start_depth: int | None = None, pfs_source: Callable[[Source], Source] | None = None,
                 cluster: bool = False, copies_misses: bool = True, door: bool = False,
                 store_roots: frozenset[int] = frozenset()):
        """``threads``: copies in flight at most (0: adaptive, up to ``max_threads``, from
        ``start_depth`` copies at first if given: a sharded node, whose share every node waits
        on, starts deep toward the PFS). ``peers``: keys another node owns are fetched from it
        into ``peer_area`` first (or from ``fetch_from_peers`` on); ``on_fallback(reason)`` is
        told each time that did not work and the PFS was used. ``pfs_source`` wraps the PFS
        source the copies read (a key-value store's roots: ``store_source.StoreSet``). ``cluster``:
        one of a cluster's daemons; ``copies_misses``: a miss is staged (the read-ahead mode's);
        ``door``: a front door may copy here; ``store_roots``: the roots that are a key-value
        store. Which route serves a file (blocks, a peer, a whole copy) is the route table's
        (``monarch/routes.py``), on these facts of the node, decided once per root and size
        (``routes``: what the daemon publishes in the index)."""
        node = NodeFacts(copies_misses=copies_misses, door=door, cluster=cluster, stores=pfs_source is not None,
                         raw_tier=any(t.codec is None for t in tiers))
        super().__init__(snapshot, tiers, Concurrency(fixed=threads or None, start=start_depth or Concurrency.START,
                                                      high=max_threads),
                         peers=peers, peer_area=peer_area, node=node, store_roots=store_roots)
        self.inline_seconds = INLINE_SECONDS
        self.schedule = Schedule(self)
        self.copier = Copier(self, self.schedule.room_for_hinted_locked, on_fallback, pfs_source)
        self.blocks = BlockStager(self, self.copier.pfs) if allows(Route.BLOCKS, node) else None
        self._workers: list[threading.Thread] = []
        self._idle = 0

    def fetch_from_peers(self, peers: PeerSource, peer_area: Tier | None) -> None:
        """From now on, keys another node owns are fetched from it (``peers``) into
        ``peer_area`` first (a replicating cluster, decided once the walk is done)."""
        with self.lock:
            self.peers, self.peer_area = peers, peer_area

    def adopt(self, key: str, tier: Tier) -> None:
        """A kept copy of ``key`` (validated) in ``tier``: staged, as if copied."""
        with self.lock:
            self.staged_locked(key, tier)

    def where(self, key: str) -> Tier | None:
        return self.staged.get(key)

    # -- asking ------------------------------------------------------------------------
    def ensure(self, key: str, inline: bool = False, now: bool = False) -> Future:
        """A future of the tier that holds ``key`` (None: it stays on the PFS). The key
        goes ahead of every background copy.

        ``inline``: the caller may copy it itself, before returning, when that is cheaper
        than handing it to a thread — a small file from a PFS whose recent copies took
        under INLINE_SECONDS (local disk, a warm cache). One slow copy raises the moving
        mean past that at once, and the copies go back to the threads.

        ``now``: the caller copies it itself whatever the slots (a peer waits for it: its
        copy must not queue behind this node's read-ahead, nor behind copies that wait on
        other nodes in turn, which could wait on this one); a copy already running is waited for."""
        with self.lock:
            tier = self.staged.get(key)
            if self.closed:  # shutting down: no new copy (what is staged may still be answered)
                return _done(tier)
            flight = self.flights.get(key)
            if flight is not None:
                if flight.running:
                    return flight.future
                if not now:
                    self.schedule.demand.append(key)  # queued in the background: promote it
                    self._wake_locked()
                    return flight.future
                # queued: taken over here (a worker skips a flight already running)
            elif tier is not None or key in self.unstageable or key in self.no_room or self.is_dirty(key):
                return _done(tier)  # no_room: counted when it first did not fit
            else:
                flight = self.flights[key] = Flight()
            if not now and not self._copy_inline_locked(key, inline):
                self.schedule.demand.append(key)
                self._wake_locked()
                return flight.future
            flight.running = True
            self.running += 1
            self.demand_copies += 1
        self._run(key, flight)
        return flight.future

    def _copy_inline_locked(self, key: str, inline: bool) -> bool:
        recent = self.concurrency.recent_seconds
        if not (inline and recent is not None and recent < self.inline_seconds and self.running < self.concurrency.limit):
            return False
        info = self.snapshot.files.get(key)  # a small file copied from here, by the asker: not another node's
        return info is not None and copied_inline(info.size) and self.route(key, info) not in (Route.PEER, Route.PEER_LANE)

    def read_ahead(self, keys: Iterable[str]) -> None:
        """Stage ``keys`` in the background, in this order, after demand and hints, while
        they fit (nothing is evicted for them)."""
        with self.lock:
            self.schedule.read_ahead_locked(keys)
            self._wake_locked()

    def keep_replicas(self, keys: Iterable[str], source: PeerSource) -> None:
        """Keep second copies of ``keys`` (other nodes' files, ``peer.replicas: 2``), copied from
        their owners through ``source`` into the tiers, never from the PFS: in the background,
        after this node's own share (once nothing else is copying), in the room it leaves;
        pinned like it. A key this node owns by then (its owner lost) is its own share."""
        with self.lock:
            self.replica_source = source
            self.schedule.replicas_locked(keys)
            self._wake_locked()

    def read_ahead_first(self, keys: Iterable[str]) -> None:
        """Stage ``keys`` in the background before anything else the read-ahead has queued
        (the compressing tiers' sample)."""
        with self.lock:
            self.schedule.feed.extendleft(reversed(list(keys)))
            self._wake_locked()

    def busy_keys(self) -> set[str]:
        """The keys staged or being copied now."""
        with self.lock:
            return set(self.staged) | set(self.flights)

    def read_ahead_more(self, keys: Iterable[str]) -> None:
        """Stage ``keys`` in the background as well, before the read-ahead's own order: the
        files of a walk still under way, as it finds them (what fits; nothing evicted)."""
        with self.lock:
            self.schedule.feed.extend(keys)
            self._wake_locked()

    # -- order hints -------------------------------------------------------------------------
    def hint_order(self, stream: int, keys: list[str], begin: bool) -> None:
        """Reader ``stream`` will read ``keys`` next, in this order (``begin``: a new epoch's
        order starts with them; else they extend the current one)."""
        with self.lock:
            self.schedule.hint_order_locked(stream, keys, begin)
            self._wake_locked()

    def hint_progress(self, stream: int, consumed: int) -> None:
        """Reader ``stream`` is done with the first ``consumed`` keys of its order."""
        with self.lock:
            if self.schedule.hint_progress_locked(stream, consumed):
                self._wake_locked()

    def hint_end(self, stream: int) -> None:
        """Reader ``stream`` has gone: its order no longer steers anything."""
        with self.lock:
            self.schedule.hint_end_locked(stream)

    # -- the job's writes ------------------------------------------------------------------
    def invalidate(self, key: str) -> int:
        """The job writes to ``key`` (a file, or a directory and all under it): drop its
        copies now and never stage it again this run. Returns how many copies went."""
        self.copier.pfs.forget(key)
        if self.blocks is not None:
            self.blocks.invalidate(key)
        for listener in list(self.listeners):  # nothing more copied elsewhere; what was is dropped below
            listener.written(key)
        with self.lock:
            self.dirty.add(key.rstrip("/"))
            gone = self.staged.keys_under(key)
            for k in gone:
                self.drop_locked(k)
        return len(gone)

    def mark_changed(self, key: str) -> None:
        """The source changed since the snapshot (found by a check at open): drop the copy."""
        self.invalidate(key)
        with self.lock:
            self.failures["changed_since_snapshot"] += 1

    # -- the workers ----------------------------------------------------------------------------
    def _wake_locked(self) -> None:
        if self.closed:
            return
        if self._idle == 0 and len(self._workers) < self.concurrency.limit:
            t = threading.Thread(target=self._work, name=f"monarch-stage-{len(self._workers)}", daemon=True)
            self._workers.append(t)
            t.start()
        else:
            self.cv.notify()

    def _work(self) -> None:
        with self.lock:
            while not self.closed:
                key, demanded = self.schedule.next_locked()
                if key is None:
                    self._idle += 1
                    self.cv.wait(1.0)
                    self._idle -= 1
                    continue
                if key == "":
                    continue  # scanned a stretch of read-ahead; let others in
                flight = self.flights[key]
                flight.running = True
                self.running += 1
                if demanded:
                    self.demand_copies += 1
                else:
                    self.background_copies += 1
                if self.schedule.has_work_locked():
                    self._wake_locked()  # more work: another worker (maybe a new one) looks
                self.lock.release()
                try:
                    self._run(key, flight)
                finally:
                    self.lock.acquire()

    def _run(self, key: str, flight: Flight) -> None:
        """Copy ``key`` (its flight already counted as running), then resolve its future."""
        t0 = time.monotonic()
        tier = None
        try:
            tier = self.copier.stage(key, flight.peer_only, flight.replica)
        finally:
            with self.lock:
                self.running -= 1
                if flight.replica and tier is not None and self.staged.get(key) is tier:
                    self.replicas.add(key)
                self.schedule.ended_locked(flight)
                if self.schedule.has_work_locked():
                    # a slot is free (this copy may have run on an asker's thread, which no worker
                    # waits for), a peer slot too, or second copies wait for quiet: a worker looks
                    self.cv.notify()
                self.flights.pop(key, None)
                self.concurrency.completed(time.monotonic() - t0)
                if self.closed and not self.running:
                    self.cv.notify_all()  # drain() waits for this
        flight.future.set_result(tier)  # callbacks run here, outside the lock

    # -- state ---------------------------------------------------------------------------------
    def in_flight(self) -> int:
        with self.lock:
            return len(self.flights)

    def idle(self) -> bool:
        """Nothing queued or running, nothing left to read ahead, every hinted order done or
        waiting for its reader (for tests and benchmarks)."""
        with self.lock:
            return not self.flights and self.schedule.idle_locked()

    def shutdown(self) -> None:
        """Stop: nothing new starts, queued copies are cancelled, copies under way stop at
        their next read and publish nothing. Returns at once: ``drain`` waits for them."""
        with self.lock:
            self.closed = True
            flights = [f for f in self.flights.values() if not f.running]
            self.flights = {k: f for k, f in self.flights.items() if f.running}
            self.schedule.clear_locked()
            self.cv.notify_all()
        for f in flights:
            f.future.cancel()
        if self.blocks is not None:
            self.blocks.stop()
        self.copier.pfs.close()

    def drain(self, timeout: float | None = None) -> bool:
        """After ``shutdown``: wait until no copy is under way (on a staging thread, inline
        in an asker, or the ranges of a large file), so that the tiers' directories can be
        removed with nothing writing into them. False if some were still running at
        ``timeout`` (a PFS read that does not return)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while self.running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cv.wait(left)
        if self.blocks is not None:
            return self.blocks.drain(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return True

    def replica_stats(self) -> dict:
        """The second copies kept (``keep_replicas``): files, bytes, and those not kept, by why."""
        with self.lock:
            files = self.snapshot.files
            return {"kept_files": len(self.replicas),
                    "kept_bytes": sum(files[k].size for k in self.replicas if k in files),
                    "no_room": self.schedule.replicas_no_room,
                    "failed": {k.partition(":")[2]: n for k, n in self.failures.items() if k.startswith("replica:")}}

    def stats(self) -> dict:
        with self.lock:
            return {"files": self.files_staged, "bytes": self.bytes_staged,
                    "pfs_files_read": self.files_read["pfs"], "pfs_bytes_read": self.bytes_read["pfs"],
                    "peer_files_read": self.files_read["peer"], "peer_bytes_read": self.bytes_read["peer"],
                    "demand_copies": self.demand_copies, "background_copies": self.background_copies,
                    "dropped": self.files_dropped, "concurrency": self.concurrency.limit,
                    "failures": dict(self.failures),
                    **({"blocks": self.blocks.stats_locked()} if self.blocks is not None and self.blocks.files else {})}


def _done(tier: Tier | None) -> Future:
    done: Future = Future()
    done.set_result(tier)
    return done
