"""``monarch index``: a dataset's namespace written once for ``dataset.manifest``, listed from
the PFS as ``find`` lists it (``snapshot.write_manifest``) or taken from a list of files the user
already has (``from_list``)."""

from __future__ import annotations

import os
import sys
import time

from monarch import protocol
from monarch.errors import ConfigError, MonarchError
from monarch.node.snapshot import from_list
from monarch.node.snapshot.indextable import files_in, index_size, used_end
from monarch.node.snapshot.snapshot import write_manifest
from monarch.secure import write_file_atomically
from monarch.sizes import human

_NEXT = "give it to the jobs as dataset.manifest, with dataset.roots in this order"


def run(roots: list[str], out: str, sizes: bool = False, list_path: str | None = None) -> int:
    """The manifest of ``roots`` written to ``out``: walked (``sizes``: every file stat'ed too),
    or from ``list_path``. What was written, on stdout; bad input, a ConfigError that says how to fix it."""
    if bad := [root for root in roots if not os.path.isdir(root)]:
        raise ConfigError(f"monarch index: {bad[0]} is not a directory; give the dataset's roots, as dataset.roots lists them")
    real = tuple(os.path.realpath(root) for root in roots)  # as the configuration takes them: symlinks resolved
    where = os.path.dirname(os.path.abspath(out))
    if not os.access(where, os.W_OK | os.X_OK):  # said before a walk that may take minutes
        raise ConfigError(f"monarch index: -o {out}: cannot write in {where}; give a writable directory")
    t0 = time.monotonic()
    try:
        if list_path:
            return _from_list(real, tuple(roots), list_path, out, t0)
        snap = write_manifest(real, out, describe=sizes)
    except OSError as e:
        raise MonarchError(f"monarch index: cannot write {out}: {e.strerror or e}") from None
    print(f"{out}: {len(snap.files)} files, {len(snap.dirs)} directories, "
          f"{human(snap.total_bytes) if sizes else 'names only: each file stat-ed when a job opens it'} (walked in "
          f"{time.monotonic() - t0:.1f} s; {_held(out) / max(1, len(snap.files)):.0f} B a file); {_NEXT}")
    return 0


def _from_list(roots: tuple[str, ...], spelled: tuple[str, ...], list_path: str, out: str, t0: float) -> int:
    """The manifest from the user's list (its absolute paths under ``roots``, resolved, or as
    ``spelled``): one stat a directory, none a file; a few files looked up first, so that a list
    of another root, or not of paths, is said rather than written."""
    listed = from_list.read_list(list_path, roots, spelled)
    looked, missing, first = from_list.sample_missing(roots, listed)
    if missing == looked:
        raise ConfigError(f"monarch index: none of {looked} files sampled from {list_path} is a file under its root "
                          f"({first} is not); give the root the list's paths are relative to, one path a line")
    data, gone = from_list.build(roots, listed)
    write_file_atomically(out, [data], size=index_size(data))
    files = files_in(data)
    dirs = protocol.INDEX_HEADER.unpack_from(data)[16]
    if missing:
        print(f"monarch index: {missing} of {looked} files sampled from {list_path} are not there now "
              f"({first}): the PFS answers for them", file=sys.stderr)
    if gone:
        print(f"monarch index: {len(gone)} directories of {list_path} are no directory now ({gone[0]}): what the "
              f"list names below them is left out, the PFS answers for it", file=sys.stderr)
    print(f"{out}: {files} files, {dirs} directories from {list_path} (in {time.monotonic() - t0:.1f} s; one stat "
          f"a directory, none a file; {used_end(data) / max(1, files):.0f} B a file); {_NEXT}")
    return 0


def _held(path: str) -> int:
    """The bytes of the index file at ``path`` that hold something (the rest, the room for stats
    written as files are described, is sparse)."""
    with open(path, "rb") as f:
        return used_end(f.read(protocol.INDEX_HEADER.size))
