"""Tiers count what their filesystem allocates: a 1 KiB file takes a 4 KiB page
on tmpfs, so a RAM tier counted in file bytes takes four times its capacity from the node."""

import errno
import hashlib
import os
import subprocess
import threading

import pytest

from monarch.config import TierConfig
from monarch.node.tiers.resources import allocated_size, allocation_unit
from monarch.node.snapshot.snapshot import take_snapshot
from monarch.node.stage.stager import Stager
from monarch.node.stage.stager_books import StagerBooks, StagerListener
from monarch.node.stage.concurrency import Concurrency
from monarch.node.tiers.tiers import Tier

KiB, MiB = 1 << 10, 1 << 20
FILES = 2000
CAPACITY = 4 * MiB  # the files' bytes (2000 KiB) fit, their pages (8000 KiB) do not


@pytest.fixture
def tmpfs(tmp_path):
    """A private tmpfs: its ``df`` counts nothing but this test's tier."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a private tmpfs was refused (unprivileged container?): {r.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def df_used(path: str) -> int:
    """What the filesystem says it has allocated (``df``'s used)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_a_ram_tier_of_1kib_files_counts_the_pages_tmpfs_takes(tmp_path, tmpfs):
    root = tmp_path / "pfs"
    for i in range(FILES):
        d = root / f"d{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(os.urandom(KiB))
    snap = take_snapshot((str(root),))
    tier = Tier.from_config(TierConfig("ram", tmpfs, CAPACITY, False), 2, "r1", 0, ())
    assert tier.unit == os.statvfs(tmpfs).f_frsize == allocation_unit(tmpfs)
    base = df_used(tmpfs)

    peak, done = [0], threading.Event()

    def watch():  # what tmpfs holds while the stager fills it, beside the tier's own account
        while not done.is_set():
            peak[0] = max(peak[0], df_used(tmpfs) - base)
    watcher = threading.Thread(target=watch)
    watcher.start()
    stager = Stager(snap, [tier], threads=4)
    try:
        placed = {k: stager.ensure(k).result(timeout=60) for k in sorted(snap.files)}
    finally:
        done.set()
        watcher.join()
        stager.shutdown()
    held = df_used(tmpfs) - base
    d = tier.describe()
    print(f"\n{d['files']} files: used {d['used']} bytes, allocated {d.get('allocated_bytes')}; "
          f"tmpfs df {held} bytes ({held / max(d['used'], 1):.1f}x the bytes); peak {peak[0]}; capacity {CAPACITY}")

    # tmpfs never held more than the tier's capacity (counting bytes, not pages, would let it hold 4x)
    assert peak[0] <= CAPACITY and held <= CAPACITY
    staged = [k for k, t in placed.items() if t is tier]
    assert 0 < len(staged) < FILES  # it stopped taking files: their pages would cross the capacity
    assert len(staged) == CAPACITY // allocated_size(KiB, tier.unit) == d["files"]
    assert stager.stats()["failures"] == {"no_room": FILES - len(staged)}
    # the account is what tmpfs says it holds, and the report shows both figures
    assert abs(d["allocated_bytes"] - held) <= 0.05 * held
    assert d["allocated_bytes"] == sum(os.stat(tier.path_for(k)).st_blocks * 512 for k in staged)
    assert d["used"] == d["stored_bytes"] == d["logical_bytes"] == len(staged) * KiB
    assert d["allocated_bytes"] + d["reserved"] <= d["capacity"] and d["reserved"] == 0
    # and the copies are the sources' bytes
    assert all(sha(tier.path_for(k)) == sha(snap.source_path(k)) for k in staged)
    tier.remove()


def test_allocation_rounds_up_to_the_unit_and_an_empty_file_takes_nothing(tmp_path):
    (tmp_path / "t").mkdir()
    tier = Tier.from_config(TierConfig("t", str(tmp_path / "t"), 10 * 4096, False), 2, "r1", 0, ())
    tier.unit = 4096
    assert [tier.allocated(n) for n in (0, 1, 4096, 4097)] == [0, 4096, 4096, 8192]
    assert tier.fits(10 * 4096 + 1) is False and tier.fits(9 * 4096 + 1)
    assert tier.reserve(tier.allocated(1)) and tier.reserve(tier.allocated(0))
    tier.committed(1, 1)
    tier.committed(0, 0)
    assert (tier.room, tier.allocated_bytes, tier.stored, tier.used, tier.reserved) == (4096, 4096, 1, 1, 0)
    # a compressed copy rewritten smaller: the pages it no longer takes come back, never more
    assert tier.reserve(tier.allocated(10_000))
    tier.committed(20_000, 10_000)
    tier.shrunk(7000, old=10_000)  # 3 pages -> 1
    assert tier.allocated_bytes == tier.room == 2 * 4096 and tier.stored == 3001
    tier.shrunk(1000)  # the old size unknown: less than a page saved frees none
    assert tier.allocated_bytes == 2 * 4096 and tier.stored == 2001
    tier.forget("k", 20_000, 2001)
    tier.release(tier.allocated(2001))
    assert (tier.room, tier.allocated_bytes) == (4096, 4096)
    tier.remove()


class Told(StagerListener):
    def __init__(self):
        self.dropped_keys = []

    def dropped(self, key):
        self.dropped_keys.append(key)


def test_a_copy_the_front_door_made_pays_its_allocation_or_goes(tmp_path):
    """The door's lease counts files' bytes: entering its copy takes the rest of the allocation,
    and a copy whose allocation does not fit is removed rather than overfill the tier."""
    (tmp_path / "t").mkdir()
    tier = Tier.from_config(TierConfig("t", str(tmp_path / "t"), 4096 + 2000, False), 2, "r1", 0, ())
    tier.unit = 4096
    books = StagerBooks(take_snapshot(()), [tier], Concurrency(fixed=1))
    told = Told()
    books.subscribe(told)
    lease = tier.capacity
    assert tier.reserve(lease, counted=False)  # all the room lent to the door
    for key in ("a", "b"):
        with open(tier.path_for(key), "wb") as f:
            f.write(b"x" * 1000)
    lease -= 2000  # the door paid the files' bytes out of its lease
    tier.release(lease)  # ... and gave back the rest (the stager's listener would)
    with books.lock:
        assert books.enter_copy_locked("a", tier, 1000)
        assert not books.enter_copy_locked("b", tier, 1000)  # a's page and b's bytes: no room for b's page
    assert told.dropped_keys == ["b"] and not os.path.exists(tier.path_for("b"))
    # b is left to the stager, whose copy goes to a tier with room: not "no room" for the job
    assert books.staged.keys() == {"a"} and not books.failures and "b" not in books.no_room
    assert tier.allocated_bytes == tier.room == 4096 <= tier.capacity and tier.files == 1
    tier.remove()


@pytest.mark.parametrize("lane", [False, True], ids=["a-miss-copied", "the-read-ahead-lane"])
def test_the_front_doors_copies_are_kept_when_the_tiers_filesystem_filled_after_them(tmp_path, lane):
    """The stager found the tier's filesystem full (ENOSPC) while the door's copies into it were
    already made: those copies hold their bytes, so they are booked, not removed as "no room"
    (which left them on the PFS for the rest of the job)."""
    (tmp_path / "t").mkdir()
    tier = Tier.from_config(TierConfig("t", str(tmp_path / "t"), 1 << 20, False), 2, "r1", 0, ())
    tier.unit = 4096
    books = StagerBooks(take_snapshot(()), [tier], Concurrency(fixed=1))
    told = Told()
    books.subscribe(told)
    keys = ["a", "b", "c"]
    assert tier.reserve(3000, counted=False)  # lent to the door, which paid the files' bytes
    for key in keys:
        with open(tier.path_for(key), "wb") as f:
            f.write(b"x" * 1000)
    tier.mark_full("ENOSPC after 3000 bytes")  # a copy of the stager's just failed
    with books.lock:
        if lane:
            books.enter_copies_locked(tier, [(key, 1000, -1) for key in keys])
        else:
            assert all(books.enter_copy_locked(key, tier, 1000) for key in keys)
    assert not told.dropped_keys and all(os.path.exists(tier.path_for(key)) for key in keys)
    assert books.staged.keys() == set(keys) and not books.failures and not books.no_room
    assert tier.allocated_bytes == tier.room == 3 * 4096 and tier.files == 3
    assert not tier.reserve(4096)  # still full for new copies
    tier.remove()


def test_a_copy_too_large_for_a_full_filesystem_fails_before_its_source_is_read(tmp_path):
    from monarch.node.tiers.tiers import write_atomically
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a private tmpfs was refused: {r.stderr.strip()}")
    try:
        read = []
        with pytest.raises(OSError) as e:
            write_atomically(str(mnt / "big"), lambda fd: read.append(fd) or 0, 0, root=str(mnt), size=1 << 20)
        assert e.value.errno == errno.ENOSPC and not read and os.listdir(mnt) == []
        # a source shorter than the size allocated leaves no allocated tail as bytes
        n = write_atomically(str(mnt / "short"), lambda fd: os.write(fd, b"abc"), 0, root=str(mnt), size=8192)
        assert n == 3 and (mnt / "short").read_bytes() == b"abc"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_the_reports_show_the_allocation_beside_the_bytes_and_how_full_by_it():
    from monarch.report import html, text
    row = {"name": "ram", "capacity": 4 * MiB, "used": MiB, "files": 1024, "full": None,
           "refused": {"full": 976}, "stopped": "full"}
    ssd = {"name": "ssd", "capacity": 8 * MiB, "used": 4 * MiB, "files": 4, "full": None, "refused": {}, "stopped": None}
    report = {"tiers": [row, ssd],  # summed over nodes; each node's tiers say what is allocated
              "nodes": [{"tiers": [dict(row, allocated_bytes=4 * MiB), dict(ssd, allocated_bytes=4 * MiB)]}, None]}
    out = []
    text._print_tiers(report, out.append)
    lines = "".join(out).splitlines()
    ram = next(i for i, line in enumerate(lines) if line.startswith("ram"))
    assert "1.0 MiB / 4.0 MiB (100%)" in lines[ram]  # how full: by the pages, what the capacity counts
    assert "allocated 4.0 MiB = 4.00x the bytes" in lines[ram + 1]
    assert not any("allocated" in line for line in lines[ram + 2:])  # ssd: allocation is its bytes, no line
    page = "".join(html._tiers(report, None, None))
    assert "1.0 MiB (allocated 4.0 MiB = 4.00x the bytes)" in page and "100.0%" in page
    # a report from before tiers counted their allocation reads as before
    old = {"tiers": [row], "nodes": [{"tiers": [row]}]}
    out = []
    text._print_tiers(old, out.append)
    assert "1.0 MiB / 4.0 MiB (25%)" in out[1] and "allocated" not in "".join(out)


class FakeDoor:
    """The front door as DoorLink drives it (its events, claims and lease), without its threads."""

    def __init__(self, slot, events):
        self.copy_slot, self._events, self.forgotten = slot, events, []

    def events(self, books=0):
        out, self._events = self._events, []
        return out

    def claim(self, key):
        return True

    def staged(self, key, slot):
        pass

    def forget(self, key):
        self.forgotten.append(key)

    def copying(self, on):
        pass

    def disable(self):
        pass

    def lease(self, books=0):
        return 0

    def grant(self, nbytes, books=0):
        pass

    def reclaim(self, books=0):
        return 0


def test_a_door_copy_removed_for_its_blocks_is_not_counted_as_staged(tmp_path):
    """The daemon counts what the door staged from ``DoorLink.absorb``: a copy removed because
    its blocks did not fit is no staged file."""
    from monarch.frontdoor import EV_STAGED, DoorEvent
    from monarch.node.doorkeeper.door_link import DoorLink
    (tmp_path / "t").mkdir()
    tier = Tier.from_config(TierConfig("t", str(tmp_path / "t"), 4096 + 2000, False), 2, "r1", 0, ())
    tier.unit = 4096
    stager = Stager(take_snapshot(()), [tier], threads=1)
    for key in ("a", "b"):
        with open(tier.path_for(key), "wb") as f:
            f.write(b"x" * 1000)
    assert tier.reserve(2000, counted=False)  # the door paid the files' bytes out of its lease
    door = FakeDoor(tier.slot, [DoorEvent(EV_STAGED, tier.slot, 1000, 1000, 0.001, key) for key in ("a", "b")])
    link = DoorLink(door, stager, may_copy=False)
    assert link.absorb() == 1  # a staged; b removed: a's page and b's bytes leave no room for b's page
    assert stager.where("a") is tier and stager.where("b") is None and door.forgotten == ["b"]
    stager.shutdown()
    tier.remove()
