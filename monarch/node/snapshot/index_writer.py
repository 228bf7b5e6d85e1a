"""The index file of a snapshot (protocol.py, "Snapshot index"), built without a Python object per file.

``protocol.build_index`` takes any entries (tests build indexes from ``os.stat`` results);
it holds every entry's record, packed bytes and dictionary slots at once: ~1.8 KiB per file
at its peak, the daemon's largest memory at a million files. Here the same bytes come from
a ``Snapshot`` in a few passes over its files, each record packed into one preallocated
buffer as it is read (the files' entry numbers and key offsets are arrays, the snapshot's
own table finds a child's entry): a few dozen bytes per file beside the index itself.
``tests/unit/node/snapshot/test_index_writer.py`` holds the two builders to the same bytes.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from typing import Callable

from monarch import protocol
from monarch.node.snapshot.indextable import IndexTable
from monarch.records.filetable import FileTable

_ENTRY = protocol.INDEX_ENTRY
_CHILD = protocol.INDEX_CHILD
_NAME_OFFSET = struct.Struct("<Q")  # a child record's second field


def _fields(st) -> tuple:
    return (st.size, st.mtime_ns, st.atime_ns, st.ctime_ns, st.ino, st.dev, st.mode, st.uid, st.gid, st.nlink)


def positions(files) -> Callable[[str], int | None]:
    """key -> its position among the files (their order in the index), or None."""
    if isinstance(files, (FileTable, IndexTable)):
        return files.row_of
    where = {key: n for n, key in enumerate(files)}
    return where.get


def index_bytes(snap) -> bytes:
    """The index of ``snap`` (a ``snapshot.Snapshot``: its ``files``, ``dirs`` and ``links``)."""
    return b"".join(index_parts(snap))


def index_parts(snap) -> list:
    """The index of ``snap`` as the buffers that make it, in order (written one after the
    other, with no joined copy). A snapshot read from its index is written as that index."""
    files, dirs, links = snap.files, snap.dirs, snap.links
    if isinstance(files, IndexTable):
        return [files.data]
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
    entries = bytearray(_ENTRY.size * total)
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

    # the files, their keys and records; then the directories' keys (the key blob's order)
    for n, (key, info) in enumerate(files.items()):
        raw = kb(key)
        h = place(raw)
        bucket(n, h)
        flags = protocol.INDEX_FLAG_SYMLINK if info.link else 0
        _ENTRY.pack_into(entries, n * _ENTRY.size, h, len(raw), key_offset[n], *_fields(info), flags,
                         link_number.get(key, 0), info.blocks, info.blksize, 0, 0)
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
        _ENTRY.pack_into(entries, n * _ENTRY.size, hashes[n], len(raw), key_offset[n], *_fields(info), flags, 0,
                         info.blocks, info.blksize, nchildren - first, first)

    # the links' own records (reached through their file's entry, not hashed)
    for i, (n, key) in enumerate(linked):
        lst = links[key]
        raw = kb(key)
        _ENTRY.pack_into(entries, (items + i) * _ENTRY.size, zlib.crc32(raw) & 0xFFFFFFFF, len(raw), key_offset[n],
                         *_fields(lst), 0, 0, lst.blocks, lst.blksize, 0, 0)

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
    entries_off = buckets_off + 4 * nbuckets
    keys_off = entries_off + len(entries)
    children_off = keys_off + len(keys)
    children_off += -children_off % 8
    header = protocol.INDEX_HEADER.pack(protocol.INDEX_MAGIC, protocol.INDEX_VERSION, total, nbuckets, 0, buckets_off,
                                        entries_off, keys_off, len(keys), children_off, nchildren)
    return [header, buckets.tobytes(), entries, keys, b"\0" * (children_off - keys_off - len(keys)), children]
