"""The snapshot's reuse across jobs: kept when no directory changed, walked again otherwise."""

from __future__ import annotations

import os
import time

from monarch.node.snapshot.snapshot import CHECKERS, load_or_walk, take_snapshot, unchanged, write_manifest


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


def test_a_manifest_is_read_instead_of_a_walk_while_no_directory_changed(tmp_path):
    """`monarch index`'s file: taken when no kept snapshot is, checked the same way; walked (and said
    why) once a directory changed, for other roots, or for a file it did not write."""
    roots = tree(tmp_path / "ds")
    manifest = str(tmp_path / "ds.index")
    made = write_manifest(roots, manifest)
    snap, how = load_or_walk(roots, None, manifest=manifest)
    assert how == "manifest" and (snap.files, snap.dirs) == (made.files, made.dirs)
    other = tree(tmp_path / "other")
    assert load_or_walk(other, None, manifest=manifest)[1].startswith("walked: a directory changed since the manifest")
    assert load_or_walk(roots, None, fresh=True, manifest=manifest)[1] == "walked: fresh walk asked"
    time.sleep(0.01)
    (tmp_path / "ds" / "a" / "new.bin").write_bytes(b"n")
    snap, how = load_or_walk(roots, None, manifest=manifest)
    assert how == f"walked: a directory changed since the manifest {manifest} was made: run `monarch index` again"
    assert "0/a/new.bin" in snap.files
    (tmp_path / "ds.index").write_bytes(b"garbage" * 20)
    assert load_or_walk(roots, None, manifest=manifest)[1].startswith(f"walked: the manifest {manifest} is not one")


def test_many_directories_are_checked_at_once_and_one_change_is_seen(tmp_path):
    root = tmp_path / "ds"
    for d in range(8 * CHECKERS):
        (root / f"d{d:03d}").mkdir(parents=True)
        (root / f"d{d:03d}" / "f").write_bytes(b"f")
    snap = take_snapshot((str(root),))
    assert unchanged(snap)
    time.sleep(0.01)
    (root / f"d{8 * CHECKERS - 1:03d}" / "g").write_bytes(b"g")  # the last directory the checkers reach
    assert not unchanged(snap)


def test_unreadable_directory_is_not_listed(tmp_path):
    roots = tree(tmp_path / "ds")
    snap = take_snapshot(roots)
    assert snap.dirs["0/"].children is not None and snap.dirs["0/a"].children is not None
    assert sorted(name for name, *_ in snap.dirs["0/a"].children) == [b"b", b"x.bin"]


def test_the_parallel_walk_finds_what_one_thread_finds(tmp_path):
    """Threads list directories and stat slices of a large one at once: the same snapshot,
    index bytes included, as one thread's walk, with links, an unreadable directory and a
    directory larger than one slice."""
    from monarch.node.snapshot import snapshot
    roots = tree(tmp_path / "ds")
    big = tmp_path / "ds" / "big"
    big.mkdir()
    for i in range(3 * snapshot.WALK_CHUNK + 5):
        (big / f"f{i:04d}").write_bytes(b"z" * (i % 7))
    (tmp_path / "ds" / "link.bin").symlink_to(tmp_path / "ds" / "a" / "x.bin")
    (tmp_path / "ds" / "dirlink").symlink_to(tmp_path / "ds" / "a")
    (tmp_path / "ds" / "broken").symlink_to(tmp_path / "nowhere")
    closed = tmp_path / "ds" / "closed"
    closed.mkdir()
    (closed / "secret").write_bytes(b"s")
    closed.chmod(0)
    try:
        one = take_snapshot(roots + (str(tmp_path / "missing"),), threads=1)
        many = take_snapshot(roots + (str(tmp_path / "missing"),), threads=8)
    finally:
        closed.chmod(0o700)
    def same_but_atime(snap):  # listing a directory moves its atime between the two walks
        return {k: d._replace(info=d.info._replace(atime_ns=0)) for k, d in snap.dirs.items()}
    assert (many.files, same_but_atime(many), many.links) == (one.files, same_but_atime(one), one.links)
    assert len(many.files) >= 3 * snapshot.WALK_CHUNK + 5 + 3  # + closed/secret when run as root
    assert many.dirs["0/big"].children is not None and len(many.dirs["0/big"].children) == 3 * snapshot.WALK_CHUNK + 5
    assert len(many.index_bytes()) == len(one.index_bytes())
