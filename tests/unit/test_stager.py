import hashlib
import os
import subprocess
import threading

import pytest

from monarch.config import TierConfig
from monarch.layout import MARKER
from monarch.snapshot import take_snapshot
from monarch.stager import Stager
from monarch.tiers import TMP_PREFIX, Tier


def make_files(root, sizes):
    for i, size in enumerate(sizes):
        d = root / f"d{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.bin").write_bytes(os.urandom(size))


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "pfs"
    make_files(root, [1000] * 10)
    return take_snapshot((str(root),))


def tiers(tmp_path, *capacities, keep=False, roots=()):
    return [Tier.from_config(TierConfig(f"t{i}", str(tmp_path / f"tier{i}"), cap, keep), 2 + i, "r1", 0, roots)
            for i, cap in enumerate(capacities)]


def test_snapshot_keys_sizes(dataset):
    assert len(dataset.files) == 10
    assert all(k.startswith("0/d") for k in dataset.files)
    assert dataset.total_bytes == 10_000
    assert os.path.exists(dataset.source_path("0/d0/f0.bin"))


def test_concurrent_requests_for_one_file_stage_it_once(tmp_path, dataset):
    stager = Stager(dataset, tiers(tmp_path, 10**6), threads=4)
    results = []
    barrier = threading.Barrier(16)

    def ask():
        barrier.wait()
        results.append(stager.ensure("0/d0/f0.bin").result(timeout=10))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16 and len({id(r) for r in results}) == 1
    assert stager.stats()["pfs_files_read"] == 1 and stager.stats()["pfs_bytes_read"] == 1000
    path = results[0].path_for("0/d0/f0.bin")
    assert digest(path) == digest(dataset.source_path("0/d0/f0.bin"))
    assert os.stat(path).st_mtime_ns == dataset.files["0/d0/f0.bin"].mtime_ns


def test_fastest_tier_first_then_next_then_pfs_and_nothing_evicted(tmp_path, dataset):
    fast, slow = tiers(tmp_path, 3000, 2500)
    stager = Stager(dataset, [fast, slow], threads=2)
    placed = [stager.ensure(k).result(timeout=10) for k in sorted(dataset.files)]
    assert [t.name if t else None for t in placed] == ["t0"] * 3 + ["t1"] * 2 + [None] * 5
    assert fast.used == 3000 and slow.used == 2000
    assert stager.stats()["failures"] == {"no_room": 5}
    # asking again for a file that did not fit neither copies nor evicts
    assert stager.ensure(sorted(dataset.files)[-1]).result(timeout=10) is None
    assert stager.stats()["pfs_files_read"] == 5 and stager.stats()["failures"] == {"no_room": 5}
    assert all(stager.where(k) is not None for k in sorted(dataset.files)[:5])


def test_unknown_key_stays_on_pfs(tmp_path, dataset):
    stager = Stager(dataset, tiers(tmp_path, 10**6), threads=1)
    assert stager.ensure("0/not/there").result(timeout=10) is None
    assert stager.stats()["failures"] == {"not_in_snapshot": 1}


def test_failed_copy_releases_space_and_leaves_no_file(tmp_path, dataset):
    (t,) = tiers(tmp_path, 10**6)
    stager = Stager(dataset, [t], threads=1)
    os.chmod(dataset.source_path("0/d1/f1.bin"), 0)
    os.rename(dataset.source_path("0/d1/f1.bin"), dataset.source_path("0/d1/f1.bin") + ".gone")
    assert stager.ensure("0/d1/f1.bin").result(timeout=10) is None
    assert t.used == 0
    assert list(stager.stats()["failures"]) == ["io_error:FileNotFoundError"]
    assert not any(set(files) - {MARKER} for _, _, files in os.walk(t.path))


def test_no_partial_file_is_ever_visible(tmp_path):
    root = tmp_path / "pfs"
    make_files(root, [64 << 20])
    snap = take_snapshot((str(root),))
    (t,) = tiers(tmp_path, 1 << 30)
    key = next(iter(snap.files))
    final = t.path_for(key)
    seen = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                seen.add(os.stat(final).st_size)
            except FileNotFoundError:
                pass

    w = threading.Thread(target=watch)
    w.start()
    Stager(snap, [t], threads=1).ensure(key).result(timeout=60)
    done.set()
    w.join()
    assert seen <= {64 << 20}
    assert digest(final) == digest(snap.source_path(key))


def test_kept_tier_adopts_fresh_copies_and_drops_stale_ones(tmp_path, dataset):
    (t,) = tiers(tmp_path, 10**6, keep=True, roots=dataset.roots)
    stager = Stager(dataset, [t], threads=2)
    keys = sorted(dataset.files)
    for k in keys[:3]:
        stager.ensure(k).result(timeout=10)
    # a stale copy (size differs) and a leftover temporary file from a crash
    with open(t.path_for(keys[0]), "ab") as f:
        f.write(b"x")
    open(os.path.join(t.path, "0", f"{TMP_PREFIX}123-crash"), "w").close()
    t.remove()  # the run ends: a kept tier stays
    (fresh,) = tiers(tmp_path, 10**6, keep=True, roots=dataset.roots)
    assert fresh.path == t.path and fresh.keep
    adopted = fresh.adopt_existing(dataset.files)
    assert sorted(adopted) == keys[1:3]
    assert fresh.used == 2000 and fresh.files == 2
    assert not os.path.exists(t.path_for(keys[0]))
    assert not os.path.exists(os.path.join(t.path, "0", f"{TMP_PREFIX}123-crash"))


def test_a_kept_tier_in_use_by_another_run_is_not_shared(tmp_path, dataset):
    (a,) = tiers(tmp_path, 10**6, keep=True, roots=dataset.roots)
    (b,) = tiers(tmp_path, 10**6, keep=True, roots=dataset.roots)
    assert a.keep and not b.keep and a.path != b.path


def test_kept_copies_of_another_dataset_are_never_adopted(tmp_path, dataset):
    (a,) = tiers(tmp_path, 10**6, keep=True, roots=dataset.roots)
    Stager(dataset, [a], threads=1).ensure(sorted(dataset.files)[0]).result(timeout=10)
    a.remove()
    other = tmp_path / "other"
    make_files(other, [1000] * 10)  # same relative names and sizes
    snap = take_snapshot((str(other),))
    (b,) = tiers(tmp_path, 10**6, keep=True, roots=snap.roots)
    assert b.path != a.path and b.adopt_existing(snap.files) == []


def test_remove_deletes_only_what_it_created(tmp_path):
    base = tmp_path / "scratch"
    base.mkdir()
    (base / "my-results.txt").write_text("precious")
    (t,) = tiers(tmp_path, 100)
    t = Tier.from_config(TierConfig("t", str(base), 100), 2, "r1", 0, ())
    assert t.path.startswith(str(base) + "/monarch-")
    t.remove()
    assert (base / "my-results.txt").read_text() == "precious"
    assert not os.path.exists(t.path)


def test_copies_are_never_more_readable_than_their_source(tmp_path, dataset):
    (t,) = tiers(tmp_path, 10**6)
    keys = sorted(dataset.files)
    os.chmod(dataset.source_path(keys[0]), 0o600)
    os.chmod(dataset.source_path(keys[1]), 0o644)
    snap = take_snapshot(dataset.roots)
    stager = Stager(snap, [t], threads=1)
    for k in keys[:2]:
        assert stager.ensure(k).result(timeout=10) is t
        assert os.stat(t.path_for(k)).st_mode & 0o077 == 0
    assert os.stat(t.path).st_mode & 0o077 == 0


def test_a_source_changed_since_the_snapshot_is_not_staged_nor_retried(tmp_path, dataset):
    (t,) = tiers(tmp_path, 10**6)
    stager = Stager(dataset, [t], threads=1)
    key = sorted(dataset.files)[0]
    with open(dataset.source_path(key), "ab") as f:
        f.write(b"new")
    assert stager.ensure(key).result(timeout=10) is None
    assert stager.ensure(key).result(timeout=10) is None
    assert stager.stats()["failures"] == {"changed_since_snapshot": 1}
    assert not os.path.exists(t.path_for(key))


def test_a_failed_copy_is_not_retried_on_every_open(tmp_path, dataset):
    (t,) = tiers(tmp_path, 10**6)
    stager = Stager(dataset, [t], threads=1)
    key = sorted(dataset.files)[0]
    os.rename(dataset.source_path(key), dataset.source_path(key) + ".gone")
    for _ in range(3):
        assert stager.ensure(key).result(timeout=10) is None
    assert stager.stats()["failures"] == {"io_error:FileNotFoundError": 1}


def test_invalidate_drops_the_copy_and_a_copy_in_flight_is_never_published(tmp_path, dataset):
    (t,) = tiers(tmp_path, 10**6)
    stager = Stager(dataset, [t], threads=1)
    a, b = sorted(dataset.files)[:2]
    assert stager.ensure(a).result(timeout=10) is t
    assert stager.invalidate(a) == 1 and not os.path.exists(t.path_for(a)) and stager.where(a) is None
    assert stager.ensure(a).result(timeout=10) is None  # never again this run
    # a write while b is being copied: the copy is dropped at publication
    real = stager._read_pfs

    def slow(key, out):
        n = real(key, out)
        stager.invalidate(os.path.dirname(key))  # the job renames the directory
        return n

    stager._read_pfs = slow
    assert stager.ensure(b).result(timeout=10) is None
    assert not os.path.exists(t.path_for(b)) and stager.stats()["failures"] == {"written_by_job": 1}
    assert t.used == 0


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_a_physically_full_tier_is_marked_full_and_the_next_tier_is_used(tmp_path, dataset, small_tmpfs):
    full = Tier.from_config(TierConfig("small", str(small_tmpfs), 10**9), 2, "r1", 0, ())
    (nxt,) = tiers(tmp_path, 10**6)
    stager = Stager(dataset, [full, nxt], threads=1)
    placed = [stager.ensure(k).result(timeout=10) for k in sorted(dataset.files)]
    assert all(p is not None for p in placed)
    assert full.full_reason and placed[-1] is nxt
    n_full = sum(p is full for p in placed)
    # each file read from the PFS once, plus the one copy the full tier refused
    assert stager.stats()["pfs_files_read"] == len(placed) + 1
    assert full.files == n_full and full.used == 1000 * n_full
    for k in sorted(dataset.files):
        assert digest(stager.where(k).path_for(k)) == digest(dataset.source_path(k))
