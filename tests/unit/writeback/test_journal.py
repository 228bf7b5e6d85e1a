"""The write-back journal: records appended whole, read back checked, a torn tail dropped."""

import os

import pytest

from monarch.writeback.journal import Journal, JournalError, Tail, decode, encode, read


def test_records_are_read_back_in_order_with_their_arguments(tmp_path):
    j = Journal(str(tmp_path / "journal"), durable=True)
    assert j.append("close", seq=1, path="/pfs/ck/a.tmp", mode=0o644, size=10) == 1
    assert j.append("rename", src="/pfs/ck/a.tmp", dst="/pfs/ck/a") == 2
    assert j.append("applied", upto=1) == 3
    j.close()
    records, why = read(str(tmp_path / "journal"))
    assert why is None
    assert [(r.n, r.op) for r in records] == [(1, "close"), (2, "rename"), (3, "applied")]
    assert records[0]["path"] == "/pfs/ck/a.tmp" and records[0]["size"] == 10
    assert os.stat(tmp_path / "journal").st_mode & 0o777 == 0o600


def test_a_torn_last_line_is_dropped_and_a_reopened_journal_numbers_on(tmp_path):
    path = tmp_path / "journal"
    j = Journal(str(path), durable=False)
    j.append("mkdir", path="/pfs/d", mode=0o755)
    j.close()
    with open(path, "ab") as f:
        f.write(encode(2, "rmdir", {"path": "/pfs/d"})[:-5])  # a crash mid-append
    records, why = read(str(path))
    assert [r.op for r in records] == ["mkdir"] and why is None


def test_a_damaged_record_stops_the_reading_there_and_is_said(tmp_path):
    path = tmp_path / "journal"
    j = Journal(str(path), durable=False)
    for k in range(3):
        j.append("unlink", path=f"/pfs/{k}")
    j.close()
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"/pfs/1", b"/pfs/X")  # the checksum no longer matches
    path.write_bytes(b"".join(lines))
    records, why = read(str(path))
    assert [r["path"] for r in records] == ["/pfs/0"]
    assert "record 2 is damaged" in why
    with pytest.raises(JournalError, match="record 2 is damaged"):
        Journal(str(path), durable=False)  # never appended to after a damaged record


def test_a_record_missing_what_its_operation_needs_is_refused():
    with pytest.raises(JournalError, match="a 'close' record needs seq, path, mode, size"):
        encode(1, "close", {"seq": 1})
    assert decode(b"00000000 {}\n") is None


def test_a_tail_reads_only_what_was_appended_and_leaves_a_line_being_written(tmp_path):
    """The run's drain reads its journal as it grows: each read decodes the new lines only (the
    records read before are the same objects), and a line not yet whole is read once it is."""
    path = str(tmp_path / "journal")
    j = Journal(path, durable=False)
    tail = Tail(path)
    j.append("mkdir", path="/p/a", mode=0o755)
    first, _ = tail.read()
    assert [r.op for r in first] == ["mkdir"]
    j.append("unlink", path="/p/b")
    line = encode(3, "rmdir", {"path": "/p/a"})
    with open(path, "ab") as f:
        f.write(line[:10])  # an append under way
    records, damaged = tail.read()
    assert damaged is None and [r.op for r in records] == ["mkdir", "unlink"] and records[0] is first[0]
    with open(path, "ab") as f:
        f.write(line[10:])
    assert [r.op for r in tail.read()[0]] == ["mkdir", "unlink", "rmdir"]
    tail.forget(2)  # applied: let go
    with open(path, "ab") as f:  # (record 3 was written past the Journal: the next by hand too)
        f.write(encode(4, "unlink", {"path": "/p/c"}))
    records, damaged = tail.read()
    assert damaged is None and tail.base == 2 and [r.n for r in records] == [3, 4]
