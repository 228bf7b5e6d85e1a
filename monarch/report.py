"""The access report: nodes' statistics combined into one versioned JSON document, and a table.

Schema ``monarch.report/3`` is documented in README.md ("Report reference"); ``/1`` and
``/2`` reports are still read and printed.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import shlex
from typing import Any, Iterable, TextIO

from monarch.errors import MonarchError

SCHEMA = "monarch.report/3"
READABLE_SCHEMAS = ("monarch.report/1", "monarch.report/2", SCHEMA)  # `monarch report` prints older reports too

def build_report(nodes: Iterable[dict | None], job: dict[str, Any]) -> dict:
    """Combine per-node statistics (``NodeDaemon.stats()``; None or ``{"missing": True}`` for a lost node).

    Per source the statistics give ``opens`` and ``bytes``, and may give ``opens_uncounted``:
    opens whose bytes the shim cannot see (read through mmap or stdio). Byte figures that
    include such opens are lower bounds (listed in ``pfs.lower_bounds``); a figure none of
    whose bytes were counted is None (unknown).
    """
    nodes = [None if not n or n.get("missing") else n for n in nodes]
    alive = [n for n in nodes if n]
    sources: dict[str, collections.Counter] = {}
    for n in alive:
        for name, counts in n["sources"].items():
            sources.setdefault(name, collections.Counter()).update(counts)
    staging = collections.Counter()
    failures = collections.Counter()
    peer = collections.Counter()
    for n in alive:
        s = n["staging"]
        staging.update({k: s[k] for k in ("files", "bytes", "pfs_files_read", "pfs_bytes_read")})
        failures.update(s["failures"])
        peer.update({k: v for k, v in n.get("peer", {}).items() if isinstance(v, (int, float))})
    dataset_bytes = alive[0]["dataset"]["bytes"] if alive else 0
    metadata = collections.Counter()
    for n in alive:
        metadata.update({k: v for k, v in n.get("metadata", {}).items() if k in ("local", "pfs")})
    decompression = collections.Counter()
    for n in alive:
        decompression.update(n.get("decompression", {}))
    timelines = [n["timeline"] for n in alive if n.get("timeline")]
    doors = [n["front_door"] for n in alive if n.get("front_door")]
    door = collections.Counter()
    for d in doors:
        door.update({k: d.get(k, 0) for k in ("copies", "answered_staged", "handed_over")})
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "job": job,
        "dataset": alive[0]["dataset"] if alive else {"files": 0, "bytes": 0},
        "nodes_reporting": len(alive),
        "nodes_lost": [i for i, n in enumerate(nodes) if not n],
        "sources": {name: dict(c) for name, c in sources.items()},
        "pfs": _pfs_traffic(sources, staging["pfs_bytes_read"], dataset_bytes),
        "staging": {"files": staging["files"], "bytes": staging["bytes"], "failures": dict(failures)},
        "metadata": {"local": metadata["local"], "pfs": metadata["pfs"]},
        # opens of compressed copies decoded by the shim in the application's process: how
        # many, the ns they took (frame open to sealed memfd), the bytes decoded, and the
        # frames it found but left to the daemon (no libzstd, a missing dictionary, a bad frame)
        "decompression": {k: decompression[k] for k in ("opens", "ns", "bytes", "left_to_daemon")},
        "peer": dict(peer),
        # the daemons' C front doors (None: no node had one): misses they copied, opens of
        # staged copies they answered, requests they handed to the Python server
        "front_door": dict(door) if doors else None,
        "tiers": _tiers_over_nodes(alive),
        "tier_errors": _tier_errors_over_nodes(nodes),
        "size_classes": _classes_over_nodes(alive),
        "timeline": combine_timelines(timelines) if timelines else None,
        "cluster": cluster_summary(nodes),
        "nodes": nodes,
    }


def cluster_summary(nodes: list[dict | None]) -> dict | None:
    """A cluster's layout and, per node, its owned share (files, bytes, staged), the bytes it
    sent to and received from peers, and its peer cache (hits, evictions, transient serves).
    None when no node reports a layout (single node)."""
    rows = []
    for k, n in enumerate(nodes):
        cl = (n or {}).get("cluster") or {}
        if not cl:
            continue
        peer, cache = n.get("peer") or {}, cl.get("peer_cache") or {}
        rows.append({"node": n.get("node", k), "owned_files": cl.get("owned_files", 0),
                     "owned_bytes": cl.get("owned_bytes", 0), "owned_staged_files": cl.get("owned_staged_files", 0),
                     "owned_staged_bytes": cl.get("owned_staged_bytes", 0),
                     "peer_bytes_sent": peer.get("bytes_sent", 0), "peer_bytes_received": peer.get("bytes_received", 0),
                     "cache_hits": cache.get("hits", 0), "cache_fetched": cache.get("fetched", 0),
                     "evictions": cache.get("evictions", 0), "transient": cache.get("transient", 0),
                     "peer_failures": sum(cache.get("failures", {}).values())})
    if not rows:
        return None
    first = next(n["cluster"] for n in nodes if n and n.get("cluster"))
    return {"mode": first.get("mode"), "why": first.get("why"), "per_node": rows}


def _tiers_over_nodes(alive: list[dict]) -> list[dict]:
    """Each tier (and the peer area) by name, summed over nodes: capacity, used (stored bytes),
    files, refused by reason, logical and stored bytes and their ratio, each node's compression,
    and the decoded files a compressing tier holds for re-opens (bytes, files)."""
    out: dict[str, dict] = {}
    for n in alive:
        for t in n.get("tiers", []):
            row = out.setdefault(t["name"], {"name": t["name"], "capacity": 0, "used": 0, "files": 0,
                                             "refused": collections.Counter(), "full_on_nodes": 0,
                                             "logical_bytes": 0, "stored_bytes": 0, "compressed_files": 0,
                                             "decoded_bytes": 0, "decoded_files": 0, "compression": []})
            for k in ("capacity", "used", "files", "logical_bytes", "stored_bytes", "compressed_files"):
                row[k] += t.get(k, 0)
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


def _tier_errors_over_nodes(nodes: list[dict | None]) -> dict[str, dict]:
    """Each tier some node could not use: the first node's reason and the nodes that said so."""
    out: dict[str, dict] = {}
    for i, n in enumerate(nodes):
        for name, reason in ((n or {}).get("tier_errors") or {}).items():
            out.setdefault(name, {"reason": reason, "nodes": []})["nodes"].append(i)
    return out


def tier_state(tier: dict) -> str | None:
    """Why a tier stopped taking files, if it did (None: it took every file offered): its
    filesystem said it was full, else the reason of its latest refusal."""
    if tier.get("full_on_nodes") or tier.get("full"):
        return "filesystem_full"
    return tier.get("last_stopped") or tier.get("stopped")


STATE_WORDS = {None: "took every file offered", "full": "full (its capacity is reached)",
               "memory_margin": "stopped at the node's memory margin (memory_margin)",
               "filesystem_full": "its filesystem is full"}


def _classes_over_nodes(alive: list[dict]) -> list[dict] | None:
    """Per size class over the cluster: the dataset (node 0's snapshot: every node has the
    same), copies in each tier summed over nodes, and what no node's tier holds."""
    per_node = [n["size_classes"] for n in alive if n.get("size_classes")]
    if not per_node:
        return None
    out = []
    for i, first in enumerate(per_node[0]):
        staged: dict[str, collections.Counter] = {}
        for classes in per_node:
            for tier, c in classes[i]["staged"].items():
                staged.setdefault(tier, collections.Counter()).update(c)
        held = sum(c["files"] for c in staged.values()), sum(c["bytes"] for c in staged.values())
        out.append({"class": first["class"], "max_bytes": first["max_bytes"], "files": first["files"],
                    "bytes": first["bytes"], "staged": {t: dict(c) for t, c in staged.items()},
                    "not_staged": {"files": max(0, first["files"] - held[0]),
                                   "bytes": max(0, first["bytes"] - held[1])}})
    return out


def combine_timelines(timelines: list[dict]) -> dict:
    """The nodes' timelines on one grid of the coarsest interval, from the earliest start:
    counts summed, gauges (``used.*``) summed over nodes at each point's end."""
    if len(timelines) == 1:
        return timelines[0]
    from monarch.timeline import is_gauge
    step = max(tl["interval"] for tl in timelines)
    origin = min(tl["start"] for tl in timelines)
    end = max((tl["start"] + tl["t"][-1] for tl in timelines if tl["t"]), default=origin)
    n = max(1, int((end - origin) // step) + (1 if (end - origin) % step else 0))
    series: dict[str, list[int]] = {}
    for tl in timelines:
        levels: dict[str, list[int | None]] = {}
        for name, column in tl["series"].items():
            out = series.setdefault(name, [0] * n)
            level = levels.setdefault(name, [None] * n)
            for t, value in zip(tl["t"], column):
                slot = min(n - 1, max(0, int((tl["start"] + t - origin - 1e-9) // step)))
                if is_gauge(name):
                    level[slot] = value  # the node's last level in the slot
                else:
                    out[slot] += value
        for name, level in levels.items():
            if is_gauge(name):
                last = 0
                for i, value in enumerate(level):
                    last = value if value is not None else last
                    series[name][i] += last
    return {"start": round(origin, 3), "interval": step,
            "t": [round((i + 1) * step, 3) for i in range(n)], "series": series}


def _pfs_traffic(sources: dict[str, collections.Counter], staging_bytes: int, dataset_bytes: int) -> dict:
    """The PFS figures, each exact, a lower bound (named in ``lower_bounds``) or None (unknown)."""
    pfs = sources.get("pfs", collections.Counter())
    opens = sum(c["opens"] for c in sources.values())
    uncounted = sum(c["opens_uncounted"] for c in sources.values())
    pfs_uncounted = pfs["opens_uncounted"]
    nothing_counted = opens > 0 and uncounted >= opens  # every managed open was read through mmap/stdio
    app_pfs = pfs["bytes"]
    app_total = sum(c["bytes"] for c in sources.values())
    pfs_total = app_pfs + staging_bytes
    lower = set()
    if pfs_uncounted:
        lower |= {"app_bytes", "total_bytes", "reads_of_dataset"}
    if uncounted:
        lower.add("without_monarch_bytes")
    if uncounted - pfs_uncounted:  # saved = bytes read from tiers and peers - bytes read to stage them
        lower.add("saved_bytes")
    unknown = pfs["opens"] > 0 and pfs_uncounted >= pfs["opens"]
    return {
        "app_bytes": None if unknown else app_pfs,
        "staging_bytes": staging_bytes,
        "total_bytes": pfs_total,
        "dataset_bytes": dataset_bytes,
        "reads_of_dataset": round(pfs_total / dataset_bytes, 4) if dataset_bytes else None,
        "without_monarch_bytes": None if nothing_counted else app_total,
        "saved_bytes": None if nothing_counted else app_total - pfs_total,
        # a ratio of two lower bounds bounds nothing
        "saved_fraction": round(1 - pfs_total / app_total, 4) if app_total and not uncounted else None,
        # None: the shim did not tell mmap/stdio opens apart (their bytes are missing, unmarked)
        "opens_uncounted": uncounted if any("opens_uncounted" in c for c in sources.values()) else None,
        "lower_bounds": sorted(lower - ({"app_bytes"} if unknown else set())),
    }


def session_delta(end: dict, start: dict) -> dict:
    """A node's numbers between two of its ``stats()``: what one ``monarch run`` attached to
    a standing daemon did (the daemon's own report at stop keeps the totals)."""
    def minus(a: dict, b: dict) -> dict:
        return {k: (v - b.get(k, 0) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                for k, v in a.items()}
    out = dict(end)
    out["sources"] = {name: minus(c, start.get("sources", {}).get(name, {})) for name, c in end["sources"].items()}
    staging = minus(end["staging"], start.get("staging", {}))
    staging["failures"] = {k: v for k, v in minus(end["staging"].get("failures", {}),
                                                  start.get("staging", {}).get("failures", {})).items() if v}
    out["staging"] = staging
    out["resolves"] = {k: v for k, v in minus(end.get("resolves", {}), start.get("resolves", {})).items() if v}
    if end.get("front_door"):
        out["front_door"] = minus(end["front_door"], start.get("front_door") or {})
    out["session_only"] = True
    return out


def write_report(report: dict, path: str) -> None:
    """Write the report through a fresh temporary name (never through a planted symlink),
    readable by its owner only, like everything else of the run (its paths, its command)."""
    from monarch.secure import write_file_atomically
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_file_atomically(path, (json.dumps(report, indent=2) + "\n").encode(), mode=0o600)


def load_report(path: str) -> dict:
    try:
        with open(path) as f:
            report = json.load(f)
    except OSError as e:
        raise MonarchError(f"report {path}: cannot read it: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise MonarchError(f"report {path}: not JSON (line {e.lineno}): {e.msg}") from None
    if not isinstance(report, dict) or report.get("schema") not in READABLE_SCHEMAS:
        raise MonarchError(f"report {path}: not a Monarch report (schema {' or '.join(READABLE_SCHEMAS)})")
    return report


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _amount(n: float | None, lower: bool) -> str:
    """Bytes for the table: ``≥`` for a lower bound, ``unknown`` for None."""
    if n is None:
        return "unknown"
    return f"≥ {human(n)}" if lower else human(n)


def _source_amount(counts: dict) -> str:
    """One source's bytes: exact, ``≥`` when some opens were uncounted, ``unknown`` when all were."""
    opens, uncounted = counts.get("opens", 0), counts.get("opens_uncounted", 0)
    return _amount(None if opens and uncounted >= opens else counts.get("bytes", 0), uncounted > 0)


def print_report(report: dict, out: TextIO) -> None:
    job, pfs, ds = report["job"], report["pfs"], report["dataset"]
    lower = set(pfs.get("lower_bounds", ()))
    w = out.write
    w("\n== Monarch access report ==\n")
    if job.get("command"):
        w(f"command   : {shlex.join(job['command'])}  (exit {job.get('exit_code')}, "
          f"{job.get('wall_seconds', 0):.2f} s)\n")
    w(f"dataset   : {ds['files']} files, {human(ds['bytes'])}\n")
    if report["nodes_lost"]:
        w(f"nodes lost: {report['nodes_lost']} (their numbers are missing)\n")
    w(f"\n{'source':<10}{'opens':>12}{'bytes read':>16}{'share of bytes read':>22}\n")
    total = sum(c["bytes"] for c in report["sources"].values()) or 1
    for name, c in report["sources"].items():
        share = f"{100 * c['bytes'] / total:.1f}%"
        w(f"{name:<10}{c['opens']:>12}{_source_amount(c):>16}{share:>22}\n")
    w("\nPFS traffic\n")
    w(f"  read by the application : {_amount(pfs['app_bytes'], 'app_bytes' in lower)}\n")
    w(f"  read by Monarch to stage: {human(pfs['staging_bytes'])}\n")
    ratio = pfs["reads_of_dataset"]
    at_least = "at least " if "reads_of_dataset" in lower else ""
    w(f"  total                   : {_amount(pfs['total_bytes'], 'total_bytes' in lower)}"
      f"{f' = {at_least}{ratio:.2f}x the dataset' if ratio is not None else ''}\n")
    w(f"  without Monarch         : {_amount(pfs['without_monarch_bytes'], 'without_monarch_bytes' in lower)}\n")
    if pfs["saved_bytes"] is not None and (pfs["saved_fraction"] is not None or pfs.get("opens_uncounted")):
        fraction = f" ({100 * pfs['saved_fraction']:.1f}%)" if pfs["saved_fraction"] is not None else ""
        w(f"  saved                   : {_amount(pfs['saved_bytes'], 'saved_bytes' in lower)}{fraction}\n")
    st = report["staging"]
    w(f"\nstaged    : {st['files']} files, {human(st['bytes'])}")
    w(f"; not staged: {', '.join(f'{k} x{v}' for k, v in sorted(st['failures'].items()))}\n" if st["failures"] else "\n")
    if report.get("tiers"):
        _print_tiers(report["tiers"], w)
    for name, e in (report.get("tier_errors") or {}).items():
        where = f" (nodes {', '.join(map(str, e['nodes']))})" if len(report["nodes"]) > 1 else ""
        w(f"tier {name} not used{where}: {e['reason']}\n")
    if report.get("size_classes"):
        _print_size_classes(report["size_classes"], w)
    meta = report.get("metadata")
    if meta and (meta["local"] or meta["pfs"]):
        w(f"metadata  : {meta['local']} calls answered from the snapshot, {meta['pfs']} sent to the PFS "
          "(stat, access, directory listings under the roots)\n")
    for t in report.get("tiers", []):
        if t.get("compressed_files"):
            c = t["compression"][0]
            w(f"tier {t['name']:<5}: {human(t['logical_bytes'])} in {human(t['stored_bytes'])} = {t['ratio']:.2f}x; "
              f"{t['compressed_files']} of {t['files']} files compressed (zstd level {c.get('level')}"
              f"{', dictionary' if c.get('dictionary') else ''}; {c.get('selection', {}).get('reason', '')})\n")
            z = report.get("decompression") or {}
            if z.get("opens"):
                w(f"{'':<11}  {z['opens']} opens decoded in the application's process: {human(z['bytes'])} in "
                  f"{z['ns'] / 1e9:.3f} s ({z['ns'] / z['opens'] / 1e3:.0f} us per open, "
                  f"{z['bytes'] / max(z['ns'], 1):.2f} GB/s); {z['left_to_daemon']} left to the daemon\n")
            if t.get("decoded_files"):
                w(f"{'':<11}  {t['decoded_files']} decoded files ({human(t['decoded_bytes'])}) held at the job's "
                  "end for re-opens at native speed (counted as opens of the tier)\n")
    door = report.get("front_door")
    if door and (door["copies"] or door["answered_staged"]):
        w(f"daemon    : {door['copies']} misses copied and {door['answered_staged']} opens of staged copies "
          f"answered in C (the front door); {door['handed_over']} requests handed to the Python server\n")
    if report.get("cluster"):
        cl = report["cluster"]
        w(f"cluster   : {cl['mode']} ({cl['why']})\n")
        for r in cl["per_node"]:
            w(f"  node {r['node']}: owns {r['owned_files']} files ({human(r['owned_bytes'])}), staged "
              f"{r['owned_staged_files']}; peers sent {human(r['peer_bytes_sent'])}, received "
              f"{human(r['peer_bytes_received'])}; cache hits {r['cache_hits']}, evictions {r['evictions']}, "
              f"transient {r['transient']}\n")
    if report["peer"]:
        p = report["peer"]
        wire = p.get("wire_bytes_received", p.get("bytes_received", 0))
        on_wire = (f" ({human(wire)} on the wire: compressed copies cross as stored)"
                   if wire < p.get("bytes_received", 0) else "")
        w(f"peers     : sent {human(p.get('bytes_sent', 0))}, received {human(p.get('bytes_received', 0))}"
          f"{on_wire}\n")
    if len(report["nodes"]) > 1:
        w(f"\n{'node':<6}" + "".join(f"{name:>12}" for name in report["sources"]) + f"{'staged':>12}{'pfs total':>12}\n")
        for i, n in enumerate(report["nodes"]):
            if not n:
                w(f"{i:<6}lost\n")
                continue
            cells = "".join(f"{_source_amount(n['sources'].get(name, {})):>12}" for name in report["sources"])
            node_pfs = n["sources"].get("pfs", {})
            pfs_cell = _amount(node_pfs.get("bytes", 0) + n["staging"]["pfs_bytes_read"],
                               node_pfs.get("opens_uncounted", 0) > 0)
            w(f"{i:<6}{cells}{human(n['staging']['bytes']):>12}{pfs_cell:>12}\n")
    uncounted = pfs.get("opens_uncounted")
    if uncounted:
        w(f"\n≥: {uncounted} opens were read through mmap or stdio (fread); their bytes are unknown, so the "
          "figures marked ≥ are lower bounds and the shares are of the bytes counted\n")
    elif uncounted is None:  # a report from a shim that does not tell such opens apart
        w("\nbytes are those read with read/pread/readv; mmap and stdio reads count opens only\n")


def _print_tiers(tiers: list[dict], w) -> None:
    w(f"\n{'tier':<10}{'used':>12} / {'capacity':<18}{'files':>8}  state\n")
    for t in tiers:
        cap = t.get("capacity") or 0
        pct = f" ({100 * t['used'] / cap:.0f}%)" if cap else ""
        refused = {k: v for k, v in (t.get("refused") or {}).items() if v}
        why = f"; refused {', '.join(f'{k} x{v}' for k, v in sorted(refused.items()))}" if refused else ""
        state = t.get("stopped")
        w(f"{t['name']:<10}{human(t['used']):>12} / {human(cap) + pct:<18}{t.get('files', 0):>8}  "
          f"{STATE_WORDS.get(state, state)}{why}\n")


def _print_size_classes(classes: list[dict], w) -> None:
    w(f"\n{'file size':<10}{'files':>8}{'bytes':>12}  where (files, bytes)\n")
    for c in classes:
        if not c["files"]:
            continue
        places = [f"{tier} {v['files']} ({human(v['bytes'])})" for tier, v in sorted(c["staged"].items())]
        if c.get("peer", {}).get("files"):
            places.append(f"peer {c['peer']['files']} ({human(c['peer']['bytes'])})")
        ns = c["not_staged"]
        if ns["files"]:
            places.append(f"not staged {ns['files']} ({human(ns['bytes'])})")
        w(f"{c['class']:<10}{c['files']:>8}{human(c['bytes']):>12}  {', '.join(places)}\n")
