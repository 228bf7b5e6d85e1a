"""A compressing tier's files stored before its level was chosen, re-encoded at that level.

The codec chooses its level on a sample (docs/compression.md); the files staged before the
choice are stored at ``codecs.DEFAULT_LEVEL``, which may hold the tier well below the ratio
the dataset needs to fit. Once the choice is made, one background thread decodes each such
frame from the tier (never a second PFS read), encodes it as the tier's files are now, and
renames the smaller frame over the old one: a reader that mapped the old frame keeps it, one
that opens the name gets either, both the file's bytes. The rename is made under the stager's
lock and only while the copy is still the one booked for the key, so a write, drop or
shutdown that came meanwhile wins; the room it frees is released at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import zstandard

from monarch.node.tiers.tiers import Tier, write_all, write_atomically
from monarch.secure import owner_only

log = logging.getLogger(__name__)

RETRY_AFTER = 0.5  # s: a file still being copied when the choice was made is tried once more


class _Gone(Exception):
    """The copy is not the one booked any more: leave it."""


def start_recode(books, tier: Tier, keys: list[str]) -> threading.Thread:
    thread = threading.Thread(target=recode, args=(books, tier, keys), name=f"monarch-recode-{tier.name}",
                              daemon=True)
    thread.start()
    return thread


def recode(books, tier: Tier, keys: list[str]) -> tuple[int, int]:
    """Re-encode ``keys``' frames in ``tier`` (``books``: the Stager); (files rewritten, stored bytes saved)."""
    files = saved = 0
    later = []
    for attempt in range(2):
        for key in keys:
            with books.lock:
                if books.closed:
                    return files, saved
                booked = books.staged.get(key) is tier and tier.is_compressed(key)
                busy = key in books.flights
            if not booked:
                if busy and attempt == 0:
                    later.append(key)
                continue
            n = _recode_one(books, tier, key)
            files += n > 0
            saved += n
        if not later:
            break
        keys, later = later, []
        time.sleep(RETRY_AFTER)
    if saved:  # room was freed: the files that did not fit are staged after all (read ahead again)
        with books.lock:
            retry, books.no_room = sorted(books.no_room), set()
        if retry:
            books.read_ahead_more(retry)
    c = tier.codec.choice
    log.info("compression: tier %s: %d files stored before the choice re-encoded at level %d, %d bytes freed",
             tier.name, files, c.level, saved)
    return files, saved


def _recode_one(books, tier: Tier, key: str) -> int:
    """Bytes saved rewriting ``key``'s frame (0: not smaller, or the copy went meanwhile)."""
    path = tier.compressed_path_for(key)
    info = books.snapshot.files.get(key)
    try:
        old = os.stat(path).st_size
        frame = tier.codec.reencode(tier.codec.decode(path, info.size))
    except (OSError, zstandard.ZstdError, AttributeError):  # dropped meanwhile (AttributeError: no info)
        return 0
    if len(frame) >= old:
        return 0

    def publish(tmp: str, dest: str) -> None:
        with books.lock:  # drop_locked and the stager's publish hold it too
            if (books.closed or books.is_dirty(key) or books.staged.get(key) is not tier
                    or os.stat(dest).st_size != old):
                raise _Gone(key)
            os.replace(tmp, dest)
            tier.shrunk(old - len(frame), old=old)
            tier.codec.recoded(old - len(frame))

    try:
        write_atomically(path, lambda fd: write_all(fd, frame), info.mtime_ns, owner_only(info.mode),
                         publish=publish, root=tier.path)
    except (_Gone, OSError):
        return 0
    return old - len(frame)
