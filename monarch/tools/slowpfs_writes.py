"""The emulated PFS's writes (``slowpfs --writable``): the operations a writable mount adds to the
read-only ones of :mod:`monarch.tools.slowpfs`, and the FUSE class that passes rename's flags.

Each write is done on SRC by the FUSE server, as its user, so that it gives what the same call
made directly on SRC would: the bytes at the offset given, the permissions, the errors, the owner.
The open latency applies to create and to an open for writing; each write call waits its latency
and its turn on the write bandwidth (apart from the reads'). Counted: ``writes`` and
``bytes_written`` (per file too), ``creates``, ``fsyncs``, ``renames``, ``unlinks``, ``mkdirs``,
``rmdirs``, ``truncates``, and every namespace operation and fsync in order (``ops``).
mfusepy is imported only where a mount is made.

With ``direct_io`` a write reaches the PFS at the writer's own size up to libfuse 3's max_write,
1 MiB (256 pages, its most and its default: a 16 MiB write from a page-aligned buffer is 16 calls,
from an unaligned one 17). Not emulated: rename's flags (RENAME_NOREPLACE, RENAME_EXCHANGE: EINVAL,
as a filesystem without them answers), fallocate's modes (EOPNOTSUPP), and ``fstat`` of a file
unlinked while open (ESTALE: libfuse's high-level API has no name left for it; its reads and writes
work). An unlink takes the name from SRC at once (``hard_remove``), never as a hidden rename.
"""

from __future__ import annotations

import errno
import os
import time

# the kernel's UTIME_NOW and UTIME_OMIT, which libfuse passes as a time's nanoseconds with 0 seconds
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
# open flags that say how to find or make the file, not how to use it; O_DIRECT: SRC may refuse it (tmpfs)
NOT_PASSED = os.O_CREAT | os.O_EXCL | os.O_NOCTTY | getattr(os, "O_DIRECT", 0)


def rel(path: str | None) -> str:
    """A path as the counters name it: relative to the mount ("?": a file unlinked while open)."""
    return "?" if path is None else path.lstrip("/")


def writable_operations(base: type) -> type:
    """``base`` (slowpfs's read-only operations: ``_real``, ``_open``, ``counters``, ``latency``,
    ``write_throttle``) with the writes."""
    from mfusepy import FuseOSError

    class WritableOperations(base):
        writable = True

        def open(self, path: str, fi) -> int:
            self._open(path, fi, fi.flags & ~NOT_PASSED)
            if fi.flags & os.O_TRUNC:  # the kernel leaves the truncation to the open (atomic_o_trunc)
                self.counters.add("truncates", op=f"truncate {rel(path)}")
            return 0

        def create(self, path: str, mode: int, fi) -> int:
            self._open(path, fi, (fi.flags & ~NOT_PASSED) | os.O_CREAT | (fi.flags & os.O_EXCL), mode)
            self.counters.add("creates", op=f"create {rel(path)}")
            return 0

        def write(self, path: str | None, data: bytes, offset: int, fi) -> int:
            if self.latency.write_s:
                time.sleep(self.latency.write_s)
            self.write_throttle.wait(len(data))  # before the bytes land, as over a link to a PFS
            n = os.pwrite(fi.fh, data, offset)
            self.counters.add("writes", None if path is None else rel(path), nbytes=n)
            return n

        def truncate(self, path: str, length: int, fh=None) -> int:
            os.truncate(self._real(path), length)  # libfuse 3 names the path, an open file's too
            self.counters.add("truncates", op=f"truncate {rel(path)}")
            return 0

        def fallocate(self, path: str | None, mode: int, offset: int, size: int, fi) -> int:
            if mode:  # punching holes, keeping the size: not emulated
                raise FuseOSError(errno.EOPNOTSUPP)
            os.posix_fallocate(fi.fh, offset, size)
            return 0

        def flush(self, path: str | None, fi) -> int:
            return 0  # every write reached SRC already

        def fsync(self, path: str | None, datasync: int, fi) -> int:
            (os.fdatasync if datasync else os.fsync)(fi.fh)
            self.counters.add("fsyncs", op=f"fsync {rel(path)}")
            return 0

        def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
            fd = os.open(self._real(path or "/"), os.O_RDONLY | os.O_DIRECTORY)  # no opendir here: no handle
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self.counters.add("fsyncs", op=f"fsync {rel(path)}/")
            return 0

        def rename(self, old: str, new: str, flags: int = 0) -> int:
            if flags:  # RENAME_NOREPLACE, RENAME_EXCHANGE: not emulated; callers (mv) fall back on EINVAL
                raise FuseOSError(errno.EINVAL)
            os.rename(self._real(old), self._real(new))
            self.counters.add("renames", op=f"rename {rel(old)} {rel(new)}")
            return 0

        def unlink(self, path: str) -> int:
            os.unlink(self._real(path))
            self.counters.add("unlinks", op=f"unlink {rel(path)}")
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._real(path), mode)
            self.counters.add("mkdirs", op=f"mkdir {rel(path)}")
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._real(path))
            self.counters.add("rmdirs", op=f"rmdir {rel(path)}")
            return 0

        def link(self, target: str, source: str) -> int:  # mfusepy's order: the new name first
            os.link(self._real(source), self._real(target))
            self.counters.add(None, op=f"link {rel(source)} {rel(target)}")
            return 0

        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, self._real(target))  # source: what the link says, as given
            self.counters.add(None, op=f"symlink {rel(target)}")
            return 0

        # the kernel resolved any symlink before these: the path names the object itself
        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._real(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.lchown(self._real(path), uid, gid)  # -1 leaves one as it is (mfusepy passes it so)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            real = self._real(path)
            if times is None:
                os.utime(real, follow_symlinks=False)
                return 0
            st, now = os.lstat(real), time.time_ns()
            os.utime(real, ns=tuple(now if t == UTIME_NOW else kept if t == UTIME_OMIT else t
                                    for t, kept in zip(times, (st.st_atime_ns, st.st_mtime_ns))),
                     follow_symlinks=False)
            return 0

    return WritableOperations


def fuse_class() -> type:
    """mfusepy's FUSE with rename's flags passed on: it drops them, and a RENAME_NOREPLACE taken for a
    plain rename would replace the file it promises to keep."""
    import mfusepy

    class FUSE(mfusepy.FUSE):
        def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
            return self.operations.rename(old.decode(self.encoding, self.errors),
                                          new.decode(self.encoding, self.errors), flags)

    return FUSE
