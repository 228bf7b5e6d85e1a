"""The emulated slow PFS: right bytes, exact counters, read-only, latency, no mount left."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import threading
import time

import pytest

from monarch.tools.slowpfs import SlowPFS, SlowPFSError, fuse_unavailable_reason, is_mounted

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

SIZES = {"empty.bin": 0, "one.bin": 1, "page.bin": 4096, "a/mid.bin": 300_001, "a/b/big.bin": 3 * 1024 * 1024 + 7}


def _digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for rel, size in SIZES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(size))
    return root


def test_bytes_and_tree_equal_the_source(slow_pfs, src):
    pfs = slow_pfs(src, open_latency_ms=0)
    mnt = pfs.mountpoint
    listed = sorted(os.path.relpath(os.path.join(d, f), mnt) for d, _, fs in os.walk(mnt) for f in fs)
    assert listed == sorted(SIZES)
    for rel, size in SIZES.items():
        st_src, st_mnt = os.stat(src / rel), os.stat(os.path.join(mnt, rel))
        assert st_mnt.st_size == size
        assert st_mnt.st_mtime_ns == st_src.st_mtime_ns
        assert _digest(os.path.join(mnt, rel)) == _digest(src / rel)


def test_counters_are_exact_and_nothing_is_cached(slow_pfs, src):
    pfs = slow_pfs(src, open_latency_ms=0)
    page = os.path.join(pfs.mountpoint, "page.bin")
    fd = os.open(page, os.O_RDONLY)
    try:
        # The same 4 KiB three times: a page cache would answer the last two.
        for _ in range(3):
            assert len(os.pread(fd, 4096, 0)) == 4096
    finally:
        os.close(fd)
    c = pfs.counters()
    assert (c["opens"], c["reads"], c["bytes"]) == (1, 3, 3 * 4096)
    assert c["files"] == {"page.bin": {"opens": 1, "reads": 3, "bytes": 3 * 4096}}

    pfs.reset_counters()
    mid = os.path.join(pfs.mountpoint, "a/mid.bin")
    for _ in range(3):
        with open(mid, "rb") as f:
            assert len(f.read()) == SIZES["a/mid.bin"]
    c = pfs.counters()
    assert c["opens"] == 3
    assert c["bytes"] == 3 * SIZES["a/mid.bin"]
    assert set(c["files"]) == {"a/mid.bin"}


def test_counters_count_forked_readers(slow_pfs, src):
    pfs = slow_pfs(src, open_latency_ms=1)
    big = os.path.join(pfs.mountpoint, "a/b/big.bin")
    pids = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                with open(big, "rb") as f:
                    f.read()
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    c = pfs.counters()
    assert c["opens"] == 3 and c["bytes"] == 3 * SIZES["a/b/big.bin"]


def test_writes_fail(slow_pfs, src):
    pfs = slow_pfs(src, open_latency_ms=0)
    mnt = pfs.mountpoint
    attempts = {
        "open for writing": lambda: open(os.path.join(mnt, "one.bin"), "r+b"),
        "truncate": lambda: open(os.path.join(mnt, "one.bin"), "wb"),
        "append": lambda: open(os.path.join(mnt, "one.bin"), "ab"),
        "create": lambda: open(os.path.join(mnt, "new.bin"), "xb"),
        "mkdir": lambda: os.mkdir(os.path.join(mnt, "newdir")),
        "unlink": lambda: os.unlink(os.path.join(mnt, "one.bin")),
        "rename": lambda: os.rename(os.path.join(mnt, "one.bin"), os.path.join(mnt, "two.bin")),
        "chmod": lambda: os.chmod(os.path.join(mnt, "one.bin"), 0o777),
    }
    for what, attempt in attempts.items():
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM), what
    assert os.path.getsize(src / "one.bin") == 1
    assert not (src / "new.bin").exists() and not (src / "newdir").exists()


def test_open_and_read_latency_and_bandwidth_are_applied(slow_pfs, src):
    pfs = slow_pfs(src, open_latency_ms=50, read_latency_ms=30, bandwidth_mbps=10)
    t0 = time.perf_counter()
    fd = os.open(os.path.join(pfs.mountpoint, "a/b/big.bin"), os.O_RDONLY)
    t_open = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        os.pread(fd, 4096, 0)
        t_small = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = len(os.pread(fd, 2_000_000, 0))  # may arrive in several FUSE reads
        t_big = time.perf_counter() - t0
    finally:
        os.close(fd)
    assert t_open >= 0.050
    assert t_small >= 0.030
    assert n == 2_000_000 and t_big >= n / 10e6  # 10 MB/s


def test_opens_are_served_concurrently(slow_pfs, src):
    pfs = slow_pfs(src, open_latency_ms=200)
    path = os.path.join(pfs.mountpoint, "one.bin")

    def one_open():
        os.close(os.open(path, os.O_RDONLY))

    threads = [threading.Thread(target=one_open) for _ in range(6)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    assert pfs.counters()["opens"] == 6
    assert elapsed < 6 * 0.200 * 0.75, f"6 opens of 200 ms took {elapsed:.2f} s: served one at a time?"


@pytest.fixture
def fuse_ok():
    reason = fuse_unavailable_reason(probe=True)
    if reason:
        pytest.skip(f"emulated PFS needs FUSE: {reason}")


def test_mount_is_gone_after_the_block(fuse_ok, src, tmp_path):
    mnt = tmp_path / "mnt"
    with SlowPFS(src, mnt, tmp_path / "c.json", open_latency_ms=0) as pfs:
        assert is_mounted(str(mnt)) and os.path.ismount(mnt)
        proc = pfs.proc
    assert not is_mounted(str(mnt))
    assert proc.poll() is not None
    assert os.listdir(mnt) == []


def test_mount_is_gone_after_an_exception(fuse_ok, src, tmp_path):
    mnt = tmp_path / "mnt"
    with pytest.raises(ZeroDivisionError):
        with SlowPFS(src, mnt, tmp_path / "c.json", open_latency_ms=0) as pfs:
            proc = pfs.proc
            assert os.path.ismount(mnt)
            1 / 0
    assert not is_mounted(str(mnt))
    assert proc.poll() is not None


def test_mount_is_gone_after_the_server_died(fuse_ok, src, tmp_path):
    mnt = tmp_path / "mnt"
    with SlowPFS(src, mnt, tmp_path / "c.json", open_latency_ms=0) as pfs:
        os.kill(pfs.proc.pid, signal.SIGKILL)
        pfs.proc.wait(timeout=10)
        assert is_mounted(str(mnt))  # dead FUSE mount: os.path.ismount cannot see it
    assert not is_mounted(str(mnt))


def test_counters_written_on_exit(fuse_ok, src, tmp_path):
    with SlowPFS(src, tmp_path / "mnt", tmp_path / "c.json", open_latency_ms=0) as pfs:
        with open(os.path.join(pfs.mountpoint, "page.bin"), "rb") as f:
            f.read()
    c = pfs.raw_counters(settle=0)
    assert c["opens"] == 1 and c["bytes"] == 4096


def test_failed_mount_says_why(fuse_ok, tmp_path):
    with pytest.raises(SlowPFSError, match="not a directory"):
        SlowPFS(tmp_path / "missing", tmp_path / "mnt", tmp_path / "c.json").start()
    assert not is_mounted(str(tmp_path / "mnt"))


def test_many_opens_are_served_at_once(src, tmp_path):
    """libfuse serves on at most max_threads threads (10 by default): a PFS and a deep
    read-ahead need far more requests in flight than that."""
    with SlowPFS(src, tmp_path / "mnt", tmp_path / "c.json", open_latency_ms=300) as pfs:
        barrier = threading.Barrier(40)

        def one(i):
            barrier.wait()
            with open(os.path.join(pfs.mountpoint, "page.bin"), "rb") as f:
                f.read()

        threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        c = pfs.raw_counters()
    assert c["opens"] == 40
    assert c["opening_peak"] >= 20  # libfuse's default would cap it at 10
