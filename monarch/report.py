"""The access report: nodes' statistics combined into one versioned JSON document, and a table.

Schema ``monarch.report/1`` is documented in README.md ("Report reference").
"""

from __future__ import annotations

import collections
import datetime
import json
import os
from typing import Any, Iterable, TextIO

from monarch.errors import MonarchError

SCHEMA = "monarch.report/1"


def build_report(nodes: Iterable[dict | None], job: dict[str, Any]) -> dict:
    """Combine per-node statistics (``NodeDaemon.stats()``; None or ``{"missing": True}`` for a lost node)."""
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
    app_pfs = sources.get("pfs", {}).get("bytes", 0)
    app_total = sum(c["bytes"] for c in sources.values())
    pfs_total = app_pfs + staging["pfs_bytes_read"]
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "job": job,
        "dataset": alive[0]["dataset"] if alive else {"files": 0, "bytes": 0},
        "nodes_reporting": len(alive),
        "nodes_lost": [i for i, n in enumerate(nodes) if not n],
        "sources": {name: dict(c) for name, c in sources.items()},
        "pfs": {
            "app_bytes": app_pfs,
            "staging_bytes": staging["pfs_bytes_read"],
            "total_bytes": pfs_total,
            "dataset_bytes": dataset_bytes,
            "reads_of_dataset": round(pfs_total / dataset_bytes, 4) if dataset_bytes else None,
            "without_monarch_bytes": app_total,
            "saved_bytes": app_total - pfs_total,
            "saved_fraction": round(1 - pfs_total / app_total, 4) if app_total else None,
        },
        "staging": {"files": staging["files"], "bytes": staging["bytes"], "failures": dict(failures)},
        "peer": dict(peer),
        "nodes": nodes,
    }


def write_report(report: dict, path: str) -> None:
    """Write the report through a fresh temporary name (never through a planted symlink)."""
    from monarch.secure import write_file_atomically
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_file_atomically(path, (json.dumps(report, indent=2) + "\n").encode(), mode=0o644)


def load_report(path: str) -> dict:
    try:
        with open(path) as f:
            report = json.load(f)
    except OSError as e:
        raise MonarchError(f"report {path}: cannot read it: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise MonarchError(f"report {path}: not JSON (line {e.lineno}): {e.msg}") from None
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        raise MonarchError(f"report {path}: not a Monarch report of schema {SCHEMA}")
    return report


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def print_report(report: dict, out: TextIO) -> None:
    job, pfs, ds = report["job"], report["pfs"], report["dataset"]
    w = out.write
    w("\n== Monarch access report ==\n")
    if job.get("command"):
        w(f"command   : {' '.join(job['command'])}  (exit {job.get('exit_code')}, "
          f"{job.get('wall_seconds', 0):.2f} s)\n")
    w(f"dataset   : {ds['files']} files, {human(ds['bytes'])}\n")
    if report["nodes_lost"]:
        w(f"nodes lost: {report['nodes_lost']} (their numbers are missing)\n")
    w(f"\n{'source':<10}{'opens':>12}{'bytes read':>16}{'share':>8}\n")
    total = sum(c["bytes"] for c in report["sources"].values()) or 1
    for name, c in report["sources"].items():
        w(f"{name:<10}{c['opens']:>12}{human(c['bytes']):>16}{100 * c['bytes'] / total:>7.1f}%\n")
    w("\nPFS traffic\n")
    w(f"  read by the application : {human(pfs['app_bytes'])}\n")
    w(f"  read by Monarch to stage: {human(pfs['staging_bytes'])}\n")
    ratio = pfs["reads_of_dataset"]
    w(f"  total                   : {human(pfs['total_bytes'])}"
      f"{f' = {ratio:.2f}x the dataset' if ratio is not None else ''}\n")
    w(f"  without Monarch         : {human(pfs['without_monarch_bytes'])}\n")
    if pfs["saved_fraction"] is not None:
        w(f"  saved                   : {human(pfs['saved_bytes'])} ({100 * pfs['saved_fraction']:.1f}%)\n")
    st = report["staging"]
    w(f"\nstaged    : {st['files']} files, {human(st['bytes'])}")
    w(f"; not staged: {', '.join(f'{k} x{v}' for k, v in sorted(st['failures'].items()))}\n" if st["failures"] else "\n")
    if report["peer"]:
        p = report["peer"]
        w(f"peers     : sent {human(p.get('bytes_sent', 0))}, received {human(p.get('bytes_received', 0))}\n")
    if len(report["nodes"]) > 1:
        w(f"\n{'node':<6}" + "".join(f"{name:>12}" for name in report["sources"]) + f"{'staged':>12}{'pfs total':>12}\n")
        for i, n in enumerate(report["nodes"]):
            if not n:
                w(f"{i:<6}lost\n")
                continue
            cells = "".join(f"{human(n['sources'].get(name, {}).get('bytes', 0)):>12}" for name in report["sources"])
            node_pfs = n["sources"]["pfs"]["bytes"] + n["staging"]["pfs_bytes_read"]
            w(f"{i:<6}{cells}{human(n['staging']['bytes']):>12}{human(node_pfs):>12}\n")
    w("\nbytes are those read with read/pread/readv; mmap and stdio reads count opens only\n")
