"""The job's view of its write-back paths: what it sees at once, what the journal holds, and what
the PFS holds once drained: the same as the same operations made directly (a differential test)."""

import errno
import os
import random

import pytest

from monarch.writeback.area import Area
from monarch.writeback.drain import drain
from monarch.writeback.journal import Journal, read
from monarch.writeback.marks import HEADER, Marks
from monarch.writeback.view import View
from support.writeback import RUN


@pytest.fixture
def view(tmp_path):
    base, pfs = tmp_path / "tier", tmp_path / "pfs"
    base.mkdir()
    pfs.mkdir()
    area = Area.create(str(base), RUN, 0)
    marks = Marks(str(tmp_path / "marks"), slots=1 << 12)
    v = View((str(pfs),), area, Journal(area.journal_path, durable=False), marks)
    v.pfs, v.marks = pfs, marks
    yield v
    area.release()


def write(view, path, data, mode=0o644):
    seq, local = view.create(str(path), mode)
    with open(local, "r+b") as f:
        f.truncate(0)
        f.write(data)
    view.close(seq)


def drained(view):
    out = drain(view.area, RUN, journal=view.journal, commit=view.applying)
    view.applied(out.upto)
    return out


def ops(view):
    records, _ = read(view.area.journal_path)
    return [(r.op, os.path.basename(r.args.get("path") or r.args.get("dst") or "")) for r in records
            if r.op != "applied"]


def test_a_save_then_rename_is_seen_at_once_and_published_in_order(view):
    pfs = view.pfs
    write(view, pfs / "model.pt.tmp", b"weights")
    view.rename(str(pfs / "model.pt.tmp"), str(pfs / "model.pt"))
    assert view.resolve(str(pfs / "model.pt"))[0] == "local"
    assert view.resolve(str(pfs / "model.pt.tmp")) == ("gone", None)
    assert view.listing(str(pfs)) == ["model.pt"]
    assert not (pfs / "model.pt").exists()  # nothing on the PFS before the drain
    assert ops(view) == [("close", "model.pt.tmp"), ("rename", "model.pt")]
    assert drained(view).complete
    assert os.listdir(pfs) == ["model.pt"] and (pfs / "model.pt").read_bytes() == b"weights"
    assert not view.pending() and view.resolve(str(pfs / "model.pt")) == ("pfs", str(pfs / "model.pt"))


def test_a_file_renamed_while_written_is_published_once_under_its_new_name(view):
    pfs = view.pfs
    seq, local = view.create(str(pfs / "a.tmp"), 0o600)
    view.rename(str(pfs / "a.tmp"), str(pfs / "a"))
    with open(local, "wb") as f:
        f.write(b"x" * 10)
    view.close(seq)
    assert ops(view) == [("close", "a")]
    drained(view)
    assert os.listdir(pfs) == ["a"] and os.stat(pfs / "a").st_mode & 0o777 == 0o600


def test_an_old_checkpoint_removed_after_a_new_one_goes_only_once_the_new_one_is_there(view):
    pfs = view.pfs
    (pfs / "old.pt").write_bytes(b"old")
    write(view, pfs / "new.pt", b"new")
    view.unlink(str(pfs / "old.pt"))
    assert view.resolve(str(pfs / "old.pt")) == ("gone", None) and (pfs / "old.pt").exists()
    assert view.listing(str(pfs)) == ["new.pt"]
    assert ops(view) == [("close", "new.pt"), ("unlink", "old.pt")]
    drained(view)
    assert os.listdir(pfs) == ["new.pt"]


def test_a_file_written_over_and_removed_before_its_close_removes_the_old_one_too(view):
    pfs = view.pfs
    (pfs / "f").write_bytes(b"old")
    seq, local = view.create(str(pfs / "f"), 0o644)  # truncated by the job: the old bytes are gone
    view.unlink(str(pfs / "f"))
    assert ops(view) == [("drop", ""), ("unlink", "f")]
    view.close(seq)  # nameless: nothing to publish
    drained(view)
    assert os.listdir(pfs) == []


def test_a_directory_written_then_renamed_into_place(view):
    """As Orbax saves: a temporary directory, its files, then the directory renamed."""
    pfs = view.pfs
    view.mkdir(str(pfs / "step_1.tmp"), 0o755)
    write(view, pfs / "step_1.tmp" / "a", b"A")
    seq, local = view.create(str(pfs / "step_1.tmp" / "b"), 0o644)
    view.rename(str(pfs / "step_1.tmp"), str(pfs / "step_1"))
    assert view.resolve(str(pfs / "step_1" / "a"))[0] == "local"
    assert view.listing(str(pfs / "step_1")) == ["a", "b"] and view.listing(str(pfs)) == ["step_1"]
    with open(local, "wb") as f:
        f.write(b"B")
    view.close(seq)  # its close names it where it is now
    drained(view)
    assert os.listdir(pfs) == ["step_1"] and sorted(os.listdir(pfs / "step_1")) == ["a", "b"]
    assert (pfs / "step_1" / "b").read_bytes() == b"B"


def test_the_errors_are_posix_ones(view):
    pfs = view.pfs
    write(view, pfs / "f", b"1")
    with pytest.raises(FileExistsError):
        view.create(str(pfs / "f"), 0o644, exclusive=True)
    with pytest.raises(FileNotFoundError):
        view.create(str(pfs / "nodir" / "f"), 0o644)
    view.mkdir(str(pfs / "d"), 0o755)
    write(view, pfs / "d" / "x", b"2")
    with pytest.raises(OSError) as e:
        view.rmdir(str(pfs / "d"))
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileNotFoundError):
        view.unlink(str(pfs / "nothing"))
    with pytest.raises(FileExistsError):
        view.mkdir(str(pfs / "f"), 0o755)


# -- the same operations made directly and through the view: the same tree ------------------------
NAMES = ("a", "b", "c", "d/a", "d/b", "e/a")


def _tree(root):
    out = {}
    for dp, dns, fns in os.walk(root):
        for n in dns:
            out[os.path.relpath(os.path.join(dp, n), root) + "/"] = None
        for n in fns:
            out[os.path.relpath(os.path.join(dp, n), root)] = open(os.path.join(dp, n), "rb").read()
    return out


@pytest.mark.parametrize("seed", [*range(60), 1224])  # 1224: a directory removed, made again, renamed
def test_random_operations_leave_the_pfs_as_the_same_operations_made_directly(view, tmp_path, seed):
    rng = random.Random(seed)
    direct = tmp_path / "direct"
    direct.mkdir()
    pfs = view.pfs
    for _ in range(30):
        op = rng.choice(("write", "write", "rename", "unlink", "mkdir", "rmdir", "drain"))
        a, b = rng.choice(NAMES + ("d", "e")), rng.choice(NAMES + ("d", "e"))
        data = rng.randbytes(rng.randrange(1, 64))
        for root, through in ((direct, None), (pfs, view)):
            pa, pb = str(root / a), str(root / b)
            try:
                if op == "write":
                    if through:
                        write(view, pa, data)
                    else:
                        with open(pa, "wb") as f:
                            f.write(data)
                elif op == "rename":
                    (view.rename if through else os.rename)(pa, pb)
                elif op == "unlink":
                    (view.unlink if through else os.unlink)(pa)
                elif op == "mkdir":
                    view.mkdir(pa, 0o755) if through else os.mkdir(pa, 0o755)
                elif op == "rmdir":
                    (view.rmdir if through else os.rmdir)(pa)
                elif op == "drain" and through:
                    assert drained(view).complete
                outcome = None
            except OSError as e:
                outcome = e.errno
            if through:
                assert outcome == expected, (op, a, b, outcome, expected)  # the same answer as directly
            else:
                expected = outcome
        for d in ("", "d", "e"):  # the job sees what a direct job sees
            listed = sorted(os.listdir(direct / d)) if (direct / d).is_dir() else None
            assert (view.listing(str(pfs / d)) if view._is_dir(str(pfs / d)) else None) == listed, (seed, d)
        assert_marked(view, [str(pfs / n) for n in NAMES + ("d", "e")])
    assert drained(view).complete
    assert _tree(pfs) == _tree(direct)
    assert not view.pending()
    assert not any(view.marks._map[HEADER.size:]), "a mark left after everything was drained"


def assert_marked(view, paths):
    """The shim asks for every path the view answers otherwise than the PFS (marks.py): the path or a
    directory above it is marked, and a directory whose listing differs is marked for its children."""
    for p in paths:
        above = [p] + [p.rsplit("/", k)[0] for k in range(1, p.count("/") - str(view.pfs).count("/") + 1)]
        marked = any(view.marks.marked(a) for a in above)
        if view.resolve(p) != ("pfs", p) or view.made_dir(p):
            assert marked, (p, view.resolve(p))
        if view._is_dir(p) and not marked and os.path.isdir(p):
            assert view.listing(p) == sorted(os.listdir(p)) or view.marks.marked(p, children=True), p


def test_a_file_renamed_after_its_close_is_found_at_every_step_of_its_drain(view):
    """The drain changes the PFS and the view together (``View.applying``): after each record, the
    job's names resolve to where the bytes are now (before, a closed file renamed since pointed at
    its local copy, removed once published: ENOENT until the rename was applied)."""
    pfs = view.pfs
    write(view, pfs / "m.tmp", b"weights" * 1000)
    view.rename(str(pfs / "m.tmp"), str(pfs / "m"))
    view.mkdir(str(pfs / "best"), 0o755)
    view.rename(str(pfs / "m"), str(pfs / "best" / "m"))
    seen = []

    def check(phase, rec):
        if phase == "applied":
            kind, where = view.resolve(str(pfs / "best" / "m"))
            with open(where, "rb") as f:
                seen.append((rec.op, f.read() == b"weights" * 1000))

    out = drain(view.area, RUN, journal=view.journal, step=check, commit=view.applying)
    assert out.complete and [ok for _, ok in seen] == [True] * 4, seen
    assert (pfs / "best" / "m").read_bytes() == b"weights" * 1000
