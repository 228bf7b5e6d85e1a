"""A file as the snapshot saw it (``FileInfo``), and the snapshot's files and listings kept
compact (``FileTable``, ``Listing``, a directory's ``DirInfo``): what the walk writes, a store's
manifest describes, and the daemon reads.

A million-file dataset kept as a dict of ``FileInfo`` tuples holds ~400 bytes of Python
objects per file beside its key (the tuple and one int object per field); here a file is
its key, one dict slot and 13 eight-byte integers. ``FileTable`` is a mapping of key ->
``FileInfo``: each look-up builds the tuple it returns (a few hundred ns), so code that
reads ``files[key].size`` is unchanged; the whole table is never materialised.
"""

from __future__ import annotations

import os
from array import array
from typing import Iterable, Iterator, Mapping, MutableMapping, NamedTuple, Sequence

_FIELDS = 13  # FileInfo's fields, in order; ``link`` kept as 0/1
_SIZE = 0
_UNSIGNED = (5, 6)  # st_ino and st_dev are unsigned 64-bit: kept as their two's complement
_WRAP = 1 << 64


def _row(info) -> list[int]:
    values = list(info)
    for i in _UNSIGNED:
        if values[i] >= 1 << 63:
            values[i] -= _WRAP
    return values


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
    blocks: int = 0
    blksize: int = 4096

    @classmethod
    def from_stat(cls, st: os.stat_result, link: bool = False) -> FileInfo:
        return cls(st.st_size, st.st_mtime_ns, st.st_mode, st.st_atime_ns, st.st_ctime_ns, st.st_ino,
                   st.st_dev, st.st_uid, st.st_gid, st.st_nlink, link, st.st_blocks, st.st_blksize)

    def same_content_as(self, st: os.stat_result) -> bool:
        """Does ``st`` describe the file this snapshot entry saw (size and mtime)?"""
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns


class FileTable(MutableMapping[str, FileInfo]):
    __slots__ = ("_rows", "_where")

    def __init__(self, items: Mapping[str, FileInfo] | Iterable[tuple[str, FileInfo]] = ()):
        self._rows = array("q")
        self._where: dict[str, int] = {}  # key -> row
        self.update(items)

    def __getitem__(self, key: str) -> FileInfo:
        return self._record(self._where[key])

    def _record(self, row: int) -> FileInfo:
        row *= _FIELDS
        f = self._rows[row:row + _FIELDS]
        ino, dev = f[5], f[6]
        return FileInfo(f[0], f[1], f[2], f[3], f[4], ino + _WRAP if ino < 0 else ino, dev + _WRAP if dev < 0 else dev,
                          f[7], f[8], f[9], bool(f[10]), f[11], f[12])

    def get(self, key: str, default=None):
        row = self._where.get(key)
        return default if row is None else self._record(row)

    def row_of(self, key: str) -> int | None:
        """``key``'s position in the table's order (its insertion), or None."""
        return self._where.get(key)

    def __setitem__(self, key: str, info: FileInfo) -> None:
        row = self._where.get(key)
        if row is None:
            self._where[key] = len(self._rows) // _FIELDS
            self._rows.extend(_row(info))
        else:
            self._rows[row * _FIELDS:(row + 1) * _FIELDS] = array("q", _row(info))

    def add_stat(self, key: str, st: os.stat_result, link: bool = False) -> None:
        """``self[key] = FileInfo.from_stat(st, link)``, without the record (the walk's path)."""
        if key in self._where:
            self[key] = FileInfo.from_stat(st, link)
            return
        ino, dev = st.st_ino, st.st_dev
        self._where[key] = len(self._rows) // _FIELDS
        self._rows.extend((st.st_size, st.st_mtime_ns, st.st_mode, st.st_atime_ns, st.st_ctime_ns,
                           ino - _WRAP if ino >= 1 << 63 else ino, dev - _WRAP if dev >= 1 << 63 else dev,
                           st.st_uid, st.st_gid, st.st_nlink, link, st.st_blocks, st.st_blksize))

    def __delitem__(self, key: str) -> None:
        raise TypeError("a snapshot's files are never removed")

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def update(self, other=(), /, **kw) -> None:
        pairs = other.items() if isinstance(other, Mapping) else other
        for key, info in pairs:
            self[key] = info

    def items(self):
        """(key, FileInfo) in insertion order, as a dict's."""
        for key, row in self._where.items():
            yield key, self._record(row)

    def values(self):
        return (info for _, info in self.items())

    def total_size(self) -> int:
        return sum(self._rows[_SIZE::_FIELDS])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and all(other.get(k) == v for k, v in self.items())

    def __repr__(self) -> str:
        return f"FileTable({len(self)} files)"

    def __reduce__(self):  # pickled compactly: keys in row order and the rows (a share crosses MPI)
        keys = [None] * len(self._where)
        for key, row in self._where.items():
            keys[row] = key
        return (_rebuild, (keys, self._rows.tobytes()))


def _rebuild(keys: list[str], rows: bytes) -> FileTable:
    table = FileTable()
    table._rows.frombytes(rows)
    table._where = {key: row for row, key in enumerate(keys)}
    return table


class Listing(Sequence[tuple[bytes, int, int]]):
    """One directory's listing, sorted: (name, d_type, d_ino) per entry, as a tuple of those
    would give them, kept as three packed buffers (a name cannot hold a NUL byte)."""
    __slots__ = ("_names", "_types", "_inos")

    def __init__(self, entries: Iterable[tuple[bytes, int, int]] = ()):
        names, types, inos = [], bytearray(), array("Q")
        for name, d_type, d_ino in entries:
            names.append(name)
            types.append(d_type)
            inos.append(d_ino)
        self._names = b"\0".join(names) if names else None
        self._types = bytes(types)
        self._inos = inos

    def __len__(self) -> int:
        return len(self._types)

    def __iter__(self) -> Iterator[tuple[bytes, int, int]]:
        if self._names is None:
            return iter(())
        return zip(self._names.split(b"\0"), self._types, self._inos)

    def __getitem__(self, i):  # an entry or a slice, as of the tuple (rare: listings are iterated)
        return tuple(self)[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Listing, tuple, list)):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Listing({len(self)} entries)"

    def __reduce__(self):
        return (Listing, (tuple(self),))


class DirInfo(NamedTuple):
    """A directory as the walk saw it: its own stat, its listing (names as bytes, with d_type
    and d_ino; None when it could not be listed whole) and the st_ino of its parent."""
    info: FileInfo
    children: Listing | tuple[tuple[bytes, int, int], ...] | None
    parent_ino: int = 0
