"""The node daemon: owns this node's tiers, snapshot, stager, peer area and statistics,
and answers the shim's ``resolve(key)``.

Single node it reads the dataset ahead of the application (``read-ahead``: in the
background from the start, what the application waits for first) or stages on access;
in a cluster it stages what this node owns and fetches the rest from the owning peer
into a bounded local peer area; when a peer cannot help (dead, slow, full) the file is
staged here from the PFS instead. Every copy, from the PFS or a peer, goes through the
stager (``monarch/node/stager*.py``, ``monarch/node/sources.py``).
Every way it cannot help ends in the same answer: read the PFS (fail open), counted by why.
"""

from __future__ import annotations

import collections
import concurrent.futures
import gc
import itertools
import logging
import os
import socket
import threading
import time
import weakref

from monarch import frontdoor, layout, protocol
from monarch.config import Config, TierConfig
from monarch.errors import MonarchError, PeerError
from monarch.frontdoor import FrontDoor
from monarch.node.codecs import Compressed, needs_dictionary, spread
from monarch.node.door_link import DoorLink
from monarch.node.gate import SnapshotGate, SnapshotState
from monarch.node.instance import Instance
from monarch.node.resolver import Resolver
from monarch.node.resources import margin_bytes
from monarch.node.snapshot import Snapshot, load_or_walk
from monarch.node.sources import PeerSource
from monarch.node.stager import Stager
from monarch.node.stats import NodeStats, size_classes
from monarch.node.tiers import Tier
from monarch.secure import UnsafeBaseError, UnsafePathError, private_dir, user_dir, write_file_atomically
from monarch.report.timeline import Sampler, Timeline

log = logging.getLogger(__name__)

SHARD_START_DEPTH = 32  # a sharded node's first copies in flight toward the PFS (adapted from there)
# at close, copies under way stop at their next read (a chunk, a range: well under this);
# one that does not (a PFS read that never returns) is not waited for beyond it
CLOSE_DRAIN_SECONDS = 30.0



class NodeDaemon:
    """This node's daemon. Everything that needs the dataset snapshot -- the walk, the stager,
    kept copies' adoption, the read-ahead, the index the shim maps -- is made ready by
    ``_prepare``: inline in the constructor, or with ``background=True`` on a thread of its
    own, so that the socket answers (ATTACH) and the application starts while the walk
    runs. Until then (``state`` WALKING) the snapshot and stager are empty stand-ins:
    the server holds the requests that need them (server.py), INVALIDATE and HINT are
    recorded and applied, in order, before anything is served (``invalidate``, ``hint``)."""

    def __init__(self, config: Config, run_id: str, cluster=None, node: int = 0, background: bool = False):
        self.config = config
        self.run_id = run_id
        self.cluster = cluster
        self.node = cluster.node if cluster is not None else node
        self.started = time.time()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self.snapshot_seconds = 0.0
        self.snapshot_how = SnapshotState.WALKING.value
        self.snapshot_ready_at: float | None = None  # time.time() when the snapshot was ready (or failed)
        self.gate = SnapshotGate()
        self._meta_off_logged: set[str] = set()
        self._link_targets: dict[str, list[str]] | None = None  # see _links_into
        self._door: FrontDoor | None = None  # the server's C front door (make_front_door)
        self.door_link: DoorLink | None = None  # the door's books kept with the current stager's
        self._stagers: "weakref.WeakSet[Stager]" = weakref.WeakSet()  # every stager made: close() drains them
        self.run_dir = layout.run_dir(config.run_base, run_id, self.node)
        # the run directory is this instance's from here (a live one refused); a dead one's
        # index, counters and socket are gone before anything of this one is published
        self.instance = Instance(self.run_dir)
        layout.write_marker(self.run_dir, run_id, layout.KIND_RUN)
        layout.prune_finished_runs(os.path.dirname(self.run_dir), spare=self.run_dir)
        protocol.create_counters(self.counters_path)
        self.tier_errors: dict[str, str] = {}
        self.replica_served = {"files": 0, "bytes": 0}  # sent to peers from second copies after a loss
        self.memory_margin = margin_bytes(config.memory_margin, config.memory_margin_share)
        self.tiers = [t for t in (self._make_tier(cfg, protocol.tier_slot(i), f"tiers[{i}].path")
                                  for i, cfg in enumerate(config.tiers)) if t is not None]
        if config.staging.policy == "read-ahead":  # the read-ahead names the codecs' sample (_start_staging)
            for tier in self.tiers:
                if tier.codec is not None:
                    tier.codec.defer_sample()
        log.debug("phase tiers.ready")
        self.peer_area = None
        self._peers = None
        self.layout = None  # a cluster's layout (monarch/cluster/capacity.py), once the snapshot is shared
        self.peer_cache = None  # sharded: other nodes' files (monarch/node/peer_cache.py)
        if cluster is not None:
            self.peer_area = self._make_tier(TierConfig("peer", config.peer.path, config.peer.capacity,
                                                        capacity_share=config.peer.capacity_share),
                                             protocol.SLOT_PEER, "peer.path")
            cluster.peer_timeout = config.peer.timeout
            cluster.on_lost = self._note_loss
            self._peers = PeerSource(cluster, config.peer.timeout)
        self.snapshot = Snapshot(tuple(config.dataset.roots), {})  # nothing until the walk ends
        self.stager = self._make_stager(self.snapshot)
        self.dataset_bytes = 0
        self.resolver = Resolver(self)
        self.timeline = Timeline(time.time())
        self._sampler = Sampler(self.timeline, self._counters_now).start()
        if background:
            threading.Thread(target=self._prepare, name="monarch-snapshot", daemon=True).start()
        else:
            self._prepare()
        log.debug("phase daemon.ready")

    # -- the snapshot, and everything that needs it --------------------------------------
    def _make_stager(self, snapshot: Snapshot) -> Stager:
        """A stager on ``snapshot``, known to ``close`` (which stops and drains every one,
        the walk's streaming one included, before the tiers go). Sharded, it keeps this
        node's share; others' files go through the peer cache."""
        if self._sharded() or self._walking_cluster():  # its own share, from the PFS
            stager = Stager(snapshot, self.tiers, self.config.staging.threads, on_fallback=self.count)
            if not self.config.staging.threads:  # every node waits on this one's share: start deep toward the PFS
                stager.concurrency.limit = max(stager.concurrency.limit, SHARD_START_DEPTH)
        else:
            stager = Stager(snapshot, self.tiers, self.config.staging.threads, peers=self._peers,
                            peer_area=self.peer_area, on_fallback=self.count)
        with self._lock:
            self._stagers.add(stager)
            closing = self.gate.closing
        if closing:  # made after close() took its list: it never copies
            stager.shutdown()
        return stager

    # -- a cluster's layout (issue 20; see monarch/cluster/capacity.py) -----------------------
    def _sharded(self) -> bool:
        return self.layout is not None and self.layout.mode == "shard"

    def _walking_cluster(self) -> bool:
        """A real cluster (not a test's stand-in) whose layout is not decided yet."""
        return hasattr(self.cluster, "allgather_ints") and self.layout is None

    def _exchange_capacities(self) -> list[tuple[int, int]] | None:
        """Collective, before the walk: every node's (tiers' bytes, peer area's bytes); None
        when they could not be exchanged (files are then owned by rendezvous hashing)."""
        from monarch.cluster import capacity
        if not hasattr(self.cluster, "allgather_ints"):  # a stand-in peer layer (tests)
            return None
        tiers = sum(t.capacity for t in self.tiers)
        peer = self.peer_area.capacity if self.peer_area is not None else 0
        try:
            return capacity.exchange(self.cluster, tiers, peer)
        except PeerError as e:  # fail open: rendezvous ownership, the peer area a store, the PFS when full
            log.warning("the nodes' capacities were not exchanged (%s): files are owned by rendezvous hashing", e)
            return None

    def _plan_cluster(self, snap: Snapshot, capacities: list[tuple[int, int]] | None) -> None:
        """Once the snapshot is shared: decide replicate or shard, set the placement (the same
        on every node); sharded, the peer area becomes an evicting cache; replicating, the
        stager fetches other nodes' files from them."""
        from monarch.cluster import capacity
        from monarch.node.peer_cache import PeerCache
        if capacities is not None:
            self.layout = capacity.plan(self.cluster, snap.files, capacities)
        if self.layout is not None and self.layout.mode == "shard":
            self.cluster.serve_threads = max(self.cluster.serve_threads, 32)  # every other node asks this one
            self.peer_cache = PeerCache(self.cluster, self.peer_area, snap)

    # -- peer.replicas: 2 (issue 21) ---------------------------------------------------------
    def _keeps_replicas(self) -> bool:
        """Sharded with ``peer.replicas: 2`` and more than one node: each node keeps, in its
        tiers, a second copy of the files it would take over if their owner were lost."""
        return (self._sharded() and self.config.peer.replicas >= 2 and self.cluster.nodes > 1
                and self._peers is not None and bool(self.tiers))

    def _second_here(self, key: str) -> bool:
        """Is this node second in ``key``'s preference list (where its second copy lives)?"""
        return self.layout.placement.owners(key, 2)[1:] == [self.node]

    def _replica_stats(self) -> dict | None:
        if not self._keeps_replicas():
            return None
        with self._lock:
            served = dict(self.replica_served)
        return self.stager.replica_stats() | {"reowned_held": self.reowned_held, "served_after_loss": served}

    def _cluster_stats(self) -> dict:
        if self.layout is None:
            return {}
        staged = self.stager.staged.copy()
        mine = [k for k in staged if self.owns(k)]
        return {"mode": self.layout.mode, "why": self.layout.why, "owned_files": self.layout.owned["files"],
                "owned_bytes": self.layout.owned["bytes"], "owned_staged_files": len(mine),
                "owned_staged_bytes": sum(self.snapshot.files[k].size for k in mine if k in self.snapshot.files),
                "capacities": self.layout.capacities, "reowned_files": self.reowned_files,
                "replicas": self._replica_stats(),
                "peer_cache": self.peer_cache.stats() if self.peer_cache is not None else None}

    # -- the C front door (monarch.frontdoor), if the server has one ---------------------------
    def make_front_door(self, listen_fd: int) -> FrontDoor | None:
        """A front door on the socket's listener, attached to this daemon's stager (None
        without tiers, with ``staging.validate: open`` (every open is checked, in Python),
        or when it cannot start: the Python server answers everything)."""
        if (not self.tiers or self.config.staging.validate == "open" or not frontdoor.wanted()
                or frontdoor.library() is None):
            return None
        dirs = {t.slot: t.path for t in self.tiers}
        if self.peer_area is not None:
            dirs[protocol.SLOT_PEER] = self.peer_area.path
        try:
            door = FrontDoor(listen_fd, list(self.config.dataset.roots), dirs, self.tiers[0].slot)
        except OSError as e:
            log.warning("the daemon's C front door did not start (%s); the Python server answers every request", e)
            return None
        with self.gate.lock:  # the stager swapped in when the walk ends is linked there
            self._door = door
            self._link_door_locked()
        self.open_front_door()  # a snapshot ready already (made in the foreground)
        return door

    def _link_door_locked(self) -> None:
        """The door kept told of the current stager's copies, and its copies booked there
        (under the gate's lock, where the stager is swapped)."""
        may_copy = self.cluster is None and self.config.staging.policy != "off"
        self.door_link = DoorLink(self._door, self.stager, may_copy)

    def open_front_door(self) -> None:
        """The snapshot is ready: the door answers from now on (never before the index is)."""
        if self._door is not None and self.gate.state is SnapshotState.READY and not self._door.open(self.index_path):
            log.warning("the front door could not map the index %s; the Python server answers every request",
                        self.index_path)

    def absorb_front_door(self) -> None:
        """What the door copied, into the stager's books and the outcomes."""
        if self.door_link is not None:
            staged = self.door_link.absorb()
            if staged:
                with self._lock:
                    self.outcomes["staged"] += staged

    def _prepare(self) -> None:
        """Walk (or reuse) the snapshot, make the stager, adopt kept copies, apply the
        INVALIDATEs that came meanwhile, write the index, then start the read-ahead and
        apply the HINTs that came meanwhile. The index is written once every kept copy has
        been checked and every early INVALIDATE applied (later ones are applied by the
        stager as they come): a process that finds it may probe the tiers at once. Nothing
        is answered from the snapshot before it is settled (server.py holds OPEN and INDEX).
        Any failure ends in FAILED: no index, every open reads the PFS (fail open)."""
        log.debug("phase snapshot.start")
        stager = growing = None
        try:
            if self._streams_read_ahead():  # copies begin with the walk's first directories
                growing = Snapshot(tuple(self.config.dataset.roots), {})
                stager = self._make_stager(growing)
            snap = self._take_snapshot(growing, stager)
            log.debug("phase snapshot.done")
            if self.gate.closing:  # stopped during the walk: leave the kept copies as they are
                if stager is not None:
                    stager.shutdown()
                return
            if stager is not None and self.layout is not None and not self._sharded():  # replicating
                stager.peers, stager.peer_area = self._peers, self.peer_area
            if stager is None or snap.files is not growing.files:  # not streamed, or a kept snapshot reused
                if stager is not None:
                    stager.shutdown()
                stager = self._make_stager(snap)
            for tier in self.tiers:
                if tier.keep:
                    for key in tier.adopt_existing(snap.files):
                        stager.adopt(key, tier)
            index = snap.index_bytes()
            with self.gate.lock:
                if self.gate.closing:
                    stager.shutdown()
                    return
                for key in self.gate.release_writes_locked():  # written to before the index exists: never served
                    self._drop_copies(stager, snap, key)
                old, self.snapshot, self.stager = self.stager, snap, stager
                if self._door is not None:
                    self._link_door_locked()
                self.dataset_bytes = snap.total_bytes  # a sum over every file: once, not per REPORT
            old.shutdown()
            write_file_atomically(self.index_path, index)
            log.debug("phase index.written")
            # the snapshot's objects (millions for a large dataset) live as long as the job: out
            # of every later collection, which would otherwise walk them all with the GIL held
            # (0.23 s per full collection at 1M files, a stall of every open being answered)
            gc.freeze()
            self.gate.state = SnapshotState.READY
            self._start_staging()
        except Exception as e:  # fail open: the job runs, on the PFS
            self._fail(e, stager)
        finally:
            self.snapshot_ready_at = time.time()
            log.debug("phase snapshot.ready")
            self.gate.settle()

    def _start_staging(self) -> None:
        """The snapshot is ready: serve peers, read ahead, then the hints that came during
        the walk, in order (as if they had come after the read-ahead started, as before),
        those that come meanwhile after them. Nothing here can make the snapshot fail: a
        failure only costs the read-ahead."""
        try:
            if self.cluster is not None:
                self.cluster.start(self.provide)
            if self.config.staging.policy == "read-ahead":
                # this node's own files from the PFS first, then (replicated) the others' from their owners
                keys = sorted(self.snapshot.files)
                self._sample_for_codecs(keys)
                others = () if self._sharded() else (k for k in keys if not self.owns(k))
                self.stager.read_ahead(itertools.chain((k for k in keys if self.owns(k)), others))
                if self._keeps_replicas():  # then second copies of the files this node takes over on a loss
                    self.stager.keep_replicas((k for k in keys if self._second_here(k)), self._peers)
        except Exception:
            log.exception("starting the read-ahead failed; files are staged as they are opened")
        while batch := self.gate.next_hints():  # then hint() applies them itself
            for hint in batch:
                try:
                    self._apply_hint(*hint)
                except Exception:
                    log.exception("applying an order hint failed")

    def _fail(self, error: Exception, stager: Stager | None) -> None:
        why = str(error) if isinstance(error, MonarchError) else f"{type(error).__name__}: {error}"
        log.error("the dataset snapshot failed (%s); the application reads the PFS for this job", why,
                  exc_info=not isinstance(error, (MonarchError, OSError)))
        with self.gate.lock:
            if stager is not None and stager is not self.stager:
                stager.shutdown()
            self.gate.fail_locked()  # nothing will be staged
            self.snapshot_how = f"failed: {why}"
            self.snapshot = Snapshot(tuple(self.config.dataset.roots), {})
            self.stager.shutdown()
            self.stager = self._make_stager(self.snapshot)
            self.door_link = None  # the door never opens: nothing of it to book
            self.dataset_bytes = 0
        try:
            os.unlink(self.index_path)  # none, or one written before a later step failed
        except OSError:
            pass

    # -- where things are --------------------------------------------------------------
    # the files of this instance (monarch/node/instance.py): the socket launchers find by its
    # run's name; the instance's own socket name, counters and index, which the shim knows
    # only from the ATTACH answer's environment
    @property
    def socket_path(self) -> str:
        return self.instance.public_socket_path

    @property
    def counters_path(self) -> str:
        return self.instance.counters_path

    @property
    def index_path(self) -> str:
        return self.instance.index_path

    def _make_tier(self, cfg: TierConfig, slot: int, key: str) -> Tier | None:
        """A tier that cannot be made is skipped with one line saying why (``tier_errors``,
        which the launcher prints and the report shows); the others serve. ``key``: the
        configuration's key of its base, named when the base itself cannot be used."""
        try:
            return Tier.from_config(cfg, slot, self.run_id, self.node, self.config.dataset.roots,
                                    memory_margin=self.memory_margin, pfs_rate=self._pfs_rate,
                                    dataset_bytes=lambda: self.dataset_bytes)
        except (MonarchError, OSError) as e:
            if isinstance(e, UnsafeBaseError):
                reason = f"config {self.config.source}: {key}: {e}"
            else:
                reason = str(e) if isinstance(e, MonarchError) else f"{cfg.path}: {e.strerror}"
            self.tier_errors[cfg.name] = reason
            log.warning("tier %s is not used: %s", cfg.name, reason)
            return None

    def _snapshot_cache(self) -> str | None:
        """Where the last walk of this dataset is kept for the next job (the user's private
        ``snapshots`` directory under the run base, keyed by the dataset id), or None."""
        try:
            directory = private_dir(os.path.join(user_dir(self.config.run_base), "snapshots"))
            return os.path.join(directory, f"{layout.dataset_id(self.config.dataset.roots)}.index")
        except (UnsafePathError, OSError) as e:
            log.warning("the snapshot is not kept for the next job: %s", e)
            return None

    def _streams_read_ahead(self) -> bool:
        """May the read-ahead start on the walk's files as it finds them? Without a kept tier
        (its copies are adopted only once the walk is whole), with the read-ahead on, alone
        on the node or in a real cluster (node 0's walk streamed to every node, each staging
        what it will surely own: monarch/cluster/early.py). The copies made meanwhile are
        not served before the index exists (the shim waits for it)."""
        return ((self.cluster is None or hasattr(self.cluster, "allgather_ints"))
                and not any(t.keep for t in self.tiers) and self.config.staging.policy == "read-ahead")

    def _take_snapshot(self, into: Snapshot | None = None, stager: Stager | None = None) -> Snapshot:
        """One walk per job (node 0's, in a cluster), or the last job's snapshot when no
        directory changed since (snapshot.load_or_walk); ``staging.validate: open`` walks.
        A walk fills ``into`` (if given) and ``stager`` (if given) copies its files as the
        walk finds them (in a cluster, those this node will surely own)."""
        t0 = time.perf_counter()
        if self.cluster is None:
            on_directory = stager.read_ahead_more if stager is not None else None
            snap, self.snapshot_how = self._walk(into, on_directory)
        else:
            capacities = self._exchange_capacities()
            if into is not None and stager is not None:
                snap, self.snapshot_how = self._share_streamed(into, stager, capacities)
            else:
                snap, self.snapshot_how = self.cluster.share(self._walk)
                snap = snap.with_local_devices()
            self._plan_cluster(snap, capacities)
        self.snapshot_seconds = time.perf_counter() - t0
        log.info("snapshot (%s): %d files, %d directories, %d bytes in %.2fs", self.snapshot_how, len(snap.files),
                 len(snap.dirs), snap.total_bytes, self.snapshot_seconds)
        return snap

    def _walk(self, into: Snapshot | None = None, on_directory=None) -> tuple[Snapshot, str]:
        roots = self.config.dataset.roots
        return load_or_walk(roots, self._snapshot_cache(), self.config.staging.validate == "open", into, on_directory)

    def _share_streamed(self, growing: Snapshot, stager: Stager, capacities) -> tuple[Snapshot, str]:
        """Collective: node 0 walks into ``growing`` and streams the files it finds; every node
        keeps them in its ``growing`` and stages at once those it will surely own. Returns
        ``growing``, whole (the stager over it goes on after the walk)."""
        from monarch.cluster.early import EarlyShare
        early = EarlyShare(capacities, self.node) if capacities is not None else None

        def on_files(files: dict) -> None:  # every node, every file once, in walk order
            if self.node != 0:
                growing.files.update(files)
            if early is not None:
                stager.read_ahead_more(early.add([(key, info.size) for key, info in files.items()]))

        def take(publish) -> tuple[Snapshot, str]:  # node 0
            sent: set[str] = set()

            def on_directory(keys: list[str]) -> None:
                sent.update(keys)
                publish({key: growing.files[key] for key in keys})
            snap, how = self._walk(growing, on_directory)
            if snap.files is not growing.files:  # the last job's snapshot, reused whole
                growing.files.update(snap.files)
                growing.dirs.update(snap.dirs)
                growing.links.update(snap.links)
            publish({key: info for key, info in growing.files.items() if key not in sent})
            return Snapshot(growing.roots, {}, growing.dirs, growing.links), how  # the files went ahead

        rest, how = self.cluster.share(take, on_files=on_files)
        if self.node != 0:
            growing.dirs.update(rest.dirs)
            growing.links.update(rest.links)
        growing.localize_devices()
        return growing, how

    def _pfs_rate(self) -> float | None:
        """Bytes per second read from the PFS so far (a compressed tier's level must
        decompress well above it)."""
        stager = getattr(self, "stager", None)
        elapsed = time.time() - self.started
        return stager.bytes_read["pfs"] / elapsed if stager is not None and elapsed > 0 else None

    def _sample_for_codecs(self, keys: list[str]) -> None:
        """Compressing tiers choose their level on files spread over this node's share of the
        dataset, staged ahead of the rest of the read-ahead: the walk's first files are one
        directory's, which may compress unlike the others (docs/compression.md)."""
        codecs = [t.codec for t in self.tiers if t.codec is not None]
        if not codecs:
            return
        busy = self.stager.busy_keys()
        sample = spread(
            [k for k in keys if self.owns(k) and k not in busy and self.snapshot.files[k].size > 0],
            codecs[0].sample_files)
        for codec in codecs:
            codec.sample_from(sample)
        self.stager.read_ahead_first(sample)

    def owns(self, key: str) -> bool:
        return self.cluster is None or self.cluster.owner(key) == self.node

    # -- the shim's question -------------------------------------------------------
    def count(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    def invalidate(self, key: str) -> None:
        """The job writes to ``key`` (file or directory): its copies on this node go now. The
        shim has already turned the metadata of its root off (EXTRA_META_OFF): say so once.
        During the walk nothing is served yet: the key is dropped when the stager is made,
        before any copy of it could be served (see ``_prepare``)."""
        root = key.partition("/")[0]
        with self._lock:
            first = root not in self._meta_off_logged
            self._meta_off_logged.add(root)
        if first:
            log.info("root %s: stat and listings go to the PFS from now on (the job changed %s)", root, key)
        if not self.gate.hold_write(key):
            with self.gate.lock:
                stager, snap = self.stager, self.snapshot
            self._drop_copies(stager, snap, key)
        self.count("invalidated")

    def _drop_copies(self, stager: Stager, snap: Snapshot, key: str) -> None:
        """``key``'s copies go, and those of the links into it (they hold its old bytes)."""
        stager.invalidate(key)
        for link in self._links_into(snap, key):
            stager.invalidate(link)

    def _links_into(self, snap: Snapshot, key: str) -> list[str]:
        """The keys of symlinked files whose target is ``key`` or lies under it (a link is
        staged under its own name with its target's bytes). The targets are resolved once,
        at the job's first write under a root."""
        if self._link_targets is None:
            targets: dict[str, list[str]] = {}
            for k, info in snap.files.items():
                if info.link:
                    targets.setdefault(os.path.realpath(snap.source_path(k)), []).append(k)
            self._link_targets = targets
        if not self._link_targets:
            return []
        path = os.path.realpath(snap.source_path(key))
        return [k for target, keys in self._link_targets.items()
                if target == path or target.startswith(path + "/") for k in keys]

    def hint(self, body: bytes) -> None:
        """An order hint from ``monarch.hints`` (protocol.py, HINT); ProtocolError if malformed.
        During the walk it is kept, and applied in order once the snapshot is ready."""
        hint = protocol.decode_hint(body)
        if not self.gate.hold_hint(hint):
            self._apply_hint(*hint)
        self.count("hints")

    def _apply_hint(self, op: int, stream: int, keys) -> None:
        if op == protocol.HINT_ORDER or op == protocol.HINT_MORE:
            self.stager.hint_order(stream, [k for k in keys if self.owns(k)], begin=op == protocol.HINT_ORDER)
        elif op == protocol.HINT_PROGRESS:
            self.stager.hint_progress(stream, keys)
        else:
            self.stager.hint_end(stream)

    def provide(self, key: str):
        """A peer asks for a key this node owns: the local path once staged; for a compressed
        copy its frame as stored (``Compressed``), or its bytes decompressed (a binary file)
        when the frame needs this tier's dictionary, which the peer does not hold; or None."""
        if self.snapshot.get(key) is None or (self._sharded() and not self.owns(key)):
            return None
        try:
            # copied on this (serving) thread at once: never queued behind the read-ahead or
            # behind copies that wait on other nodes (issue 21: 5 s waits, then the PFS twice)
            tier = self.stager.ensure(key, now=True).result(timeout=self.config.staging.resolve_timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            return None
        if tier is None:
            return None
        if self._opened_from_at_loss is not None and key in self.stager.replicas:  # a lost node's file, from its second copy
            with self._lock:
                self.replica_served["files"] += 1
                self.replica_served["bytes"] += self.snapshot.files[key].size
        if tier.is_compressed(key):
            path, size = tier.compressed_path_for(key), self.snapshot.files[key].size
            if not needs_dictionary(path):  # crosses the network as stored (cluster/transfer.py)
                return Compressed(path, size)
            return os.fdopen(tier.codec.inflate(path, size, os.path.basename(key)), "rb")
        return tier.path_for(key)

    # -- statistics and shutdown ---------------------------------------------------------
    def _slot_names(self) -> dict[int, str]:
        names = {protocol.SLOT_PFS: "pfs"} | {t.slot: t.name for t in self.tiers}  # a skipped tier keeps its slot
        if self.cluster is not None:
            names[protocol.SLOT_PEER] = "peer"
        return names

    def _counters_now(self) -> tuple[dict[str, int], dict[str, int]]:
        """The timeline's sample: cumulative counters and the tiers' levels."""
        counters = {}
        for name, c in protocol.read_opened_from(self.counters_path, self._slot_names()).items():
            counters[f"opens.{name}"] = c["opens"]
            counters[f"bytes.{name}"] = c["bytes"]
        s = self.stager.stats()
        counters |= {"staged_files": s["files"], "staged_bytes": s["bytes"], "pfs_staging_bytes": s["pfs_bytes_read"]}
        if self.cluster is not None:
            counters["peer_bytes_received"] = s["peer_bytes_read"]
        tiers = self.tiers + ([self.peer_area] if self.peer_area is not None else [])
        return counters, {t.name: t.stored for t in tiers}

    def stats(self, brief: bool = False) -> dict:
        """``node_stats`` as they cross the socket and MPI (``NodeStats.to_dict``)."""
        return self.node_stats(brief).to_dict()

    def node_stats(self, brief: bool = False) -> NodeStats:
        """This node's numbers (the report module turns them into the report). ``brief`` (the
        launcher's progress polls) leaves out the timeline and the size classes, whose cost
        grows with the job's length and the dataset's size."""
        opened_from = protocol.read_opened_from(self.counters_path, self._slot_names())
        door = None
        if self._door is not None:
            self.absorb_front_door()
            if self.door_link is not None:
                self.door_link.reclaim_lease()
            door = self._door.counts()
            door["answered_staged"] = sum(door["hits_by_slot"].values())
        with self._lock:
            outcomes = collections.Counter(self.outcomes)
        for slot, n in (door or {}).get("hits_by_slot", {}).items():  # opens the door answered itself
            outcomes["already_fetched" if slot == protocol.SLOT_PEER else "already_staged"] += n
        outcomes = dict(outcomes)
        try:
            counters = protocol.read_extra_counters(self.counters_path)
        except (OSError, ValueError):
            counters = (0,) * protocol.EXTRA_WORDS
        off = counters[protocol.EXTRA_META_OFF]
        timeline = classes = None
        if not brief:
            self._sampler.sample()  # the last, partial interval
            # the peer area is a tier of the stager's: its files count as staged "peer"
            timeline = self.timeline.to_dict()
            classes = size_classes(self.snapshot.files, self.stager.staged.copy(), set())
        return NodeStats(
            node=self.node, host=socket.gethostname(),
            uptime_seconds=round(time.time() - self.started, 3),
            snapshot_seconds=round(self.snapshot_seconds, 3),
            snapshot=self.snapshot_how,
            # when the snapshot was ready (or failed), in seconds after the daemon started and
            # as a time stamp: the application may have started long before (docs/design.md)
            snapshot_ready_seconds=(round(self.snapshot_ready_at - self.started, 3)
                                    if self.snapshot_ready_at is not None else None),
            snapshot_ready_at=round(self.snapshot_ready_at, 3) if self.snapshot_ready_at is not None else None,
            metadata={"local": counters[protocol.EXTRA_META_LOCAL], "pfs": counters[protocol.EXTRA_META_PFS],
                      "off_roots": [k for k in range(len(self.config.dataset.roots))
                                    if off & (1 << min(k, 63))]},
            opened_from=opened_from,  # per slot an open was served from (the shim's counters)
            # compressed copies the shim decoded in the application's processes (shim_zstd.c)
            decompression={"opens": counters[protocol.EXTRA_ZSTD_OPENS], "ns": counters[protocol.EXTRA_ZSTD_NS],
                           "bytes": counters[protocol.EXTRA_ZSTD_BYTES],
                           "left_to_daemon": counters[protocol.EXTRA_ZSTD_FALLBACKS],
                           "reused": counters[protocol.EXTRA_ZSTD_REUSED]},
            processes_with_shim=counters[protocol.EXTRA_PROCESSES],
            staging=self.stager.stats() | {"policy": self.config.staging.policy, "in_flight": self.stager.in_flight()},
            tiers=[t.describe() for t in self.tiers] + ([self.peer_area.describe()] if self.peer_area else []),
            tier_errors=dict(self.tier_errors),
            resolves=outcomes,
            peer=self._peer_stats(),
            dataset={"files": len(self.snapshot.files), "bytes": self.dataset_bytes},
            inflated_bytes=self.resolver.inflated_bytes,
            front_door=door,
            cluster=self._cluster_stats(),
            timeline=timeline,
            size_classes=classes,
        )

    # -- a lost peer (issue 21) ------------------------------------------------------------
    _opened_from_at_loss: dict | None = None
    reowned_files = 0  # files of lost nodes this node took over
    reowned_held = 0   # ... of which it held a second copy already (peer.replicas: 2)

    def _note_loss(self, node: int, why: str) -> None:
        """A peer is lost (the cluster's engine thread): keep this node's open counters as they
        are now, so the report can say what this survivor served after the loss."""
        if self._opened_from_at_loss is None:
            self._opened_from_at_loss = protocol.read_opened_from(self.counters_path, self._slot_names())
        # off the engine thread: a pass over the snapshot
        threading.Thread(target=self._stage_reowned, args=(node,), name="monarch-reowned", daemon=True).start()

    def _stage_reowned(self, lost: int) -> None:
        """The files of ``lost`` this node owns now go ahead of the rest of its read-ahead:
        the other survivors ask for them at once, and wait for them ~1 s at most before they
        read the PFS themselves (a second PFS read of the file). Before the snapshot is ready
        the read-ahead, still to start, takes them as this node's own."""
        with self.gate.lock:
            if self.gate.state is not SnapshotState.READY or self.gate.closing:
                return
            stager, snap = self.stager, self.snapshot
        if self.config.staging.policy != "read-ahead":  # staged as they are asked for, at once (provide)
            return
        keys = [k for k in sorted(snap.files) if self.cluster.first_owner(k) == lost and self.owns(k)]
        held = sum(1 for k in keys if k in stager.replicas)  # second copies: nothing to read
        stager.read_ahead_more(keys)
        with self._lock:
            self.reowned_files += len(keys)
            self.reowned_held += held
        log.info("node %d lost: %d of its files are this node's now (%d held as second copies already), "
                 "the rest staged ahead of the read-ahead", lost, len(keys), held)

    def _peer_stats(self) -> dict:
        if self.cluster is None:
            return {}
        return self.cluster.counters() | {"opened_from_at_loss": self._opened_from_at_loss}

    def client_env(self) -> dict[str, str]:
        """What the shim in the application needs (the launcher exports exactly these keys)."""
        probe = [(t.slot, t.path) for t in self.tiers]
        if self.peer_area is not None:
            probe.append((protocol.SLOT_PEER, self.peer_area.path))
        env = {
            protocol.ENV_ROOTS: protocol.format_roots(self.config.dataset.spellings()),
            protocol.ENV_PROBE: protocol.format_probe(probe),
            protocol.ENV_SOCKET: self.instance.socket_path,
            protocol.ENV_COUNTERS: self.counters_path,
            protocol.ENV_INDEX: self.index_path,
        }
        if self.config.staging.validate == "open":
            env[protocol.ENV_ASK_FIRST] = "1"  # every open asks the daemon, which checks the PFS once per file
        return env

    def describe(self) -> dict:
        """Who this daemon is, for a launcher deciding whether to attach."""
        return {"run": self.run_id, "node": self.node, "roots": list(self.config.dataset.roots),
                "config": self.config.source, "pid": os.getpid(), "tier_errors": dict(self.tier_errors)}

    def close(self) -> None:
        """Stop staging and remove what the run asked not to keep. The run directory keeps
        the daemon's log and the report; the index (as large as the dataset's names) goes.
        A walk still under way is left to end on its own; nothing it finds is used.

        Every copy into the tiers stops before they are removed: the front door's (its
        threads joined), the stagers' (the walk's streaming one included: their threads,
        the askers copying inline, the ranges of large files; see ``Stager.drain``), the
        decodes. Nothing re-creates a tier's directory after it went."""
        with self.gate.lock, self._lock:
            self.gate.closing = True
            stagers = list(self._stagers)
        self._sampler.stop()
        if self._door is not None:
            self._door.stop()  # no-op after the server's; joins the door's threads, copies and all
        for stager in stagers:
            stager.shutdown()
        deadline = time.monotonic() + CLOSE_DRAIN_SECONDS
        for stager in stagers:
            if not stager.drain(max(0.0, deadline - time.monotonic())):
                log.warning("a copy from the PFS did not stop within %.0f s of the daemon's close; "
                            "the tiers are removed without it", CLOSE_DRAIN_SECONDS)
        self.resolver.close()  # its decodes finish before the tiers go
        if self.peer_cache is not None:
            self.peer_cache.close()
        try:
            os.unlink(self.index_path)
        except OSError:
            pass
        for tier in self.tiers:
            tier.remove()
        if self.peer_area is not None:
            self.peer_area.remove()
        self.instance.release()  # the counters stay, with the log and the report, until the next instance
