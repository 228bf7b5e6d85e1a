"""File -> node placement.

Two schemes, both computed identically on every node with nothing negotiated:

* ``owner(key, nodes)``: rendezvous (highest-random-weight) hashing from the key and the
  node count alone. Adding a node moves only the keys it wins (about 1/(n+1)); removing one
  moves only its keys. Plain hashing leaves the fullest node ~10 % over the mean share at
  1,024 nodes and 1M files (what the daemon uses today).

* ``Placement``: bounded shares, built from the dataset snapshot (every node has the same:
  node 0 walks and broadcasts it) and the nodes' capacity weights. Every key is hashed
  (xxhash64) onto a ring; the ring, sorted, is cut into one contiguous arc per node holding
  its capacity-weighted share of the *bytes* (cut at cumulative bytes, so each node is
  within one file of its share). ``owner`` is a bisection of the key's hash in the cut
  points: O(log n), no per-key table, and defined for keys the snapshot never saw.

  Each key has a preference list: its arc's node, then the node owning its position when
  that arc is cut again among the other nodes (by their weights, within one file), then
  the others by rendezvous hashing. The owner after losses is the first node of the list
  still alive, so losing a node re-owns exactly what it owned, spread evenly over the
  survivors, and nothing else moves (in any order of losses). Replicas are the next nodes
  of the same list: the node that keeps a key's second copy is the one that takes it over
  when its owner is lost, so a loss needs nothing from the PFS for replicated files.

See docs/cluster.md, "Capacity model and placement".
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Collection, Iterable, Iterator, Sequence

import xxhash

RING_SEED = 0x6D6F6E6172636821  # the ring hash's seed: not a node id, so unrelated to weight(key, node)
RING_END = 1 << 64


def weight(key: str, node: int) -> int:
    """The rendezvous weight of ``node`` for ``key``: xxhash64 of the key, seeded by the node."""
    return xxhash.xxh64_intdigest(key.encode("utf-8", "surrogateescape"), seed=node)


def owner(key: str, nodes: int) -> int:
    """The node in ``range(nodes)`` that owns ``key`` (ties go to the lowest node).

    Cost is one xxhash64 per node (about 0.2 us each): negligible next to a file open up to
    a few hundred nodes.
    """
    if nodes < 1:
        raise ValueError(f"owner(): nodes must be >= 1, got {nodes}")
    best, best_w = 0, -1
    for node in range(nodes):
        w = weight(key, node)
        if w > best_w:
            best, best_w = node, w
    return best


def ring_hash(key: str) -> int:
    """A key's position on the ring of ``Placement`` (xxhash64, fixed seed: the same in every process)."""
    return xxhash.xxh64_intdigest(key.encode("utf-8", "surrogateescape"), seed=RING_SEED)


class _Cut:
    """A hash range cut into contiguous parts: part i covers [starts[i], starts[i+1]) and
    belongs to nodes[i]; firsts[i] is the index (in ring order) of its first key."""

    __slots__ = ("starts", "nodes", "firsts")

    def __init__(self, starts: list[int], nodes: list[int], firsts: list[int]):
        self.starts, self.nodes, self.firsts = starts, nodes, firsts

    def part(self, h: int) -> int:
        # equal starts are empty parts: bisect_right picks the last, the one that holds h
        return bisect_right(self.starts, h) - 1


class Placement:
    """Capacity-weighted bounded shares of a known set of keys (see the module doc).

    Build it with ``Placement.build(items, weights)``: ``items`` the distinct (key, size)
    pairs of the dataset, ``weights`` one non-negative integer per node (its capacity in
    bytes, say; only the ratios matter). A node of weight 0 owns nothing and keeps no replica.
    """

    def __init__(self, weights: Sequence[int], hashes: array, cost: array):
        self.weights = tuple(weights)
        self.nodes = len(self.weights)
        self._hashes = hashes   # the keys' ring hashes, sorted
        self._cost = cost       # cumulative (size + 1) in ring order, len n + 1 (see build)
        self._live = [n for n, w in enumerate(self.weights) if w > 0]
        self._ring = self._split(0, RING_END, 0, len(hashes), self._live)
        self._second: dict[int, _Cut] = {}  # arc -> that arc cut among the other nodes

    @classmethod
    def build(cls, items: Iterable[tuple[str, int]], weights: Sequence[int]) -> "Placement":
        """The placement of ``items`` (key, size) over ``len(weights)`` nodes."""
        weights = list(weights)
        if not weights:
            raise ValueError("Placement.build(): no nodes (weights is empty)")
        if any(not isinstance(w, int) or w < 0 for w in weights):
            raise ValueError(f"Placement.build(): weights must be whole numbers >= 0 (capacities), got {weights[:8]}")
        if not any(weights):
            raise ValueError("Placement.build(): every node has weight 0: no node can own anything")
        hashes, sizes = [], []
        for key, size in items:
            hashes.append(ring_hash(key))
            sizes.append(size)
        order = sorted(range(len(hashes)), key=hashes.__getitem__)
        # Each file costs its size + 1 byte when cutting: empty files are then spread by count
        # (not all piled on one arc); bytes are the cost less the count.
        cost = array("Q", accumulate((sizes[i] + 1 for i in order), initial=0))
        return cls(weights, array("Q", (hashes[i] for i in order)), cost)

    # -- cutting -----------------------------------------------------------------------
    def _split(self, lo: int, hi: int, jlo: int, jhi: int, nodes: list[int]) -> _Cut:
        """Cut [lo, hi), holding keys jlo..jhi-1, into one part per node of ``nodes`` (in that
        order) with its weight's share of their cost, each cut at the nearest key boundary."""
        hashes, cost, weights = self._hashes, self._cost, self.weights
        total = sum(weights[n] for n in nodes)
        base, span = cost[jlo], cost[jhi] - cost[jlo]
        starts, firsts = [lo], [jlo]
        acc = 0
        for n in nodes[:-1]:
            acc += weights[n]
            if span == 0:  # no keys here: cut the hash range itself, for keys not in the snapshot
                starts.append(lo + (hi - lo) * acc // total)
                firsts.append(jlo)
                continue
            target = base + span * acc // total  # integers: the same cut in every process
            j = bisect_left(cost, target, jlo, jhi + 1)
            if j > jlo and target - cost[j - 1] <= cost[j] - target:
                j -= 1
            j = max(j, firsts[-1])
            while jlo < j < jhi and hashes[j - 1] == hashes[j]:  # a hash collision stays on one side
                j += 1
            starts.append(hashes[j] if j < jhi else hi)
            firsts.append(j)
        firsts.append(jhi)
        return _Cut(starts, list(nodes), firsts)

    def _second_cut(self, arc: int, keep: bool = True) -> _Cut:
        """Arc ``arc`` of the ring cut among the other live nodes, in ring order after its node
        (kept for the next look-up unless ``keep`` is false: all arcs' cuts are ~nodes^2 ints)."""
        cut = self._second.get(arc)
        if cut is None:
            ring, me = self._ring, self._ring.nodes[arc]
            k = self._live.index(me)
            others = self._live[k + 1:] + self._live[:k]
            hi = ring.starts[arc + 1] if arc + 1 < len(ring.starts) else RING_END
            cut = self._split(ring.starts[arc], hi, ring.firsts[arc], ring.firsts[arc + 1], others) \
                if others else _Cut([ring.starts[arc]], [], [ring.firsts[arc], ring.firsts[arc + 1]])
            if keep:
                self._second[arc] = cut
        return cut

    # -- answers -----------------------------------------------------------------------
    def preference(self, key: str) -> Iterator[int]:
        """The live nodes in the order they take ``key``: owner, the next owner when it is lost, ..."""
        h = ring_hash(key)
        arc = self._ring.part(h)
        first = self._ring.nodes[arc]
        yield first
        second = self._second_cut(arc)
        if not second.nodes:
            return
        nxt = second.nodes[second.part(h)]
        yield nxt
        rest = [n for n in self._live if n != first and n != nxt]
        rest.sort(key=lambda n: (-weight(key, n), n))
        yield from rest

    def ring(self) -> tuple[list[int], list[int]]:
        """The ring's parts while no node is lost: (starts, nodes), part i the hashes from
        starts[i] (starts[0] 0) to the next start, nodes[i]'s (equal starts: empty parts)."""
        return list(self._ring.starts), list(self._ring.nodes)

    def owner(self, key: str, lost: Collection[int] = ()) -> int:
        """The node that owns ``key`` while the nodes in ``lost`` are gone.

        Raises LookupError when every node with a weight is lost.
        """
        if not lost:
            return self._ring.nodes[self._ring.part(ring_hash(key))]
        for node in self.preference(key):
            if node not in lost:
                return node
        raise LookupError(f"owner of {key!r}: every node with capacity is lost ({len(lost)} nodes)")

    def owners(self, key: str, replicas: int, lost: Collection[int] = ()) -> list[int]:
        """The ``replicas`` distinct nodes that keep ``key`` (owner first); fewer when fewer live."""
        if replicas < 1:
            raise ValueError(f"owners(): replicas must be >= 1, got {replicas}")
        out = []
        for node in self.preference(key):
            if node not in lost:
                out.append(node)
                if len(out) == replicas:
                    break
        return out

    def _bytes(self, jlo: int, jhi: int) -> int:
        return self._cost[jhi] - self._cost[jlo] - (jhi - jlo)

    def shares(self) -> list[int]:
        """Bytes of the built keys each node owns (also what re-owning a lost node moves)."""
        out = [0] * self.nodes
        ring = self._ring
        for i, node in enumerate(ring.nodes):
            out[node] += self._bytes(ring.firsts[i], ring.firsts[i + 1])
        return out

    def second_shares(self) -> list[int]:
        """Bytes of second copies each node keeps with two replicas (= what it takes over from
        the others' losses, each node's share spread over all the others)."""
        out = [0] * self.nodes
        for arc in range(len(self._ring.nodes)):
            cut = self._second_cut(arc, keep=False)
            for i, node in enumerate(cut.nodes):
                out[node] += self._bytes(cut.firsts[i], cut.firsts[i + 1])
        return out

    @property
    def total_bytes(self) -> int:
        return self._bytes(0, len(self._hashes))

    def __len__(self) -> int:
        return len(self._hashes)
