"""A manifest from a list of files the user already has (``monarch index --from-list LIST``):
one path a line, relative to the root (``./`` allowed, as ``find`` prints it) or absolute under
one of the roots, then optionally a TAB and its size in bytes::

    find /pfs/imagenet -type f -printf '%P\\t%s\\n' > imagenet.list

No file is stat'ed: its entry is left undescribed (as a listing-mode walk leaves it) and described
at its first open or stat from the PFS's own answer, so a stale list never serves a wrong byte or
stat: a listed name that is gone is answered by the PFS. A list need not be a directory's whole
listing (a split's files, a subset), so no directory is "listed whole": a name the list leaves out
is looked up on the PFS, and a directory's listing is the PFS's. Each directory is stat'ed once
(``CHECKERS`` at once), for the job's check that nothing changed since (``unchanged``). A size on
a line is the plan's until the file is described (the dataset's bytes, a compressed tier's level).
"""

from __future__ import annotations

import os
import re
import stat
from array import array

from monarch import protocol
from monarch.index_layout import pack, split_key
from monarch.errors import ConfigError
from monarch.node.snapshot.pfsmeta import lstats_under_roots

CHECKERS = 8  # directories stat'ed at once (snapshot.CHECKERS: a PFS's metadata servers answer several)
SAMPLE = 16   # listed files looked up when the manifest is made: a list of another root, or not of paths, is caught
_ENCODING, _ERRORS = "utf-8", "surrogateescape"
_BAD = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")  # an empty part, "." or "..": no path below a root


def read_list(path: str, roots: tuple[str, ...], spelled: tuple[str, ...] = ()) -> list[dict[str, int]]:
    """Per root, its listed files: relative path -> size (-1: none given); an absolute path may
    name its root as ``roots`` do (resolved) or as ``spelled`` (as the user gave them). Raises
    ConfigError naming the line of the first path that is not one (``..``, empty parts, outside
    every root) or whose size is not a number."""
    listed: list[dict[str, int]] = [{} for _ in roots]
    prefixes = [root.rstrip("/") + "/" for root in roots]
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ConfigError(f"monarch index: --from-list {path}: {e.strerror}; give the list's path") from None
    with f:
        lines = f.read().decode(_ENCODING, _ERRORS).split("\n")
    one = listed[0] if len(prefixes) == 1 else None
    for number, text in enumerate(lines, 1):
        name, tab, size_text = text.rstrip("\r").rpartition("\t")
        if not tab:
            name, size = size_text, -1
        elif size_text.isdigit():
            size = int(size_text)
        else:
            raise ConfigError(f"{path}:{number}: {size_text!r} after the TAB is not a size in bytes; write each "
                              f"line as PATH or PATH<TAB>SIZE (find ROOT -type f -printf '%P\\t%s\\n')")
        if one is not None and name and name[0] not in " ./" and not _BAD.search(name):
            one[name] = size  # the common line, at once
        elif name.strip():
            k, rel = _place(name, prefixes, f"{path}:{number}", spelled)
            listed[k][rel] = size
    if not any(listed):
        raise ConfigError(f"monarch index: --from-list {path} names no file; give a list of the dataset's files")
    return listed


def _place(name: str, prefixes: list[str], where: str, spelled: tuple[str, ...] = ()) -> tuple[int, str]:
    """The root (its number) and the path relative to it of a listed ``name``."""
    if name.startswith("/"):
        for k, prefix in [*enumerate(prefixes), *((k, s.rstrip("/") + "/") for k, s in enumerate(spelled))]:
            if name.startswith(prefix):
                return k, _relative(name[len(prefix):], name, where)
        raise ConfigError(f"{where}: {name} is under none of the roots ({', '.join(p[:-1] for p in prefixes)}); "
                          f"list the dataset's files, or give their root")
    if len(prefixes) > 1:
        raise ConfigError(f"{where}: {name} is relative, and {len(prefixes)} roots were given; write each path "
                          f"absolute, or make one list per root")
    return 0, _relative(name[2:] if name.startswith("./") else name, name, where)


def _relative(rel: str, name: str, where: str) -> str:
    if _BAD.search(rel):
        raise ConfigError(f"{where}: {name!r} is not a file's path below its root (an empty part, '.' or '..'); "
                          f"list files as find prints them")
    return rel


def build(roots: tuple[str, ...], listed: list[dict[str, int]], checkers: int = CHECKERS) -> tuple[bytearray, list[str]]:
    """The manifest's index (protocol.py, "Snapshot index"): the listed files undescribed (their
    sizes, if given, in their entries), then every directory above them as one stat found it,
    none listed whole; INDEX_LISTING in the header (served before its check, as a listing's).
    And the listed directories that are no directory on the PFS now (a stale list): their files
    are left out, so the PFS answers for them."""
    dirs: dict[tuple[int, str], None] = {}
    for k, files in enumerate(listed):
        dirs[(k, "")] = None
        for parent in {rel.rpartition("/")[0] for rel in files}:  # each directory once, then those above it
            while parent and (k, parent) not in dirs:
                dirs[(k, parent)] = None
                parent = parent.rpartition("/")[0]
    clash = next(((k, rel) for k, rel in dirs if rel and rel in listed[k]), None)
    if clash:
        raise ConfigError(f"the list names {roots[clash[0]]}/{clash[1]} as a file and as a directory above others; "
                          f"list files only")
    dir_stats, gone = _stat_dirs(roots, list(dirs), checkers)
    below = tuple(f"{k}/{rel}/" for k, rel in gone)  # a directory gone takes what the list names below it
    items = []
    for k, files in enumerate(listed):
        for rel, size in files.items():
            key = f"{k}/{rel}"
            if not below or not key.startswith(below):
                items.append((key.encode(_ENCODING, _ERRORS), size))
    if below:
        dir_stats = [(raw, st) for raw, st in dir_stats if not (raw.decode(_ENCODING, _ERRORS) + "/").startswith(below)]
    return _index(items, dir_stats), [f"{roots[k]}/{rel}" for k, rel in gone]


def _index(items: list[tuple[bytes, int]], dir_stats: list[tuple[bytes, os.stat_result]]) -> bytearray:
    """The index's bytes up to its used end: the files (key, size or -1) not described (their
    listed sizes), under every directory above them. index_layout.build_index's layout, built
    without its object per file."""
    by_dir: dict[bytes, list[tuple[bytes, int]]] = {raw: [] for raw, _ in dir_stats}
    for raw, size in items:
        parent, name = split_key(raw)
        mine = by_dir.get(parent)
        if mine is not None:  # else its root is no directory now: the PFS answers for it
            mine.append((name, size if size > 0 else 0))
    rows, counts, names, sizes = [], [], [], array("Q")
    for raw, st in sorted(dir_stats):
        mine = sorted(by_dir.pop(raw))
        counts.append(len(mine))
        names.extend(name for name, _ in mine)
        sizes.extend(size for _, size in mine)
        rows.append((raw, (st.st_size, st.st_mtime_ns, st.st_atime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                           st.st_mode, st.st_uid, st.st_gid, st.st_nlink), 0, st.st_blocks, st.st_blksize, None))
    return bytearray(b"".join(pack(rows, counts, names, sizes=sizes, reserved=protocol.INDEX_LISTING)))


def _stat_dirs(roots: tuple[str, ...], dirs: list[tuple[int, str]],
               checkers: int) -> tuple[list[tuple[bytes, os.stat_result]], list[tuple[int, str]]]:
    """Each directory's key and lstat (``checkers`` at once, relative to its root's descriptor),
    and those that are no directory on the PFS (gone, a file, a symlink: a path through a
    symlink is the PFS's to resolve)."""
    stats = lstats_under_roots(roots, dirs, checkers)
    found = [((f"{k}/{rel}" if rel else f"{k}/").encode(_ENCODING, _ERRORS), st)
             for (k, rel), st in zip(dirs, stats) if st is not None and stat.S_ISDIR(st.st_mode)]
    return found, sorted(item for item, st in zip(dirs, stats) if st is None or not stat.S_ISDIR(st.st_mode))


def sample_missing(roots: tuple[str, ...], listed: list[dict[str, int]], sample: int = SAMPLE) -> tuple[int, int, str]:
    """``sample`` listed files spread over the list looked up (lstat): how many were looked up,
    how many are not regular files there, and the first such path ("" if none)."""
    every = [(k, rel) for k, files in enumerate(listed) for rel in files]
    picked = every[::max(1, len(every) // sample)][:sample]
    missing, first = 0, ""
    for k, rel in picked:
        try:
            regular = stat.S_ISREG(os.lstat(os.path.join(roots[k], rel)).st_mode)
        except OSError:
            regular = False
        if not regular:
            missing += 1
            first = first or os.path.join(roots[k], rel)
    return len(picked), missing, first
