"""The peer plane's map (``monarch/cluster/__init__.py``'s docstring) names every file of the plane,
wherever it lives, and names no file that is gone: a file added to the plane without a line
in the map, or one moved or removed with its line left, fails here. The other rooms that hold
pieces of it point back to the map."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import monarch
from monarch import cluster

PACKAGE = Path(monarch.__file__).parent
CLUSTER = PACKAGE / "cluster"
# the plane's files outside monarch/cluster/, by pattern relative to monarch/
ELSEWHERE = ("node/peer/*.py", "node/doorkeeper/peer_door_link.py", "frontdoor/door_peer*.c", "native/datapath.h")
# the rooms holding pieces of the plane, whose own maps point to this one
POINTING_BACK = ("node/peer/__init__.py", "node/doorkeeper/__init__.py", "frontdoor/__init__.py")
SOURCE_SUFFIXES = (".py", ".c", ".h")


def plane_files(package: Path = PACKAGE) -> list[str]:
    """The plane's files as the map names them: ``monarch/cluster/``'s by name, the others by
    their path under monarch/ (no ``__init__.py``: a package's own map is not a piece)."""
    here = [p.name for p in sorted((package / "cluster").iterdir())
            if p.is_file() and p.suffix in SOURCE_SUFFIXES and p.name != "__init__.py"]
    there = [str(p.relative_to(package)) for pattern in ELSEWHERE for p in sorted(package.glob(pattern))
             if p.name != "__init__.py"]
    return here + there


def named(doc: str) -> set[str]:
    """The source files the map names (in double backquotes): ``monarch/cluster/``'s by name,
    the others by their path under monarch/."""
    return {m for m in re.findall(r"``([\w/.]+)``", doc) if m.endswith(SOURCE_SUFFIXES)}


def where(name: str, package: Path = PACKAGE) -> Path:
    return package / ("cluster" if "/" not in name else "") / name


def unmapped(doc: str, package: Path = PACKAGE) -> tuple[list[str], list[str]]:
    """(the plane's files the map does not name, the files it names that do not exist)."""
    missing = [f for f in plane_files(package) if f"``{f}``" not in doc]
    gone = sorted(n for n in named(doc) if not where(n, package).is_file())
    return missing, gone


def test_the_map_names_every_file_of_the_peer_plane_and_no_file_that_is_gone():
    doc = cluster.__doc__ or ""
    files = plane_files()
    assert {"datapath.c", "native/datapath.h", "peer.py", "node/peer/peer_cache.py", "frontdoor/door_peer.c",
            "node/doorkeeper/peer_door_link.py"} <= set(files)
    assert "node/resolver.py" in named(doc)  # a piece used by the plane, owned by another room
    assert unmapped(doc) == ([], [])


def test_a_file_added_to_the_plane_without_a_line_in_the_map_is_found(tmp_path):
    """A copy of the tree the map names, then a new file in each place the plane covers."""
    doc = cluster.__doc__ or ""
    for name in named(doc) | set(plane_files()):
        where(name, tmp_path).parent.mkdir(parents=True, exist_ok=True)
        where(name, tmp_path).write_text("")
    assert unmapped(doc, tmp_path) == ([], [])
    for new in ("cluster/gossip.py", "cluster/datapath_batches.c", "node/peer/replicas.py",
                "node/doorkeeper/peer_door_link.py", "frontdoor/door_peer_told.c"):
        existed = (tmp_path / new).exists()
        (tmp_path / new).write_text("")
        missing, _ = unmapped(doc.replace(f"``{new}``", "``gone``") if existed else doc, tmp_path)
        assert missing == [new.removeprefix("cluster/")], new
        if not existed:
            (tmp_path / new).unlink()
    (tmp_path / "cluster" / "lost.py").unlink()  # gone, its line left
    assert unmapped(doc, tmp_path) == ([], ["lost.py"])


def test_the_rooms_holding_pieces_of_the_plane_point_to_its_map():
    for rel in POINTING_BACK:
        doc = ast.get_docstring(ast.parse((PACKAGE / rel).read_text())) or ""
        assert "monarch/cluster/__init__.py" in doc, rel
