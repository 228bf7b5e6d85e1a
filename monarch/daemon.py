"""The node daemon: owns this node's tiers, snapshot, stager, peer area and statistics,
and answers the shim's ``resolve(key)``.

Single node it stages on access (or prestages); in a cluster it stages what this node
owns and fetches the rest from the owning peer into a bounded local peer area; when a
peer cannot help (dead, slow, full) the file is staged here from the PFS instead.
Every way it cannot help ends in the same answer: read the PFS (fail open), counted by why.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import socket
import threading
import time

from monarch import protocol
from monarch.config import Config
from monarch.errors import PeerError
from monarch.snapshot import Snapshot, take_snapshot
from monarch.stager import Stager
from monarch.tiers import Tier, write_atomically

log = logging.getLogger(__name__)

PFS = (protocol.SLOT_PFS, "")


class NodeDaemon:
    def __init__(self, config: Config, cluster=None, node: int = 0):
        self.config = config
        self.cluster = cluster
        self.node = cluster.node if cluster is not None else node
        self.started = time.time()
        self.tiers = [Tier.from_config(t, protocol.tier_slot(i)) for i, t in enumerate(config.tiers)]
        self.peer_area = Tier("peer", config.peer.path, config.peer.capacity, protocol.SLOT_PEER)
        self.outcomes: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._peer_flights: dict[str, concurrent.futures.Future] = {}
        self._peer_files: set[str] = set()
        self._down_peers: set[int] = set()  # timed out once: not waited for again this job
        self.peer_bytes_received = 0
        self.snapshot_seconds = 0.0
        os.makedirs(config.run_dir, exist_ok=True)
        protocol.create_counters(config.counters_path)
        for tier in self.tiers:
            tier.prepare()
        self.snapshot = self._take_snapshot()
        self.stager = Stager(self.snapshot, self.tiers, config.staging.threads)
        for tier in self.tiers:
            if tier.keep:
                for key in tier.adopt_existing(self.snapshot.files):
                    self.stager.adopt(key, tier)
        if cluster is not None:
            self.peer_area.prepare()
            cluster.peer_timeout = config.peer.timeout
            cluster.start(self.provide)
        if config.staging.policy == "prestage":
            self.stager.prestage(k for k in sorted(self.snapshot.files) if self.owns(k))

    def _take_snapshot(self) -> Snapshot:
        t0 = time.perf_counter()
        roots = self.config.dataset.roots
        snap = take_snapshot(roots) if self.cluster is None else self.cluster.share(lambda: take_snapshot(roots))
        self.snapshot_seconds = time.perf_counter() - t0
        log.info("snapshot: %d files, %d bytes in %.2fs", len(snap.files), snap.total_bytes, self.snapshot_seconds)
        return snap

    def owns(self, key: str) -> bool:
        return self.cluster is None or self.cluster.owner(key) == self.node

    # -- the shim's question -------------------------------------------------------
    def resolve(self, key: str) -> tuple[int, str]:
        """Where the shim should open ``key``: ``(slot, path)``, or ``PFS``."""
        answer, outcome = self._resolve(key)
        with self._lock:
            self.outcomes[outcome] += 1
        return answer

    def _resolve(self, key: str) -> tuple[tuple[int, str], str]:
        tier = self.stager.where(key)
        if tier is not None:
            return (tier.slot, tier.path_for(key)), "already_staged"
        if self.snapshot.get(key) is None:
            return PFS, "pfs:not_in_snapshot"
        if self.config.staging.policy == "off":
            return PFS, "pfs:policy_off"
        if not self.owns(key) and self.cluster.owner(key) not in self._down_peers:
            answer, outcome = self._from_peer(key)
            if answer != PFS:
                return answer, outcome
            with self._lock:  # the peer could not help: count why, then stage it here
                self.outcomes[outcome] += 1
        try:
            tier = self.stager.ensure(key).result(timeout=self.config.staging.resolve_timeout)
        except concurrent.futures.TimeoutError:
            return PFS, "pfs:timeout"
        except concurrent.futures.CancelledError:
            return PFS, "pfs:shutting_down"
        if tier is None:
            return PFS, "pfs:not_staged"
        return (tier.slot, tier.path_for(key)), "staged"

    def provide(self, key: str) -> str | None:
        """A peer asks for a key this node owns: the local path once staged, or None."""
        if self.snapshot.get(key) is None:
            return None
        try:
            tier = self.stager.ensure(key).result(timeout=self.config.staging.resolve_timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            return None
        return None if tier is None else tier.path_for(key)

    # -- the peer area ---------------------------------------------------------------
    def _from_peer(self, key: str) -> tuple[tuple[int, str], str]:
        path = self.peer_area.path_for(key)
        with self._lock:
            if key in self._peer_files:
                return (protocol.SLOT_PEER, path), "already_fetched"
            flight = self._peer_flights.get(key)
            leader = flight is None
            if leader:
                flight = self._peer_flights[key] = concurrent.futures.Future()
        if leader:
            flight.set_result(self._fetch(key, path))
            with self._lock:
                self._peer_flights.pop(key, None)
        try:
            outcome = flight.result(timeout=self.config.peer.timeout + self.config.staging.resolve_timeout)
        except concurrent.futures.TimeoutError:
            return PFS, "peer_timeout"
        return ((protocol.SLOT_PEER, path), "fetched") if outcome == "fetched" else (PFS, outcome)

    def _fetch(self, key: str, path: str) -> str:
        info = self.snapshot.get(key)
        if not self.peer_area.reserve(info.size):
            return "peer_area_full"
        owner = self.cluster.owner(key)
        t0 = time.monotonic()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            n = write_atomically(path, lambda tmp: self.cluster.fetch(owner, key, tmp), info.mtime_ns)
        except PeerError as e:
            self.peer_area.release(info.size)
            if time.monotonic() - t0 >= self.config.peer.timeout:
                with self._lock:
                    self._down_peers.add(owner)
                log.warning("node %d timed out: its files are staged locally from now on (%s)", owner, e)
            else:
                log.warning("fetching %s from node %d failed: %s", key, owner, e)
            return "peer_failed"
        except OSError as e:
            self.peer_area.release(info.size)
            log.warning("writing %s into the peer area failed: %s", key, e)
            return "peer_area_error"
        self.peer_area.committed()
        with self._lock:
            self._peer_files.add(key)
            self.peer_bytes_received += n
        return "fetched"

    # -- statistics and shutdown ---------------------------------------------------------
    def stats(self) -> dict:
        """This node's numbers (the report module turns them into the report)."""
        names = protocol.slot_names([t.name for t in self.tiers], with_peer=self.cluster is not None)
        sources = protocol.read_sources(self.config.counters_path, names)
        with self._lock:
            outcomes = dict(self.outcomes)
        return {
            "node": self.node, "host": socket.gethostname(),
            "uptime_seconds": round(time.time() - self.started, 3),
            "snapshot_seconds": round(self.snapshot_seconds, 3),
            "sources": sources,
            "staging": self.stager.stats() | {"policy": self.config.staging.policy, "in_flight": self.stager.in_flight()},
            "tiers": [t.describe() for t in self.tiers] + ([self.peer_area.describe()] if self.cluster else []),
            "resolves": outcomes,
            "peer": self.cluster.counters() if self.cluster is not None else {},
            "dataset": {"files": len(self.snapshot.files), "bytes": self.snapshot.total_bytes},
        }

    def client_env(self) -> dict[str, str]:
        """What the shim in the application needs (the launcher exports it)."""
        probe = [(t.slot, t.path) for t in self.tiers]
        if self.cluster is not None:
            probe.append((protocol.SLOT_PEER, self.peer_area.path))
        return {
            protocol.ENV_ROOTS: ":".join(self.config.dataset.roots),
            protocol.ENV_PROBE: ":".join(f"{slot}={path}" for slot, path in probe),
            protocol.ENV_SOCKET: self.config.socket_path,
            protocol.ENV_COUNTERS: self.config.counters_path,
        }

    def close(self) -> None:
        """Stop staging and remove what the job asked not to keep (the counters stay for the report)."""
        self.stager.shutdown()
        for tier in self.tiers:
            if not tier.keep:
                tier.remove()
        if self.cluster is not None:
            self.peer_area.remove()
