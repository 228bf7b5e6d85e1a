"""A manifest from a user's list (from_list.py): the list read with its line's errors said, and
the index made from it: every file undescribed with its listed size, every directory as one stat
found it and none listed whole, checked against the PFS as a manifest is."""

from __future__ import annotations

import os

import pytest

from monarch import protocol
from monarch.errors import ConfigError
from monarch.node.snapshot import from_list
from monarch.node.snapshot.indextable import index_size
from monarch.node.snapshot.snapshot import load_or_walk, read_index_file, unchanged
from monarch.secure import write_file_atomically


def _list(tmp_path, text: str) -> str:
    path = tmp_path / "files.list"
    path.write_text(text)
    return str(path)


def test_lines_are_paths_relative_or_absolute_with_sizes_optional(tmp_path):
    root = str(tmp_path / "data")
    listed = from_list.read_list(_list(tmp_path, f"./a/x.jpg\t12\nb/y z.jpg\n\n{root}/c/w.jpg\t0\na/x.jpg\t13\n"),
                                 (root,))
    assert listed == [{"a/x.jpg": 13, "b/y z.jpg": -1, "c/w.jpg": 0}]  # the last line of a name wins


@pytest.mark.parametrize("text, said", [
    ("a/x.jpg\tbig\n", ":1: 'big' after the TAB is not a size"),
    ("ok.jpg\na/../x.jpg\n", ":2: 'a/../x.jpg' is not a file's path below its root"),
    ("a//x.jpg\n", ":1: 'a//x.jpg'"),
    ("/elsewhere/x.jpg\n", ":1: /elsewhere/x.jpg is under none of the roots"),
    ("\n\n", "names no file"),
])
def test_a_bad_line_is_said_with_its_number_and_the_fix(tmp_path, text, said):
    with pytest.raises(ConfigError, match=None) as e:
        from_list.read_list(_list(tmp_path, text), (str(tmp_path / "data"),))
    assert said in str(e.value), str(e.value)


def test_an_absolute_path_may_spell_its_root_as_given_or_resolved(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    real, link = str(tmp_path / "real"), str(tmp_path / "link")
    text = f"{link}/a/x\n{real}/b/y\n"
    assert from_list.read_list(_list(tmp_path, text), (real,), (link,)) == [{"a/x": -1, "b/y": -1}]


def test_several_roots_want_absolute_paths(tmp_path):
    roots = (str(tmp_path / "r0"), str(tmp_path / "r1"))
    assert from_list.read_list(_list(tmp_path, f"{roots[1]}/a\n{roots[0]}/b/c\n"), roots) == [{"b/c": -1}, {"a": -1}]
    with pytest.raises(ConfigError, match="relative, and 2 roots were given"):
        from_list.read_list(_list(tmp_path, "a\n"), roots)


def _tree(root):
    for d in ("a", "a/b", "c"):
        os.makedirs(root / d, exist_ok=True)
    for rel in ("a/x", "a/b/y", "c/z", "c/unlisted"):
        (root / rel).write_bytes(rel.encode() * 3)


def test_the_index_holds_the_listed_files_undescribed_and_the_directories_above_them(tmp_path):
    root = tmp_path / "data"
    _tree(root)
    roots = (str(root),)
    data, gone = from_list.build(roots, from_list.read_list(_list(tmp_path, "a/x\t9\na/b/y\nc/z\t7\n"), roots))
    assert gone == []
    header = protocol.INDEX_HEADER.unpack_from(data)
    assert header[4] == protocol.INDEX_LISTING  # served before its check, as a listing walk's manifest is
    path = tmp_path / "m.index"
    write_file_atomically(str(path), [data], size=index_size(data))  # as `monarch index` writes it: its stats' room sparse
    assert len(data) < os.path.getsize(path) == index_size(data)
    snap = read_index_file(str(path), roots)
    assert sorted(snap.files) == ["0/a/b/y", "0/a/x", "0/c/z"] and snap.files.undescribed() == 3
    assert snap.total_bytes == 16  # the listed sizes, until the files are described
    assert sorted(snap.dirs) == ["0/", "0/a", "0/a/b", "0/c"]
    assert all(d.children is None for d in snap.dirs.values())  # no directory listed whole: other names are the PFS's
    st = os.stat(root / "a" / "b")
    assert (snap.dirs["0/a/b"].info.ino, snap.dirs["0/a/b"].info.mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert snap.files["0/c/z"].size == len(b"c/z" * 3)  # described from the PFS at its first need
    assert unchanged(snap, whole=False) and not unchanged(snap)
    (root / "c" / "new").write_bytes(b"n")
    assert not unchanged(snap, whole=False)


def test_a_directory_gone_since_the_list_takes_its_files_out(tmp_path):
    root = tmp_path / "data"
    _tree(root)
    roots = (str(root),)
    data, gone = from_list.build(roots, from_list.read_list(_list(tmp_path, "a/x\nq/r/s\nq/t\n"), roots))
    assert gone == [f"{root}/q", f"{root}/q/r"]
    path = tmp_path / "m.index"
    path.write_bytes(data)
    snap = read_index_file(str(path), roots)
    assert sorted(snap.files) == ["0/a/x"] and sorted(snap.dirs) == ["0/", "0/a"]


def test_a_job_takes_a_lists_manifest_as_a_manifest(tmp_path):
    root = tmp_path / "data"
    _tree(root)
    roots = (str(root),)
    path = tmp_path / "m.index"
    path.write_bytes(from_list.build(roots, from_list.read_list(_list(tmp_path, "a/x\nc/z\n"), roots))[0])
    snap, how = load_or_walk(roots, None, manifest=str(path), describe=False, check_later=False)
    assert how == "manifest" and sorted(snap.files) == ["0/a/x", "0/c/z"]
