"""A snapshot's files read straight from its index (``IndexTable``): the index the shim maps
is the daemon's table too, with no Python object per file.

A million-file dataset in a ``FileTable`` still holds a key string and a dict slot per file
(~250 bytes beside its 104 bytes of fields); here a file is its 8-byte record and its name's
bytes, and once it is described its short stat beside its directory's shape (8
bytes, and 8 a time of its own; a 112-byte stat where it differs from the shape in more); a look-up
is the shim's: its directory's key's CRC-32 and linear probing in the index's buckets (only the
directories have one), then a binary search of that directory's names. The C walk (``walker.c``) and a kept
index (``snapshot.read_index``) both give one without building anything per file.

The index is the whole snapshot's (its files, directories and links), so the daemon writes
it as it is (``index_writer.index_parts``). It changes by the stats written as files are
described (``put_stat``; ``index_writer.Describer``), by ``remap_devices`` (a snapshot received
from another node), which patches every stat in place, and by the routes published in its files'
stats (``index_writer.stamp_routes``, read by ``route``); a file cannot be added.
"""

from __future__ import annotations

import bisect
import heapq
import os
import stat
import struct
import sys
import zlib
from typing import Callable, Iterator, MutableMapping, Sequence

from monarch import protocol
from monarch.protocol import DT_LNK, DT_REG
from monarch.index_layout import (AFFIX, affixes_off, check_tables, first_bucket, short_entry, short_words,
                                  undescribed_view)
from monarch.records.filetable import FileInfo, Listing
from monarch.routes import Route

_ENTRY = protocol.INDEX_ENTRY
_CHILD = protocol.INDEX_CHILD
_SIZE = _ENTRY.size
_FILE = protocol.INDEX_FILE.size
_HEAD = struct.Struct("<IIQ")     # an entry's hash, key length, key offset
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_STAT_AT = 4                      # a file record's stat slot (u32), after its name's offset
_FIRST_AT = 104                   # a stat's last field: its file's number
_WORDS = _SIZE // 8               # a stat's u64 words
_FLAGS_AT = 80                    # an entry's flags (u32)
# INDEX_HEADER's fields: files, stats used, files' and stats' offsets, size, directories, names' size,
# the offsets of the ranges, the sizes and the inodes
_H_FILES, _H_USED, _H_FILES_OFF, _H_STATS_OFF, _H_SIZE, _H_DIRS, _H_NAMES = 11, 12, 13, 14, 15, 16, 18
_H_RANGES, _H_SIZES, _H_INOS, _H_SHORTS = 19, 20, 21, 17
_STATS_USED_AT = 76               # the header's stats used (u32)
_SHORTS_USED_AT = 108             # the header's shorts used (u32: words)
_MODE = struct.Struct("<I")       # at offset _MODE_AT of an entry
_MODE_AT = 64
_DEV_AT = 56                      # st_dev, u64
_DEV = struct.Struct("<Q")
_ENCODING = sys.getfilesystemencoding()
_ERRORS = sys.getfilesystemencodeerrors()


def _info(e: tuple) -> FileInfo:
    """The FileInfo of an INDEX_ENTRY tuple."""
    return FileInfo(e[3], e[4], e[9], e[5], e[6], e[7], e[8], e[10], e[11], e[12],
                    bool(e[13] & protocol.INDEX_FLAG_SYMLINK), e[15], e[16])


class IndexTable(MutableMapping[str, FileInfo]):
    """The files of an index (its entries 0 .. ``nfiles`` - 1) as a mapping key -> FileInfo,
    with ``FileTable``'s extras (``row_of``, ``total_size``). Entry n (from 0) is number n + 1.
    Read in place through views of its tables; the directories' key prefixes and file ranges
    (a few per thousand files) are kept as Python objects for the look-ups."""
    __slots__ = ("data", "nfiles", "total", "ndirs", "_buckets", "_nbuckets", "_files", "_fixed", "_stats", "_keys",
                 "_names_size", "_sizes", "_inos", "_one_ino", "_view", "_recs", "_stat_words", "_shorts", "_starts", "_dir_keys",
                 "_prefixes", "_affixes", "describer")

    def __init__(self, data: bytearray | bytes, nfiles: int | None = None,
                 describer: Callable[["IndexTable", int], bool] | None = None):
        check_tables(data)
        header = protocol.INDEX_HEADER.unpack_from(data)
        if nfiles is not None and nfiles != header[_H_FILES]:
            raise ValueError(f"an index of {header[_H_FILES]} files, not {nfiles}")
        self.nfiles = header[_H_FILES]
        self.total = header[2]
        self.ndirs = header[_H_DIRS]
        self._nbuckets = header[3]
        self._files, self._fixed, self._stats, self._keys = header[_H_FILES_OFF], header[6], header[_H_STATS_OFF], header[7]
        self._names_size, self._sizes, self._inos = header[_H_NAMES], header[_H_SIZES], header[_H_INOS]
        self._one_ino = bool(header[4] & protocol.INDEX_INOS_ONE)  # the inodes table: one u64, every file's
        ranges = header[_H_RANGES]
        self._starts = list(memoryview(data).cast("B")[ranges:ranges + 4 * (self.ndirs + 1)].cast("I"))
        self.rebind(data)
        self._dir_keys = []
        for d in range(self.nfiles, self.nfiles + self.ndirs):
            _, length, offset = _HEAD.unpack_from(data, self._fixed + _SIZE * (d - self.nfiles))
            self._dir_keys.append(bytes(data[self._keys + offset:self._keys + offset + length]))
        # a file's key begins with its directory's, "/" after it unless it ends with one (a root's)
        self._prefixes = [key if key.endswith(b"/") else key + b"/" for key in self._dir_keys]
        # its name: its directory's files' common prefix, its middle (its own bytes), their common suffix
        self._affixes = []
        for j in range(self.ndirs):
            a, p, s = AFFIX.unpack_from(data, affixes_off(ranges, self.ndirs) + AFFIX.size * j)
            self._affixes.append((bytes(data[self._keys + a:self._keys + a + p]),
                                  bytes(data[self._keys + a + p:self._keys + a + p + s])))
        # a listing-mode walk's files are described when first asked for (index_writer.Describer)
        self.describer = describer

    def rebind(self, data) -> None:
        """The same index read from ``data`` from now on (Snapshot.rebind)."""
        header = protocol.INDEX_HEADER.unpack_from(data)
        view = memoryview(data).cast("B")
        self._view = view
        self._buckets = view[header[5]:header[5] + 4 * header[3]].cast("I")
        self._recs = view[self._files:self._files + _FILE * self.nfiles].cast("I")  # name offset, stat slot
        end = min(len(view), self._stats + _SIZE * self.nfiles)  # a copy may stop at the used end
        self._stat_words = view[self._stats:self._stats + max(end - self._stats, 0) // _SIZE * _SIZE].cast("Q")
        shorts = self._stats - 8 * protocol.INDEX_SHORT_ROOM * self.nfiles  # read only where a record names one
        self._shorts = view[shorts:self._stats].cast("Q") if len(view) >= self._stats else None
        self.data = data

    # -- the entries ---------------------------------------------------------------------
    def stat_at(self, n: int) -> int:
        """Where file ``n``'s (from 0) stat is (an offset in ``data``), or -1 while it is not
        described (a slot whose stat does not name the file back, as a copy made while it was
        written may hold, is none; DESCRIBING is above every slot)."""
        s = self._recs[2 * n + 1]
        if 0 < s <= self.nfiles:
            last = _WORDS * s - 1  # the slot's last word: its file's number
            if last < len(self._stat_words) and self._stat_words[last] == n + 1:
                return self._stats + _SIZE * (s - 1)
        return -1

    def short(self, n: int) -> tuple | None:
        """File ``n``'s (from 0) stat as INDEX_ENTRY's fields from its short stat and its directory's
        shape, if its record names a short stat and both are whole; else None."""
        s, shorts, nfiles = self._recs[2 * n + 1], self._shorts, self.nfiles
        if s <= nfiles or s == protocol.INDEX_DESCRIBING or shorts is None:
            return None
        k = s - nfiles - 1
        words = shorts[k:k + 4]
        if not words or short_words(words[0]) > len(words):
            return None
        j = bisect.bisect_left(self._starts, n + 1) - 1
        shape = _ENTRY.unpack_from(self.data, self._stats - 8 * len(shorts) - _SIZE * (self.ndirs - j))
        off, length = self._name_span(n)
        return short_entry(shape, words, length, off, n + 1)

    def is_described(self, n: int) -> bool:
        """Has file ``n`` (from 0) its stat (in a slot or a short stat)?"""
        return self.stat_at(n) >= 0 or self.short(n) is not None

    def _name(self, n: int, j: int | None = None) -> bytes:
        """File ``n``'s (from 0) name, whole (``j``: its directory, from 0, if known)."""
        if j is None:
            j = bisect.bisect_left(self._starts, n + 1) - 1
        off, length = self._name_span(n)
        prefix, suffix = self._affixes[j]
        return prefix + self._view[self._keys + off:self._keys + off + length] + suffix

    def _name_span(self, n: int) -> tuple[int, int]:
        """File ``n``'s (from 0) name: its offset and length in the key bytes."""
        recs = self._recs
        start = recs[2 * n]
        end = recs[2 * n + 2] if n + 1 < self.nfiles else self._names_size
        return start, max(end - start, 0)

    def listed_size(self, n: int) -> int:
        """File ``n``'s (from 0) size as its index lists it (0 without the sizes)."""
        return _U64.unpack_from(self.data, self._sizes + 8 * n)[0] if self._sizes else 0

    def entry(self, n: int) -> tuple:
        """Entry ``n`` (from 0) as INDEX_ENTRY's fields (a file not described yet: ``undescribed_view``)."""
        if n >= self.nfiles:
            return _ENTRY.unpack_from(self.data, self._fixed + _SIZE * (n - self.nfiles))
        at = self.stat_at(n)
        if at >= 0:
            return _ENTRY.unpack_from(self.data, at)
        short = self.short(n)
        if short is None:
            off, length = self._name_span(n)
            return undescribed_view(length, off, self.listed_size(n))
        return short

    def files_of(self, d: int) -> range:
        """The files (from 0) of directory entry ``d`` (from 0)."""
        j = d - self.nfiles
        return range(self._starts[j], self._starts[j + 1])

    def raw_key(self, n: int) -> bytes:
        if n < self.nfiles:
            j = bisect.bisect_left(self._starts, n + 1) - 1
            return self._prefixes[j] + self._name(n, j)
        if n >= self.nfiles + self.ndirs:  # a link record: its file's
            return self.raw_key(_U64.unpack_from(self.data, self._fixed + _SIZE * (n - self.nfiles) + _FIRST_AT)[0] - 1)
        return self._dir_keys[n - self.nfiles]

    def route(self, n: int) -> Route | None:
        """The route published for entry ``n`` (from 0; ``protocol.INDEX_ROUTE_MASK``), or None."""
        bits = (self.entry(n)[13] & protocol.INDEX_ROUTE_MASK) >> protocol.INDEX_ROUTE_SHIFT
        return Route(bits - 1) if bits else None

    def key(self, n: int) -> str:
        return self.raw_key(n).decode(_ENCODING, _ERRORS)

    def is_dir(self, n: int) -> bool:
        return n >= self.nfiles and stat.S_ISDIR(
            _MODE.unpack_from(self.data, self._fixed + _SIZE * (n - self.nfiles) + _MODE_AT)[0])

    def number(self, raw: bytes) -> int:
        """The entry (from 0) keyed ``raw`` (a file's or a directory's), or -1: a file's by its
        directory's key and a binary search of that directory's names (in their bytewise order),
        else a directory's by its bucket."""
        cut = raw.rfind(b"/") + 1
        if 1 < cut < len(raw) and raw[cut - 2] != 0x2F:  # "a//b" names no file
            parent = raw[:cut - 1]
            d = self._dir_number(parent if b"/" in parent else raw[:cut])  # a root's file: "<k>/"
            if d >= 0:
                n = self._find_in(d - self.nfiles, raw[cut:])
                if n >= 0:
                    return n
        return self._dir_number(raw)

    def _find_in(self, j: int, name: bytes) -> int:
        """File ``name``'s entry (from 0) in directory ``j`` (from 0), or -1."""
        prefix, suffix = self._affixes[j]
        if len(name) <= len(prefix) + len(suffix) or not name.startswith(prefix) or not name.endswith(suffix):
            return -1
        rest = name[len(prefix):]  # its middle and the suffix: the order of the directory's names
        lo, hi = self._starts[j], self._starts[j + 1]
        view, keys = self._view, self._keys
        while lo < hi:
            n = (lo + hi) // 2
            off, length = self._name_span(n)
            here = bytes(view[keys + off:keys + off + length]) + suffix
            if here == rest:
                return n
            if rest < here:
                hi = n
            else:
                lo = n + 1
        return -1

    def _dir_number(self, raw: bytes) -> int:
        """The entry (from 0) of directory ``raw``, or -1: the shim's look-up, the key's CRC-32 then
        linear probing in the buckets (bounded: a table with no empty bucket ends the search too)."""
        nbuckets, buckets, nfiles = self._nbuckets, self._buckets, self.nfiles
        b = first_bucket(zlib.crc32(raw), nbuckets)
        for _ in range(nbuckets):
            n = buckets[b]
            if n <= nfiles or n > nfiles + self.ndirs:
                return -1
            if self._dir_keys[n - 1 - nfiles] == raw:
                return n - 1
            b = b + 1 if b + 1 < nbuckets else 0
        return -1

    def used_end(self) -> int:
        """Where the stats written so far end: the bytes a copy of the index needs (the rest are zeros)."""
        return min(used_end(self.data), len(self.data))

    def remap_devices(self, remap: dict[int, int]) -> None:
        """Every entry's st_dev through ``remap`` (another node's device numbers -> ours)."""
        fixed = [self._fixed + _SIZE * n for n in range(self.total - self.nfiles)]
        shapes = self._stats - 8 * protocol.INDEX_SHORT_ROOM * self.nfiles - _SIZE * self.ndirs
        ready = [at for at in range(shapes, shapes + _SIZE * self.ndirs, _SIZE)  # (their files' short stats follow)
                 if at + _SIZE <= len(self.data) and _U32.unpack_from(self.data, at)[0] == protocol.INDEX_SHAPE_READY]
        stats = range(self._stats, self.used_end(), _SIZE)
        for at in (*fixed, *ready, *stats):
            dev = _DEV.unpack_from(self.data, at + _DEV_AT)[0]
            if dev in remap:
                _DEV.pack_into(self.data, at + _DEV_AT, remap[dev])

    def listing(self, d: int, lo: int, hi: int) -> Iterator[tuple[bytes, int, int]]:
        """Directory entry ``d``'s (from 0) listing, "." and ".." aside: its child records ``lo`` to
        ``hi`` and its files, as (name, d_type, d_ino), in bytewise order of their names."""
        data = self.data
        header = protocol.INDEX_HEADER.unpack_from(data)
        children = header[9]
        others = []
        for i in range(lo, hi):
            d_ino, off, _, nlen, d_type, _ = _CHILD.unpack_from(data, children + _CHILD.size * i)
            others.append((bytes(data[self._keys + off:self._keys + off + nlen]), d_type, d_ino))
        files = []
        for n in self.files_of(d):
            at = self.stat_at(n)
            link = at >= 0 and _U32.unpack_from(data, at + _FLAGS_AT)[0] & protocol.INDEX_FLAG_SYMLINK
            files.append((bytes(self._name(n, d - self.nfiles)), DT_LNK if link else DT_REG,
                          _U64.unpack_from(data, self._inos + (0 if self._one_ino else 8 * n))[0] if self._inos else 0))
        return heapq.merge(others, files)

    # -- the mapping -----------------------------------------------------------------------
    def row_of(self, key: str) -> int | None:
        """``key``'s position among the files (its entry), or None."""
        n = self.number(os.fsencode(key))
        return n if 0 <= n < self.nfiles else None

    def described(self, n: int) -> tuple | None:
        """File entry ``n``'s fields, described now if a listing-mode walk left it undescribed;
        None if it cannot be (gone, no longer a regular file, nothing to describe it with)."""
        if self.is_described(n):
            return self.entry(n)
        if self.describer is None or not self.describer(self, n):
            return None
        return self.entry(n) if self.is_described(n) else None

    def __getitem__(self, key: str) -> FileInfo:
        n = self.row_of(key)
        e = None if n is None else self.described(n)
        if e is None:
            raise KeyError(key)
        return _info(e)

    def get(self, key: str, default=None):
        n = self.row_of(key)
        e = None if n is None else self.described(n)
        return default if e is None else _info(e)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.row_of(key) is not None

    def __setitem__(self, key: str, info: FileInfo) -> None:
        n = self.row_of(key)
        if n is None:
            raise TypeError("an index's files are fixed: no file can be added")
        fields = (info.size, info.mtime_ns, info.atime_ns, info.ctime_ns, info.ino, info.dev, info.mode,
                  info.uid, info.gid, info.nlink, info.blocks, info.blksize)
        if put_stat(self, n, fields, 0) < 0:
            raise ValueError("the index has no room for another file's stat")

    def __delitem__(self, key: str) -> None:
        raise TypeError("a snapshot's files are never removed")

    def __iter__(self) -> Iterator[str]:
        view, recs, keys, starts, nfiles = self._view, self._recs, self._keys, self._starts, self.nfiles
        for j, prefix in enumerate(self._prefixes):
            before, after = self._affixes[j]
            for n in range(starts[j], starts[j + 1]):
                end = recs[2 * n + 2] if n + 1 < nfiles else self._names_size
                yield (prefix + before + view[keys + recs[2 * n]:keys + end] + after).decode(_ENCODING, _ERRORS)

    def items(self):
        """Every file as the index holds it now: one not described yet has only its key, S_IFREG
        and its listed size or 0 (``undescribed`` counts them; ``get`` describes one)."""
        for n, key in enumerate(self):
            yield key, _info(self.entry(n))

    def values(self):
        return (_info(self.entry(n)) for n in range(self.nfiles))

    def __len__(self) -> int:
        return self.nfiles

    def undescribed(self) -> int:
        """How many files are not described yet."""
        if not self.nfiles:
            return 0
        return sum(1 for s in self._recs[1::2] if not s or s == protocol.INDEX_DESCRIBING)

    def sizes(self) -> Sequence[int] | Iterator[int]:
        """The files' sizes in their order: each one's stat's once described, else its listed size,
        else 0 (read in place where the index lists sizes, its describers writing theirs there too)."""
        if not self.nfiles:
            return ()
        if self._sizes:
            return self._view[self._sizes:self._sizes + 8 * self.nfiles].cast("Q")
        words, nfiles = self._stat_words, self.nfiles
        return (words[_WORDS * s - _WORDS + 2] if 0 < s <= nfiles and _WORDS * s <= len(words)
                and words[_WORDS * s - 1] == n + 1 else self._short_size(n) if s > nfiles else 0
                for n, s in enumerate(self._recs[1::2]))

    def _short_size(self, n: int) -> int:
        e = self.short(n)
        return e[3] if e is not None else 0

    def _shorted(self) -> Iterator[tuple[int, int]]:
        """(file from 0, size) of each file whose stat is a short stat, in file order."""
        nfiles = self.nfiles
        for n, s in enumerate(self._recs[1::2]):
            if s > nfiles and (e := self.short(n)) is not None:
                yield n, e[3]

    def stats_used(self) -> int:
        """How many stat slots are taken (each file described so far has one; they are taken in turn)."""
        return min(_U32.unpack_from(self.data, _STATS_USED_AT)[0], self.nfiles, len(self._stat_words) // _WORDS)

    def described_sizes(self) -> Iterator[tuple[int, int]]:
        """(file from 0, size) of each file described: those in slots in the order of their stats (a
        slot that does not name its file back, being written or cut from a copy, is none), then
        those in short stats (none larger than INDEX_SHORT_MAX_SIZE) in file order."""
        for n, size in self._slots(0, None):
            if n >= 0:
                yield n, size
        yield from self._shorted()

    def _slots(self, since: int, until: int | None) -> Iterator[tuple[int, int]]:
        """(file from 0, size) of stat slots ``since`` to ``until`` in turn; (-1, 0) for a slot that
        does not name its file back."""
        words, recs, nfiles = self._stat_words, self._recs, self.nfiles
        used = self.stats_used() if until is None else min(until, self.stats_used())
        for s, (size, n) in enumerate(zip(words[_WORDS * since + 2:_WORDS * used:_WORDS],
                                          words[_WORDS * since + _WORDS - 1:_WORDS * used:_WORDS]), since + 1):
            yield (n - 1, size) if 0 < n <= nfiles and recs[2 * n - 1] == s else (-1, 0)

    def total_size(self) -> int:
        if self._sizes or not self.nfiles:
            return sum(self.sizes())
        words = self._stat_words  # each stat taken is one file's (a slot being written adds its size or 0)
        used = min(_U32.unpack_from(self.data, _STATS_USED_AT)[0], self.nfiles, len(words) // _WORDS)
        return sum(words[2:_WORDS * used:_WORDS]) + self._short_total()

    def _short_total(self) -> int:
        """The sizes of the short stats taken, walked in turn (each first word says how many follow;
        a word not written yet counts one, 0 bytes): no record read."""
        shorts = self._shorts
        if shorts is None:
            return 0
        taken = min(_U32.unpack_from(self.data, _SHORTS_USED_AT)[0], len(shorts))
        total, k, mask = 0, 0, (1 << protocol.INDEX_SHORT_SIZE_BITS) - 1
        while k < taken:
            word = shorts[k]
            total += word & mask if word >> 63 else 0
            k += short_words(word) if word >> 63 else 1
        return total

    def __repr__(self) -> str:
        return f"IndexTable({self.nfiles} files)"

    def __reduce__(self):  # pickled as its index's used parts (a share crosses MPI): ~80 bytes per file
        data = self.data
        head, stats = used_ranges(protocol.INDEX_HEADER.unpack_from(data))[:1], used_ranges(
            protocol.INDEX_HEADER.unpack_from(data))[1:]
        parts = [bytes(data[a:min(b, len(data))]) for a, b in head + stats]
        return (_unpickled, (parts, stats[0][0] - head[0][1] if stats else 0, self.nfiles))


def put_stat(table: IndexTable, n: int, fields: tuple, flags: int) -> int:
    """File ``n``'s (from 0) stat written, in Python (``fields``: size, mtime, atime, ctime, ino,
    dev, mode, uid, gid, nlink, blocks, blksize; ``flags``: its route's bits): in its slot if it
    has one, else in the next free slot, which its record then names (protocol.py: its stat first,
    the slot last). 1 written; -1 no slot left. Callers serialize (the C library's
    ``index_put_stat`` is the one the daemon uses beside the front door)."""
    data, record = table.data, table._files + _FILE * n
    at = table.stat_at(n)
    if at < 0:
        used = _U32.unpack_from(data, _STATS_USED_AT)[0]
        if used >= table.nfiles or table._stats + _SIZE * (used + 1) > len(data):  # no room here (a copy's used end)
            return -1
        _U32.pack_into(data, _STATS_USED_AT, used + 1)
        at = table._stats + _SIZE * used
        slot = used + 1
    else:
        slot = 0
    off, length = table._name_span(n)
    (size, mtime, atime, ctime, ino, dev, mode, uid, gid, nlink, blocks, blksize) = fields
    _ENTRY.pack_into(data, at, 0, length, off, size, mtime, atime, ctime, ino, dev, mode, uid, gid, nlink, flags, 0,
                     blocks, blksize, 0, n + 1)
    if table._sizes:
        _U64.pack_into(data, table._sizes + 8 * n, size)
    if slot:
        _U32.pack_into(data, record + _STAT_AT, slot)
    return 1


def _unpickled(parts: list[bytes], gap: int, nfiles: int) -> IndexTable:
    """An IndexTable from its used parts and the zeros between them (``IndexTable.__reduce__``)."""
    return IndexTable(parts[0] + bytes(gap) + parts[1] if len(parts) > 1 else parts[0], nfiles)


class IndexListing(Sequence[tuple[bytes, int, int]]):
    """A listed directory's names as its index holds them ("." and ".." aside: its child records
    ``lo`` to ``hi`` and its files), read when iterated: a ``Listing`` that costs nothing until used."""
    __slots__ = ("_table", "_dir", "_lo", "_hi")

    def __init__(self, table: IndexTable, d: int, lo: int, hi: int):
        self._table, self._dir, self._lo, self._hi = table, d, lo, hi

    def __len__(self) -> int:
        return self._hi - self._lo + len(self._table.files_of(self._dir))

    def __iter__(self) -> Iterator[tuple[bytes, int, int]]:
        return self._table.listing(self._dir, self._lo, self._hi)

    def __getitem__(self, i):
        return tuple(self)[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"IndexListing({len(self)} entries)"

    def __reduce__(self):  # on its own (a snapshot's files carry their index whole)
        return (Listing, (tuple(self),))


def index_size(data) -> int:
    """The length of the index file ``data`` begins (its stats' room included)."""
    return protocol.INDEX_HEADER.unpack_from(data)[_H_SIZE]


def used_end(data) -> int:
    """Where the stats the index ``data`` holds end: a copy of it needs no byte past (the rest is
    zeros): the shapes' offset while no stat is in a slot (a short stat needs its shape, whose file
    has one)."""
    return used_ranges(protocol.INDEX_HEADER.unpack_from(data))[-1][1]


def used_ranges(header: tuple) -> list[tuple[int, int]]:
    """The parts of an index (from its INDEX_HEADER fields) a copy needs, as (start, end): up to its
    shorts' words used, then its stats used; the rest is zeros (the rooms' unused parts)."""
    stats_off, files, used = header[_H_STATS_OFF], header[_H_FILES], header[_H_USED]
    shorts = stats_off - 8 * protocol.INDEX_SHORT_ROOM * files
    if not used:
        return [(0, shorts - _SIZE * header[_H_DIRS])]
    taken = min(header[_H_SHORTS], protocol.INDEX_SHORT_ROOM * files)
    return [(0, shorts + 8 * taken), (stats_off, stats_off + _SIZE * min(used, files))]


def files_in(data: bytearray | bytes) -> int:
    """How many of an index's entries are files (they come first, then the directories, then the
    links' own records)."""
    return protocol.INDEX_HEADER.unpack_from(data)[_H_FILES]


def file_sizes(files) -> Sequence[int] | Iterator[int]:
    """The files' sizes, in the table's order (an IndexTable's: ``IndexTable.sizes``, no record per file)."""
    if not isinstance(files, IndexTable):
        return (info.size for info in files.values())
    return files.sizes()


def larger_than(files, size: int) -> list[str]:
    """The keys of the files larger than ``size``, in the table's order (an IndexTable's read
    from its sizes alone: no record built per file; a file not described yet is not among them)."""
    if not isinstance(files, IndexTable):
        return [key for key, info in files.items() if info.size > size]
    if files._sizes:
        return [files.key(n) for n, s in enumerate(files.sizes()) if s > size]
    return [files.key(n) for n in sorted(n for n, s in files.described_sizes() if s > size)]  # a size is a stat's


def listed_only(files, key: str) -> bool:
    """Is ``key`` a file a listing-mode walk named and nobody described yet (its size unknown)?"""
    if not isinstance(files, IndexTable):
        return False
    n = files.row_of(key)
    return n is not None and not files.is_described(n)


class LargerDescribed:
    """The files of a listing-mode walk's index described larger than ``size`` since it was last
    asked, in the order they were described (the front door's read-ahead lane describes each file
    it opens, and leaves those past its row's size to the stager): each file once."""

    WAIT = 3  # asks a slot still being written is waited for (a describer writes its stat after taking it)

    def __init__(self, files, size: int):
        if size < protocol.INDEX_SHORT_MAX_SIZE:  # its slots alone hold every file larger
            raise ValueError(f"files larger than {size} bytes may have short stats (up to {protocol.INDEX_SHORT_MAX_SIZE})")
        self._files, self._size = files, size
        self._seen = files.stats_used() if isinstance(files, IndexTable) and not files._sizes else None
        self._waited = 0

    def new(self) -> list[str]:
        files, since = self._files, self._seen
        if since is None:
            return []  # every size was known at the start (larger_than gave them all)
        found = []
        for s, (n, size) in enumerate(files._slots(since, None), since):
            if n < 0 and self._waited < self.WAIT:
                self._waited += 1
                break  # asked again from this slot
            self._seen, self._waited = s + 1, 0
            if size > self._size:
                found.append(files.key(n))
        return found
