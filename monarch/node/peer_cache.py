"""The peer area as an evicting cache of other nodes' files (a sharded cluster, issue 20).

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
"""

from __future__ import annotations

import collections
import concurrent.futures
import fcntl
import logging
import os
import threading
import time
from typing import Callable

from monarch import protocol
from monarch.node.codecs import SEALS
from monarch.errors import PeerError
from monarch.secure import owner_only
from monarch.node.snapshot import Snapshot
from monarch.node.tiers import Tier, write_atomically

log = logging.getLogger(__name__)

GRACE = 0.5        # seconds a fresh copy is safe from eviction (the application it was answered to opens it first)
FETCH_THREADS = 32  # fetches from owners at once (each waits on the owner's staging at worst)

Done = Callable[[tuple[int, object], str], None]


class PeerCache:
    def __init__(self, cluster, area: Tier | None, snapshot: Snapshot, threads: int = FETCH_THREADS):
        self.cluster = cluster
        self.area = area
        self.snapshot = snapshot
        self._lock = threading.Lock()
        self._lru: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()  # key -> (size, published)
        self._waiting: dict[str, list[Done]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="monarch-peer-fetch")
        self.counts: collections.Counter[str] = collections.Counter()
        self.failures: collections.Counter[str] = collections.Counter()
        self._closed = False

    # -- asking --------------------------------------------------------------------------
    def where(self, key: str) -> str | None:
        """The path of ``key``'s cached copy (marked as used), or None."""
        with self._lock:
            if key not in self._lru:
                return None
            self._lru.move_to_end(key)
            self.counts["hits"] += 1
        return self.area.path_for(key)

    def resolve(self, key: str, done: Done) -> None:
        """Answer ``done(answer, outcome)`` with the owner's copy: cached, transient, or PFS."""
        path = self.where(key)
        if path is not None:
            done((protocol.SLOT_PEER, path), "already_fetched")
            return
        with self._lock:
            waiters = self._waiting.get(key)
            if waiters is not None:
                waiters.append(done)
                return
            self._waiting[key] = [done]
        try:
            self._pool.submit(self._fetch, key)
        except RuntimeError:  # closed
            self._answer(key, lambda: (protocol.SLOT_PFS, ""), "pfs:shutting_down")

    # -- fetching ------------------------------------------------------------------------
    def _fetch(self, key: str) -> None:
        info = self.snapshot.files[key]
        owner = self.cluster.owner(key)
        try:
            if self.area is not None and self._make_room(info.size):
                self._into_area(key, info, owner)
            else:
                self._transient(key, info, owner)
        except PeerError as e:
            reason = _reason(e)
            with self._lock:
                self.failures[reason] += 1
            log.info("fetching %s from node %d failed (%s): the application reads the PFS", key, owner, e)
            self._answer(key, lambda: (protocol.SLOT_PFS, ""), f"pfs:peer_{reason}")
        except Exception as e:  # never fail the application: it reads the PFS
            with self._lock:
                self.failures["error"] += 1
            log.warning("fetching %s from node %d: %s: the application reads the PFS", key, owner, e)
            self._answer(key, lambda: (protocol.SLOT_PFS, ""), "pfs:peer_error")

    def _make_room(self, size: int) -> bool:
        """Reserve ``size`` bytes in the area, evicting least recently used copies older than GRACE."""
        area = self.area
        while not area.reserve(size, counted=False):
            with self._lock:
                victim = next(iter(self._lru.items()), None)
                if victim is None or time.monotonic() - victim[1][1] < GRACE or size > area.capacity:
                    return False
                key, (vsize, _) = victim
                del self._lru[key]
                self.counts["evictions"] += 1
                self.counts["evicted_bytes"] += vsize
            try:
                os.unlink(area.path_for(key))  # an application that has it open keeps reading it
            except OSError:
                pass
            area.release(vsize)
            area.forget(key, vsize, vsize)
        return True

    def _into_area(self, key: str, info, owner: int) -> None:
        area = self.area
        dest = area.path_for(key)
        try:
            n = write_atomically(dest, lambda fd: self.cluster.fetch(owner, key, fd), info.mtime_ns,
                                 owner_only(info.mode), root=area.path)
        except BaseException:
            area.release(info.size)
            raise
        if n != info.size:
            os.unlink(dest)
            area.release(info.size)
            raise PeerError(f"fetch {key!r}: node {owner} sent {n} bytes, the snapshot saw {info.size} (corrupt)")
        area.committed(info.size, info.size, key)
        with self._lock:
            self._lru[key] = (info.size, time.monotonic())
            self.counts["fetched"] += 1
            self.counts["fetched_bytes"] += n
        self._answer(key, lambda: (protocol.SLOT_PEER, dest), "fetched")

    def _transient(self, key: str, info, owner: int) -> None:
        """No room: a sealed memfd filled from the owner, one open file description per waiter."""
        mfd = os.memfd_create(os.path.basename(key)[:200], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            n = self.cluster.fetch(owner, key, mfd)
            if n != info.size:
                raise PeerError(f"fetch {key!r}: node {owner} sent {n} bytes, the snapshot saw {info.size} (corrupt)")
            fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, SEALS)
            os.lseek(mfd, 0, os.SEEK_SET)
            with self._lock:
                self.counts["transient"] += 1
                self.counts["transient_bytes"] += n
            self._answer(key, lambda: (protocol.SLOT_PEER | protocol.ANSWER_FD, _reopen(mfd)), "fetched:transient")
        finally:
            os.close(mfd)

    def _answer(self, key: str, make: Callable[[], tuple[int, object]], outcome: str) -> None:
        with self._lock:
            waiters = self._waiting.pop(key, [])
        for done in waiters:
            try:
                answer = make()
            except OSError as e:
                log.warning("answering %s: %s: the application reads the PFS", key, e)
                answer, outcome = (protocol.SLOT_PFS, ""), "pfs:peer_error"
            try:
                done(answer, outcome)
            except Exception:
                log.exception("answering %s", key)

    # -- numbers and the end ---------------------------------------------------------------
    def stats(self) -> dict:
        with self._lock:
            return dict(self.counts) | {"cached_files": len(self._lru), "failures": dict(self.failures),
                                        "capacity": self.area.capacity if self.area is not None else 0}

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)


def _reopen(mfd: int) -> int:
    """A new open file description of the memfd (its own offset), read-only."""
    return os.open(f"/proc/self/fd/{mfd}", os.O_RDONLY | os.O_CLOEXEC)


def _reason(error: PeerError) -> str:
    text = str(error)
    for reason in ("refused", "not answering", "did not send", "corrupt", "not running", "aborted"):
        if reason in text:
            return reason.replace(" ", "_")
    return "failed"
