"""The index built where the shim will map it: a fresh file beside the name it is published
under, mapped shared and writable, filled there (a manifest or a kept snapshot copied by the
kernel, or the C walk's index built into it), then published by renaming it.

The daemon reads the snapshot from that very mapping, so the node holds the index once (the
file's pages, which every process maps), and nothing is read into the daemon's memory or
written out of it (a manifest of 10 million files is 1.7 GB: read into a buffer and written out
again, it would be most of a job's wait for its namespace, and the buffer the daemon's peak).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct

from monarch import protocol
from monarch.node.snapshot.indextable import used_ranges

_THIS_VERSION = struct.pack("<QI", protocol.INDEX_MAGIC, protocol.INDEX_VERSION)  # a header's first 12 bytes


class IndexFile:
    """A new file of ``size`` bytes beside ``at`` (``at.tmp-HEX``: what a dead instance leaves is
    removed by the next, monarch/node/instance.py), mapped shared: ``data``."""

    def __init__(self, at: str, size: int):
        if size <= 0:
            raise ValueError("an index is never empty")
        self.path: str | None = f"{at}.tmp-{os.urandom(6).hex()}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            self.data = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            self.discard()
            raise
        self._fd = fd  # kept for copy_of; closed once filled

    @classmethod
    def copy_of(cls, source: str, at: str) -> "IndexFile":
        """The index file ``source`` (a manifest, a kept snapshot) copied beside ``at``, mapped: its
        used parts, the copy as long as the index says (its rooms for the short stats and the stats
        of files described later are sparse, as the source's; copying them would write every page)."""
        src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = length = os.fstat(src).st_size
            ranges = [(0, length)]
            header = os.pread(src, protocol.INDEX_HEADER.size, 0)
            if len(header) == protocol.INDEX_HEADER.size and header[:12] == _THIS_VERSION:
                fields = protocol.INDEX_HEADER.unpack(header)
                (*_, files, used, _, stats_off, whole) = fields[:16]
                used_parts = used_ranges(fields)
                inside = all(0 <= a <= b for a, b in used_parts) and used_parts[-1][1] <= length
                if inside and length <= whole == stats_off + protocol.INDEX_ENTRY.size * files:
                    ranges, size = used_parts, whole  # else copied as it is, for check_tables to refuse
            made = cls(at, size)
            try:
                for start, end in ranges:
                    _copy(src, made._fd, start, end)
            except BaseException:
                made.discard()
                raise
            made._close_fd()
            return made
        finally:
            os.close(src)

    @classmethod
    def blank(cls, at: str, size: int) -> "IndexFile":
        made = cls(at, size)
        made._close_fd()
        return made

    def publish(self, path: str) -> None:
        """Renamed to ``path``: the shim and the door map it from there (the same pages)."""
        os.replace(self.path, path)
        self.path = None

    def discard(self) -> None:
        """The file removed, if not published (its mapping lives as long as its readers)."""
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.path = None

    def _close_fd(self) -> None:
        os.close(self._fd)
        self._fd = -1


def _copy(src: int, dst: int, done: int, size: int) -> None:
    """Bytes ``done`` to ``size`` from ``src`` to ``dst``, at the same offsets, in the kernel:
    copy_file_range (a reflink or a server-side copy where the filesystem has them), else sendfile
    across filesystems."""
    use_range = True
    while done < size:
        if use_range:
            try:
                n = os.copy_file_range(src, dst, size - done, done, done)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                use_range = False
                continue
        else:
            os.lseek(dst, done, os.SEEK_SET)
            n = os.sendfile(dst, src, done, size - done)
        if n == 0:
            raise OSError(errno.EIO, f"the index file ended at {done} of its {size} bytes while it was copied")
        done += n
