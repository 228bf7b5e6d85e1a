"""A large file's ranges -> nodes: who reads each range from the PFS for the whole cluster.

A file staged by blocks (``node/stage/blocks.py``) is not owned whole by one node: it is cut
into ``RANGE``-byte ranges, and each range has an owner, computed alike on every node with
nothing negotiated. The owner reads its ranges from the PFS (once for the cluster) and answers
the other nodes' requests for their blocks; the others fetch those blocks from it.

Placement is rendezvous hashing of ``"<key>#<range>"`` with bounded shares: the ranges are
taken in order, each by the node of highest weight that holds fewer than ``ceil(ranges /
nodes)`` of them, so every node owns the same number of ranges, plus or minus one, and a node
with room for a ``1/nodes`` share of the file (and a range more) holds all of its own. A lost
owner's ranges go to the survivor of highest weight for each (only its ranges move).

16 MiB ranges (16 blocks): a 1 GiB file is 64 ranges, 16 per node of 4; a sequential reader
crosses an owner every 16 MiB, and a random one spreads its requests over every owner.
"""

from __future__ import annotations

import functools
from typing import Collection

from .placement import weight

__all__ = ["RANGE", "range_count", "first_owners", "range_owner", "owned_bytes"]

RANGE = 16 << 20  # bytes of one range (a whole number of blocks: BLOCK divides it)


def range_count(size: int) -> int:
    return -(-size // RANGE)


@functools.lru_cache(maxsize=256)
def first_owners(key: str, size: int, nodes: int) -> tuple[int, ...]:
    """Each range's owner while no node is lost: bounded rendezvous (see the module)."""
    if nodes < 1:
        raise ValueError(f"first_owners(): nodes must be >= 1, got {nodes}")
    count = range_count(size)
    cap = -(-count // nodes)
    held = [0] * nodes
    out = []
    for r in range(count):
        name = f"{key}#{r}"
        for node in sorted(range(nodes), key=lambda n: (-weight(name, n), n)):
            if held[node] < cap:
                held[node] += 1
                out.append(node)
                break
    return tuple(out)


def range_owner(key: str, size: int, r: int, nodes: int, lost: Collection[int] = ()) -> int:
    """The owner of range ``r`` of ``key`` now: its first owner, else (lost) the live node of
    highest weight for it; -1 when every node is lost."""
    first = first_owners(key, size, nodes)[r]
    if first not in lost:
        return first
    name = f"{key}#{r}"
    live = [n for n in range(nodes) if n not in lost]
    return max(live, key=lambda n: (weight(name, n), -n)) if live else -1


def owned_bytes(key: str, size: int, node: int, nodes: int) -> int:
    """The bytes of ``key`` whose ranges ``node`` owns first (``monarch plan``'s figure)."""
    owners = first_owners(key, size, nodes)
    return sum(min(RANGE, size - r * RANGE) for r, n in enumerate(owners) if n == node)
