"""The snapshot's keys in the read-ahead's order, with no list of them.

A key in a Python list costs about 90 bytes (the string and its slot): 180 MB at 2 million
files, more than the index that holds them. An index (``IndexTable``) is therefore gone over in
its own order (its directories by key, each one's files by name), a key made as it is reached,
and sampled by position. A snapshot that is not an index (a dict: small, or Python's walk) is
sorted.
"""

from __future__ import annotations

from typing import Callable, Iterable

from monarch.node.snapshot.indextable import IndexTable


def in_order(files) -> Iterable[str]:
    """``files``'s keys in order, iterable again each time it is asked (a cluster node goes over
    them twice: its own files, then the others)."""
    return files if isinstance(files, IndexTable) else sorted(files)


def spread_over(files, n: int, accept: Callable[[str], bool]) -> list[str]:
    """About ``n`` keys that ``accept`` takes, spread evenly over ``in_order(files)``: in each of n
    equal stretches the first taken from its middle on, then from its start (none if none is)."""
    if not isinstance(files, IndexTable):
        keys = [k for k in sorted(files) if accept(k)]
        if len(keys) <= n:
            return keys
        return [keys[(2 * i + 1) * len(keys) // (2 * n)] for i in range(n)]
    total = len(files)
    stretches = min(n, total)
    got = []
    for i in range(stretches):
        lo, hi = i * total // stretches, (i + 1) * total // stretches
        mid = (lo + hi) // 2
        got += next(([k] for j in (*range(mid, hi), *range(lo, mid)) if accept(k := files.key(j))), [])
    return got
