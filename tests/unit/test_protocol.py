"""protocol.py is the contract; monarch_shim.c mirrors it by hand. Keep them equal."""

from __future__ import annotations

import os
import re
import struct

import pytest

from monarch import protocol
from monarch.shim.build import SOURCE

# C macro (without the MONARCH_ prefix) -> protocol.py name
MIRRORED = {
    "COUNTERS_MAGIC": "COUNTERS_MAGIC",
    "COUNTERS_VERSION": "COUNTERS_VERSION",
    "MAX_SLOTS": "MAX_SLOTS",
    "HEADER_WORDS": "HEADER_WORDS",
    "SLOT_WORDS": "SLOT_WORDS",
    "EXTRA_WORDS": "EXTRA_WORDS",
    "SLOT_PFS": "SLOT_PFS",
    "SLOT_PEER": "SLOT_PEER",
    "FIRST_TIER_SLOT": "FIRST_TIER_SLOT",
    "SHIM_TIMEOUT_MS_DEFAULT": "SHIM_TIMEOUT_MS_DEFAULT",
    "ENV_ROOTS": "ENV_ROOTS",
    "ENV_PROBE": "ENV_PROBE",
    "ENV_SOCKET": "ENV_SOCKET",
    "ENV_COUNTERS": "ENV_COUNTERS",
    "ENV_DISABLE": "ENV_DISABLE",
    "ENV_INDEX": "ENV_INDEX",
    "HEARTBEAT_MS": "HEARTBEAT_MS",
    "HEARTBEAT_TIMEOUT_MS": "HEARTBEAT_TIMEOUT_MS",
    "VERB_OPEN": "VERB_OPEN",
    "VERB_INVALIDATE": "VERB_INVALIDATE",
    "VERB_ATTACH": "VERB_ATTACH",
    "VERB_REPORT": "VERB_REPORT",
    "VERB_STOP": "VERB_STOP",
    "STATUS_PENDING": "STATUS_PENDING",
    "STATUS_ERROR": "STATUS_ERROR",
    "ANSWER_FD": "ANSWER_FD",
    "MEMFD_SEALS": "MEMFD_SEALS",
    "MAX_REQUEST": "MAX_REQUEST",
    "MAX_ANSWER": "MAX_ANSWER",
    "INDEX_MAGIC": "INDEX_MAGIC",
    "INDEX_VERSION": "INDEX_VERSION",
    "INDEX_FLAG_SYMLINK": "INDEX_FLAG_SYMLINK",
    "INDEX_FLAG_LISTED": "INDEX_FLAG_LISTED",
    "EXTRA_META_LOCAL": "EXTRA_META_LOCAL",
    "EXTRA_META_PFS": "EXTRA_META_PFS",
    "EXTRA_META_OFF": "EXTRA_META_OFF",
    "EXTRA_ZSTD_OPENS": "EXTRA_ZSTD_OPENS",
    "EXTRA_ZSTD_NS": "EXTRA_ZSTD_NS",
    "EXTRA_ZSTD_BYTES": "EXTRA_ZSTD_BYTES",
    "EXTRA_ZSTD_FALLBACKS": "EXTRA_ZSTD_FALLBACKS",
    "ENV_SHIM_ZSTD": "ENV_SHIM_ZSTD",
    "ENV_ASK_FIRST": "ENV_ASK_FIRST",
    "ENV_INDEX_WAIT": "ENV_INDEX_WAIT",
    "SHIM_INDEX_WAIT_MS_DEFAULT": "SHIM_INDEX_WAIT_MS_DEFAULT",
    "VERB_INDEX": "VERB_INDEX",
    "INDEX_READY": "INDEX_READY",
    "INDEX_NONE": "INDEX_NONE",
}

# C macro -> the size of a protocol.py struct layout
MIRRORED_SIZES = {
    "REQUEST_HEADER_SIZE": protocol.REQUEST_HEADER,
    "ANSWER_HEADER_SIZE": protocol.ANSWER_HEADER,
    "INDEX_HEADER_SIZE": protocol.INDEX_HEADER,
    "INDEX_ENTRY_SIZE": protocol.INDEX_ENTRY,
    "INDEX_CHILD_SIZE": protocol.INDEX_CHILD,
}

DEFINE = re.compile(r"^#define MONARCH_(\w+)[ \t]+(.+?)\s*$", re.M)


def c_value(text: str):
    if text.startswith('"'):
        return text.strip('"')
    return int(re.sub(r"[uUlL]+$", "", text.strip("()")), 0)


@pytest.fixture(scope="module")
def c_defines() -> dict[str, object]:
    out = {}
    for name, value in DEFINE.findall(SOURCE.read_text()):
        try:
            out[name] = c_value(value)
        except ValueError:
            pass  # function-like or computed macros
    return out


@pytest.mark.parametrize("c_name,py_name", MIRRORED.items())
def test_c_mirror_equals_protocol(c_defines, c_name, py_name):
    assert c_name in c_defines, f"monarch_shim.c lacks #define MONARCH_{c_name}"
    assert c_defines[c_name] == getattr(protocol, py_name), f"MONARCH_{c_name} differs from protocol.{py_name}"


@pytest.mark.parametrize("c_name,layout", MIRRORED_SIZES.items())
def test_c_layout_sizes_equal_protocol(c_defines, c_name, layout):
    assert c_defines.get(c_name) == layout.size, f"MONARCH_{c_name} differs from the protocol.py struct"


def test_debug_and_timeout_env_names_documented(c_defines):
    assert c_defines["ENV_DEBUG"] == "MONARCH_SHIM_DEBUG"
    assert c_defines["ENV_TIMEOUT"] == "MONARCH_SHIM_TIMEOUT_MS"
    assert "MONARCH_SHIM_DEBUG" in protocol.__doc__ and "MONARCH_SHIM_TIMEOUT_MS" in protocol.__doc__


def test_counters_layout():
    assert protocol.COUNTERS_SIZE == 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * protocol.MAX_SLOTS
                                          + protocol.EXTRA_WORDS)
    assert protocol.MAX_TIERS == protocol.MAX_SLOTS - protocol.FIRST_TIER_SLOT
    assert protocol.tier_slot(0) == protocol.FIRST_TIER_SLOT
    assert protocol.SLOT_PFS == 0 and protocol.SLOT_PEER == 1
    # the shim's fd table stores slot + 1 in a uint8_t, with its top bit as the "uncounted" mark
    assert protocol.MAX_SLOTS < 127


def test_counters_roundtrip(tmp_path):
    path = str(tmp_path / "c")
    protocol.create_counters(path)
    raw = bytearray(open(path, "rb").read())
    assert len(raw) == protocol.COUNTERS_SIZE
    assert protocol.read_counters(path) == [(0, 0, 0)] * protocol.MAX_SLOTS
    # what the shim does: little-endian adds at word HEADER_WORDS + SLOT_WORDS*slot (+1 bytes, +2 uncounted)
    for slot, values in [(0, (3, 1000, 1)), (2, (1, 7, 0)), (15, (9, 2**40, 4))]:
        for i, v in enumerate(values):
            struct.pack_into("<Q", raw, 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * slot + i), v)
    struct.pack_into("<Q", raw, 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * protocol.MAX_SLOTS
                                     + protocol.EXTRA_META_PFS), 5)
    open(path, "wb").write(raw)
    counts = protocol.read_counters(path)
    assert counts[0] == (3, 1000, 1) and counts[2] == (1, 7, 0) and counts[15] == (9, 2**40, 4)
    assert counts[1] == (0, 0, 0)
    assert protocol.read_extra_counters(path)[protocol.EXTRA_META_PFS] == 5
    names = {0: "pfs", 2: "ram"}
    assert protocol.read_sources(path, names) == {"pfs": {"opens": 3, "bytes": 1000, "opens_uncounted": 1},
                                                  "ram": {"opens": 1, "bytes": 7, "opens_uncounted": 0}}


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
    bytes([9, 0, 0, 0]) + struct.pack("<I", 1),                        # unknown verb
    bytes([protocol.VERB_OPEN, 1, 0, 0]) + struct.pack("<I", 1),        # flags
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
    data = protocol.build_index(entries)
    (magic, version, n, nbuckets, _, boff, eoff, koff, ksize, coff,
     nchildren) = protocol.INDEX_HEADER.unpack_from(data)
    assert (magic, version, n) == (protocol.INDEX_MAGIC, protocol.INDEX_VERSION, len(names))
    assert nbuckets & (nbuckets - 1) == 0 and nbuckets >= 2 * n  # always an empty bucket: lookups end
    assert eoff == boff + 4 * nbuckets and koff == eoff + protocol.INDEX_ENTRY.size * n
    assert coff >= koff + ksize and nchildren == 0 and len(data) == coff
    for key, st in entries:
        got = protocol.index_lookup(data, key)
        assert got == (st.st_size, st.st_mtime_ns, st.st_atime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                       st.st_mode, st.st_uid, st.st_gid, st.st_nlink, 0, 0, st.st_blocks, st.st_blksize, 0, 0)
    flagged = protocol.build_index([(b"0/l", entries[0][1], protocol.INDEX_FLAG_SYMLINK)])
    assert protocol.index_lookup(flagged, b"0/l")[10:12] == (protocol.INDEX_FLAG_SYMLINK, 0)
    assert protocol.index_lookup(data, b"0/missing") is None
    assert protocol.index_lookup(data, b"1/a.jpg") is None  # same name, other root
    assert protocol.key_hash(b"123456789") == 0xCBF43926     # the CRC-32 check value the shim's table must give


def test_index_directories_links_and_listings(tmp_path):
    """Directories carry their whole listing ("." and ".." first, then sorted names, d_type and
    d_ino), a symlinked file its own lstat, and the index reads back into the snapshot."""
    from monarch.snapshot import read_index, take_snapshot
    root = tmp_path / "ds"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "sub" / "b.bin").write_bytes(b"b" * 10)
    (root / "sub" / "A.bin").write_bytes(b"a" * 3)
    (root / "lnk").symlink_to("sub/b.bin")
    (root / "dlnk").symlink_to("sub")
    os.mkfifo(root / "fifo")
    snap = take_snapshot((str(root),))
    idx = protocol.Index(snap.index_bytes())
    top = idx.children(idx.number(b"0/"))
    assert [(name, d_type) for name, d_type, _, _ in top] == [
        (b".", protocol.DT_DIR), (b"..", protocol.DT_DIR), (b"dlnk", protocol.DT_LNK), (b"fifo", protocol.DT_FIFO),
        (b"lnk", protocol.DT_LNK), (b"sub", protocol.DT_DIR)]
    assert top[0][2] == os.stat(root).st_ino and top[1][2] == os.stat(tmp_path).st_ino
    assert {name: ino for name, _, ino, _ in top[2:]} == {e.name.encode(): e.inode() for e in os.scandir(root)}
    assert [entry != 0 for *_, entry in top[2:]] == [False, False, True, True]  # undescribed: dir link, fifo
    sub = idx.children(idx.number(b"0/sub"))
    assert [name for name, *_ in sub] == [b".", b"..", b"A.bin", b"b.bin", b"deep"]
    lnk = protocol.index_lookup(idx.data, b"0/lnk")
    assert lnk[10] == protocol.INDEX_FLAG_SYMLINK and lnk[0] == 10
    link_record = idx.entry(lnk[11])
    assert link_record[9] == os.lstat(root / "lnk").st_mode and link_record[7] == os.lstat(root / "lnk").st_ino
    assert protocol.index_lookup(idx.data, b"0/sub")[10] == protocol.INDEX_FLAG_LISTED
    again = read_index(idx.data, snap.roots)
    assert (again.files, again.dirs, again.links) == (snap.files, snap.dirs, snap.links)


def test_index_lookup_rejects_foreign_data():
    with pytest.raises(ValueError, match="not a Monarch index"):
        protocol.index_lookup(b"\0" * 128, b"0/a")
