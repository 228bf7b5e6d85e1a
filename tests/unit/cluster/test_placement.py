"""Rendezvous placement: deterministic, balanced, minimal movement."""

import subprocess
import sys

import pytest

from monarch.cluster import owner
from monarch.cluster.placement import weight

KEYS = [f"{i % 3}/train/n{i % 1000:04d}/img_{i:06d}.jpg" for i in range(10_000)]


def test_deterministic_across_processes():
    here = [owner(k, 7) for k in KEYS[:500]]
    code = ("import sys; from monarch.cluster import owner; "
            "print(','.join(str(owner(f'{i % 3}/train/n{i % 1000:04d}/img_{i:06d}.jpg', 7)) for i in range(500)))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert there.strip().split(",") == [str(o) for o in here]


def test_owner_is_the_highest_weight():
    for key in KEYS[:200]:
        o = owner(key, 5)
        assert all(weight(key, o) >= weight(key, n) for n in range(5))


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_balance(nodes):
    counts = [0] * nodes
    for key in KEYS:
        counts[owner(key, nodes)] += 1
    ideal = len(KEYS) / nodes
    assert sum(counts) == len(KEYS)
    assert max(abs(c - ideal) for c in counts) <= 0.10 * ideal, counts


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_adding_a_node_moves_only_its_share(nodes):
    before = [owner(k, nodes) for k in KEYS]
    after = [owner(k, nodes + 1) for k in KEYS]
    moved = [(b, a) for b, a in zip(before, after) if b != a]
    assert all(a == nodes for _, a in moved), "a key moved between old nodes"
    share = len(KEYS) / (nodes + 1)
    assert abs(len(moved) - share) <= 0.10 * share


def test_single_node_and_bad_count():
    assert {owner(k, 1) for k in KEYS[:100]} == {0}
    with pytest.raises(ValueError):
        owner("x", 0)


# -- Placement: bounded capacity-weighted shares ------------------------------------------

import os  # noqa: E402
import random  # noqa: E402

from monarch.cluster.placement import Placement  # noqa: E402


def uneven_items(n=20_000, seed=7):
    """Sizes from 10 B to ~4 MiB, heavy-tailed like image and shard datasets."""
    rng = random.Random(seed)
    return [(f"0/train/n{i % 997:04d}/img_{i:06d}.jpg", int(10 * 2 ** rng.uniform(0, 18))) for i in range(n)]


ITEMS = uneven_items()
BIGGEST = max(s for _, s in ITEMS)
SIZE = dict(ITEMS)


@pytest.mark.parametrize("weights", [[1] * 8, [1, 2, 3, 4, 5], [5, 0, 1, 1, 3, 0, 8]])
def test_shares_are_within_one_file_of_the_capacity_weighted_share(weights):
    p = Placement.build(ITEMS, weights)
    shares = p.shares()
    total = sum(SIZE.values())
    assert sum(shares) == total == p.total_bytes and len(p) == len(ITEMS)
    for node, w in enumerate(weights):
        target = total * w / sum(weights)
        # one file either way, plus the 1-byte-per-file cost of cutting (see build)
        assert abs(shares[node] - target) <= BIGGEST + len(ITEMS) / len(weights), (node, shares, target)
    counted = [0] * len(weights)
    for key, size in ITEMS:
        counted[p.owner(key)] += size
    assert counted == shares
    assert all(shares[n] == 0 for n, w in enumerate(weights) if w == 0)


def test_owner_of_a_key_outside_the_snapshot_and_of_an_empty_dataset():
    p = Placement.build(ITEMS[:100], [1, 0, 1])
    assert {p.owner(f"new/{i}") for i in range(300)} == {0, 2}
    empty = Placement.build([], [1, 3])
    owners = [empty.owner(f"k{i}") for i in range(4000)]
    assert set(owners) == {0, 1} and 800 < owners.count(0) < 1200  # the hash range cut 1:3
    assert empty.shares() == [0, 0]


def test_bad_weights():
    for weights in ([], [0, 0], [1, -1], [1.5, 2]):
        with pytest.raises(ValueError):
            Placement.build(ITEMS[:10], weights)


PROBE = ("import sys, json; from monarch.cluster.placement import Placement; "
         "from tests.unit.cluster.test_placement import ITEMS; "
         "p = Placement.build(ITEMS, [3, 1, 2, 2, 5]); keys = [k for k, _ in ITEMS[:3000]]; "
         "print(json.dumps([[p.owner(k), p.owner(k, {0, 3}), p.owners(k, 3)] for k in keys]))")


def test_placement_is_the_same_in_every_process():
    outs = []
    for seed in ("1", "2", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.append(subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                                   env=env, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                                       os.path.dirname(os.path.abspath(__file__)))))).stdout)
    assert outs[0] == outs[1] == outs[2]
    assert outs[0].count("[") > 3000


@pytest.mark.parametrize("lost", [0, 3])
def test_a_loss_moves_exactly_the_lost_nodes_files_spread_over_the_survivors(lost):
    weights = [1, 2, 3, 4, 5]
    p = Placement.build(ITEMS, weights)
    before = {k: p.owner(k) for k, _ in ITEMS}
    after = {k: p.owner(k, {lost}) for k, _ in ITEMS}
    moved = [k for k in before if before[k] != after[k]]
    assert set(moved) == {k for k, o in before.items() if o == lost}
    assert sum(SIZE[k] for k in moved) == p.shares()[lost]
    assert lost not in after.values()
    gained = [0] * len(weights)
    for k in moved:
        gained[after[k]] += SIZE[k]
    rest = sum(w for n, w in enumerate(weights) if n != lost)
    for node, w in enumerate(weights):
        if node != lost:  # the lost share is cut among the survivors by weight, within one file
            assert abs(gained[node] - p.shares()[lost] * w / rest) <= BIGGEST + len(ITEMS), gained


def test_a_second_loss_moves_only_what_the_second_node_holds():
    p = Placement.build(ITEMS, [1] * 6)
    one = {k: p.owner(k, {1}) for k, _ in ITEMS}
    two = {k: p.owner(k, {1, 4}) for k, _ in ITEMS}
    assert {k for k in one if one[k] != two[k]} == {k for k, o in one.items() if o == 4}
    assert two == {k: p.owner(k, {4, 1}) for k, _ in ITEMS}  # the order of the losses does not matter
    with pytest.raises(LookupError):
        p.owner(ITEMS[0][0], set(range(6)))


def test_replicas_are_distinct_and_the_second_takes_over_on_a_loss():
    weights = [2, 1, 0, 1, 3]
    p = Placement.build(ITEMS, weights)
    second = [0] * len(weights)
    for key, size in ITEMS[:5000]:
        three = p.owners(key, 3)
        assert len(set(three)) == 3 and 2 not in three and three[0] == p.owner(key)
        assert three[1] == p.owner(key, {three[0]})
        assert three[2] == p.owner(key, {three[0], three[1]})
        assert p.owners(key, 2, lost={three[0]}) == three[1:]
        assert p.owners(key, 9) == list(p.preference(key)) and len(p.owners(key, 9)) == 4
    for key, size in ITEMS:
        second[p.owners(key, 2)[1]] += size
    assert second == p.second_shares()
    assert sum(second) == p.total_bytes and second[2] == 0


def test_single_live_node_has_no_second_copy():
    p = Placement.build(ITEMS[:50], [0, 7])
    assert all(p.owners(k, 2) == [1] for k, _ in ITEMS[:50])
    assert p.second_shares() == [0, 0]


def test_cluster_owner_asks_the_placement_once_set():
    from monarch.cluster import Cluster
    c = Cluster.__new__(Cluster)  # no MPI: only owner() is exercised
    c.nodes, c.placement, c._lost = 5, None, {}
    assert [c.owner(k) for k, _ in ITEMS[:200]] == [owner(k, 5) for k, _ in ITEMS[:200]]
    c.placement = Placement.build(ITEMS, [1] * 5)
    assert [c.owner(k) for k, _ in ITEMS[:200]] == [c.placement.owner(k) for k, _ in ITEMS[:200]]


def test_cluster_owner_after_a_loss_moves_only_the_lost_nodes_keys():
    """A lost node's keys go to the next node of their preference list; no other key moves."""
    from monarch.cluster import Cluster
    c = Cluster.__new__(Cluster)  # no MPI: only owner() is exercised
    c.nodes, c.node, c._lost = 4, 0, {}
    for c.placement in (Placement.build(ITEMS, [3, 1, 2, 2]), None):  # capacity arcs, then rendezvous
        before = {k: c.owner(k) for k, _ in ITEMS[:2000]}
        c._lost = {2: {"node": 2, "at": 0.0, "why": "proc failed"}}
        after = {k: c.owner(k) for k, _ in ITEMS[:2000]}
        c._lost = {}
        moved = [k for k in before if before[k] != after[k]]
        assert moved and all(before[k] == 2 for k in moved)
        assert sum(1 for k in before if before[k] == 2) == len(moved) and 2 not in after.values()


def test_the_layout_weighs_each_file_by_what_its_copy_takes():
    """A tier counts a copy in whole blocks, so the layout does too: 100 one-byte
    files take 400 KiB of 4 KiB blocks, more than a node's 300 KiB, though their bytes fit."""
    from monarch.cluster import capacity
    from monarch.node.snapshot.snapshot import FileInfo

    class Nodes:
        node, placement = 0, None

        def use_placement(self, placement):
            self.placement = placement

    files = {f"0/f{i}": FileInfo(1, 0) for i in range(100)}
    nodes = [(300 << 10, 0), (300 << 10, 0)]
    assert capacity.plan(Nodes(), files, nodes, unit=1).mode == capacity.REPLICATE
    assert capacity.plan(Nodes(), files, nodes, unit=4096).mode == capacity.SHARD
