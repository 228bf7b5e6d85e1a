"""Large files staged by blocks, read through a real ``monarch run`` behind the emulated PFS.

Each reader checks every byte it reads against the source file (read apart, not through the
shim); the PFS traffic is the emulator's own count; "staged" is read from the daemon's own
block map in the tier (a header, then a state byte per block: 2 = staged).
"""

import json
import os
import struct
import sys

import pytest

from monarch.node.stage import blocks
from monarch.node.stage.block_map import (BLOCKMAP_EVICTIONS_OFFSET, BLOCKMAP_MAPPED_OFFSET,
                                          BLOCKMAP_PFS_READS_OFFSET, BLOCKMAP_RECORDS_OFFSET, BLOCKMAP_ROOM_OFFSET,
                                          BLOCKMAP_WAIT_OFFSET, BLOCKMAP_WINDOW_OFFSET)
from support.harness import load, make_bases, monarch

pytestmark = [pytest.mark.integration, pytest.mark.fuse]

MiB = 1 << 20

# Shared by the readers below: the source to check against, the block map of the copy (found
# in the tier base), the emulated PFS's own byte count.
COMMON = f"HEADER_SIZE, DONE_OFFSET = {blocks.BLOCKMAP_HEADER.size}, {blocks.BLOCKMAP_DONE_OFFSET}\n" + r"""
import glob, hashlib, json, mmap, os, random, re, struct, sys, threading, time
path, src_path, tier_base, pfs_counters = sys.argv[1:5]
src = os.open(src_path, os.O_RDONLY)
size = os.fstat(src).st_size

def want(off, n):
    return os.pread(src, n, off)

def block_map():
    found = glob.glob(os.path.join(tier_base, "**", ".blockmap", "**", os.path.basename(path)), recursive=True)
    if not found:
        return None, None
    with open(found[0], "rb") as f:
        raw = f.read()
    done, blocks = struct.unpack_from("<Q", raw, DONE_OFFSET)[0], struct.unpack_from("<Q", raw, 32)[0]
    return raw[HEADER_SIZE:HEADER_SIZE + blocks], done  # (the states: the owners follow them)

def staged():
    states, _ = block_map()
    return (states.count(2), len(states)) if states is not None else (0, 0)

def wait_whole(timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n, total = staged()
        if total and n == total:
            return
        time.sleep(0.05)
    raise SystemExit(f"the copy was not whole within {timeout} s: {staged()}")

def advice():
    # the kernel's advice ("rr": MADV_RANDOM) on the mappings' ranges still on the PFS's file
    random_read, on_pfs = [], False
    for line in open("/proc/self/smaps"):
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
            on_pfs = line.rstrip().endswith(path)
        elif line.startswith("VmFlags:") and on_pfs:
            random_read.append("rr" in line.split()[1:])
    return random_read

def pfs_bytes():
    time.sleep(0.1)  # the emulator writes its counters every 10 ms
    with open(pfs_counters) as f:
        return json.load(f)["bytes"]
"""


@pytest.fixture(scope="module", autouse=True)
def shim_built():
    """The shim built before the first job: its build (seconds, after a change to its source) is
    not counted in the first case's timings."""
    from monarch.shim import shim_library
    shim_library()


def setup_case(short_tmp, slow_pfs, size, bandwidth, capacity, name="tok.bin", read_latency_ms=0.0):
    src = os.path.join(short_tmp, "src", "data")
    os.makedirs(src)
    with open(os.path.join(src, name), "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
        f.write(os.urandom(size % MiB))
    pfs = slow_pfs(os.path.dirname(src), open_latency_ms=2, read_latency_ms=read_latency_ms, bandwidth_mbps=bandwidth,
                   page_cache=True)
    root = os.path.join(str(pfs.mountpoint), "data")
    tier_base = f"/dev/shm{short_tmp}/ram"
    cfg = os.path.join(short_tmp, "c.yaml")
    with open(cfg, "w") as f:
        json.dump({"dataset": {"roots": [root]}, "run_base": f"{short_tmp}/run",
                   "tiers": [{"name": "ram", "path": tier_base, "capacity": capacity}]}, f)
    make_bases(cfg)
    return pfs, cfg, os.path.join(root, name), os.path.join(src, name), tier_base


def run_reader(short_tmp, cfg, body, path, src, tier_base, pfs, timeout=240, extra=()):
    script = os.path.join(short_tmp, "reader.py")
    with open(script, "w") as f:
        f.write(COMMON + body)
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, script, path, src,
                tier_base, pfs.counters_path, *extra, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), load(report), r.stderr


OPEN_THEN_READ = r"""
t0 = time.monotonic()
fd = os.open(path, os.O_RDONLY)
opened_s = time.monotonic() - t0
at_open = staged()
assert os.fstat(fd).st_size == size and os.lseek(fd, 0, os.SEEK_END) == size  # the source's
assert os.pread(fd, 4096, size - 100) == want(size - 100, 100)
wait_whole()
assert hashlib.md5(open(path, "rb").read()).digest() == hashlib.md5(want(0, size)).digest()
print(json.dumps({"opened_s": opened_s, "staged_at_open": at_open}))
"""


def test_an_open_of_a_large_file_is_answered_before_its_copy_ends(short_tmp, slow_pfs):
    size = 48 * MiB  # 2.4 s at 20 MB/s
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 20, "1GiB")
    out, rep, _ = run_reader(short_tmp, cfg, OPEN_THEN_READ, path, src, tier_base, pfs)
    done, total = out["staged_at_open"]
    # the open did not wait for the copy: the copy's own map shows it incomplete when the open
    # returned (how much the read-ahead did before it depends on how long the reader took to start)
    assert total == size // MiB and done < total, out
    assert out["opened_s"] < 1.0, out  # the copy takes 2.4 s
    blocks = rep["blocks"]
    assert blocks["files"] == 1 and blocks["whole_files"] == 1 and blocks["read"]["opens"] >= 1
    assert pfs.counters()["bytes"] <= 1.05 * size


MAPPED_BEFORE = r"""
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # made before its blocks arrive
os.close(fd)  # the mapping keeps the file (as np.memmap does)
rng = random.Random(7)
bad = 0
def windows(n):
    global bad
    for _ in range(n):
        o = rng.randrange(0, size - 2050)
        bad += m[o:o + 2050] != want(o, 2050)
staged_before = staged()[0]
windows(200)
wait_whole()
time.sleep(0.3)  # the remapper's pause is at most 50 ms
before = pfs_bytes()
windows(3000)
assert m[:] == want(0, size)  # every byte, through the mapping
after = pfs_bytes()
mine = [l for l in open("/proc/self/maps") if "/.blocks/" in l]
moved = sum(int(l.split()[0].split("-")[1], 16) - int(l.split()[0].split("-")[0], 16) for l in mine)
print(json.dumps({"bad": bad, "pfs_during": after - before, "moved": moved, "staged_before": staged_before}))
"""


@pytest.mark.parametrize("size_mib, bandwidth", [(40, 25), (384, 0)], ids=["slow-copy", "fast-copy"])
def test_a_mapping_made_before_the_copy_is_read_from_the_local_copy_afterwards(short_tmp, slow_pfs, size_mib,
                                                                               bandwidth):
    """``fast-copy``: blocks arrive while the shim's remapper populates long runs of them, so the
    daemon's "done" comes during a pass that found blocks not staged yet: every one is moved all
    the same."""
    size = size_mib * MiB
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, bandwidth, "1GiB")
    out, rep, _ = run_reader(short_tmp, cfg, MAPPED_BEFORE, path, src, tier_base, pfs)
    assert out["bad"] == 0, out
    assert out["staged_before"] < size // MiB  # mapped while the copy was under way
    assert out["pfs_during"] == 0, out  # the reader went on (the whole file, 3000 windows), the PFS did not
    assert out["moved"] >= size, out  # the mapping's pages are the copy's (/proc/self/maps)
    assert rep["blocks"]["read"]["remapped_bytes"] >= size


ADVICE = r"""
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
os.close(fd)
rng = random.Random(3)
bad = 0
deadline = time.monotonic() + 0.5
while time.monotonic() < deadline:
    o = rng.randrange(0, size - 2050)
    bad += m[o:o + 2050] != want(o, 2050)
    time.sleep(0.01)
print(json.dumps({"bad": bad, "random_read": advice(), "staged": staged()}))
"""


@pytest.mark.parametrize("read_latency_ms, random_read", [(0, True), (20, False)], ids=["quick-pfs", "long-round-trip"])
def test_a_mappings_faults_read_pages_on_a_quick_pfs_and_around_on_a_long_round_trip(short_tmp, slow_pfs,
                                                                                     read_latency_ms, random_read):
    """On the PFS's pages a fault reads the page (the daemon's blocks are the read-ahead), but
    on a PFS whose every read call costs 20 ms a 2 KiB window across two pages would pay two
    round trips: there the kernel's read-around stays."""
    size = 64 * MiB  # 4 s at 16 MB/s: mapped while most of it is on the PFS
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 16, "1GiB", read_latency_ms=read_latency_ms)
    out, rep, _ = run_reader(short_tmp, cfg, ADVICE, path, src, tier_base, pfs)
    assert out["bad"] == 0, out
    assert out["random_read"] and out["staged"][0] < out["staged"][1], out  # ranges still on the PFS
    assert set(out["random_read"]) == {random_read}, out
    pace = rep["nodes"][0]["staging"]["blocks"]["pace"]
    assert pace["readaround"] is not random_read, pace


RECORDS = r"""
kind, records_at = sys.argv[5], int(sys.argv[6])
length = 2050 if kind == "windows" else 65536  # a token window, or an LMDB's values (page-aligned)
page_by_page = kind == "slow-records"  # each value decoded as its pages come: over several of the shim's looks
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
os.close(fd)
rng = random.Random(5)
bad = 0

def found():
    files = glob.glob(os.path.join(tier_base, "**", ".blockmap", "**", os.path.basename(path)), recursive=True)
    with open(files[0], "rb") as f:
        return struct.unpack_from("<Q", f.read(records_at + 8), records_at)[0]

def read(seconds):
    global bad
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        o = rng.randrange(0, size - length) if kind == "windows" else rng.randrange(0, size - length) & ~4095
        for at, n in [(o + p, 4096) for p in range(0, length, 4096)] if page_by_page else [(o, length)]:
            bad += m[at:at + n] != want(at, n)
            time.sleep(0.015 if page_by_page else 0)
        time.sleep(0.002)

read(0.5)
deadline = time.monotonic() + 10
while not found() and time.monotonic() < deadline:
    read(0.1)
time.sleep(0.1)  # the remapper's next look lifts the advice
read(0.3)
print(json.dumps({"bad": bad, "records": found(), "random_read": advice(), "staged": staged()}))
"""


@pytest.mark.parametrize("kind, records", [("records", blocks.RECORDS_YES), ("slow-records", blocks.RECORDS_YES),
                                           ("windows", blocks.RECORDS_NO)])
def test_a_random_reader_of_records_gets_direct_faults_and_the_read_ahead_yields_to_them(short_tmp, slow_pfs, kind,
                                                                                         records):
    """An LMDB's gets through a mapping while the file stages: with the shim's MADV_RANDOM each of
    a 64 KiB value's 16 pages was a fault of its own, each behind the read-ahead's queue at the
    link, and the gets ran at 0.46x direct's pace. The shim tells such a reader apart by the runs
    of pages its faults bring in: its faults read around (as direct's), and the daemon's read-ahead
    yields the link (one small request at a time) while the file stages. A reader of 2 KiB windows
    keeps its page-sized faults, and the read-ahead its pace. A reader whose values come in over
    several of the shim's looks (decoded page by page, or faulted in slowly on a loaded machine) is
    seen with each value's runs whole (counted at every look, its values in progress would be seen
    short, and it taken for a reader of pages)."""
    size = 64 * MiB  # 4 s at 16 MB/s: the job ends before the copy
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 16, "1GiB")
    out, rep, _ = run_reader(short_tmp, cfg, RECORDS, path, src, tier_base, pfs,
                             extra=(kind, str(BLOCKMAP_RECORDS_OFFSET)))
    pace = rep["nodes"][0]["staging"]["blocks"]["pace"]
    assert out["bad"] == 0, out
    if pace["readaround"]:  # a loaded machine measured a long round trip: every fault reads around
        assert out["records"] == 0 and not any(out["random_read"]), (out, pace)  # (runs say nothing then)
        return
    assert out["staged"][0] < out["staged"][1], (out, pace)  # found while ranges were still on the PFS
    assert out["records"] == records, (out, pace)
    assert out["random_read"] and set(out["random_read"]) == {kind == "windows"}, (out, pace)  # kept or lifted
    assert pace["yielding"] is (kind != "windows"), pace


SAYS_PFS_READS = r"""
reads_at, mapped_at = int(sys.argv[5]), int(sys.argv[6])

def header(at):
    found = glob.glob(os.path.join(tier_base, "**", ".blockmap", "**", os.path.basename(path)), recursive=True)
    with open(found[0], "rb") as f:
        return struct.unpack_from("<Q", f.read(at + 8), at)[0]

fd = os.open(path, os.O_RDONLY)
bad = 0
before = header(reads_at)
states, _ = block_map()
b = states.rindex(0) if 0 in states else None  # a block still on the PFS only
if b is not None:
    bad += os.pread(fd, 4096, b << 20) != want(b << 20, 4096)
after_pfs = header(reads_at)
wait_whole()
for off in range(0, size, 1 << 20):
    bad += os.pread(fd, 1 << 20, off) != want(off, 1 << 20)
after_copy = header(reads_at)
mapped_before = header(mapped_at)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
bad += m[size - 4096:] != want(size - 4096, 4096)
print(json.dumps({"bad": bad, "absent": b, "reads": [before, after_pfs, after_copy],
                  "mapped": [mapped_before, header(mapped_at)]}))
"""


def test_the_shim_says_in_the_map_when_the_application_reads_the_pfs_file_itself(short_tmp, slow_pfs):
    """The daemon's read-ahead keeps little of the link queued ahead of the application's reads
    of the PFS; where there are none (a reader of the copy only, as cat's) it is alone on the
    link and fills it. The shim says which: a read of a block not staged raises the map's
    pfs_reads, a read of the copy does not, and a mapping of the PFS's file (its faults read it
    unseen) sets the map's mapped."""
    size = 32 * MiB  # 2 s at 16 MB/s: a block is still on the PFS at the first read
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 16, "1GiB")
    out, rep, _ = run_reader(short_tmp, cfg, SAYS_PFS_READS, path, src, tier_base, pfs,
                             extra=(str(BLOCKMAP_PFS_READS_OFFSET), str(BLOCKMAP_MAPPED_OFFSET)))
    assert out["bad"] == 0, out
    assert out["absent"] is not None, out
    before, after_pfs, after_copy = out["reads"]
    assert after_pfs > before and after_copy == after_pfs, out
    assert out["mapped"] == [0, 1], out


PARTLY = r"""
fd = os.open(path, os.O_RDONLY)
bad = 0
for epoch in range(3):
    for off in range(0, size, 256 << 10):  # every byte, in 256 KiB reads, each epoch
        bad += os.pread(fd, 256 << 10, off) != want(off, 256 << 10)
    if epoch == 0:
        deadline = time.monotonic() + 60
        while block_map()[1] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the daemon stages what fits, then says it is done
n, total = staged()
print(json.dumps({"bad": bad, "staged": n, "blocks": total}))
"""


def test_a_file_larger_than_the_tier_is_partly_staged_and_its_staged_blocks_read_locally(short_tmp, slow_pfs):
    size = 48 * MiB
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 200, "20MiB")
    out, rep, stderr = run_reader(short_tmp, cfg, PARTLY, path, src, tier_base, pfs)
    assert out["bad"] == 0, out
    assert 0 < out["staged"] <= 20 and out["blocks"] == 48, out  # as much as the room holds
    blocks = rep["blocks"]
    assert blocks["partly_staged_files"] == 1 and blocks["partly_staged_of_bytes"] == size
    assert blocks["partly_staged_bytes"] == out["staged"] * MiB
    read = blocks["read"]
    # epochs 2 and 3 read the staged blocks from the copy, the rest from the PFS
    assert read["local_bytes"] >= 2 * out["staged"] * MiB and read["pfs_bytes"] >= 2 * (48 - out["staged"]) * MiB
    counted = pfs.counters()["bytes"]
    assert counted <= 3 * size - 2 * out["staged"] * MiB + 0.05 * size, (counted, out)
    assert "partly staged: 1 file" in stderr


def test_the_report_counts_a_file_read_from_staged_blocks_as_staged_by_blocks_not_as_not_staged(short_tmp, slow_pfs):
    """A large file partly staged (the tier holds 20 of its 48 blocks) is read from its staged
    blocks: the report's size classes say so (``by_blocks``: the bytes staged of its bytes), in
    the JSON and printed, and do not count it as "not staged"."""
    size = 48 * MiB
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 200, "20MiB")
    out, rep, stderr = run_reader(short_tmp, cfg, PARTLY, path, src, tier_base, pfs)
    assert out["bad"] == 0, out
    assert rep["blocks"]["read"]["local_bytes"] > 0, rep["blocks"]
    large = next(c for c in rep["size_classes"] if c["class"] == ">=16MiB")
    assert large["files"] == 1 and large["not_staged"] == {"files": 0, "bytes": 0}, large
    assert large["by_blocks"] == {"files": 1, "bytes": out["staged"] * MiB, "of_bytes": size}, large
    line = next(ln for ln in stderr.splitlines() if ln.startswith(">=16MiB"))
    assert f"by blocks 1 ({out['staged']}.0 MiB of 48.0 MiB)" in line and "not staged" not in line, line


FAMILIES = r"""
import numpy as np
fd = os.open(path, os.O_RDONLY)
checks = []
def check(name, ok):
    checks.append(name) if not ok else None

# numpy's memmap, made before the blocks arrive, read in a forked child and in threads
arr = np.memmap(path, dtype=np.uint8, mode="r")
ref = np.memmap(src_path, dtype=np.uint8, mode="r")
rng = random.Random(3)
def windows(tag, n, seed):
    r = random.Random(seed)
    for _ in range(n):
        o = r.randrange(0, size - 4096)
        if not np.array_equal(arr[o:o + 4096], ref[o:o + 4096]):
            check(f"memmap {tag}", False)
        got = os.pread(fd, 3000, o)
        if got != want(o, 3000):
            check(f"pread {tag}", False)
threads = [threading.Thread(target=windows, args=(f"thread {i}", 300, i)) for i in range(4)]
for t in threads:
    t.start()
pid = os.fork()
if pid == 0:
    try:
        windows("child", 300, 99)
        wait_whole()
        time.sleep(0.3)
        windows("child after", 300, 98)
        os._exit(0 if not checks else 3)
    except BaseException:
        os._exit(4)
windows("main", 300, 5)
for t in threads:
    t.join()
_, status = os.waitpid(pid, 0)
check("forked child", os.waitstatus_to_exitcode(status) == 0)

# a sequential read with read() through a Python file object, readv/preadv, stdio
with open(path, "rb") as f:
    f.seek(3 << 20)
    check("file.read", f.read(5 << 20) == want(3 << 20, 5 << 20))
    check("tell", f.tell() == 8 << 20)
bufs = [bytearray(1000), bytearray(70000)]
check("preadv", os.preadv(fd, bufs, 12345) == 71000 and bytes(bufs[0]) + bytes(bufs[1]) == want(12345, 71000))
os.lseek(fd, 777, os.SEEK_SET)
check("readv", os.readv(fd, bufs) == 71000 and bytes(bufs[0]) + bytes(bufs[1]) == want(777, 71000))
check("lseek after readv", os.lseek(fd, 0, os.SEEK_CUR) == 777 + 71000)
wait_whole()
os.lseek(fd, 1 << 20, os.SEEK_SET)
check("read once staged", os.read(fd, 2 << 20) == want(1 << 20, 2 << 20))
check("offset once staged", os.lseek(fd, 0, os.SEEK_CUR) == 3 << 20)
dup = os.dup(fd)
os.close(fd)
check("dup once staged", os.pread(dup, 4096, size - 4096) == want(size - 4096, 4096))
check("fstat", os.fstat(dup).st_size == size)
time.sleep(0.3)
check("memmap once staged", np.array_equal(arr, ref))
import subprocess
md5 = subprocess.run(["md5sum", path], capture_output=True, text=True).stdout.split()[0]
check("md5sum", md5 == hashlib.md5(want(0, size)).hexdigest())
print(json.dumps({"failed": checks}))
"""


def test_every_reader_family_reads_the_sources_bytes_while_blocks_arrive(short_tmp, slow_pfs):
    pytest.importorskip("numpy")
    size = 32 * MiB + 12345  # a short last block
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 15, "1GiB")
    out, rep, _ = run_reader(short_tmp, cfg, FAMILIES, path, src, tier_base, pfs)
    assert out["failed"] == [], out
    read = rep["blocks"]["read"]
    assert read["local_bytes"] > 0 and read["remapped_bytes"] > 0, read
    assert pfs.counters()["bytes"] <= 1.5 * size  # the staging once, and what was read before its blocks


def test_the_block_map_header_is_what_the_shim_reads():
    """blocks.BLOCKMAP_HEADER packs the C struct monarch_blockmap_header (its size: test_wire)."""
    raw = blocks.BLOCKMAP_HEADER.pack(blocks.BLOCKMAP_MAGIC, blocks.BLOCKMAP_VERSION, 20, 5, -1, 1, 1, 3, 4, 7, 8, 9, 10, 11, 12, 13)
    assert struct.unpack_from("<Q", raw, blocks.BLOCKMAP_DONE_OFFSET)[0] == 1
    assert struct.unpack_from("<Q", raw, blocks.BLOCKMAP_READAROUND_OFFSET)[0] == 3
    assert struct.unpack_from("<Q", raw, blocks.BLOCKMAP_FILL_OFFSET)[0] == 4
    assert struct.unpack_from("<Q", raw, BLOCKMAP_WAIT_OFFSET)[0] == 7
    assert struct.unpack_from("<Q", raw, BLOCKMAP_WINDOW_OFFSET)[0] == 8
    assert struct.unpack_from("<Q", raw, BLOCKMAP_EVICTIONS_OFFSET)[0] == 9
    assert struct.unpack_from("<Q", raw, BLOCKMAP_RECORDS_OFFSET)[0] == 10
    assert struct.unpack_from("<Q", raw, BLOCKMAP_PFS_READS_OFFSET)[0] == 11
    assert struct.unpack_from("<Q", raw, BLOCKMAP_MAPPED_OFFSET)[0] == 12
    assert struct.unpack_from("<Q", raw, BLOCKMAP_ROOM_OFFSET)[0] == 13
    assert raw[:8] == b"BLOCKMAP"


CLOSES_OTHERS = r"""
fd = os.open(path, os.O_RDONLY)
wait_whole()
assert os.pread(fd, 1 << 20, 0) == want(0, 1 << 20)
keep = {fd, src}
for n in range(3, 256):  # as a worker that closes every descriptor it did not open
    if n not in keep:
        try:
            os.close(n)
        except OSError:
            pass
decoys = [os.open("/dev/zero", os.O_RDONLY) for _ in range(20)]  # other files on the freed numbers
ok = all(os.pread(fd, 65536, off) == want(off, 65536) for off in range(0, size - 65536, 3 << 20))
print(json.dumps({"ok": ok}))
"""


def test_a_reader_that_closes_the_shims_copy_still_reads_the_sources_bytes(short_tmp, slow_pfs):
    size = 24 * MiB  # 2.4 s at 10 MB/s: opened while its blocks are staged
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 10, "1GiB")
    out, rep, _ = run_reader(short_tmp, cfg, CLOSES_OTHERS, path, src, tier_base, pfs)
    assert out["ok"], out
    assert rep["blocks"]["read"]["opens"] == 1 and rep["blocks"]["read"]["local_bytes"] >= 1 << 20


def test_two_jobs_of_one_user_share_a_large_files_blocks_and_read_the_pfs_once(short_tmp, slow_pfs):
    """Two concurrent jobs (their own scheduler jobs) open one large file in a shared tier: one
    stages it by blocks, the other reads those blocks (its own shim checks the map against its
    snapshot) until the whole copy is published; the emulated PFS serves the file about once."""
    import subprocess
    from support.harness import monarch_env
    size = 40 * MiB
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 40, "1GiB")
    with open(cfg) as f:
        config = json.load(f)
    config["staging"] = {"share": True, "linger": 0}
    with open(cfg, "w") as f:
        json.dump(config, f)
    script = os.path.join(short_tmp, "reader.py")
    with open(script, "w") as f:
        f.write(COMMON + OPEN_THEN_READ)
    procs = [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--", sys.executable,
                               script, path, src, tier_base, pfs.counters_path],
                              env=monarch_env(MONARCH_JOB_ID=f"share-{i}"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, out + err
    assert pfs.counters()["bytes"] <= 1.15 * size  # the staging once, and what was read before its blocks


FIRST_PART = r"""
with open(path, "rb", buffering=0) as f:
    ok = f.read(MiB) == want(0, MiB)
time.sleep(float(sys.argv[5]))  # the job's work, while the copy goes on
print(json.dumps({"ok": ok, "staged": staged()[0]}))
"""

WHOLE_FILE = r"""
with open(path, "rb", buffering=0) as f:
    ok = hashlib.md5(f.read()).digest() == hashlib.md5(want(0, size)).digest()
wait_whole()
print(json.dumps({"ok": ok}))
"""


def test_a_chain_of_jobs_stages_on_from_the_blocks_a_gone_job_left(short_tmp, slow_pfs):
    """Job 1 of a chain ends with its large file partly staged in the shared set (the default);
    job 2 reads the whole file: it keeps job 1's blocks and reads the PFS for the rest only,
    every byte checked. Before, job 2 removed them and read the whole file again: a chain of
    jobs each shorter than the copy never finished it."""
    size = 32 * MiB
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 20, "1GiB")
    first, _, _ = run_reader(short_tmp, cfg, "MiB = 1 << 20\n" + FIRST_PART, path, src, tier_base, pfs, extra=("0.8",))
    # (20 MB/s: a copy of 1.7 s; what job 1 staged is more than job 2's bound leaves for a second read)
    assert first["ok"] and 6 <= first["staged"] < size // MiB, first
    second, rep, _ = run_reader(short_tmp, cfg, WHOLE_FILE, path, src, tier_base, pfs)
    assert second["ok"], second
    assert pfs.counters()["bytes"] <= 1.15 * size, (first, pfs.counters()["bytes"] / size)  # the chain: the file once
    shared = rep["nodes"][0]["tiers"][0]["shared"]
    assert shared["resumed_files"] == 1 and shared["resumed_bytes"] >= first["staged"] * MiB, shared


LARGE_READS = r"""
kind = sys.argv[5]
t0 = time.monotonic()
fd = os.open(path, os.O_RDONLY)
got = []
if kind == "whole":  # one read() of the whole file (a whole-file f.read(), a shard read at once)
    with os.fdopen(fd, "rb", buffering=0) as f:
        got.append(f.read())
elif kind == "calls":  # 16 MiB read() calls, in order
    while True:
        b = os.read(fd, 16 << 20)
        if not b:
            break
        got.append(b)
    os.close(fd)
else:  # a weights load: a header, then tensors of many sizes at unaligned offsets, by readinto
    rng = random.Random(5)
    off = 0
    while off < size:
        n = min(size - off, rng.choice([4096, 300 << 10, 5 << 20, 9 << 20 | 12345, 17 << 20 | 777]))
        buf = bytearray(n)
        os.lseek(fd, off, os.SEEK_SET)
        with memoryview(buf) as view:
            while view:  # (a read() may be short: loop as a loader does)
                r = os.readv(fd, [view]) if n < (4 << 20) else os.read(fd, len(view))
                if isinstance(r, bytes):
                    view[:len(r)], r = r, len(r)
                assert r > 0
                view = view[r:]
        got.append(bytes(buf))
        off += n
    os.close(fd)
seconds = time.monotonic() - t0
data = b"".join(got)
ok = len(data) == size and hashlib.md5(data).digest() == hashlib.md5(want(0, size)).digest()
pfs = pfs_bytes()
wait_whole()
print(json.dumps({"ok": ok, "pfs": pfs, "seconds": seconds}))
"""


@pytest.mark.parametrize("kind", ["whole", "calls", "weights"])
def test_a_file_read_in_large_calls_is_read_from_the_pfs_once(short_tmp, slow_pfs, kind):
    """A whole-file read, 16 MiB read() calls and a weights load (unaligned reads of 4 KiB to
    17 MiB) of a file the tier holds: the application's reads of blocks not staged fill the
    copy, so the PFS serves the file once (before: its reads, and the same blocks again for
    the copy), every byte the source's, and the copy is whole and published."""
    size = 64 * MiB + 4321
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 200, "1GiB")
    script = os.path.join(short_tmp, "reader.py")
    with open(script, "w") as f:
        f.write(COMMON + LARGE_READS)
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, script, path, src,
                tier_base, pfs.counters_path, kind, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    assert out["pfs"] <= 1.05 * size, (out["pfs"] / size, out)
    assert pfs.counters()["bytes"] <= 1.05 * size, pfs.counters()["bytes"] / size
    blocks = load(report)["blocks"]
    assert blocks["whole_files"] == 1, blocks


AFTER_DONE = r"""
app_random = sys.argv[5] == "random"  # the application advises its mappings itself (LMDB's MDB_NORDAHEAD)
fd = os.open(path, os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # made while the daemon stages what fits
if app_random:
    m.madvise(mmap.MADV_RANDOM)
rng = random.Random(3)
bad = 0
def windows(mm, n):
    global bad
    for _ in range(n):
        o = rng.randrange(0, size - 70000)
        bad += mm[o:o + 70000] != want(o, 70000)
windows(m, 50)
during = advice()
deadline = time.monotonic() + 60
while block_map()[1] == 0 and time.monotonic() < deadline:
    time.sleep(0.05)  # the room is full: the daemon says no more blocks will come
time.sleep(0.3)  # the remapper's pause is at most 50 ms
windows(m, 200)
after = advice()
m2 = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # made after: read as direct's from the start
if app_random:
    m2.madvise(mmap.MADV_RANDOM)
windows(m2, 200)
print(json.dumps({"bad": bad, "during": during, "after": advice(), "after_first": after, "staged": staged()}))
"""


@pytest.mark.parametrize("advice", ["none", "random"])
def test_a_partly_staged_files_mappings_read_as_directs_once_no_more_blocks_will_come(short_tmp, slow_pfs, advice):
    """A file twice the room: once the daemon has staged what fits (the map's done), the ranges
    left on the PFS are read for the rest of the job as direct reads them, with the kernel's
    read-around, not page by page (MADV_RANDOM, the read-ahead's rule while blocks still come):
    before, a random reader of a partly staged file ran slower than direct for the whole job.
    ``random``: as direct reads them means with the application's own advice. LMDB under
    MDB_NORDAHEAD advises MADV_RANDOM; the shim gave it the read-around all the same, and an LMDB
    twice the tier read 3 epochs read 3.12x its size from the PFS (direct 3.00x, the bound 2.00x)."""
    size = 48 * MiB
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 100, "20MiB")
    out, rep, _ = run_reader(short_tmp, cfg, AFTER_DONE, path, src, tier_base, pfs, extra=(advice,))
    assert out["bad"] == 0, out
    assert 0 < out["staged"][0] < out["staged"][1], out  # partly staged: ranges left on the PFS
    app_random = advice == "random"  # (the kernel's advice, "rr": MADV_RANDOM)
    assert out["after_first"] and set(out["after_first"]) == {app_random}, out  # the mapping made before
    assert out["after"] and set(out["after"]) == {app_random}, out  # and one made after done



STDIO = r"""
import subprocess
cmd = json.loads(sys.argv[5])
t0 = time.monotonic()
r = subprocess.run([a.replace("{path}", path).replace("{src}", src_path) for a in cmd], capture_output=True,
                   text=True, timeout=200)
seconds = time.monotonic() - t0
pfs = pfs_bytes()
wait_whole()
data = want(0, size)
print(json.dumps({"rc": r.returncode, "out": r.stdout, "err": r.stderr[-2000:], "pfs": pfs, "seconds": seconds,
                  "md5": hashlib.md5(data).hexdigest(), "sha256": hashlib.sha256(data).hexdigest()}))
"""


@pytest.fixture(scope="module")
def stdio_reader(tmp_path_factory):
    """tests/integration/stdio_reader.c compiled (fopen/fdopen, fread, fseeko, getc, fgets ...)."""
    import shutil
    import subprocess
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    exe = str(tmp_path_factory.mktemp("stdio") / "stdio_reader")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stdio_reader.c")
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-o", exe, src], check=True)
    return exe


@pytest.mark.parametrize("reader", ["md5sum", "sha256sum", "fopen", "fdopen", "fromfile", "cat"])
def test_a_stdio_reader_of_a_large_file_reads_its_staged_blocks_and_the_pfs_once(short_tmp, slow_pfs, stdio_reader,
                                                                                reader):
    """md5sum, sha256sum, a C program (fopen or fdopen, fread, fseeko, getc, fgets, fscanf,
    freopen) and numpy's fromfile (fdopen of a dup, fread) read a large file while its blocks
    are staged: a FILE of a file staged by blocks reads through the shim's block-aware path
    (its staged blocks from the copy, a run in order's blocks not staged filled into it), so
    the PFS serves the file once, every byte the source's. Before, stdio read it through
    glibc's internal __read, which no preload sees: the PFS served it twice (the FILE's reads
    and the daemon's copy). cat's 128 KiB read() calls, in order, fill the copy as a large
    read does (before: 1.03x the file at 2 ms per PFS read call)."""
    size = 64 * MiB + 4321  # 1.3 s at 50 MB/s: opened while its blocks are staged
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 50, "1GiB")
    cmd = {"md5sum": ["md5sum", "{path}"], "sha256sum": ["sha256sum", "{path}"],
           "fopen": [stdio_reader, "fopen", "{path}", "{src}"],
           "fdopen": [stdio_reader, "fdopen", "{path}", "{src}"], "cat": ["sh", "-c", "cat '{path}' | md5sum"],
           "fromfile": [sys.executable, "-c", "import hashlib, sys, numpy; print(hashlib.md5(numpy.fromfile("
                        "sys.argv[1], dtype=numpy.uint8)).hexdigest())", "{path}"]}[reader]
    if reader == "fromfile":
        pytest.importorskip("numpy")
    out, rep, _ = run_reader(short_tmp, cfg, STDIO, path, src, tier_base, pfs, extra=[json.dumps(cmd)])
    assert out["rc"] == 0, out
    if reader in ("md5sum", "sha256sum", "cat", "fromfile"):
        assert out["out"].split()[0] == out["sha256" if reader == "sha256sum" else "md5"], out
    else:
        assert out["out"].strip() == "ok", out
    assert out["pfs"] <= 1.05 * size, (out["pfs"] / size, out)
    assert pfs.counters()["bytes"] <= 1.05 * size, pfs.counters()["bytes"] / size
    read = rep["blocks"]["read"]  # the FILE's reads are the shim's now: seen, from the copy and the PFS
    assert read["local_bytes"] > 0 and read["local_bytes"] + read["pfs_bytes"] >= size, read


# The reader of LARGE_READS or STDIO over a file twice the room: no whole copy to wait for, but the
# daemon's word that no more blocks will come (the room is full), then the blocks it staged.
HALF_END = r"""
def wait_done(timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states, done = block_map()
        if done:
            return states.count(2), len(states)
        time.sleep(0.05)
    raise SystemExit(f"the daemon did not finish within {timeout} s: {staged()}")
"""


@pytest.mark.parametrize("kind", ["calls", "weights", "md5sum", "cat"])
def test_a_file_twice_the_room_read_once_in_order_is_read_from_the_pfs_once(short_tmp, slow_pfs, kind):
    """A file twice the room read once in order: 16 MiB read() calls, a weights load (unaligned
    reads of 4 KiB to 17 MiB), md5sum (stdio) and cat (128 KiB reads). The room is given to the
    blocks in the reader's order (its reads fill those it reaches first, the read-ahead reads
    the others ahead of it), and no block the application read from the PFS is read again to
    stage it: the PFS serves the file once (before: the reader's reads of blocks not staged,
    marked wanted, were read again for the copy, and the reader read the PFS for the blocks
    the read-ahead had in flight: 1.06-1.15x), every byte the source's, and the room is
    still filled (pinned for a later epoch)."""
    size = 64 * MiB + 4321
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 100, "32MiB")
    if kind in ("calls", "weights"):
        body, extra = LARGE_READS.replace("wait_whole()\n", "states = wait_done()\n").replace(
            '"seconds": seconds}', '"seconds": seconds, "staged": states}'), [kind]
    else:
        cmd = ["md5sum", "{path}"] if kind == "md5sum" else ["sh", "-c", "cat '{path}' | md5sum"]
        body, extra = STDIO.replace("wait_whole()\n", "states = wait_done()\n").replace(
            '"seconds": seconds,', '"seconds": seconds, "staged": states,'), [json.dumps(cmd)]
    out, rep, _ = run_reader(short_tmp, cfg, HALF_END + body, path, src, tier_base, pfs, extra=extra)
    if kind in ("calls", "weights"):
        assert out["ok"], out
    else:
        assert out["rc"] == 0 and out["out"].split()[0] == out["md5"], out
    assert out["pfs"] <= 1.05 * size, (out["pfs"] / size, out)
    assert pfs.counters()["bytes"] <= 1.05 * size, pfs.counters()["bytes"] / size
    staged_blocks, blocks_of = out["staged"]
    assert blocks_of == 65 and 28 <= staged_blocks <= 32, out  # the room (32 blocks) pinned, no more
    assert rep["blocks"]["partly_staged_files"] == 1, rep["blocks"]


AFTER_DONE_CALLS = r"""
fd = os.open(path, os.O_RDONLY)
states = wait_done()  # nothing read yet: the read-ahead staged what the room holds, in order
before = pfs_bytes()
got = []
while True:
    b = os.read(fd, (12 << 20) + 4321)  # calls across staged blocks and blocks left on the PFS
    if not b:
        break
    got.append(b)
os.close(fd)
data = b"".join(got)
ok = len(data) == size and hashlib.md5(data).digest() == hashlib.md5(want(0, size)).digest()
print(json.dumps({"ok": ok, "pass_pfs": pfs_bytes() - before, "staged": states}))
"""


def test_a_large_read_across_staged_blocks_and_the_pfs_after_done_reads_each_from_its_place(short_tmp, slow_pfs):
    """A file twice the room, read in large calls once the daemon is done: a call across staged
    blocks and blocks left on the PFS reads the staged ones from the copy and only the others
    from the PFS (before, such a call went to the PFS whole: a weights load of a file twice the
    room read 1.20x the file)."""
    size = 64 * MiB + 4321
    pfs, cfg, path, src, tier_base = setup_case(short_tmp, slow_pfs, size, 200, "32MiB")
    out, rep, _ = run_reader(short_tmp, cfg, HALF_END + AFTER_DONE_CALLS, path, src, tier_base, pfs)
    assert out["ok"], out
    staged_blocks, blocks_of = out["staged"]
    assert blocks_of == 65 and 28 <= staged_blocks <= 32, out
    left = size - staged_blocks * MiB
    assert out["pass_pfs"] <= 1.02 * left, (out["pass_pfs"] / left, out)
    assert rep["blocks"]["read"]["local_bytes"] >= staged_blocks * MiB, rep["blocks"]["read"]
