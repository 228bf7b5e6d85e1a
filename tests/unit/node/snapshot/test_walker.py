"""The C walk (monarch/node/snapshot/walker.c) sees what the Python walk sees, entry for entry, and
writes the index the Python writer would write for it, byte for byte."""

import os
import pickle
import struct
import resource
import subprocess
import sys

import pytest

from monarch import index_layout, protocol, routes
from monarch.node.snapshot import snapshot, walker
from monarch.records.filetable import FileTable
from monarch.node.snapshot.index_writer import index_parts, stamp_routes
from monarch.node.snapshot.indextable import IndexTable, LargerDescribed, larger_than
from monarch.node.snapshot.snapshot import Snapshot, load_or_walk, take_snapshot

pytestmark = pytest.mark.skipif(walker.library() is None, reason="the C walker could not be built (no C compiler)")


def tree(base):
    """Every kind of entry a dataset may hold."""
    root = base / "ds"
    (root / "a" / "b").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "flat").mkdir()
    for i in range(700):  # more than one slice of a directory (walker.c: SLICE)
        (root / "flat" / f"f{i:04d}").write_bytes(os.urandom(i % 7))
    (root / "a" / "x").write_text("x")
    (root / "a" / "b" / "deep").write_text("deep")
    os.symlink("../a/x", root / "a" / "link")           # a link to a file: the file, and its own lstat
    os.symlink("b", root / "a" / "dirlink")              # a link to a directory: a name only
    os.symlink("nowhere", root / "a" / "broken")         # a broken link: a name only
    os.symlink("nowhere", root / "flat" / "broken")      # the same spare name twice: stored once
    os.mkfifo(root / "a" / "fifo")                       # a special file: a name only
    for name in (b"new\nline", b"\xff\xfe", b"L" * 255, "é".encode()):
        with open(os.path.join(os.fsencode(root / "a"), name), "wb") as f:
            f.write(name)
    return root


def without_atimes(snap: Snapshot):
    """A walk reads directories and follows links: atimes move between two walks."""
    fix = lambda i: i._replace(atime_ns=0)  # noqa: E731
    return ({k: fix(i) for k, i in snap.files.items()},
            {k: d._replace(info=fix(d.info)) for k, d in snap.dirs.items()},
            {k: fix(i) for k, i in snap.links.items()})


@pytest.mark.parametrize("poisoned", [False, True])
def test_the_c_walk_sees_what_the_python_walk_sees_and_writes_its_index(tmp_path, monkeypatch, poisoned):
    root = tree(tmp_path)
    if poisoned:  # the buffer the index is built in is not zeroed first: every byte of it is written
        monkeypatch.setattr(walker, "unwritten_bytearray", lambda size: bytearray(b"\xa5" * size))
    roots = (str(root), str(tmp_path / "missing"), str(root / "a"))  # a root that is not there; one inside another
    walked = walker.walk_index(roots)
    assert walked is not None
    index, nfiles = walked
    fast = Snapshot.from_index(roots, index, nfiles)
    slow = take_snapshot(roots)
    assert isinstance(fast.files, IndexTable) and len(fast.files) == len(slow.files) == 700 + 7 + 7  # root a is walked twice
    assert without_atimes(fast) == without_atimes(slow)
    assert fast.links and fast.dirs["0/a"].children is not None and fast.dirs["0/empty"].children == ()
    # the Python writer, given the same snapshot in the C walk's order, writes the same bytes
    same = Snapshot(roots, FileTable(fast.files.items()), dict(fast.dirs), dict(fast.links))
    assert b"".join(index_parts(same)) == bytes(index)
    assert index_parts(fast) == [index]  # written as it is
    # each file's route published (index_fill.c's walk_routes) as the Python writer publishes it
    steps = routes.published(routes.NodeFacts(door=True), len(roots))
    routed = bytearray(index)
    stamp_routes(routed, nfiles, steps)
    assert b"".join(index_parts(same, steps)) == bytes(routed) != bytes(index)
    # the shim's look-ups find every file and directory in it
    for key, info in slow.files.items():
        e = index_layout.index_lookup(bytes(index), protocol.key_bytes(key))
        assert e is not None and (e[0], e[1], e[4]) == (info.size, info.mtime_ns, info.ino)


def test_the_table_read_from_an_index_is_the_snapshots_mapping(tmp_path):
    root = tree(tmp_path)
    snap = Snapshot.from_index((str(root),), *walker.walk_index((str(root),)))
    files = snap.files
    key = "0/a/b/deep"
    assert key in files and files[key].size == 4 and files.get("0/a/nope") is None and "0/a/b" not in files
    assert files.row_of(key) is not None and files.row_of("0/a") is None  # a directory is no file
    assert files.total_size() == sum(i.size for i in files.values())
    assert list(files) == [k for k, _ in files.items()] and len(list(files)) == len(files)
    assert os.fsdecode(os.path.join(b"0/a", b"\xff\xfe")) in files and "0/a/new\nline" in files
    again = pickle.loads(pickle.dumps(snap))
    assert again.files == files and again.dirs == snap.dirs
    files[key] = files[key]._replace(size=99)  # patched in the index itself
    assert files[key].size == 99 and index_layout.index_lookup(bytes(files.data), b"0/a/b/deep")[0] == 99
    with pytest.raises(TypeError):
        files["0/a/new"] = files[key]


def test_a_kept_index_is_read_back_in_place_and_reused(tmp_path):
    root = tree(tmp_path)
    cache = str(tmp_path / "kept.index")
    first, how = load_or_walk((str(root),), cache)
    assert how.startswith("walked") and isinstance(first.files, IndexTable)
    again, how = load_or_walk((str(root),), cache)
    assert how == "reused" and isinstance(again.files, IndexTable)
    assert without_atimes(again) == without_atimes(first)
    (root / "a" / "new").write_text("n")  # a directory changed: walked again, the new file in it
    third, how = load_or_walk((str(root),), cache)
    assert how.startswith("walked") and "0/a/new" in third.files


def test_devices_remapped_in_the_index_itself(tmp_path):
    root = tree(tmp_path)
    snap = Snapshot.from_index((str(root),), *walker.walk_index((str(root),)))
    here = snap.dirs["0/"].info.dev
    foreign = Snapshot.from_index(snap.roots, bytearray(snap.files.data), snap.files.nfiles)
    foreign.files.remap_devices({here: here + 1})  # as another node's device number would come
    foreign = Snapshot.from_index(snap.roots, foreign.files.data, foreign.files.nfiles)
    assert foreign.dirs["0/"].info.dev == here + 1
    local = foreign.with_local_devices()
    assert local.dirs["0/"].info.dev == here and local.files["0/a/x"].dev == here
    assert all(i.dev == here for i in local.links.values())
    assert index_layout.index_lookup(bytes(local.files.data), b"0/a/x")[5] == here


def test_switched_off_the_python_walk_takes_over(tmp_path, monkeypatch):
    root = tree(tmp_path)
    monkeypatch.setenv(walker.ENV_C_WALK, "0")
    snap, how = load_or_walk((str(root),), None)
    assert isinstance(snap.files, FileTable) and len(snap.files) == 707


def walk_peak(root, dirs: int, per_dir: int, name: str, listing: bool = False) -> tuple[int, int, int]:
    """``dirs`` directories of ``per_dir`` empty files named ``name.format(d, i)`` under ``root``,
    walked in a fresh process: (files, the index's bytes, the process's peak grown by the walk).
    ``listing``: listing mode, the index built in zero pages (a fresh file's, as the daemon's)."""
    for d in range(dirs):
        (root / f"n{d:08d}").mkdir(parents=True)
        for i in range(per_dir):
            (root / f"n{d:08d}" / name.format(d, i)).write_bytes(b"")
    how = ", describe=False, buffer=lambda size: mmap.mmap(-1, size)" if listing else ""
    code = ("import mmap,resource,sys; from monarch.node.snapshot import walker; walker.library();"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
            f"index, n = walker.walk_index((sys.argv[1],){how});"
            "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
            "print(n, len(index), (after - before) * 1024)")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True).stdout
    n, size, grown = map(int, out.split())
    return n, size, grown


def test_the_walk_holds_about_one_index_of_memory(tmp_path):
    """A file costs its index entry, not an object: the walk's peak beside the index it
    returns is a few dozen bytes per file (measured in a fresh process, by its high water)."""
    n, size, grown = walk_peak(tmp_path / "many", 20, 2500, "img_{1:06d}.JPEG")
    assert n == 50_000
    assert grown / n < size / n + 100, f"{grown / n:.0f} B per file at the peak, the index {size / n:.0f}"


def test_a_listing_walk_holds_each_files_middle_not_its_whole_name(tmp_path):
    """In listing mode a file costs the walk, until its index is written, its record and the
    middle of its name (what its directory's names do not share), as it costs the index: the
    walk's peak over the index it fills (a fresh file's zero pages, as the daemon's) is measured
    in a fresh process, names of 55 bytes sharing 49."""
    n, _, grown = walk_peak(tmp_path / "many", 10, 4000, "n{0:08d}_a_training_image_of_the_collection_{1:06d}.JPEG",
                            listing=True)
    assert n == 40_000
    assert grown / n < 104, f"{grown / n:.0f} B per file at the peak"  # 90-92; whole names held: 115-125


def _zero_atimes(data: bytearray) -> bytearray:
    """The index with every entry's and stat's atime 0 (a walk reads directories: atimes move between
    two), its header's word that says how it was walked 0, and its files' stats whole (a short
    stat read with its directory's shape) in their files' order (a file described later takes the
    next free slot, or a short stat; a full walk gives file n slot n), the shapes and shorts
    zeros."""
    out = bytearray(data)
    header = protocol.INDEX_HEADER.unpack_from(out)
    files, dirs, foff, soff, size = header[11], header[16], header[13], header[14], protocol.INDEX_ENTRY.size
    index = index_layout.Index(bytes(data))
    struct.pack_into("<I", out, 20, 0)
    stats = []
    for n in range(files):
        slot = protocol.INDEX_FILE.unpack_from(out, foff + protocol.INDEX_FILE.size * n)[1]
        if slot:
            stats.append(bytearray(protocol.INDEX_ENTRY.pack(*index.entry(n + 1))))
            struct.pack_into("<I", out, foff + protocol.INDEX_FILE.size * n + 4, len(stats))
    shapes = soff - 8 * protocol.INDEX_SHORT_ROOM * files - size * dirs
    out[shapes:] = bytes(soff - shapes) + b"".join(stats)
    struct.pack_into("<I", out, 76, len(stats))
    struct.pack_into("<I", out, 108, 0)  # the shorts' words taken
    for at in [header[6] + size * n for n in range(header[2] - files)] + [soff + size * s for s in range(len(stats))]:
        struct.pack_into("<q", out, at + 32, 0)
    return out


@pytest.mark.parametrize("how", ["in one pass", "one by one when asked"])
def test_a_listing_walk_names_every_file_and_describing_them_gives_the_full_walks_index(tmp_path, how):
    """Listing mode stats no name the listing types as a file or a directory: every such file is
    UNDESCRIBED (its key, S_IFREG, no route), the directories and listings are the full walk's.
    Described afterwards (index_fill.c's pass, or Describer file by file), the index is the full walk's,
    byte for byte, routes and all."""
    root = tree(tmp_path)
    roots = (str(root), str(tmp_path / "missing"))
    steps = routes.published(routes.NodeFacts(door=True), len(roots))
    full, nfiles = walker.walk_index(roots)
    stamp_routes(full, nfiles, steps)
    listed, n = walker.walk_index(roots, describe=False)
    assert n == nfiles
    stamp_routes(listed, n, steps)
    snap = Snapshot.from_index(roots, listed, n)
    assert not snapshot.listing_index(snap)  # its link to a file was stat'ed: not every file is undescribed
    table = snap.files
    kinds = {}
    for i in range(n):
        e = table.entry(i)
        kinds[table.key(i)] = bool(e[13] & protocol.INDEX_FLAG_UNDESCRIBED)
        if kinds[table.key(i)]:
            assert e[3] == 0 and e[9] == 0o100000 and not e[13] & protocol.INDEX_ROUTE_MASK, e
    assert not kinds["0/a/link"]  # a symlink to a file: its d_type says link, so it is stat'ed
    assert sum(kinds.values()) == n - 1 == table.undescribed()
    full_snap = Snapshot.from_index(roots, bytearray(full), nfiles)
    assert {k: d.children for k, d in snap.dirs.items()} == {k: d.children for k, d in full_snap.dirs.items()}
    assert index_layout.index_lookup(bytes(listed), b"0/a/x") is not None  # named: the shim finds it (and passes)
    if how == "in one pass":
        snap.describe_with(steps)
        assert snapshot.describe_rest(snap, steps) == n - 1
    else:
        snap.describe_with(steps)
        for key in full_snap.files:
            assert table.get(key) == full_snap.files.get(key)._replace(atime_ns=table.get(key).atime_ns)
    assert table.undescribed() == 0
    assert _zero_atimes(listed) == _zero_atimes(full)


def test_a_listed_file_gone_before_it_is_described_is_no_file_of_the_snapshot(tmp_path):
    root = tree(tmp_path)
    listed, n = walker.walk_index((str(root),), describe=False)
    snap = Snapshot.from_index((str(root),), listed, n)
    os.unlink(root / "a" / "x")
    os.mkdir(root / "a" / "x")  # the name now a directory
    os.unlink(root / "a" / "b" / "deep")
    assert "0/a/b/deep" in snap.files  # named by the listing
    assert snap.files.get("0/a/b/deep") is None and snap.files.get("0/a/x") is None
    with pytest.raises(KeyError):
        snap.files["0/a/x"]
    assert snapshot.describe_rest(snap, None) == n - 3  # the link was described by the walk
    assert snap.files.undescribed() == 2
    plain = tmp_path / "plain"
    (plain / "d").mkdir(parents=True)
    (plain / "d" / "f").write_bytes(b"f")
    assert snapshot.listing_index(Snapshot.from_index((str(plain),), *walker.walk_index((str(plain),), describe=False)))
    assert not snapshot.listing_index(Snapshot.from_index((str(plain),), *walker.walk_index((str(plain),))))


def test_the_files_described_larger_than_a_size_are_found_once_each_as_they_are_described(tmp_path):
    """What the stager takes from the front door's lane: each file the lane described past its row's
    size, once, in the order described; none of a listing walk's files before one is described. A
    smaller file's stat may be a short stat, which is never past the row."""
    root = tmp_path / "t"
    root.mkdir()
    row = routes.ROWS[routes.Route.DOOR].max_size
    for i, size in enumerate((10, row + 5000, 20, row + 7000, row + 9000)):
        (root / f"f{i}").write_bytes(b"x" * size)
    listed, n = walker.walk_index((str(root),), describe=False)
    snap = Snapshot.from_index((str(root),), listed, n)
    snap.describe_with(routes.published(routes.NodeFacts(door=True), 1))
    table = snap.files
    found = LargerDescribed(table, row)
    assert found.new() == [] and larger_than(table, row) == []
    with pytest.raises(ValueError, match="short stats"):
        LargerDescribed(table, 1000)
    for key in ("0/f3", "0/f0", "0/f1"):
        assert table.get(key) is not None  # described, as the lane describes one
    assert found.new() == ["0/f3", "0/f1"]
    assert found.new() == []
    table.get("0/f4")
    table.get("0/f3")  # (described already: no second slot)
    assert found.new() == ["0/f4"]
    assert sorted(larger_than(table, row)) == ["0/f1", "0/f3", "0/f4"]
    assert sorted(larger_than(table, 15)) == ["0/f1", "0/f3", "0/f4"]  # f0 (10 bytes) in a slot: its directory's shape


def test_a_directorys_files_common_prefix_and_suffix_are_stored_once_and_every_name_is_found_whole(tmp_path):
    """The walk's index (and Python's, byte for byte) keeps what a directory's file names share at
    their start and end once for the directory (each name's own middle at least a byte); every file
    is found by its whole key, none by a key that has the affixes but not the middle, and its key,
    its listing and the lookups read back whole."""
    root = tmp_path / "t"
    (root / "imgs").mkdir(parents=True)
    names = ["img_0001.jpg", "img_0002.jpg", "img_0010.jpg", "img_.jpg", "img_1.jpg", "img_99999.jpg"]
    for name in names:
        (root / "imgs" / name).write_bytes(name.encode())
    (root / "one").mkdir()
    (root / "one" / "alone.bin").write_bytes(b"x")
    for describe in (True, False):
        data, n = walker.walk_index((str(root),), describe=describe)
        header = protocol.INDEX_HEADER.unpack_from(data)
        # "img_" and "jpg" (".jpg" would leave "img_.jpg" no middle); a file alone keeps its name
        assert header[18] == sum(len(name) - len("img_") - len("jpg") for name in names) + len("alone.bin")
        index = index_layout.Index(bytes(data))
        table = Snapshot.from_index((str(root),), bytearray(data), n).files
        for name in names:
            key = f"0/imgs/{name}".encode()
            m = index.number(key)
            assert m and index.key(m) == key and index.name(m) == name.encode() and table.row_of(key.decode()) == m - 1
        for absent in ("img_.jpgx", "img_0001.jp", "img_jpg", "img_00001.jpg", "mg_0001.jpg", "img_0001.jpg/"):
            assert index.number(f"0/imgs/{absent}".encode()) == 0 and table.row_of(f"0/imgs/{absent}") is None
        listing = [c[0] for c in index.children(index.number(b"0/imgs"))][2:]
        assert listing == sorted(name.encode() for name in names)
        assert sorted(table) == sorted([f"0/imgs/{name}" for name in names] + ["0/one/alone.bin"])
