"""The layout from the nodes' capacities (monarch/cluster/capacity.py): replicate only when every
node can hold the whole dataset, shard by the tiers' bytes otherwise, the same on every node."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from monarch.cluster.capacity import REPLICATE, SHARD, decide, exchange, plan, weights


@dataclass
class Info:
    size: int


class FakeCluster:
    """What capacity.py asks of a ``Cluster``: its node, the allgather, where the placement goes."""

    def __init__(self, node: int, gathered: list[list[int]] | None = None):
        self.node = node
        self.gathered = gathered
        self.placement = None
        self.asked: list = []

    def allgather_ints(self, values, timeout):
        self.asked.append((list(values), timeout))
        return self.gathered

    def use_placement(self, placement):
        self.placement = placement


@pytest.mark.parametrize("capacities, total, mode", [
    ([(100, 0), (100, 0)], 100, REPLICATE),   # exactly the dataset: each holds it all
    ([(60, 40), (100, 0)], 100, REPLICATE),   # the peer area counts toward holding it all
    ([(100, 0), (99, 0)], 100, SHARD),        # one byte short on the smallest node
    ([(10 ** 12, 0)], 100, SHARD),            # one node: nothing to replicate to
])
def test_replicate_only_when_the_smallest_node_holds_the_whole_dataset(capacities, total, mode):
    got, why = decide(capacities, total)
    assert got == mode and why
    assert ("one node" == why) == (len(capacities) == 1)


def test_sharding_weighs_the_tiers_and_replicating_weighs_all_alike():
    assert weights([(300, 5), (100, 7)], SHARD) == [300, 100]  # the peer area caches, it does not own
    assert weights([(300, 5), (100, 7)], REPLICATE) == [1, 1]
    assert weights([(0, 5), (0, 7)], SHARD) == [1, 1]  # no tiers anywhere: still every node owns a share


def test_the_exchange_gives_each_nodes_capacity_and_the_largest_allocation_unit():
    cluster = FakeCluster(0, [[100, 10, 4096], [200, 20, 512], [300, 30, 0]])
    capacities, unit = exchange(cluster, 100, 10, 4096, timeout=7.0)
    assert cluster.asked == [([100, 10, 4096], 7.0)]
    assert capacities == [(100, 10), (200, 20), (300, 30)] and unit == 4096
    assert exchange(FakeCluster(0, [[1, 2, 0], [3, 4, 0]]), 1, 2)[1] == 1  # never below one byte


def test_every_node_plans_the_same_placement_and_counts_what_it_owns():
    files = {f"0/f{i:04d}": Info(1000 + i) for i in range(400)}
    capacities = [(300_000, 0), (300_000, 0), (300_000, 0)]  # 3 x 300 kB < 0.5 MB: shard
    layouts = [plan(FakeCluster(node), files, capacities, unit=4096) for node in range(3)]
    assert {lay.mode for lay in layouts} == {SHARD}
    owners = [[lay.placement.owner(k) for k in sorted(files)] for lay in layouts]
    assert owners[0] == owners[1] == owners[2]
    for node, lay in enumerate(layouts):
        mine = [k for k in files if lay.placement.owner(k) == node]
        assert lay.owned == {"files": len(mine), "bytes": sum(files[k].size for k in mine)}
    assert sum(lay.owned["files"] for lay in layouts) == len(files)
    assert sum(lay.owned["bytes"] for lay in layouts) == sum(i.size for i in files.values())


def test_the_plan_weighs_each_file_by_what_its_copy_takes_in_the_tiers():
    # 40 files of 1 byte take 40 units of 4 KiB: 160 KiB, more than a node's 100 KiB, so the
    # layout shards, though their 40 bytes would fit anywhere
    files = {f"0/f{i}": Info(1) for i in range(40)}
    cluster = FakeCluster(1)
    layout = plan(cluster, files, [(100 << 10, 0), (100 << 10, 0)], unit=4096)
    assert layout.mode == SHARD and cluster.placement is layout.placement
    assert plan(FakeCluster(1), files, [(100 << 10, 0), (100 << 10, 0)], unit=1).mode == REPLICATE


class Listing(dict):
    """A listing's files as capacity.py sees them (the node's IndexTable): their count, and how many
    have no size yet (all of them)."""

    def undescribed(self) -> int:
        return len(self)


def test_a_listing_is_placed_by_count_the_same_on_every_node_with_no_key_held():
    files = Listing((f"0/d{i // 1000}/f{i:06d}", Info(0)) for i in range(40_000))
    capacities = [(96 << 20, 0), (32 << 20, 0)]  # tiers 3:1, the dataset (160 MiB) larger than either: shard
    sampled = [3000] * 64
    layouts = [plan(FakeCluster(node), files, capacities, unit=4096, sampled=sampled) for node in range(2)]
    assert {lay.mode for lay in layouts} == {SHARD} and "placed by count" in layouts[0].why
    assert len(layouts[0].placement) == 0  # cut on the ring itself: no key held, no size needed
    owners = [lay.placement.owner(k) for k in files for lay in layouts]
    assert owners[0::2] == owners[1::2]  # the same owner on every node
    share = owners[0::2].count(0) / len(files)
    assert abs(share - 0.75) < 0.01  # its weight's share of the files, within a few sqrt(n) of n
    assert layouts[0].owned == {"files": 30_000, "bytes": 30_000 * 4096, "estimated": True}


def test_a_listing_is_replicated_only_where_every_node_holds_the_most_its_bytes_may_be():
    files = Listing((f"0/f{i}", Info(0)) for i in range(1000))
    even = [4096] * 64  # every sample one page: the estimate is exact
    assert plan(FakeCluster(0), files, [(1000 * 4096, 0)] * 2, 4096, even).mode == REPLICATE
    # the same mean with a spread: the estimate's margin (3 standard errors) no longer fits
    spread = [4096, 3 * 4096] * 32
    assert plan(FakeCluster(0), files, [(2000 * 4096, 0)] * 2, 4096, spread).mode == SHARD
    assert plan(FakeCluster(0), files, [(2400 * 4096, 0)] * 2, 4096, spread).mode == REPLICATE
