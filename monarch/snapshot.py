"""The dataset snapshot: every managed file's key and its source's ``stat``, from one tree walk.

A key is ``"<root index>/<path relative to that root>"`` (see monarch/protocol.py), decoded
with ``os.fsdecode`` so that any name the filesystem allows (newlines, non-UTF-8 bytes,
255-byte names) is a key. The snapshot is the job's view of the dataset: what the
stager checks a source against before copying it, and what ``fstat`` of a staged copy
reports (through the index the shim maps).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from monarch import protocol
from monarch.secure import write_file_atomically


class FileInfo(NamedTuple):
    """The source's stat as the snapshot saw it (the fields the index carries)."""
    size: int
    mtime_ns: int
    mode: int = 0o100644
    atime_ns: int = 0
    ctime_ns: int = 0
    ino: int = 0
    dev: int = 0
    uid: int = 0
    gid: int = 0
    nlink: int = 1
    link: bool = False  # the name is a symlink (to a file): an O_NOFOLLOW open of it fails

    @classmethod
    def from_stat(cls, st: os.stat_result, link: bool = False) -> "FileInfo":
        return cls(st.st_size, st.st_mtime_ns, st.st_mode, st.st_atime_ns, st.st_ctime_ns, st.st_ino,
                   st.st_dev, st.st_uid, st.st_gid, st.st_nlink, link)

    def same_content_as(self, st: os.stat_result) -> bool:
        """Does ``st`` describe the file this snapshot entry saw (size and mtime)?"""
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns


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

    def write_index(self, path: str) -> None:
        """The index the shim maps (protocol.py, "Snapshot index"), written atomically."""
        write_file_atomically(path, protocol.build_index(
            (protocol.key_bytes(key), info) for key, info in self.files.items()))


def take_snapshot(roots: tuple[str, ...]) -> Snapshot:
    """Walk every root once (os.scandir: one stat per entry, no extra lookups).

    Directories are not followed through symlinks (their files are not the root's); a
    symlink to a file is the file the kernel would open.
    """
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
                        rel = os.path.relpath(entry.path, root)
                        files[f"{index}/{rel}"] = FileInfo.from_stat(entry.stat(), entry.is_symlink())
                except OSError:
                    continue
    return Snapshot(roots=tuple(roots), files=files)
