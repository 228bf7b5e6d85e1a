"""The dataset snapshot: every managed file's key, size and mtime, from one tree walk.

A key is ``"<root index>/<path relative to that root>"`` (see monarch/protocol.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class FileInfo:
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Snapshot:
    roots: tuple[str, ...]
    files: dict[str, FileInfo]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def source_path(self, key: str) -> str:
        index, _, rel = key.partition("/")
        return os.path.join(self.roots[int(index)], rel)

    def get(self, key: str) -> FileInfo | None:
        return self.files.get(key)


def take_snapshot(roots: tuple[str, ...]) -> Snapshot:
    """Walk every root once (os.scandir: one stat per entry, no extra lookups)."""
    files: dict[str, FileInfo] = {}
    for index, root in enumerate(roots):
        stack = [root]
        while stack:
            directory = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue  # unreadable directory: its files stay on the PFS
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file():
                        st = entry.stat()
                        rel = os.path.relpath(entry.path, root)
                        files[f"{index}/{rel}"] = FileInfo(st.st_size, st.st_mtime_ns)
                except OSError:
                    continue
    return Snapshot(roots=tuple(roots), files=files)
