"""The node daemon: owns this node's tiers, snapshot, stager and statistics, and answers
the shim's ``resolve(key)``.

Single node it reads the dataset ahead of the application (``read-ahead``: in the
background from the start, what the application waits for first) or stages on access;
in a cluster its role (``monarch/node/peer/cluster_role.py``) stages what this node owns and
fetches the rest from the owning peer into a bounded local peer area; when a peer cannot
help (dead, slow, full) the file is staged here from the PFS instead. Every copy, from the
PFS or a peer, goes through the stager (``monarch/node/stage/``). Every way it cannot help
ends in the same answer: read the PFS (fail open), counted by why (``monarch/node/outcomes.py``).

The daemon's parts each own one thing and report their own slice of the statistics: the
resolver (the shim's question), the cluster role, the front door's keeper
(``door_link.py``), the read-ahead (``read_ahead.py``: who reads ahead is one table,
``stage/read_ahead_modes.py``), the stager; the daemon makes them, runs the snapshot's life
and assembles what they report.
"""

from __future__ import annotations

import collections
import gc
import glob
import logging
import os
import socket
import threading
import time
import weakref

from monarch import layout, protocol
from monarch.config import Config, TierConfig, served
from monarch.errors import MonarchError
from monarch.node.peer.cluster_role import ClusterRole, PeerLayer
from monarch.node.stage.current import Current
from monarch.node.doorkeeper.door_link import PEER_WORKERS, DoorKeeper, DoorLink
from monarch.node.snapshot.gate import SnapshotGate, SnapshotState
from monarch.node.instance import Instance
from monarch.node.notices import JobNotices
from monarch.node.outcomes import Outcome
from monarch.node.read_ahead import ReadAhead
from monarch.node.resolver import Resolver
from monarch.node.tiers.resources import margin_bytes
from monarch.node.writeback import make_writeback
from monarch.node.snapshot.listed import ListedFiles
from monarch.node.snapshot.snapshot import Snapshot, load_or_walk
from monarch.node.stage.stager import Stager
from monarch.node.stats import shim_counters, size_classes
from monarch.node.tiers import shared_tier
from monarch.node.tiers.tiers import Tier
from monarch.records.filetable import FileTable
from monarch.records.node_stats import NodeStats
from monarch.secure import UnsafeBaseError, UnsafePathError, private_dir, user_dir
from monarch.report.timeline import Sampler, Timeline

log = logging.getLogger(__name__)

# at close, copies under way stop at their next read (a chunk, a range: well under this);
# one that does not (a PFS read that never returns) is not waited for beyond it
CLOSE_DRAIN_SECONDS = 30.0
PAGES_TIMEOUT = 0.005  # a shim's PAGES fetch from the block's owner, at most (a busy owner: the PFS's page sooner)


class NodeDaemon:
    """This node's daemon. Everything that needs the dataset snapshot -- the walk, the stager,
    kept copies' adoption, the read-ahead, the index the shim maps -- is made ready by
    ``_prepare``: inline in the constructor, or with ``background=True`` on a thread of its
    own, so that the socket answers (ATTACH) and the application starts while the walk
    runs. Until then (``state`` WALKING) the snapshot and stager are empty stand-ins:
    the server holds the requests that need them (server.py), INVALIDATE and HINT are
    recorded and applied, in order, before anything is served (``invalidate``, ``hint``)."""

    def __init__(self, config: Config, run_id: str, cluster: PeerLayer | None = None, node: int = 0,
                 background: bool = False):
        self.config = config
        self.run_id = run_id
        self.node = cluster.node if cluster is not None else node
        self.started = time.time()
        self.outcomes: collections.Counter[Outcome] = collections.Counter()
        self._lock = threading.Lock()
        self.snapshot_seconds = 0.0
        self.snapshot_how = SnapshotState.WALKING.value
        self.snapshot_ready_at: float | None = None  # time.time() when the snapshot was ready (or failed)
        self.gate = SnapshotGate()
        self._door_keeper: DoorKeeper | None = None  # the server's C front door's keeper (make_front_door)
        self._stagers: "weakref.WeakSet[Stager]" = weakref.WeakSet()  # every stager made: close() drains them
        self.run_dir = layout.run_dir(config.run_base, run_id, self.node)
        # the run directory is this instance's from here (a live one refused); a dead one's
        # index, counters and socket are gone before anything of this one is published
        self.instance = Instance(self.run_dir)
        layout.write_marker(self.run_dir, run_id, layout.KIND_RUN)
        layout.prune_finished_runs(os.path.dirname(self.run_dir), spare=self.run_dir)
        protocol.create_counters(self.counters_path)
        self.tier_errors: dict[str, str] = {}
        self.memory_margin = margin_bytes(config.memory_margin, config.memory_margin_share)
        self.dataset_bytes = 0
        self._listed: ListedFiles | None = None  # the snapshot's files not described yet, once its index is written
        self._unsized = 0  # of those, never described (their bytes are not in dataset_bytes), at the last full REPORT
        self.stores = None  # roots served from a key-value store (None: none)
        if config.dataset.stores:  # the store clients only then: hashlib's import maps OpenSSL (3.4 MB resident)
            from monarch.node.stage.store_source import StoreSet
            self.stores = StoreSet.of(config, cluster is not None)
        self._in_cluster = cluster is not None  # a cluster's daemon stages its own share: its tiers are not shared
        self.current = Current(self.gate, Snapshot(tuple(config.dataset.roots), FileTable()))  # nothing until the walk ends
        self.tiers = [t for t in (self._make_tier(cfg, protocol.tier_slot(i), f"tiers[{i}].path")
                                  for i, cfg in enumerate(config.tiers)) if t is not None]
        log.debug("phase tiers.ready")
        self.writeback = make_writeback(config, self.tiers, run_id, self.node)  # None: not configured
        self.peer_area: Tier | None = None
        self.role: ClusterRole | None = None
        if cluster is not None:
            self.peer_area = self._make_tier(TierConfig("peer", config.peer.path, config.peer.capacity,
                                                        capacity_share=config.peer.capacity_share),
                                             protocol.SLOT_PEER, "peer.path")
            self.role = ClusterRole(cluster, config, self.tiers, self.peer_area, self.current,
                                    lambda: protocol.read_opened_from(self.counters_path, self._slot_names()),
                                    kept=self.writeback.kept_reads if self.writeback is not None else None)
            if self.writeback is not None:  # published in the order of every node's (W4); kept copies shared
                self.writeback.order_by(cluster.write_order, cluster.partners, cluster)
        self.notices = JobNotices(self.current, self.owns, self.count, peer=bool(self.role and config.peer.fetch_ahead))
        self.read_ahead = ReadAhead(config.staging.policy, self.current, self.tiers, self.role, self.stores is not None,
                                    self.notices, self.counters_path, lambda: self._door_keeper,
                                    self.open_front_door, self.absorb_front_door)
        self._copies_misses = self.read_ahead.lanes().copies_misses  # the policy's alone: a fact of every stager
        with self.gate.lock:
            self.current.install_locked(self.current.snapshot, self._make_stager(self.current.snapshot))
        self.resolver = Resolver(self.current, config.staging, self.count, self.role, copies_misses=self._copies_misses)
        self.timeline = Timeline(time.time())
        self._sampler = Sampler(self.timeline, self._counters_now).start()
        if background:
            threading.Thread(target=self._prepare, name="monarch-snapshot", daemon=True).start()
        else:
            self._prepare()
        log.debug("phase daemon.ready")

    # what serves now (monarch/node/stage/current.py): read at each call, swapped when the walk ends
    @property
    def snapshot(self) -> Snapshot:
        return self.current.snapshot

    @property
    def stager(self) -> Stager:
        return self.current.stager

    # -- the snapshot, and everything that needs it --------------------------------------
    def _make_stager(self, snapshot: Snapshot) -> Stager:
        """A stager on ``snapshot``, known to ``close`` (which stops and drains every one,
        the walk's streaming one included, before the tiers go); in a cluster, as its role
        says (its own share, or others' files from their owners first)."""
        options = self.role.stager_options() if self.role is not None else {}
        if self.stores is not None:
            options = self.stores.stager_options() | options
        stager = Stager(snapshot, self.tiers, self.config.staging.threads, on_fallback=self._count_fallback,
                        cluster=self.role is not None, copies_misses=self._copies_misses,
                        door=self.config.staging.validate != "open" and self.stores is None, **options)
        if self.role is not None:
            self.role.use_stager(stager)
        with self._lock:
            self._stagers.add(stager)
            closing = self.gate.closing
        if closing:  # made after close() took its list: it never copies
            stager.shutdown()
        return stager

    # -- the C front door (monarch.frontdoor), if the server has one ---------------------------
    def make_front_door(self, listen_fd: int):
        """A front door on the socket's listener, kept linked to the current stager (None
        with ``staging.validate: open`` (every open is checked, in Python), or when it cannot
        start: the Python server answers everything)."""
        if self.config.staging.validate == "open":
            return None
        keeper = DoorKeeper.start(listen_fd, list(self.config.dataset.roots), self.tiers, self.peer_area, self.current,
                                  self.read_ahead.door_may_copy, PEER_WORKERS if self.role is not None else 0,
                                  own_only=self.role is not None, fixed_depth=self.config.staging.threads)
        if keeper is None:
            return None
        with self.gate.lock:  # the stager swapped in when the walk ends is linked there
            self._door_keeper = keeper
            keeper.relink_locked()
        datapath = self.role.cluster.datapath if self.role is not None else None
        if datapath is not None:  # a guarded fault's pages of another owner's block, fetched by the door
            keeper.front_door.pages(*datapath.fetch_pages_function(), self.role.node, PAGES_TIMEOUT)
        self.open_front_door()  # a snapshot ready already (made in the foreground)
        if self._listed is not None and self._listed.described.is_set():  # (else _start_staging starts its lane)
            self.read_ahead.door_started()  # the small files the stager has not taken yet: the door's lane
        return keeper.front_door

    @property
    def door_link(self) -> DoorLink | None:
        """The door's books kept with the current stager's (None without a door)."""
        return self._door_keeper.link if self._door_keeper is not None else None

    def open_front_door(self) -> None:
        """The snapshot is ready: the door answers from now on (never before the index is)."""
        if self._door_keeper is not None:
            self._door_keeper.open(self.index_path)

    def absorb_front_door(self) -> None:
        """What the door copied, and the progress readers told it, to the books and the outcomes."""
        if self._door_keeper is not None and any((answered := self._door_keeper.absorb()).values()):
            with self._lock:
                self.outcomes.update(answered)

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
            if self.read_ahead.streams():  # copies begin with the walk's first directories
                growing = Snapshot(tuple(self.config.dataset.roots), FileTable())
                stager = self._make_stager(growing)
            snap = self._take_snapshot(growing, stager)
            log.debug("phase snapshot.done")
            if self.gate.closing:  # stopped during the walk: leave the kept copies as they are
                if stager is not None:
                    stager.shutdown()
                return
            if stager is None or snap.files is not growing.files:  # not streamed, or a kept snapshot reused
                if stager is not None:
                    stager.shutdown()
                stager = self._make_stager(snap)
            snap.describe_with(self._routes(stager))  # a file described from now on publishes its route
            for tier in self.tiers:
                if tier.keep:
                    for key in tier.adopt_existing(snap.files):
                        stager.adopt(key, tier)
            index = snap.index_parts(self._routes(stager))
            with self.gate.lock:
                if self.gate.closing:
                    stager.shutdown()
                    return
                for key in self.gate.release_writes_locked():  # written to before the index exists: never served
                    self.notices.drop_copies(stager, snap, key)
                old = self.current.install_locked(snap, stager)
                if self._door_keeper is not None:
                    self._door_keeper.relink_locked()
                self.dataset_bytes = snap.total_bytes  # a sum over every file: once, not per REPORT
            old.shutdown()
            self._listed = ListedFiles(snap, self.snapshot_how, self.counters_path)
            snap.publish_index(self.index_path, index)  # files described later are described where the shim reads
            del index
            log.debug("phase index.written")
            # the snapshot's objects (millions for a large dataset) live as long as the job: out
            # of every later collection, which would otherwise walk them all with the GIL held
            # (0.23 s per full collection at 1M files, a stall of every open being answered)
            gc.freeze()
            self.gate.ready()
            if self._listed.pending(self._describe_all()):  # held requests need neither its check nor its pass
                self.snapshot_ready_at = time.time()
                self.gate.settle()
            self._start_staging()
        except Exception as e:  # fail open: the job runs, on the PFS
            self._fail(e, stager)
        finally:
            self.snapshot_ready_at = self.snapshot_ready_at or time.time()
            log.debug("phase snapshot.ready")
            self.gate.settle()

    def _routes(self, stager: Stager) -> tuple:
        """Each root's routes by size, published per file in the index for the shim and the door
        (monarch/routes.py): the stager's own (``stager.routes``, which the resolver and the stager
        read too), decided once on the node's facts: the stager's, the resolver's (does a miss
        stage), and whether a front door may copy here (its ``allowed`` says, at each open,
        whether it does). Static facts only: on a sharded node the owners come after the index, so
        another node's files are told apart where the owners are (the door's peer_owner_locked,
        the stager's peers)."""
        return stager.routes

    def _describe_all(self) -> bool:
        """Are a listing-mode walk's files all described in one pass (a stat each)? Only where the
        read-ahead is the stager's (or a compressing tier chooses its level by the dataset's
        bytes). Where the front door's lane reads ahead, a file is described where it is first
        opened: by the lane's copy, from the descriptor it copies from, the job's miss or its
        stat; a file nobody opens costs the PFS nothing."""
        return self.config.staging.policy != "on-access" and not self.read_ahead.describes_as_it_copies()

    def _start_staging(self) -> None:
        """The snapshot is ready: serve peers, read ahead, then the hints that came during
        the walk, in order (as if they had come after the read-ahead started, as before),
        those that come meanwhile after them. Nothing here can make the snapshot fail: a
        failure only costs the read-ahead."""
        try:
            self.snapshot_how = self._listed.check()  # a manifest served before its check
            self._listed.describe(self._routes(self.stager), self._describe_all())
            self.dataset_bytes = self.snapshot.total_bytes
            self.read_ahead.start()
        except Exception:
            log.exception("starting the read-ahead failed; files are staged as they are opened")
        while batch := self.gate.next_hints():  # then hint() applies them itself
            for hint in batch:
                try:
                    self.notices.apply_hint(*hint)
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
            empty = Snapshot(tuple(self.config.dataset.roots), FileTable())
            self.current.install_locked(empty, self._make_stager(empty)).shutdown()
            if self._door_keeper is not None:
                self._door_keeper.unlink_locked()
            self.dataset_bytes = 0
        self._remove_index()  # none, or one written before a later step failed

    def _remove_index(self) -> None:
        """The published index removed, and any still being built beside it (index_file.py)."""
        for path in [self.index_path, *glob.glob(glob.escape(self.index_path) + ".tmp-*")]:
            try:
                os.unlink(path)
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
            return shared_tier.make(cfg, slot, self.run_id, self.node, self.config, self.stores is not None,
                                    self._in_cluster, self.memory_margin, self._pfs_rate, lambda: self.dataset_bytes)
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
        ``snapshots`` directory under the run base, keyed by the dataset id), or None: only
        when a tier has ``keep: true`` (its copies outlive the job, and so may the index that
        adopts them); else nothing of the job stays behind, nor is an earlier one's read
        (a file left there by a job that kept its tiers stays theirs: it is not ours to remove)."""
        if not any(t.keep for t in self.config.tiers):
            return None
        try:
            directory = private_dir(os.path.join(user_dir(self.config.run_base), "snapshots"))
            return os.path.join(directory, f"{layout.dataset_id(self.config.dataset.roots)}.index")
        except (UnsafePathError, OSError) as e:
            log.warning("the snapshot is not kept for the next job: %s", e)
            return None

    def _take_snapshot(self, into: Snapshot | None = None, stager: Stager | None = None) -> Snapshot:
        """One walk per job (node 0's, in a cluster), or the last job's snapshot when no
        directory changed since (snapshot.load_or_walk); ``staging.validate: open`` walks.
        A walk fills ``into`` (if given) and ``stager`` (if given) copies its files as the
        walk finds them (in a cluster, those this node will surely own)."""
        t0 = time.perf_counter()
        if self.role is None:
            on_directory = stager.read_ahead_more if stager is not None else None
            snap, self.snapshot_how = self._walk(into, on_directory)
        else:
            snap, self.snapshot_how = self.role.take_snapshot(self._walk, into, stager, self.read_ahead.walk_to_door,
                                                               self.index_path)
        self.snapshot_seconds = time.perf_counter() - t0
        log.info("snapshot (%s): %d files, %d directories, %d bytes in %.2fs", self.snapshot_how, len(snap.files),
                 len(snap.dirs), snap.total_bytes, self.snapshot_seconds)
        return snap

    def _walk(self, into: Snapshot | None = None, on_directory=None) -> tuple[Snapshot, str]:
        roots = self.config.dataset.roots
        if self.stores is not None:  # a store's root from its manifest (and the others walked)
            return self.stores.load_snapshot(tuple(roots), into, on_directory)
        # the namespace at the listings' pace (walker.c): each file is described where it is first opened
        # (a cluster places files by count: cluster/capacity.plan_by_count)
        return load_or_walk(roots, self._snapshot_cache(), self.config.staging.validate == "open", into, on_directory,
                            manifest=self.config.dataset.manifest, describe=False,
                            check_later=self.role is None and not any(t.keep for t in self.config.tiers),
                            index_at=self.index_path)

    def _pfs_rate(self) -> float | None:
        """Bytes per second read from the PFS so far (a compressed tier's level must
        decompress well above it)."""
        stager = self.current.stager  # None until the first is installed
        elapsed = time.time() - self.started
        return stager.bytes_read["pfs"] / elapsed if stager is not None and elapsed > 0 else None

    def owns(self, key: str) -> bool:
        return self.role is None or self.role.owns(key)

    # -- the shim's question, the job's writes and hints -------------------------------------
    def count(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    def _count_fallback(self, why: str) -> None:
        """The stager's word that a peer could not help and the PFS was used (replicating)."""
        try:
            outcome = Outcome(why)
        except ValueError:  # a reason not declared in outcomes.py: still counted, never the copy's failure
            log.warning("a fallback for an undeclared reason %r, counted as %s", why, Outcome.FALLBACK_PEER_FAILED)
            outcome = Outcome.FALLBACK_PEER_FAILED
        self.count(outcome)

    def provide(self, key: str):
        """A peer's request for ``key`` (the cluster role answers it; None alone on a node)."""
        return self.role.provide(key) if self.role is not None else None

    def describe(self, key: str) -> bool:
        """``key``'s stat in the index (a file the walk only listed: described now): is it a file?"""
        return self.snapshot.files.get(key) is not None

    def invalidate(self, key: str) -> None:
        """The job writes to ``key``: its copies here go (``JobNotices.invalidate``)."""
        self.notices.invalidate(key)

    def hint(self, body: bytes) -> None:
        """An order hint from ``monarch.hints`` (``JobNotices.hint``)."""
        self.notices.hint(body)

    # -- statistics ---------------------------------------------------------------------
    def _slot_names(self) -> dict[int, str]:
        names = {protocol.SLOT_PFS: "pfs"} | {t.slot: t.name for t in self.tiers}  # a skipped tier keeps its slot
        if self.role is not None:
            names[protocol.SLOT_PEER] = "peer"
        return names

    def _all_tiers(self) -> list[Tier]:
        return self.tiers + ([self.peer_area] if self.peer_area is not None else [])

    def _counters_now(self) -> tuple[dict[str, int], dict[str, int]]:
        """The timeline's sample: cumulative counters and the tiers' levels."""
        counters = {}
        for name, c in protocol.read_opened_from(self.counters_path, self._slot_names()).items():
            counters[f"opens.{name}"] = c["opens"]
            counters[f"bytes.{name}"] = c["bytes"]
        s = self.stager.stats()
        counters |= {"staged_files": s["files"], "staged_bytes": s["bytes"], "pfs_staging_bytes": s["pfs_bytes_read"]}
        if self.role is not None:
            counters["peer_bytes_received"] = s["peer_bytes_read"]
        return counters, {t.name: t.stored for t in self._all_tiers()}  # bytes of copies, not room lent

    def stats(self, brief: bool = False) -> dict:
        """``node_stats`` as they cross the socket and MPI (``NodeStats.to_dict``)."""
        return self.node_stats(brief).to_dict()

    def node_stats(self, brief: bool = False) -> NodeStats:
        """This node's numbers, assembled from its parts' slices (the report module turns them
        into the report). ``brief`` (the launcher's progress polls) leaves out the timeline
        and the size classes, whose cost grows with the job's length and the dataset's size."""
        front_door = None
        if self._door_keeper is not None:
            self.absorb_front_door()
            front_door = self._door_keeper.stats()
        with self._lock:
            outcomes = collections.Counter(self.outcomes)
        for slot, n in (front_door or {}).get("hits_by_slot", {}).items():  # opens the door answered itself
            outcomes[Outcome.ALREADY_FETCHED if slot == protocol.SLOT_PEER else Outcome.ALREADY_STAGED] += n
        timeline = classes = None
        if not brief:
            self._sampler.sample()  # the last, partial interval
            # the peer area is a tier of the stager's: its files count as staged "peer"
            timeline = self.timeline.to_dict()
            blocks = self.stager.blocks.held() if self.stager.blocks is not None else None
            classes = size_classes(self.snapshot.files, self.stager.staged.copy(), set(), blocks)
            if self._listed is not None and self._listed.listed:  # the bytes of the files described so far
                self.dataset_bytes, self._unsized = self.snapshot.total_bytes, self.snapshot.files.undescribed()
        ready_at = self.snapshot_ready_at
        return NodeStats(
            node=self.node, host=socket.gethostname(), uptime_seconds=round(time.time() - self.started, 3),
            snapshot_seconds=round(self.snapshot_seconds, 3), snapshot=self.snapshot_how,
            # when the snapshot was ready (or failed), in seconds after the daemon started and
            # as a time stamp: the application may have started long before (docs/design.md)
            snapshot_ready_seconds=round(ready_at - self.started, 3) if ready_at is not None else None,
            snapshot_ready_at=round(ready_at, 3) if ready_at is not None else None,
            **shim_counters(self.counters_path, self._slot_names(), self.config.dataset.roots),
            staging=self.stager.stats() | {"policy": self.config.staging.policy, "in_flight": self.stager.in_flight()}
            | (self.stores.stats(self.stager) if self.stores is not None else {}),
            tiers=[t.describe() for t in self._all_tiers()],
            tier_errors=dict(self.tier_errors),
            resolves={str(k): v for k, v in outcomes.items()},
            peer=self.role.peer_stats() if self.role is not None else {},
            dataset={"files": len(self.snapshot.files), "bytes": self.dataset_bytes}
            | ({"unsized": self._unsized} if self._unsized else {}),
            inflated_bytes=self.resolver.inflated_bytes, front_door=front_door,
            cluster=self.role.stats() if self.role is not None else {},
            writeback=self.writeback.stats() if self.writeback is not None else None,
            timeline=timeline, size_classes=classes)

    # -- what others ask of it, and its end -----------------------------------------------
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
            # what the shim checks its own view against (a container's /data may be other files)
            protocol.ENV_ROOT_IDS: protocol.format_ids(_identities(
                (k, root) for k, root in enumerate(self.config.dataset.roots)
                if self.stores is None or k not in self.stores.mounts)),
            protocol.ENV_PROBE_IDS: protocol.format_ids(_identities(probe)),
        }
        if self.stores is not None:  # no PFS behind these roots: what the daemon cannot serve fails (EIO)
            env[protocol.ENV_STORE_ROOTS] = ",".join(str(k) for k in sorted(self.stores.mounts))
        env |= shared_tier.client_env(self.tiers)  # copies other jobs staged: checked by the shim
        if self.writeback is not None:  # its calls' own socket where the server made it (node/writeback_door.py)
            door = self.instance.writeback_socket_path
            env |= self.writeback.client_env(door if os.path.exists(door) else None)
        if self.config.staging.validate == "open":
            env[protocol.ENV_ASK_FIRST] = "1"  # every open asks the daemon, which checks the PFS once per file
        return env

    def describe(self) -> dict:
        """Who this daemon is, for a launcher deciding whether to attach."""
        return {"run": self.run_id, "node": self.node, "roots": list(self.config.dataset.roots), "pid": os.getpid(),
                "served": served(self.config), "config": self.config.source, "tier_errors": dict(self.tier_errors),
                "tier_sharing": shared_tier.sharing(self.tiers),
                # each tier's filesystem's free space when it was made, and its reserve: the launcher says at
                # the start which tier that leaves no room (report/text.py, no_room_words)
                "tier_room": {t.name: {"filesystem_free_at_start": t.filesystem.at_start,
                                       "filesystem_reserve": t.filesystem.reserve,
                                       "filesystem_reserve_from": t.filesystem.whence}
                              for t in self._all_tiers() if t.filesystem is not None}}

    def close(self) -> None:
        """Stop staging and remove what the run asked not to keep. The run directory keeps
        the daemon's log and the report; the index (as large as the dataset's names) goes.
        A walk still under way is left to end on its own; nothing it finds is used.

        Every copy into the tiers stops before they are removed: the front door's (its
        threads joined), the stagers' (the walk's streaming one included: their threads,
        the askers copying inline, the ranges of large files; see ``Stager.drain``), the
        decodes. Nothing re-creates a tier's directory after it went."""
        with self.gate.lock, self._lock:
            self.gate.close_locked()
            stagers = list(self._stagers)
        self._sampler.stop()
        if self._door_keeper is not None:
            self._door_keeper.stop()
        for stager in stagers:
            stager.shutdown()
        deadline = time.monotonic() + CLOSE_DRAIN_SECONDS
        for stager in stagers:
            if not stager.drain(max(0.0, deadline - time.monotonic())):
                log.warning("a copy from the PFS did not stop within %.0f s of the daemon's close; "
                            "the tiers are removed without it", CLOSE_DRAIN_SECONDS)
        self.resolver.close()  # its decodes finish before the tiers go
        if self.writeback is not None:  # everything the job closed on the PFS, or kept for `monarch drain`
            self.writeback.close()
        if self.role is not None:
            self.role.close()
        if self._listed is not None and self.role is None and self.snapshot_how.startswith(("walked", "reused")):
            self._listed.keep(self._snapshot_cache())
        self._remove_index()
        for tier in self._all_tiers():
            tier.remove()
        if self.stores is not None:
            self.stores.close()
        self.instance.release()  # the counters stay, with the log and the report, until the next instance


def _identities(dirs) -> list[tuple[int, int, int]]:
    """(k, device, inode) of each directory that exists (a root, a tier folder): the shim serves a
    root, or probes a folder, only where its own path names the same object (a container's or a
    chroot's ``/data`` may be other files than the daemon's)."""
    out = []
    for k, path in dirs:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append((k, st.st_dev, st.st_ino))
    return out
