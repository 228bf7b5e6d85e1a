"""The read-ahead's keys with no list of them: an index gone over in its own order (again each
time), a sample spread over it by position, and ReadAhead's stager handed neither a list of
every key nor one per stretch (tracemalloc: a list of 100,000 keys is ~8 MB)."""

from __future__ import annotations

import os
import tracemalloc
from types import SimpleNamespace

from monarch import index_layout
from monarch.node.read_ahead import ReadAhead
from monarch.node.snapshot.indextable import IndexTable
from monarch.node.snapshot.key_order import in_order, spread_over

REG = 0o100644


def index_of(keys: list[str], size=lambda k: 7) -> IndexTable:
    """An index of ``keys``, every file described (as this file, its size ``size(key)``)."""
    st = os.stat(__file__)
    ns = {f: getattr(st, f) for f in ("st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_blocks", "st_blksize")}
    return IndexTable(bytearray(index_layout.build_index(
        [(k.encode(), os.stat_result((REG, *st[1:6], size(k), *st[7:10]), ns), 0) for k in keys])))


def test_an_index_is_gone_over_in_its_own_order_again_each_time_a_dict_sorted():
    table = index_of(["0/b/z", "0/a/y", "0/a/x", "0/c"])
    keys = in_order(table)
    assert keys is table and list(keys) == list(keys) == list(table)  # its directories by key, files by name
    assert set(keys) == {"0/b/z", "0/a/y", "0/a/x", "0/c"}
    assert in_order({"b": 1, "a": 2}) == ["a", "b"]


def test_a_sample_is_spread_over_the_index_a_key_a_stretch_and_only_keys_taken():
    keys = [f"0/d{d}/f{i:03d}" for d in range(4) for i in range(250)]
    table = index_of(keys)
    order = list(table)
    got = spread_over(table, 10, lambda k: True)
    assert got == [order[100 * i + 50] for i in range(10)]  # each stretch's middle
    odd = spread_over(table, 10, lambda k: int(k[-3:]) % 2 == 1)  # the first taken from the middle on
    assert odd == [next(k for k in order[100 * i + 50:100 * i + 100] if int(k[-3:]) % 2) for i in range(10)]
    assert spread_over(table, 10, lambda k: k == order[3]) == [order[3]]  # a stretch with none taken gives none
    assert spread_over(table, 5000, lambda k: True) == order  # more asked than there are
    assert spread_over({"c": 0, "a": 0, "b": 0, "d": 0}, 2, lambda k: k != "a") == ["b", "d"]


def test_a_sample_takes_every_class_of_the_dataset_alike():
    keys = [f"class_{c}/{i:03d}" for c in range(6) for i in range(100)]
    for files in (dict.fromkeys(keys), index_of(keys)):
        picked = spread_over(files, 32, lambda k: True)
        assert len(picked) == 32 and len(set(picked)) == 32
        per_class = [sum(k.startswith(f"class_{c}/") for k in picked) for c in range(6)]
        assert min(per_class) >= 5 and max(per_class) <= 6, per_class
    assert spread_over(dict.fromkeys(keys[:10]), 32, lambda k: True) == keys[:10]


class Stager:
    def __init__(self):
        self.ahead, self.first = [], []

    def read_ahead(self, keys):
        self.ahead.append(keys)

    def read_ahead_first(self, keys):
        self.first.append(list(keys))

    def busy_keys(self):
        return set()


def test_the_stager_reads_ahead_an_index_with_no_list_of_its_keys():
    """A compressing tier's read-ahead (the stager's alone, its sample first) over 100,000 files:
    what it allocates is the sample's, not a key each file."""
    n = 100_000
    table = index_of([f"0/d{i // 1000:03d}/f{i:06d}" for i in range(n)], size=lambda k: len(k))
    codec = SimpleNamespace(sample_files=64, taken=None, defer_sample=lambda: None)
    codec.sample_from = lambda keys: setattr(codec, "taken", list(keys))
    stager = Stager()
    current = SimpleNamespace(ready=True, stager=stager, snapshot=SimpleNamespace(files=table),
                              gate=SimpleNamespace(closing=False))
    ahead = ReadAhead("read-ahead", current, [SimpleNamespace(keep=False, codec=codec)], None, False, None, "",
                      lambda: None, lambda: None, lambda: None)
    tracemalloc.start()
    try:
        ahead.start()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(codec.taken) == 64 and stager.first == [codec.taken]
    assert len(stager.ahead) == 1 and sum(1 for _ in stager.ahead[0]) == n  # every file, in the index's order
    assert peak < 8 * n, f"the read-ahead's start allocated {peak:,} bytes for {n:,} files"
