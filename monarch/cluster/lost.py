"""The report's section on lost nodes: who, when, why, and what the survivors did after.

Kept apart from the report module: ``add_to_report(report, nodes)`` is called on the report
the coordinator builds from ``Cluster.finish()``'s list (a lost node's entry is
``{"node", "missing": True, "reason", "lost": {"node", "at", "why"} | None}``).
"""

from __future__ import annotations

import collections

PFS_NOTE = ("lower bound: the lost nodes' own PFS reads (their staging, and their applications' opens "
            "after the loss) are not counted")


def lost_section(nodes: list[dict | None]) -> dict:
    """``{"nodes": [{"node", "at", "why"}], "after_loss": {...}, "pfs_note"}`` from finish()'s list."""
    lost = []
    for k, n in enumerate(nodes):
        if n and not n.get("missing"):
            continue
        info = (n or {}).get("lost") or {}
        lost.append({"node": k, "at": info.get("at"), "why": info.get("why") or (n or {}).get("reason") or "unknown"})
    return {"nodes": lost, "after_loss": _after_loss([n for n in nodes if n and not n.get("missing")]),
            "pfs_note": PFS_NOTE if lost else None}


def _after_loss(alive: list[dict]) -> dict:
    """What the survivors did after the first loss each saw: peer files and bytes sent and
    received, and the opens they answered, by where each was served from (the counters then and at the end)."""
    peer = collections.Counter()
    opens = collections.Counter()
    nbytes = collections.Counter()
    for n in alive:
        p = n.get("peer") or {}
        peer.update(p.get("after_loss") or {})
        then = p.get("opened_from_at_loss")
        if then is None:
            continue
        for name, now in (n.get("opened_from") or {}).items():
            before = then.get(name, {})
            opens[name] += now.get("opens", 0) - before.get("opens", 0)
            nbytes[name] += now.get("bytes", 0) - before.get("bytes", 0)
    return {"peer": dict(peer), "opens": dict(opens), "bytes": dict(nbytes)}


def add_to_report(report: dict, nodes: list[dict | None]) -> dict:
    """Add ``report["lost"]`` and, when a node was lost, mark the PFS figure a lower bound."""
    section = lost_section(nodes)
    report["lost"] = section
    pfs = report.get("pfs")
    if isinstance(pfs, dict):
        pfs["lower_bound"] = bool(section["nodes"])
        if section["nodes"]:
            pfs["lower_bound_why"] = PFS_NOTE
    return report
