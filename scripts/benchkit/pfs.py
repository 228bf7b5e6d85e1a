"""The emulated PFS (``monarch.tools.slowpfs``: a FUSE mount with a latency per call and a
bandwidth) as the benchmarks set it up: whether it can run here, said once, the same way."""

from __future__ import annotations

import sys

from monarch.tools.slowpfs import fuse_unavailable_reason


def pfs_unavailable(who: str, probe: bool = True) -> bool:
    """True, and why said on stderr, when the emulated PFS cannot run on this machine (no FUSE, or
    ``probe``: a mount tried and refused); the benchmark ``who`` then exits 2."""
    reason = fuse_unavailable_reason(probe=probe)
    if reason:
        print(f"{who}: the emulated PFS cannot run here: {reason}", file=sys.stderr)
    return bool(reason)
