"""Which of a store's keys can be files under a dataset's root, and why the others cannot.

A bucket is often written by other people and tools, so any UTF-8 string may be a key. A key
is served as a file only when it is itself a plain relative path (never normalised: ``a//b``
is not served as ``a/b``), no other key names the same path, and no key lies below it. The
rest are skipped, each with the reason, and the dataset's other files are served as usual.
"""

from __future__ import annotations

from typing import Iterable

NAME_MAX = 255    # bytes in one path segment (Linux)
PATH_MAX = 4095   # bytes in a whole path, its terminating NUL left out (Linux)
NAMED = 20        # skipped keys named at most (all are counted)


def why_not_a_path(rel: str) -> str | None:
    """Why ``rel`` (a key less the dataset's prefix) cannot be a path under the root; None if it can."""
    if not rel:
        return "empty name"
    if "\0" in rel:
        return "holds a NUL"
    if any(c in rel for c in "\n\r"):
        return "holds a newline"
    if rel.startswith("/"):
        return "starts with '/' (an empty segment)"
    parts = rel.split("/")
    if "" in parts:
        return "holds an empty segment ('//')"
    if ".." in parts:
        return "holds a '..' segment (would leave the root)"
    if "." in parts:
        return "holds a '.' segment"
    try:
        encoded = [p.encode() for p in parts]
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if any(len(p) > NAME_MAX for p in encoded):
        return f"has a segment longer than {NAME_MAX} bytes"
    if len(rel.encode()) > PATH_MAX:
        return f"is longer than {PATH_MAX} bytes"
    return None


def screen(rels: Iterable[str], dirs: Iterable[str] = ()) -> tuple[set[str], list[tuple[str, str]]]:
    """The keys of ``rels`` served as files, and the others as (key, why), sorted.

    Two keys of one path (a hand-written manifest may repeat one) are both skipped: neither
    is more right than the other. A key that is also a prefix of others (``dir`` and
    ``dir/x``) is skipped and the prefix served as a directory: its files have unambiguous
    paths, the object has none. ``dirs`` are known directories (a console's ``dir/``)."""
    seen: dict[str, int] = {}
    skipped: list[tuple[str, str]] = []
    for rel in rels:
        why = why_not_a_path(rel)
        if why is not None:
            skipped.append((rel, why))
        else:
            seen[rel] = seen.get(rel, 0) + 1
    for rel, n in seen.items():
        if n > 1:
            skipped.append((rel, f"listed {n} times"))
    kept = {rel for rel, n in seen.items() if n == 1}
    parents = {rel[:i] for rel in kept for i, c in enumerate(rel) if c == "/"} | set(dirs)
    for rel in sorted(kept & parents):
        skipped.append((rel, f"both an object and a prefix: served as the directory {rel}/"))
        kept.discard(rel)
    return kept, sorted(skipped)


def summary(skipped: list[tuple[str, str]] | tuple, named: int = 3) -> str:
    """One line: how many keys were skipped, the first few named (``repr``: a newline stays visible)."""
    shown = ", ".join(f"{key!r} ({why})" for key, why in list(skipped)[:named])
    more = f", and {len(skipped) - named} more" if len(skipped) > named else ""
    return f"{len(skipped)} objects not served as files: {shown}{more}"
