"""Which files a node may stage while node 0 is still walking: those it will surely own.

The final ``Placement`` cuts the hash ring at cumulative bytes, so it needs the whole
snapshot; a cluster that waited for it would stage nothing during the walk (minutes on a
large PFS). But the cuts are predictable: keys hash uniformly, so the cut after the nodes
holding a fraction F of the weight falls near F of the ring, within a few standard
deviations of sqrt(F (1 - F) (1 + cv^2) / n) for n files whose sizes vary by cv (the
deviation only shrinks as more files come). A key hashed inside its node's expected arc,
more than ``Z`` such deviations from either end, is that node's under the final placement;
the node stages it at once. Keys near a cut are asked again each time the count of files
seen doubles (the margins shrink), and the rest wait for the placement.

The weights must be known before the walk ends: they are when every node has the same
tiers (sharding and replicating then weigh nodes alike), or once the files seen already
outgrow the smallest node (sharding is then certain). See docs/cluster.md.
"""

from __future__ import annotations

import math
from typing import Sequence

from .capacity import SHARD, weights as layout_weights
from .placement import RING_END, ring_hash

Z = 5.0  # standard deviations kept from a cut: a wrong guess is vanishingly rare (and costs
         # one more PFS read of that file, never wrong bytes)


class EarlyShare:
    """This node's surely-owned keys among the files walked so far (one per daemon, fed in
    walk order by ``add``)."""

    def __init__(self, capacities: Sequence[tuple[int, int]], node: int):
        self.capacities = list(capacities)
        self.node = node
        self._smallest = min(t + p for t, p in self.capacities)
        self._n = 0
        self._bytes = 0
        self._sum = 0.0     # of each file's cost (size + 1, as the placement cuts)
        self._sumsq = 0.0
        self._arc: tuple[float, float, float, float] | None = None  # lo, hi, F at lo, F at hi
        self._weights_known = False
        self._undecided: list[tuple[str, int]] = []  # (key, ring hash) near a cut, or before the weights
        self._swept_at = 0
        self._decide_weights()

    def _decide_weights(self) -> None:
        tiers = [t for t, _ in self.capacities]
        sharding_certain = len(self.capacities) > 1 and self._bytes > self._smallest
        if not (len(set(tiers)) == 1 or sharding_certain or len(self.capacities) == 1):
            return
        ws = layout_weights(self.capacities, SHARD)
        live = [n for n, w in enumerate(ws) if w > 0]
        self._weights_known = True
        if self.node not in live:
            return  # owns nothing
        total = sum(ws[n] for n in live)
        before = sum(ws[n] for n in live[:live.index(self.node)])
        f_lo, f_hi = before / total, (before + ws[self.node]) / total
        self._arc = (f_lo * RING_END, f_hi * RING_END, f_lo, f_hi)

    def add(self, files: Sequence[tuple[str, int]]) -> list[str]:
        """Newly walked (key, size) pairs; returns the keys found surely this node's, among
        them and among the undecided ones of earlier parts."""
        for _, size in files:
            cost = size + 1
            self._n += 1
            self._bytes += size
            self._sum += cost
            self._sumsq += cost * cost
        if not self._weights_known:
            self._decide_weights()
        mine = self._sort([(key, ring_hash(key)) for key, _ in files])
        if self._n >= 2 * self._swept_at and self._undecided:  # the margins shrank: ask again
            self._swept_at = self._n
            undecided, self._undecided = self._undecided, []
            mine += self._sort(undecided)
        return mine

    def _sort(self, hashed: list[tuple[str, int]]) -> list[str]:
        """The surely-mine keys of ``hashed``; those still near a cut are kept for later."""
        if not self._weights_known:
            self._undecided.extend(hashed)
            return []
        if self._arc is None:
            return []
        lo, hi, f_lo, f_hi = self._arc
        m_lo, m_hi = self._margin(f_lo), self._margin(f_hi)
        mine = []
        for key, h in hashed:
            if lo + m_lo <= h < hi - m_hi:
                mine.append(key)
            elif lo - m_lo <= h < hi + m_hi:  # may still turn out mine
                self._undecided.append((key, h))
        return mine

    def _margin(self, f: float) -> float:
        """How far (on the ring) the final cut at weight fraction ``f`` may fall from ``f``."""
        if f <= 0.0 or f >= 1.0:
            return 0.0  # the ring's ends are fixed
        if self._n == 0:
            return RING_END
        mean = self._sum / self._n
        cv2 = max(0.0, self._sumsq / self._n / (mean * mean) - 1.0)
        return Z * math.sqrt(f * (1.0 - f) * (1.0 + cv2) / self._n) * RING_END
