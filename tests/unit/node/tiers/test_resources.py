"""Capacities that respect the node: shares of memory or free space, and the memory margin
of RAM tiers (psutil replaced by fixed readings)."""

import collections
import os

import pytest

from monarch.node.tiers import resources
from monarch.config import TierConfig
from monarch.node.tiers.tiers import Tier

GiB = 2**30
VM = collections.namedtuple("VM", "total available")


@pytest.fixture
def node(monkeypatch):
    """A node with 16 GiB of memory, ``state["available"]`` of it available."""
    state = {"available": 8 * GiB, "reads": 0}

    def virtual_memory():
        state["reads"] += 1
        return VM(16 * GiB, state["available"])
    monkeypatch.setattr(resources.psutil, "virtual_memory", virtual_memory)
    return state


def test_guard_refuses_what_would_cross_the_margin(node):
    guard = resources.MemoryGuard(margin=6 * GiB)
    assert guard.allows(1 * GiB)
    assert guard.allows(1 * GiB)       # 8 - 2 = 6: exactly the margin is still allowed
    assert not guard.allows(1)         # the reading is cached, but what was allowed since counts
    assert node["reads"] == 1


def test_guard_rereads_after_max_age(node, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(resources.time, "monotonic", lambda: now[0])
    guard = resources.MemoryGuard(margin=1 * GiB, max_age=0.5)
    assert guard.allows(6 * GiB)
    node["available"] = 1 * GiB + 100    # the application grew
    assert not guard.allows(GiB + 1)     # 8 - 6 - (1 + 1 byte) < 1 on the cached reading already
    now[0] += 0.6
    assert guard.allows(100) and not guard.allows(1)
    assert node["reads"] == 2


def test_margin_as_share_of_total_memory(node):
    assert resources.margin_bytes(0, 0.10) == int(1.6 * GiB)
    assert resources.margin_bytes(3 * GiB, None) == 3 * GiB


def _tier(tmp_path, monkeypatch, capacity, share=None, in_memory=True, margin=1 * GiB):
    monkeypatch.setattr("monarch.node.tiers.tiers.is_memory_backed", lambda path: in_memory)
    monkeypatch.setattr(resources, "is_memory_backed", lambda path: in_memory)
    cfg = TierConfig("ram", str(tmp_path / "base"), capacity, capacity_share=share)
    os.makedirs(cfg.path)
    return Tier.from_config(cfg, 0, "run1", 0, (str(tmp_path / "ds"),), memory_margin=margin)


def test_a_ram_tier_larger_than_the_node_stops_at_the_margin(tmp_path, monkeypatch, node):
    tier = _tier(tmp_path, monkeypatch, capacity=64 * GiB)  # far more than the node has
    taken = 0
    while tier.reserve(512 * 2**20):
        taken += 512 * 2**20
    assert taken == 7 * GiB  # 8 GiB available, 1 GiB margin kept
    assert tier.refused == {"memory_margin": 1}
    d = tier.describe()
    # nothing copied: the room taken is reserved, not used (used is the bytes of copies)
    assert d["stopped"] == "memory_margin" and d["used"] + d["reserved"] == 7 * GiB and d["memory_margin"] == GiB


def test_capacity_refusals_are_told_apart(tmp_path, monkeypatch, node):
    tier = _tier(tmp_path, monkeypatch, capacity=1 * GiB)
    assert tier.reserve(GiB) and not tier.reserve(1)
    tier.mark_full("ENOSPC after 1 bytes")
    assert not tier.reserve(1)
    assert tier.refused == {"full": 1, "filesystem_full": 1}
    assert tier.describe()["stopped"] == "filesystem_full"


def test_a_disk_tier_has_no_memory_guard(tmp_path, monkeypatch, node):
    node["available"] = 0
    tier = _tier(tmp_path, monkeypatch, capacity=1 * GiB, in_memory=False)
    assert tier.memory is None and tier.reserve(GiB)


def test_capacity_share_of_available_memory(tmp_path, monkeypatch, node):
    tier = _tier(tmp_path, monkeypatch, capacity=0, share=0.5)
    assert tier.capacity == 4 * GiB
    assert tier.describe()["capacity_from"] == "50% of available memory"


def test_capacity_share_of_free_space(tmp_path, monkeypatch, node):
    monkeypatch.setattr(resources, "free_space", lambda path: 100 * GiB)
    tier = _tier(tmp_path, monkeypatch, capacity=0, share=0.25, in_memory=False)
    assert tier.capacity == 25 * GiB
    assert tier.describe()["capacity_from"].startswith("25% of free space on ")


def test_dev_shm_is_memory_and_the_root_filesystem_is_not():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    assert resources.filesystem_type("/dev/shm") in ("tmpfs", "ramfs")
    assert resources.is_memory_backed("/dev/shm/some/dir/below")
    assert resources.free_space("/") > 0
