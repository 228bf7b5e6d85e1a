"""What this node's C data path may answer peers by itself: its own raw staged copies.

The owner's end of the C data path (``monarch/cluster/datapath.c``) answers a peer's request
from a table of keys, never from the disk alone. An ``Offers`` listener keeps that table
with the stager's books: a raw copy of a key this node owns is offered when it is published
and withdrawn before it is dropped. Everything else (a compressed copy, a second copy kept
for a peer, a key not staged yet) is not offered: the peer's request then comes back to
Python's protocol and ``ClusterRole.provide``, which stages, decodes and counts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from monarch.node.stage.stager import Stager
from monarch.node.stage.stager_books import StagerListener
from monarch.node.tiers.tiers import Tier

if TYPE_CHECKING:  # the peer layer's floor is above this one
    from monarch.cluster.datapath import DataPath


class Offers(StagerListener):
    def __init__(self, datapath: DataPath, owns: Callable[[str], bool], stager: Stager, tiers: list[Tier]):
        self.datapath = datapath
        self.owns = owns
        for tier in tiers:
            datapath.tier(tier.slot, tier.path)
        with stager.lock:  # what is staged so far, then every event: nothing missed in between
            self.replicas = stager.replicas
            stager.subscribe_locked(self)

    def published(self, key: str, tier: Tier) -> None:
        if not tier.is_compressed(key) and self.owns(key) and key not in self.replicas:
            self.datapath.offer(key, tier.slot)

    def dropped(self, key: str) -> None:
        self.datapath.withdraw(key)
