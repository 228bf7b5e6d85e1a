"""The emulated PFS's generated tree (monarch/tools/slowpfs_generated.py) with no mount: the formula
(sizes, bytes, names), the command line that carries it, and the operations called as libfuse
calls them. Mounted: tests/integration/test_slowpfs_generated_mount.py."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from types import SimpleNamespace

import pytest

from monarch.errors import ConfigError
from monarch.tools import slowpfs
from monarch.tools.slowpfs import Counters, Latency, SlowPFS, SlowPFSError, _operations_class
from monarch.tools.slowpfs_generated import (PERIOD, Generated, generated_bytes, generated_pattern, generated_size,
                                             parse_size_range)


def test_sizes_are_fixed_by_the_index_and_seed_and_cover_the_range():
    sizes = [generated_size(i) for i in range(20_000)]
    assert min(sizes) == 1024 and max(sizes) == 4096  # both ends drawn, nothing outside
    assert sizes == [generated_size(i) for i in range(20_000)]
    assert sizes != [generated_size(i, seed=1) for i in range(20_000)]
    assert {generated_size(i, 10, 12) for i in range(100)} == {10, 11, 12}
    assert generated_size(7, 5, 5) == 5
    # pinned: a benchmark's files stay the same from one version to the next
    assert sizes[:4] == [3854, 1670, 3101, 3298]
    assert hashlib.md5(generated_bytes(0)).hexdigest() == "3552c313bf510b92f9d888852c4064b5"


def test_bytes_at_any_offset_are_the_pattern_repeated_and_end_at_the_size():
    i, lo, hi = 12345, 10_000, 20_000  # files of several periods
    size = generated_size(i, lo, hi)
    whole = generated_bytes(i, 0, None, lo, hi)
    pattern = generated_pattern(i)
    assert len(whole) == size and len(pattern) == PERIOD
    assert all(whole[k] == pattern[k % PERIOD] for k in range(0, size, 97))
    for offset, length in ((0, 1), (1, 4098), (4098, 4100), (size - 3, 100), (5 * PERIOD, PERIOD)):
        assert generated_bytes(i, offset, length, lo, hi) == whole[offset:offset + length]
    assert generated_bytes(i, size, 10, lo, hi) == b"" and generated_bytes(i, size + 5, 10, lo, hi) == b""
    chunks = b"".join(generated_bytes(i, k, 4096, lo, hi) for k in range(0, size, 4096))
    assert chunks == whole
    assert generated_bytes(i + 1, 0, 100, lo, hi) != whole[:100]  # another file, other bytes
    assert generated_bytes(i, 0, 100, lo, hi, seed=1) != whole[:100]


def test_names_give_their_index_and_no_other_spelling_does():
    g = Generated(files=2500, per_dir=1000)
    assert g.directories == 3 and g.path(0) == "d000000/f00000000.bin" and g.path(2499) == "d000002/f00002499.bin"
    assert [g.file("/" + g.path(i)) for i in (0, 999, 1000, 2499)] == [0, 999, 1000, 2499]
    assert g.directory("d000002") == 2
    for name in ("d000003", "d00002", "d0000002", "x000000", "d", "d+00001", "d00000a"):
        assert g.directory(name) is None, name
    for path in ("/d000000/f00001000.bin",  # the right name in the wrong directory
                 "/d000002/f00002500.bin", "/d000000/f0.bin", "/d000000/f00000000", "/d000000/f00000000.txt",
                 "/d000000", "/d000000/f00000000.bin/x", "/f00000000.bin"):
        assert g.file(path) is None, path
    assert list(Generated(files=3, per_dir=2).paths()) == ["d000000/f00000000.bin", "d000000/f00000001.bin",
                                                          "d000001/f00000002.bin"]


def test_a_wrong_tree_or_size_range_says_what_is_wrong():
    assert parse_size_range("1KiB-4KiB") == (1024, 4096) and parse_size_range("100") == (100, 100)
    for text, what in (("4KiB-1KiB", "smallest size above its largest"), ("1 G-2", "expected MIN-MAX"),
                       ("-5", "expected MIN-MAX")):
        with pytest.raises(ConfigError, match=what):
            parse_size_range(text)
    for kwargs in (dict(files=-1), dict(files=1, per_dir=0), dict(files=1, min_size=5, max_size=4)):
        with pytest.raises(ConfigError, match="generated tree"):
            Generated(**kwargs)
    with pytest.raises(SlowPFSError, match="read-only"):
        SlowPFS(Generated(files=1), "/nonexistent/mnt", writable=True)


def test_the_command_carries_the_tree_and_the_command_line_gives_it_back(monkeypatch, tmp_path):
    tree = Generated(files=20_000, per_dir=500, min_size=10, max_size=20, seed=3)
    pfs = SlowPFS(tree, tmp_path / "mnt", tmp_path / "c.json", open_latency_ms=1, lookup_latency_ms=0.2)
    argv = pfs.command()
    argv = argv[argv.index("--generate"):]
    assert argv[argv.index("--per-dir") + 1] == "500" and str(tmp_path / "mnt") in argv
    mounted = []
    monkeypatch.setattr(slowpfs, "mount", lambda *a, **k: mounted.append((a, k)))
    assert slowpfs.main(argv) == 0
    (src, mountpoint, counters, latency), options = mounted[0]
    assert (src, mountpoint, counters) == (tree, str(tmp_path / "mnt"), str(tmp_path / "c.json"))
    assert (latency.open_s, latency.lookup_s, options["writable"]) == (0.001, 0.0002, False)
    # a directory still: SRC and MOUNTPOINT, even apart
    assert slowpfs.main(["src", "--counters", "c.json", "mnt"]) == 0 and mounted[1][0][:2] == ("src", "mnt")
    for wrong in (["--generate", "5", "src", "mnt", "--counters", "c"], ["src", "--counters", "c"],
                  ["--seed", "1", "src", "mnt", "--counters", "c"], ["--generate", "5", "mnt", "--counters", "c",
                                                                        "--writable"]):
        with pytest.raises(SystemExit):
            slowpfs.main(wrong)
    assert len(mounted) == 2


def test_counters_without_files_keep_the_totals_alone(tmp_path):
    c = Counters(str(tmp_path / "c.json"), per_file=False)
    c.add("opens", "d000000/f00000000.bin")
    c.add("reads", "d000000/f00000000.bin", nbytes=10)
    snap = c.snapshot()
    assert (snap["opens"], snap["reads"], snap["bytes"], snap["files"]) == (1, 1, 10, {})


@pytest.fixture
def ops(tmp_path):
    pytest.importorskip("mfusepy", exc_type=ImportError)  # needs libfuse3 loadable too
    tree = Generated(files=25, per_dir=10, min_size=5000, max_size=9000)
    counters = Counters(str(tmp_path / "c.json"), per_file=False)
    return _operations_class(generated=True)(tree, Latency(open_s=0.0), counters)


def _errno(call) -> int:
    from mfusepy import FuseOSError
    with pytest.raises(FuseOSError) as info:
        call()
    return info.value.errno


def test_the_operations_answer_from_the_names_and_count_totals(ops):
    tree = ops.tree
    root, d2, f = ops.getattr("/"), ops.getattr("/d000002"), ops.getattr("/d000002/f00000024.bin")
    assert stat.S_ISDIR(root["st_mode"]) and stat.S_ISDIR(d2["st_mode"]) and f["st_mode"] == stat.S_IFREG | 0o444
    assert f["st_size"] == tree.size(24) and f["st_mtime"] == root["st_mtime"] == ops.time_ns
    assert list(ops.readdir("/", 0)) == [(".", stat.S_IFDIR, 0), ("..", stat.S_IFDIR, 0)] + [
        (f"d00000{k}", stat.S_IFDIR, 0) for k in range(3)]
    assert [name for name, mode, _ in ops.readdir("/d000002", 0) if mode == stat.S_IFREG] == [
        f"f000000{i}.bin" for i in range(20, 25)]
    for call in (lambda: ops.getattr("/d000003"), lambda: ops.getattr("/d000000/f00000010.bin"),
                 lambda: ops.readdir("/d000009", 0), lambda: ops.access("/nothing", os.R_OK)):
        assert _errno(call) == errno.ENOENT
    assert _errno(lambda: ops.readdir("/d000000/f00000001.bin", 0)) == errno.ENOTDIR
    assert _errno(lambda: ops.access("/d000000/f00000001.bin", os.W_OK)) == errno.EROFS
    assert _errno(lambda: ops.access("/d000000/f00000001.bin", os.X_OK)) == errno.EACCES
    assert ops.access("/d000000", os.R_OK | os.X_OK) == 0
    assert _errno(lambda: ops.open("/d000000/f00000001.bin", SimpleNamespace(flags=os.O_RDWR))) == errno.EROFS
    fi = SimpleNamespace(flags=os.O_RDONLY, fh=None, direct_io=0, keep_cache=0)
    ops.open("/d000001/f00000013.bin", fi)
    data = b"".join(ops.read("/d000001/f00000013.bin", 4096, k, fi) for k in range(0, 12288, 4096))
    assert data == tree.data(13) and ops.release("/d000001/f00000013.bin", fi) == 0
    snap = ops.counters.snapshot()
    assert (snap["opens"], snap["reads"], snap["bytes"], snap["files"]) == (1, 3, tree.size(13), {})
    assert (snap["lookups"], snap["readdirs"], snap["accesses"]) == (5, 4, 4)
    assert ops.statfs("/")["f_files"] == 25 + 3 + 1
