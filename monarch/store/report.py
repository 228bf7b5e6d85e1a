"""The report's ``store`` figures: bytes read from the stores beside the dataset's, the values
refused (named), the copies lost to a store that stopped answering. None without a store."""

from __future__ import annotations

from typing import Iterable

from monarch.sizes import human

SKIPPED_NAMED = 10  # skipped keys named per root in the printed report (all are counted)


def store_traffic(alive: Iterable, dataset_bytes: int) -> dict | None:
    """Over nodes (``NodeStats``): the store section of the report, or None (no store)."""
    sections = [(n.staging, n.staging.get("store")) for n in alive]
    sections = [(s, st) for s, st in sections if st]
    if not sections:
        return None
    read = sum(s.get("store_bytes_read", 0) for s, _ in sections)
    refused: dict[str, str] = {}
    urls: dict[str, str] = {}
    skipped: dict[str, list] = {}
    skipped_count: dict[str, int] = {}
    for _, st in sections:
        refused.update(st.get("refused", {}))
        urls.update(st.get("urls", {}))
        skipped.update(st.get("skipped", {}))
        skipped_count.update(st.get("skipped_count", {}))
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
        "skipped": skipped,
        "skipped_count": skipped_count,
    }


def store_lines(store: dict | None) -> list[str]:
    """The printed report's lines about the stores (none without one)."""
    if not store:
        return []
    lines = ["\nstore traffic (" + ", ".join(f"{root} <- {url}" for root, url in store["urls"].items()) + ")\n"]
    ratio = store["reads_of_dataset"]
    lines.append(f"  read by Monarch to stage: {human(store['bytes_read'])}"
                 f"{f' = {ratio:.2f}x the dataset' if ratio is not None else ''} ({store['files_read']} values)\n")
    for root, named in sorted(store.get("skipped", {}).items()):
        count = store.get("skipped_count", {}).get(root, len(named))
        lines.append(f"  {count} objects not served as files under {root} (their keys cannot be paths there):\n")
        lines += [f"    {key!r}: {why}\n" for key, why in named[:SKIPPED_NAMED]]
        if count > min(len(named), SKIPPED_NAMED):
            lines.append(f"    ... and {count - min(len(named), SKIPPED_NAMED)} more\n")
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
