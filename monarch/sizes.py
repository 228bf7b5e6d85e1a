"""Sizes as people write and read them: one parser (configuration, CLI, benchmarks), one printer."""

from __future__ import annotations

import re
from typing import Any

UNITS = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
         "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
FORMS = "units B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (of 1000)"
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")


def parse_size(text: Any) -> int:
    """``"64GiB"`` -> bytes (a plain number is bytes); raises ValueError naming the forms."""
    if isinstance(text, bool):
        raise ValueError(f"expected a size like 64GiB ({FORMS}), got {text!r}")
    if isinstance(text, int) and text >= 0:
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"expected a size like 64GiB ({FORMS}), got {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def human(n: float) -> str:
    """Bytes for people: ``1536`` -> ``"1.5 KiB"`` (powers of 1024)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def human_range(low: float, high: float | None) -> str:
    """A count of bytes known as a range, for people: ``"1.5 KiB"`` when exact (``high == low``),
    ``"≥ 1.5 KiB"`` with no upper bound (None), else ``"1.5 KiB to 3.0 KiB"``."""
    if high == low:
        return human(low)
    if high is None:
        return f"≥ {human(low)}"
    return f"{human(low)} to {human(high)}"


def allocated_size(size: int, unit: int) -> int:
    """What a file of ``size`` bytes takes on a filesystem allocating ``unit`` bytes at a
    time: ``size`` rounded up to the unit (0 bytes take nothing).

    Left out, on purpose: inodes and directory entries (tmpfs keeps them in kernel memory
    that its ``df`` does not count as used; ext4's inode tables are made with the
    filesystem; a directory's own blocks are few), ext4 extent-tree blocks of a very
    fragmented large file, and tmpfs mounted ``huge=`` (2 MiB pages for large files). A
    filesystem that stores small files inline (ext4 ``inline_data``, off by default; btrfs)
    or compresses takes less than this: the account errs on the safe side."""
    return -(-size // unit) * unit
