"""The snapshot index's bytes (protocol.py, "Snapshot index") built and read in Python: the
reference the C readers (the shim, the front door) and the compact writers (``walker.c``,
``node/snapshot/index_writer.py``, ``node/snapshot/from_list.py``) are tested against.

``build_index`` holds every entry as objects (tests build indexes from ``os.stat`` results);
the daemon's writers make the same bytes without an object per file."""

from __future__ import annotations

import bisect
import itertools
import stat as _stat
import struct
import sys
import zlib
from array import array
from typing import Iterable

from monarch.protocol import (DT_DIR, DT_LNK, DT_REG, INDEX_AFFIX, INDEX_CHILD, INDEX_DESCRIBING, INDEX_ENTRY, INDEX_FILE, INDEX_FLAG_LISTED,
                              INDEX_FLAG_SYMLINK, INDEX_FLAG_UNDESCRIBED, INDEX_HEADER, INDEX_INOS_ONE, INDEX_MAGIC, INDEX_ROUTE_SHIFT,
                              INDEX_SHAPE_READY, INDEX_SHORT_BLOCKS_AT, INDEX_SHORT_INO_AT, INDEX_SHORT_INO_BITS,
                              INDEX_SHORT_ROOM, INDEX_SHORT_ROUTE_AT, INDEX_SHORT_SIZE_BITS, INDEX_SHORT_TIMES_AT,
                              INDEX_VERSION, key_hash)


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


def undescribed_view(name_len: int, name_off: int, size: int) -> tuple:
    """The INDEX_ENTRY fields Python shows for a file not described yet: its name's length and
    offset, its listed size, S_IFREG, INDEX_FLAG_UNDESCRIBED (nothing is answered from them)."""
    return (0, name_len, name_off, size, 0, 0, 0, 0, 0, _stat.S_IFREG, 0, 0, 0, INDEX_FLAG_UNDESCRIBED, 0, 0, 0, 0, 0)


def short_blocks(how: int, size: int, blksize: int) -> int:
    """A file's st_blocks from its size, as its short stat's ``how`` says (-1: none can be)."""
    if how == 0:
        return -(-size // 512)
    if how == 1:
        return -(-size // 4096) * 8
    if how == 2:
        return -(-size // blksize) * (blksize // 512) if blksize >= 512 else -1
    return 0


def short_words(first: int) -> int:
    """The u64 words a short stat takes, from its first."""
    return 1 + ((first >> INDEX_SHORT_TIMES_AT) & 3)


def short_entry(shape: tuple, words, name_len: int, name_off: int, n: int) -> tuple | None:
    """The INDEX_ENTRY fields of file ``n`` (from 1) whose stat is the short stat ``words`` (its
    first word, then at least the words it says) beside its directory's ``shape`` (INDEX_ENTRY
    fields), its name's length and offset; None if either is not whole (its first word not
    written, the shape not ready)."""
    word = words[0]
    if not word >> 63 or shape[0] != INDEX_SHAPE_READY:
        return None
    size = word & ((1 << INDEX_SHORT_SIZE_BITS) - 1)
    delta = (word >> INDEX_SHORT_INO_AT) & ((1 << INDEX_SHORT_INO_BITS) - 1)
    if delta >> (INDEX_SHORT_INO_BITS - 1):
        delta -= 1 << INDEX_SHORT_INO_BITS
    (_, _, _, _, mtime, atime, ctime, ino, dev, mode, uid, gid, nlink, _, _, _, blksize, _, _) = shape
    more = [w - (1 << 64) if w >> 63 else w for w in words[1:short_words(word)]]  # i64 times
    if more:
        mtime = more[0]
        atime = more[1] if len(more) > 1 else mtime
        ctime = more[2] if len(more) > 2 else mtime
    flags = ((word >> INDEX_SHORT_ROUTE_AT) & 0xF) << INDEX_ROUTE_SHIFT
    blocks = short_blocks((word >> INDEX_SHORT_BLOCKS_AT) & 3, size, blksize)
    return (0, name_len, name_off, size, mtime, atime, ctime, (ino + delta) & (2**64 - 1), dev, mode, uid, gid, nlink,
            flags, 0, blocks, blksize, 0, n)


AFFIX = INDEX_AFFIX  # a directory's: its affix bytes' offset in the key bytes, its prefix's length, its suffix's


def name_affixes(names: list[bytes]) -> tuple[int, int]:
    """The common prefix's and suffix's lengths of a directory's files' ``names`` (in bytewise order)
    stored once for it, each name's middle at least one byte: (0, 0) under two files (walker.c's
    dir_affixes)."""
    if len(names) < 2:
        return 0, 0
    shortest = min(map(len, names))
    first, last = names[0], names[-1]
    p = 0
    while p + 1 < shortest and first[p] == last[p]:
        p += 1
    s = shortest
    for name in names:
        k = 0
        while k < s and name[len(name) - 1 - k] == first[len(first) - 1 - k]:
            k += 1
        s = k
        if not s:
            break
    return p, min(s, shortest - 1 - p)


def affixes_off(ranges_off: int, dirs: int) -> int:
    """Where the directories' affixes lie: after the ranges, at a multiple of 8."""
    return pad8(ranges_off + 4 * (dirs + 1))


def bucket_count(dirs: int) -> int:
    """Buckets for ``dirs`` directories (only they are keyed: a file is found by name in its
    directory's range): 3/2 x dirs rounded up to a multiple of 16 (the tables after them start on
    64 bytes), at least 16."""
    return max(16, (3 * dirs + 31) // 32 * 16)


def first_bucket(h: int, buckets: int) -> int:
    """The bucket a key of hash ``h`` is looked for first: its place in [0, buckets)."""
    return h * buckets >> 32


def split_key(raw: bytes) -> tuple[bytes, bytes]:
    """A file's key as (its directory's key, its name): a root's file's directory is ``b"<k>/"``."""
    cut = raw.rindex(b"/")
    parent = raw[:cut]
    return (parent if b"/" in parent else parent + b"/"), raw[cut + 1:]


def joined(dir_key: bytes, name: bytes) -> bytes:
    """A file's key from its directory's key and its name."""
    return dir_key + name if dir_key.endswith(b"/") else dir_key + b"/" + name


def pack(dirs: list, counts: list[int], names: Iterable[bytes], stats: Iterable | None = None, sizes=None,
         inos=None, links=(), reserved: int = 0) -> list:
    """The index (protocol.py, "Snapshot index") as the buffers that make it up to its used end (its
    shapes' offset while no stat is there), in order; every writer's layout.

    ``dirs``: per directory, in the bytewise order of their keys, (key, size .. nlink of its stat,
    flags, blocks, blksize, listing): ``listing`` None (not listed) or (its st_ino, its parent's,
    [(name, d_type, d_ino, entry number or 0)] of its names that are not its files, sorted).
    ``counts``: each directory's files, whose ``names`` follow one another (each directory's in
    bytewise order; read once). ``stats``: per file in order (read once), None (not described) or
    (size .. nlink, flags, link number, blocks, blksize): slots 1.. in file order. ``sizes``,
    ``inos``: arrays of a u64 per file, or None. ``links``: (file number, size .. nlink, blocks,
    blksize) of each link record, after the directories."""
    nfiles, ndirs = sum(counts), len(dirs)
    nbuckets = bucket_count(ndirs)
    buckets = array("I", bytes(4 * nbuckets))

    def place(h: int, number: int) -> None:
        b = first_bucket(h, nbuckets)
        while buckets[b]:
            b = b + 1 if b + 1 < nbuckets else 0
        buckets[b] = number

    records = array("I", bytes(INDEX_FILE.size * nfiles))  # (name offset, stat slot) a file
    keys, ranges, names = bytearray(), array("I", [0]), iter(names)
    affixes = []  # each directory's files' names' common (prefix, suffix)
    n = 0
    for (key, *_), count in zip(dirs, counts):
        mine = list(itertools.islice(names, count))
        p, s = name_affixes(mine)
        affixes.append((mine[0][:p], mine[0][len(mine[0]) - s:]) if mine else (b"", b""))
        for name in mine:
            records[2 * n] = len(keys)
            keys += name[p:len(name) - s]  # its middle
            n += 1
        ranges.append(n)
    if n != nfiles or next(names, None) is not None:
        raise ValueError(f"the directories hold {nfiles} files, not as many as named")
    names_size = len(keys)
    if names_size >= 1 << 32:
        raise ValueError(f"the files' names take {names_size} bytes, more than an index holds (4 GiB)")
    dir_key_at = []
    for key, *_ in dirs:
        dir_key_at.append(len(keys))
        keys += key
    for j, (key, *_) in enumerate(dirs):
        place(zlib.crc32(key), nfiles + j + 1)

    fixed, children, spare = bytearray(), bytearray(), {}
    nchildren = 0
    for j, (key, fields, flags, blocks, blksize, listing) in enumerate(dirs):
        first = nchildren
        if listing is not None:
            ino, parent_ino, others = listing
            children += INDEX_CHILD.pack(ino, 0, 0, 0, DT_DIR, 0) + INDEX_CHILD.pack(parent_ino, 0, 0, 0, DT_DIR, 0)
            nchildren += 2
            for name, d_type, d_ino, entry in others:
                if entry > nfiles:  # a subdirectory: the tail of its key
                    sub = entry - nfiles - 1
                    off = dir_key_at[sub] + len(dirs[sub][0]) - len(name)
                else:
                    off = spare.get(name)
                    if off is None:
                        off = spare[name] = len(keys)
                        keys += name
                children += INDEX_CHILD.pack(d_ino, off, entry, len(name), d_type, 0)
                nchildren += 1
        fixed += INDEX_ENTRY.pack(zlib.crc32(key), len(key), dir_key_at[j], *fields, flags, 0, blocks, blksize,
                                  nchildren - first, first)

    affix_table = bytearray()
    for prefix, suffix in affixes:  # the key bytes' last
        affix_table += AFFIX.pack(len(keys), len(prefix), len(suffix))
        keys += prefix + suffix

    def name_of(n: int) -> tuple[int, int]:  # file n's (from 1) name's middle: its length and offset
        return (records[2 * n] if n < nfiles else names_size) - records[2 * n - 2], records[2 * n - 2]

    for n, *fields, blocks, blksize in links:
        fixed += INDEX_ENTRY.pack(0, *name_of(n), *fields, 0, 0, blocks, blksize, 0, n)
    described = bytearray()
    used = 0
    for n, st in enumerate(stats or (), 1):
        if st is not None:
            *fields, flags, link, blocks, blksize = st
            described += INDEX_ENTRY.pack(0, *name_of(n), *fields, flags, link, blocks, blksize, 0, n)
            used += 1
            records[2 * n - 1] = used

    if sys.byteorder != "little":
        for a in (buckets, records, ranges, *(x for x in (sizes, inos) if x is not None)):
            a.byteswap()
    files_off = INDEX_HEADER.size + 4 * nbuckets
    ranges_off = files_off + INDEX_FILE.size * nfiles
    at = affixes_off(ranges_off, ndirs) + AFFIX.size * ndirs
    sizes_off = at if sizes is not None else 0
    at += 8 * nfiles if sizes is not None else 0
    one_ino = inos is not None and len(inos) > 0 and inos.count(inos[0]) == len(inos)
    if one_ino:  # every name listed with the same d_ino (a FUSE filesystem's unknown one): stored once
        inos, reserved = inos[:1], reserved | INDEX_INOS_ONE
    inos_off = at if inos is not None else 0
    at += 8 * len(inos) if inos is not None else 0
    entries_off, keys_off = at, at + len(fixed)
    children_off = pad8(keys_off + len(keys))
    shapes_off = pad8(children_off + len(children))
    stats_off = shapes_off + INDEX_ENTRY.size * ndirs + 8 * INDEX_SHORT_ROOM * nfiles  # the shapes and the shorts: zeros
    header = INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, nfiles + ndirs + len(links), nbuckets, reserved,
                               INDEX_HEADER.size, entries_off, keys_off, len(keys), children_off, nchildren, nfiles,
                               used, files_off, stats_off, stats_off + INDEX_ENTRY.size * nfiles, ndirs, 0, names_size,
                               ranges_off, sizes_off, inos_off)
    gap = b"\0" * (pad8(ranges_off + 4 * len(ranges)) - ranges_off - 4 * len(ranges))
    return [header, *(memoryview(a).cast("B") for a in (buckets, records, ranges)), gap, affix_table,
            *(memoryview(a).cast("B") for a in (sizes, inos) if a is not None), fixed, keys,
            b"\0" * (children_off - keys_off - len(keys)), children,
            b"\0" * (shapes_off - children_off - len(children)),
            *((bytes(stats_off - shapes_off), described) if described else ())]


def build_index(entries: Iterable[tuple], dirs: Iterable[tuple] = (), links: dict | None = None) -> bytes:
    """The index file's bytes up to its used end (the file is the header's ``size`` long: the
    room for the shapes, the shorts and the stats after them is zeros), its files numbered as the
    index orders them (each directory's after the other's).

    ``entries``: (key, stat[, flags]) of files; a stat is an os.stat_result or a snapshot
    FileInfo (which knows whether its name is a symlink); a file whose flags have
    INDEX_FLAG_UNDESCRIBED is listed, not described (its stat's size only is kept, as its listed
    size). ``dirs``: (key, stat, children) of directories, ``children`` a list of (name, d_type,
    d_ino) of the whole listing (without "." and "..") or None when the directory could not be
    listed, plus the ``".."`` st_ino as a fourth item (0 if unknown); a file's directory that is
    not among them gets an entry flagged UNDESCRIBED. ``links``: key -> the symlink's own lstat,
    for keys whose name is a symlink."""
    links = links or {}
    by_dir: dict[bytes, list] = {}
    listed_sizes = False
    for raw, st, *rest in entries:
        flags = rest[0] if rest else 0
        if getattr(st, "link", False):
            flags |= INDEX_FLAG_SYMLINK
        parent, name = split_key(raw)
        by_dir.setdefault(parent, []).append((name, raw, st, flags))
        listed_sizes = listed_sizes or bool(flags & INDEX_FLAG_UNDESCRIBED)
    folders = {raw: (st, children, parent[0] if parent else 0) for raw, st, children, *parent in dirs}
    for parent in by_dir:
        folders.setdefault(parent, None)
    order = sorted(folders)
    dir_number = {}
    files = []  # (name, raw, st, flags) in index order
    counts = []
    for key in order:
        mine = sorted(by_dir.get(key, ()))
        files.extend(mine)
        counts.append(len(mine))
    nfiles = len(files)
    number = {raw: n for n, (_, raw, _, _) in enumerate(files, 1)}
    dir_number = {key: nfiles + j + 1 for j, key in enumerate(order)}
    linked = [(number[raw], links[raw]) for _, raw, _, flags in files if flags & INDEX_FLAG_SYMLINK and raw in links]
    link_number = {n: nfiles + len(order) + i + 1 for i, (n, _) in enumerate(linked)}
    any_listed = any(v is not None and v[1] is not None for v in folders.values())
    inos = array("Q", bytes(8 * nfiles)) if any_listed else None
    rows = []
    for key in order:
        given = folders[key]
        if given is None:
            rows.append((key, (0,) * 6 + (_stat.S_IFDIR, 0, 0, 0), INDEX_FLAG_UNDESCRIBED, 0, 0, None))
            continue
        st, children, parent_ino = given
        fields, (blocks, blksize) = stat_fields(st)
        listing = None
        if children is not None:
            others = []
            for name, d_type, d_ino in sorted(children):
                child = joined(key, name)
                if child in number:
                    inos[number[child] - 1] = d_ino
                else:
                    others.append((name, d_type, d_ino, dir_number.get(child, 0)))
            listing = (fields[4], parent_ino, others)
        rows.append((key, fields, INDEX_FLAG_LISTED if children is not None else 0, blocks, blksize, listing))
    stats, sizes = [], array("Q", bytes(8 * nfiles)) if listed_sizes else None
    for n, (_, raw, st, flags) in enumerate(files, 1):
        fields, (blocks, blksize) = stat_fields(st)
        if sizes is not None:
            sizes[n - 1] = max(fields[0], 0)
        stats.append(None if flags & INDEX_FLAG_UNDESCRIBED else (*fields, flags, link_number.get(n, 0), blocks, blksize))
    link_rows = [(n, *stat_fields(lst)[0], *stat_fields(lst)[1]) for n, lst in linked]
    return b"".join(pack(rows, counts, [name for name, *_ in files], stats, sizes, inos, link_rows))


def check_tables(data) -> None:
    """Is ``data`` an index of this version whose tables lie inside it, as the shim and the front
    door require before they map one (monarch_shim.c, door_index.c's index_valid)? A ValueError
    that says what is wrong if not: a file the daemon took as its snapshot and they refused would
    leave the job with nothing staged and every metadata call the PFS's. ``data`` may end at the
    stats' used end (a copy's, a pickle's): the stats' room is checked against the header's size."""
    if len(data) < INDEX_HEADER.size:
        raise ValueError(f"{len(data)} bytes, shorter than an index's header ({INDEX_HEADER.size})")
    (magic, version, entries, buckets, reserved, buckets_off, entries_off, keys_off, keys_size, children_off, nchildren,
     files, used, files_off, stats_off, size, dirs, _, names_size, ranges_off, sizes_off,
     inos_off) = INDEX_HEADER.unpack_from(data)
    if magic != INDEX_MAGIC or version != INDEX_VERSION:
        raise ValueError("not a Monarch index of version %d" % INDEX_VERSION)
    if not buckets:
        raise ValueError("its buckets (0) hold no key")
    if dirs >= buckets:
        raise ValueError(f"its directories ({dirs}) are not fewer than its buckets ({buckets})")
    if files + dirs > entries or used > files:
        raise ValueError(f"its files ({files}), directories ({dirs}) or stats used ({used}) are more than it "
                         f"holds ({entries} entries)")
    if names_size > keys_size:
        raise ValueError(f"its names ({names_size} bytes) are more than its key bytes ({keys_size})")
    if len(data) > size:
        raise ValueError(f"{len(data)} bytes, longer than its size ({size})")
    if size != stats_off + INDEX_ENTRY.size * files:
        raise ValueError(f"its size ({size}) is not where the room for its {files} files' stats ends")
    shapes_off = stats_off - 8 * INDEX_SHORT_ROOM * files - INDEX_ENTRY.size * dirs
    for what, off, length, end in (("buckets", buckets_off, 4 * buckets, len(data)),
                                   ("file records", files_off, INDEX_FILE.size * files, len(data)),
                                   ("directory ranges", ranges_off, 4 * (dirs + 1), len(data)),
                                   ("sizes", sizes_off, 8 * files if sizes_off else 0, len(data)),
                                   ("inodes", inos_off, (8 if reserved & INDEX_INOS_ONE else 8 * files)
                                    if inos_off else 0, len(data)),
                                   ("entries", entries_off, INDEX_ENTRY.size * (entries - files), len(data)),
                                   ("key bytes", keys_off, keys_size, len(data)),
                                   ("child records", children_off, INDEX_CHILD.size * nchildren, len(data)),
                                   ("shapes", shapes_off, 0, len(data)),
                                   ("stats used", stats_off, INDEX_ENTRY.size * used, len(data) if used else size),
                                   ("stats", stats_off, INDEX_ENTRY.size * files, size)):
        if off > end or length > end - off:
            raise ValueError(f"its {what} ({length} bytes at {off}) lie past its end ({end} bytes)")
    affixes = affixes_off(ranges_off, dirs)
    if affixes + AFFIX.size * dirs > min(len(data), entries_off):
        raise ValueError(f"its directories' affixes ({AFFIX.size * dirs} bytes at {affixes}) run past its entries")
    for j in range(dirs):
        a, p, s = AFFIX.unpack_from(data, affixes + AFFIX.size * j)
        if a + p + s > keys_size:
            raise ValueError(f"its directory {j}'s affixes ({p + s} bytes at {a}) lie past its key bytes ({keys_size})")
    if shapes_off < children_off + INDEX_CHILD.size * nchildren:
        raise ValueError(f"its stats ({stats_off}) leave no room for its shapes and shorts after its child records")
    ranges = memoryview(data)[ranges_off:ranges_off + 4 * (dirs + 1)].cast("B").cast("I")
    if ranges[0] != 0 or ranges[dirs] != files or any(a > b for a, b in zip(ranges, ranges[1:])):
        raise ValueError(f"its directories' file ranges do not cover its {files} files in order")
    if files and struct.unpack_from("<I", data, files_off + INDEX_FILE.size * (files - 1))[0] > names_size:
        raise ValueError(f"its last file's name lies past its {names_size} bytes of names")


class Index:
    """A read-only view of an index file's bytes (the shim's lookups, in Python). ``data`` may end
    at the used end: a stats slot past it reads as not described."""

    def __init__(self, data: bytes):
        if len(data) < INDEX_HEADER.size:
            raise ValueError("not a Monarch index of version %d: %d bytes" % (INDEX_VERSION, len(data)))
        (magic, version, self.entries, self.buckets, self.reserved, self.buckets_off, self.entries_off,
         self.keys_off, self.keys_size, self.children_off, self.nchildren, self.files, self.stats_used,
         self.files_off, self.stats_off, self.size, self.dirs, _, self.names_size, self.ranges_off, self.sizes_off,
         self.inos_off) = INDEX_HEADER.unpack_from(data)
        if magic != INDEX_MAGIC or version != INDEX_VERSION:
            raise ValueError("not a Monarch index of version %d" % INDEX_VERSION)
        self.data = data
        self.ranges = [struct.unpack_from("<I", data, self.ranges_off + 4 * j)[0] for j in range(self.dirs + 1)]

    def record(self, n: int) -> tuple:
        """File ``n``'s (from 1) INDEX_FILE fields."""
        return INDEX_FILE.unpack_from(self.data, self.files_off + INDEX_FILE.size * (n - 1))

    def middle(self, n: int) -> tuple[int, int]:
        """File ``n``'s name's own bytes: their offset in the key bytes and length."""
        start = self.record(n)[0]
        end = self.record(n + 1)[0] if n < self.files else self.names_size
        return start, end - start

    def name(self, n: int) -> bytes:
        """File ``n``'s name: its directory's files' common prefix, its middle, their common suffix."""
        off, length = self.middle(n)
        a, p, s = AFFIX.unpack_from(self.data, affixes_off(self.ranges_off, self.dirs) + AFFIX.size * (self.dir_of(n) - self.files - 1))
        k = self.keys_off
        return self.data[k + a:k + a + p] + self.data[k + off:k + off + length] + self.data[k + a + p:k + a + p + s]

    def dir_of(self, n: int) -> int:
        """The number of file ``n``'s directory."""
        return self.files + bisect.bisect_left(self.ranges, n)

    def short(self, n: int) -> tuple | None:
        """File ``n``'s stat from its short stat and its directory's shape, if its record names a
        short stat and both are whole; else None."""
        s, room = self.record(n)[1], INDEX_SHORT_ROOM * self.files
        shorts = self.stats_off - 8 * room
        if s <= self.files or s == INDEX_DESCRIBING or self.stats_off > len(self.data):
            return None
        k = s - self.files - 1
        words = struct.unpack_from(f"<{min(4, room - k)}Q", self.data, shorts + 8 * k) if k < room else (0,)
        if short_words(words[0]) > len(words):
            return None
        shape = INDEX_ENTRY.unpack_from(self.data, shorts - INDEX_ENTRY.size * (self.files + self.dirs - self.dir_of(n) + 1))
        return short_entry(shape, words, self.middle(n)[1], self.record(n)[0], n)

    def stat_slot(self, n: int) -> int:
        """The stats slot (from 1) of file ``n``, or 0 while it has none (not described, or its
        stat a short stat)."""
        s = self.record(n)[1]
        at = self.stats_off + INDEX_ENTRY.size * (s - 1)
        if s == INDEX_DESCRIBING or not 0 < s <= self.files or at + INDEX_ENTRY.size > len(self.data):
            return 0
        return s if INDEX_ENTRY.unpack_from(self.data, at)[18] == n else 0  # its stat names it back

    def file_size(self, n: int) -> int:
        """File ``n``'s size: its stat's, else its listed size, else 0."""
        s = self.stat_slot(n)
        if s:
            return INDEX_ENTRY.unpack_from(self.data, self.stats_off + INDEX_ENTRY.size * (s - 1))[3]
        if short := self.short(n):
            return short[3]
        return struct.unpack_from("<Q", self.data, self.sizes_off + 8 * (n - 1))[0] if self.sizes_off else 0

    def entry(self, number: int) -> tuple:
        """Entry ``number`` (from 1): the INDEX_ENTRY fields (a file not described yet: its
        ``undescribed_view``)."""
        if number <= self.files:
            s = self.stat_slot(number)
            if not s and (short := self.short(number)):
                return short
            if not s:
                return undescribed_view(self.middle(number)[1], self.record(number)[0], self.file_size(number))
            return INDEX_ENTRY.unpack_from(self.data, self.stats_off + INDEX_ENTRY.size * (s - 1))
        return INDEX_ENTRY.unpack_from(self.data, self.entries_off + INDEX_ENTRY.size * (number - self.files - 1))

    def key(self, number: int) -> bytes:
        if number <= self.files:
            return joined(self.key(self.dir_of(number)), self.name(number))
        if number > self.files + self.dirs:  # a link record: its file's
            return self.key(self.entry(number)[18])
        _, length, off = INDEX_ENTRY.unpack_from(self.data, self.entries_off + INDEX_ENTRY.size * (number - self.files - 1))[:3]
        return self.data[self.keys_off + off: self.keys_off + off + length]

    def number(self, raw: bytes) -> int:
        """Entry number (from 1) of ``raw``, or 0: a file's by a binary search of its directory's
        names (each directory's files lie in the bytewise order of their names), else a directory's
        by its bucket."""
        cut = raw.rfind(b"/")
        if 0 < cut < len(raw) - 1 and raw[cut - 1] != 0x2F:  # "a//b" names no file
            parent, name = split_key(raw)
            m = self.dir_number(parent)
            if m:
                j = m - self.files - 1
                lo, hi = struct.unpack_from("<II", self.data, self.ranges_off + 4 * j)
                lo += 1
                hi += 1
                while lo < hi:
                    n = (lo + hi) // 2
                    here = self.name(n)
                    if here == name:
                        return n
                    lo, hi = (lo, n) if name < here else (n + 1, hi)
        return self.dir_number(raw)

    def dir_number(self, raw: bytes) -> int:
        """Entry number (from 1) of directory ``raw``, or 0."""
        h = key_hash(raw)
        b = first_bucket(h, self.buckets)
        for _ in range(self.buckets):  # bounded, as the shim's look-up is
            n = struct.unpack_from("<I", self.data, self.buckets_off + 4 * b)[0]
            if n <= self.files or n > self.files + self.dirs:
                return 0
            if self.entry(n)[0] == h and self.key(n) == raw:
                return n
            b = b + 1 if b + 1 < self.buckets else 0
        return 0

    def children(self, number: int) -> list[tuple[bytes, int, int, int]]:
        """A listed directory's listing: (name, d_type, d_ino, entry number or 0), "." and ".."
        first, then its child records and its files in bytewise order of their names."""
        e = self.entry(number)
        out = []
        for i in range(e[18], e[18] + e[17]):
            d_ino, off, entry, nlen, d_type, _ = INDEX_CHILD.unpack_from(self.data, self.children_off + INDEX_CHILD.size * i)
            name = b"." if i == e[18] else b".." if i == e[18] + 1 else self.data[self.keys_off + off: self.keys_off + off + nlen]
            out.append((name, d_type, d_ino, entry))
        j = number - self.files - 1
        files = []
        for n in range(self.ranges[j] + 1, self.ranges[j + 1] + 1):
            link = self.entry(n)[13] & INDEX_FLAG_SYMLINK
            one = self.reserved & INDEX_INOS_ONE
            d_ino = struct.unpack_from("<Q", self.data, self.inos_off + (0 if one else 8 * (n - 1)))[0] if self.inos_off else 0
            files.append((self.name(n), DT_LNK if link else DT_REG, d_ino, n))
        return out[:2] + sorted(out[2:] + files)


def index_lookup(data: bytes, raw: bytes) -> tuple | None:
    """The entry of ``raw`` in an index (the shim's lookup, in Python for tests): a tuple in
    INDEX_ENTRY order after the key fields (size, mtime_ns, atime_ns, ctime_ns, ino, dev,
    mode, uid, gid, nlink, flags, link, blocks, blksize, children, first child), or None."""
    index = Index(data)
    n = index.number(raw)
    return index.entry(n)[3:] if n else None
