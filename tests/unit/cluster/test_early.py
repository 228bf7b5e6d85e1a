"""Staging during the walk (monarch/cluster/early.py): a node stages only keys it will own."""

import random

import pytest

from monarch.cluster.capacity import SHARD, weights
from monarch.cluster.early import EarlyShare
from monarch.cluster.placement import Placement


def dataset(n, sizes, seed):
    rng = random.Random(seed)
    if sizes == "equal":
        return [(f"0/train/{i:07d}.jpg", 110_000) for i in range(n)]
    if sizes == "lognormal":
        return [(f"0/train/{i:07d}.jpg", int(rng.lognormvariate(11, 1.2))) for i in range(n)]
    return [(f"0/d{i % 17}/{i}", rng.choice([0, 1, 4096, 10 << 20])) for i in range(n)]  # "mixed"


def early_keys(items, capacities, node, step):
    """Each node's surely-owned keys, asked as the walk's parts come (``step`` files each)."""
    early, out = EarlyShare(capacities, node), []
    for i in range(0, len(items), step):
        out += early.add(items[i:i + step])
    assert len(out) == len(set(out)), "a key was given twice"
    return set(out)


@pytest.mark.parametrize("nodes", [1, 2, 4, 8, 32])
@pytest.mark.parametrize("sizes", ["equal", "lognormal", "mixed"])
def test_a_node_stages_early_only_what_the_final_placement_gives_it(nodes, sizes):
    items = dataset(3000, sizes, seed=nodes)
    random.Random(1).shuffle(items)  # the walk's order is not the ring's
    capacities = [(24 << 20, 4 << 20)] * nodes
    final = Placement.build(items, weights(capacities, SHARD))
    for node in range(nodes):
        wrong = [k for k in early_keys(items, capacities, node, step=97) if final.owner(k) != node]
        assert not wrong, f"node {node} would stage {len(wrong)} files it does not own: {wrong[:3]}"


def test_most_of_a_share_is_staged_during_the_walk_with_few_nodes():
    items = dataset(1200, "equal", seed=3)
    capacities = [(24 << 20, 4 << 20)] * 4
    final = Placement.build(items, weights(capacities, SHARD))
    for node in range(4):
        owned = {k for k, _ in items if final.owner(k) == node}
        early = early_keys(items, capacities, node, step=100)
        assert early <= owned and len(early) >= 0.3 * len(owned), (node, len(early), len(owned))


def test_one_node_stages_everything_at_once():
    items = dataset(50, "mixed", seed=5)
    assert early_keys(items, [(1 << 30, 0)], 0, step=1) == {k for k, _ in items}


def test_unlike_nodes_wait_until_sharding_is_certain():
    """Replicating weighs nodes alike, sharding by their tiers: until the files seen outgrow
    the smallest node, the weights (and so the arcs) are not known."""
    capacities = [(10 << 20, 0), (30 << 20, 0)]
    early = EarlyShare(capacities, 1)
    assert early.add([(f"0/{i}", 1 << 20) for i in range(5)]) == []  # 5 MiB: may still fit on every node
    later = early.add([(f"1/{i}", 1 << 20) for i in range(10_000)])  # larger than node 0: sharded, by tiers
    assert any(k.startswith("0/") for k in later) and any(k.startswith("1/") for k in later)


def test_a_node_without_capacity_stages_nothing():
    early = EarlyShare([(0, 0), (1 << 30, 0)], 0)
    assert early.add([(f"0/{i}", 100) for i in range(10_000)]) == []
