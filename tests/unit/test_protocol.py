"""protocol.py: frames, counters and the snapshot index in Python (the C side: tests/unit/test_wire.py)."""

from __future__ import annotations

import os
import stat
import struct

import pytest

from monarch import index_layout, protocol

def test_counters_layout():
    assert protocol.COUNTERS_SIZE == 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * protocol.MAX_SLOTS
                                          + protocol.EXTRA_WORDS)
    assert protocol.MAX_TIERS == protocol.MAX_SLOTS - protocol.FIRST_TIER_SLOT
    assert protocol.tier_slot(0) == protocol.FIRST_TIER_SLOT
    assert protocol.SLOT_PFS == 0 and protocol.SLOT_PEER == 1
    # the shim's fd table stores slot + 1 in a uint8_t, below its two flags (uncounted, stdio)
    assert protocol.MAX_SLOTS < 0x3f


def test_counters_roundtrip(tmp_path):
    path = str(tmp_path / "c")
    protocol.create_counters(path)
    raw = bytearray(open(path, "rb").read())
    assert len(raw) == protocol.COUNTERS_SIZE
    assert protocol.read_counters(path) == [(0,) * 5] * protocol.MAX_SLOTS
    # what the shim does: little-endian adds at word HEADER_WORDS + SLOT_WORDS*slot (+1 bytes, +2 uncounted,
    # +3 stdio, +4 mapped bytes)
    for slot, values in [(0, (3, 1000, 1, 0, 4096)), (2, (1, 7, 0, 0, 0)), (15, (9, 2**40, 4, 4, 0))]:
        for i, v in enumerate(values):
            struct.pack_into("<Q", raw, 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * slot + i), v)
    struct.pack_into("<Q", raw, 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * protocol.MAX_SLOTS
                                     + protocol.EXTRA_META_PFS), 5)
    open(path, "wb").write(raw)
    counts = protocol.read_counters(path)
    assert counts[0] == (3, 1000, 1, 0, 4096) and counts[2] == (1, 7, 0, 0, 0) and counts[15] == (9, 2**40, 4, 4, 0)
    assert counts[1] == (0,) * 5
    assert protocol.read_extra_counters(path)[protocol.EXTRA_META_PFS] == 5
    names = {0: "pfs", 2: "ram"}
    assert protocol.read_opened_from(path, names) == {
        "pfs": {"opens": 3, "bytes": 1000, "opens_uncounted": 1, "opens_stdio": 0, "mapped_bytes": 4096},
        "ram": {"opens": 1, "bytes": 7, "opens_uncounted": 0, "opens_stdio": 0, "mapped_bytes": 0}}


def test_read_counters_rejects_foreign_file(tmp_path):
    path = tmp_path / "c"
    path.write_bytes(b"\0" * protocol.COUNTERS_SIZE)
    with pytest.raises(ValueError, match="not a Monarch counters file"):
        protocol.read_counters(str(path))


# -- frames ---------------------------------------------------------------------------
class FakeSock:
    """recv() from a byte string in small pieces, as a stream socket may deliver it."""

    def __init__(self, data: bytes, piece: int = 3):
        self.data, self.piece = data, piece

    def recv(self, n: int) -> bytes:
        out, self.data = self.data[:min(n, self.piece)], self.data[min(n, self.piece):]
        return out


@pytest.mark.parametrize("key", [b"0/a.jpg", b"3/dir/with\nnewline", b"1/\xff\xfe latin", b"0/" + b"n" * 255, b""])
def test_request_roundtrip(key):
    frame = protocol.encode_request(protocol.VERB_OPEN, key)
    # what the shim writes: u8 verb, u8 0, u16 0, u32 little-endian length, key
    assert frame[:8] == bytes([protocol.VERB_OPEN, 0, 0, 0]) + struct.pack("<I", len(key))
    verb, length = protocol.decode_request_header(frame[:8])
    assert (verb, frame[8:8 + length]) == (protocol.VERB_OPEN, key)
    assert protocol.key_bytes(protocol.key_str(key)) == key  # surrogateescape round trip


@pytest.mark.parametrize("header", [
    bytes([max(protocol.VERBS) + 1, 0, 0, 0]) + struct.pack("<I", 1),  # unknown verb
    bytes([protocol.VERB_OPEN, 2, 0, 0]) + struct.pack("<I", 1),        # an unknown flag
    bytes([protocol.VERB_INDEX, protocol.REQUEST_KEEP, 0, 0]) + struct.pack("<I", 1),  # KEEP on another verb
    bytes([protocol.VERB_OPEN, 0, 0, 1]) + struct.pack("<I", 1),        # reserved
    bytes([protocol.VERB_OPEN, 0, 0, 0]) + struct.pack("<I", protocol.MAX_REQUEST + 1),
])
def test_bad_request_headers_are_refused(header):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_request_header(header)


def test_oversized_request_cannot_be_encoded():
    with pytest.raises(protocol.ProtocolError):
        protocol.encode_request(protocol.VERB_INVALIDATE, b"k" * (protocol.MAX_REQUEST + 1))


def test_answer_roundtrip_skips_heartbeats():
    body = b"/tier/0/a\nb\xff"
    stream = protocol.encode_answer(protocol.STATUS_PENDING) * 3 + protocol.encode_answer(2, body)
    assert stream[:8] == struct.pack("<iI", protocol.STATUS_PENDING, 0)
    assert protocol.recv_answer(FakeSock(stream)) == (2, body)
    assert protocol.recv_answer(FakeSock(protocol.encode_answer(protocol.SLOT_PFS))) == (protocol.SLOT_PFS, b"")


def test_oversized_or_truncated_answers_raise():
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        protocol.recv_answer(FakeSock(struct.pack("<iI", 2, 5000) + b"x" * 5000), limit=4095)
    with pytest.raises(protocol.ProtocolError, match="closed"):
        protocol.recv_answer(FakeSock(protocol.encode_answer(2, b"/tier/x")[:-2]))


# -- snapshot index ---------------------------------------------------------------------
def test_index_build_and_lookup(tmp_path):
    names = [b"a.jpg", b"dir/b\nc", b"\xff\xfe.bin", b"n" * 255] + [f"many/{i}".encode() for i in range(40)]
    entries = []
    for i, name in enumerate(names):
        path = os.path.join(bytes(tmp_path), name.replace(b"/", b"_"))
        with open(path, "wb") as f:
            f.write(b"x" * i)
        entries.append((b"0/" + name, os.stat(path)))
    data = index_layout.build_index(entries)
    (magic, version, n, nbuckets, _, boff, eoff, koff, ksize, coff, nchildren, files, used, foff, soff, size, dirs, _,
     names_size, roff, sizes_off, inos_off) = protocol.INDEX_HEADER.unpack_from(data)
    assert (magic, version, files, used, dirs) == (protocol.INDEX_MAGIC, protocol.INDEX_VERSION, len(names), len(names), 3)
    assert n == files + dirs  # the files' directories ("0/", "0/dir", "0/many") have entries, undescribed
    assert nbuckets == max(16, (3 * dirs + 31) // 32 * 16) > dirs  # 3/2 of the directories (a file has none): an empty one
    assert foff == boff + 4 * nbuckets and roff == foff + protocol.INDEX_FILE.size * n - protocol.INDEX_FILE.size * dirs
    assert sizes_off == inos_off == 0 and eoff == roff + 16 + index_layout.AFFIX.size * dirs and koff == eoff + protocol.INDEX_ENTRY.size * dirs
    assert names_size == sum(len(name.rpartition(b"/")[2]) for name in names)  # each name once, under its directory
    assert coff >= koff + ksize and coff % 8 == 0 and nchildren == 0 and soff == coff + protocol.INDEX_ENTRY.size * dirs + 8 * protocol.INDEX_SHORT_ROOM * files  # shapes, shorts
    assert len(data) == size == soff + protocol.INDEX_ENTRY.size * files  # every file described: every slot taken
    index = index_layout.Index(data)
    for key, st in entries:
        got = index_layout.index_lookup(data, key)
        assert got == (st.st_size, st.st_mtime_ns, st.st_atime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                       st.st_mode, st.st_uid, st.st_gid, st.st_nlink, 0, 0, st.st_blocks, st.st_blksize, 0,
                       index.number(key))
        assert index.key(index.number(key)) == key
    assert [index.key(m) for m in range(files + 1, n + 1)] == [b"0/", b"0/dir", b"0/many"]
    assert index_layout.index_lookup(data, b"0/dir")[10] == protocol.INDEX_FLAG_UNDESCRIBED  # nothing answered from it
    flagged = index_layout.build_index([(b"0/l", entries[0][1], protocol.INDEX_FLAG_SYMLINK)])
    assert index_layout.index_lookup(flagged, b"0/l")[10:12] == (protocol.INDEX_FLAG_SYMLINK, 0)
    assert index_layout.index_lookup(data, b"0/missing") is None
    assert index_layout.index_lookup(data, b"1/a.jpg") is None  # same name, other root
    assert protocol.key_hash(b"123456789") == 0xCBF43926     # the CRC-32 check value the shim's table must give


def test_index_directories_links_and_listings(tmp_path):
    """Directories carry their whole listing ("." and ".." first, then sorted names, d_type and
    d_ino), a symlinked file its own lstat, and the index reads back into the snapshot."""
    from monarch.node.snapshot.snapshot import read_index, take_snapshot
    root = tmp_path / "ds"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "sub" / "b.bin").write_bytes(b"b" * 10)
    (root / "sub" / "A.bin").write_bytes(b"a" * 3)
    (root / "lnk").symlink_to("sub/b.bin")
    (root / "dlnk").symlink_to("sub")
    os.mkfifo(root / "fifo")
    snap = take_snapshot((str(root),))
    idx = index_layout.Index(snap.index_bytes())
    top = idx.children(idx.number(b"0/"))
    assert [(name, d_type) for name, d_type, _, _ in top] == [
        (b".", protocol.DT_DIR), (b"..", protocol.DT_DIR), (b"dlnk", protocol.DT_LNK), (b"fifo", protocol.DT_FIFO),
        (b"lnk", protocol.DT_LNK), (b"sub", protocol.DT_DIR)]
    assert top[0][2] == os.stat(root).st_ino and top[1][2] == os.stat(tmp_path).st_ino
    assert {name: ino for name, _, ino, _ in top[2:]} == {e.name.encode(): e.inode() for e in os.scandir(root)}
    assert [entry != 0 for *_, entry in top[2:]] == [False, False, True, True]  # undescribed: dir link, fifo
    sub = idx.children(idx.number(b"0/sub"))
    assert [name for name, *_ in sub] == [b".", b"..", b"A.bin", b"b.bin", b"deep"]
    lnk = index_layout.index_lookup(idx.data, b"0/lnk")
    assert lnk[10] == protocol.INDEX_FLAG_SYMLINK and lnk[0] == 10
    link_record = idx.entry(lnk[11])
    assert link_record[9] == os.lstat(root / "lnk").st_mode and link_record[7] == os.lstat(root / "lnk").st_ino
    assert index_layout.index_lookup(idx.data, b"0/sub")[10] == protocol.INDEX_FLAG_LISTED
    again = read_index(idx.data, snap.roots)
    assert (again.files, again.dirs, again.links) == (snap.files, snap.dirs, snap.links)


def test_a_file_listed_has_a_record_and_no_stat_until_it_is_described(tmp_path):
    """A listed file costs its 8-byte record (its name's offset, its stat's slot), its name and its
    listed size; its 112-byte stat is
    written when it is described, into the next slot of the room at the index's end, the record
    naming the slot last; the bytes a copy needs grow by one stat."""
    from monarch.node.snapshot.indextable import IndexTable, used_end
    (tmp_path / "a").write_bytes(b"a" * 7)
    st = os.stat(tmp_path / "a")
    listed = [(b"0/a", st, protocol.INDEX_FLAG_UNDESCRIBED), (b"0/b", os.stat(tmp_path), protocol.INDEX_FLAG_UNDESCRIBED)]
    data = index_layout.build_index(listed)
    header = protocol.INDEX_HEADER.unpack_from(data)
    shapes = header[14] - 8 * protocol.INDEX_SHORT_ROOM * 2 - protocol.INDEX_ENTRY.size * header[16]
    assert header[11:13] == (2, 0) and len(data) == used_end(data) == shapes  # no stat yet: no byte of the room
    assert index_layout.index_lookup(data, b"0/a")[:1] + index_layout.index_lookup(data, b"0/a")[6:11] == (
        7, stat.S_IFREG, 0, 0, 0, protocol.INDEX_FLAG_UNDESCRIBED)  # its listed size; nothing to answer from
    room = bytearray(data) + bytearray(header[15] - len(data))  # the file at its size
    table = IndexTable(room)
    assert table.undescribed() == 2 and "0/a" in table
    table["0/a"] = _info(st)
    assert table.undescribed() == 1 and used_end(room) == header[14] + protocol.INDEX_ENTRY.size
    assert index_layout.index_lookup(bytes(room), b"0/a")[:4] == (st.st_size, st.st_mtime_ns, st.st_atime_ns,
                                                                   st.st_ctime_ns)
    assert protocol.INDEX_FILE.unpack_from(room, header[13])[1] == 1  # its stat in slot 1
    assert index_layout.Index(bytes(room)).file_size(1) == st.st_size  # its listed size now its stat's


def _info(st):
    from monarch.records.filetable import FileInfo
    return FileInfo(st.st_size, st.st_mtime_ns, st.st_mode, st.st_atime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                    st.st_uid, st.st_gid, st.st_nlink, False, st.st_blocks, st.st_blksize)


def test_index_lookup_rejects_foreign_data():
    with pytest.raises(ValueError, match="not a Monarch index"):
        index_layout.index_lookup(b"\0" * 128, b"0/a")


def test_an_open_may_ask_to_keep_its_connection():
    """REQUEST_KEEP on an OPEN is a known frame (the shim's kept connection): the Python server
    answers it (and closes: it never answers ANSWER_KEPT)."""
    header = bytes([protocol.VERB_OPEN, protocol.REQUEST_KEEP, 0, 0]) + struct.pack("<I", 5)
    assert protocol.decode_request_header(header) == (protocol.VERB_OPEN, 5)
