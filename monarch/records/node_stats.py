"""What one node tells the report: its statistics as one dataclass (``NodeStats``) and the
slices inside it, as each part reports them.

The daemon fills it (``monarch/node/stats.py`` reads the shim's counters and the size
classes into it); the launcher, its progress line and the report read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, TypedDict


# -- the slices, as each part reports them (docs/report.md) ------------------------
class Opened(TypedDict, total=False):
    """Opens served from one slot (a tier, the peer area, the PFS): the shim's counters."""
    opens: int
    bytes: int            # read with read, pread, readv ... and delivered by fread: every one seen
    opens_uncounted: int  # opens whose bytes the shim did not all see (mapped, or read through a FILE)
    opens_stdio: int      # of those, opens a FILE read (stdio's own reads: their bytes have no bound)
    mapped_bytes: int     # the lengths mmap mapped from the slot's descriptors (page faults read at most that)


def bytes_read_range(counts: Mapping[str, int]) -> tuple[int, int | None]:
    """What the opens of one place read, as a range: (the bytes the shim counted, at most that
    plus the lengths mapped), the two equal when every byte was seen; no upper bound (None) when
    a FILE read some (stdio's internal reads), or in statistics from before mapped lengths
    were counted."""
    counted = counts.get("bytes", 0)
    if not counts.get("opens_uncounted", 0):
        return counted, counted
    if counts.get("opens_stdio", 1) or "mapped_bytes" not in counts:
        return counted, None
    return counted, counted + counts["mapped_bytes"]


class PfsCalls(TypedDict):
    """Calls under a root the shim sent to the PFS for one reason (counted in the PFS's
    opens, or in ``Metadata.pfs``, too)."""
    opens: int
    metadata: int         # stat, access, listings


class Metadata(TypedDict):
    local: int            # stat and listings answered from the index
    pfs: int              # ... passed to the PFS
    off_roots: list[int]  # roots whose metadata the job turned off by writing under them
    # opens and metadata calls sent to the PFS because the snapshot index was not written yet
    # (the daemon was walking: EXTRA_EARLY_*), or because the daemon could not be reached or
    # went silent (EXTRA_LOST_*): the index is what vouches for the tiers and answers metadata
    before_index: PfsCalls
    daemon_lost: PfsCalls


class Decompression(TypedDict):
    opens: int            # compressed copies the shim decoded in the application's process
    ns: int
    bytes: int
    left_to_daemon: int
    reused: int           # decoded into a reused memfd of the shim's pool


class BlockReads(TypedDict):
    opens: int            # opens of files staged by blocks (shim_blocks.c)
    local_bytes: int      # bytes their descriptors read from staged blocks of the copy
    pfs_bytes: int        # bytes they read from the PFS (blocks not staged yet, or no room for them)
    remapped_bytes: int   # bytes of their read-only mappings moved onto the copy
    faults_held: int      # a cluster's mappings: faults that waited for their block from its owner (shim_guard.c)
    fault_wait_ns: int    # ... the time they waited
    faults_late: int      # ... faults read from the PFS, their block not here in time (a page, or the block's pages)
    faults_pages: int     # ... random faults on another owner's block served with its pages from it (shim_pages.c)


class Dataset(TypedDict):
    files: int
    bytes: int


class Staging(TypedDict, total=False):
    """The stager's figures (``Stager.stats``) and the policy it runs."""
    files: int
    bytes: int
    pfs_files_read: int
    pfs_bytes_read: int
    peer_files_read: int
    peer_bytes_read: int
    demand_copies: int
    background_copies: int
    dropped: int
    concurrency: int
    failures: dict[str, int]
    policy: str
    in_flight: int


class ClusterSlice(TypedDict, total=False):
    """The cluster role's slice (``ClusterRole.stats``); empty alone on a node."""
    mode: str             # shard or replicate
    why: str
    owned_files: int
    owned_bytes: int
    owned_estimated: bool  # placed by count: the owned figures are the node's share of the files' count and estimated bytes
    owned_staged_files: int
    owned_staged_bytes: int
    capacities: list[tuple[int, int]]
    reowned_files: int
    replicas: dict[str, Any] | None
    peer_cache: dict[str, Any] | None


class ShimCounters(TypedDict):
    opened_from: dict[str, Opened]
    metadata: Metadata
    decompression: Decompression
    block_reads: BlockReads
    processes_with_shim: int
    raw_calls: dict[str, Any]
    view: dict[str, Any]

# left out of the wire form when None: a brief REPORT (progress polls) and a lost daemon's stats have none
_OMITTED_WHEN_NONE = ("timeline", "size_classes")


@dataclass
class NodeStats:
    """One node's statistics: the daemon fills them (``NodeDaemon.stats``), the launcher, its
    progress line and the report read them. They cross the socket (REPORT, JSON) and MPI as
    ``to_dict()``, the report's ``nodes[]`` entry (docs/report.md); the figures
    inside each field stay the mappings the stager, the tiers and the shim's counters give."""

    node: int = 0
    host: str = ""
    opened_from: dict[str, Opened] = field(default_factory=dict)  # per slot name
    staging: Staging = field(default_factory=dict)
    dataset: Dataset = field(default_factory=lambda: {"files": 0, "bytes": 0})
    peer: dict[str, Any] = field(default_factory=dict)  # the peer layer's counters (Cluster.counters)
    resolves: dict[str, int] = field(default_factory=dict)  # the daemon's answers by outcome (outcomes.py)
    tiers: list[dict[str, Any]] = field(default_factory=list)
    tier_errors: dict[str, str] = field(default_factory=dict)
    uptime_seconds: float = 0.0
    snapshot_seconds: float = 0.0
    snapshot: str | None = None  # reused, walked: <why>, failed: <why>, walking
    snapshot_ready_seconds: float | None = None
    snapshot_ready_at: float | None = None
    metadata: Metadata | dict = field(default_factory=dict)
    decompression: Decompression | dict = field(default_factory=dict)
    block_reads: BlockReads | dict = field(default_factory=dict)
    # processes in which the shim was active (the counters' EXTRA_PROCESSES); None: not told
    processes_with_shim: int | None = None
    # what the application's view lacked of the daemon's (shim_view.c): the shim's FALLBACK_* bits,
    # the roots that named other files for it, the processes that made a call under a root
    view: dict[str, Any] = field(default_factory=dict)
    # system calls made without libc the shim answered: {answered, ns, paused, by_call: {name: calls}}
    raw_calls: dict[str, Any] = field(default_factory=dict)
    writeback: dict[str, Any] | None = None  # the job's writes drained to the PFS (monarch/node/writeback.py)
    inflated_bytes: int = 0
    front_door: dict[str, Any] | None = None
    cluster: ClusterSlice = field(default_factory=dict)
    timeline: dict[str, Any] | None = None
    size_classes: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys added on the way (the server's request counts)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NodeStats":
        names = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in d.items() if k in names},
                   extra={k: v for k, v in d.items() if k not in names})

    @classmethod
    def from_wire(cls, d: Any) -> "NodeStats | None":
        """A node's stats as received; None for a lost node (None, or ``{"missing": True}``)."""
        return cls.from_dict(d) if isinstance(d, dict) and d and not d.get("missing") else None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        for name in _OMITTED_WHEN_NONE:
            if out[name] is None:
                del out[name]
        return out | self.extra
