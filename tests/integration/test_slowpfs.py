"""The emulated slow PFS: right bytes, exact counters, read-only by default, writable when asked
(the bytes and names on SRC, the order of operations, the write cap), latency, no mount left."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
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
    attempts.update({
        "rmdir": lambda: os.rmdir(os.path.join(mnt, "a/b")),
        "truncate a path": lambda: os.truncate(os.path.join(mnt, "one.bin"), 0),
        "utime": lambda: os.utime(os.path.join(mnt, "one.bin"), ns=(1, 1)),
        "symlink": lambda: os.symlink("one.bin", os.path.join(mnt, "link")),
        "link": lambda: os.link(os.path.join(mnt, "one.bin"), os.path.join(mnt, "hard")),
    })
    for what, attempt in attempts.items():
        with pytest.raises(OSError) as info:
            attempt()
        assert info.value.errno == errno.EROFS, what
    assert os.path.getsize(src / "one.bin") == 1
    assert not (src / "new.bin").exists() and not (src / "newdir").exists() and (src / "a/b").is_dir()
    assert pfs.counters()["writes"] == pfs.counters()["ops_total"] == 0


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


# --------------------------------------------------------------------------- writable


def _pattern(seed: int, size: int) -> bytes:
    """Bytes that differ at every offset and between writers: a misplaced write shows."""
    return hashlib.sha256(str(seed).encode()).digest() * (size // 32) + bytes(size % 32)


def test_writes_from_several_processes_land_in_src_byte_for_byte(slow_pfs, src):
    pfs = slow_pfs(src, open_latency_ms=1, writable=True)
    shared = os.path.join(pfs.mountpoint, "shared.bin")
    region, writers = 3 * 1024 * 1024 + 5, 4  # odd sizes: offsets off every page
    fd = os.open(shared, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    pids = []
    for rank in range(writers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                fd = os.open(shared, os.O_WRONLY)  # each its own region of one file, in 64 KiB + 3 writes
                data, step = _pattern(rank, region), 65536 + 3
                for off in range(0, region, step):
                    os.pwrite(fd, data[off:off + step], rank * region + off)
                os.close(fd)
                with open(os.path.join(pfs.mountpoint, f"own-{rank}.bin"), "wb") as f:  # and a file of its own
                    f.write(data)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    expected = b"".join(_pattern(rank, region) for rank in range(writers))
    assert _digest(src / "shared.bin") == hashlib.sha256(expected).hexdigest()
    assert _digest(shared) == _digest(src / "shared.bin")  # read back through the mount
    for rank in range(writers):
        assert (src / f"own-{rank}.bin").read_bytes() == _pattern(rank, region)
    c = pfs.counters()
    assert c["bytes_written"] == 2 * writers * region and c["creates"] == 1 + writers
    assert c["files"]["shared.bin"]["bytes_written"] == writers * region
    assert c["files"]["own-0.bin"]["bytes_written"] == region
    assert "bytes_written" not in c["files"].get("one.bin", {})  # files only read keep their three counters


def test_namespace_operations_act_on_src(slow_pfs, src):
    pfs = slow_pfs(src, open_latency_ms=0, writable=True)
    mnt = pfs.mountpoint

    def on(rel):
        return os.path.join(mnt, rel)

    os.mkdir(on("ckpt"), 0o750)
    assert (src / "ckpt").is_dir() and (src / "ckpt").stat().st_mode & 0o777 == 0o750
    os.rename(on("a/mid.bin"), on("ckpt/mid.bin"))
    assert not (src / "a/mid.bin").exists() and (src / "ckpt/mid.bin").stat().st_size == SIZES["a/mid.bin"]
    os.replace(on("one.bin"), on("page.bin"))  # over an existing file
    assert not (src / "one.bin").exists() and (src / "page.bin").stat().st_size == 1
    os.truncate(on("a/b/big.bin"), 1000)
    with open(on("ckpt/mid.bin"), "r+b") as f:
        f.truncate(77)  # ftruncate on an open file
    assert (src / "a/b/big.bin").stat().st_size == 1000 and (src / "ckpt/mid.bin").stat().st_size == 77
    with open(on("page.bin"), "wb"):  # O_TRUNC in the open
        pass
    assert (src / "page.bin").stat().st_size == 0
    os.chmod(on("page.bin"), 0o604)
    os.utime(on("page.bin"), ns=(1_000_000_007, 2_000_000_009))
    st = (src / "page.bin").stat()
    assert (st.st_mode & 0o777, st.st_atime_ns, st.st_mtime_ns) == (0o604, 1_000_000_007, 2_000_000_009)
    os.chown(on("page.bin"), os.getuid(), os.getgid())  # as a direct chown by this user gives
    os.symlink("page.bin", on("sym"))
    os.link(on("page.bin"), on("hard"))
    assert os.readlink(src / "sym") == "page.bin" and (src / "hard").stat().st_ino == st.st_ino
    os.unlink(on("hard"))
    os.unlink(on("ckpt/mid.bin"))
    os.rmdir(on("ckpt"))
    assert not (src / "hard").exists() and not (src / "ckpt").exists()
    with pytest.raises(OSError) as info:
        os.rmdir(on("a"))  # not empty: what SRC says
    assert info.value.errno == errno.ENOTEMPTY and (src / "a/b").is_dir()
    c = pfs.counters()
    assert (c["mkdirs"], c["renames"], c["truncates"], c["unlinks"], c["rmdirs"]) == (1, 2, 3, 2, 1)
    assert c["ops"] == ["mkdir ckpt", "rename a/mid.bin ckpt/mid.bin", "rename one.bin page.bin",
                        "truncate a/b/big.bin", "truncate ckpt/mid.bin", "truncate page.bin",
                        "symlink sym", "link page.bin hard", "unlink hard", "unlink ckpt/mid.bin", "rmdir ckpt"]


def test_a_rename_with_flags_is_refused_not_taken_for_a_plain_one(slow_pfs, src):
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in this C library (glibc < 2.28)")
    pfs = slow_pfs(src, open_latency_ms=0, writable=True)
    at_cwd, noreplace = -100, 1
    rc = libc.renameat2(at_cwd, os.path.join(pfs.mountpoint, "one.bin").encode(),
                        at_cwd, os.path.join(pfs.mountpoint, "fresh.bin").encode(), noreplace)
    assert rc == -1 and ctypes.get_errno() == errno.EINVAL
    assert (src / "one.bin").exists() and not (src / "fresh.bin").exists()


def test_counters_give_bytes_written_and_the_order_names_appeared(slow_pfs, src):
    """A checkpoint as torch.save and a rename make it: each file written as NAME.tmp, synced, renamed."""
    pfs = slow_pfs(src, open_latency_ms=0, writable=True)
    pfs.reset_counters()
    os.mkdir(os.path.join(pfs.mountpoint, "ckpt"))
    chunk = mmap.mmap(-1, 16 << 20)  # page-aligned, as a tensor's storage: each request a whole max_write
    chunk.write(_pattern(7, 16 << 20))
    for name in ("model.pt", "optim.pt"):
        final = os.path.join(pfs.mountpoint, "ckpt", name)
        with open(final + ".tmp", "wb", buffering=0) as f:
            f.write(chunk)
            f.write(b"tail")
            os.fsync(f.fileno())
        os.replace(final + ".tmp", final)
    c = pfs.counters()
    assert c["ops"] == ["mkdir ckpt",
                        "create ckpt/model.pt.tmp", "fsync ckpt/model.pt.tmp", "rename ckpt/model.pt.tmp ckpt/model.pt",
                        "create ckpt/optim.pt.tmp", "fsync ckpt/optim.pt.tmp", "rename ckpt/optim.pt.tmp ckpt/optim.pt"]
    assert c["bytes_written"] == 2 * ((16 << 20) + 4)
    assert c["files"]["ckpt/optim.pt.tmp"]["bytes_written"] == (16 << 20) + 4
    assert (c["creates"], c["fsyncs"], c["renames"], c["mkdirs"]) == (2, 2, 2, 1)
    # a 16 MiB write reaches the PFS in requests of max_write (1 MiB with libfuse 3), not of a page
    assert 2 * 2 <= c["writes"] <= 2 * (16 + 1), c["writes"]
    assert (src / "ckpt/model.pt").read_bytes()[:1 << 20] == bytes(chunk[:1 << 20])


def test_the_write_cap_and_the_latencies_hold(slow_pfs, src):
    """Lower bounds only: a loaded machine is slower, never faster, than the emulated PFS allows."""
    pfs = slow_pfs(src, open_latency_ms=50, writable=True, write_bandwidth_mbps=40, write_latency_ms=20)
    path = os.path.join(pfs.mountpoint, "capped.bin")
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    t_create = time.perf_counter() - t0
    data = _pattern(3, 20 << 20)
    t0 = time.perf_counter()
    for off in range(0, len(data), 4 << 20):
        os.pwrite(fd, data[off:off + (4 << 20)], off)
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(10):  # one request each, one after the other
        os.pwrite(fd, data[:100], i * 100)
    t_small = time.perf_counter() - t0
    os.close(fd)
    t0 = time.perf_counter()
    os.close(os.open(path, os.O_WRONLY))
    t_open = time.perf_counter() - t0
    assert t_create >= 0.050 and t_open >= 0.050
    assert t_write >= 0.45, f"20 MiB at 40 MB/s took {t_write:.2f} s"  # 0.52 s at the cap
    assert t_small >= 10 * 0.020
    assert pfs.counters()["bytes_written"] == len(data) + 1000
    assert (src / "capped.bin").read_bytes() == data[:100] * 10 + data[1000:]


def test_modes_of_new_files_are_what_a_direct_create_gives(slow_pfs, src):
    """The kernel applies the caller's umask before the emulated PFS sees a mode: never twice."""
    pfs = slow_pfs(src, open_latency_ms=0, writable=True)
    old = os.umask(0)
    try:
        os.close(os.open(os.path.join(pfs.mountpoint, "open.bin"), os.O_WRONLY | os.O_CREAT, 0o666))
        os.mkdir(os.path.join(pfs.mountpoint, "open.d"), 0o777)
        os.umask(0o077)
        os.close(os.open(os.path.join(pfs.mountpoint, "private.bin"), os.O_WRONLY | os.O_CREAT, 0o666))
    finally:
        os.umask(old)
    modes = {n: (src / n).stat().st_mode & 0o777 for n in ("open.bin", "open.d", "private.bin")}
    assert modes == {"open.bin": 0o666, "open.d": 0o777, "private.bin": 0o600}


def test_a_file_unlinked_while_open_goes_from_src_at_once_and_stays_usable(slow_pfs, src):
    """As unlink on SRC: no .fuse_hidden* left there until the last close, no rename in the ops.
    (Its fstat answers ESTALE: libfuse's high-level API has no name left to ask about.)"""
    pfs = slow_pfs(src, open_latency_ms=0, writable=True)
    path = os.path.join(pfs.mountpoint, "scratch.bin")
    with open(path, "w+b", buffering=0) as f:
        os.unlink(path)
        assert [n for n in os.listdir(src) if n.startswith(".fuse_hidden") or n == "scratch.bin"] == []
        f.write(b"abc" * 1000)
        assert os.pread(f.fileno(), 6, 2994) == b"abcabc"
    c = pfs.counters()
    assert c["bytes_written"] == 3000 and c["ops"] == ["create scratch.bin", "unlink scratch.bin"]
