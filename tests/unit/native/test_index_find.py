"""The snapshot index's look-up (monarch_native.h's monarch_index_find, the shim's, the front
door's and the data path's; index_layout.Index and IndexTable in Python): a file is found by a
binary search of its directory's names, which share a prefix and a suffix stored once, so every
name between, around and beside the real ones must miss, in C and in Python alike."""

import ctypes
import os
import random
from pathlib import Path

import pytest

from monarch import index_layout
from monarch.native.build import build_library
from monarch.node.snapshot.indextable import IndexTable

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def find(tmp_path_factory):
    lib = ctypes.CDLL(str(build_library(tmp_path_factory.mktemp("find") / "probe.so", HERE / "index_find_probe.c",
                                        "the index look-up probe")))
    lib.probe_find.restype = ctypes.c_int64
    lib.probe_find.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64]
    return lambda data, key: lib.probe_find(bytes(data), len(data), key, len(key))


def names_that_sort_close() -> dict[bytes, list[bytes]]:
    """Directories whose names are prefixes of one another, share a long prefix and suffix, sort
    around "." and high bytes, and a directory of one file (no affixes) and the roots' files."""
    rng = random.Random(7)
    tree = {
        b"0/": [b"a", b"a.jpg", b"b"],
        b"0/img": [f"n{i:05d}.JPEG".encode() for i in rng.sample(range(100000), 300)],
        b"0/num": [f"{i}.jpg".encode() for i in range(1, 120)],  # 1.jpg < 10.jpg < 100.jpg < 11.jpg ...
        b"0/mix": [b"x", b"x.", b"x.a", b"x\xff", b"x\x00y", b"xa", b"xx.jpg", b"\xff\xfe"],
        b"0/one": [b"only.bin"],
        b"0/num/deep": [b"1.jpg", b"2.jpg"],
        b"1/": [b"a.jpg"],
        b"12/img": [b"n00001.JPEG", b"n00002.JPEG"],
    }
    return {d: sorted(set(names)) for d, names in tree.items()}


def near_misses(name: bytes) -> list[bytes]:
    out = [name[:-1], name + b"0", name + b".jpg", b"0" + name, name[:1] + b"\x00" + name[1:], name.upper()]
    if name:
        out += [name[:-1] + bytes([name[-1] - 1 if name[-1] else 1]), name[:-1] + bytes([(name[-1] + 1) % 256])]
    return [m for m in out if m and b"/" not in m]


def test_every_file_and_directory_is_found_and_every_near_name_missed(find, tmp_path):
    tree = names_that_sort_close()
    st = os.stat(tmp_path)
    entries = [(index_layout.joined(d, name), st) for d, names in tree.items() for name in names]
    data = index_layout.build_index(entries)
    index, table = index_layout.Index(data), IndexTable(bytearray(data))
    keys = [key for key, _ in entries] + sorted({d for d in tree} | {b"0/num"})
    for key in keys:
        n = index.number(key)
        assert n and index.key(n) == key, key
        assert find(data, key) == n and table.number(key) == n - 1, key
    present = set(keys)
    misses = {index_layout.joined(d, m) for d, names in tree.items() for name in names for m in near_misses(name)}
    misses |= {b"0", b"0/im", b"0/img/", b"0/num/deep/", b"2/a.jpg", b"0//a", b"/0/a", b"0/num/deep/1.jpg/x"}
    for key in sorted(misses - present):
        assert find(data, key) == 0 and index.number(key) == 0 and table.number(key) == -1, key
    assert index.buckets == max(16, (3 * index.dirs + 31) // 32 * 16)  # the directories': no file has a bucket
