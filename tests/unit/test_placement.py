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
