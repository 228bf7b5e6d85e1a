"""A run's tier removed in C (``remover.c``): its copies unlinked by a few threads, one
directory each, with no interpreter step per file (a million copies must go faster than ``rm -rf``).

What the C removal leaves (no compiler, a copy written meanwhile) ``StorageDir.remove``
removes after it, as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

from monarch.native.build import OptionalLibrary

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("remover.c")
LIBRARY_NAME = "libmonarch_remover.so"
THREADS = 4  # directories emptied at once; 100k x 1 KiB in /dev/shm on 2 cores: 1 thread 0.88 s, 2 0.45 s, 4 0.47 s (rm -rf 0.99 s)

_LIBRARY = OptionalLibrary(SOURCE, Path(__file__).with_name(LIBRARY_NAME), "the C tier remover",
                           "tiers are removed in Python",
                           {"remove_tree": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)])})


def library() -> ctypes.CDLL | None:
    """The remover's library: built by ``pip install``, or from this checkout on first use
    (None, once logged, if it cannot be: Python's rmtree removes the tier)."""
    return _LIBRARY.get()


def remove_tree(path: str, threads: int = THREADS) -> bool:
    """Remove ``path`` and everything below it, no symlink followed. True if it is gone."""
    lib = library()
    if lib is None:
        return False
    out = (ctypes.c_uint64 * 2)()
    gone = lib.remove_tree(os.fsencode(path), threads, out) == 0
    log.debug("removed %s: %d entries, %d left", path, out[0], out[1])
    return gone
