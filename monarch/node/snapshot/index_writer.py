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
import threading
import weakref
from array import array
from typing import Callable

from monarch import protocol
from monarch.index_layout import joined, pack, split_key
from monarch.node.snapshot import walker
from monarch.node.snapshot.indextable import IndexTable, put_stat
from monarch.routes import stepped

Routes = tuple  # per root k: routes.size_steps of the node for root k's files
ROUTE_STEPS = 8  # steps per root at most (monarch_native.h's MONARCH_ROUTE_STEPS)

_ENTRY = protocol.INDEX_ENTRY
# an entry's stat fields (size .. nlink), its flags, and its blocks and blksize, at their offsets
_FLAGS, _FLAGS_AT = struct.Struct("<I"), 80
_U64 = struct.Struct("<Q")


def _fields(st) -> tuple:
    return (st.size, st.mtime_ns, st.atime_ns, st.ctime_ns, st.ino, st.dev, st.mode, st.uid, st.gid, st.nlink)


def positions(files) -> Callable[[str], int | None]:
    """key -> its position among the files in their index (its entry number - 1), or None."""
    if isinstance(files, IndexTable):
        return files.row_of
    where = {key: n for n, key in enumerate(key for _, mine in grouped(files) for _, key in mine)}
    return where.get


def grouped(files, dir_keys=()) -> list[tuple[bytes, list[tuple[bytes, str]]]]:
    """``files``' keys in their index's order: per directory (those of ``dir_keys`` too, with no
    file), in the bytewise order of the keys, (its key, [(name, key)] by name)."""
    by_dir: dict[bytes, list] = {protocol.key_bytes(key): [] for key in dir_keys}
    for key in files:
        parent, name = split_key(protocol.key_bytes(key))
        by_dir.setdefault(parent, []).append((name, key))
    return [(parent, sorted(by_dir[parent])) for parent in sorted(by_dir)]


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
    shorts = protocol.INDEX_HEADER.unpack_from(data)[14] - 8 * nfiles
    for n in range(nfiles):
        if (e := table.short(n)) is not None:  # the route's 4 bits in its short word
            word = _U64.unpack_from(data, shorts + 8 * n)[0] & ~(0xF << protocol.INDEX_SHORT_ROUTE_AT)
            bits = route_flags(table.key(n), e[3], e[9], routes) >> protocol.INDEX_ROUTE_SHIFT
            _U64.pack_into(data, shorts + 8 * n, word | bits << protocol.INDEX_SHORT_ROUTE_AT)
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
        if table.is_described(n):
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
            elif not table.is_described(n):
                put_stat(table, n, fields, route_flags(key, st.st_size, st.st_mode, self.routes))
        return table.is_described(n)


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        os.close(fd)


def index_bytes(snap, routes: Routes | None = None) -> bytes:
    """The index of ``snap`` (a ``snapshot.Snapshot``: its ``files``, ``dirs`` and ``links``)."""
    return b"".join(index_parts(snap, routes))


def index_parts(snap, routes: Routes | None = None) -> list:
    """The index of ``snap`` as the buffers that make it, in order (written one after the
    other, with no joined copy), each file's route published when ``routes`` is given. A snapshot
    read from its index is written as that index (its routes rewritten in place if given); any
    other is numbered as an index orders its files (each directory's after the other's, by name)."""
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
    folders = {protocol.key_bytes(key): d for key, d in dirs.items()}
    order = grouped(files, dirs)
    nfiles = sum(len(mine) for _, mine in order)
    dir_number = {key: nfiles + j + 1 for j, (key, _) in enumerate(order)}
    listed = any(d.children is not None for d in dirs.values())
    inos = array("Q", bytes(8 * nfiles)) if listed else None
    linked, rows, n = [], [], 0
    for parent, mine in order:
        d = folders.get(parent)
        for i, (_, key) in enumerate(mine, n + 1):
            if key in links and files[key].link:
                linked.append((i, key))
        if d is None:  # a file's directory the snapshot does not hold: nothing is answered from it
            rows.append((parent, (0,) * 6 + (stat.S_IFDIR, 0, 0, 0), protocol.INDEX_FLAG_UNDESCRIBED, 0, 0, None))
        else:
            listing = None
            if d.children is not None:
                mine_at = {name: i for i, (name, _) in enumerate(mine, n)}
                others = []
                for name, d_type, d_ino in sorted(d.children):
                    at = mine_at.get(name)
                    if at is not None:
                        inos[at] = d_ino
                    else:
                        others.append((name, d_type, d_ino, dir_number.get(joined(parent, name), 0)))
                listing = (d.info.ino, d.parent_ino, others)
            rows.append((parent, _fields(d.info), protocol.INDEX_FLAG_LISTED if listing is not None else 0,
                         d.info.blocks, d.info.blksize, listing))
        n += len(mine)
    link_number = {i: nfiles + len(order) + j + 1 for j, (i, _) in enumerate(linked)}

    def stats():
        for i, (_, key) in enumerate((item for _, mine in order for item in mine), 1):
            info = files[key]
            flags = (protocol.INDEX_FLAG_SYMLINK if info.link else 0) | route_flags(key, info.size, info.mode, routes)
            yield (*_fields(info), flags, link_number.get(i, 0), info.blocks, info.blksize)

    names = (name for _, mine in order for name, _ in mine)
    link_rows = [(i, *_fields(links[key]), links[key].blocks, links[key].blksize) for i, key in linked]
    return pack(rows, [len(mine) for _, mine in order], names, stats(), None, inos, link_rows)
