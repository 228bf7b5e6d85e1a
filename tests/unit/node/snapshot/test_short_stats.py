"""A described file's stat as a short stat beside its directory's shape (protocol.py, "Snapshot
index": shapes, shorts): written by the C describer every describer shares (``index_put_stat``),
read back whole by Python's readers; a stat that differs from the shape in more than its size,
inode, blocks and times, or too large, takes a 112-byte slot as before."""

from __future__ import annotations

import ctypes
import os
import pickle
import stat

import pytest

from monarch import index_layout, protocol, routes
from monarch.node.snapshot import walker
from monarch.node.snapshot.index_writer import route_tables, stamp_routes
from monarch.node.snapshot.indextable import IndexTable, used_ranges
from monarch.node.snapshot.snapshot import write_index_file

pytestmark = pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")

T = 1_700_000_000_123_456_789  # ns
REG = stat.S_IFREG | 0o644


def fields(size, ino, mtime=T, atime=T, ctime=T, blocks=None, mode=REG, uid=1000, dev=2049, blksize=4096):
    """size, mtime, atime, ctime, ino, dev, mode, uid, gid, nlink, blocks, blksize (index_put_stat's)."""
    return (size, mtime, atime, ctime, ino, dev, mode, uid, 100, 1, -(-size // 512) if blocks is None else blocks,
            blksize)


# (name, its stat, what it takes: words of the shorts, or "slot")
FILES = [
    ("a-shape", fields(100, 5000), "slot"),                                 # the directory's first: its shape
    ("b-same-times", fields(3000, 5003), 1),
    ("c-mtime", fields(7, 4990, mtime=T + 9, atime=T + 9, ctime=T + 9), 2),
    ("d-mtime-atime", fields(4096, 6000, mtime=T - 5, atime=T + 77, ctime=T - 5, blocks=8), 3),
    ("e-all-times", fields(1, 2**35 + 4999, mtime=T + 1, atime=T + 2, ctime=T + 3, blocks=0), 4),
    ("f-blocks-4096", fields(5000, 5001, blocks=16), 1),
    ("g-largest", fields(protocol.INDEX_SHORT_MAX_SIZE, 5002), 1),
    ("h-past-largest", fields(protocol.INDEX_SHORT_MAX_SIZE + 1, 5004), "slot"),
    ("i-other-owner", fields(10, 5005, uid=0), "slot"),
    ("j-ino-far", fields(10, 5000 + 2**35, mtime=T), "slot"),
    ("k-odd-blocks", fields(10, 5006, blocks=3), "slot"),
    ("l-other-mode", fields(10, 5007, mode=stat.S_IFREG | 0o600), "slot"),
    ("m-before-1970", fields(10, 5008, mtime=-1_500_000_001, atime=-1_500_000_001, ctime=-1_500_000_001), 2),
]


def listed_index(names, dirs=("0/d",)):
    """An index of ``names`` (keys), none described, in a writable bytearray the file's full size."""
    data = index_layout.build_index([(k.encode(), os.stat_result((REG, 0, 0, 1, 0, 0, 0, 0, 0, 0)),
                                      protocol.INDEX_FLAG_UNDESCRIBED) for k in names])
    size = protocol.INDEX_HEADER.unpack_from(data)[15]
    return bytearray(data) + bytearray(size - len(data))


def describe(data, n, st, steps=None):
    lib = walker.library()
    buf = (ctypes.c_char * len(data)).from_buffer(data)
    tables = route_tables(steps) if steps is not None else (None, None, None)
    try:
        return lib.index_put_stat(ctypes.addressof(buf), len(data), n, (ctypes.c_int64 * 12)(*st), *tables,
                                  len(steps) if steps is not None else 0)
    finally:
        del buf


def as_stat(e: tuple) -> tuple:
    """INDEX_ENTRY fields as index_put_stat's."""
    return (e[3], e[4], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12], e[15], e[16])


def described_table():
    keys = [f"0/d/{name}" for name, _, _ in FILES]
    data = listed_index(keys)
    table = IndexTable(data)
    for name, st, _ in FILES:
        assert describe(data, table.row_of(f"0/d/{name}") + 1, st) == 1
    return data, table


def test_each_file_takes_the_short_stat_its_fields_need_and_reads_back_as_it_was_given():
    data, table = described_table()
    header = protocol.INDEX_HEADER.unpack_from(data)
    words = sum(w for _, _, w in FILES if w != "slot")
    assert header[17] == words and header[12] == sum(1 for *_, w in FILES if w == "slot")
    index = index_layout.Index(bytes(data))
    for name, st, takes in FILES:
        n = table.row_of(f"0/d/{name}")
        record = protocol.INDEX_FILE.unpack_from(data, header[13] + 8 * n)[1]
        assert (record > table.nfiles) == (takes != "slot"), name
        got = table.entry(n)
        assert as_stat(got) == st, name
        assert got[1:3] == table._name_span(n)[::-1] and got[18] == n + 1  # its name, its number
        assert as_stat(index.entry(n + 1)) == st and table.get(f"0/d/{name}").ino == st[4]
    assert table.undescribed() == 0
    assert sorted(table.described_sizes()) == sorted((table.row_of(f"0/d/{n}"), st[0]) for n, st, _ in FILES)
    assert table.total_size() == sum(st[0] for _, st, _ in FILES) == sum(table.sizes())


def test_a_described_file_is_not_described_again_and_its_route_goes_into_its_short_stat():
    data, table = described_table()
    n = table.row_of("0/d/b-same-times")
    assert describe(data, n + 1, fields(1, 1)) == 0 and as_stat(table.entry(n)) == FILES[1][1]
    steps = routes.published(routes.NodeFacts(door=True), 1)
    stamp_routes(data, table.nfiles, steps)
    for name, st, _ in FILES:
        expected = routes.route_of(routes.FileFacts(size=st[0], regular=True), routes.NodeFacts(door=True))
        assert table.route(table.row_of(f"0/d/{name}")) == expected, name
    assert as_stat(table.entry(n)) == FILES[1][1]  # the route beside its stat, which is unchanged


def test_another_nodes_device_numbers_reach_the_short_stats_through_their_shape():
    data, table = described_table()
    table.remap_devices({2049: 77})
    assert {table.entry(table.row_of(f"0/d/{name}"))[8] for name, _, _ in FILES} == {77}


def test_a_copy_holds_the_shorts_used_and_leaves_the_rest_of_their_room_a_hole(tmp_path):
    data, table = described_table()
    header = protocol.INDEX_HEADER.unpack_from(data)
    (_, head_end), (stats_off, stats_end) = used_ranges(header)
    assert head_end == header[14] - 8 * protocol.INDEX_SHORT_ROOM * table.nfiles + 8 * header[17]
    path = tmp_path / "kept.index"
    write_index_file(str(path), [data])
    kept = path.read_bytes()
    assert len(kept) == header[15] and kept[:head_end] == data[:head_end]
    assert kept[head_end:stats_off] == bytes(stats_off - head_end) and kept[stats_off:stats_end] == data[stats_off:stats_end]
    again = pickle.loads(pickle.dumps(table))
    for table_b in (IndexTable(bytearray(kept)), again):
        assert [as_stat(table_b.entry(n)) for n in range(table.nfiles)] == [as_stat(table.entry(n)) for n in range(table.nfiles)]


def test_a_directorys_first_regular_file_is_its_shape_and_every_directory_has_its_own():
    keys = ["0/x/one", "0/x/two", "0/y/one", "0/y/two"]
    data = listed_index(keys)
    table = IndexTable(data)
    for key, st in zip(keys, (fields(1, 10), fields(2, 11), fields(3, 20, uid=5), fields(4, 21, uid=5))):
        describe(data, table.row_of(key) + 1, st)
    header = protocol.INDEX_HEADER.unpack_from(data)
    assert header[12] == 2 and header[17] == 2  # a slot each directory, a short stat each other file
    assert [table.entry(table.row_of(k))[10] for k in keys] == [1000, 1000, 5, 5]


def test_an_index_short_of_room_for_its_shorts_is_refused():
    data = listed_index(["0/d/a"])
    header = list(protocol.INDEX_HEADER.unpack_from(data))
    header[9] = header[14] - 8  # its children would run into the shapes and shorts
    protocol.INDEX_HEADER.pack_into(data, 0, *header)
    with pytest.raises(ValueError, match="no room for its shapes and shorts"):
        IndexTable(data)


def test_a_copy_of_an_index_with_no_stat_ends_at_its_shapes_and_takes_its_routes():
    """A manifest made from a list (no file described) is its bytes up to its shapes: the C library
    takes it as an index whose routes it publishes (none yet), as a copy of one with stats."""
    data = bytearray(index_layout.build_index([(b"0/d/a", os.stat_result((REG, 0, 0, 1, 0, 0, 5, 0, 0, 0)),
                                                protocol.INDEX_FLAG_UNDESCRIBED)]))
    header = protocol.INDEX_HEADER.unpack_from(data)
    assert len(data) == header[14] - 8 * protocol.INDEX_SHORT_ROOM - protocol.INDEX_ENTRY.size * header[16]
    stamp_routes(data, 1, routes.published(routes.NodeFacts(door=True), 1))
    assert IndexTable(data).route(0) is None  # not described: no route yet
