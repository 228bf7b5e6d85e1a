"""This node's part in a cluster: the layout, who owns what, the peer area, serving peers, replicas, losses.

One node alone has no cluster role (the daemon holds None). In a cluster of daemons (one per
node, one MPI job: ``monarch/cluster/``), the role:

* shares the snapshot node 0 walks (streamed, so that each node stages what it will surely
  own while the walk goes on: ``monarch/cluster/early.py``), then decides the layout
  (``monarch/cluster/capacity.py``): *replicate* when every node can hold the whole
  dataset (the stager fetches other nodes' files from their owners into the peer area),
  else *shard* (each file has one owner, the peer area is an evicting cache of the
  others': ``monarch/node/peer/peer_cache.py``);
* answers peers' requests for the files this node owns (``provide``);
* with ``peer.replicas: 2``, keeps second copies of the files it would take over;
* when a node is lost, stages the lost node's files it owns now ahead of the rest.

It reads what serves now (snapshot, stager) through ``Current`` and reports its own slices
of the node's statistics (``stats``, ``peer_stats``).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

from monarch import protocol
from monarch.cluster import capacity
from monarch.cluster.provide import Compressed
from monarch.config import Config
from monarch.errors import PeerError
from monarch.node.tiers.codecs import needs_dictionary
from monarch.node.stage.current import Current
from monarch.node.peer.block_peers import BlockPeers
from monarch.node.peer.offers import Offers
from monarch.node.peer.peer_cache import PeerCache
from monarch.node.snapshot.index_file import IndexFile
from monarch.node.snapshot.key_order import in_order
from monarch.node.snapshot.indextable import IndexTable, listed_only, used_ranges
from monarch.node.snapshot.snapshot import Snapshot
from monarch.node.stage.read_ahead_modes import Where, decide
from monarch.node.stage.sources import PeerSource
from monarch.node.stage.stager import Stager
from monarch.routes import copied_inline, staged_by_blocks
from monarch.node.tiers.tiers import Tier
from monarch.records.node_stats import ClusterSlice
from monarch.sizes import allocated_size

log = logging.getLogger(__name__)

SHARD_START_DEPTH = 32    # a sharded node's first copies in flight toward the PFS (adapted from there)
# the small files node 0's walk finds in its first seconds wait for the front door's lane, which
# copies them once the index is written for a fifth of the stager's CPU per file; a longer walk
# (a large dataset) has the stager copy them as they are found
DOOR_WALK_GRACE = 2.0
SERVE_THREADS = 8         # peers' requests answered at once ...
SHARDED_SERVE_THREADS = 32  # ... when sharded, where every other node asks this one for its share

Walk = Callable[..., tuple[Snapshot, str]]  # (into, on_directory) -> (snapshot, how it was taken)


def sample_sizes(snap: Snapshot, samples: int = capacity.SIZE_SAMPLES) -> list[int]:
    """The sizes of ``samples`` files spread over a listing (a stat each, far fewer than the
    listing's own calls; nothing written in the index: its files are described with their routes)."""
    files, sizes = snap.files, []
    n = len(files)
    for k in range(min(samples, n)):
        try:
            sizes.append(os.stat(snap.source_path(files.key(k * n // min(samples, n))), follow_symlinks=False).st_size)
        except OSError:
            pass  # gone since the listing: one sample less
    return sizes


@dataclass(frozen=True)
class IndexShared:
    """What node 0 shares of a walk that made an index: enough for every node to make a file of
    its length and receive its used parts (``ranges``: [start, end) offsets) into it."""
    roots: tuple[str, ...]
    nfiles: int
    size: int
    ranges: list[tuple[int, int]]
    sampled: list[int]  # a listing's: the sizes of files spread over it (capacity.plan_by_count)


class PeerLayer(Protocol):
    """What the role asks of the peer layer (``monarch.cluster.Cluster``; tests give stand-ins).
    ``collective``: its nodes run collectives (exchange capacities, stream node 0's walk)."""
    node: int
    nodes: int
    collective: bool
    heartbeat_timeout: float  # a silent owner is down after this
    datapath: Any  # the C data path (cluster/datapath.DataPath: offered this node's raw staged copies), or None

    def owner(self, key: str) -> int: ...
    def first_owner(self, key: str) -> int: ...
    def fetch(self, owner: int, key: str, dest: int, size: int | None = None) -> int: ...
    def share(self, take: Callable, timeout: float | None = None, on_files: Callable | None = None) -> Any: ...
    def start(self, provide: Callable[[str], Any], serve_threads: int = SERVE_THREADS,
              provide_range: Callable[[str, int, int], Any] | None = None) -> None: ...
    def range_owner(self, key: str, size: int, r: int) -> int: ...
    def fetch_range(self, owner: int, key: str, offset: int, length: int, fd: int,
                    timeout: float | None = None, version: tuple[int, int] | None = None) -> int: ...
    def offer_blocks(self, key: str, slot: int) -> None: ...
    def range_bytes_served_in_c(self) -> int: ...
    def on_loss(self, listener: Callable[[int, str], None]) -> None: ...
    def counters(self) -> dict[str, Any]: ...


class ClusterRole:
    def __init__(self, cluster: PeerLayer, config: Config, tiers: list[Tier], peer_area: Tier | None,
                 current: Current, opened_from: Callable[[], dict], kept=None):
        """``opened_from()``: the node's open counters now (kept as they are when a node is lost);
        ``kept``: the write-back's kept copies (``node/kept_reads.py``), told what the others keep."""
        self.cluster = cluster
        self._kept = kept
        self.node = cluster.node
        self.peer_area = peer_area
        self.peers = PeerSource(cluster, config.peer.timeout)
        self.layout = None  # monarch/cluster/capacity.Layout, once the snapshot is shared
        self.peer_cache: PeerCache | None = None  # sharded: other nodes' files
        self._config = config
        self._tiers = tiers
        self._current = current
        self._opened_from = opened_from
        self._lock = threading.Lock()
        self._unit = max((t.unit for t in tiers), default=1)  # a copy takes its size rounded up to it
        self.replica_served = {"files": 0, "bytes": 0}  # sent to peers from second copies after a loss
        self.opened_from_at_loss: dict | None = None
        self.reowned_files = 0  # files of lost nodes this node took over
        self.reowned_held = 0   # ... of which it held a second copy already (peer.replicas: 2)
        self.offers: Offers | None = None  # what the C data path answers peers by itself
        self._own_walk: Snapshot | None = None  # node 0: its walk's index, while its bytes are shared
        self._index_at: str | None = None  # where this node publishes its index (peers are described from it)
        cluster.on_loss(self._note_loss)

    # -- who owns what ------------------------------------------------------------------
    def owns(self, key: str) -> bool:
        """Does this node stage ``key`` itself (its owner; a large file staged by blocks is
        every node's, by ranges: ``block_peers.py``)?"""
        return self.cluster.owner(key) == self.node or self.by_ranges(key)

    def by_ranges(self, key: str) -> bool:
        """Is ``key`` a large file staged by blocks, its ranges owned across the nodes?"""
        files = self._current.snapshot.files
        if listed_only(files, key):  # its size unknown (a listing's): owned whole by its hash, never stat'ed here
            return False
        info = files.get(key)
        if info is None or not staged_by_blocks(info.size):  # (most files: no route asked for, at a million of them)
            return False
        stager = self._current.stager
        return stager is not None and stager.blocks is not None and stager.blocks.eligible(key, info)

    def use_stager(self, stager: Stager) -> None:
        """A new stager of this node: its large files' blocks come from their ranges' owners."""
        if stager.blocks is not None and self.cluster.nodes > 1:
            stager.blocks.use_peers(BlockPeers(self.cluster, self._config.peer.timeout))

    def sharded(self) -> bool:
        return self.layout is not None and self.layout.mode == "shard"

    def where(self) -> Where:
        """Where this node stands for the read-ahead's table once the walk ended (replicating
        also when the capacities were not exchanged: files owned by hashing, none sharded)."""
        return Where.SHARDED if self.sharded() else Where.REPLICATING

    def deciding(self) -> bool:
        """Is the layout still to be decided (a collective cluster before the walk ended)?"""
        return self.cluster.collective and self.layout is None

    def remote(self, key: str) -> PeerCache | None:
        """The peer cache that answers ``key`` when another node owns it (sharded), else None."""
        return self.peer_cache if self.peer_cache is not None and not self.owns(key) else None

    def stager_options(self) -> dict[str, Any]:
        """How a stager of this node is made: sharded (or not decided yet) it copies its own
        share from the PFS, deep from the start (every node waits on it); replicating, it
        fetches other nodes' files from their owners first."""
        if self.sharded() or self.deciding():
            return {"start_depth": None if self._config.staging.threads else SHARD_START_DEPTH}
        return {"peers": self.peers, "peer_area": self.peer_area}

    # -- the snapshot, shared ----------------------------------------------------------------
    def take_snapshot(self, walk: Walk, growing: Snapshot | None, stager: Stager | None,
                      door_copies: Callable[[], bool] = lambda: False,
                      index_at: str | None = None) -> tuple[Snapshot, str]:
        """Collective: node 0's walk, on every node (streamed into ``growing`` while ``stager``
        copies what this node will surely own, when both are given; while ``door_copies()``,
        the front door's lane copies the small ones of the walk's first seconds), then the layout.
        A walk that made an index (the C walk, a kept snapshot, a manifest) is not streamed: its
        bytes are broadcast into the file each node publishes it from, beside ``index_at``."""
        self._index_at = index_at
        capacities = self._exchange_capacities()
        self._exchange_kept()
        if growing is not None and stager is not None:
            snap, how = self._share_streamed(walk, growing, stager, capacities, door_copies)
        else:
            snap, how = self.cluster.share(lambda: self._walked(*walk(None, None)))
            if not isinstance(snap, IndexShared):
                snap = snap.with_local_devices()
        sampled = None
        if isinstance(snap, IndexShared):
            sampled, snap = snap.sampled, self._index_shared(snap, index_at)
        self._plan(snap, capacities, sampled)
        if stager is not None and self.layout is not None and not self.sharded():  # replicating
            stager.fetch_from_peers(self.peers, self.peer_area)
        return snap, how

    def _walked(self, snap: Snapshot, how: str) -> tuple[Snapshot | IndexShared, str]:
        """Node 0's walk as shared: an index's header (its bytes follow, ``_index_shared``), kept
        here meanwhile; else the snapshot itself (pickled; or as it is, where the peer layer runs no
        collectives). A listing's sizes are sampled first."""
        if not isinstance(snap.files, IndexTable) or not self.cluster.collective:
            return snap, how
        sampled = sample_sizes(snap) if capacity.listed_sizes_unknown(snap.files) else []
        self._own_walk = snap
        header = protocol.INDEX_HEADER.unpack_from(snap.files.data)
        return IndexShared(snap.roots, snap.files.nfiles, len(snap.files.data), used_ranges(header), sampled), how

    def _index_shared(self, head: IndexShared, index_at: str | None) -> Snapshot:
        """Collective: node 0's index, its used parts broadcast into a file of the same length on
        every other node (mapped: no copy in between; its rooms stay holes), read as the snapshot."""
        if self.node == 0:
            snap, self._own_walk = self._own_walk, None
            for lo, hi in head.ranges:
                self.cluster.bcast_into(memoryview(snap.files.data)[lo:hi], None)
            return snap
        made = IndexFile.blank(index_at, head.size) if index_at else None
        data = made.data if made is not None else bytearray(head.size)
        try:
            for lo, hi in head.ranges:
                self.cluster.bcast_into(memoryview(data)[lo:hi], None)
        except BaseException:
            if made is not None:
                made.discard()
            raise
        snap = Snapshot.from_index(head.roots, data, head.nfiles, made)
        snap.localize_devices()
        return snap

    def _exchange_capacities(self) -> list[tuple[int, int]] | None:
        """Collective, before the walk: every node's (tiers' bytes, peer area's bytes); None
        when they could not be exchanged (files are then owned by rendezvous hashing)."""
        if not self.cluster.collective:
            return None
        tiers = sum(t.capacity for t in self._tiers)
        peer = self.peer_area.capacity if self.peer_area is not None else 0
        try:
            capacities, self._unit = capacity.exchange(self.cluster, tiers, peer, self._unit)
            return capacities
        except PeerError as e:  # fail open: rendezvous ownership, the peer area a store, the PFS when full
            log.warning("the nodes' capacities were not exchanged (%s): files are owned by rendezvous hashing", e)
            return None

    def _exchange_kept(self) -> None:
        """Collective, before the walk: what each node keeps of earlier runs' writes, to every node (a
        restart's files read from the node that keeps them); not exchanged, each node reads its own."""
        if not self.cluster.collective:
            return
        try:
            mine = self._kept.holdings() if self._kept is not None else b"[]"
            payloads = self.cluster.allgather_bytes(mine, 120.0)
        except Exception as e:  # (PeerError, or a store that cannot be read: never the walk's failure)
            log.warning("the nodes' kept copies were not exchanged (%s): each node reads only its own", e)
            payloads = None
        if self._kept is not None:
            self._kept.learn(payloads)

    def _plan(self, snap: Snapshot, capacities: list[tuple[int, int]] | None, sampled: list[int] | None = None) -> None:
        """Decide replicate or shard and set the placement (the same on every node); sharded,
        the peer area becomes an evicting cache."""
        if capacities is not None:
            self.layout = capacity.plan(self.cluster, snap.files, capacities, self._unit, sampled)
        if self.sharded():
            self.peer_cache = PeerCache(self.cluster, self.peer_area, snap)

    def _share_streamed(self, walk: Walk, growing: Snapshot, stager: Stager,
                        capacities: list[tuple[int, int]] | None,
                        door_copies: Callable[[], bool]) -> tuple[Snapshot | IndexShared, str]:
        """Collective: node 0 walks into ``growing`` and streams the files it finds; every node
        keeps them in its ``growing`` and stages at once those it will surely own. Returns
        ``growing``, whole (the stager over it goes on after the walk), or the header of an index
        the walk made (nothing streamed: ``_index_shared`` sends it)."""
        from monarch.cluster.early import EarlyShare
        early = EarlyShare(capacities, self.node) if capacities is not None else None
        started = time.monotonic()

        def on_files(files: dict) -> None:  # every node, every file once, in walk order
            if self.node != 0:
                growing.files.update(files)
            if early is not None:
                keys = early.add([(key, allocated_size(info.size, self._unit)) for key, info in files.items()])
                if time.monotonic() - started < DOOR_WALK_GRACE and door_copies():
                    keys = [key for key in keys if not copied_inline(files[key].size)]  # the small ones: the lane's
                stager.read_ahead_more(keys)

        def take(publish: Callable[[dict], None]) -> tuple[Snapshot, str]:  # node 0
            sent: set[str] = set()

            def on_directory(keys: list[str]) -> None:
                sent.update(keys)
                publish({key: growing.files[key] for key in keys})
            snap, how = walk(growing, on_directory)
            if isinstance(snap.files, IndexTable):  # an index: its bytes go to every node whole
                return self._walked(snap, how)
            if snap.files is not growing.files:  # the last job's snapshot, reused whole
                growing.files.update(snap.files)
                growing.dirs.update(snap.dirs)
                growing.links.update(snap.links)
            publish({key: info for key, info in growing.files.items() if key not in sent})
            return Snapshot(growing.roots, {}, growing.dirs, growing.links), how  # the files went ahead

        rest, how = self.cluster.share(take, on_files=on_files)
        if isinstance(rest, IndexShared):
            return rest, how
        if self.node != 0:
            growing.dirs.update(rest.dirs)
            growing.links.update(rest.links)
        growing.localize_devices()
        return growing, how

    # -- staging, once the snapshot is ready ----------------------------------------------------
    def start(self) -> None:
        """Serve peers from now on (the C data path what it can, Python's protocol the rest)."""
        if self.cluster.datapath is not None:
            self.offers = Offers(self.cluster.datapath, self.owns, self._current.stager, self._tiers)
            # the files this node describes, described to its peers from the index it publishes, as mapped here
            files = self._current.snapshot.files
            if self._index_at is not None and isinstance(files, IndexTable) and isinstance(files.data, (bytearray,
                                                                                                       mmap.mmap)):
                self.cluster.datapath.use_index(files.data)
        self.cluster.start(self.provide, SHARDED_SERVE_THREADS if self.sharded() else SERVE_THREADS,
                           provide_range=self.provide_range)

    def read_ahead_order(self, keys: Iterable[str]) -> Iterator[str]:
        """This node's own files (from the PFS) first, then, replicating, the others' (from
        their owners): ``keys`` iterated again for the others."""
        others = () if self.sharded() else (k for k in keys if not self.owns(k))
        return itertools.chain((k for k in keys if self.owns(k)), others)

    def keep_replicas(self, stager: Stager, keys: Callable[[], Iterable[str]]) -> None:
        """With ``peer.replicas: 2`` (sharded, more than one node, tiers here): second copies
        of the files this node would take over if their owner were lost (``keys()``: every file,
        asked for only then: a list of millions of keys is most of a node's memory)."""
        if self._keeps_replicas():
            stager.keep_replicas((k for k in keys() if self._second_here(k)), self.peers)

    def _keeps_replicas(self) -> bool:
        return (self.sharded() and self._config.peer.replicas >= 2 and self.cluster.nodes > 1
                and bool(self._tiers))

    def _second_here(self, key: str) -> bool:
        """Is this node second in ``key``'s preference list (where its second copy lives)?"""
        return self.layout.placement.owners(key, 2)[1:] == [self.node]

    # -- serving peers -----------------------------------------------------------------------
    def provide(self, key: str) -> str | Compressed | Any | None:
        """A peer asks for a key this node owns: the local path once staged; for a compressed
        copy its frame as stored (``Compressed``), or its bytes decompressed (a binary file)
        when the frame needs this tier's dictionary, which the peer does not hold; or None. A
        key of a write-back file an earlier run published is answered with the copy kept here."""
        if self._kept is not None and (kept := self._kept.provide(key)) is not None:
            return kept
        snapshot, stager = self._current.snapshot, self._current.stager
        if snapshot.get(key) is None or (self.sharded() and not self.owns(key)):
            return None
        try:
            # copied on this (serving) thread at once: never queued behind the read-ahead or
            # behind copies that wait on other nodes (queued, the peer waited 5 s, then read the PFS twice)
            tier = stager.ensure(key, now=True).result(timeout=self._config.staging.resolve_timeout)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            return None
        if tier is None:
            return None
        if self.opened_from_at_loss is not None and key in stager.replicas:  # a lost node's file, from its second copy
            with self._lock:
                self.replica_served["files"] += 1
                self.replica_served["bytes"] += snapshot.files[key].size
        if tier.is_compressed(key):
            path, size = tier.compressed_path_for(key), snapshot.files[key].size
            if not needs_dictionary(path):  # crosses the network as stored (cluster/transfer.py)
                return Compressed(path, size)
            return os.fdopen(tier.codec.inflate(path, size, os.path.basename(key)), "rb")
        return tier.path_for(key)

    def provide_range(self, key: str, offset: int, length: int) -> str | None:
        """A peer asks for a span of a large file's blocks (a range this node owns): the path
        of the block copy holding them once staged, or None."""
        stager = self._current.stager
        if stager is None or stager.blocks is None:
            return None
        return stager.blocks.serve_range(key, offset, length, self._config.staging.resolve_timeout)

    # -- a lost peer ---------------------------------------------------------------------
    def _note_loss(self, node: int, why: str) -> None:
        """A peer is lost (the cluster's engine thread): keep this node's open counters as they
        are now, so the report can say what this survivor served after the loss."""
        if self.opened_from_at_loss is None:
            self.opened_from_at_loss = self._opened_from()
        # off the engine thread: a pass over the snapshot
        threading.Thread(target=self._stage_reowned, args=(node,), name="monarch-reowned", daemon=True).start()

    def _stage_reowned(self, lost: int) -> None:
        """The files of ``lost`` this node owns now go ahead of the rest of its read-ahead:
        the other survivors ask for them at once, and wait for them ~1 s at most before they
        read the PFS themselves (a second PFS read of the file). Before the snapshot is ready
        the read-ahead, still to start, takes them as this node's own."""
        gate = self._current.gate
        with gate.lock:
            if not self._current.ready or gate.closing:
                return
            stager, snap = self._current.stager, self._current.snapshot
        if stager.blocks is not None:  # the large files' ranges of the lost node: their faults ask the new owners
            stager.blocks.reown()
        if not decide(self._config.staging.policy, self.where()).reads_ahead:  # staged when asked for (provide)
            return
        keys = [k for k in in_order(snap.files) if self.cluster.first_owner(k) == lost and self.owns(k)]
        held = sum(1 for k in keys if k in stager.replicas)  # second copies: nothing to read
        stager.read_ahead_more(keys)
        with self._lock:
            self.reowned_files += len(keys)
            self.reowned_held += held
        log.info("node %d lost: %d of its files are this node's now (%d held as second copies already), "
                 "the rest staged ahead of the read-ahead", lost, len(keys), held)

    # -- its slices of the node's statistics ----------------------------------------------------
    def stats(self) -> ClusterSlice:
        """The report's ``cluster`` entry of this node: its layout, its share and how much of
        it is staged, replicas, the peer cache."""
        if self.layout is None:
            return {}
        files, stager = self._current.snapshot.files, self._current.stager
        staged_files = staged_bytes = 0  # counted a key at a time: a list of a node's copies was ~90 B each
        for k in stager.staged.copy():
            if self.owns(k):
                staged_files += 1
                staged_bytes += files[k].size if k in files else 0
        return {"mode": self.layout.mode, "why": self.layout.why, "owned_files": self.layout.owned["files"],
                "owned_bytes": self.layout.owned["bytes"], "owned_estimated": bool(self.layout.owned.get("estimated")),
                "owned_staged_files": staged_files,
                "owned_staged_bytes": staged_bytes,
                "capacities": self.layout.capacities, "reowned_files": self.reowned_files,
                "replicas": self._replica_stats(stager),
                "peer_cache": self.peer_cache.stats() if self.peer_cache is not None else None}

    def _replica_stats(self, stager: Stager) -> dict[str, Any] | None:
        if not self._keeps_replicas():
            return None
        with self._lock:
            served = dict(self.replica_served)
        return stager.replica_stats() | {"reowned_held": self.reowned_held, "served_after_loss": served}

    def peer_stats(self) -> dict[str, Any]:
        """The report's ``peer`` entry: what crossed between the nodes, and the open counters
        at the first loss."""
        return self.cluster.counters() | {"opened_from_at_loss": self.opened_from_at_loss}

    def close(self) -> None:
        if self.peer_cache is not None:
            self.peer_cache.close()
