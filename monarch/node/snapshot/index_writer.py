"""The index file of a snapshot (protocol.py, "Snapshot index"), built without a Python object per file.

``index_layout.build_index`` takes any entries (tests build indexes from ``os.stat`` results);
it holds every entry's record, packed bytes and dictionary slots at once: ~1.8 KiB per file
at its peak, the daemon's largest memory at a million files. Here the same bytes come from
a ``Snapshot`` in a few passes over its files, each record packed into one preallocated
buffer as it is read (the files' entry numbers and key offsets are arrays, the snapshot's
own table finds a child's entry): a few dozen bytes per file beside the index itself.
``tests/unit/node/snapshot/test_index_writer.py`` holds the two builders to the same bytes.

Each file's route (``monarch/routes.py``) is published in its entry's flags when ``routes`` is
given: per root, ``routes.size_steps`` of the node (``Routes``); an index made before (the C walk's,
a kept one, node 0's) has them written in place (``stamp_routes``: ``index_fill.c``'s ``walk_routes``,
or here without the C library). The same steps give the same bits on either side.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
import struct
import sys
import threading
import weakref
import zlib
from array import array
from typing import Callable

from monarch import protocol
from monarch.index_layout import pad8
from monarch.node.snapshot import walker
from monarch.node.snapshot.indextable import IndexTable, put_stat
from monarch.records.filetable import FileTable
from monarch.routes import stepped

Routes = tuple  # per root k: routes.size_steps of the node for root k's files
ROUTE_STEPS = 8  # steps per root at most (monarch_native.h's MONARCH_ROUTE_STEPS)

_ENTRY = protocol.INDEX_ENTRY
_FILE = protocol.INDEX_FILE
_CHILD = protocol.INDEX_CHILD
_NAME_OFFSET = struct.Struct("<Q")  # a child record's second field
# an entry's stat fields (size .. nlink), its flags, and its blocks and blksize, at their offsets
_FLAGS, _FLAGS_AT = struct.Struct("<I"), 80


def _fields(st) -> tuple:
    return (st.size, st.mtime_ns, st.atime_ns, st.ctime_ns, st.ino, st.dev, st.mode, st.uid, st.gid, st.nlink)


def positions(files) -> Callable[[str], int | None]:
    """key -> its position among the files (their order in the index), or None."""
    if isinstance(files, (FileTable, IndexTable)):
        return files.row_of
    where = {key: n for n, key in enumerate(files)}
    return where.get


def route_flags(key: str, size: int, mode: int, routes: Routes | None) -> int:
    """The flags bits that publish the route of a file (0: none: no ``routes``, not a regular file,
    a root without steps)."""
    k = key.partition("/")[0]
    if routes is None or not stat.S_ISREG(mode) or not k.isdigit() or int(k) >= len(routes) or not routes[int(k)]:
        return 0
    return (stepped(size, routes[int(k)]) + 1) << protocol.INDEX_ROUTE_SHIFT


def route_tables(routes: Routes) -> tuple:
    """``routes`` as walker.c takes them: per root k, its steps' least sizes and routes at ``k *
    ROUTE_STEPS``, and how many steps each root has."""
    n = len(routes)
    smallest, route, counts = (ctypes.c_uint64 * (n * ROUTE_STEPS))(), (ctypes.c_uint8 * (n * ROUTE_STEPS))(), (ctypes.c_int * n)()
    for k, steps in enumerate(routes):
        if len(steps) > ROUTE_STEPS:
            raise ValueError("more route steps than the C index writer takes")
        counts[k] = len(steps)
        for j, (size, r) in enumerate(steps):
            smallest[k * ROUTE_STEPS + j], route[k * ROUTE_STEPS + j] = size, int(r)
    return smallest, route, counts


def stamp_routes(data: bytearray, nfiles: int, routes: Routes) -> None:
    """Publish the routes in the stats of the index ``data``'s first ``nfiles`` files, in place: in C
    (``index_fill.c``'s ``walk_routes``) when the library is there. A file not described yet gets
    none (``describe`` publishes it)."""
    lib = walker.library()
    if lib is not None:
        buf = (ctypes.c_char * len(data)).from_buffer(data)
        try:
            if lib.walk_routes(ctypes.addressof(buf), len(data), nfiles, *route_tables(routes), len(routes)) != 0:
                raise ValueError("not a Monarch index of version %d" % protocol.INDEX_VERSION)
        finally:
            del buf
        return
    table = IndexTable(data, nfiles)
    for n in range(nfiles):
        at = table.stat_at(n)
        if at >= 0:
            e = _ENTRY.unpack_from(data, at)
            _FLAGS.pack_into(data, at + _FLAGS_AT,
                             (e[13] & ~protocol.INDEX_ROUTE_MASK) | route_flags(table.key(n), e[3], e[9], routes))


class Describer:
    """The files of an index that a listing-mode walk left undescribed, stat'ed one by one when
    something needs them (``IndexTable.get``: the open that stages one, a kept copy adopted):
    index_fill.c's describe_entry for one file, relative to its root's descriptor (opened O_PATH once
    and kept: no lookup above the root, no opendir on the PFS). ``routes``: the node's, once its
    stager has them (``Snapshot.describe_with``)."""

    def __init__(self, roots: tuple[str, ...], routes: Routes | None = None):
        self.roots, self.routes = tuple(roots), routes
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        weakref.finalize(self, _close_all, self._fds)

    def use_routes(self, routes: Routes) -> None:
        self.routes = routes

    def _root_fd(self, k: int) -> int:
        fd = self._fds.get(k)
        if fd is None:
            fd = self._fds[k] = os.open(self.roots[k], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return fd

    def __call__(self, table: IndexTable, n: int) -> bool:
        """File ``n``'s stat taken now and written in its index (protocol.py: its stat in a free slot,
        then the slot in its record, which the shim loads first). False if the file is gone or no
        longer a regular file (it stays undescribed: nothing is served from it)."""
        if table.stat_at(n) >= 0:
            return True
        if not isinstance(table.data, (bytearray, mmap.mmap)):
            return False  # an index received, not published here yet: its files are described once it is
        key = table.key(n)
        k, _, rel = key.partition("/")
        try:
            with self._lock:
                fd = self._root_fd(int(k))
            st = os.stat(rel, dir_fd=fd, follow_symlinks=False)
        except (OSError, ValueError, IndexError):
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        fields = (st.st_size, st.st_mtime_ns, st.st_atime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode,
                  st.st_uid, st.st_gid, st.st_nlink, st.st_blocks, st.st_blksize)
        lib = walker.library()
        with self._lock:  # one Python writer at a time; the front door's (C) claims its file first, as this does
            if lib is not None:
                routes = route_tables(self.routes) if self.routes is not None else (None, None, None)
                buf = (ctypes.c_char * len(table.data)).from_buffer(table.data)
                try:
                    lib.index_put_stat(ctypes.addressof(buf), len(table.data), n + 1, (ctypes.c_int64 * 12)(*fields),
                                       *routes, len(self.routes) if self.routes is not None else 0)
                finally:
                    del buf
            elif table.stat_at(n) < 0:
                put_stat(table, n, fields, route_flags(key, st.st_size, st.st_mode, self.routes))
        return table.stat_at(n) >= 0


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        os.close(fd)


def index_bytes(snap, routes: Routes | None = None) -> bytes:
    """The index of ``snap`` (a ``snapshot.Snapshot``: its ``files``, ``dirs`` and ``links``)."""
    return b"".join(index_parts(snap, routes))


def index_parts(snap, routes: Routes | None = None) -> list:
    """The index of ``snap`` as the buffers that make it, in order (written one after the
    other, with no joined copy), each file's route published when ``routes`` is given. A snapshot
    read from its index is written as that index (its routes rewritten in place if given)."""
    files, dirs, links = snap.files, snap.dirs, snap.links
    if isinstance(files, IndexTable):
        if routes is None:
            return [files.data]
        # stamped in a copy when the table's buffer is not writable (an index received from
        # node 0, or read from a kept file, is bytes); the table itself needs no routes: Python
        # reads the same steps from the stager's books (StagerBooks.route)
        data = files.data if isinstance(files.data, (bytearray, mmap.mmap)) else bytearray(files.data)
        stamp_routes(data, files.nfiles, routes)
        return [data]
    kb = protocol.key_bytes
    nfiles = len(files)
    dir_keys = list(dirs)
    dir_position = {key: nfiles + j for j, key in enumerate(dir_keys)}
    file_position = positions(files)

    def position(key: str) -> int | None:
        n = file_position(key)
        return n if n is not None else dir_position.get(key)

    items = nfiles + len(dir_keys)
    linked = sorted((file_position(k), k) for k, _ in links.items()
                    if file_position(k) is not None and files[k].link)  # a link's own lstat follows the items
    link_number = {key: items + i + 1 for i, (_, key) in enumerate(linked)}
    total = items + len(linked)
    nbuckets = 16
    while nbuckets < 2 * total:
        nbuckets *= 2
    mask = nbuckets - 1
    buckets = array("I", bytes(4 * nbuckets))
    records = bytearray(_FILE.size * nfiles)
    fixed = bytearray(_ENTRY.size * (total - nfiles))
    stats = bytearray(_ENTRY.size * nfiles)  # every file described (a snapshot's FileInfo): file n's stat in slot n
    keys = bytearray()
    key_offset = array("Q")
    hashes = array("I")

    def place(raw: bytes) -> int:
        h = zlib.crc32(raw) & 0xFFFFFFFF
        hashes.append(h)
        key_offset.append(len(keys))
        keys.extend(raw)
        return h

    def bucket(n: int, h: int) -> None:
        b = h & mask
        while buckets[b]:
            b = (b + 1) & mask
        buckets[b] = n + 1

    # the files, their keys, records and stats; then the directories' keys (the key blob's order)
    for n, (key, info) in enumerate(files.items()):
        raw = kb(key)
        h = place(raw)
        bucket(n, h)
        flags = (protocol.INDEX_FLAG_SYMLINK if info.link else 0) | route_flags(key, info.size, info.mode, routes)
        _FILE.pack_into(records, n * _FILE.size, h, len(raw), key_offset[n], info.size, n + 1, 0)
        _ENTRY.pack_into(stats, n * _ENTRY.size, h, len(raw), key_offset[n], *_fields(info), flags,
                         link_number.get(key, 0), info.blocks, info.blksize, 0, n + 1)
    for key in dir_keys:
        place(kb(key))

    # the directories' records and listings
    children = bytearray()
    nchildren = 0
    names: dict[bytes, int] = {}  # a listed name that is no entry of the index: its bytes, once
    spare: list[tuple[int, bytes]] = []  # (child record number, name) whose name offset comes last
    for j, key in enumerate(dir_keys):
        n = nfiles + j
        d = dirs[key]
        info = d.info
        raw = kb(key)
        bucket(n, hashes[n])
        first = nchildren
        listed = d.children is not None
        if listed:
            prefix = raw if raw.endswith(b"/") else raw + b"/"
            skey = key if key.endswith("/") else key + "/"
            children += _CHILD.pack(info.ino, 0, 0, 0, protocol.DT_DIR, 0)  # "." and "..": no name stored
            children += _CHILD.pack(d.parent_ino, 0, 0, 0, protocol.DT_DIR, 0)
            nchildren += 2
            for name, d_type, d_ino in sorted(d.children):
                c = position(skey + os.fsdecode(name))
                if c is not None:
                    children += _CHILD.pack(d_ino, key_offset[c] + len(prefix), c + 1, len(name), d_type, 0)
                else:
                    children += _CHILD.pack(d_ino, 0, 0, len(name), d_type, 0)
                    spare.append((nchildren, name))
                nchildren += 1
        flags = protocol.INDEX_FLAG_LISTED if listed else 0
        _ENTRY.pack_into(fixed, j * _ENTRY.size, hashes[n], len(raw), key_offset[n], *_fields(info), flags, 0,
                         info.blocks, info.blksize, nchildren - first, first)

    # the links' own records (reached through their file's stat, not hashed)
    for i, (n, key) in enumerate(linked):
        lst = links[key]
        raw = kb(key)
        _ENTRY.pack_into(fixed, (len(dir_keys) + i) * _ENTRY.size, zlib.crc32(raw) & 0xFFFFFFFF, len(raw),
                         key_offset[n], *_fields(lst), 0, 0, lst.blocks, lst.blksize, 0, 0)

    # names that are no entry's key: after every key, each once, in listing order
    for record, name in spare:
        off = names.get(name)
        if off is None:
            off = names[name] = len(keys)
            keys.extend(name)
        _NAME_OFFSET.pack_into(children, record * _CHILD.size + 8, off)

    if sys.byteorder != "little":
        buckets.byteswap()
    buckets_off = protocol.INDEX_HEADER.size
    files_off = buckets_off + 4 * nbuckets
    entries_off = files_off + len(records)
    keys_off = entries_off + len(fixed)
    children_off = pad8(keys_off + len(keys))
    stats_off = pad8(children_off + len(children))
    header = protocol.INDEX_HEADER.pack(protocol.INDEX_MAGIC, protocol.INDEX_VERSION, total, nbuckets, 0, buckets_off,
                                        entries_off, keys_off, len(keys), children_off, nchildren, nfiles, nfiles,
                                        files_off, stats_off, stats_off + len(stats))
    return [header, buckets.tobytes(), records, fixed, keys, b"\0" * (children_off - keys_off - len(keys)), children,
            b"\0" * (stats_off - children_off - len(children)), stats]
