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

from monarch import layout, protocol
from monarch.config import Config, TierConfig
from monarch.errors import MonarchError, PeerError
from monarch.report import size_classes
from monarch.resources import margin_bytes
from monarch.secure import owner_only
from monarch.snapshot import Snapshot, take_snapshot
from monarch.stager import Invalidated, Stager
from monarch.tiers import Tier, write_atomically
from monarch.timeline import Sampler, Timeline

log = logging.getLogger(__name__)

PFS = (protocol.SLOT_PFS, "")


class NodeDaemon:
    def __init__(self, config: Config, run_id: str, cluster=None, node: int = 0):
        self.config = config
        self.run_id = run_id
        self.cluster = cluster
        self.node = cluster.node if cluster is not None else node
        self.started = time.time()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._peer_flights: dict[str, concurrent.futures.Future] = {}
        self._peer_files: set[str] = set()
        self._down_peers: set[int] = set()  # timed out once: not waited for again this job
        self._validated: set[str] = set()  # staging.validate: open — keys checked against the PFS
        self.peer_bytes_received = 0
        self.snapshot_seconds = 0.0
        self.run_dir = layout.run_dir(config.run_dir, run_id, self.node)
        layout.write_marker(self.run_dir, run_id)
        protocol.create_counters(self.counters_path)
        self.tier_errors: dict[str, str] = {}
        self.memory_margin = margin_bytes(config.memory_margin, config.memory_margin_share)
        roots = config.dataset.roots
        self.tiers = [t for t in (self._make_tier(cfg, protocol.tier_slot(i)) for i, cfg in enumerate(config.tiers))
                      if t is not None]
        self.snapshot = self._take_snapshot()
        self.snapshot.write_index(self.index_path)
        self.dataset_bytes = self.snapshot.total_bytes  # a sum over every file: once, not per REPORT
        self.stager = Stager(self.snapshot, self.tiers, config.staging.threads)
        for tier in self.tiers:
            if tier.keep:
                for key in tier.adopt_existing(self.snapshot.files):
                    self.stager.adopt(key, tier)
        self.peer_area = None
        if cluster is not None:
            self.peer_area = self._make_tier(TierConfig("peer", config.peer.path, config.peer.capacity),
                                             protocol.SLOT_PEER)
            cluster.peer_timeout = config.peer.timeout
            cluster.start(self.provide)
        self.timeline = Timeline(time.time())
        self._sampler = Sampler(self.timeline, self._counters_now).start()
        if config.staging.policy == "prestage":
            self.stager.prestage(k for k in sorted(self.snapshot.files) if self.owns(k))

    # -- where things are --------------------------------------------------------------
    @property
    def socket_path(self) -> str:
        return os.path.join(self.run_dir, "daemon.sock")

    @property
    def counters_path(self) -> str:
        return os.path.join(self.run_dir, "counters")

    @property
    def index_path(self) -> str:
        return os.path.join(self.run_dir, "index")

    def _make_tier(self, cfg: TierConfig, slot: int) -> Tier | None:
        """A tier that cannot be made is skipped with one line saying why; the others serve."""
        try:
            return Tier.from_config(cfg, slot, self.run_id, self.node, self.config.dataset.roots,
                                    memory_margin=self.memory_margin)
        except (MonarchError, OSError) as e:
            reason = str(e) if isinstance(e, MonarchError) else f"{cfg.path}: {e.strerror}"
            self.tier_errors[cfg.name] = reason
            log.warning("tier %s is not used: %s", cfg.name, reason)
            return None

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
    def resolve_now(self, key: str) -> tuple[int, str] | None:
        """The answer when it needs no waiting (the event loop answers these itself), else None."""
        info = self.snapshot.get(key)
        if info is None:
            answer, outcome = PFS, "pfs:not_in_snapshot"
        elif self.config.staging.validate == "open" and key not in self._validated:
            return None
        elif (tier := self.stager.where(key)) is not None:
            answer, outcome = (tier.slot, tier.path_for(key)), "already_staged"
        elif key in self._peer_files:
            answer, outcome = (protocol.SLOT_PEER, self.peer_area.path_for(key)), "already_fetched"
        else:
            return None
        with self._lock:
            self.outcomes[outcome] += 1
        return answer

    def resolve(self, key: str) -> tuple[int, str]:
        """Where the shim should open ``key``: ``(slot, path)``, or ``PFS``."""
        answer, outcome = self._resolve(key)
        with self._lock:
            self.outcomes[outcome] += 1
        return answer

    def _resolve(self, key: str) -> tuple[tuple[int, str], str]:
        info = self.snapshot.get(key)
        if info is None:
            return PFS, "pfs:not_in_snapshot"
        if self.config.staging.validate == "open" and key not in self._validated and not self._still_same(key, info):
            return PFS, "pfs:changed_since_snapshot"
        tier = self.stager.where(key)
        if tier is not None:
            return (tier.slot, tier.path_for(key)), "already_staged"
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

    def _still_same(self, key: str, info) -> bool:
        """staging.validate: open — the first open of a file in the job compares the PFS's
        size and mtime with the snapshot; a changed file is never served from a copy."""
        try:
            same = info.same_content_as(os.stat(self.snapshot.source_path(key)))
        except OSError:
            same = False
        if same:
            with self._lock:
                self._validated.add(key)
        else:
            self.stager.mark_changed(key)
        return same

    def invalidate(self, key: str) -> None:
        """The job writes to ``key`` (file or directory): its copies on this node go now."""
        self.stager.invalidate(key)
        if self.peer_area is not None:
            prefix = key.rstrip("/") + "/"
            with self._lock:
                gone = [k for k in self._peer_files if k == key or k.startswith(prefix)]
                for k in gone:
                    self._peer_files.discard(k)
                    try:
                        os.unlink(self.peer_area.path_for(k))
                    except OSError:
                        pass
        with self._lock:
            self.outcomes["invalidated"] += 1

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
        if self.peer_area is None:
            return PFS, "peer_area_unusable"
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
            n = write_atomically(path, lambda fd: self.cluster.fetch(owner, key, fd), info.mtime_ns,
                                 owner_only(info.mode), publish=lambda tmp, dest: self._publish_peer(key, tmp, dest))
        except PeerError as e:
            self.peer_area.release(info.size)
            if time.monotonic() - t0 >= self.config.peer.timeout:
                with self._lock:
                    self._down_peers.add(owner)
                log.warning("node %d timed out: its files are staged locally from now on (%s)", owner, e)
            else:
                log.warning("fetching %s from node %d failed: %s", key, owner, e)
            return "peer_failed"
        except (OSError, Invalidated) as e:
            self.peer_area.release(info.size)
            log.warning("writing %s into the peer area failed: %s", key, e)
            return "peer_area_error"
        self.peer_area.committed()
        with self._lock:
            self._peer_files.add(key)
            self.peer_bytes_received += n
        return "fetched"

    def _publish_peer(self, key: str, tmp: str, dest: str) -> None:
        with self.stager._lock:
            if self.stager._is_dirty(key):
                raise Invalidated(key)
            os.replace(tmp, dest)

    # -- statistics and shutdown ---------------------------------------------------------
    def _source_names(self) -> dict[int, str]:
        names = {protocol.SLOT_PFS: "pfs"} | {t.slot: t.name for t in self.tiers}  # a skipped tier keeps its slot
        if self.cluster is not None:
            names[protocol.SLOT_PEER] = "peer"
        return names

    def _counters_now(self) -> tuple[dict[str, int], dict[str, int]]:
        """The timeline's sample: cumulative counters and the tiers' levels."""
        counters = {}
        for name, c in protocol.read_sources(self.counters_path, self._source_names()).items():
            counters[f"opens.{name}"] = c["opens"]
            counters[f"bytes.{name}"] = c["bytes"]
        s = self.stager.stats()
        counters |= {"staged_files": s["files"], "staged_bytes": s["bytes"], "pfs_staging_bytes": s["pfs_bytes_read"]}
        if self.cluster is not None:
            counters["peer_bytes_received"] = self.peer_bytes_received
        tiers = self.tiers + ([self.peer_area] if self.peer_area is not None else [])
        return counters, {t.name: t.used for t in tiers}

    def stats(self, brief: bool = False) -> dict:
        """This node's numbers (the report module turns them into the report). ``brief`` (the
        launcher's progress polls) leaves out the timeline and the size classes, whose cost
        grows with the job's length and the dataset's size."""
        sources = protocol.read_sources(self.counters_path, self._source_names())
        with self._lock:
            outcomes = dict(self.outcomes)
        extra = {}
        if not brief:
            self._sampler.sample()  # the last, partial interval
            extra = {"timeline": self.timeline.to_dict(),
                     "size_classes": size_classes(self.snapshot.files, self.stager.staged.copy(),
                                                  set(self._peer_files))}
        return extra | {
            "node": self.node, "host": socket.gethostname(),
            "uptime_seconds": round(time.time() - self.started, 3),
            "snapshot_seconds": round(self.snapshot_seconds, 3),
            "sources": sources,
            "staging": self.stager.stats() | {"policy": self.config.staging.policy, "in_flight": self.stager.in_flight()},
            "tiers": [t.describe() for t in self.tiers] + ([self.peer_area.describe()] if self.peer_area else []),
            "tier_errors": dict(self.tier_errors),
            "resolves": outcomes,
            "peer": self.cluster.counters() if self.cluster is not None else {},
            "dataset": {"files": len(self.snapshot.files), "bytes": self.dataset_bytes},
        }

    def client_env(self) -> dict[str, str]:
        """What the shim in the application needs (the launcher exports exactly these keys)."""
        probe = [(t.slot, t.path) for t in self.tiers]
        if self.peer_area is not None:
            probe.append((protocol.SLOT_PEER, self.peer_area.path))
        env = {
            protocol.ENV_ROOTS: protocol.format_roots(self.config.dataset.spellings()),
            protocol.ENV_PROBE: protocol.format_probe(probe),
            protocol.ENV_SOCKET: self.socket_path,
            protocol.ENV_COUNTERS: self.counters_path,
            protocol.ENV_INDEX: self.index_path,
        }
        if self.config.staging.validate == "open":
            env[protocol.ENV_ASK_FIRST] = "1"  # every open asks the daemon, which checks the PFS once per file
        return env

    def describe(self) -> dict:
        """Who this daemon is, for a launcher deciding whether to attach."""
        return {"run": self.run_id, "node": self.node, "roots": list(self.config.dataset.roots),
                "config": self.config.source, "pid": os.getpid()}

    def close(self) -> None:
        """Stop staging and remove what the run asked not to keep. The run directory keeps
        the daemon's log and the report; the index (as large as the dataset's names) goes."""
        self._sampler.stop()
        self.stager.shutdown()
        try:
            os.unlink(self.index_path)
        except OSError:
            pass
        for tier in self.tiers:
            tier.remove()
        if self.peer_area is not None:
            self.peer_area.remove()
