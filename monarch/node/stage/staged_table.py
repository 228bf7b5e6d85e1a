"""Which tier holds each staged file's complete copy (``StagedTable``, the stager's ``staged``):
one byte per file where the snapshot is an index.

A million staged files in a dict cost ~120 bytes each (a key string and a dict slot). Here a
file of an ``IndexTable`` snapshot costs one byte, at its entry's number (found by the
index's own look-up, the shim's), naming its tier by a small code (0: no copy). A key the
index does not hold, and every key of a snapshot that is no index (the Python walk's
``FileTable``, a store's manifest, a plain dict), is kept in a dict as before.
"""

from __future__ import annotations

import os
from typing import Iterator, MutableMapping, TypeVar

from monarch.node.snapshot.indextable import IndexTable

__all__ = ["StagedTable"]

T = TypeVar("T")  # a tier (``tiers.Tier``): any object, told apart by identity
_NONE = object()
_CODES = 255      # tiers one table tells apart by code (a node has a few); any more go to the dict


class StagedTable(MutableMapping[str, T]):
    """key -> the tier holding its copy, over the files of ``files`` (one byte per file of an
    IndexTable, a dict otherwise); a dict's interface (get, in, [], pop, items, copy, len)."""
    __slots__ = ("_index", "_codes", "_tiers", "_code_of", "_others", "_count")

    def __init__(self, files=None):
        self._index: IndexTable | None = files if isinstance(files, IndexTable) else None
        self._codes = bytearray(self._index.nfiles if self._index is not None else 0)  # by entry: a code
        self._tiers: list = [None]         # code -> tier
        self._code_of: dict[int, int] = {}  # id(tier) -> its code (a tier is never compared, only told apart)
        self._others: dict[str, T] = {}    # the keys the index does not hold
        self._count = 0                    # nonzero codes

    def _row(self, key: object) -> int | None:
        return self._index.row_of(key) if self._index is not None and isinstance(key, str) else None

    def _code(self, tier: T) -> int:
        """``tier``'s code, given it at first sight; 0 when every code is taken."""
        code = self._code_of.get(id(tier))
        if code is None:
            if len(self._tiers) > _CODES:
                return 0
            code = self._code_of[id(tier)] = len(self._tiers)
            self._tiers.append(tier)  # held: its id stays its own
        return code

    # -- the mapping ---------------------------------------------------------------------------
    def get(self, key: str, default=None):
        n = self._row(key)
        code = self._codes[n] if n is not None else 0
        if code:
            return self._tiers[code]
        return self._others.get(key, default) if self._others else default

    def __getitem__(self, key: str) -> T:
        tier = self.get(key, _NONE)
        if tier is _NONE:
            raise KeyError(key)
        return tier

    def __contains__(self, key: object) -> bool:
        n = self._row(key)
        return (n is not None and self._codes[n] != 0) or (bool(self._others) and key in self._others)

    def __setitem__(self, key: str, tier: T) -> None:
        n = self._row(key)
        if n is None:
            self._others[key] = tier
            return
        code = self._code(tier)
        self._count += (code != 0) - (self._codes[n] != 0)
        self._codes[n] = code
        if not code:
            self._others[key] = tier
        elif self._others:
            self._others.pop(key, None)  # (a key of the dict's while codes ran out)

    def set_row(self, n: int, tier: T) -> bool:
        """The file of index row ``n`` (from 0: the front door's entry number less one) is in
        ``tier``: booked with no look-up of its key. False if this table has no such row or no
        code left (the caller books it by key)."""
        code = self._code(tier) if 0 <= n < len(self._codes) else 0
        if not code:
            return False
        self._count += not self._codes[n]
        self._codes[n] = code
        return True

    def pop(self, key: str, default=_NONE):
        n = self._row(key)
        code = self._codes[n] if n is not None else 0
        if code:
            self._codes[n] = 0
            self._count -= 1
            return self._tiers[code]
        if default is _NONE:
            return self._others.pop(key)
        return self._others.pop(key, default)

    def __delitem__(self, key: str) -> None:
        self.pop(key)

    def __len__(self) -> int:
        return self._count + len(self._others)

    def _rows(self) -> Iterator[tuple[int, int]]:
        """(entry, code) of each file with a code, in the index's order."""
        if self._count:
            yield from ((n, c) for n, c in enumerate(self._codes) if c)

    def __iter__(self) -> Iterator[str]:
        key = self._index.key if self._index is not None else None
        for n, _ in self._rows():
            yield key(n)
        yield from list(self._others)

    def items(self) -> Iterator[tuple[str, T]]:  # type: ignore[override]
        key, tiers = (self._index.key if self._index is not None else None), self._tiers
        for n, code in self._rows():
            yield key(n), tiers[code]
        yield from list(self._others.items())

    def tiers_of(self, files) -> Iterator[T | None]:
        """The tier of each of ``files``' keys, in their order (None: no copy); read by rows
        when ``files`` is this table's index."""
        if files is not self._index or self._index is None:
            yield from (self.get(key) for key in files)
            return
        tiers, others, key = self._tiers, self._others, self._index.key
        for n, code in enumerate(self._codes):
            yield tiers[code] if code else others.get(key(n)) if others else None

    def keys_under(self, key: str) -> list[str]:
        """``key`` if it has a copy, and every key below it (``key`` a directory's)."""
        prefix = key.rstrip("/") + "/"
        out = [k for k in self._others if k == key or k.startswith(prefix)]
        n = self._row(key)
        if n is not None:  # a file of the index: none of its rows lies below it
            return out + [key] if self._codes[n] else out
        if self._count:
            index, raw = self._index, os.fsencode(key)
            raw_prefix = os.fsencode(prefix)
            for n, _ in self._rows():
                k = index.raw_key(n)
                if k == raw or k.startswith(raw_prefix):
                    out.append(index.key(n))
        return out

    def copy(self) -> "StagedTable[T]":
        """A table of the same copies, apart from this one from now on (a million files: a
        megabyte copied, no object per file)."""
        other: StagedTable[T] = StagedTable()
        other._copy_from(self)
        return other

    def _copy_from(self, table: "StagedTable[T]") -> None:
        self._index, self._codes = table._index, bytearray(table._codes)  # one step: a copy without the lock is whole
        self._count = len(self._codes) - self._codes.count(0)
        self._tiers, self._code_of, self._others = list(table._tiers), dict(table._code_of), dict(table._others)

    def __repr__(self) -> str:
        return f"StagedTable({len(self)} keys, {self._count} by index entry)"
