"""What one node tells the report about its dataset: where its files are, by size class."""

from __future__ import annotations

# file-size classes of the report: (name, upper bound in bytes, exclusive; None: no bound)
SIZE_CLASSES: tuple[tuple[str, int | None], ...] = (
    ("<64KiB", 64 << 10), ("<1MiB", 1 << 20), ("<16MiB", 16 << 20), (">=16MiB", None))


def _size_class(size: int) -> int:
    for i, (_, bound) in enumerate(SIZE_CLASSES):
        if bound is None or size < bound:
            return i
    return len(SIZE_CLASSES) - 1


def size_classes(files: dict, staged: dict, fetched: set) -> list[dict]:
    """Per file-size class, where the dataset's files are on this node: ``files``/``bytes`` of
    the dataset, ``staged`` per tier, ``peer`` (fetched from the owning node) and
    ``not_staged`` (the application reads them from the PFS).

    ``files``: key -> FileInfo (the snapshot); ``staged``: key -> Tier; ``fetched``: keys in
    the peer area.
    """
    out = [{"class": name, "max_bytes": bound, "files": 0, "bytes": 0, "staged": {},
            "peer": {"files": 0, "bytes": 0}, "not_staged": {"files": 0, "bytes": 0}}
           for name, bound in SIZE_CLASSES]
    for key, info in files.items():
        row = out[_size_class(info.size)]
        row["files"] += 1
        row["bytes"] += info.size
        tier = staged.get(key)
        if tier is not None:
            where = row["staged"].setdefault(tier.name, {"files": 0, "bytes": 0})
        elif key in fetched:
            where = row["peer"]
        else:
            where = row["not_staged"]
        where["files"] += 1
        where["bytes"] += info.size
    return out
