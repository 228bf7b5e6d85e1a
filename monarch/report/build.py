"""The access report's JSON document: the nodes' statistics combined into one, versioned.

Schema ``monarch.report/4`` is documented in docs/report.md; ``/1`` to
``/3`` reports are still read and printed (``monarch.report.store``).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import math
from typing import Any, Iterable

from monarch.records.node_stats import NodeStats, bytes_read_range
from monarch.report.bypass import bypass_fallback
from monarch.report.fallbacks import shim_fallbacks
from monarch.report.timeline import combine_timelines
from monarch.store.report import store_traffic

SCHEMA = "monarch.report/4"  # /4: "sources" (where opens were served from) became "opened_from"

def build_report(nodes: Iterable[NodeStats | dict | None], job: dict[str, Any]) -> dict:
    """Combine per-node statistics (``NodeStats``, or as received: ``NodeDaemon.stats()``; None or
    ``{"missing": True}`` for a lost node).

    Per slot an open was served from (``opened_from``: a tier, ``peer``, ``pfs``) the statistics
    give ``opens`` and ``bytes``, and may give ``opens_uncounted``: opens whose bytes the shim
    cannot all see (read through mmap or stdio), ``opens_stdio`` and ``mapped_bytes``. Byte
    figures that include such opens are lower bounds (listed in ``pfs.lower_bounds``), ranges
    when mmap alone hid bytes (their upper ends in ``pfs.at_most``: at most the lengths mapped).
    """
    nodes = [n if isinstance(n, NodeStats) else NodeStats.from_wire(n) for n in nodes]
    alive = [n for n in nodes if n]
    opened_from: dict[str, collections.Counter] = {}
    for n in alive:
        for name, counts in n.opened_from.items():
            opened_from.setdefault(name, collections.Counter()).update(counts)
    staging = collections.Counter()
    failures = collections.Counter()
    peer = collections.Counter()
    for n in alive:
        s = n.staging
        staging.update({k: s[k] for k in ("files", "bytes", "pfs_files_read", "pfs_bytes_read")})
        failures.update(s["failures"])
        peer.update({k: v for k, v in n.peer.items() if isinstance(v, (int, float))})
    dataset_bytes = alive[0].dataset["bytes"] if alive else 0
    metadata = collections.Counter()
    early, lost = collections.Counter(), collections.Counter()
    for n in alive:
        metadata.update({k: v for k, v in n.metadata.items() if k in ("local", "pfs")})
        early.update(n.metadata.get("before_index") or {})
        lost.update(n.metadata.get("daemon_lost") or {})
    ready = [n.snapshot_ready_seconds for n in alive if n.snapshot_ready_seconds is not None]
    decompression = collections.Counter()
    for n in alive:
        decompression.update(n.decompression)
    blocks = _blocks_over_nodes(alive)
    timelines = [n.timeline for n in alive if n.timeline]
    doors = [n.front_door for n in alive if n.front_door]
    door = collections.Counter()
    for d in doors:
        door.update({k: d.get(k, 0) for k in ("copies", "answered_staged", "handed_over")})
    report = {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "job": job,
        "dataset": alive[0].dataset if alive else {"files": 0, "bytes": 0},
        "nodes_reporting": len(alive),
        "nodes_lost": [i for i, n in enumerate(nodes) if not n],
        "opened_from": {name: dict(c) for name, c in opened_from.items()},
        "pfs": _pfs_traffic(opened_from, staging["pfs_bytes_read"], dataset_bytes),
        "store": store_traffic(alive, dataset_bytes),  # a dataset root in a key-value store (None: none)
        "staging": {"files": staging["files"], "bytes": staging["bytes"], "failures": dict(failures)},
        "metadata": {"local": metadata["local"], "pfs": metadata["pfs"]},
        # calls under the roots the shim sent to the PFS (counted there too) because the snapshot
        # index was not written yet (the walk: "walk_seconds", the slowest node's, from its daemon's
        # start), or because it could not reach its daemon or the daemon went silent
        "pfs_before_index": {"opens": early["opens"], "metadata": early["metadata"],
                             "walk_seconds": max(ready) if ready else None},
        "pfs_daemon_lost": {"opens": lost["opens"], "metadata": lost["metadata"]},
        "processes_with_shim": _processes_with_shim(alive),
        # of those, the processes that made a call under a root (the readers; None: not counted)
        "processes_at_roots": _processes_at_roots(alive),
        # opens of compressed copies decoded by the shim in the application's process: how
        # many, the ns they took (frame open to the application's descriptor), the bytes decoded,
        # the frames it found but left to the daemon (no libzstd, a missing dictionary, a bad
        # frame), and the opens decoded into a reused memfd (its pages already there)
        "decompression": {k: decompression[k] for k in ("opens", "ns", "bytes", "left_to_daemon", "reused")},
        "peer": dict(peer),
        # large files staged by blocks (None: none was)
        "blocks": blocks,
        # the daemons' C front doors (None: no node had one): misses they copied, opens of
        # staged copies they answered, requests they handed to the Python server
        "front_door": dict(door) if doors else None,
        "tiers": _tiers_over_nodes(alive),
        "tier_errors": _tier_errors_over_nodes(nodes),
        "size_classes": _classes_over_nodes(alive),
        "timeline": combine_timelines(timelines) if timelines else None,
        "cluster": cluster_summary(nodes),
        # the job's writes under the write-back paths, over nodes (None: none configured)
        "writeback": _writeback_over_nodes(alive),
        # system calls made without libc the shims answered, over nodes (None: none)
        "raw_calls": _raw_calls_over_nodes(alive),
        "nodes": [n.to_dict() if n else None for n in nodes],
    }
    # each way the application came to read the dataset without Monarch, its reason and its fix
    said = shim_fallbacks(alive)
    bypassed = None if said else bypass_fallback(report)  # the shim's own reasons say why, where it had any
    report["fallbacks"] = said + ([bypassed] if bypassed else [])
    return report


def _raw_calls_over_nodes(alive: list[NodeStats]) -> dict | None:
    """What watching raw system calls cost, summed over nodes: calls answered (a SIGSYS each), by
    system call, the ns their handler took, and the pauses in compute runtimes; None: none answered."""
    total, by_call = collections.Counter(), collections.Counter()
    for n in alive:
        total.update({k: n.raw_calls.get(k, 0) for k in ("answered", "ns", "paused")})
        by_call.update(n.raw_calls.get("by_call") or {})
    if not total["answered"]:
        return None
    return {**{k: total[k] for k in ("answered", "ns", "paused")}, "by_call": dict(by_call.most_common())}


BLOCK_FIGURES = ("files", "whole_files", "partly_staged_files", "partly_staged_bytes", "partly_staged_of_bytes",
                 "blocks_staged", "bytes_staged", "blocks_from_pfs", "bytes_from_pfs",
                 # a cluster's: another owner's blocks from it, those read from the PFS when it could not send them,
                 # those that left a window for others (a file larger than the room)
                 "blocks_from_peers", "bytes_from_peers", "blocks_peer_failed", "blocks_left_window")
BLOCK_READS = ("opens", "local_bytes", "pfs_bytes", "remapped_bytes", "faults_held", "fault_wait_ns", "faults_late",
               "faults_pages")


def _blocks_over_nodes(alive: list[NodeStats]) -> dict | None:
    """Large files staged by blocks, summed over nodes: the stagers' files (whole, partly
    staged: X of Y bytes), and what the application's descriptors of them read from the
    staged blocks and from the PFS (the shim's counts); None when no node staged any."""
    staged, reads = collections.Counter(), collections.Counter()
    for n in alive:
        staged.update({k: v for k, v in (n.staging.get("blocks") or {}).items() if k in BLOCK_FIGURES})
        reads.update({k: v for k, v in (n.block_reads or {}).items() if k in BLOCK_READS})
    if not staged["files"] and not reads["opens"]:
        return None
    return {**{k: staged[k] for k in BLOCK_FIGURES}, "read": {k: reads[k] for k in BLOCK_READS}}


def _processes_with_shim(alive: list[NodeStats]) -> int | None:
    """Processes in which the shim was active, summed over nodes (they exec'd away or ran
    to their end); None when no node's shim counted them (an older shim or daemon)."""
    counts = [n.processes_with_shim for n in alive if n.processes_with_shim is not None]
    return sum(counts) if counts else None


WRITEBACK_SUMS = ("bytes_written", "files_closed", "files_published", "bytes_published", "pending_bytes",
                  "peak_pending_bytes", "drain_seconds", "waited_for_room", "syncs", "not_closed",
                  "bytes_copied", "files_written_through", "opened_through", "ordered_files", "order_wait_seconds",
                  "app_write_seconds", "app_close_seconds", "app_sync_seconds", "partner_bytes_sent",
                  "partner_seconds", "partner_records", "held_for_lost_published",
                  # published files kept on the node for the next runs; earlier runs' kept copies read (not the PFS)
                  "kept_files", "kept_bytes", "served_files", "served_bytes", "stale",
                  # a restart's reads of those files by source (node/kept_reads.py), the PFS's time they saved
                  *(f"restart_{s}_{k}" for s in ("tier", "partner", "peer", "pfs") for k in ("files", "bytes")),
                  "restart_fetch_seconds", "restart_saved_seconds")


def _writeback_over_nodes(alive: list[NodeStats]) -> dict | None:
    """Write-back summed over nodes: what the job wrote, what reached the PFS, and what did not
    (each node's refusal, each file not published and where its bytes are kept)."""
    nodes = [n.writeback for n in alive if n.writeback]
    if not nodes:
        return None
    out = {k: sum(n.get(k) or 0 for n in nodes) for k in WRITEBACK_SUMS}
    for k in WRITEBACK_SUMS:
        if k.endswith("_seconds"):
            out[k] = round(out[k], 3)
    # the PFS's write rate as the drain met it (its own time, not its waits on other nodes), and the
    # application's time to write the same bytes straight to it at that rate: what direct would block
    copying = sum(max(0.0, (n.get("drain_seconds") or 0) - (n.get("order_wait_seconds") or 0)) for n in nodes)
    rate = out["bytes_copied"] / copying if copying > 0 and out["bytes_copied"] else None
    out["pfs_write_rate"] = round(rate) if rate else None
    out["direct_estimate_seconds"] = round(out["bytes_written"] / rate, 3) if rate else None
    # what of the drain ran after the job's command had ended (the rest overlapped the job)
    after = [n["drained_after_s"] - n["job_ended_after_s"] for n in nodes
             if n.get("drained_after_s") is not None and n.get("job_ended_after_s") is not None]
    out["drain_after_job_seconds"] = round(max(0.0, max(after)), 3) if after else None
    out["fsync"] = sorted({n["fsync"] for n in nodes if n.get("fsync")})
    out["failed"] = [n["failed"] for n in nodes if n.get("failed")]
    out["unpublished"] = {path: where for n in nodes for path, where in (n.get("unpublished") or {}).items()}
    out["kept_in"] = [n["area"] for n in nodes if n.get("failed") or n.get("unpublished") or n.get("not_closed")]
    return out


def _processes_at_roots(alive: list[NodeStats]) -> int | None:
    """Processes that made a call under a root, summed over nodes; None when no node counted them."""
    counts = [n.view["processes_at_roots"] for n in alive if n.view and "processes_at_roots" in n.view]
    return sum(counts) if counts else None


def cluster_summary(nodes: list[NodeStats | None]) -> dict | None:
    """A cluster's layout and, per node, its owned share (files, bytes, staged), the bytes it
    sent to and received from peers, and its peer cache (hits, evictions, transient serves).
    None when no node reports a layout (single node)."""
    rows = []
    for k, n in enumerate(nodes):
        cl = (n.cluster if n else None) or {}
        if not cl:
            continue
        peer, cache = n.peer or {}, cl.get("peer_cache") or {}
        rows.append({"node": n.node, "owned_files": cl.get("owned_files", 0),
                     "owned_bytes": cl.get("owned_bytes", 0), "owned_estimated": cl.get("owned_estimated", False),
                     "owned_staged_files": cl.get("owned_staged_files", 0),
                     "owned_staged_bytes": cl.get("owned_staged_bytes", 0),
                     "peer_bytes_sent": peer.get("bytes_sent", 0), "peer_bytes_received": peer.get("bytes_received", 0),
                     "cache_hits": cache.get("hits", 0), "cache_fetched": cache.get("fetched", 0),
                     "evictions": cache.get("evictions", 0), "transient": cache.get("transient", 0),
                     "peer_failures": sum(cache.get("failures", {}).values())})
    if not rows:
        return None
    first = next(n.cluster for n in nodes if n and n.cluster)
    return {"mode": first.get("mode"), "why": first.get("why"), "per_node": rows}


def _tiers_over_nodes(alive: list[NodeStats]) -> list[dict]:
    """Each tier (and the peer area) by name, summed over nodes: capacity, used (stored bytes),
    files, refused by reason, logical and stored bytes and their ratio, each node's compression,
    and the decoded files a compressing tier holds for re-opens (bytes, files)."""
    out: dict[str, dict] = {}
    for n in alive:
        for t in n.tiers:
            row = out.setdefault(t["name"], {"name": t["name"], "capacity": 0, "used": 0, "files": 0,
                                             "refused": collections.Counter(), "full_on_nodes": 0,
                                             "logical_bytes": 0, "stored_bytes": 0, "compressed_files": 0,
                                             "decoded_bytes": 0, "decoded_files": 0, "compression": []})
            for k in ("capacity", "used", "files", "logical_bytes", "stored_bytes", "compressed_files"):
                row[k] += t.get(k, 0)
            if "allocated_bytes" in t:  # a node of this version: what the filesystem holds for the copies
                row["allocated_bytes"] = row.get("allocated_bytes", 0) + t["allocated_bytes"]
            decoded = t.get("decoded_cache") or {}  # decoded files kept for native re-opens (not in "used")
            row["decoded_bytes"] += decoded.get("bytes", 0)
            row["decoded_files"] += decoded.get("files", 0)
            row["compression"].append(t.get("compression", {"mode": "off"}))
            row["refused"].update(t.get("refused", {}))
            if t.get("full"):
                row["full_on_nodes"] += 1
            if t.get("stopped"):
                row["last_stopped"] = t["stopped"]
    for row in out.values():
        row["refused"] = dict(row["refused"])
        row["stopped"] = tier_state(row)
        row["ratio"] = round(row["logical_bytes"] / row["stored_bytes"], 3) if row["stored_bytes"] else 1.0
    return list(out.values())


def _tier_errors_over_nodes(nodes: list[NodeStats | None]) -> dict[str, dict]:
    """Each tier some node could not use: the first node's reason and the nodes that said so."""
    out: dict[str, dict] = {}
    for i, n in enumerate(nodes):
        for name, reason in ((n.tier_errors if n else None) or {}).items():
            out.setdefault(name, {"reason": reason, "nodes": []})["nodes"].append(i)
    return out


def tier_state(tier: dict) -> str | None:
    """Why a tier stopped taking files, if it did (None: it took every file offered): its
    filesystem said it was full, else the reason of its latest refusal."""
    if tier.get("full_on_nodes") or tier.get("full"):
        return "filesystem_full"
    return tier.get("last_stopped") or tier.get("stopped")


def _classes_over_nodes(alive: list[NodeStats]) -> list[dict] | None:
    """Per size class over the cluster: the dataset (node 0's snapshot: every node has the
    same), copies in each tier summed over nodes, large files served from staged blocks
    (``by_blocks``: their staged ``bytes`` of ``of_bytes``), and what no node holds any of."""
    per_node = [n.size_classes for n in alive if n.size_classes]
    if not per_node:
        return None
    out = []
    for i, first in enumerate(per_node[0]):
        staged: dict[str, collections.Counter] = {}
        by_blocks = collections.Counter(files=0, bytes=0, of_bytes=0)
        for classes in per_node:
            for tier, c in classes[i]["staged"].items():
                staged.setdefault(tier, collections.Counter()).update(c)
            by_blocks.update(classes[i].get("by_blocks") or {})
        held = (sum(c["files"] for c in staged.values()) + by_blocks["files"],
                sum(c["bytes"] for c in staged.values()) + by_blocks["of_bytes"])
        out.append({"class": first["class"], "max_bytes": first["max_bytes"], "files": first["files"],
                    "bytes": first["bytes"], "staged": {t: dict(c) for t, c in staged.items()},
                    "by_blocks": dict(by_blocks),
                    "not_staged": {"files": max(0, first["files"] - held[0]),
                                   "bytes": max(0, first["bytes"] - held[1])}})
    return out

# Figures that model a run without Monarch rather than count this one: every byte the command
# read is taken as read from the PFS, whereas a page cache would have absorbed its re-reads
# (h5py's chunks, a header read per sample) and the kernel's read-ahead added some.
ESTIMATED = ["saved_bytes", "saved_fraction", "without_monarch_bytes"]


def _pfs_traffic(opened_from: dict[str, collections.Counter], staging_bytes: int, dataset_bytes: int) -> dict:
    """The PFS figures, each exact, estimated (named in ``estimated``) or a lower bound (named in
    ``lower_bounds``); a lower bound that also has an upper one (opens read through mmap: at
    most the lengths mapped) names it in ``at_most``, so the figure is a range."""
    pfs = opened_from.get("pfs", collections.Counter())
    opens = sum(c["opens"] for c in opened_from.values())
    uncounted = sum(c["opens_uncounted"] for c in opened_from.values())
    pfs_uncounted = pfs["opens_uncounted"]
    app_pfs = pfs["bytes"]
    app_total = sum(c["bytes"] for c in opened_from.values())
    # every managed open was read through mmap/stdio, and not a byte of them through fread
    nothing_counted = opens > 0 and uncounted >= opens and not app_total
    pfs_total = app_pfs + staging_bytes
    lower = set()
    if pfs_uncounted:
        lower |= {"app_bytes", "total_bytes", "reads_of_dataset"}
    if uncounted:
        lower.add("without_monarch_bytes")
    if uncounted - pfs_uncounted:  # saved = bytes read from tiers and peers - bytes read to stage them
        lower |= {"saved_bytes", "saved_fraction"}
    at_most: dict[str, float] = {}
    app_most = bytes_read_range(pfs)[1]
    if pfs_uncounted and app_most is not None:
        at_most.update(app_bytes=app_most, total_bytes=app_most + staging_bytes)
        if dataset_bytes:  # rounded up, as the lower end is rounded down: the range holds the truth
            at_most["reads_of_dataset"] = math.ceil(1e4 * (app_most + staging_bytes) / dataset_bytes) / 1e4
    highs = [bytes_read_range(c)[1] for c in opened_from.values()]
    if uncounted and None not in highs:
        at_most["without_monarch_bytes"] = sum(highs)
    saved, fraction = _saving(app_total, pfs_total, nothing_counted, bound="saved_bytes" in lower,
                              pfs_exact=not pfs_uncounted)
    return {
        "app_bytes": app_pfs,
        "staging_bytes": staging_bytes,
        "total_bytes": pfs_total,
        "dataset_bytes": dataset_bytes,
        "reads_of_dataset": (math.floor if pfs_uncounted else round)(1e4 * pfs_total / dataset_bytes) / 1e4
                            if dataset_bytes else None,
        "without_monarch_bytes": None if nothing_counted and "without_monarch_bytes" not in at_most else app_total,
        "saved_bytes": saved,
        "saved_fraction": fraction,
        # None: the shim did not tell mmap/stdio opens apart (their bytes are missing, unmarked)
        "opens_uncounted": uncounted if any("opens_uncounted" in c for c in opened_from.values()) else None,
        "lower_bounds": sorted(lower - ({"saved_fraction"} if fraction is None else set())),
        "at_most": at_most,
        "estimated": [] if nothing_counted else ESTIMATED,
    }


def _saving(app_total: int, pfs_total: int, nothing_counted: bool, bound: bool,
            pfs_exact: bool) -> tuple[int | None, float | None]:
    """The saving in bytes and as a fraction, each exact, a lower bound (``bound``: some opens of
    the tiers or peers read bytes the shim did not see) or None. A lower bound that is not
    positive says nothing about a saving (a negative one must never read as a loss), and a
    fraction bounds something only when its denominator alone is a bound (``pfs_exact``). A
    negative saving (Monarch staged more than the command read: read-ahead copies what fits of
    the dataset, whatever the command reads) is a multiple of a small figure, not a share."""
    saved = app_total - pfs_total
    if nothing_counted or (bound and saved <= 0):
        return None, None
    if not app_total or not pfs_exact or saved < 0:  # a ratio of two lower bounds bounds nothing
        return saved, None
    return saved, round(1 - pfs_total / app_total, 4)


def session_delta(end: NodeStats, start: NodeStats) -> NodeStats:
    """A node's numbers between two of its stats: what one ``monarch run`` attached to a
    standing daemon did (the daemon's own report at stop keeps the totals)."""
    def minus(a: dict, b: dict) -> dict:
        return {k: (v - b.get(k, 0) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                for k, v in a.items()}
    staging = minus(end.staging, start.staging)
    staging["failures"] = {k: v for k, v in minus(end.staging.get("failures", {}),
                                                  start.staging.get("failures", {})).items() if v}
    return dataclasses.replace(
        end, opened_from={name: minus(c, start.opened_from.get(name, {})) for name, c in end.opened_from.items()},
        staging=staging, resolves={k: v for k, v in minus(end.resolves, start.resolves).items() if v},
        front_door=minus(end.front_door, start.front_door or {}) if end.front_door else end.front_door,
        processes_with_shim=_minus_processes(end.processes_with_shim, start.processes_with_shim),
        raw_calls=_minus_raw_calls(end.raw_calls, start.raw_calls),
        view=end.view | ({"processes_at_roots": _minus_processes(end.view.get("processes_at_roots"),
                                                                  start.view.get("processes_at_roots"))}
                         if end.view and start.view else {}),
        extra=end.extra | {"session_only": True})


def _minus_raw_calls(end: dict, start: dict) -> dict:
    if not end:
        return end
    by_call = {k: v - (start.get("by_call") or {}).get(k, 0) for k, v in (end.get("by_call") or {}).items()}
    return {**{k: end.get(k, 0) - start.get(k, 0) for k in ("answered", "ns", "paused")},
            "by_call": {k: v for k, v in by_call.items() if v}}


def _minus_processes(end: int | None, start: int | None) -> int | None:
    """The processes with the shim one run added to a standing daemon's counter (those still
    running from another run stay in both; None: a side did not tell)."""
    return None if end is None or start is None else max(0, end - start)
