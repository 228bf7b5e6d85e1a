"""The snapshot's reuse across jobs: kept when no directory changed, walked again otherwise."""

from __future__ import annotations

import os
import time

from monarch.snapshot import load_or_walk, take_snapshot


def tree(root):
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "x.bin").write_bytes(b"x" * 5)
    (root / "a" / "b" / "y.bin").write_bytes(b"y" * 7)
    return (str(root),)


def test_reused_when_nothing_changed_and_walked_when_a_directory_did(tmp_path):
    roots = tree(tmp_path / "ds")
    cache = str(tmp_path / "kept.index")
    first, how = load_or_walk(roots, cache)
    assert how == "walked: no kept snapshot" and os.path.exists(cache)
    again, how = load_or_walk(roots, cache)
    assert how == "reused"
    assert (again.files, again.dirs, again.links) == (first.files, first.dirs, first.links)
    time.sleep(0.01)
    (tmp_path / "ds" / "a" / "b" / "new.bin").write_bytes(b"n")  # the directory's mtime moves
    third, how = load_or_walk(roots, cache)
    assert how == "walked: a directory changed since the kept snapshot"
    assert "0/a/b/new.bin" in third.files
    assert load_or_walk(roots, cache)[1] == "reused"


def test_fresh_walk_when_asked_and_damaged_file_is_not_trusted(tmp_path):
    roots = tree(tmp_path / "ds")
    cache = tmp_path / "kept.index"
    load_or_walk(roots, str(cache))
    assert load_or_walk(roots, str(cache), fresh=True)[1] == "walked: fresh walk asked"
    cache.write_bytes(b"garbage" * 20)
    snap, how = load_or_walk(roots, str(cache))
    assert how.startswith("walked: kept snapshot unreadable") and snap.files == take_snapshot(roots).files


def test_unreadable_directory_is_not_listed(tmp_path):
    roots = tree(tmp_path / "ds")
    snap = take_snapshot(roots)
    assert snap.dirs["0/"].children is not None and snap.dirs["0/a"].children is not None
    assert sorted(name for name, *_ in snap.dirs["0/a"].children) == [b"b", b"x.bin"]
