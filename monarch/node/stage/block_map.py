"""A large file's copy by blocks and its map, as files: their format (the shim reads them too),
what another job finds of them in a shared set, and publishing a copy over another.

``<tier>/.blocks/<key>`` is the copy (the source's size, blocks filled in any order);
``<tier>/.blockmap/<key>`` its map: ``BLOCKMAP_HEADER``, then a state byte per block. The job
staging a copy holds an ``flock`` on it (``blocks.BlockFile.create``) until it lets go of it,
so another job tells a copy being staged from one whose job is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import threading

from monarch.node.snapshot.snapshot import FileInfo
from monarch.node.tiers.tiers import TMP_PREFIX

__all__ = ["BLOCK", "BLOCK_SHIFT", "BLOCKMAP_HEADER", "copy_state", "link_over", "staged_bytes"]

# The copy and its map, as the shim reads them (monarch/wire/monarch_wire.h: MONARCH_BLOCK*,
# struct monarch_blockmap_header; tests/unit/test_wire.py holds the two together).
# BLOCKS_DIR, BLOCKMAP_DIR (node/tiers/tiers.py): the copy, the source's size, blocks in any order;
# its map: BLOCKMAP_HEADER, then a state byte per block
BLOCKMAP_MAGIC = 0x50414D4B434F4C42  # "BLOCKMAP"
BLOCKMAP_VERSION = 2
BLOCKMAP_HEADER = struct.Struct("<QIIQqQQQ")  # magic, version, block_shift, size, mtime_ns, blocks, done, readaround
BLOCKMAP_DONE_OFFSET = 40  # "done": nonzero once the daemon stages no more of the file
BLOCKMAP_READAROUND_OFFSET = 48  # "readaround": nonzero once the PFS's round trip is long (ReadPace.readaround)
BLOCK_ABSENT = 0
BLOCK_WANTED = 1  # the shim read it from the PFS: staged next
BLOCK_STAGED = 2  # every byte in the copy: the shim reads it there

BLOCK_SHIFT = 20  # 1 MiB blocks: a block cache's usual page (Alluxio, mountpoint-s3); a mapping moves in these
BLOCK = 1 << BLOCK_SHIFT


def link_over(src: str, dest: str) -> os.stat_result | None:
    """``src`` linked at ``dest`` in place of any other file there (atomically: a reader finds
    one or the other); the stat of the file it replaced, None if none (or ``src`` itself)."""
    try:
        os.link(src, dest)
        return None
    except FileExistsError:
        pass
    old = os.lstat(dest)
    if os.path.samestat(old, os.lstat(src)):
        return None
    # a temporary's name, which a set's sweep removes should this process die before the rename
    tmp = os.path.join(os.path.dirname(dest), f"{TMP_PREFIX}link-{os.getpid()}-{threading.get_ident()}")
    os.link(src, tmp)
    try:
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return old if stat.S_ISREG(old.st_mode) else None


def copy_state(copy: str, bmap: str, info: FileInfo) -> tuple[str | None, bool, bool]:
    """A shared set's block copy of a file: (None: none; "same": of the file ``info``
    describes; "other": of another version; "broken": its map unreadable), whether every
    block is staged, whether a live job holds it to stage it."""
    try:
        fd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, False, False
    except OSError:
        return "broken", False, False
    try:
        live = not _try_lock(fd)
    finally:
        os.close(fd)
    try:
        with open(bmap, "rb") as f:
            magic, version, shift, size, mtime_ns, blocks, _, _ = BLOCKMAP_HEADER.unpack(f.read(BLOCKMAP_HEADER.size))
            states = f.read(blocks + 1)
    except (OSError, struct.error):
        return "broken", False, live
    if (magic, version, shift) != (BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCK_SHIFT):
        return "broken", False, live
    complete = len(states) == blocks and states.count(BLOCK_STAGED) == blocks
    return "same" if (size, mtime_ns) == (info.size, info.mtime_ns) else "other", complete, live


def staged_bytes(bmap: str, info: FileInfo) -> int:
    """The bytes of the staged blocks a map says, if it is the map of the file ``info`` describes."""
    try:
        with open(bmap, "rb") as f:
            magic, version, shift, size, mtime_ns, blocks, _, _ = BLOCKMAP_HEADER.unpack(f.read(BLOCKMAP_HEADER.size))
            states = f.read(blocks)
    except (OSError, struct.error):
        return 0
    if (magic, version, shift, size, mtime_ns) != (BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCK_SHIFT, info.size,
                                                   info.mtime_ns) or len(states) != blocks:
        return 0
    n = states.count(BLOCK_STAGED)
    short = BLOCK * blocks - size  # the last block's missing tail
    return n * BLOCK - (short if blocks and states[-1] == BLOCK_STAGED else 0)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
