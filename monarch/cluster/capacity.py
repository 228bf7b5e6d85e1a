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


def plan(cluster: Cluster, files: dict, capacities: list[tuple[int, int]], unit: int = 1) -> Layout:
    """Decide, build the placement (the same on every node) and hand it to ``cluster``; each
    file weighs what its copy takes, its size rounded up to ``unit``."""
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
