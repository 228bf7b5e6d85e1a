"""The PFS source: a large file copied in ranges read at once gives the same bytes and the
same accounting as one stream, refuses a file that is no longer the snapshot's, and
gives back every range reader and descriptor."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

from monarch import routes
from monarch.node.stage import sources
from monarch.node.snapshot.snapshot import take_snapshot
from monarch.node.stage.sources import PFSSource, SourceChanged
from support.harness import CountingTally

KiB = 1024


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch):
    # the same code paths as 32 MiB files in 8 MiB ranges, at a test's size
    monkeypatch.setattr(routes, "RANGES_MIN", 256 * KiB)  # read_in_ranges reads the table's
    monkeypatch.setattr(sources, "RANGE", 64 * KiB)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("size", [256 * KiB - 1, 256 * KiB, 64 * KiB * 9 + 1, 3 * 1024 * KiB + 5])
def test_ranged_copy_is_the_file(tmp_path, size):
    root = tmp_path / "ds"
    root.mkdir()
    data = os.urandom(size)
    (root / "big.bin").write_bytes(data)
    snap = take_snapshot((str(root),))
    source = PFSSource(snap)
    out_path = tmp_path / "copy"
    before = _fds()
    out = os.open(out_path, os.O_WRONLY | os.O_CREAT)
    tally = CountingTally()
    try:
        assert source.copy("0/big.bin", snap.files["0/big.bin"], out, tally) == size
    finally:
        os.close(out)
    source.close()
    assert hashlib.sha256(out_path.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert (tally.files, tally.bytes) == (1, size)
    assert _fds() == before
    assert sources._range_readers._value == 16  # every range reader given back


def _changed_after_snapshot(tmp_path, change, size):
    root = tmp_path / "ds"
    root.mkdir()
    path = root / "big.bin"
    path.write_bytes(os.urandom(size))
    snap = take_snapshot((str(root),))
    info = snap.files["0/big.bin"]
    change(path)
    os.utime(path, ns=(info.mtime_ns, info.mtime_ns))  # same mtime: only the bytes read can tell
    return snap, info


@pytest.mark.parametrize("size", [1024 * KiB, 100 * KiB], ids=["ranges", "stream"])
@pytest.mark.parametrize("change", ["grown", "shrunk"])
def test_a_file_that_changed_size_is_refused(tmp_path, change, size):
    def grow(p):
        with open(p, "ab") as f:
            f.write(b"more")

    snap, info = _changed_after_snapshot(tmp_path, grow if change == "grown" else lambda p: os.truncate(p, size // 3),
                                         size)
    # the descriptor's size no longer matches: refused before a byte is read
    source = PFSSource(snap)
    sink = os.open(os.devnull, os.O_WRONLY)
    with pytest.raises(SourceChanged):
        source.copy("0/big.bin", info, sink, CountingTally())
    # and if the attributes were stale, the bytes read tell: the ranges find the end elsewhere
    real = sources.checked_stat
    sources.checked_stat = lambda fd, fresh: real(fd, fresh)._replace(st_size=info.size)
    try:
        with pytest.raises(SourceChanged):
            source.copy("0/big.bin", info, sink, CountingTally())
    finally:
        sources.checked_stat = real
        os.close(sink)
    source.close()


def test_a_failed_range_write_fails_the_copy_and_frees_the_readers(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(1024 * KiB))
    snap = take_snapshot((str(root),))
    source = PFSSource(snap)
    ro = os.open(root / "big.bin", os.O_RDONLY)  # not writable: every pwrite fails
    try:
        with pytest.raises(OSError):
            source.copy("0/big.bin", snap.files["0/big.bin"], ro, CountingTally())
    finally:
        os.close(ro)
    source.close()
    assert sources._range_readers._value == 16


def test_a_small_file_is_one_stream_into_a_buffer(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    data = os.urandom(100 * KiB)
    (root / "f").write_bytes(data)
    snap = take_snapshot((str(root),))
    source = PFSSource(snap)
    buf = io.BytesIO()
    assert source.copy("0/f", snap.files["0/f"], buf, CountingTally()) == len(data)
    assert buf.getvalue() == data
    source.close()


def test_a_fifo_swapped_in_for_a_file_is_refused_without_blocking(tmp_path):
    import threading
    root = tmp_path / "ds"
    root.mkdir()
    (root / "a.bin").write_bytes(b"x" * 100)
    snap = take_snapshot((str(root),))
    os.unlink(root / "a.bin")
    os.mkfifo(root / "a.bin", 0o600)  # no writer: a blocking open of it never returns
    source = PFSSource(snap)
    tally, outcome = CountingTally(), []

    def copy():
        try:
            source.copy("0/a.bin", snap.files["0/a.bin"], io.BytesIO(), tally)
        except SourceChanged as e:
            outcome.append(e)
    t = threading.Thread(target=copy, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # blocked in open(): let it go before failing
        os.close(os.open(root / "a.bin", os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail("the copy blocked opening a FIFO")
    source.close()
    assert len(outcome) == 1 and "regular file" in str(outcome[0])
    assert (tally.files, tally.bytes) == (0, 0)
