"""The emulated PFS's writes (monarch/tools/slowpfs_writes.py) called as libfuse calls them, with no
mount: what each does on SRC, what it counts, what it refuses; and the counters' ``ops``, kept to the
last ``OPS_KEPT`` and given since a reset. The mounted paths: tests/integration/test_slowpfs.py."""

from __future__ import annotations

import errno
import json
import os
import time
from types import SimpleNamespace

import pytest

from monarch.tools.slowpfs import OPS_KEPT, Counters, Latency, SlowPFS, _operations_class


def test_ops_are_kept_to_the_last_ones_and_counted_all(tmp_path):
    c = Counters(str(tmp_path / "c.json"))
    for i in range(OPS_KEPT + 5):
        c.add("mkdirs", op=f"mkdir d{i}")
    snap = c.snapshot()
    assert snap["mkdirs"] == snap["ops_total"] == OPS_KEPT + 5
    assert len(snap["ops"]) == OPS_KEPT and snap["ops"][0] == "mkdir d5" and snap["ops"][-1] == f"mkdir d{OPS_KEPT + 4}"


def test_counters_since_a_reset_give_the_new_ops_alone(tmp_path):
    path = tmp_path / "c.json"
    c = Counters(str(path))
    c.add("creates", op="create a.tmp")
    c.add("writes", "a.tmp", nbytes=10)
    c.add("opens", "b")
    c.flush()
    pfs = SlowPFS(tmp_path, tmp_path / "mnt", path)  # never started: its counters file is read as it is
    pfs.reset_counters(settle=0)
    c.add("renames", op="rename a.tmp a")
    c.add("writes", "a.tmp", nbytes=5)
    c.flush()
    got = pfs.counters(settle=0)
    assert got["ops"] == ["rename a.tmp a"] and got["ops_total"] == 1
    assert (got["bytes_written"], got["writes"], got["renames"], got["creates"]) == (5, 1, 1, 0)
    assert got["files"] == {"a.tmp": {"opens": 0, "reads": 0, "bytes": 0, "bytes_written": 5}}
    # a file only read keeps the three figures it always had
    assert json.loads(path.read_text())["files"]["b"] == {"opens": 1, "reads": 0, "bytes": 0}


@pytest.fixture
def ops(tmp_path):
    pytest.importorskip("mfusepy", exc_type=ImportError)  # needs libfuse3 loadable too
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"0123456789")
    counters = Counters(str(tmp_path / "c.json"))
    return _operations_class(writable=True)(str(src), Latency(open_s=0.0), counters)


def fi(flags: int) -> SimpleNamespace:
    """libfuse's fuse_file_info as the callbacks use it."""
    return SimpleNamespace(flags=flags, fh=None, direct_io=0, keep_cache=0)


def test_a_read_only_mount_has_no_write_callback_and_a_writable_one_has_them():
    mfusepy = pytest.importorskip("mfusepy", exc_type=ImportError)
    read_only, writable = _operations_class(False), _operations_class(True)
    for name in ("write", "create", "rename", "unlink", "mkdir", "truncate", "fsync", "chmod"):
        assert getattr(getattr(read_only, name), "libfuse_ignore", False), name  # mfusepy leaves it to libfuse: EROFS
        assert not getattr(getattr(writable, name), "libfuse_ignore", False), name
    assert issubclass(writable, mfusepy.Operations) and writable.__mro__[1].__name__ == read_only.__name__


def test_an_open_that_truncates_counts_a_truncate_and_a_create_refuses_what_exists(ops):
    f = fi(os.O_WRONLY | os.O_TRUNC)
    ops.open("/a", f)
    assert ops.write("/a", b"xy", 3, f) == 2
    ops.release("/a", f)
    assert open(ops._real("/a"), "rb").read() == b"\0\0\0xy"
    with pytest.raises(FileExistsError):
        ops.create("/a", 0o644, fi(os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    snap = ops.counters.snapshot()
    assert (snap["truncates"], snap["opens"], snap["creates"], snap["ops"]) == (1, 1, 0, ["truncate a"])
    assert snap["files"]["a"]["bytes_written"] == 2


def test_a_write_to_a_file_unlinked_while_open_is_counted_without_a_name(ops):
    f = fi(os.O_RDWR)
    ops.open("/a", f)
    ops.unlink("/a")
    assert ops.write(None, b"abc", 0, f) == 3  # libfuse gives no path once the name is gone
    assert ops.getattr(None, f)["st_size"] == 10 and ops.read(None, 3, 0, f) == b"abc"  # by the descriptor
    ops.release(None, f)
    snap = ops.counters.snapshot()
    assert snap["bytes_written"] == 3 and snap["bytes"] == 3 and set(snap["files"]) == {"a"}
    assert snap["files"]["a"] == {"opens": 1, "reads": 0, "bytes": 0}


def test_rename_flags_and_hole_punching_are_refused(ops):
    from mfusepy import FuseOSError
    for flags in (1, 2):  # RENAME_NOREPLACE, RENAME_EXCHANGE
        with pytest.raises(FuseOSError) as info:
            ops.rename("/a", "/b", flags)
        assert info.value.errno == errno.EINVAL
    assert os.path.exists(ops._real("/a")) and not os.path.exists(ops._real("/b"))
    f = fi(os.O_RDWR)
    ops.open("/a", f)
    with pytest.raises(FuseOSError) as info:
        ops.fallocate("/a", 3, 0, 4, f)  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
    assert info.value.errno == errno.EOPNOTSUPP
    ops.fallocate("/a", 0, 0, 100, f)
    ops.release("/a", f)
    assert os.path.getsize(ops._real("/a")) == 100 and ops.counters.snapshot()["renames"] == 0


def test_utimens_keeps_an_omitted_time_and_sets_now_where_asked(ops):
    from monarch.tools.slowpfs_writes import UTIME_NOW, UTIME_OMIT
    os.utime(ops._real("/a"), ns=(5_000_000_001, 6_000_000_002))
    before = time.time_ns()
    ops.utimens("/a", (UTIME_OMIT, UTIME_NOW))
    st = os.stat(ops._real("/a"))
    assert st.st_atime_ns == 5_000_000_001 and st.st_mtime_ns >= before - 10_000_000
    ops.utimens("/a", (7, UTIME_OMIT))
    st = os.stat(ops._real("/a"))
    assert st.st_atime_ns == 7 and st.st_mtime_ns >= before - 10_000_000
