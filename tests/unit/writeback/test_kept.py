"""The kept copies' store (monarch/writeback/kept.py): kept only when the PFS holds those bytes, a
changed PFS file never served, renames followed, the room kept, the linger ended by the next run."""

import json
import os
import threading
import time

from monarch.writeback.kept import KeptWrites, describe, drop, store_path


def tier(tmp_path):
    (tmp_path / "tier").mkdir(exist_ok=True)
    return str(tmp_path / "tier")


def published(tmp_path, name, data):
    """A file as the drain leaves it: the area's copy and the PFS's, with the same bytes and time."""
    local, pfs = tmp_path / "area" / name, tmp_path / "pfs" / name
    for p in (local, pfs):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    os.utime(pfs, ns=(0, os.stat(local).st_mtime_ns))
    return str(local), str(pfs)


def test_a_kept_copy_is_served_while_the_pfs_file_is_unchanged(tmp_path):
    kept = KeptWrites(tier(tmp_path), 1 << 20)
    local, pfs = published(tmp_path, "a", b"x" * 100)
    kept.keep(pfs, local)
    os.unlink(local)  # the drain lets the area's copy go: the kept one is a link of its own
    served = kept.lookup(pfs)
    assert served is not None and open(served, "rb").read() == b"x" * 100
    os.chmod(pfs, 0o600)  # any change of the PFS file moves its ctime
    assert kept.lookup(pfs) is None and kept.figures["stale"] == 1
    assert kept.lookup(pfs) is None  # dropped


def test_bytes_the_pfs_does_not_hold_are_not_kept(tmp_path):
    kept = KeptWrites(tier(tmp_path), 1 << 20)
    local, pfs = published(tmp_path, "a", b"x" * 100)
    with open(pfs, "ab") as f:
        f.write(b"more")
    kept.keep(pfs, local)
    assert kept.lookup(pfs) is None and kept.figures["kept_files"] == 0


def test_a_rename_is_followed_and_the_oldest_leave_the_room(tmp_path):
    kept = KeptWrites(tier(tmp_path), 250)
    local, pfs = published(tmp_path, "a.tmp", b"a" * 100)
    kept.keep(pfs, local)
    os.rename(pfs, pfs[:-4])
    kept.moved(pfs, pfs[:-4])
    assert kept.lookup(pfs) is None and kept.lookup(pfs[:-4]) is not None
    for name in ("b", "c"):
        local, p = published(tmp_path, name, name.encode() * 100)
        kept.keep(p, local)
    assert kept.lookup(pfs[:-4]) is None  # the oldest went: 300 bytes do not fit in 250
    assert kept.lookup(str(tmp_path / "pfs" / "c")) is not None
    kept.make_room(120)  # the job's own writes need the rest
    assert [p for p, _, _ in kept.listing()] == [str(tmp_path / "pfs" / "c")]


def test_a_store_past_its_linger_is_emptied_by_the_next_run_and_a_live_one_is_not_dropped(tmp_path):
    base = tier(tmp_path)
    kept = KeptWrites(base, 1 << 20, linger=0.0)
    local, pfs = published(tmp_path, "a", b"x" * 100)
    kept.keep(pfs, local)
    assert drop(base) == "in use by a running job"
    kept.close()
    time.sleep(0.01)
    assert describe(base)[1:3] == (1, 100)
    again = KeptWrites.made(base, 1 << 20, 600.0)
    assert again.lookup(pfs) is None and describe(base)[1] == 0
    again.close()
    assert drop(base) is None and not os.path.exists(store_path(base))


def test_a_store_that_kept_nothing_is_not_left_behind(tmp_path):
    base = tier(tmp_path)
    kept = KeptWrites(base, 10)
    local, pfs = published(tmp_path, "a", b"x" * 100)  # larger than the room
    kept.keep(pfs, local)
    kept.close()
    assert not os.path.exists(store_path(base))


class _Rec:
    """A drain's record, as ``follow`` is told it."""

    def __init__(self, n, op, **args):
        self.n, self.op, self.args = n, op, args

    def __getitem__(self, key):
        return self.args[key]


def test_the_drain_does_not_wait_for_the_store_and_a_rename_meanwhile_is_followed(tmp_path):
    """The drain tells the store and goes on (the copy linked at once, its PFS identity taken by the
    store's thread): a file renamed on the PFS before the store looked is kept under its new name,
    and its area copy may go at once."""
    kept = KeptWrites(tier(tmp_path), 1 << 20)
    local, pfs = published(tmp_path, "model.tmp", b"m" * 100)
    def the_drain():
        kept.follow(_Rec(1, "close", path=pfs), local)
        os.unlink(local)
        os.rename(pfs, pfs[:-4])
        kept.follow(_Rec(2, "rename", src=pfs, dst=pfs[:-4]), "")

    with kept._mu:  # the store's thread held back: the drain goes on without it
        drain = threading.Thread(target=the_drain)
        drain.start()
        drain.join(30)  # (a guard against a hang, not a measure)
        assert not drain.is_alive()
        assert kept.lookup(pfs[:-4]) is None  # (not yet looked at: the PFS's)
    kept.followed()
    served = kept.lookup(pfs[:-4])
    assert served is not None and open(served, "rb").read() == b"m" * 100 and kept.lookup(pfs) is None
    assert kept.figures["kept_files"] == 1
    assert [n for n in os.listdir(os.path.join(kept.path, "data")) if n.startswith(".")] == []  # no link left over


def test_an_index_with_a_rate_that_is_not_one_is_not_trusted(tmp_path):
    """A damaged index (a copy's rate a string): nothing of it is served, and a read never fails on it
    (the saved seconds are divided by it)."""
    kept = KeptWrites(tier(tmp_path), 1 << 20)
    local, pfs = published(tmp_path, "a", b"x" * 100)
    kept.keep(pfs, local)
    index = os.path.join(kept.path, "index.json")
    doc = json.load(open(index))
    doc[pfs]["rate"] = "fast"
    with open(index, "w") as f:
        json.dump(doc, f)
    again = KeptWrites(tier(tmp_path), 1 << 20)
    assert again.lookup(pfs) is None and again.rate_of(pfs) is None
