"""The snapshot's compact index builder gives the very bytes of index_layout.build_index, and the
snapshot keeps its files compact (FileTable); each file's route it publishes is route_of's, in
Python and in C alike."""

import dataclasses
import os
import pickle

import pytest

from monarch import index_layout, protocol, routes
from monarch.records.filetable import FileTable, Listing
from monarch.node.snapshot import walker
from monarch.node.snapshot.index_writer import index_bytes, stamp_routes
from monarch.node.snapshot.indextable import IndexTable
from monarch.routes import Route
from monarch.node.snapshot.snapshot import FileInfo, Snapshot, take_snapshot


def reference(snap: Snapshot) -> bytes:
    kb = protocol.key_bytes
    return index_layout.build_index(((kb(key), info) for key, info in snap.files.items()),
                                ((kb(key), d.info, d.children, d.parent_ino) for key, d in snap.dirs.items()),
                                {kb(key): info for key, info in snap.links.items()})


def test_the_compact_builder_writes_the_reference_bytes(tmp_path):
    root = tmp_path / "ds"
    (root / "a" / "b").mkdir(parents=True)
    for i in range(40):
        (root / "a" / f"f{i}.bin").write_bytes(os.urandom(i))
    (root / "a" / "b" / "deep.txt").write_text("x")
    (root / "top.txt").write_text("top")
    os.symlink(root / "top.txt", root / "a" / "link.txt")          # a link to a file: an entry, and its lstat
    os.symlink(root / "a" / "b", root / "a" / "dirlink")            # a link to a directory: a name only
    os.symlink(root / "missing", root / "broken")                    # a broken link: a name only
    os.mkfifo(root / "a" / "fifo")                                   # a special file: a name only
    (root / "unlisted").mkdir()
    (root / "unlisted" / "x").write_text("x")
    os.chmod(root / "unlisted", 0o000)                               # (as root it is still listed)
    try:
        snap = take_snapshot((str(root), str(tmp_path / "ds" / "a")))  # two roots, one inside the other
    finally:
        os.chmod(root / "unlisted", 0o755)
    assert isinstance(snap.files, FileTable) and snap.links
    assert index_bytes(snap) == reference(snap)
    assert snap.index_bytes() == reference(snap)


def test_a_snapshot_with_a_plain_dict_of_files_gives_the_same_bytes(tmp_path):
    (tmp_path / "f").write_text("hello")
    snap = take_snapshot((str(tmp_path),))
    plain = Snapshot(snap.roots, dict(snap.files.items()), snap.dirs, snap.links)
    assert index_bytes(plain) == reference(snap)


def test_the_file_table_is_a_mapping_of_file_infos_that_survives_pickling():
    table = FileTable()
    big = FileInfo(5, -3, 0o100644, 1, 2, (1 << 64) - 5, 77, 0, 0, 1, True, 8, 4096)  # an inode number past 2^63
    table["0/a"] = big
    table["0/b"] = FileInfo(9, 10)
    assert table["0/a"] == big and table.get("0/zz") is None and "0/b" in table and len(table) == 2
    table["0/a"] = big._replace(size=6)
    assert table["0/a"].size == 6 and list(table) == ["0/a", "0/b"] and table.total_size() == 15
    again = pickle.loads(pickle.dumps(table))
    assert again == table and list(again.items()) == list(table.items())


def test_a_listing_reads_as_the_tuple_of_its_entries():
    entries = ((b"a", protocol.DT_REG, 7), (b"b\xff", protocol.DT_DIR, (1 << 64) - 1), (b"c", protocol.DT_LNK, 0))
    listing = Listing(entries)
    assert len(listing) == 3 and tuple(listing) == entries and listing == entries and listing[1] == entries[1]
    assert pickle.loads(pickle.dumps(listing)) == entries and Listing(()) == () and list(Listing(())) == []


def test_the_snapshot_holds_a_file_in_a_few_hundred_bytes(tmp_path):
    """The snapshot and the index built from it are what grows with the files in the daemon:
    a few hundred bytes per file each (counted by tracemalloc, not timed)."""
    import gc
    import tracemalloc
    root = tmp_path / "ds"
    for d in range(20):
        (root / f"class{d:03d}").mkdir(parents=True)
        for i in range(500):
            (root / f"class{d:03d}" / f"img_{i:06d}.JPEG").write_bytes(b"")
    tracemalloc.start()
    try:
        snap = take_snapshot((str(root),))
        gc.collect()
        live = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        parts = snap.index_parts()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    n = len(snap.files)
    assert n == 10_000
    assert live / n < 350, f"{live / n:.0f} B per file live"  # a dict of FileInfo tuples: ~690
    index = sum(len(p) for p in parts)
    assert (peak - index) / n < 450, f"{(peak - index) / n:.0f} B per file beside the index while building it"


# -- each file's route, published in its entry's flags (monarch/routes.py) ---------------------
def routed_tree(tmp_path):
    """A small file, one the door's row just takes, one just past it, a large one (sparse: its
    size is what routes it), each under a PFS root (0) and a store's (1)."""
    sizes = {"small": 100 << 10, "edge": routes.INLINE_MAX, "past": routes.INLINE_MAX + 1, "large": 64 << 20}
    roots = []
    for k in range(2):
        root = tmp_path / f"r{k}"
        root.mkdir()
        for name, size in sizes.items():
            with open(root / name, "wb") as f:
                f.truncate(size)
        os.symlink(root / "small", root / "link")  # a link to a file: its own record publishes none
        roots.append(str(root))
    return tuple(roots), sizes


@pytest.mark.parametrize("node", [routes.NodeFacts(door=True), routes.NodeFacts(), routes.NodeFacts(cluster=True, door=True),
                                  routes.NodeFacts(copies_misses=False), routes.NodeFacts(door=True, raw_tier=False)])
def test_each_files_published_route_is_route_ofs(tmp_path, monkeypatch, node):
    roots, sizes = routed_tree(tmp_path)
    steps = routes.published(node, 2, stores={1})
    want = {f"{k}/{name}": routes.route_of(routes.FileFacts(size=size, store=k == 1), node)
            for k in range(2) for name, size in sizes.items()} | {
        f"{k}/link": routes.route_of(routes.FileFacts(size=sizes["small"], store=k == 1), node) for k in range(2)}
    snap = take_snapshot(roots)
    written = index_bytes(snap, steps)  # the Python writer
    table = IndexTable(bytearray(written), len(snap.files))
    assert {table.key(n): table.route(n) for n in range(table.nfiles)} == want
    assert {Route.DOOR, Route.BLOCKS, Route.STORE} & set(want.values()) or not node.copies_misses
    index = index_layout.Index(written)  # directories and the links' own records publish none
    assert all(not index.entry(n)[13] & protocol.INDEX_ROUTE_MASK for n in range(len(snap.files) + 1, index.entries + 1))
    # an index written before (the C walk's, a kept one, another node's) stamped in place: the same bytes,
    # in C and without it; a route stamped again over another is replaced
    unrouted = bytearray(index_bytes(snap, routes.published(routes.NodeFacts(copies_misses=False), 2)))
    stamp_routes(unrouted, len(snap.files), steps)
    assert bytes(unrouted) == written
    monkeypatch.setattr(walker, "library", lambda: None)
    unrouted = bytearray(index_bytes(snap))
    stamp_routes(unrouted, len(snap.files), steps)
    assert bytes(unrouted) == written


def test_the_large_files_route_is_blocks_and_the_small_ones_the_doors_alone(tmp_path):
    roots, sizes = routed_tree(tmp_path)
    node = routes.NodeFacts(door=True)
    snap = take_snapshot(roots)
    table = IndexTable(bytearray(index_bytes(snap, routes.published(node, 2, stores={1}))), len(snap.files))
    got = {table.key(n): table.route(n) for n in range(table.nfiles)}
    assert (got["0/small"], got["0/edge"], got["0/past"], got["0/large"]) == (Route.DOOR, Route.DOOR, Route.COPY,
                                                                              Route.BLOCKS)
    assert {got[f"1/{name}"] for name in sizes} == {Route.STORE}
    assert IndexTable(bytearray(index_bytes(snap)), len(snap.files)).route(0) is None  # none asked: none published


def test_an_index_received_as_bytes_is_published_with_its_routes(tmp_path):
    """A cluster node's snapshot is the index node 0 sent (bytes, read-only): its routes are
    published in a copy, the same bytes as an index written here (a read-only buffer once made
    the node's snapshot fail, and its readers read the PFS)."""
    roots, _ = routed_tree(tmp_path)
    node = routes.NodeFacts(door=True, cluster=True)
    steps = routes.published(node, 2, stores={1})
    snap = take_snapshot(roots)
    written = index_bytes(snap, steps)
    received = dataclasses.replace(snap, files=IndexTable(bytes(index_bytes(snap)), len(snap.files)))  # bytes
    assert b"".join(bytes(part) for part in received.index_parts(steps)) == written
