"""The peer area as an evicting cache of other nodes' files (a sharded cluster).

When the dataset is sharded over the nodes (``monarch/cluster/capacity.py``), each file has
one owner that keeps it pinned in its tiers; another node that opens it gets it from the
owner, NEVER from the PFS while the owner has it:

* into the peer area, when there is room or room can be made by evicting the least
  recently used copies (LRU; a copy published less than ``GRACE`` seconds ago is not
  evicted: the application it was answered to may not have opened it yet);
* else into a transient copy: a sealed memfd filled from the owner, answered with
  ``ANSWER_FD`` (one open file description per waiter), gone once the application closes it.

Only when the owner cannot help (down, refuses, fails) is the open answered "read the PFS"
(fail open), counted by reason. One fetch per key at a time: concurrent opens of a key wait
for the same one.

The mechanisms are the stager's, on books of the cache's own (``StagerBooks`` with the peer
area as its one place): one flight per key in the books' table, room reserved through the
books (which drop what the ``LeastRecentlyUsed`` policy names when the area is full), the
copy written under a temporary name and published by the ``Copier``'s rename under the
books' lock, every byte counted by source (``SourceTally``). What is the cache's own: the
eviction policy, the transient copy, and the answers.
"""

from __future__ import annotations

import collections
import itertools
import concurrent.futures
import fcntl
import logging
import os
import time
from typing import Callable

from monarch import protocol
from monarch.errors import FailureReason, PeerError
from monarch.node.tiers.codecs import SEALS
from monarch.node.stage.concurrency import Concurrency
from monarch.node.outcomes import Outcome
from monarch.node.snapshot.snapshot import Snapshot
from monarch.node.stage.sources import PeerSource, SourceChanged
from monarch.node.stage.stager_books import Eviction, Flight, StagerBooks, StagerListener
from monarch.node.stage.stager_copy import Closed, Copier, SourceTally
from monarch.node.tiers.tiers import Tier

log = logging.getLogger(__name__)

GRACE = 0.5        # seconds a fresh copy is safe from eviction (the application it was answered to opens it first)
EVICT_TRIES = 16   # copies answered just now looked past for one eviction, the least recently used first
EVICT_SCAN = 512   # copies looked at for one eviction at most (young ones are passed over)
FETCH_THREADS = 32  # fetches from owners at once (each waits on the owner's staging at worst)

Answer = tuple[int, object]
Done = Callable[[Answer, Outcome], None]
PFS: Answer = (protocol.SLOT_PFS, "")


class LeastRecentlyUsed(StagerListener, Eviction):
    """The peer area's eviction policy: the least recently used copy goes first, never one
    published less than ``GRACE`` seconds ago. It keeps its order from the books' events
    (``published``, ``dropped``) and the cache's hits (``used_locked``), all under the books' lock."""

    def __init__(self, snapshot: Snapshot, counts: collections.Counter[str]):
        self.snapshot = snapshot
        self.counts = counts
        self.order: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()  # key: size, published
        self._may_evict: Callable[[str], bool] | None = None  # see ask_before_evicting

    def ask_before_evicting(self, may_evict: Callable[[str], bool] | None) -> None:
        """From now on a copy goes only if ``may_evict(key)`` (False: someone else answered it
        within GRACE, e.g. the front door, whose hits this order never sees: it counts as used);
        None: ask no one."""
        self._may_evict = may_evict

    def published(self, key: str, tier: Tier) -> None:
        self.order[key] = (self.snapshot.files[key].size, time.monotonic())

    def dropped(self, key: str) -> None:
        self.order.pop(key, None)

    def used_locked(self, key: str) -> None:
        self.order.move_to_end(key)

    def victim_locked(self, tier: Tier, size: int) -> str | None:
        """The least recently used copy not published within GRACE (a copy fetched ahead of a
        hinted order was answered to no one: published at 0, it may go before younger ones)."""
        if size > tier.capacity:
            return None
        now, answered, victim = time.monotonic(), [], None
        for key, (vsize, published) in itertools.islice(self.order.items(), EVICT_SCAN):
            if now - published < GRACE:
                continue
            if self._may_evict is None or self._may_evict(key):
                victim = key, (vsize, published)
                break
            answered.append(key)
            if len(answered) == EVICT_TRIES:
                break
        for key in answered:  # answered just now: used
            self.order.move_to_end(key)
        if victim is None:
            return None
        key, (vsize, _) = victim
        self.counts["evictions"] += 1
        self.counts["evicted_bytes"] += vsize
        return key  # the books drop it: an application that has it open keeps reading it


class PeerCache:
    def __init__(self, cluster, area: Tier | None, snapshot: Snapshot, threads: int = FETCH_THREADS):
        self.cluster = cluster
        self.area = area
        self.snapshot = snapshot
        self.books = StagerBooks(snapshot, [], Concurrency(fixed=threads), peer_area=area)
        self.source = PeerSource(cluster, None)  # a lost owner is the cluster's: its keys get a new one
        self.copier = Copier(self.books)
        self.counts: collections.Counter[str] = collections.Counter()
        self.failures: collections.Counter[str] = collections.Counter()
        self.lru = LeastRecentlyUsed(snapshot, self.counts)
        self.books.subscribe(self.lru)
        self.books.eviction = self.lru
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="monarch-peer-fetch")

    def ask_before_evicting(self, may_evict: Callable[[str], bool] | None) -> None:
        """See ``LeastRecentlyUsed.ask_before_evicting``."""
        self.lru.ask_before_evicting(may_evict)

    # -- asking --------------------------------------------------------------------------
    def where(self, key: str) -> str | None:
        """The path of ``key``'s cached copy (marked as used), or None."""
        with self.books.lock:
            return self._where_locked(key)

    def _where_locked(self, key: str) -> str | None:
        if key not in self.books.staged:
            return None
        self.lru.used_locked(key)
        self.counts["hits"] += 1
        return self.area.path_for(key)

    def resolve(self, key: str, done: Done) -> None:
        """Answer ``done(answer, outcome)`` with the owner's copy: cached, transient, or PFS."""
        books = self.books
        with books.lock:
            path = self._where_locked(key)
            closed, new = books.closed, False
            if path is None and not closed:
                flight = books.flights.get(key)
                if flight is None:
                    new = True
                    flight = books.flights[key] = Flight(peer_only=True)
                # in the table, so not yet resolved: the callback runs when it is, with every other waiter's
                flight.future.add_done_callback(lambda f: _answer(key, done, *f.result()))
        if path is not None:
            done((protocol.SLOT_PEER, path), Outcome.ALREADY_FETCHED)
        elif closed:
            done(PFS, Outcome.PFS_SHUTTING_DOWN)
        elif new:
            try:
                self._pool.submit(self._fetch, key, flight)
            except RuntimeError:  # closed
                self._land(key, flight, lambda: PFS, Outcome.PFS_SHUTTING_DOWN)

    # -- fetching ------------------------------------------------------------------------
    def _fetch(self, key: str, flight: Flight) -> None:
        with self.books.lock:
            if self.books.closed or self.books.flights.get(key) is not flight:  # close() answers it
                return
            flight.running = True
        if any([listener.claiming(key) for listener in self.books.listeners]):  # the front door fetched it first
            with self.books.lock:
                fetched = self.area is not None and self.books.staged.get(key) is self.area
            if fetched:
                dest = self.area.path_for(key)
                return self._land(key, flight, lambda: (protocol.SLOT_PEER, dest), Outcome.ALREADY_FETCHED)
        info = self.snapshot.files[key]
        owner = self.cluster.owner(key)
        mfd = None
        try:
            places = self.books.peer_places() if self.area is not None else []
            if self.copier.copy_into(self.source, key, info, places) is not None:  # room reserved or made
                with self.books.lock:
                    self.counts["fetched"] += 1
                    self.counts["fetched_bytes"] += info.size
                dest = self.area.path_for(key)
                make, outcome = (lambda: (protocol.SLOT_PEER, dest)), Outcome.FETCHED
            else:  # no room could be made
                mfd = self._transient(key, info)
                make, outcome = ((lambda: (protocol.SLOT_PEER | protocol.ANSWER_FD, _reopen(mfd))),
                                 Outcome.FETCHED_TRANSIENT)
        except Closed:
            make, outcome = (lambda: PFS), Outcome.PFS_SHUTTING_DOWN
        except (PeerError, SourceChanged) as e:  # SourceChanged: the owner sent another size than the snapshot's
            reason = e.reason if isinstance(e, PeerError) else FailureReason.CORRUPT
            with self.books.lock:
                self.failures[str(reason)] += 1
            log.info("fetching %s from node %d failed (%s): the application reads the PFS", key, owner, e)
            make, outcome = (lambda: PFS), Outcome.peer_failed(reason)
        except Exception as e:  # never fail the application: it reads the PFS
            with self.books.lock:
                self.failures["error"] += 1
            log.warning("fetching %s from node %d: %s: the application reads the PFS", key, owner, e)
            make, outcome = (lambda: PFS), Outcome.PFS_PEER_ERROR
        try:
            self._land(key, flight, make, outcome)
        finally:
            if mfd is not None:
                os.close(mfd)

    def _transient(self, key: str, info) -> int:
        """No room: a sealed memfd filled from the owner (each waiter gets its own open file description)."""
        mfd = os.memfd_create(os.path.basename(key)[:200], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            n = self.source.copy(key, info, mfd, SourceTally(self.books, self.source.name))
            fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, SEALS)
            os.lseek(mfd, 0, os.SEEK_SET)
        except BaseException:
            os.close(mfd)
            raise
        with self.books.lock:
            self.counts["transient"] += 1
            self.counts["transient_bytes"] += n
        return mfd

    def _land(self, key: str, flight: Flight, make: Callable[[], Answer], outcome: Outcome) -> None:
        """``flight`` ends: out of the table, then every waiter answered (``make()`` each);
        once (close() may have answered it)."""
        with self.books.lock:
            if self.books.flights.get(key) is not flight:
                return
            del self.books.flights[key]
        flight.future.set_result((make, outcome))

    # -- numbers and the end ---------------------------------------------------------------
    def stats(self) -> dict:
        with self.books.lock:
            return dict(self.counts) | {"cached_files": len(self.lru.order), "failures": dict(self.failures),
                                        "capacity": self.area.capacity if self.area is not None else 0}

    def close(self) -> None:
        """Stop: no new fetch; a fetch under way stops at its next read and publishes nothing;
        whoever waits for one not started yet reads the PFS."""
        with self.books.lock:
            self.books.closed = True
            queued = [(k, f) for k, f in self.books.flights.items() if not f.running]
        self._pool.shutdown(wait=False, cancel_futures=True)
        for key, flight in queued:
            self._land(key, flight, lambda: PFS, Outcome.PFS_SHUTTING_DOWN)


def _answer(key: str, done: Done, make: Callable[[], Answer], outcome: Outcome) -> None:
    try:
        answer = make()
    except OSError as e:
        log.warning("answering %s: %s: the application reads the PFS", key, e)
        answer, outcome = PFS, Outcome.PFS_PEER_ERROR
    try:
        done(answer, outcome)
    except Exception:
        log.exception("answering %s", key)


def _reopen(mfd: int) -> int:
    """A new open file description of the memfd (its own offset), read-only."""
    return os.open(f"/proc/self/fd/{mfd}", os.O_RDONLY | os.O_CLOEXEC)

