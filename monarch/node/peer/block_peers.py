"""A cluster's nodes as the sources of a large file's blocks (``stage/blocks.RangePeers``).

Each range of a large file has an owner (``monarch/cluster/ranges.py``, the same answer on
every node): the owner reads its ranges' blocks from the PFS, once for the cluster, and the
other nodes fetch them from it (the peer verb ``range``: ``cluster/fetch.py``, answered by the
owner's ``BlockStager.serve_range``). A lost owner's ranges are a survivor's from then on.
"""

from __future__ import annotations

from typing import Any

from monarch.cluster.ranges import RANGE, first_owners
from monarch.node.stage.block_map import BLOCK

__all__ = ["BlockPeers"]

BLOCKS_PER_RANGE = RANGE // BLOCK
assert RANGE % BLOCK == 0, "a range is a whole number of blocks"


class BlockPeers:
    """``RangePeers`` over the peer layer (``monarch.cluster.Cluster``). ``timeout``: how long
    a fetch waits for the owner (which may read the blocks from the PFS first)."""

    def __init__(self, cluster: Any, timeout: float):
        self.cluster = cluster
        self.node = cluster.node
        self.timeout = timeout

    def owner(self, key: str, size: int, block: int) -> int:
        return self.cluster.range_owner(key, size, block // BLOCKS_PER_RANGE)

    def own_blocks(self, key: str, size: int) -> list[int]:
        blocks = -(-size // BLOCK)
        return [b for r, node in enumerate(first_owners(key, size, self.cluster.nodes)) if node == self.node
                for b in range(r * BLOCKS_PER_RANGE, min(blocks, (r + 1) * BLOCKS_PER_RANGE))]

    def fetch(self, owner: int, key: str, offset: int, length: int, fd: int, version: tuple[int, int]) -> int:
        return self.cluster.fetch_range(owner, key, offset, length, fd, self.timeout, version)

    def offer(self, key: str, slot: int) -> None:
        self.cluster.offer_blocks(key, slot)

    def served_elsewhere(self) -> int:
        return self.cluster.range_bytes_served_in_c()
