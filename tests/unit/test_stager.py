import hashlib
import os
import threading

import pytest

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


def tiers(tmp_path, *capacities):
    out = []
    for i, cap in enumerate(capacities):
        t = Tier(f"t{i}", str(tmp_path / f"tier{i}"), cap, slot=2 + i)
        t.prepare()
        out.append(t)
    return out


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
    assert not any(files for _, _, files in os.walk(t.path))


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
    (t,) = tiers(tmp_path, 10**6)
    stager = Stager(dataset, [t], threads=2)
    keys = sorted(dataset.files)
    for k in keys[:3]:
        stager.ensure(k).result(timeout=10)
    # a stale copy (size differs) and a leftover temporary file from a crash
    with open(t.path_for(keys[0]), "ab") as f:
        f.write(b"x")
    open(os.path.join(t.path, "0", f"{TMP_PREFIX}123-crash"), "w").close()
    fresh = Tier("t0", t.path, 10**6, slot=2, keep=True)
    adopted = fresh.adopt_existing(dataset.files)
    assert sorted(adopted) == keys[1:3]
    assert fresh.used == 2000 and fresh.files == 2
    assert not os.path.exists(t.path_for(keys[0]))
    assert not os.path.exists(os.path.join(t.path, "0", f"{TMP_PREFIX}123-crash"))


def test_remove_deletes_only_what_it_created(tmp_path):
    keep = tmp_path / "shared"
    keep.mkdir()
    (keep / "other-job").mkdir()
    t = Tier("t", str(keep / "job" / "node0" / "ram"), 100, slot=2)
    t.prepare()
    t.remove()
    assert not (keep / "job").exists() and (keep / "other-job").exists()
