"""The tier remover (monarch/node/tiers/remover.c): a run's tier removed by a few threads in C,
every entry gone, nothing outside it touched through a symlink planted inside."""

from __future__ import annotations

import os

import pytest

from monarch.node.tiers import remover
pytestmark = pytest.mark.skipif(remover.library() is None, reason="the tier remover cannot be built here")


def make_tree(top: str, dirs: int, files: int) -> int:
    """``dirs`` directories of ``files`` files two levels deep, and some odd entries; the count."""
    n = 0
    for d in range(dirs):
        sub = os.path.join(top, "0", f"d{d}", "deeper" if d % 3 == 0 else "")
        os.makedirs(sub, exist_ok=True)
        for f in range(files):
            with open(os.path.join(sub, f"f{f}"), "wb") as out:
                out.write(b"x" * (f % 7))
            n += 1
    os.makedirs(os.path.join(top, "0", "empty", "dirs"))
    os.mkfifo(os.path.join(top, "0", "d1", "a-fifo"))
    with open(os.path.join(top, "top-file"), "wb") as out:
        out.write(b"y")
    return n


@pytest.mark.parametrize("threads", [1, 4])
def test_the_whole_tree_goes(tmp_path, threads):
    top = str(tmp_path / "tier")
    make_tree(top, dirs=40, files=50)
    assert remover.remove_tree(top, threads)
    assert not os.path.lexists(top)


def test_a_symlink_inside_is_removed_not_followed(tmp_path):
    top, outside = str(tmp_path / "tier"), tmp_path / "outside"
    make_tree(top, dirs=5, files=5)
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "keep.bin").write_bytes(b"keep")
    os.symlink(outside, os.path.join(top, "0", "d2", "link-to-dir"))
    os.symlink(outside / "sub" / "keep.bin", os.path.join(top, "0", "link-to-file"))
    os.rename(os.path.join(top, "0", "d4"), os.path.join(top, "0", "d4-moved"))
    os.symlink(outside, os.path.join(top, "0", "d4"))  # where a directory was: a link in its place
    assert remover.remove_tree(top)
    assert not os.path.lexists(top)
    assert (outside / "sub" / "keep.bin").read_bytes() == b"keep"


def test_a_missing_tree_is_gone_and_a_symlinked_top_is_not_followed(tmp_path):
    assert remover.remove_tree(str(tmp_path / "never-made"))
    target = tmp_path / "target"
    (target / "0").mkdir(parents=True)
    (target / "0" / "f").write_bytes(b"z")
    os.symlink(target, tmp_path / "top-link")
    assert not remover.remove_tree(str(tmp_path / "top-link"))  # not a directory of its own: left to Python
    assert (target / "0" / "f").read_bytes() == b"z"
