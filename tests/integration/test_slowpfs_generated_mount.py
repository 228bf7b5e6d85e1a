"""The emulated PFS's generated tree mounted: 20,000 files in 20 directories, listed, stat'ed and
read as a job would, every answer held against the formula; a walk that reads directories alone
makes lookups per directory, none per file. The formula and the operations alone:
tests/unit/tools/test_slowpfs_generated.py."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import subprocess

import pytest

from monarch.tools.slowpfs_generated import Generated

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

TREE = Generated(files=20_000, per_dir=1000)
LOOKUPS_A_DIRECTORY = 8  # find: fstatat twice, openat, fstat of each directory, each reaching the PFS


@pytest.fixture
def pfs(slow_pfs):
    return slow_pfs(TREE, open_latency_ms=0)


def test_a_walk_lists_every_file_with_lookups_per_directory_not_per_file(pfs):
    mnt = pfs.mountpoint
    directories = TREE.directories + 1  # and the root
    pfs.reset_counters()
    found = subprocess.run(["find", mnt, "-type", "f"], capture_output=True, text=True, check=True, timeout=60).stdout
    c = pfs.counters()
    assert sorted(found.splitlines()) == [os.path.join(mnt, p) for p in TREE.paths()]
    assert c["readdirs"] == directories and c["opens"] == c["reads"] == 0
    assert c["lookups"] <= LOOKUPS_A_DIRECTORY * directories  # 20,000 files: none of them looked up
    assert c["files"] == {}  # totals alone

    pfs.reset_counters()
    walked = sorted(os.path.relpath(os.path.join(d, f), mnt) for d, _, files in os.walk(mnt) for f in files)
    c = pfs.counters()
    assert walked == list(TREE.paths()) and c["readdirs"] == directories
    assert c["lookups"] <= LOOKUPS_A_DIRECTORY * directories


def test_stat_gives_the_formula_s_sizes_and_one_time(pfs):
    mnt = pfs.mountpoint
    times = set()
    pfs.reset_counters()
    sampled = 0
    for k in range(TREE.directories):  # each file's stat relative to its directory: one lookup
        fd = os.open(os.path.join(mnt, f"d{k:06d}"), os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(k * TREE.per_dir, (k + 1) * TREE.per_dir, 10):  # a tenth of them: 2 calls a stat
                sampled += 1
                st = os.stat(os.path.basename(TREE.path(i)), dir_fd=fd, follow_symlinks=False)
                assert (st.st_size, st.st_mode & 0o777) == (TREE.size(i), 0o444), i
                times.add((st.st_mtime_ns, st.st_ctime_ns))
        finally:
            os.close(fd)
    assert pfs.counters()["lookups"] >= sampled  # nothing cached: each stat reached the PFS
    times.add((os.stat(os.path.join(mnt, "d000007")).st_mtime_ns, os.stat(mnt).st_ctime_ns))
    assert len(times) == 1 and len({t for pair in times for t in pair}) == 1
    for missing in ("d000020", "d000001/f00000000.bin", "d000000/f0.bin", "d000000/f00000000.dat"):
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(mnt, missing))
    with pytest.raises(OSError) as info:
        open(os.path.join(mnt, TREE.path(0)), "r+b")
    assert info.value.errno == errno.EROFS


def test_files_read_whole_or_in_part_give_the_formula_s_bytes_and_are_counted(pfs):
    mnt = pfs.mountpoint
    sample = sorted({0, 999, 1000, 19_999, *random.Random(5).sample(range(TREE.files), 40)})
    pfs.reset_counters()
    for i in sample:
        with open(os.path.join(mnt, TREE.path(i)), "rb") as f:
            assert f.read() == TREE.data(i), i
    c = pfs.counters()
    assert (c["opens"], c["bytes"], c["files"]) == (len(sample), sum(TREE.size(i) for i in sample), {})
    assert c["reads"] >= len(sample)

    paths = [os.path.join(mnt, TREE.path(i)) for i in sample[:10]]
    cat = subprocess.run(["cat", *paths], capture_output=True, check=True, timeout=30).stdout
    assert cat == b"".join(TREE.data(i) for i in sample[:10])
    sums = subprocess.run(["md5sum", *paths], capture_output=True, text=True, check=True, timeout=30).stdout
    assert [line.split()[0] for line in sums.splitlines()] == [hashlib.md5(TREE.data(i)).hexdigest()
                                                              for i in sample[:10]]
    fd = os.open(paths[0], os.O_RDONLY)
    try:
        assert os.pread(fd, 700, 300) == TREE.data(sample[0], 300, 700)
        assert os.pread(fd, 100, TREE.size(sample[0])) == b""
    finally:
        os.close(fd)
    assert pfs.counters()["opens"] == len(sample) + 20 + 1  # cat's and md5sum's, and the last one
