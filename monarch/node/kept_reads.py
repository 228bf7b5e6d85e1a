"""A restart's reads: a read-only open under the write-back paths of a file an earlier run published,
served from this node's kept copy, from another node's over the peer plane, or by the PFS
(docs/consistency.md, "Kept copies").

Each node keeps what its own drain published (``KeptWrites``) and, under ``fsync: partner``, what
its partner-of node published, from the copies it held for it (``partner_published``): so a node
replaced between two runs (its tier empty) finds its files on its partner. At a cluster's start the
nodes tell each other what they keep (``holdings``, ``learn``: one collective, ``ClusterRole``), and
those paths are marked for the shim, so that a read-only open of one asks the daemon. The daemon
answers with, in this order:

  tier      this node's kept copy, while the PFS file still has the identity it was kept with
  partner   the copy this node's partner keeps of it (it held it for this node), fetched over the
            peer plane into this node's store, then served from there
  peer      another node's kept copy (a file another rank wrote: a checkpoint every rank loads)
  PFS       nothing kept anywhere matches the PFS file now (changed, replaced, or dropped)

A peer's copy is fetched only where it was kept with the identity the PFS shows now (size, mtime,
ctime, inode: a change on the PFS moves the ctime, which no one can set back), and the fetched bytes
must be that size. Never old bytes; a failed fetch is the PFS's read, never the job's failure. The
figures count each source (files, bytes) and the PFS's seconds they saved, at the rate the drain met
on the PFS when the copy was kept.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from monarch.errors import PeerError
from monarch.writeback.kept import SAME_FILE, KeptWrites, pfs_identity

log = logging.getLogger(__name__)

KEY = "\0kept\0"           # a peer's request for a kept copy: KEY + PFS path + "\0" + its identity, joined by ":"
WAIT_FOR_HOLDINGS = 10.0   # an open at a cluster's start waits this long for the nodes' holdings at most
SOURCES = ("tier", "partner", "peer", "pfs")


def peer_key(path: str, same: tuple) -> str:
    return f"{KEY}{path}\0{':'.join(str(v) for v in same)}"


def parse_key(key: str) -> tuple[str, tuple] | None:
    """(path, identity) of a peer's request for a kept copy (None: not one)."""
    if not key.startswith(KEY):
        return None
    path, _, same = key[len(KEY):].rpartition("\0")
    try:
        return path, tuple(int(v) for v in same.split(":"))
    except ValueError:
        return None


class KeptReads:
    """This node's restart reads (``open``), its part in the cluster's kept copies (``holdings``,
    ``learn``, ``provide``) and its partner-of node's copies kept here (``partner_published``)."""

    def __init__(self, kept: KeptWrites, marks):
        self.kept, self._marks = kept, marks
        self._cluster = None
        self._node, self._nodes = 0, 1
        self._elsewhere: dict[str, list[tuple[int, tuple, float | None]]] = {}  # path -> (node, identity, rate)
        self._learnt = threading.Event()
        self._learnt.set()  # (a single node: nothing to learn)
        self._lock = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}
        self._partner_stores: dict[int, KeptWrites] = {}
        self._tell = None  # the peer plane's word of what is kept here (cluster.holdings.tell)
        self.figures = {**{f"restart_{s}_{k}": 0 for s in SOURCES for k in ("files", "bytes")},
                        "restart_fetch_seconds": 0.0, "restart_saved_seconds": 0.0}

    def across(self, cluster) -> None:
        """The nodes of ``cluster`` (the peer plane): their holdings learnt at its start (``learn``), and
        each copy kept later told as it is (``cluster.holdings``), both ways."""
        self._cluster, self._node, self._nodes = cluster, cluster.node, cluster.nodes
        if getattr(cluster, "collective", False):
            self._learnt.clear()
        news = getattr(cluster, "holdings", None)
        if news is not None:
            news.listen(self._heard)
            self.kept.tell_kept_to(news.tell)
            self._tell = news.tell

    # -- what the nodes keep (the collective at a cluster's start: ClusterRole) ----------------------
    def holdings(self) -> bytes:
        """What this node keeps, for the others: [[path, size, mtime_ns, ctime_ns, ino, rate], ...]."""
        rates = self.kept.rates()
        return json.dumps([[*h, rates.get(h[0])] for h in self.kept.holdings()]).encode()

    def learn(self, payloads: list[bytes] | None) -> None:
        """Every node's ``holdings`` (None: they could not be exchanged: only this node's copies serve)."""
        for node, payload in enumerate(payloads or []):
            if node == self._node:
                continue
            try:
                self._heard(node, json.loads(payload))
            except (ValueError, TypeError) as e:
                log.warning("kept copies: node %d's holdings are unreadable (%s): not read from there", node, e)
        self._learnt.set()

    def _heard(self, node: int, entries: list) -> None:
        """Node ``node`` keeps these copies ([path, size, mtime_ns, ctime_ns, ino, rate] each)."""
        for path, *same, rate in entries:
            if not (isinstance(path, str) and len(same) == len(SAME_FILE)):
                raise ValueError(f"not a kept copy: {[path, *same, rate]!r}")
            entry = (node, tuple(int(v) for v in same), rate if isinstance(rate, (int, float)) else None)
            with self._lock:
                first = path not in self._elsewhere
                self._elsewhere[path] = [e for e in self._elsewhere.get(path, []) if e[0] != node] + [entry]
            if first and self._marks is not None:
                self._marks.add(path)  # (its open asks the daemon: another node may serve it)

    # -- a read-only open on this node -------------------------------------------------------------
    def open(self, path: str) -> str | None:
        """The local path that serves a read-only open of ``path`` (None: read the PFS)."""
        now: dict | None | bool = False
        if self.kept.holds(path):
            now = pfs_identity(path)
            local = self.kept.lookup(path, now)
            if local is not None:
                self._count("tier", now["size"], self.kept.rate_of(path))
                return local
        if not self._learnt.is_set() and not self._learnt.wait(WAIT_FOR_HOLDINGS):
            log.warning("kept copies: the nodes' holdings not learnt in %gs: this node reads its own", WAIT_FOR_HOLDINGS)
            self._learnt.set()  # (once: a start that failed before the exchange is not waited for again)
        holders = self._elsewhere.get(path)
        if not holders:
            return self._read_from_pfs(now)
        if now is False:
            now = pfs_identity(path)
        if now is None:
            return None
        same = tuple(now[k] for k in SAME_FILE)
        with self._one_fetch(path):
            local = self.kept.lookup(path, now) if self.kept.holds(path) else None  # fetched meanwhile
            if local is not None:
                self._count("tier", now["size"], self.kept.rate_of(path))
                return local
            for node, rate in self._order(holders, same):
                local = self._fetch(node, path, now, same, rate)
                if local is not None:
                    return local
        return self._read_from_pfs(now)

    def _order(self, holders: list, same: tuple) -> list[tuple[int, float | None]]:
        """The nodes that keep ``path`` as the PFS has it now: this node's partner first (it holds what
        this node wrote), then the next ones around the ring (the askers of one file spread out)."""
        ring = [(n - self._node) % self._nodes for n in range(self._nodes)]
        found = sorted(((node, rate) for node, kept, rate in holders if kept == same), key=lambda h: ring[h[0]])
        return [h for h in found if not self._cluster.is_lost(h[0])] if self._cluster is not None else []

    def _fetch(self, node: int, path: str, now: dict, same: tuple, rate: float | None) -> str | None:
        started = time.monotonic()
        try:
            local = self.kept.adopt(path, now, lambda fd: self._cluster.fetch(node, peer_key(path, same), fd), rate)
        except (PeerError, OSError) as e:
            log.warning("kept copies: %s not fetched from node %d (%s): trying elsewhere, then the PFS", path, node, e)
            return None
        took = time.monotonic() - started
        with self._lock:
            self.figures["restart_fetch_seconds"] += took
        if local is None:
            return None
        self._count("partner" if node == (self._node + 1) % self._nodes else "peer", now["size"], rate, took)
        return local

    def _one_fetch(self, path: str) -> threading.Lock:
        """One fetch of ``path`` at a time on this node (the others then find it kept here)."""
        with self._lock:
            return self._fetching.setdefault(path, threading.Lock())

    def _count(self, source: str, size: int, rate: float | None, took: float = 0.0) -> None:
        with self._lock:
            self.figures[f"restart_{source}_files"] += 1
            self.figures[f"restart_{source}_bytes"] += size
            if rate:
                self.figures["restart_saved_seconds"] += max(0.0, size / rate - took)

    def _read_from_pfs(self, now: dict | None | bool) -> None:
        if isinstance(now, dict):  # (a file kept somewhere, changed since: the PFS's bytes)
            with self._lock:
                self.figures["restart_pfs_files"] += 1
                self.figures["restart_pfs_bytes"] += now["size"]
        return None

    # -- another node's request (the peer plane's provider) ----------------------------------------
    def provide(self, key: str) -> str | None:
        """The copy kept here that a peer asks for, if kept with the identity it names."""
        asked = parse_key(key)
        if asked is None:
            return None
        path, same = asked
        local = self.kept.answer(path, same)
        if local is None:
            for store in list(self._partner_stores.values()):
                local = store.answer(path, same)
                if local is not None:
                    break
        return local

    # -- the copies this node held for its partner-of node --------------------------------------------
    def partner_published(self, node: int, rec, held: str) -> None:
        """``node``'s drain applied ``rec`` (a close: its copy held here at ``held``; a rename, a
        removal): followed by a store of this node's for ``node``'s copies (the same kept-writes
        directory, its own order of records)."""
        store = self._partner_stores.get(node)
        if store is None:
            store = self._partner_stores[node] = KeptWrites(self.kept.base, self.kept.room, self.kept.linger,
                                                            self.kept.rate)
            store.mark_in(self._marks)
            if self._tell is not None:
                store.tell_kept_to(self._tell)
        store.follow(rec, held)

    def followed(self) -> None:
        for store in list(self._partner_stores.values()):
            store.followed(drained=True)

    def close(self) -> None:
        for store in list(self._partner_stores.values()):
            store.close()
