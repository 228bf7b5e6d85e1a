"""The report's ``store`` figures: bytes read from the stores beside the dataset's, the values
refused (named), the copies lost to a store that stopped answering. None without a store."""

from __future__ import annotations

from typing import Iterable

from monarch.sizes import human


def store_traffic(alive: Iterable, dataset_bytes: int) -> dict | None:
    """Over nodes (``NodeStats``): the store section of the report, or None (no store)."""
    sections = [(n.staging, n.staging.get("store")) for n in alive]
    sections = [(s, st) for s, st in sections if st]
    if not sections:
        return None
    read = sum(s.get("store_bytes_read", 0) for s, _ in sections)
    refused: dict[str, str] = {}
    urls: dict[str, str] = {}
    for _, st in sections:
        refused.update(st.get("refused", {}))
        urls.update(st.get("urls", {}))
    lost = [st["lost_at"] for _, st in sections if st.get("lost_at")]
    failed = sorted({n.snapshot for n in alive if str(n.snapshot).startswith("failed")})
    return {
        "urls": urls,
        "files_read": sum(s.get("store_files_read", 0) for s, _ in sections),
        "bytes_read": read,
        "dataset_bytes": dataset_bytes,
        "reads_of_dataset": round(read / dataset_bytes, 4) if dataset_bytes else None,
        "refused_count": sum(st.get("refused_count", 0) for _, st in sections),
        "refused": refused,
        "lost_copies": sum(st.get("lost_copies", 0) for _, st in sections),
        "lost_at": min(lost) if lost else None,
        "snapshot_failed": failed[0].partition(": ")[2] if failed else None,
    }


def store_lines(store: dict | None) -> list[str]:
    """The printed report's lines about the stores (none without one)."""
    if not store:
        return []
    lines = ["\nstore traffic (" + ", ".join(f"{root} <- {url}" for root, url in store["urls"].items()) + ")\n"]
    ratio = store["reads_of_dataset"]
    lines.append(f"  read by Monarch to stage: {human(store['bytes_read'])}"
                 f"{f' = {ratio:.2f}x the dataset' if ratio is not None else ''} ({store['files_read']} values)\n")
    if store["refused_count"]:
        lines.append(f"  refused (not served, opens fail with EIO): {store['refused_count']} values whose size or "
                     "digest is not the manifest's, or missing\n")
        lines += [f"    {path}: {why}\n" for path, why in sorted(store["refused"].items())]
    if store.get("snapshot_failed"):
        lines.append(f"  the snapshot failed ({store['snapshot_failed']}): every open under the store's root "
                     "failed with EIO\n")
    if store["lost_copies"]:
        lines.append(f"  store lost: {store['lost_copies']} copies failed because the store did not answer "
                     "(their opens failed with EIO; what was staged went on being served)\n")
    return lines
