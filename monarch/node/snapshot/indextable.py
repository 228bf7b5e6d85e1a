"""A snapshot's files read straight from its index (``IndexTable``): the index the shim maps
is the daemon's table too, with no Python object per file.

A million-file dataset in a ``FileTable`` still holds a key string and a dict slot per file
(~250 bytes beside its 104 bytes of fields); here a file is its index entry (112 bytes)
and its key's bytes, ~175 bytes in all, and a look-up is the shim's: the key's CRC-32,
then linear probing in the index's buckets. The C walk (``walker.c``) and a kept index
(``snapshot.read_index``) both give one without building anything per file.

The index is the whole snapshot's (its files, directories and links), so the daemon writes
it as it is (``index_writer.index_parts``). It changes only by ``remap_devices`` (a snapshot
received from another node), which patches every entry in place, and by the routes published in
its files' flags (``index_writer.stamp_routes``, read by ``route``); a file cannot be added.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
import zlib
from typing import Callable, Iterator, MutableMapping, Sequence

from monarch import protocol
from monarch.records.filetable import FileInfo, Listing
from monarch.routes import Route

_ENTRY = protocol.INDEX_ENTRY
_CHILD = protocol.INDEX_CHILD
_SIZE = _ENTRY.size
_HEAD = struct.Struct("<IIQ")     # an entry's hash, key length, key offset
_MODE = struct.Struct("<I")       # at offset _MODE_AT of an entry
_MODE_AT = 64
_DEV_AT = 56                      # st_dev, u64
_DEV = struct.Struct("<Q")
_ENCODING = sys.getfilesystemencoding()
_ERRORS = sys.getfilesystemencodeerrors()


def check_tables(data) -> None:
    """Is ``data`` an index of this version whose tables lie inside it, as the shim and the front
    door require before they map one (monarch_shim.c, door_index.c's index_valid)? A ValueError
    that says what is wrong if not: a file the daemon took as its snapshot and they refused would
    leave the job with nothing staged and every metadata call the PFS's."""
    if len(data) < protocol.INDEX_HEADER.size:
        raise ValueError(f"{len(data)} bytes, shorter than an index's header ({protocol.INDEX_HEADER.size})")
    (magic, version, entries, buckets, _, buckets_off, entries_off, keys_off, keys_size, children_off,
     nchildren) = protocol.INDEX_HEADER.unpack_from(data)
    if magic != protocol.INDEX_MAGIC or version != protocol.INDEX_VERSION:
        raise ValueError("not a Monarch index of version %d" % protocol.INDEX_VERSION)
    if not buckets or buckets & (buckets - 1):
        raise ValueError(f"its buckets ({buckets}) are not a power of two")
    if entries >= buckets:
        raise ValueError(f"its entries ({entries}) are not fewer than its buckets ({buckets})")
    size = len(data)
    for what, off, length in (("buckets", buckets_off, 4 * buckets), ("entries", entries_off, _SIZE * entries),
                              ("key bytes", keys_off, keys_size), ("child records", children_off, _CHILD.size * nchildren)):
        if off > size or length > size - off:
            raise ValueError(f"its {what} ({length} bytes at {off}) lie past its end ({size} bytes)")


def _info(e: tuple) -> FileInfo:
    """The FileInfo of an INDEX_ENTRY tuple."""
    return FileInfo(e[3], e[4], e[9], e[5], e[6], e[7], e[8], e[10], e[11], e[12],
                    bool(e[13] & protocol.INDEX_FLAG_SYMLINK), e[15], e[16])


class IndexTable(MutableMapping[str, FileInfo]):
    """The files of an index (its first ``nfiles`` entries) as a mapping key -> FileInfo,
    with ``FileTable``'s extras (``row_of``, ``total_size``)."""
    __slots__ = ("data", "nfiles", "total", "_buckets", "_mask", "_entries", "_keys", "describer")

    def __init__(self, data: bytearray | bytes, nfiles: int, describer: Callable[["IndexTable", int], bool] | None = None):
        check_tables(data)
        header = protocol.INDEX_HEADER.unpack_from(data)
        self.data = data
        self.nfiles = nfiles
        self.total = header[2]
        self._mask = header[3] - 1
        self._buckets = memoryview(data)[header[5]:header[5] + 4 * header[3]].cast("I")
        self._entries = header[6]
        self._keys = header[7]
        # a listing-mode walk's files are described when first asked for (index_writer.Describer)
        self.describer = describer

    def rebind(self, data) -> None:
        """The same index read from ``data`` from now on (Snapshot.rebind)."""
        header = protocol.INDEX_HEADER.unpack_from(data)
        self._buckets = memoryview(data)[header[5]:header[5] + 4 * header[3]].cast("I")
        self.data = data

    # -- the entries ---------------------------------------------------------------------
    def entry(self, n: int) -> tuple:
        """Entry ``n`` (from 0) as INDEX_ENTRY's fields."""
        return _ENTRY.unpack_from(self.data, self._entries + _SIZE * n)

    def raw_key(self, n: int) -> bytes:
        _, length, offset = _HEAD.unpack_from(self.data, self._entries + _SIZE * n)
        start = self._keys + offset
        return bytes(self.data[start:start + length])

    def route(self, n: int) -> Route | None:
        """The route published for entry ``n`` (from 0; ``protocol.INDEX_ROUTE_MASK``), or None."""
        bits = (self.entry(n)[13] & protocol.INDEX_ROUTE_MASK) >> protocol.INDEX_ROUTE_SHIFT
        return Route(bits - 1) if bits else None

    def key(self, n: int) -> str:
        _, length, offset = _HEAD.unpack_from(self.data, self._entries + _SIZE * n)
        start = self._keys + offset
        return self.data[start:start + length].decode(_ENCODING, _ERRORS)

    def is_dir(self, n: int) -> bool:
        return stat.S_ISDIR(_MODE.unpack_from(self.data, self._entries + _SIZE * n + _MODE_AT)[0])

    def number(self, raw: bytes) -> int:
        """The entry (from 0) keyed ``raw`` (a file's or a directory's), or -1."""
        h = zlib.crc32(raw)
        b = h & self._mask
        data, buckets, entries, keys, length = self.data, self._buckets, self._entries, self._keys, len(raw)
        while True:
            n = buckets[b]
            if not n:
                return -1
            eh, klen, koff = _HEAD.unpack_from(data, entries + _SIZE * (n - 1))
            if eh == h and klen == length and data[keys + koff:keys + koff + klen] == raw:
                return n - 1
            b = (b + 1) & self._mask

    def remap_devices(self, remap: dict[int, int]) -> None:
        """Every entry's st_dev through ``remap`` (another node's device numbers -> ours)."""
        for n in range(self.total):
            at = self._entries + _SIZE * n + _DEV_AT
            dev = _DEV.unpack_from(self.data, at)[0]
            if dev in remap:
                _DEV.pack_into(self.data, at, remap[dev])

    # -- the mapping -----------------------------------------------------------------------
    def row_of(self, key: str) -> int | None:
        """``key``'s position among the files (its entry), or None."""
        n = self.number(os.fsencode(key))
        return n if 0 <= n < self.nfiles else None

    def described(self, n: int) -> tuple | None:
        """File entry ``n``'s fields, described now if a listing-mode walk left it undescribed;
        None if it cannot be (gone, no longer a regular file, nothing to describe it with)."""
        e = self.entry(n)
        if not e[13] & protocol.INDEX_FLAG_UNDESCRIBED:
            return e
        if self.describer is None or not self.describer(self, n):
            return None
        e = self.entry(n)
        return None if e[13] & protocol.INDEX_FLAG_UNDESCRIBED else e

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
        e = list(self.entry(n))
        e[3:13] = (info.size, info.mtime_ns, info.atime_ns, info.ctime_ns, info.ino, info.dev, info.mode,
                   info.uid, info.gid, info.nlink)
        e[15], e[16] = info.blocks, info.blksize
        e[13] &= ~protocol.INDEX_FLAG_UNDESCRIBED
        _ENTRY.pack_into(self.data, self._entries + _SIZE * n, *e)

    def __delitem__(self, key: str) -> None:
        raise TypeError("a snapshot's files are never removed")

    def __iter__(self) -> Iterator[str]:
        data, entries, keys, head = self.data, self._entries, self._keys, _HEAD.unpack_from
        for n in range(self.nfiles):
            _, length, offset = head(data, entries + _SIZE * n)
            yield data[keys + offset:keys + offset + length].decode(_ENCODING, _ERRORS)

    def items(self):
        """Every file as the index holds it now: one a listing-mode walk left undescribed has only
        its key, S_IFREG and size 0 (``undescribed`` counts them; ``get`` describes one)."""
        for n in range(self.nfiles):
            yield self.key(n), _info(self.entry(n))

    def values(self):
        return (_info(self.entry(n)) for n in range(self.nfiles))

    def __len__(self) -> int:
        return self.nfiles

    def undescribed(self) -> int:
        """How many files a listing-mode walk left undescribed so far."""
        if not self.nfiles:
            return 0
        flags = memoryview(self.data)[self._entries:self._entries + _SIZE * self.nfiles].cast("I")[20::_SIZE // 4]
        return sum(1 for f in flags if f & protocol.INDEX_FLAG_UNDESCRIBED)

    def total_size(self) -> int:
        if not self.nfiles:
            return 0
        sizes = memoryview(self.data)[self._entries:self._entries + _SIZE * self.nfiles].cast("Q")
        return sum(sizes[2::_SIZE // 8])

    def __repr__(self) -> str:
        return f"IndexTable({self.nfiles} files)"

    def __reduce__(self):  # pickled as its index (a share crosses MPI): ~175 bytes per file
        return (IndexTable, (bytes(self.data), self.nfiles))


class IndexListing(Sequence[tuple[bytes, int, int]]):
    """A listed directory's names as its index holds them (child records ``lo`` to ``hi``,
    after "." and ".."), read when iterated: a ``Listing`` that costs nothing until used."""
    __slots__ = ("_data", "_lo", "_hi")

    def __init__(self, data: bytearray | bytes, lo: int, hi: int):
        self._data, self._lo, self._hi = data, lo, hi

    def __len__(self) -> int:
        return self._hi - self._lo

    def rebound(self, data) -> "IndexListing":
        return IndexListing(data, self._lo, self._hi)

    def __iter__(self) -> Iterator[tuple[bytes, int, int]]:
        data = self._data
        header = protocol.INDEX_HEADER.unpack_from(data)
        keys, children = header[7], header[9]
        for i in range(self._lo, self._hi):
            d_ino, off, _, nlen, d_type, _ = _CHILD.unpack_from(data, children + _CHILD.size * i)
            yield bytes(data[keys + off:keys + off + nlen]), d_type, d_ino

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


def files_in(data: bytearray | bytes) -> int | None:
    """How many of an index's entries are files (they come first, then the directories, then
    the links' own records), or None if the index has no directory (then its layout says
    nothing about where its files end)."""
    header = protocol.INDEX_HEADER.unpack_from(data)
    entries, total = header[6], header[2]

    def is_dir(n: int) -> bool:
        return stat.S_ISDIR(_MODE.unpack_from(data, entries + _SIZE * n + _MODE_AT)[0])
    items = total
    while items and not is_dir(items - 1):  # the links' records
        items -= 1
    if not items:
        return None
    lo, hi = 0, items
    while lo < hi:  # the first directory
        mid = (lo + hi) // 2
        if is_dir(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def file_sizes(files) -> Sequence[int] | Iterator[int]:
    """The files' sizes, in the table's order (an IndexTable's read in place: no record per file)."""
    if not isinstance(files, IndexTable):
        return (info.size for info in files.values())
    if not files.nfiles:
        return ()
    return memoryview(files.data)[files._entries:files._entries + _SIZE * files.nfiles].cast("Q")[2::_SIZE // 8]


def larger_than(files, size: int) -> list[str]:
    """The keys of the files larger than ``size``, in the table's order (an IndexTable's read
    from its sizes alone: no record built per file)."""
    if not isinstance(files, IndexTable):
        return [key for key, info in files.items() if info.size > size]
    return [files.key(n) for n, s in enumerate(file_sizes(files)) if s > size]
