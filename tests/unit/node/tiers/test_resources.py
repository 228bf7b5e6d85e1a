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
    monkeypatch.setattr(resources, "free_space", lambda path: 64 * GiB)  # its tmpfs larger than what is available
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


# -- the filesystem's reserve for the application ----------------------------------------------
MiB = 2**20


def test_filesystem_guard_keeps_the_reserve_free_whoever_fills_the_filesystem(monkeypatch):
    now, free, reads = [1000.0], [4 * MiB], []
    monkeypatch.setattr(resources.time, "monotonic", lambda: now[0])
    guard = resources.FilesystemGuard("/x", reserve=MiB, read_free=lambda: reads.append(1) or free[0])
    assert guard.headroom() == 3 * MiB
    assert guard.allows(2 * MiB) and guard.allows(MiB)  # 4 - 3 = 1: exactly the reserve is still allowed
    assert not guard.allows(1) and guard.headroom() == 0  # the cached reading less what was allowed since
    guard.not_taken(MiB)  # allowed, then refused by another guard: not taken after all
    assert guard.headroom() == MiB
    now[0] += 0.6
    free[0] = MiB + 4096  # the copies landed, and the application wrote some more
    assert not guard.allows(8192) and guard.allows(4096)
    assert len(reads) == 2 and guard.describe()["reserve"] == MiB


def test_a_share_of_a_small_tmpfs_is_a_share_of_its_free_space_not_of_the_node(tmp_path, monkeypatch, node):
    """A container's 64 MiB /dev/shm on a node of 8 GiB available: 50% is 32 MiB, not 4 GiB."""
    monkeypatch.setattr(resources, "is_memory_backed", lambda path: True)
    monkeypatch.setattr(resources, "free_space", lambda path: 64 * MiB)
    capacity, whole = resources.share_of_node("/dev/shm", 0.5)
    assert capacity == 32 * MiB and whole == "free space on /dev/shm (less than the available memory)"
    monkeypatch.setattr(resources, "free_space", lambda path: 64 * GiB)  # a tmpfs larger than what is available
    assert resources.share_of_node("/dev/shm", 0.5) == (4 * GiB, "available memory")


@pytest.fixture
def small_fs(tmp_path, monkeypatch):
    """The tier's filesystem as 64 MiB with ``state["free"]`` of it free."""
    state = {"free": 64 * MiB}
    monkeypatch.setattr(resources, "filesystem_size", lambda path: 64 * MiB)
    monkeypatch.setattr("monarch.node.tiers.tiers.filesystem_size", lambda path: 64 * MiB)
    monkeypatch.setattr(resources, "free_space", lambda path: state["free"])
    return state


def _fs_tier(tmp_path, monkeypatch, capacity, reserve, in_memory=True):
    monkeypatch.setattr("monarch.node.tiers.tiers.is_memory_backed", lambda path: in_memory)
    monkeypatch.setattr(resources, "is_memory_backed", lambda path: in_memory)
    cfg = TierConfig("ram", str(tmp_path / "base"), capacity)
    os.makedirs(cfg.path)
    tier = Tier.from_config(cfg, 0, "run1", 0, (str(tmp_path / "ds"),), memory_margin=GiB, filesystem_reserve=reserve)
    for guard in (tier.memory, tier.filesystem):
        if guard is not None:
            guard.max_age = -1  # a fresh reading at each question
    return tier


def test_a_tier_on_a_small_filesystem_leaves_the_reserve_to_the_application(tmp_path, monkeypatch, node, small_fs):
    tier = _fs_tier(tmp_path, monkeypatch, capacity=4 * GiB, reserve=(0, 0.25))
    # the 4 GiB configured is an upper bound: the filesystem's 64 MiB less its 16 MiB reserve
    assert tier.capacity == 48 * MiB
    d = tier.describe()
    assert d["filesystem_reserve"] == 16 * MiB and d["filesystem_reserve_from"].startswith("25% of the 64.0 MiB of ")
    assert d["capacity_from"].startswith("4.0 GiB configured, cut to its filesystem's size less the reserve, 25% of")

    def take(size):  # a copy: its room reserved, then its bytes on the filesystem
        ok = tier.reserve(size)
        small_fs["free"] -= size if ok else 0
        return ok
    assert all(take(MiB) for _ in range(40))
    small_fs["free"] -= 20 * MiB  # the application's own shared memory and semaphores
    assert tier.free_room() == 0 and not tier.has_room(MiB)
    assert not take(MiB)  # 4 MiB left free: the application's room, not the tier's
    assert tier.refused == {"filesystem_reserve": 1} and tier.describe()["stopped"] == "filesystem_reserve"
    assert tier.reserve(MiB, written=True)  # a copy already made costs the filesystem nothing more
    small_fs["free"] += 20 * MiB  # the application let go of it
    assert tier.free_room() == 7 * MiB  # the capacity, 48 MiB, less the 41 MiB taken
    assert all(take(MiB) for _ in range(7)) and not take(MiB)
    assert tier.refused == {"filesystem_reserve": 2}  # the capacity the reserve cut: still the reserve's refusal


def test_the_memory_margin_is_asked_first_and_a_reserve_refusal_takes_nothing_from_it(tmp_path, monkeypatch, node,
                                                                                    small_fs):
    tier = _fs_tier(tmp_path, monkeypatch, capacity=32 * MiB, reserve=(8 * MiB, None))
    assert tier.capacity == 32 * MiB and "capacity_from" not in tier.describe()  # within the filesystem: not cut
    assert tier.describe()["filesystem_reserve_from"].endswith("8.0 MiB (filesystem_reserve) on " +
                                                               (resources.mount_of(tier.path)[0] or tier.path))
    small_fs["free"] = 9 * MiB
    assert not tier.reserve(2 * MiB) and tier.refused == {"filesystem_reserve": 1}
    assert tier.memory.headroom() == 7 * GiB  # the bytes the reserve refused were not taken from the margin
    node["available"] = GiB  # the node's memory is short too: its margin is the reason said
    assert not tier.reserve(2 * MiB) and tier.refused == {"filesystem_reserve": 1, "memory_margin": 1}


def test_no_reserve_is_kept_with_filesystem_reserve_0(tmp_path, monkeypatch, node, small_fs):
    tier = _fs_tier(tmp_path, monkeypatch, capacity=4 * GiB, reserve=(0, None))
    assert tier.filesystem is None and tier.capacity == 4 * GiB  # ENOSPC is what stops it, as before
    small_fs["free"] = 0
    assert tier.reserve(MiB)


def test_a_tier_whose_filesystem_has_no_room_beside_the_reserve_says_so_when_it_is_made(tmp_path, monkeypatch, node,
                                                                                       small_fs, caplog):
    small_fs["free"] = 15 * MiB  # others' files took the rest: less free than the 16 MiB reserve
    tier = _fs_tier(tmp_path, monkeypatch, capacity=4 * GiB, reserve=(0, 0.25))
    assert not tier.reserve(4096) and tier.refused == {"filesystem_reserve": 1}
    assert tier.describe()["filesystem_free_at_start"] == 15 * MiB  # what the launcher and the report say
    assert "tier ram: takes no file: its filesystem has 15728640 bytes free, within the application's reserve " \
           "of 16777216 bytes, 25% of the 64.0 MiB of " in caplog.text
    caplog.clear()
    small_fs["free"] = 17 * MiB
    assert _fs_tier(tmp_path / "room", monkeypatch, capacity=4 * GiB, reserve=(0, 0.25)).reserve(4096)
    assert "takes no file" not in caplog.text


def test_decoded_files_of_a_compressing_tier_keep_the_reserve_too(tmp_path, monkeypatch, node, small_fs):
    from monarch.node.snapshot.snapshot import FileInfo
    info = FileInfo(0, 0, 0o100644)  # a source's stat
    tier = _fs_tier(tmp_path, monkeypatch, capacity=32 * MiB, reserve=(8 * MiB, None))
    tier.set_decoded_cache(16 * MiB)  # decoded bytes beyond the capacity: still on the filesystem
    small_fs["free"] = 9 * MiB
    assert tier.decoded.put("a", b"a" * 4096, info, tier.decoded.token())
    assert not tier.decoded.put("b", b"b" * 2 * MiB, info, tier.decoded.token())  # 7 MiB would be left
    assert tier.decoded.refused == 1 and not os.path.exists(tier.decoded.path_for("b"))
    tier.decoded.close()
