"""The block stager (monarch/node/stage/blocks.py) on its own: room, order, publication, the job's writes."""

import os
import threading
import time

import pytest

from monarch.config import TierConfig
from monarch.node.snapshot.snapshot import take_snapshot
from monarch.node.stage import block_map, blocks
from monarch.node.stage.stager import Stager
from monarch.node.tiers.tiers import Tier

MiB = 1 << 20


def setup(tmp_path, size, capacity):
    root = tmp_path / "pfs"
    (root / "d").mkdir(parents=True)
    data = os.urandom(size)
    (root / "d" / "big.bin").write_bytes(data)
    (tmp_path / "t").mkdir()
    tier = Tier.from_config(TierConfig("ram", str(tmp_path / "t"), capacity, False), 2, "r1", 0, ())
    return Stager(take_snapshot((str(root),)), [tier]), tier, "0/d/big.bin", data


def wait_done(stager, bf, timeout=30):
    """Until ``bf`` is done, read under the books' lock: a whole file is marked done, then
    published, both under that lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with stager.lock:
            if bf.done:
                return
        time.sleep(0.01)
    pytest.fail(f"{bf.key} was not done within {timeout} s")


def test_a_large_file_is_answered_at_once_then_published_whole(tmp_path):
    stager, tier, key, data = setup(tmp_path, 20 * MiB + 5, 1 << 30)
    slot, path = stager.blocks.answer(key)
    assert slot & 0x400 and slot & 0xff == tier.slot and path.endswith("/.blocks/" + key)
    bf = stager.blocks.files[key]
    wait_done(stager, bf)
    assert bf.whole and stager.where(key) is tier and open(tier.path_for(key), "rb").read() == data
    assert tier.files == 1 and tier.room == tier.allocated(len(data))
    with stager.lock:
        st = stager.blocks.stats_locked()
    assert st["whole_files"] == 1 and st["bytes_staged"] == len(data) and st["blocks_staged"] == 21
    assert stager.stats()["pfs_bytes_read"] == len(data)  # each block once
    assert stager.blocks.answer(key) is None  # whole: the shim probes the plain copy
    stager.shutdown()
    assert stager.drain(10)


def test_a_file_larger_than_the_room_is_staged_in_part_the_wanted_blocks_first(tmp_path):
    stager, tier, key, data = setup(tmp_path, 40 * MiB, 10 * MiB)
    gate = threading.Event()  # the PFS answers once the marks are made (the blocks picked before wait)
    source = stager.blocks._source
    stager.blocks._source = lambda bf: (gate.wait(10), source(bf))[1]
    bf = stager.blocks.attach(key)
    assert bf.budget == 10 and tier.room == 10 * MiB  # as many blocks as the room holds
    wanted = [33, 7, 38]
    for b in wanted:
        bf.states[b] = blocks.BLOCK_WANTED  # as the shim marks what it read from the PFS
    gate.set()
    wait_done(stager, bf)
    staged = [b for b in range(bf.blocks) if bf.states[b] == blocks.BLOCK_STAGED]
    assert len(staged) == 10 and set(wanted) <= set(staged)
    copy = open(bf.path, "rb").read()
    assert all(copy[b * MiB:(b + 1) * MiB] == data[b * MiB:(b + 1) * MiB] for b in staged)
    assert stager.where(key) is None and not bf.whole  # never published: not whole
    with open(bf.map_path, "rb") as f:
        assert int.from_bytes(f.read(48)[40:48], "little") == 1  # "done": the shim stops waiting
    with stager.lock:
        st = stager.blocks.stats_locked()
    assert st["partly_staged_files"] == 1 and st["partly_staged_bytes"] == 10 * MiB
    assert st["partly_staged_of_bytes"] == 40 * MiB


def test_a_file_larger_than_the_room_read_in_order_gives_the_room_to_the_readers_next_blocks(tmp_path):
    """A reader going through a file larger than the room (the shim marks PASSED the blocks it read
    from the PFS): the room left is PLANNED after the furthest of them, the reader's fills take
    their planned blocks, the read-ahead reads the others, and no block the reader passed is read
    again while the room is held for blocks ahead of it; the file is done once the plan is read."""
    stager, tier, key, data = setup(tmp_path, 40 * MiB, 10 * MiB)
    gate = threading.Event()
    source = stager.blocks._source
    stager.blocks._source = lambda bf: (gate.wait(10), source(bf))[1]
    bf = stager.blocks.attach(key)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the read-ahead's first blocks under way (held at the gate)
        with stager.lock:
            first = sorted(bf.in_flight)
        if first:
            break
        time.sleep(0.01)
    with stager.lock:
        first = sorted(bf.in_flight)
        passed = list(range(first[-1] + 1, first[-1] + 5))
        for b in passed:
            bf.states[b] = blocks.BLOCK_PASSED  # the reader's first read, from the PFS
        bf.plan()  # (as the next pick does)
        planned = [b for b in range(bf.blocks) if bf.states[b] == blocks.BLOCK_PLANNED]
        assert planned == list(range(passed[-1] + 1, passed[-1] + 1 + 10 - len(first))), (first, planned)
        mine = planned[:2]
        for b in mine:
            bf.states[b] = blocks.BLOCK_FILLING  # a shim's read takes the plan's first blocks
    gate.set()
    time.sleep(0.3)
    with stager.lock:
        assert not bf.done  # the shim's blocks are the plan's still
    with open(bf.path, "r+b") as f:
        for b in mine:
            f.seek(b * MiB)
            f.write(data[b * MiB:(b + 1) * MiB])
    for b in mine:
        bf.states[b] = blocks.BLOCK_STAGED
    wait_done(stager, bf)
    staged = [b for b in range(bf.blocks) if bf.states[b] == blocks.BLOCK_STAGED]
    assert staged == first + planned, staged  # the room (10 blocks): none the reader passed
    copy = open(bf.path, "rb").read()
    assert all(copy[b * MiB:(b + 1) * MiB] == data[b * MiB:(b + 1) * MiB] for b in staged)
    assert stager.blocks.from_pfs["blocks"] == 10 - len(mine)  # the shim's blocks were its reads'
    with stager.lock:
        st = stager.blocks.stats_locked()
    assert st["partly_staged_bytes"] == 10 * MiB and st["blocks_filled_by_reads"] == len(mine)
    assert tier.room == 10 * MiB  # no more than the room


def test_a_file_larger_than_the_room_stages_the_blocks_a_reader_passed_last(tmp_path):
    """Room left once nothing ahead of an in-order reader is left: the blocks it passed are
    staged then (the room keeps them for a later epoch), never before the others."""
    stager, tier, key, data = setup(tmp_path, 20 * MiB, 18 * MiB)
    gate = threading.Event()
    source = stager.blocks._source
    stager.blocks._source = lambda bf: (gate.wait(10), source(bf))[1]
    bf = stager.blocks.attach(key)
    time.sleep(0.2)
    with stager.lock:
        assert max(bf.in_flight) < 16
        for b in range(16, 19):
            bf.states[b] = blocks.BLOCK_PASSED
    gate.set()
    wait_done(stager, bf)
    staged = {b for b in range(bf.blocks) if bf.states[b] == blocks.BLOCK_STAGED}
    # the room full: the block ahead of the reader and every block not passed first, then one passed
    assert len(staged) == 18 and set(range(16)) | {19} <= staged and len(staged & {16, 17, 18}) == 1, sorted(staged)
    copy = open(bf.path, "rb").read()
    assert all(copy[b * MiB:(b + 1) * MiB] == data[b * MiB:(b + 1) * MiB] for b in staged)


def test_the_jobs_write_stops_serving_the_blocks_and_gives_the_room_back(tmp_path):
    stager, tier, key, data = setup(tmp_path, 24 * MiB, 1 << 30)
    bf = stager.blocks.attach(key)
    states = bytes(bf.states)  # whatever was staged so far
    stager.invalidate(key)
    deadline = time.monotonic() + 10
    while os.path.exists(bf.path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(bf.path) and not os.path.exists(bf.map_path)
    assert stager.where(key) is None and tier.room == 0 and len(states) == 24  # its room given back
    assert stager.blocks.answer(key) is None  # never again this run


def test_a_source_changed_since_the_snapshot_is_never_staged(tmp_path):
    stager, tier, key, data = setup(tmp_path, 17 * MiB, 1 << 30)
    path = tmp_path / "pfs" / "d" / "big.bin"
    os.utime(path, ns=(1, 1))  # another mtime than the snapshot saw
    bf = stager.blocks.attach(key)
    wait_done(stager, bf)
    assert bf.staged == 0 and not bf.whole and stager.blocks.failures == 1


def test_a_shared_sets_copy_of_a_changed_large_file_is_replaced_once_and_the_next_job_books_it(tmp_path):
    """Three "jobs" (stagers on one shared set) in a chain over a large file rewritten after the
    first: the second removes the stale copy (whole and its blocks, one file under two names),
    gives its room back, stages and publishes the new one; the third books it as found."""
    from monarch.node.tiers.shared_tier import SharedTier
    root = tmp_path / "pfs"
    (root / "d").mkdir(parents=True)
    src, key = root / "d" / "big.bin", "0/d/big.bin"
    (tmp_path / "base").mkdir()
    cfg = TierConfig("ram", str(tmp_path / "base"), 1 << 30, False)

    def job(run):
        snapshot = take_snapshot((str(root),))
        tier = SharedTier.from_config(cfg, 2, run, 0, (str(root),), linger=600, wait=5)
        return Stager(snapshot, [tier]), tier, snapshot

    def stage(stager):
        assert stager.blocks.answer(key) is not None
        wait_done(stager, stager.blocks.files[key])

    def leave(stager, tier):
        stager.shutdown()
        assert stager.drain(10)
        tier.remove()

    src.write_bytes(os.urandom(20 * MiB))
    first, t1, _ = job("j1")
    stage(first)
    assert first.blocks.files[key].whole
    leave(first, t1)
    data = os.urandom(20 * MiB)
    before = src.stat().st_mtime_ns
    src.write_bytes(data)
    os.utime(src, ns=(before + 10**9, before + 10**9))
    second, t2, _ = job("j2")
    assert open(t2.path_for(key), "rb").read() != data  # the set's stale copy
    stage(second)
    assert second.blocks.files[key].whole and open(t2.path_for(key), "rb").read() == data
    assert t2.restaged_files == 1 and t2.shared.taken() == t2.allocated(len(data))  # the stale room given back
    leave(second, t2)
    third, t3, snapshot = job("j3")
    assert t3.adopt_existing(snapshot.files) == [key] and t3.restaged_files == 0
    assert third.blocks.answer(key) is None  # whole: the shim's probe finds it
    assert third.stats()["pfs_bytes_read"] == 0
    leave(third, t3)


def test_a_large_files_blocks_a_gone_job_left_unfinished_are_staged_on_by_the_next_job(tmp_path):
    """A job of a chain ends with its large file partly staged in the shared set: the next job
    keeps the blocks it staged and reads only the rest from the PFS (they used to be removed and
    the whole file read again, so a chain of jobs shorter than the copy never warmed)."""
    from monarch.node.tiers.shared_tier import SharedTier
    root = tmp_path / "pfs"
    (root / "d").mkdir(parents=True)
    src, key = root / "d" / "big.bin", "0/d/big.bin"
    data = os.urandom(20 * MiB + 3)
    src.write_bytes(data)
    (tmp_path / "base").mkdir()
    cfg = TierConfig("ram", str(tmp_path / "base"), 1 << 30, False)

    def job(run):
        tier = SharedTier.from_config(cfg, 2, run, 0, (str(root),), linger=600, wait=5)
        return Stager(take_snapshot((str(root),)), [tier]), tier

    first, t1 = job("j1")
    gate, read = threading.Event(), first.blocks._read_block
    count = iter(range(1 << 30))

    def read_some(bf, b, buf):  # the job ends after 8 blocks: the others wait for it
        if next(count) >= 8:
            gate.wait(10)
        return read(bf, b, buf)

    first.blocks._read_block = read_some
    assert first.blocks.answer(key) is not None
    bf1 = first.blocks.files[key]
    deadline = time.monotonic() + 10
    while bf1.staged < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    first.shutdown()
    gate.set()  # (the blocks under way end after the job's end: kept too)
    assert first.drain(10)
    t1.remove()
    left = bf1.staged_bytes
    assert 8 * MiB < left < len(data)
    second, t2 = job("j2")
    assert second.blocks.answer(key) is not None
    bf2 = second.blocks.files[key]
    wait_done(second, bf2)
    assert bf2.whole and open(t2.path_for(key), "rb").read() == data
    assert second.stats()["pfs_bytes_read"] == len(data) - left  # the gone job's blocks kept
    assert (t2.resumed_files, t2.resumed_bytes, t2.resumed_of_bytes, t2.restaged_files) == (1, left, len(data), 0)
    assert t2.shared.taken() == t2.allocated(len(data))  # its room in the set's ledger, once
    second.shutdown()
    assert second.drain(10)
    t2.remove()


def set_over_a_large_file(tmp_path):
    """A 40 MiB file on the "PFS" and a shared set of 16 MiB: its key, its bytes, the root, and
    ``join(run)``, a job's tier on the set."""
    from monarch.node.tiers.shared_tier import SharedTier
    root = tmp_path / "pfs"
    (root / "d").mkdir(parents=True)
    data = os.urandom(40 * MiB)
    (root / "d" / "big.bin").write_bytes(data)
    (tmp_path / "base").mkdir()
    cfg = TierConfig("ram", str(tmp_path / "base"), 16 * MiB, False)
    return "0/d/big.bin", data, root, lambda run: SharedTier.from_config(cfg, 2, run, 0, (str(root),), linger=600,
                                                                         wait=5)


def test_a_partly_staged_copy_a_gone_job_left_gives_the_ledger_back_the_room_it_held(tmp_path):
    """Jobs overlapping on a shared set (no recount of the ledger at a join): a job stages a file
    larger than the set's room in part and leaves; the next job takes the copy up. The ledger must
    still hold what the set's copies hold: the room the gone job took for its blocks is given back,
    not the file's whole size (that made the ledger forget another job's copies: the set could then
    be filled past its capacity). So must a sweep of the set count it, and a removal give it back."""
    from monarch.node.tiers import shared_set
    key, data, root, join = set_over_a_large_file(tmp_path)
    other = join("j0")  # another job, there all along, holding 4 MiB of other copies
    assert other.reserve(4 * MiB)
    first = Stager(take_snapshot((str(root),)), [join("j1")])
    t1 = first.tiers[0]
    assert first.blocks.answer(key) is not None
    bf1 = first.blocks.files[key]
    held = bf1.reserved
    assert 0 < bf1.budget < bf1.blocks and t1.shared.taken() == 4 * MiB + held  # room for some of its blocks
    wait_done(first, bf1)
    first.shutdown()
    assert first.drain(10)
    t1.remove()
    assert other.shared.taken() == 4 * MiB + held  # the gone job's copy keeps its room
    assert shared_set._sweep(other.shared.path, other.allocated)[1] == held  # and a recount finds as much

    second = Stager(take_snapshot((str(root),)), [join("j2")])
    t2 = second.tiers[0]
    assert second.blocks.answer(key) is not None
    bf2 = second.blocks.files[key]
    assert t2.resumed_files == 1 and bf2.staged == bf1.staged > 0
    assert t2.shared.taken() == 4 * MiB + bf2.reserved <= 16 * MiB  # the other job's copies not forgotten
    assert bf2.done == (bf2.staged == bf2.budget)  # a room full from the start: done at once (the rest as direct's)
    wait_done(second, bf2)
    copy, bmap = bf2.path, bf2.map_path
    staged = open(copy, "rb").read()
    assert all(staged[b * MiB:(b + 1) * MiB] == data[b * MiB:(b + 1) * MiB]
               for b in range(bf2.blocks) if bf2.states[b] == blocks.BLOCK_STAGED)
    second.shutdown()
    assert second.drain(10)
    assert t2.remove_copies(copy) and t2.shared.taken() == 4 * MiB  # a removal gives back what it held
    os.unlink(bmap)
    t2.remove()
    other.remove()


def test_a_gone_jobs_blocks_more_than_the_room_now_holds_are_removed_and_the_file_staged_anew(tmp_path):
    """The next job's room holds fewer blocks than the gone job staged (its tier in RAM refuses
    more: the node's memory margin). The copy goes, with the room it held, and the file is staged
    anew in the room there is: the ledger holds that alone, every staged byte right."""
    key, data, root, join = set_over_a_large_file(tmp_path)
    other = join("j0")  # another job, there all along: the ledger is not recounted at a join
    first = Stager(take_snapshot((str(root),)), [join("j1")])
    t1 = first.tiers[0]
    assert first.blocks.answer(key) is not None
    bf1 = first.blocks.files[key]
    wait_done(first, bf1)
    first.shutdown()
    assert first.drain(10)
    t1.remove()
    assert bf1.staged == bf1.budget == 16 and other.shared.taken() == 16 * MiB
    second = Stager(take_snapshot((str(root),)), [join("j2")])
    t2 = second.tiers[0]
    reserve = t2.reserve
    t2.reserve = lambda size, *a, **k: size <= 2 * MiB and reserve(size, *a, **k)  # the memory margin
    assert second.blocks.answer(key) is not None
    bf2 = second.blocks.files[key]
    wait_done(second, bf2)
    assert t2.resumed_files == 0 and bf2.budget == bf2.staged == 2  # anew, in the room there is
    assert other.shared.taken() == 2 * MiB  # the gone job's room given back, the new copy's taken
    copy = open(bf2.path, "rb").read()
    assert all(copy[b * MiB:(b + 1) * MiB] == data[b * MiB:(b + 1) * MiB]
               for b in range(bf2.blocks) if bf2.states[b] == blocks.BLOCK_STAGED)
    assert second.stats()["pfs_bytes_read"] == 2 * MiB
    second.shutdown()
    assert second.drain(10)
    t2.remove()
    other.remove()


def test_publishing_links_over_a_copy_of_another_version_and_leaves_no_temporary(tmp_path):
    src, dest = tmp_path / "copy", tmp_path / "key"
    src.write_bytes(b"new" * 10)
    dest.write_bytes(b"old")
    replaced = block_map.link_over(str(src), str(dest))
    assert replaced is not None and replaced.st_size == 3
    assert os.path.samestat(os.stat(src), os.stat(dest)) and sorted(os.listdir(tmp_path)) == ["copy", "key"]
    assert block_map.link_over(str(src), str(dest)) is None  # itself: nothing replaced



def test_the_maps_records_say_when_the_read_ahead_yields(tmp_path):
    """A shim that found a mapping's random reader of records (RECORDS_YES) has the read-ahead
    yield until the file is done; RECORDS_NO (pages, a scan) or nothing found yet, never."""
    stager, tier, key, _ = setup(tmp_path, 4 * MiB, 1 << 30)
    info = stager.snapshot.files[key]
    bf = block_map.BlockFile(key, info, tier, 4, tier.allocated(info.size))
    bf.create()
    try:
        at = block_map.BLOCKMAP_RECORDS_OFFSET
        say = lambda v: bf._map.__setitem__(slice(at, at + 8), v.to_bytes(8, "little"))  # noqa: E731 (the shim's store)
        assert not bf.records  # nothing found yet
        say(block_map.RECORDS_YES)
        assert bf.records
        say(block_map.RECORDS_NO)
        assert not bf.records
        say(block_map.RECORDS_YES)
        bf.finish()
        assert not bf.records  # done: nothing left to yield for
    finally:
        bf.close()


def test_the_read_ahead_is_alone_on_the_link_while_no_application_reads_the_pfs_file(tmp_path):
    """The map's pfs_reads (a shim's read of the PFS's file) take the read-ahead off the link for
    ALONE_QUIET; the map's mapped (faults read it unseen) for good; a file done minds neither."""
    stager, tier, key, _ = setup(tmp_path, 4 * MiB, 1 << 30)
    info = stager.snapshot.files[key]
    bf = block_map.BlockFile(key, info, tier, 4, tier.allocated(info.size))
    bf.create()
    stager.blocks._active.append(bf)
    bump = lambda at, v: bf._map.__setitem__(slice(at, at + 8), v.to_bytes(8, "little"))  # noqa: E731 (the shim's
    try:
        with stager.lock:
            stager.blocks._pace_locked()
        assert stager.blocks.pace.alone  # nothing read on the PFS: a reader of the copy alone
        now = time.monotonic()
        assert not bf.read_on_pfs(now, 1.0)
        bump(block_map.BLOCKMAP_PFS_READS_OFFSET, 3)
        assert bf.read_on_pfs(now, 1.0) and bf.read_on_pfs(now + 0.9, 1.0)  # a read a moment ago
        assert not bf.read_on_pfs(now + 1.1, 1.0)  # none since, for a second
        bump(block_map.BLOCKMAP_PFS_READS_OFFSET, 4)
        assert bf.read_on_pfs(now + 1.2, 1.0)
        with stager.lock:
            stager.blocks._pace_locked()
        assert not stager.blocks.pace.alone
        bump(block_map.BLOCKMAP_MAPPED_OFFSET, 1)
        assert bf.read_on_pfs(now + 100, 1.0)  # mapped: its faults are never seen
        bf.finish()
        assert not bf.read_on_pfs(now + 100, 1.0)  # done: no read-ahead left to mind them
    finally:
        stager.blocks._active.remove(bf)
        bf.close()


class TwoNodes:
    """``RangePeers`` of node 0 of two: 16-block ranges alternate, node 1 lost once ``lost``."""

    node = 0

    def __init__(self):
        self.lost = False

    def owner(self, key, size, block):
        return 0 if self.lost else (block // 16) % 2

    def own_blocks(self, key, size):
        return [b for b in range(-(-size // MiB)) if (b // 16) % 2 == 0]

    def fetch(self, *args):
        from monarch.errors import PeerError
        raise PeerError("not in this test")

    def offer(self, key, slot):
        pass

    def served_elsewhere(self):
        return 0


def test_a_cluster_files_map_names_each_blocks_owner_and_a_loss_names_the_new_ones(tmp_path):
    """The shim asks another owner's block's owner for a fault's pages (shim_pages.c): the map
    names it after the states (-1: this node's own), and anew when a node is lost."""
    stager, tier, key, data = setup(tmp_path, 40 * MiB, 1 << 30)
    peers = TwoNodes()
    stager.blocks.use_peers(peers)
    gate = threading.Event()  # nothing staged until the map was looked at
    source = stager.blocks._source
    stager.blocks._source = lambda bf: (gate.wait(10), source(bf))[1]
    bf = stager.blocks.attach(key)

    def owners():
        with open(bf.map_path, "rb") as f:
            raw = f.read()
        assert len(raw) == block_map.map_size(bf.blocks)
        at = block_map.owners_at(bf.blocks)
        return [int.from_bytes(raw[at + 2 * b:at + 2 * b + 2], "little", signed=True) for b in range(bf.blocks)]

    assert owners() == [-1 if (b // 16) % 2 == 0 else 1 for b in range(40)]
    peers.lost = True
    stager.blocks.reown()
    assert owners() == [-1] * 40  # node 1's ranges are this node's now: their faults wait for them here
    gate.set()
    stager.shutdown()
    assert stager.drain(10)
