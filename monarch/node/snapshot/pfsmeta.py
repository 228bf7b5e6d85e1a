"""Metadata round trips to the PFS, paid once: directory descriptors, and the attributes an
open has already fetched.

On a parallel filesystem every path component of an ``open`` or ``stat`` is a lookup at the
metadata server unless the client caches it (the emulated PFS caches nothing, like a
Lustre or GPFS client under metadata pressure). Opening ``<root>/<dir>/<file>`` by its full
path costs one lookup per component, and ``fstat`` of the descriptor one more getattr.
Opened relative to a descriptor of its directory, a file costs one lookup (its own name);
and the lookup that opened it already refreshed its attributes, which
``statx(AT_STATX_DONT_SYNC)`` then reads without asking the server again.

That is the freshness a reader gets where the open itself refreshes the attributes: NFS
revalidates them at every open (close-to-open), GPFS keeps them coherent under its tokens,
FUSE looks the name up again (with a zero entry timeout; else its cache is what every
reader of the mount sees). Only on those filesystems (``fstatfs`` of the directory, once)
are the cached attributes trusted; elsewhere (Lustre, whose size may need a glimpse; local
filesystems, where ``fstat`` is cheap) ``fstat`` asks, as it does where ``statx`` is
missing (kernel before 4.11, a libc without it).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import platform
import struct
import threading
from contextlib import contextmanager
from typing import Iterator, NamedTuple

_AT_EMPTY_PATH = 0x1000
_AT_STATX_DONT_SYNC = 0x4000
_STATX_TYPE, _STATX_MODE, _STATX_INO, _STATX_SIZE, _STATX_MTIME = 0x1, 0x2, 0x100, 0x200, 0x40
_WANT = _STATX_TYPE | _STATX_MODE | _STATX_INO | _STATX_SIZE | _STATX_MTIME
_SYS_STATX = {"x86_64": 332, "aarch64": 291, "ppc64le": 383}.get(platform.machine())
_STATX_SIZEOF = 256


class OpenedStat(NamedTuple):
    """The fields the stager and the walk compare (os.stat_result's names)."""
    st_size: int
    st_mtime_ns: int
    st_ino: int
    st_mode: int


def _load_libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


_libc = _load_libc()


def _statx_call():
    """libc's statx, else the raw system call, else None."""
    libc = _libc
    if libc is None:
        return None
    fn = getattr(libc, "statx", None)
    if fn is not None:
        fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)
        return fn
    if _SYS_STATX is None:
        return None
    syscall = libc.syscall
    return lambda fd, path, flags, mask, buf: syscall(_SYS_STATX, ctypes.c_int(fd), ctypes.c_char_p(path),
                                                      ctypes.c_int(flags), ctypes.c_uint(mask), buf)


_statx = _statx_call()


_FIELDS = struct.Struct("<I24xH2xQQ64xqI")  # stx_mask, stx_mode, stx_ino, stx_size, stx_mtime (sec, nsec)
_buffers = threading.local()  # a statx buffer per thread: no allocation per call


def opened_stat(fd: int) -> OpenedStat:
    """Size, mtime, inode and mode of an open descriptor as its open left them in the
    client's cache (no round trip); ``os.fstat`` where that cannot be had."""
    if _statx is not None:
        buf = getattr(_buffers, "buf", None)
        if buf is None:
            buf = _buffers.buf = ctypes.create_string_buffer(_STATX_SIZEOF)
        if _statx(fd, b"", _AT_EMPTY_PATH | _AT_STATX_DONT_SYNC, _WANT, buf) == 0:
            mask, mode, ino, size, sec, nsec = _FIELDS.unpack_from(buf)
            if mask & _WANT == _WANT:
                return OpenedStat(size, sec * 1_000_000_000 + nsec, ino, mode)
    st = os.fstat(fd)
    return OpenedStat(st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)


# f_type of the filesystems whose open refreshes a file's attributes (see the module doc)
FRESH_AFTER_OPEN = {0x6969: "nfs", 0x65735546: "fuse", 0x47504653: "gpfs"}
_STATFS_SIZEOF = 120


def _fstatfs_call():
    fn = getattr(_libc, "fstatfs", None)
    if fn is None:
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_void_p)
    return fn


_fstatfs = _fstatfs_call()


def attrs_fresh_after_open(fd: int) -> bool:
    """Does an open on ``fd``'s filesystem leave fresh attributes in the client's cache?"""
    if _fstatfs is None or _statx is None:
        return False
    buf = ctypes.create_string_buffer(_STATFS_SIZEOF)
    if _fstatfs(fd, buf) != 0:
        return False
    return struct.unpack_from("@l", buf)[0] & 0xFFFFFFFF in FRESH_AFTER_OPEN


def checked_stat(fd: int, fresh: bool) -> OpenedStat:
    """The attributes to check a just-opened source against: the open's own where the
    filesystem refreshes them at open (``fresh``), else asked (``fstat``)."""
    if fresh:
        return opened_stat(fd)
    st = os.fstat(fd)
    return OpenedStat(st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)


def parent_key(key: str) -> tuple[str, str]:
    """``("0/a/b", "f")`` for ``"0/a/b/f"``; a file at the top of root k has parent ``"k/"``."""
    head, _, name = key.rpartition("/")
    return (head if "/" in head else head + "/"), name


class DirFds:
    """Descriptors of the dataset's directories the stager opens files in, least recently
    used closed beyond ``limit`` (never one in use: a closed number could be reused by
    another thread's open). A directory is used only if it is still the one the snapshot
    listed (same inode); else, and for a key the snapshot has no directory for, the caller
    opens the full path."""

    def __init__(self, snapshot, limit: int = 64):
        self.snapshot = snapshot
        self.limit = limit
        self._lock = threading.Lock()
        # dkey -> [fd, users, retired, attributes fresh after an open there]
        self._fds: collections.OrderedDict[str, list] = collections.OrderedDict()
        self._closed = False
        # root -> attributes fresh after an open there: a root is one filesystem, asked once (a
        # statfs per directory was one more PFS call per miss in random order)
        self._fresh: dict[str, bool] = {}

    def _open(self, dkey: str) -> int | None:
        d = self.snapshot.dirs.get(dkey)
        if d is None:
            return None
        try:
            # O_NONBLOCK as for files (sources.PFSSource._open): whatever is swapped in, never a wait
            fd = os.open(self.snapshot.source_path(dkey), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if opened_stat(fd).st_ino == d.info.ino:
                return fd
        except OSError:
            pass
        os.close(fd)
        return None

    def _take(self, dkey: str) -> list | None:
        with self._lock:
            held = self._fds.get(dkey)
            if held is not None:
                held[1] += 1
                self._fds.move_to_end(dkey)
                return held
        fd = self._open(dkey)
        if fd is None:
            return None
        with self._lock:
            held = self._fds.get(dkey)
            if held is not None:  # another thread opened it meanwhile
                os.close(fd)
                held[1] += 1
                return held
            root = dkey.partition("/")[0]
            if root not in self._fresh:
                self._fresh[root] = attrs_fresh_after_open(fd)
            held = [fd, 1, self._closed, self._fresh[root]]
            if not self._closed:
                self._fds[dkey] = held
            return held

    def _give_back(self, held: list) -> None:
        with self._lock:
            held[1] -= 1
            if held[2] and held[1] == 0:
                os.close(held[0])
            self._trim_locked()

    @contextmanager
    def parent_of(self, key: str) -> Iterator[tuple[int | None, str, bool]]:
        """``(dir fd or None, name, fresh)`` to open ``key`` with ``os.open(name, dir_fd=fd)``
        (None: open ``snapshot.source_path(key)``); ``fresh``: its filesystem refreshes
        attributes at open (``checked_stat``)."""
        dkey, name = parent_key(key)
        held = self._take(dkey)
        if held is None:
            yield None, name, False
            return
        try:
            yield held[0], name, held[3]
        finally:
            self._give_back(held)

    def _retire_locked(self, dkey: str) -> None:
        held = self._fds.pop(dkey)
        held[2] = True
        if held[1] == 0:
            os.close(held[0])

    def _trim_locked(self) -> None:
        over = len(self._fds) - self.limit
        if over <= 0:
            return
        for dkey in [k for k, held in self._fds.items() if held[1] == 0][:max(0, over)]:
            self._retire_locked(dkey)

    def forget(self, key: str) -> None:
        """The job changed ``key`` (a file or directory): the descriptors of it and of the
        directories under it are opened afresh next time (closed once no copy uses them)."""
        prefix = key.rstrip("/") + "/"
        with self._lock:
            for dkey in [k for k in self._fds if k == key or k.startswith(prefix)]:
                self._retire_locked(dkey)

    def close(self) -> None:
        """Close every descriptor (one in use when its last user is done)."""
        with self._lock:
            self._closed = True
            for dkey in list(self._fds):
                self._retire_locked(dkey)


def lstats_under_roots(roots: tuple[str, ...], items: list[tuple[int, str]], at_once: int) -> list:
    """Each ``(k, rel)``'s lstat (``rel`` "" : root ``k`` itself), relative to a descriptor of its
    root opened once (no lookup above the root), ``at_once`` in flight (at a PFS's latency a
    million directories one by one take minutes; a few at once is what its metadata servers
    answer): an os.stat_result, or None where it failed; or None for all if a root cannot be opened."""
    from concurrent.futures import ThreadPoolExecutor
    fds: list[int] = []
    try:
        for root in roots:
            fds.append(os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError:
        for fd in fds:
            os.close(fd)
        return [None] * len(items)

    def one(item: tuple[int, str]):
        k, rel = item
        try:
            return os.stat(rel, dir_fd=fds[k], follow_symlinks=False) if rel else os.fstat(fds[k])
        except OSError:
            return None
    try:
        if len(items) < 4 * at_once:
            return [one(item) for item in items]
        with ThreadPoolExecutor(at_once, thread_name_prefix="monarch-stat") as pool:
            return list(pool.map(one, items, chunksize=64))
    finally:
        for fd in fds:
            os.close(fd)
