"""The emulated PFS's generated tree (``slowpfs --generate N``): N files made by formula, nothing
stored, for datasets of millions of files that no disk here needs to hold.

Layout: ``d000000/f00000000.bin`` ...: directory k holds files ``k*per_dir`` to
``min(N, (k+1)*per_dir) - 1``, each name the index written at its fixed width (wider only past it).
File i's size, :func:`generated_size`, lies between ``min_size`` and ``max_size``, drawn from a
64-bit hash of (seed, i); its bytes, :func:`generated_bytes`, are a pattern of ``PERIOD`` bytes
(SHAKE-128 of that hash) repeated: byte k is ``pattern[k % PERIOD]``, so a test or a benchmark
checks every byte without a copy (a file over ``PERIOD`` bytes repeats itself and compresses).
Files and directories have the mount's start as their times, read-only modes, the server's user.

The server keeps nothing per file: each answer is computed from the name, and its counters keep
totals only (no ``files`` entries). A directory is listed with each entry's type (``find -type f``
needs no lookup per file). The latencies and counters are the read-only mount's: the lookup latency
on getattr, readdir and access, the open latency on open, the read latency and bandwidth on read.
mfusepy is imported only where a mount is made.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import itertools
import os
import stat
import time
from dataclasses import dataclass
from typing import Any, Iterator

from monarch.errors import ConfigError
from monarch.sizes import parse_size

DIR_NAME = "d{:06d}"
FILE_NAME = "f{:08d}.bin"
PERIOD = 4099  # a file's pattern, in bytes: a prime over the default largest file (4 KiB)
PER_DIR = 1000
MIN_SIZE, MAX_SIZE = 1024, 4096
_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a 64-bit integer hashed to another, the same everywhere."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def generated_key(i: int, seed: int = 0) -> int:
    """File ``i``'s 64-bit hash, from which its size and bytes are drawn."""
    return _mix(_mix(seed & _M64) ^ i)


def generated_size(i: int, min_size: int = MIN_SIZE, max_size: int = MAX_SIZE, seed: int = 0) -> int:
    """File ``i``'s size in bytes, ``min_size`` to ``max_size`` (both included)."""
    return min_size + generated_key(i, seed) % (max_size - min_size + 1)


def generated_pattern(i: int, seed: int = 0) -> bytes:
    """The ``PERIOD`` bytes file ``i`` repeats."""
    return hashlib.shake_128(generated_key(i, seed).to_bytes(8, "little")).digest(PERIOD)


def generated_bytes(i: int, offset: int = 0, length: int | None = None, min_size: int = MIN_SIZE,
                    max_size: int = MAX_SIZE, seed: int = 0) -> bytes:
    """File ``i``'s bytes from ``offset``, ``length`` of them (None: to the end), cut at its end."""
    end = generated_size(i, min_size, max_size, seed)
    if length is not None:
        end = min(end, offset + length)
    if offset >= end:
        return b""
    start = offset % PERIOD
    return (generated_pattern(i, seed) * ((start + end - offset) // PERIOD + 1))[start:start + end - offset]


def parse_size_range(text: str) -> tuple[int, int]:
    """``"1KiB-4KiB"`` -> (1024, 4096); one size alone: every file of that size."""
    low, sep, high = text.partition("-")
    try:
        sizes = (parse_size(low), parse_size(high if sep else low))
    except ValueError as exc:
        raise ConfigError(f"--file-size: expected MIN-MAX like 1KiB-4KiB, got {text!r}: {exc}") from None
    if sizes[0] > sizes[1]:
        raise ConfigError(f"--file-size: {text!r} has its smallest size above its largest")
    return sizes


@dataclass(frozen=True)
class Generated:
    """A generated tree: ``files`` files, ``per_dir`` a directory, sizes from ``min_size`` to
    ``max_size``; ``seed`` draws other sizes and bytes. ``SlowPFS(Generated(files=N), mnt)``."""

    files: int
    per_dir: int = PER_DIR
    min_size: int = MIN_SIZE
    max_size: int = MAX_SIZE
    seed: int = 0

    def __post_init__(self) -> None:
        if self.files < 0 or self.per_dir < 1:
            raise ConfigError(f"generated tree: files must be 0 or more and per_dir 1 or more, got "
                              f"{self.files} and {self.per_dir}")
        if not 0 <= self.min_size <= self.max_size:
            raise ConfigError(f"generated tree: sizes must be 0 <= min <= max, got {self.min_size}-{self.max_size}")

    @property
    def directories(self) -> int:
        return -(-self.files // self.per_dir)

    def path(self, i: int) -> str:
        """File ``i``'s path relative to the mount."""
        return f"{DIR_NAME.format(i // self.per_dir)}/{FILE_NAME.format(i)}"

    def paths(self) -> Iterator[str]:
        return (self.path(i) for i in range(self.files))

    def size(self, i: int) -> int:
        return generated_size(i, self.min_size, self.max_size, self.seed)

    def data(self, i: int, offset: int = 0, length: int | None = None) -> bytes:
        return generated_bytes(i, offset, length, self.min_size, self.max_size, self.seed)

    def directory(self, name: str) -> int | None:
        """The index of the directory of this name, None if there is none."""
        k = _number(name, DIR_NAME, "d")
        return k if k is not None and k < self.directories else None

    def file(self, path: str) -> int | None:
        """The index of the file at ``path`` (``/d000000/f00000000.bin``), None if there is none."""
        parts = path.strip("/").split("/")
        k = self.directory(parts[0]) if len(parts) == 2 else None
        i = _number(parts[1], FILE_NAME, "f") if k is not None else None
        return i if i is not None and i < self.files and i // self.per_dir == k else None

    def argv(self) -> list[str]:
        """This tree as slowpfs's command line gives it."""
        return ["--generate", str(self.files), "--per-dir", str(self.per_dir),
                "--file-size", f"{self.min_size}-{self.max_size}", "--seed", str(self.seed)]


def _number(name: str, form: str, prefix: str) -> int | None:
    """The number in ``name`` if ``form`` writes it so (no other spelling of it), else None."""
    digits = name[1:].partition(".")[0]
    if not name.startswith(prefix) or not (digits.isascii() and digits.isdigit()):
        return None
    n = int(digits)
    return n if form.format(n) == name else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--generate", type=int, metavar="N",
                        help="serve N generated files instead of SRC (no SRC given): nothing stored, read-only")
    parser.add_argument("--per-dir", type=int, metavar="D", help=f"files a directory (default {PER_DIR})")
    parser.add_argument("--file-size", metavar="MIN-MAX", help="file sizes (default 1KiB-4KiB)")
    parser.add_argument("--seed", type=int, help="draws other sizes and bytes (default 0)")


def from_args(args: argparse.Namespace) -> Generated | None:
    """The tree the command line asks for, None without ``--generate``; ConfigError if wrong."""
    if args.generate is None:
        if (args.per_dir, args.file_size, args.seed) != (None, None, None):
            raise ConfigError("--per-dir, --file-size and --seed need --generate N")
        return None
    low, high = parse_size_range(args.file_size) if args.file_size else (MIN_SIZE, MAX_SIZE)
    return Generated(args.generate, PER_DIR if args.per_dir is None else args.per_dir, low, high, args.seed or 0)


def generated_operations(base: type) -> type:
    """``base`` (slowpfs's read-only operations: ``_metadata``, ``_open``, ``counters``, ``latency``)
    serving a :class:`Generated` tree instead of a directory."""
    from mfusepy import FuseOSError

    class GeneratedOperations(base):
        def __init__(self, tree: Generated, latency: Any, counters: Any) -> None:
            super().__init__(tree, latency, counters)
            self.tree = tree
            self.time_ns = time.time_ns()  # every file's and directory's times: the mount's start

        def _find(self, path: str) -> tuple[int, int]:
            """(mode, size) of what ``path`` names; ENOENT if nothing."""
            parts = path.strip("/").split("/")
            if parts == [""] or (len(parts) == 1 and self.tree.directory(parts[0]) is not None):
                return stat.S_IFDIR | 0o555, 4096
            i = self.tree.file(path)
            if i is None:
                raise FuseOSError(errno.ENOENT)
            return stat.S_IFREG | 0o444, self.tree.size(i)

        def getattr(self, path: str | None, fh=None) -> dict[str, Any]:
            self._metadata("lookups")
            if path is None:  # a file unlinked while open: none here
                raise FuseOSError(errno.ENOENT)
            mode, size = self._find(path)
            t = self.time_ns
            return {"st_mode": mode, "st_nlink": 2 if stat.S_ISDIR(mode) else 1, "st_uid": os.getuid(),
                    "st_gid": os.getgid(), "st_size": size, "st_blocks": -(-size // 512), "st_blksize": 4096,
                    "st_atime": t, "st_mtime": t, "st_ctime": t}

        def readdir(self, path: str, fh: int) -> Iterator[tuple[str, int, int]]:
            """The entries with their types alone (no attributes: the kernel makes no lookup of them)."""
            self._metadata("readdirs")
            parts = path.strip("/").split("/")
            dots = [(".", stat.S_IFDIR, 0), ("..", stat.S_IFDIR, 0)]
            if parts == [""]:
                dirs = range(self.tree.directories)
                return itertools.chain(dots, ((DIR_NAME.format(d), stat.S_IFDIR, 0) for d in dirs))
            k = self.tree.directory(parts[0]) if len(parts) == 1 else None
            if k is None:
                raise FuseOSError(errno.ENOENT if self.tree.file(path) is None else errno.ENOTDIR)
            files = range(k * self.tree.per_dir, min(self.tree.files, (k + 1) * self.tree.per_dir))
            return itertools.chain(dots, ((FILE_NAME.format(i), stat.S_IFREG, 0) for i in files))

        def access(self, path: str, amode: int) -> int:
            self._metadata("accesses")
            mode, _ = self._find(path)
            if amode & os.W_OK:
                raise FuseOSError(errno.EROFS)
            if amode & os.X_OK and not stat.S_ISDIR(mode):
                raise FuseOSError(errno.EACCES)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            self.counters.add("statfs")
            blocks = self.tree.files * (self.tree.min_size + self.tree.max_size) // 2 // 4096  # about
            return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": blocks, "f_bfree": 0, "f_bavail": 0,
                    "f_files": self.tree.files + self.tree.directories + 1, "f_ffree": 0, "f_favail": 0,
                    "f_namemax": 255}

        def readlink(self, path: str) -> str:
            raise FuseOSError(errno.EINVAL)  # no link here

        def _open_file(self, path: str, flags: int, mode: int) -> int:
            i = self.tree.file(path)
            if i is None:
                raise FuseOSError(errno.ENOENT)
            return i  # the open's handle: the file's index

        def _pread(self, fh: int, size: int, offset: int) -> bytes:
            return self.tree.data(fh, offset, size)

        def release(self, path: str, fi) -> int:
            return 0

    return GeneratedOperations
