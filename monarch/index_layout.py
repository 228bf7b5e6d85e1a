"""The snapshot index's bytes (protocol.py, "Snapshot index") built and read in Python: the
reference the C readers (the shim, the front door) and the compact writers (``walker.c``,
``node/snapshot/index_writer.py``, ``node/snapshot/from_list.py``) are tested against.

``build_index`` holds every entry as objects (tests build indexes from ``os.stat`` results);
the daemon's writers make the same bytes without an object per file."""

from __future__ import annotations

import stat as _stat
import struct
from typing import Iterable

from monarch.protocol import (DT_DIR, INDEX_CHILD, INDEX_DESCRIBING, INDEX_ENTRY, INDEX_FILE, INDEX_FLAG_LISTED,
                              INDEX_FLAG_SYMLINK, INDEX_FLAG_UNDESCRIBED, INDEX_HEADER, INDEX_MAGIC, INDEX_VERSION,
                              key_hash)


def stat_fields(st) -> tuple:
    """(size, mtime, atime, ctime, ino, dev, mode, uid, gid, nlink) of an os.stat_result or a
    snapshot FileInfo; and (blocks, blksize)."""
    if hasattr(st, "st_size"):
        return ((st.st_size, st.st_mtime_ns, st.st_atime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                 st.st_mode, st.st_uid, st.st_gid, st.st_nlink), (st.st_blocks, st.st_blksize))
    return ((st.size, st.mtime_ns, st.atime_ns, st.ctime_ns, st.ino, st.dev, st.mode, st.uid, st.gid, st.nlink),
            (st.blocks, st.blksize))


def pad8(n: int) -> int:
    return n + (-n % 8)


def undescribed_view(record: tuple) -> tuple:
    """The INDEX_ENTRY fields Python shows for a file not described yet: its key, its listed size,
    S_IFREG, INDEX_FLAG_UNDESCRIBED (nothing is answered from them)."""
    return (record[0], record[1], record[2], record[3], 0, 0, 0, 0, 0, _stat.S_IFREG, 0, 0, 0,
            INDEX_FLAG_UNDESCRIBED, 0, 0, 0, 0, 0)


def build_index(entries: Iterable[tuple], dirs: Iterable[tuple] = (), links: dict | None = None) -> bytes:
    """The index file's bytes up to its used end (the file is the header's ``size`` long: the
    stats' room after them is zeros).

    ``entries``: (key, stat[, flags]) of files; a stat is an os.stat_result or a snapshot
    FileInfo (which knows whether its name is a symlink); a file whose flags have
    INDEX_FLAG_UNDESCRIBED is listed, not described (its stat's size only is kept, as its record's).
    ``dirs``: (key, stat, children) of directories, ``children`` a list of (name, d_type, d_ino)
    of the whole listing (without "." and "..") or None when the directory could not be listed,
    plus the ``".."`` st_ino as a fourth item (0 if unknown). ``links``: key -> the symlink's own
    lstat, for keys whose name is a symlink."""
    links = links or {}
    files = []  # (raw, st, flags)
    for raw, st, *rest in entries:
        flags = rest[0] if rest else 0
        if getattr(st, "link", False):
            flags |= INDEX_FLAG_SYMLINK
        files.append((raw, st, flags))
    folders = [(raw, st, children, parent[0] if parent else 0) for raw, st, children, *parent in dirs]
    nfiles = len(files)
    number = {raw: n + 1 for n, (raw, *_) in enumerate(files)}
    number.update({raw: nfiles + j + 1 for j, (raw, *_) in enumerate(folders)})
    linked = [(raw, links[raw]) for raw, _, flags in files if flags & INDEX_FLAG_SYMLINK and raw in links]
    link_number = {raw: nfiles + len(folders) + i + 1 for i, (raw, _) in enumerate(linked)}
    total = nfiles + len(folders) + len(linked)
    nbuckets = 16
    while nbuckets < 2 * total:
        nbuckets *= 2
    mask = nbuckets - 1
    buckets = [0] * nbuckets
    keys = bytearray()
    key_off: dict[bytes, int] = {}
    for raw in [raw for raw, *_ in files] + [raw for raw, *_ in folders]:
        key_off[raw] = len(keys)
        keys += raw
        h = key_hash(raw)
        b = h & mask
        while buckets[b]:
            b = (b + 1) & mask
        buckets[b] = number[raw]
    records, stats = [], []
    for n, (raw, st, flags) in enumerate(files, 1):
        fields, blocks = stat_fields(st)
        h = key_hash(raw)
        if flags & INDEX_FLAG_UNDESCRIBED:
            records.append(INDEX_FILE.pack(h, len(raw), key_off[raw], max(fields[0], 0), 0, 0))
            continue
        stats.append(INDEX_ENTRY.pack(h, len(raw), key_off[raw], *fields, flags, link_number.get(raw, 0),
                                      blocks[0], blocks[1], 0, n))
        records.append(INDEX_FILE.pack(h, len(raw), key_off[raw], fields[0], len(stats), 0))
    fixed, child_recs = [], []
    for raw, st, children, parent_ino in folders:
        first, count = len(child_recs), 0
        if children is not None:
            fields, _ = stat_fields(st)
            prefix = raw if raw.endswith(b"/") else raw + b"/"
            child_recs.append((fields[4], 0, 0, 0, DT_DIR, b"."))
            child_recs.append((parent_ino, 0, 0, 0, DT_DIR, b".."))
            for name, d_type, d_ino in sorted(children):
                child = prefix + name
                if child in key_off:
                    off, entry = key_off[child] + len(prefix), number[child]
                else:
                    off, entry = None, 0
                child_recs.append((d_ino, off, entry, len(name), d_type, name))
            count = len(child_recs) - first
        fields, blocks = stat_fields(st)
        fixed.append(INDEX_ENTRY.pack(key_hash(raw), len(raw), key_off[raw], *fields,
                                      INDEX_FLAG_LISTED if children is not None else 0, 0, blocks[0], blocks[1],
                                      count, first))
    for raw, lst in linked:
        fields, blocks = stat_fields(lst)
        fixed.append(INDEX_ENTRY.pack(key_hash(raw), len(raw), key_off[raw], *fields, 0, 0, blocks[0], blocks[1],
                                      0, 0))
    names: dict[bytes, int] = {}
    children_packed = []
    for d_ino, off, entry, nlen, d_type, name in child_recs:
        if off is None:
            off = names.get(name)
            if off is None:
                off = names[name] = len(keys)
                keys += name
        children_packed.append(INDEX_CHILD.pack(d_ino, off, entry, nlen, d_type, 0))
    buckets_off = INDEX_HEADER.size
    files_off = buckets_off + 4 * nbuckets
    entries_off = files_off + INDEX_FILE.size * nfiles
    keys_off = entries_off + INDEX_ENTRY.size * len(fixed)
    children_off = pad8(keys_off + len(keys))
    stats_off = pad8(children_off + INDEX_CHILD.size * len(children_packed))
    size = stats_off + INDEX_ENTRY.size * nfiles
    header = INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, total, nbuckets, 0, buckets_off, entries_off, keys_off,
                               len(keys), children_off, len(children_packed), nfiles, len(stats), files_off, stats_off,
                               size)
    return b"".join([header, struct.pack(f"<{nbuckets}I", *buckets), *records, *fixed, bytes(keys),
                     b"\0" * (children_off - keys_off - len(keys)), *children_packed,
                     b"\0" * (stats_off - children_off - INDEX_CHILD.size * len(children_packed)), *stats])


class Index:
    """A read-only view of an index file's bytes (the shim's lookups, in Python). ``data`` may end
    at the used end: a stats slot past it reads as not described."""

    def __init__(self, data: bytes):
        (magic, version, self.entries, self.buckets, self.reserved, self.buckets_off, self.entries_off,
         self.keys_off, self.keys_size, self.children_off, self.nchildren, self.files, self.stats_used,
         self.files_off, self.stats_off, self.size) = INDEX_HEADER.unpack_from(data)
        if magic != INDEX_MAGIC or version != INDEX_VERSION:
            raise ValueError("not a Monarch index of version %d" % INDEX_VERSION)
        self.data = data

    def record(self, n: int) -> tuple:
        """File ``n``'s (from 1) INDEX_FILE fields."""
        return INDEX_FILE.unpack_from(self.data, self.files_off + INDEX_FILE.size * (n - 1))

    def stat_slot(self, n: int) -> int:
        """The stats slot (from 1) of file ``n``, or 0 while it is not described."""
        s = self.record(n)[4]
        at = self.stats_off + INDEX_ENTRY.size * (s - 1)
        if s == INDEX_DESCRIBING or not 0 < s <= self.files or at + INDEX_ENTRY.size > len(self.data):
            return 0
        return s if INDEX_ENTRY.unpack_from(self.data, at)[18] == n else 0  # its stat names it back

    def entry(self, number: int) -> tuple:
        """Entry ``number`` (from 1): the INDEX_ENTRY fields (a file not described yet: its
        ``undescribed_view``)."""
        if number <= self.files:
            s = self.stat_slot(number)
            if not s:
                return undescribed_view(self.record(number))
            return INDEX_ENTRY.unpack_from(self.data, self.stats_off + INDEX_ENTRY.size * (s - 1))
        return INDEX_ENTRY.unpack_from(self.data, self.entries_off + INDEX_ENTRY.size * (number - self.files - 1))

    def head(self, number: int) -> tuple[int, int, int]:
        """The hash, key length and key offset of entry ``number``."""
        if number <= self.files:
            return INDEX_FILE.unpack_from(self.data, self.files_off + INDEX_FILE.size * (number - 1))[:3]
        return INDEX_ENTRY.unpack_from(self.data, self.entries_off + INDEX_ENTRY.size * (number - self.files - 1))[:3]

    def key(self, number: int) -> bytes:
        _, length, off = self.head(number)
        return self.data[self.keys_off + off: self.keys_off + off + length]

    def number(self, raw: bytes) -> int:
        """Entry number (from 1) of ``raw``, or 0."""
        h = key_hash(raw)
        b = h & (self.buckets - 1)
        for _ in range(self.buckets):  # bounded, as the shim's look-up is
            n = struct.unpack_from("<I", self.data, self.buckets_off + 4 * b)[0]
            if not n or n > self.entries:
                return 0
            eh, length, off = self.head(n)
            if eh == h and self.data[self.keys_off + off: self.keys_off + off + length] == raw:
                return n
            b = (b + 1) & (self.buckets - 1)
        return 0

    def children(self, number: int) -> list[tuple[bytes, int, int, int]]:
        """A listed directory's records: (name, d_type, d_ino, entry number or 0)."""
        e = self.entry(number)
        out = []
        for i in range(e[18], e[18] + e[17]):
            d_ino, off, entry, nlen, d_type, _ = INDEX_CHILD.unpack_from(self.data, self.children_off + INDEX_CHILD.size * i)
            name = b"." if i == e[18] else b".." if i == e[18] + 1 else self.data[self.keys_off + off: self.keys_off + off + nlen]
            out.append((name, d_type, d_ino, entry))
        return out


def index_lookup(data: bytes, raw: bytes) -> tuple | None:
    """The entry of ``raw`` in an index (the shim's lookup, in Python for tests): a tuple in
    INDEX_ENTRY order after the key fields (size, mtime_ns, atime_ns, ctime_ns, ino, dev,
    mode, uid, gid, nlink, flags, link, blocks, blksize, children, first child), or None."""
    index = Index(data)
    n = index.number(raw)
    return index.entry(n)[3:] if n else None
