import hashlib
import os
import subprocess
import threading
import time

import pytest

from monarch.config import TierConfig
from monarch.layout import MARKER, TIER_LOCK
from monarch.node.tiers.resources import allocated_size, allocation_unit
from monarch.node.snapshot.snapshot import load_or_walk, take_snapshot
from monarch.node.stage.stager import Stager
from monarch.node.tiers.tiers import TMP_PREFIX, Tier


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
    for i in range(len(capacities)):
        (tmp_path / f"tier{i}").mkdir(exist_ok=True)  # a base exists; Monarch makes monarch-<uid> in it
    return [Tier.from_config(TierConfig(f"t{i}", str(tmp_path / f"tier{i}"), cap, keep), 2 + i, "r1", 0, roots)
            for i, cap in enumerate(capacities)]


def room_for(tmp_path, files, size=1000):
    """A capacity with room for ``files`` files of ``size`` bytes in a tier under ``tmp_path``:
    a tier counts what its filesystem allocates for a copy (blocks), not its bytes."""
    return int(files * allocated_size(size, allocation_unit(str(tmp_path))))


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
    fast, slow = tiers(tmp_path, room_for(tmp_path, 3), room_for(tmp_path, 2.5))
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
    assert not any(set(files) - {MARKER, TIER_LOCK} for _, _, files in os.walk(t.path))


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
    stager = Stager(snap, [t], threads=1)
    stager.ensure(key).result(timeout=60)  # a large file: staged by blocks, published once whole
    deadline = time.monotonic() + 60
    while stager.where(key) is None and time.monotonic() < deadline:
        time.sleep(0.01)
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


def test_a_kept_tier_keeps_only_regular_files_and_follows_no_symlink(tmp_path, dataset):
    """A symlink (to a dataset file of the same size and mtime, to a directory outside) and
    a FIFO in a kept tier are removed, never adopted nor followed; what they point at stays."""
    (t,) = tiers(tmp_path, 10**6, keep=True, roots=dataset.roots)
    keys = sorted(dataset.files)
    Stager(dataset, [t], threads=1).ensure(keys[0]).result(timeout=10)
    t.remove()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("mine")
    os.symlink(outside, os.path.join(t.path, "0", "a_dir_link"))
    link, fifo = t.path_for(keys[1]), t.path_for(keys[2])
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(dataset.source_path(keys[1]), link)
    os.makedirs(os.path.dirname(fifo), exist_ok=True)
    os.mkfifo(fifo)
    (fresh,) = tiers(tmp_path, 10**6, keep=True, roots=dataset.roots)
    assert fresh.path == t.path
    assert fresh.adopt_existing(dataset.files) == [keys[0]]
    assert not any(os.path.lexists(p) for p in (os.path.join(t.path, "0", "a_dir_link"), link, fifo))
    assert (outside / "precious").read_text() == "mine" and os.path.exists(dataset.source_path(keys[1]))


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
    real = stager.copier.read_pfs

    def slow(key, out):
        n = real(key, out)
        stager.invalidate(os.path.dirname(key))  # the job renames the directory
        return n

    stager.copier.read_pfs = slow
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
    # each file read from the PFS once: the full tier refused its copy before a byte was read
    assert stager.stats()["pfs_files_read"] == len(placed)
    assert stager.stats()["failures"] == {}
    assert full.files == n_full and full.used == 1000 * n_full
    for k in sorted(dataset.files):
        assert digest(stager.where(k).path_for(k)) == digest(dataset.source_path(k))


# -- scheduling: demand first, read-ahead, single flight, adaptive concurrency, hints --------
import collections  # noqa: E402
import time  # noqa: E402

from monarch.node.stage.concurrency import Concurrency  # noqa: E402


def recording(stager, delay=0.0, gate=None):
    """Wrap the stager's PFS reads: record the order of copies (and per key counts)."""
    seen = []
    real = stager.copier.read_pfs

    def read(key, out):
        seen.append(key)
        if gate is not None:
            gate.wait(10)
        if delay:
            time.sleep(delay)
        return real(key, out)

    stager.copier.read_pfs = read
    return seen


def wait_idle(stager, timeout=30):
    deadline = time.monotonic() + timeout
    while not stager.idle():
        assert time.monotonic() < deadline, "the stager did not finish"
        time.sleep(0.01)


@pytest.fixture
def many(tmp_path):
    root = tmp_path / "pfs"
    make_files(root, [1000] * 60)
    return take_snapshot((str(root),))


def test_a_demanded_file_jumps_the_read_ahead_queue(tmp_path, many):
    stager = Stager(many, tiers(tmp_path, 10**6), threads=2)
    seen = recording(stager, delay=0.02)
    keys = sorted(many.files)
    stager.read_ahead(keys)
    while not seen:
        time.sleep(0.001)
    assert stager.ensure(keys[-1]).result(timeout=10) is not None
    # at most the copies already running (2) and one more came before it; FIFO would be 59
    assert seen.index(keys[-1]) <= 3
    wait_idle(stager)
    assert sorted(seen) == keys  # everything read once, the demanded file too
    assert stager.stats()["pfs_files_read"] == 60


def test_a_demanded_file_being_read_ahead_is_waited_for_not_read_twice(tmp_path, dataset):
    stager = Stager(dataset, tiers(tmp_path, 10**6), threads=1)
    gate = threading.Event()
    seen = recording(stager, gate=gate)
    key = sorted(dataset.files)[0]
    stager.read_ahead([key])
    while not seen:
        time.sleep(0.001)
    future = stager.ensure(key)
    assert not future.done()
    gate.set()
    assert future.result(timeout=10) is stager.where(key) is not None
    assert seen == [key] and stager.stats()["pfs_files_read"] == 1


def test_read_ahead_stages_what_fits_pinned_and_counts_no_failure(tmp_path, dataset):
    (t,) = tiers(tmp_path, room_for(tmp_path, 4.5))
    stager = Stager(dataset, [t], threads=2)
    stager.read_ahead(sorted(dataset.files))
    wait_idle(stager)
    assert stager.stats()["files"] == 4 and t.used == 4000
    assert stager.stats()["failures"] == {} and stager.stats()["dropped"] == 0
    late = sorted(dataset.files)[-1]
    assert stager.ensure(late).result(timeout=10) is None  # no room: read from the PFS, nothing evicted
    assert stager.stats()["failures"] == {"no_room": 1} and stager.stats()["pfs_files_read"] == 4


def test_many_slow_copies_are_in_flight_at_once(tmp_path, many):
    stager = Stager(many, tiers(tmp_path, 10**6), threads=32)
    running, peak = [0], [0]
    lock = threading.Lock()
    real = stager.copier.read_pfs

    def read(key, out):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return real(key, out)

    stager.copier.read_pfs = read
    stager.read_ahead(sorted(many.files))
    wait_idle(stager)
    assert stager.stats()["files"] == 60
    assert peak[0] >= 16  # background copies use most of the 32 slots (a quarter stays for demand)


def test_adaptive_concurrency_climbs_while_it_pays_and_stops_at_the_plateau():
    now = [0.0]
    c = Concurrency(clock=lambda: now[0])
    assert c.limit == 8

    def window(rate_of, c=c):  # 0.3 s of saturated work: copies finish at rate_of(limit) per second,
        end = now[0] + 0.3      # each after limit / rate seconds (Little's law: a copy waits its turn)
        while now[0] < end:
            now[0] += 1 / rate_of(c.limit)
            c.completed(c.limit / rate_of(c.limit))

    latency_bound = lambda limit: min(limit, 64) / 0.02  # noqa: E731  20 ms copies, the source serves 64 at once
    for _ in range(10):
        window(latency_bound)
    assert c.limit in (64, 128)  # doubled while it paid (8, 16, 32, 64), not to the 256 cap
    stop = c.limit
    for _ in range(5):
        window(latency_bound)
    assert c.limit <= stop
    c2 = Concurrency(clock=lambda: now[0])
    cpu_bound = lambda limit: 2000.0  # noqa: E731  more copies at once do not help
    for _ in range(6):
        window(cpu_bound, c2)
    assert c2.limit == c2.low == 4 and c.fixed is None  # not up from 8, and back down to the fewest
    assert Concurrency(fixed=5).limit == 5



def per_key_reads(stager):
    counts = collections.Counter()
    real = stager.copier.read_pfs

    def read(key, out):
        counts[key] += 1
        return real(key, out)

    stager.copier.read_pfs = read
    return counts


def run_epoch(stager, order, stream=1):
    """A reader that tells its order, then reads in it: a miss asks the stager (as the shim
    asks the daemon), and it reports what it has consumed."""
    stager.hint_order(stream, order, begin=True)
    served = collections.Counter()
    for i, key in enumerate(order):
        tier = stager.where(key) or stager.ensure(key).result(timeout=10)
        served["tier" if tier is not None else "pfs"] += 1
        stager.hint_progress(stream, i + 1)
    return served


def test_order_hints_with_half_the_dataset_in_the_tier_read_each_file_at_most_once_per_epoch(tmp_path, many):
    import random
    (t,) = tiers(tmp_path, room_for(tmp_path, 30))  # half of 60 files of 1000 bytes
    stager = Stager(many, [t], threads=4)
    counts = per_key_reads(stager)
    keys = sorted(many.files)
    total = 0
    for epoch in range(3):
        order = list(keys)
        random.Random(epoch).shuffle(order)
        before = collections.Counter(counts)
        run_epoch(stager, order)
        wait_idle(stager)
        this = counts - before
        assert max(this.values(), default=0) <= 1, f"epoch {epoch}: a file read twice"
        total += sum(this.values())
        assert t.used <= 30_000
    assert stager.stats()["dropped"] > 0
    # epochs after the first find the copies the last one left: fewer than 60 reads each
    assert total < 3 * 60


def test_without_hints_nothing_is_dropped(tmp_path, many):
    (t,) = tiers(tmp_path, room_for(tmp_path, 30))
    stager = Stager(many, [t], threads=4)
    keys = sorted(many.files)
    for key in keys:
        stager.ensure(key).result(timeout=10)
    assert stager.stats()["dropped"] == 0 and stager.stats()["files"] == 30
    assert all(stager.where(k) is not None for k in keys[:30])


def test_hints_stage_ahead_of_the_reader_in_its_order(tmp_path, many):
    (t,) = tiers(tmp_path, room_for(tmp_path, 20))
    stager = Stager(many, [t], threads=2)
    order = sorted(many.files, reverse=True)
    stager.hint_order(7, order, begin=True)
    wait_idle(stager)
    assert [k for k in order if stager.where(k) is not None] == order[:20]  # the first 20 in its order
    stager.hint_progress(7, 10)
    wait_idle(stager)
    assert [k for k in order if stager.where(k) is not None] == order[10:30]
    stager.hint_end(7)


def test_progress_wakes_a_worker_only_for_an_order_that_waits_for_room(tmp_path, many):
    # a reader tells its progress every few files: a worker woken for each, with nothing to
    # copy, cost the daemon's interpreter a wake-up per frame (bench_cluster --hints)
    (t,) = tiers(tmp_path, room_for(tmp_path, 20))
    stager = Stager(many, [t], threads=2)
    wakes = []
    real = stager._wake_locked
    stager._wake_locked = lambda: (wakes.append(1), real())
    order = sorted(many.files)
    stager.hint_order(7, order[:10], begin=True)  # fits: staged, nothing waits
    wait_idle(stager)
    woken = len(wakes)
    for done in range(1, 11):
        stager.hint_progress(7, done)
    assert len(wakes) == woken
    stager.hint_order(8, order[10:], begin=True)  # 50 more: its cursor waits for room at the 11th
    wait_idle(stager)
    woken = len(wakes)
    stager.hint_progress(8, 10)
    assert len(wakes) == woken + 1
    wait_idle(stager)
    assert [k for k in order[10:] if stager.where(k) is not None][:1] == [order[20]]
    stager.hint_end(7)
    stager.hint_end(8)


def test_an_invalidated_key_is_not_staged_by_read_ahead_or_hints(tmp_path, dataset):
    stager = Stager(dataset, tiers(tmp_path, 10**6), threads=2)
    keys = sorted(dataset.files)
    stager.invalidate(os.path.dirname(keys[0]))
    stager.hint_order(1, keys, begin=True)
    stager.read_ahead(keys)
    wait_idle(stager)
    assert all(stager.where(k) is None for k in keys if k.startswith(os.path.dirname(keys[0]) + "/"))
    assert stager.stats()["files"] == sum(1 for k in keys if not k.startswith(os.path.dirname(keys[0]) + "/"))


def test_small_files_from_a_fast_pfs_are_copied_by_the_asker(tmp_path, dataset):
    stager = Stager(dataset, tiers(tmp_path, 10**6), threads=2)
    stager.inline_seconds = 0.01  # "fast" on any test machine; a 200 ms copy is slow anywhere
    keys = sorted(dataset.files)
    for k in keys[:5]:
        stager.ensure(k).result(timeout=10)  # through the threads: the PFS is measured
    me = threading.current_thread()
    who = []
    real = stager.copier.read_pfs
    stager.copier.read_pfs = lambda key, out: (who.append(threading.current_thread()), real(key, out))[1]
    future = stager.ensure(keys[5], inline=True)
    assert future.done() and future.result() is not None and who == [me]
    stager.copier.read_pfs = lambda key, out: (time.sleep(0.2), real(key, out))[1]
    stager.ensure(keys[6], inline=True).result(timeout=10)  # slow: the mean goes up ...
    stager.copier.read_pfs = lambda key, out: (who.append(threading.current_thread()), real(key, out))[1]
    stager.ensure(keys[7], inline=True).result(timeout=10)
    assert who[-1] is not me  # ... and the next copy goes to a thread


def test_a_copy_never_recreates_a_torn_down_tier(tmp_path, dataset):
    (t,) = tiers(tmp_path, 10**6)
    stager = Stager(dataset, [t], threads=1)
    t.remove()  # torn down while a copy was about to start (before the fix: os.makedirs made it again)
    assert stager.ensure("0/d0/f0.bin").result(timeout=10) is None
    assert not os.path.exists(t.path)  # neither the tier's directory nor anything below it


def test_shutdown_stops_ranged_copies_and_drain_waits_for_them(tmp_path, monkeypatch):
    from monarch import routes
    from monarch.node.stage import sources
    root = tmp_path / "pfs"
    make_files(root, [4 << 20] * 3)
    snap = take_snapshot((str(root),))
    monkeypatch.setattr(routes, "RANGES_MIN", 1 << 20)  # copied in ranges (read_in_ranges), by several threads
    monkeypatch.setattr(sources, "RANGE", 128 << 10)
    write_at = sources._write_at
    monkeypatch.setattr(sources, "_write_at", lambda *a: (time.sleep(0.02), write_at(*a)))  # a slow tier
    (t,) = tiers(tmp_path, 10**9)
    stager = Stager(snap, [t], threads=3)
    stager.read_ahead(sorted(snap.files))
    deadline = time.monotonic() + 30
    while not any(n.startswith(TMP_PREFIX) for _, _, names in os.walk(t.path) for n in names):
        assert time.monotonic() < deadline, "no copy started"
        time.sleep(0.005)
    stager.shutdown()
    assert stager.drain(30)  # every copy stopped at its next read: none is under way
    assert stager.in_flight() == 0 and stager.stats()["files"] == 0  # nothing published after shutdown
    assert sources._range_readers._value == 16  # every range reader returned
    t.remove()
    time.sleep(0.2)
    assert not os.path.exists(t.path)
    assert stager.ensure(sorted(snap.files)[0]).result(timeout=1) is None  # nothing new starts


def test_a_copy_asked_now_is_made_at_once_even_with_every_slot_taken(tmp_path, dataset):
    """A peer's request (the daemon's ``provide``) is copied on the asking thread at once, not
    queued behind copies that hold every slot (in a cluster those may wait on other nodes,
    which wait on this one). A queued request for the same key is taken over."""
    stager = Stager(dataset, tiers(tmp_path, 10**6), threads=1)
    keys = sorted(dataset.files)
    blocker, wanted = keys[0], keys[5]
    release = threading.Event()
    real = stager.copier.read_pfs

    def read_pfs(key, out):
        if key == blocker:
            release.wait(30)
        return real(key, out)

    stager.copier.read_pfs = read_pfs
    try:
        first = stager.ensure(blocker)  # takes the only slot, and holds it
        for _ in range(3000):
            if stager.running:
                break
            threading.Event().wait(0.01)
        queued = stager.ensure(wanted)  # behind it
        asked = stager.ensure(wanted, now=True)
        assert asked.done() and not first.done()  # copied here, while the slot is still held
        tier = asked.result()
        assert tier is not None and digest(tier.path_for(wanted)) == digest(dataset.source_path(wanted))
        assert queued.result(timeout=0) is tier  # the queued request was taken over: one copy
        assert stager.stats()["pfs_files_read"] == 1
    finally:
        release.set()
    assert first.result(timeout=30) is not None
    assert stager.stats()["pfs_files_read"] == 2


class FakeOwner:
    """A ``PeerSource`` stand-in: the owning node of every key but ``mine``; ``fail`` refuses."""
    name = "peer"

    def __init__(self, snapshot, mine=(), fail=False):
        self.snapshot, self.mine, self.fail = snapshot, set(mine), fail

    def owns_elsewhere(self, key):
        return key not in self.mine

    def available(self, key):
        return None

    def copy(self, key, info, out, tally):
        from monarch.errors import PeerError
        if self.fail:
            raise PeerError(f"fetch {key!r}: node 1 refused")
        data = open(self.snapshot.source_path(key), "rb").read()
        os.write(out, data)
        tally.opened()
        tally.read(len(data))
        return len(data)


def wait_idle(stager):
    for _ in range(3000):
        if stager.idle():
            return
        threading.Event().wait(0.01)
    pytest.fail("the stager did not settle in 30 s")


def test_second_copies_come_from_their_owner_after_the_own_share_in_the_room_it_leaves(tmp_path, dataset):
    """peer.replicas: 2: this node's share first (from the PFS), then second copies of others'
    files from their owner into the tiers' room left, never from the PFS; pinned, counted."""
    keys = sorted(dataset.files)
    own, others = keys[:5], keys[5:]
    stager = Stager(dataset, tiers(tmp_path, room_for(tmp_path, 7)), threads=2)
    stager.read_ahead(own)
    stager.keep_replicas(others, FakeOwner(dataset, mine=own))
    wait_idle(stager)
    s, r = stager.stats(), stager.replica_stats()
    assert s["pfs_files_read"] == 5 and all(k in stager.staged for k in own)  # the share first, whole
    assert s["peer_files_read"] == 2 and r["kept_files"] == 2 and r["kept_bytes"] == 2000 and r["no_room"] == 3
    for k in stager.replicas:
        assert k in others and digest(stager.staged[k].path_for(k)) == digest(dataset.source_path(k))


def test_a_second_copy_its_owner_refuses_is_not_read_from_the_pfs_nor_given_up(tmp_path, dataset):
    keys = sorted(dataset.files)
    stager = Stager(dataset, tiers(tmp_path, 10**6), threads=2)
    stager.keep_replicas(keys[5:], FakeOwner(dataset, mine=keys[:5], fail=True))
    wait_idle(stager)
    assert stager.stats()["pfs_files_read"] == 0 and stager.replica_stats()["failed"] == {"peer_failed": 5}
    assert stager.ensure(keys[6]).result(timeout=30) is not None  # its owner lost, say: staged here after all
    assert stager.stats()["pfs_files_read"] == 1 and not stager.replicas


def test_an_adaptive_stager_starts_at_the_depth_asked_a_fixed_one_keeps_its_threads(tmp_path, dataset):
    assert Stager(dataset, tiers(tmp_path, 10**6), start_depth=32).concurrency.limit == 32
    assert Stager(dataset, tiers(tmp_path, 10**6)).concurrency.limit == 8
    assert Stager(dataset, tiers(tmp_path, 10**6), threads=3, start_depth=32).concurrency.limit == 3


def test_fetch_from_peers_sends_other_nodes_files_to_their_owner_from_then_on(tmp_path, dataset):
    """A replicating cluster, decided after the walk: the stager made for the walk fetches
    other nodes' files from them into the peer area from then on, never from the PFS."""
    keys = sorted(dataset.files)
    own = keys[:5]
    (tier, area) = tiers(tmp_path, 10**6, 10**6)
    stager = Stager(dataset, [tier], threads=2)
    assert stager.ensure(keys[0]).result(timeout=30) is tier  # before: from the PFS
    stager.fetch_from_peers(FakeOwner(dataset, mine=own), area)
    assert stager.ensure(keys[5]).result(timeout=30) is area
    assert stager.ensure(keys[1]).result(timeout=30) is tier
    s = stager.stats()
    assert (s["pfs_files_read"], s["peer_files_read"]) == (2, 1)
    assert digest(area.path_for(keys[5])) == digest(dataset.source_path(keys[5]))


def test_read_ahead_into_a_full_tier_describes_no_listed_file_it_cannot_keep(tmp_path):
    """A listing walk's files (no stat yet): the read-ahead describes each file it reaches and
    stages what fits; once a file found no room, the files not described yet are passed over,
    not stat'ed only to learn that they do not fit either."""
    root = tmp_path / "pfs"
    make_files(root, [1000] * 10)
    snap, _ = load_or_walk((str(root),), None, describe=False)
    assert snap.files.undescribed() == 10
    (t,) = tiers(tmp_path, room_for(tmp_path, 4.5))
    stager = Stager(snap, [t], threads=1)
    stager.read_ahead(sorted(snap.files))
    wait_idle(stager)
    assert stager.stats()["files"] == 4 and stager.stats()["failures"] == {}
    assert snap.files.undescribed() >= 5  # described: the four staged (and one that found no room)
