"""The stager's ``staged`` books (StagedTable): a dict's answers, one byte per file of an index
snapshot, a dict for keys the index does not hold and for snapshots that are no index."""

import pytest

from monarch.node.snapshot.indextable import IndexTable
from monarch.node.snapshot.snapshot import Snapshot, take_snapshot
from monarch.node.stage.staged_table import StagedTable


class Tier:
    """Any object is a tier here: told apart by identity (two equal names are two tiers)."""
    def __init__(self, name):
        self.name = name


@pytest.fixture
def index_snapshot(tmp_path):
    root = tmp_path / "ds"
    (root / "a").mkdir(parents=True)
    for i in range(20):
        (root / "a" / f"f{i}").write_bytes(b"x" * i)
    (root / "top").write_text("top")
    snap = take_snapshot((str(root),))
    return Snapshot.from_index(snap.roots, bytearray(snap.index_bytes()), len(snap.files))


def check_like_a_dict(table, keys, outside):
    """``table`` answers as a dict given the same operations, for ``keys`` (of the snapshot)
    and ``outside`` (keys it does not hold)."""
    ram, ssd = Tier("ram"), Tier("ram")
    plain = {}
    for i, key in enumerate(keys + outside):
        for t in (table, plain):
            t[key] = ram if i % 2 else ssd
    for t in (table, plain):
        t[keys[0]] = ram  # a key moved to another tier
        del t[keys[1]]
    assert table.pop(keys[2]) is plain.pop(keys[2])
    assert table.pop(keys[2], None) is None and table.pop(outside[0]) is plain.pop(outside[0])
    with pytest.raises(KeyError):
        table.pop(keys[2])
    with pytest.raises(KeyError):
        table[keys[1]]
    with pytest.raises(KeyError):
        del table[outside[0]]
    assert len(table) == len(plain) == len(keys) + len(outside) - 3
    assert dict(table.items()) == plain and set(table) == set(plain) and table.keys() == plain.keys()
    for key in keys + outside:
        assert table.get(key) is plain.get(key) and (key in table) == (key in plain)
    assert table.get(keys[1], "none") == "none" and 42 not in table
    copy = table.copy()
    table[keys[1]] = ram
    del table[keys[3]]
    assert dict(copy.items()) == plain and len(copy) == len(plain)  # apart from the table after
    assert table[keys[1]] is ram and keys[3] not in table and keys[3] in copy


def test_an_index_snapshots_files_take_a_byte_each_and_answer_as_a_dict(index_snapshot):
    files = index_snapshot.files
    assert isinstance(files, IndexTable)
    table = StagedTable(files)
    keys = list(files)
    check_like_a_dict(table, keys, ["0/a", "0/not-a-file", "9/elsewhere"])  # "0/a": a directory of the index
    assert len(table._codes) == len(files) and table._count == len(keys) - 2
    assert list(table.tiers_of(files)) == [table.get(k) for k in keys]
    assert list(table.copy().tiers_of(files)) == [table.get(k) for k in keys]  # by rows, as by keys
    assert set(table._others) == {"0/not-a-file", "9/elsewhere"}  # the rest in the bytes ("0/a" popped)


def test_any_other_snapshot_keeps_a_dict(tmp_path, index_snapshot):
    files = dict(index_snapshot.files.items())  # a plain dict (a store's manifest), as a FileTable would be
    table = StagedTable(files)
    check_like_a_dict(table, list(files), ["0/a", "9/elsewhere"])
    assert not table._codes and len(table._others) == len(table)
    assert list(table.tiers_of(files)) == [table.get(k) for k in files]


def test_entry_numbers_and_keys_book_the_same_copy(index_snapshot):
    files = index_snapshot.files
    table, ram = StagedTable(files), Tier("ram")
    n = files.row_of("0/a/f3")
    assert table.set_row(n, ram) and table["0/a/f3"] is ram and list(table) == ["0/a/f3"]
    assert not StagedTable({}).set_row(0, ram)  # no rows: the caller books it by key
    assert table.pop("0/a/f3") is ram and not table.set_row(len(files), ram) and not table


def test_keys_under_a_directory_are_found_in_the_bytes_and_the_dict(index_snapshot):
    files = index_snapshot.files
    table, ram = StagedTable(files), Tier("ram")
    for key in ("0/a/f1", "0/a/f12", "0/top", "0/ab/x"):  # "0/ab/x" is no key of the index
        table[key] = ram
    assert sorted(table.keys_under("0/a/")) == sorted(table.keys_under("0/a")) == ["0/a/f1", "0/a/f12"]
    assert table.keys_under("0/top") == ["0/top"] and table.keys_under("0/a/f2") == []


def test_past_255_tiers_the_dict_takes_the_rest(index_snapshot):
    files = index_snapshot.files
    table, keys = StagedTable(files), list(files)
    tiers = [Tier(str(i)) for i in range(300)]
    for i, tier in enumerate(tiers):
        table[keys[i % len(keys)]] = tier
    for i in range(len(tiers) - len(keys), len(tiers)):  # each key's last tier
        assert table[keys[i % len(keys)]] is tiers[i]
    assert len(table) == len(keys) and list(table.tiers_of(files)) == [table.get(k) for k in keys]
