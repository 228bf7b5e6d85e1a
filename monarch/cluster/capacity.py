"""What each node can hold, exchanged once, and the layout decided from it.

Every node tells every other its capacity (``Cluster.allgather_ints``: its tiers' bytes and
its peer area's), then each builds the same ``Placement`` from the shared snapshot and
those capacities: nothing else is negotiated.

* **replicate** when every node can hold the whole dataset (its tiers + peer area >= the
  dataset's bytes): each node stages what it owns from the PFS and copies the rest from
  the owners, pinned (the peer area is a store); the PFS is read once for the cluster.
* **shard** otherwise: each file has one owner, weighted by its *tiers'* capacity (the
  place an owned file is kept, pinned, from the job's start; the peer area is then an
  evicting cache of other nodes' files, see ``monarch/node/peer/peer_cache.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..routes import staged_by_blocks
from ..sizes import allocated_size
from . import ranges
from .placement import Placement

if TYPE_CHECKING:
    from .peer import Cluster

log = logging.getLogger(__name__)

REPLICATE, SHARD = "replicate", "shard"
SIZE_SAMPLES = 64  # a listing's files node 0 stats to estimate the dataset's bytes (plan_by_count)


@dataclass
class Layout:
    """This job's layout, the same on every node."""
    mode: str
    why: str
    placement: Placement
    capacities: list[tuple[int, int]]  # per node: (tiers' bytes, peer area's bytes)
    owned: dict = field(default_factory=dict)  # this node: files and bytes it owns


def decide(capacities: list[tuple[int, int]], total: int) -> tuple[str, str]:
    """Replicate or shard, and why (in words for the log and the report)."""
    smallest = min(t + p for t, p in capacities)
    if len(capacities) > 1 and smallest >= total:
        return REPLICATE, (f"every node can hold the whole dataset ({total} bytes; the smallest node holds "
                           f"{smallest}): each keeps a full copy, the PFS is read once")
    if len(capacities) == 1:
        return SHARD, "one node"
    return SHARD, (f"the dataset ({total} bytes) is larger than the smallest node ({smallest} bytes): each file "
                   "has one owner, by the nodes' tier capacity; the peer area caches other nodes' files")


def weights(capacities: list[tuple[int, int]], mode: str) -> list[int]:
    """Placement weights: tiers' bytes when sharding (where owned files go), all alike when
    replicating (every node holds everything; ownership only says who reads the PFS)."""
    if mode == REPLICATE:
        return [1] * len(capacities)
    ws = [t for t, _ in capacities]
    return ws if any(ws) else [1] * len(capacities)


def exchange(cluster: Cluster, tiers_bytes: int, peer_bytes: int, unit: int = 1,
             timeout: float | None = 120.0) -> tuple[list[tuple[int, int]], int]:
    """Collective: every node's (tiers' bytes, peer area's bytes), indexed by node, and the
    largest allocation unit of their tiers (what a file's copy takes is its size rounded up
    to it: the placement weighs files by that, so that each owner's share fits its tiers as
    they count it). Known before the walk (a node stages what it surely owns as the walk
    goes: see early.py)."""
    gathered = cluster.allgather_ints([tiers_bytes, peer_bytes, unit], timeout)
    return [(int(t), int(p)) for t, p, _ in gathered], max(1, max(int(u) for _, _, u in gathered))


def plan(cluster: Cluster, files: dict, capacities: list[tuple[int, int]], unit: int = 1,
         sampled: list[int] | None = None) -> Layout:
    """Decide, build the placement (the same on every node) and hand it to ``cluster``; each
    file weighs what its copy takes, its size rounded up to ``unit``. A listing's files (sizes
    unknown until each is opened) are placed by count: see ``plan_by_count`` (``sampled``: the
    sizes of a spread sample of them, node 0's, the same on every node)."""
    if listed_sizes_unknown(files):
        return plan_by_count(cluster, files, capacities, unit, sampled or [])
    total = sum(allocated_size(info.size, unit) for info in files.values())
    mode, why = decide(capacities, total)
    # a large file is owned by ranges, spread over every node (ranges.py), not whole by one
    placement = Placement.build(((k, allocated_size(info.size, unit)) for k, info in files.items()
                                 if not staged_by_blocks(info.size)), weights(capacities, mode))
    cluster.use_placement(placement)
    owned_files = owned_bytes = 0
    for key, info in files.items():
        if staged_by_blocks(info.size):
            owned_bytes += ranges.owned_bytes(key, info.size, cluster.node, cluster.nodes)
        elif placement.owner(key) == cluster.node:
            owned_files += 1
            owned_bytes += info.size
    log.info("cluster layout: %s (%s); this node owns %d files, %d bytes", mode, why, owned_files, owned_bytes)
    return Layout(mode, why, placement, capacities, {"files": owned_files, "bytes": owned_bytes})


def listed_sizes_unknown(files) -> bool:
    """Are most of ``files`` a listing's, named without a stat (their sizes come with their opens)?"""
    undescribed = getattr(files, "undescribed", None)  # the node's IndexTable's (a floor above this one)
    return undescribed is not None and 2 * undescribed() > len(files)


def plan_by_count(cluster: Cluster, files, capacities: list[tuple[int, int]], unit: int, sampled: list[int]) -> Layout:
    """The placement of a listing's files, known by name only: each node's arc of the hash ring is
    its weight's share of the ring itself (uniform hashes put its share of the files in it, within
    a few standard deviations: sqrt(n) of n), so no size is needed and no key is held. The dataset's
    bytes, for replicate or shard, are estimated from ``sampled``: the sizes of SIZE_SAMPLES files
    spread over the listing, which node 0 stats before it shares the index."""
    sampled = [allocated_size(size, unit) for size in sampled]
    total, high = estimated_bytes(sampled, len(files))
    mode, why = decide(capacities, high)  # replicated only where every node holds the most it may be
    ws = weights(capacities, mode)
    placement = Placement.build((), ws)
    cluster.use_placement(placement)
    share = ws[cluster.node] / sum(ws)
    owned = {"files": round(share * len(files)), "bytes": round(share * total), "estimated": True}
    why += f" (bytes estimated from {len(sampled)} files of {len(files)}; placed by count)"
    log.info("cluster layout: %s (%s); this node owns about %d files, %d bytes", mode, why, owned["files"],
             owned["bytes"])
    return Layout(mode, why, placement, capacities, owned)


def estimated_bytes(sampled: list[int], files: int) -> tuple[int, int]:
    """The bytes of ``files`` files estimated from the sizes of a sample of them: the sample's mean
    times the count, and that plus three standard errors (an estimate low by chance would have
    every node try to hold more than it can)."""
    if not sampled:
        return 0, 0
    k = len(sampled)
    mean = sum(sampled) / k
    sd = (sum((s - mean) ** 2 for s in sampled) / (k - 1)) ** 0.5 if k > 1 else mean
    return round(mean * files), round((mean + 3 * sd / k ** 0.5) * files)
