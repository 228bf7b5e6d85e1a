"""The dataset walk in C (``walker.c``): the roots' trees listed and stat'ed by a few threads
outside the interpreter, and the snapshot index built from them, with no Python object
per file; and each file's route written into an index (``walk_routes``: ``index_writer.stamp_routes``). ``snapshot.load_or_walk`` takes it when the library is there; the Python walk
(``snapshot.take_snapshot``) is the fallback and the reference the C walk is tested against.

Without a C compiler, or with ``MONARCH_C_WALK=0``, the Python walk does it all.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Callable

from monarch.native.build import OptionalLibrary

SOURCE = Path(__file__).with_name("walker.c")
LIBRARY_NAME = "libmonarch_walker.so"
ENV_C_WALK = "MONARCH_C_WALK"
THREADS = 8  # directories listed and entries stat'ed at once: hides the PFS's metadata latency

_vp, _i, _u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
_LIBRARY = OptionalLibrary(SOURCE, Path(__file__).with_name(LIBRARY_NAME), "the C dataset walker",
                           "the dataset is walked in Python", {
                               "walk_run": (_vp, [ctypes.POINTER(_i), ctypes.POINTER(_i), ctypes.POINTER(_u64), _i, _i,
                                                  _i]),
                               "walk_index_size": (_u64, [_vp]),
                               "walk_counts": (None, [_vp, ctypes.POINTER(_u64)]),
                               "walk_build": (_i, [_vp, _vp, _u64, _i]),
                               "walk_free": (None, [_vp]),
                               "walk_routes": (_i, [_vp, _u64, _u64, ctypes.POINTER(_u64),
                                                    ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(_i), _i]),
                               "walk_describe": (ctypes.c_int64, [_vp, _u64, _u64, ctypes.POINTER(_i), _i,
                                                                  ctypes.POINTER(_u64), ctypes.POINTER(ctypes.c_uint8),
                                                                  ctypes.POINTER(_i), _i]),
                               "index_put_stat": (_i, [_vp, _u64, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int64),
                                                       ctypes.POINTER(_u64), ctypes.POINTER(ctypes.c_uint8),
                                                       ctypes.POINTER(_i), _i]),
                           })


def library() -> ctypes.CDLL | None:
    """The walker's library: built by ``pip install``, or from this checkout on first use
    (None, once logged, if it cannot be: the Python walk is used)."""
    return _LIBRARY.get()


def unwritten_bytearray(size: int) -> bytearray:
    """A bytearray of ``size`` bytes whose content is whatever its memory held: ``bytearray(size)``
    zeroes every page at once, which, beside the walk's own records, would double the peak."""
    out = bytearray()
    if size and _resize(ctypes.py_object(out), size) != 0:
        raise MemoryError(size)
    return out


_resize = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_ssize_t)(("PyByteArray_Resize", ctypes.pythonapi))


def wanted() -> bool:
    return os.environ.get(ENV_C_WALK, "1") not in ("0", "no", "off", "false")


def walk_index(roots: tuple[str, ...], threads: int = THREADS, describe: bool = True,
               buffer: Callable[[int], object] | None = None) -> tuple[bytearray, int] | None:
    """The index of a fresh walk of ``roots`` and its number of files (the first entries), or
    None when the C walker cannot be used. A root that cannot be opened is left out, as
    the Python walk leaves it (its files are read from the PFS). ``describe`` False: listing mode
    (walker.c's doc): the files are named, not stat'ed (each described later). ``buffer``: the
    writable buffer of a given size the index is built in, zeros (a fresh file's; by default a
    bytearray of whatever its memory held)."""
    lib = library() if wanted() else None
    if lib is None:
        return None
    fds, indexes, parents = [], [], []
    try:
        for index, root in enumerate(roots):
            try:
                fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                continue
            fds.append(fd)
            indexes.append(index)
            try:
                parents.append(os.stat(os.path.dirname(root.rstrip("/")) or "/").st_ino)
            except OSError:
                parents.append(0)
        n = len(fds)
        walk = lib.walk_run((ctypes.c_int * n)(*fds), (ctypes.c_int * n)(*indexes), (ctypes.c_uint64 * n)(*parents),
                            n, threads, int(describe))
        if not walk:
            err = ctypes.get_errno()
            raise OSError(err, f"the C walk of the dataset failed: {os.strerror(err)}")
        try:
            counts = (ctypes.c_uint64 * 3)()
            lib.walk_counts(walk, counts)
            index = (buffer or unwritten_bytearray)(lib.walk_index_size(walk))
            buf = (ctypes.c_char * len(index)).from_buffer(index)
            if lib.walk_build(walk, ctypes.addressof(buf), len(index), int(buffer is not None)) != 0:
                raise OSError("the C walk's index did not come out at its own size")
            del buf  # the bytearray may be resized or freed again
        finally:
            lib.walk_free(walk)
        return index, int(counts[0])
    finally:
        for fd in fds:
            os.close(fd)


def describe_index(data, nfiles: int, roots: tuple[str, ...], tables: tuple, threads: int = THREADS) -> int | None:
    """Every file of the index ``data`` (a writable buffer: the shared mapping the shim reads) that
    a listing-mode walk left undescribed, stat'ed and filled in place, ``threads`` at once, its route
    from ``tables`` (index_writer.route_tables). The number described; None without the C library."""
    lib = library()
    if lib is None:
        return None
    fds = []
    try:
        for root in roots:
            try:
                fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            except OSError:
                fds.append(-1)  # its files stay undescribed: described at their open, or read from the PFS
        n = len(fds)
        buf = (ctypes.c_char * len(data)).from_buffer(data)
        try:
            got = lib.walk_describe(ctypes.addressof(buf), len(data), nfiles, (ctypes.c_int * n)(*fds), n, *tables,
                                    threads)
        finally:
            del buf
        if got < 0:
            raise ValueError("not a Monarch index of this version")
        return int(got)
    finally:
        for fd in fds:
            if fd >= 0:
                os.close(fd)
