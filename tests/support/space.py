"""The free space a run of the test suite needs, where its tests write: checked once, at the
start (tests/conftest.py), so that a host that cannot hold the suite's data says so first, with
the figures and the fix, rather than in many unrelated failures."""

from __future__ import annotations

import os
from typing import Callable

GiB = 1 << 30

# What the suite holds at once, at most, measured over a whole run (``df`` every second; pytest
# keeps only failed tests' folders): its datasets, run directories, disk tiers and the emulated
# PFS's files in /tmp, 0.55 GiB at the peak; its RAM tiers in /dev/shm, 0.38 GiB. The tiers tests
# make keep no filesystem reserve (support.harness.NO_RESERVE), so this is all the room they need.
NEEDS_FREE = (("/tmp", 1 * GiB, "its datasets, run directories and disk tiers"),
              ("/dev/shm", 1 * GiB, "its RAM tiers"))


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def short_of_space(needs=NEEDS_FREE, free: Callable[[str], int] = free_bytes) -> str | None:
    """Why the suite cannot run here (each place with less free than it needs, and the fix), or None."""
    short = []
    for path, need, what in needs:
        try:
            left = free(path)
        except OSError:
            continue  # not there: the tests that need it say so themselves
        if left < need:
            short.append(f"{path} has {left / GiB:.1f} GiB free, and the suite needs {need / GiB:.0f} GiB there ({what})")
    if not short:
        return None
    return ("the test suite cannot run here: " + "; ".join(short) + ". Free some space there (pytest keeps its last "
            "runs' failed tests' folders in /tmp/pytest-of-$USER), or run the suite where there is more.")
