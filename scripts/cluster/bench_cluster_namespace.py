#!/usr/bin/env python3
"""Many small files on a cluster of simulated nodes: what the cluster's namespace and first job
cost against ``find``, side by side in one run, on the emulated PFS's generated tree.

The cluster counterpart of scripts/node/bench_many_files.py, whose emulated PFS, READER, counters
and ``find`` row it imports. The dataset is the emulated PFS in its generated mode
(``monarch.tools.slowpfs_generated``): ``--files`` files of 1-4 KiB (``--file-size``), ``--per-dir``
a directory, made by formula and stored nowhere, behind a FUSE mount with a latency on every
metadata call (``--lookup-latency-ms``: getattr, readdir, access) and on every open
(``--open-latency-ms``); the kernel caches nothing. The emulator's counters (its JSON file) count
each row's calls: metadata (lookups + readdirs + opendirs + statfs + accesses) and opens apart.

    python scripts/cluster/bench_cluster_namespace.py              # 200,000 files, 4 nodes: 1.5-5 minutes on 2 cores
    python scripts/cluster/bench_cluster_namespace.py --files 2000000 --nodes 8
    python scripts/cluster/bench_cluster_namespace.py --quick      # 2,000 files, 200 read, 2 nodes: 5 s, a smoke run

The rows, each launched from here (wall: its launch to its end):

  find      ``find MNT -type f``; the files it prints are counted and must be ``--files``.
  cluster   ``mpiexec -n N monarch serve -c CFG`` (``--nodes`` daemons on this machine, each its own
            run base, RAM tier and peer area by ${MONARCH_NODE}, scripts/benchkit/cluster.py), CFG with
            the shipped policy, ``staging: {policy: read-ahead, share: false}``, each node's RAM tier
            ``--capacity`` and its peer area a quarter of that (by default its 1/N share of the
            dataset, each file a 4 KiB page, and a quarter more: the nodes shard the dataset, no node
            could hold it whole); once every daemon answers, on every node k at once ``monarch run -c
            CFG -- python3 READER`` with MONARCH_NODE=k. The row ends when the last READER ends; the
            daemons are then stopped, ``monarch stop`` on every node (node 0 writes the job's
            report.json in its run directory).

READER (bench_many_files's) stats one file under the root, which waits for the namespace
(``MONARCH_SHIM_INDEX_WAIT_MS``: as long as ``--timeout``); then reads ``--sample`` files (node k's
drawn with ``--seed`` + k) twice, every byte of each pass checked against the generator's, and
prints the daemon's VmHWM (daemon.pid beside MONARCH_SOCKET: node k's daemon). The table is
bench_many_files' (the cluster's passes: the slowest node's; its index: node 0's). Under it, the
cluster's against find's:

  namespace ready     node 0's report: nodes[0].snapshot_ready_seconds (after its daemon's start),
                      against find's wall (target <= 2x); the slowest node's beside it.
  metadata calls      the emulator's, from before the daemons' launch to the last READER's end,
                      against find's; the same less one a distinct file the READERs opened (the
                      name each open looks up; target <= 2x), and less one a PFS open.
  opens               the emulator's opens against the distinct files the READERs read (the samples'
                      union): the read-ahead opens every file the nodes own.
  PFS bytes           the emulator's bytes, from the launch to the daemons' stop, against the bytes
                      the daemons staged from the PFS: the sum over nodes of the report's
                      nodes[k].staging.pfs_bytes_read (the stager's bytes_read["pfs"], the front
                      door's copies included; target 1.00x: nothing read twice, no READER's open
                      sent to the PFS). nodes[k].cluster.owned_staged_bytes (the owned copies held
                      at the end) is printed beside it.
  peak / file         each node's daemon VmHWM read by its READER after its passes, / files; the
                      largest (target <= 48 B).
  bytes               every file each READER read, checked; one wrong byte and the script exits 1.
  CPU-s               every process of the row (scripts/benchkit/cpuwatch.py, every 0.1 s): the
                      emulated PFS's, the daemons', the rest (mpiexec, the launchers, READERs, find).

One repeat; the load average is printed at the start and the end. The JSON (``--json``) holds the
table, the ratios, each row's figures and each node's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parents[1] / "node")]  # scripts/: benchkit; bench_many_files
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)
import bench_many_files as many  # noqa: E402

from benchkit.cluster import bench_env, daemon_run_dir, mpiexec, start_daemons, stop_daemons, wait_for  # noqa: E402
from benchkit.cpuwatch import CpuWatch  # noqa: E402
from benchkit.options import fresh_bytecode, parse_with_quick, result_path, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch.sizes import allocated_size, parse_size  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

NAME = "bench_cluster_namespace"
JOB = "benchnamespace"
PAGE = 4096  # what a small file's copy takes in a tmpfs tier (monarch.sizes.allocated_size)
PEAK_TARGET = 48  # bytes a file, the daemon's VmHWM (docs/performance.md)


def write_config(work: Path, shm: Path, mnt: Path, nodes: int, capacity: int) -> Path:
    """One configuration for every node, told apart by ${MONARCH_NODE} (bench_cluster's shape): the
    root, a run base, a RAM tier of ``capacity`` and a peer area of a quarter of it, made here."""
    for k in range(nodes):
        for d in (work / f"run{k}", shm / f"ram{k}", shm / f"peer{k}"):
            d.mkdir(parents=True)  # Monarch makes only its own monarch-<uid> inside an existing base
    path = work / "cluster.yaml"
    path.write_text(f"""# written by scripts/cluster/{NAME}.py
dataset: {{roots: [{json.dumps(str(mnt))}]}}
run_base: "{work}/run${{MONARCH_NODE}}"
tiers:
  - {{name: ram, path: "{shm}/ram${{MONARCH_NODE}}", capacity: {capacity}, keep: false}}
peer: {{path: "{shm}/peer${{MONARCH_NODE}}", capacity: {capacity // 4}, timeout: 10}}
staging: {{policy: read-ahead, share: false}}
""")
    return path


def stop_cluster(serve: subprocess.Popen, cfg: Path, nodes: int, wait_s: float = 90.0) -> None:
    """Every node's daemon asked to stop (``monarch stop``, docs/cluster.md step 4): each finishes,
    node 0 writes the report, mpiexec ends; then stop_daemons (a SIGTERM only if mpiexec is still
    there). A SIGTERM to Open MPI's mpiexec (prterun) first lost node 0's report from 20,000 files
    on: its daemons were gone within a second, nothing written."""
    try:
        stops = [subprocess.Popen([sys.executable, "-m", "monarch", "stop", "-c", str(cfg)],
                                  env=bench_env(JOB, MONARCH_NODE=k), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for k in range(nodes)]
        for k, proc in enumerate(stops):
            err = proc.communicate(timeout=wait_s)[1]
            if proc.returncode != 0:
                print(f"  warning: monarch stop on node {k} exited {proc.returncode}: {err.strip()[-500:]}", flush=True)
        serve.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        pass  # stop_daemons: a SIGTERM, then the group killed
    finally:
        stop_daemons(serve)


def reader_result(k: int, code: int, out: str, err: str) -> dict:
    """Node ``k``'s READER's RESULT line (printed even when a byte was wrong: it then exits 1)."""
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{NAME}: node {k}'s READER printed no result (exit {code}):\n{out[-2000:]}\n{err[-3000:]}")
    return json.loads(line[len("RESULT "):])


def load_report(work: Path) -> dict:
    path = daemon_run_dir(work, JOB, 0) / "report.json"
    if not path.exists():
        log = (work / "serve.log").read_text(errors="replace")[-3000:] if (work / "serve.log").exists() else ""
        raise SystemExit(f"{NAME}: node 0 wrote no report ({path}); the daemons' output:\n{log}")
    return json.loads(path.read_text())


def run_cluster(cfg: Path, mnt: Path, reader: Path, work: Path, args, pfs: SlowPFS, watch: CpuWatch) -> dict:
    """The cluster's row: the daemons, then a READER on every node at once; its figures, each node's
    among them (``per_node``), and the job's report's."""
    deadline = time.monotonic() + args.timeout
    row = many.Row(f"cluster: {args.nodes} nodes, read-ahead", pfs, watch)
    serve, launch, up = start_daemons(str(cfg), work, args.nodes, JOB, deadline, work / "serve.log")
    try:
        procs = []
        for k in range(args.nodes):
            cmd = [sys.executable, "-m", "monarch", "run", "-c", str(cfg), "--no-progress", "--report",
                   str(work / f"run{k}.json"), "--", sys.executable, str(reader),
                   *many.reader_args(mnt, args, pfs, seed=args.seed + k)]
            env = bench_env(JOB, MONARCH_NODE=k, MONARCH_SHIM_INDEX_WAIT_MS=args.wait_ms, TMPDIR=work / "tmp")
            env.pop("LD_PRELOAD", None)
            procs.append(subprocess.Popen(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True))
        done = wait_for(procs, deadline)
        r = row.done()
    finally:
        t0 = time.monotonic()
        stop_cluster(serve, cfg, args.nodes)
        launch.close()
    r["stop_s"] = time.monotonic() - t0
    stopped = many.counters(pfs)  # the daemons gone: what they read to the end, as their report counts
    meta_stop, opens_stop = many.calls(row.before, stopped)
    rep = load_report(work)
    nodes = [many.reads({"launch": r["launch"]}, reader_result(k, c, o, e), row.before, args)
             | {"code": c, "without_monarch": "Monarch is not active" in e} for k, (c, o, e) in enumerate(done)]
    alive = [n or {} for n in rep["nodes"]]
    picks = [set(random.Random(args.seed + k).sample(range(args.files), args.sample_n)) for k in range(args.nodes)]
    r |= {"ready": alive[0].get("snapshot_ready_seconds"), "snapshot": alive[0].get("snapshot"),
          "ready_by_node": [n.get("snapshot_ready_seconds") for n in alive],
          "metadata_before_read": max(n["metadata_before_read"] for n in nodes),
          "pass1": max(n["pass1"] for n in nodes), "pass2": max(n["pass2"] for n in nodes),
          "checked": sum(n["checked"] for n in nodes), "wrong": 2 * args.sample_n * args.nodes
          - sum(n["checked"] for n in nodes), "hwm_by_node": [n["hwm_per_file"] for n in nodes],
          "hwm_per_file": max((n["hwm_per_file"] or 0 for n in nodes), default=None) or None,
          "index_per_file": nodes[0]["index_per_file"], "daemons_up_s": up, "distinct_read": len(set().union(*picks)),
          "to_stop": {"metadata": meta_stop, "opens": opens_stop,
                      "bytes": stopped.get("bytes", 0) - row.before.get("bytes", 0)},
          "staged_pfs_bytes": sum((n.get("staging") or {}).get("pfs_bytes_read", 0) for n in alive),
          "staged_pfs_files": sum((n.get("staging") or {}).get("pfs_files_read", 0) for n in alive),
          "owned_staged_bytes": sum((n.get("cluster") or {}).get("owned_staged_bytes", 0) for n in alive),
          "app_pfs_bytes": (rep.get("pfs") or {}).get("app_bytes"), "pfs_why": pfs_why(alive),
          "layout": (rep.get("cluster") or {}).get("mode"), "dataset": rep.get("dataset"),
          "opened_from": rep.get("opened_from") or {}, "pfs_before_index": rep.get("pfs_before_index"),
          "nodes_reporting": rep.get("nodes_reporting"), "per_node": nodes, "warnings": []}
    warn = r["warnings"].append
    if (r["dataset"] or {}).get("files") != args.files:
        warn(f"the report's dataset has {(r['dataset'] or {}).get('files')} files, not {args.files}")
    if r["nodes_reporting"] != args.nodes:
        warn(f"{r['nodes_reporting']} nodes reported, not {args.nodes}")
    if r["layout"] != "shard":
        warn(f"layout {r['layout']}, not shard: each node can hold the dataset (--capacity)")
    if any(n["without_monarch"] for n in nodes):
        warn(f"nodes without Monarch: {[k for k, n in enumerate(nodes) if n['without_monarch']]}")
    for k, n in enumerate(nodes):
        if n["code"] != 0 and n["checked"] == 2 * args.sample_n:
            warn(f"node {k}'s READER exited {n['code']} with every byte right")
    early = r["pfs_before_index"] or {}
    if early.get("metadata") or early.get("opens"):
        warn(f"calls went to the PFS before the index was written: {early}")
    for w in r["warnings"]:
        print(f"  warning (cluster): {w}", flush=True)
    return r


def pfs_why(nodes: list[dict]) -> dict[str, int]:
    """Why the daemons sent opens to the PFS, summed over nodes (nodes[k].resolves' "pfs:<why>")."""
    out: dict[str, int] = {}
    for n in nodes:
        for k, v in (n.get("resolves") or {}).items():
            if k.startswith("pfs:"):
                out[k[4:]] = out.get(k[4:], 0) + v
    return out


# --------------------------------------------------------------------------- the figures under the table


def ratios(find: dict, c: dict) -> dict:
    ratio = many.ratio
    return {"namespace_ready": ratio(c["ready"], find["wall"]),
            "metadata": ratio(c["metadata"], find["metadata"]),
            "metadata_less_distinct": ratio(c["metadata"] - c["distinct_read"], find["metadata"]),
            "metadata_less_opens": ratio(c["metadata"] - c["opens"], find["metadata"]),
            "opens_per_distinct": ratio(c["opens"], c["distinct_read"]),
            "pfs_bytes_per_staged": ratio(c["to_stop"]["bytes"], c["staged_pfs_bytes"]),
            "cpu": ratio(sum(c["cpu"].values()), sum(find["cpu"].values()))}


def target(value: float | None, limit: float, unit: str = "x") -> str:
    """``target <= LIMIT: met`` (or NOT met, or n/a without a figure)."""
    said = "n/a" if value is None else "met" if value <= limit else "NOT met"
    return f"target <= {limit:.2f}x: {said}" if unit == "x" else f"target <= {limit:g} {unit}: {said}"


def print_ratios(find: dict, c: dict, rat: dict, args) -> None:
    fx = many.fx
    slowest = max((x for x in c["ready_by_node"] if x is not None), default=None)
    print(f"\ncluster / find: namespace ready (node 0) {many.cell(c['ready'])} s against find's {find['wall']:.2f} s: "
          f"{fx(rat['namespace_ready'])} ({target(rat['namespace_ready'], 2)}); the slowest node's "
          f"{many.cell(slowest)} s; snapshot {c['snapshot']}")
    print(f"cluster / find: PFS metadata calls {c['metadata']:,} against {find['metadata']:,}: {fx(rat['metadata'])}; "
          f"less one a distinct file the READERs opened ({c['distinct_read']:,}) "
          f"{fx(rat['metadata_less_distinct'])} ({target(rat['metadata_less_distinct'], 2)}); less one a PFS open "
          f"({c['opens']:,}) {fx(rat['metadata_less_opens'])}; to the daemons' stop {c['to_stop']['metadata']:,}")
    print(f"PFS opens {c['opens']:,} (to the daemons' stop {c['to_stop']['opens']:,}) against {c['distinct_read']:,} "
          f"distinct files read on the {args.nodes} nodes ({args.nodes} x {args.sample_n:,} drawn): "
          f"{fx(rat['opens_per_distinct'])}; the daemons read {c['staged_pfs_files']:,} files from the PFS")
    ds = c["dataset"] or {}
    print(f"PFS bytes read {c['to_stop']['bytes']:,} (launch to the daemons' stop) against bytes staged from the PFS "
          f"{c['staged_pfs_bytes']:,} (the report's nodes[k].staging.pfs_bytes_read, summed): "
          f"{fx(rat['pfs_bytes_per_staged'])} ({target(rat['pfs_bytes_per_staged'], 1.005)}); "
          f"owned copies held at the end "
          f"{c['owned_staged_bytes']:,} (nodes[k].cluster.owned_staged_bytes); the report's dataset "
          f"{ds.get('bytes', 0):,} bytes ({ds.get('unsized', 0):,} files unsized there), layout {c['layout']}")
    peaks = c["hwm_by_node"]
    top = c["hwm_per_file"]
    print("daemon peak (VmHWM) / file: " + ", ".join(f"node {k} {many.cell(v, 0)} B" for k, v in enumerate(peaks))
          + f"; the largest {many.cell(top, 0)} B ({target(top, PEAK_TARGET, 'B')})")
    cpu, fcpu = c["cpu"], find["cpu"]
    print(f"CPU-s, the cluster's row: pfs {cpu['pfs']:.1f}, daemons {cpu['daemon']:.1f}, rest {cpu['rest']:.1f} "
          f"(mpiexec, launchers, READERs), {sum(cpu.values()):.1f} in all; find's {sum(fcpu.values()):.1f} "
          f"(pfs {fcpu['pfs']:.1f}): {fx(rat['cpu'])}")
    slots = ", ".join(f"{k} {v.get('opens', 0):,}" for k, v in sorted(c["opened_from"].items()))
    why = ", ".join(f"{k} {v:,}" for k, v in sorted(c["pfs_why"].items()))
    print(f"READERs' opens by where they were served (the report's opened_from): {slots or 'none counted'}; "
          f"the PFS's bytes the READERs read {many.cell(c['app_pfs_bytes'], thousands=True)} (pfs.app_bytes); "
          f"why sent to the PFS (nodes[k].resolves): {why or 'none'}")
    print(f"bytes checked: {c['checked']:,} files read on {args.nodes} nodes ({args.nodes} x {args.sample_n:,} x 2 "
          f"passes), {c['wrong']:,} wrong; layout {c['layout']}; node 0's snapshot {str(c['snapshot']).split(':')[0]}; "
          f"the READERs' opens sent to the PFS {(c['opened_from'].get('pfs') or {}).get('opens', 0):,}")


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes, a daemon each (default 4)")
    many.add_tree_arguments(p)
    p.add_argument("--sample", type=int, default=20000,
                   help="files each node's READER reads, each pass (default 20,000)")
    p.add_argument("--capacity", type=parse_size, default=None, metavar="BYTES",
                   help="each node's RAM tier, as `256MiB`; its peer area a quarter of it (default: the node's 1/N "
                        "share of the dataset, each file a 4 KiB page at least, and a quarter more)")
    p.add_argument("--seed", type=int, default=0, help="node k's sample is drawn with seed + k (default 0)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed to each row (default 3600)")
    p.add_argument("--workdir", help="scratch directory (default: a new one under /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (serve.log, the reports)")
    p.add_argument("--json", default=result_path(f"{NAME}.json"),
                   help=f"the JSON written (default: results/{NAME}.json of this checkout)")
    args = parse_with_quick(p, argv, {"files": 2000, "per_dir": 100, "sample": 200, "nodes": 2})
    if args.nodes < 2:
        p.error("--nodes must be at least 2")
    low, high = many.tree_of(p, args)
    args.wait_ms = int(min(args.timeout, 24 * 3600) * 1000)
    dataset = args.files * allocated_size((low + high) // 2, PAGE)  # what the tiers count, about
    capacity = args.capacity or -(-int(1.25 * dataset / args.nodes) // (1 << 20)) << 20
    fresh_bytecode()
    if pfs_unavailable(NAME):
        return 2
    mpiexec(NAME)  # exits with how to install it where there is none
    print(many.machine(), flush=True)
    print(f"{many.tree_line(args, low, high)}; {args.nodes} nodes, each a RAM tier of "
          f"{capacity / 2**20:.0f} MiB and a peer area of {capacity / 4 / 2**20:.0f} MiB; READER on each: "
          f"{args.sample_n:,} files at random, 2 passes", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bcn-", dir=args.workdir or "/tmp"))  # short: socket paths are bounded
    shm = Path(tempfile.mkdtemp(prefix="bcn-", dir="/dev/shm"))
    try:
        (work / "tmp").mkdir()
        reader = work / "reader.py"
        reader.write_text(many.READER)
        mnt = work / "mnt"
        cfg = write_config(work, shm, mnt, args.nodes, capacity)
        with SlowPFS(args.tree, mnt, work / "counters.json", lookup_latency_ms=args.lookup_latency_ms,
                     open_latency_ms=args.open_latency_ms, timeout=60) as pfs, \
                CpuWatch(period=0.1, pfs_pid=pfs.proc.pid) as watch:
            find = many.run_find(mnt, args, pfs, watch)
            print(f"  find: {find['wall']:.2f} s", flush=True)
            c = run_cluster(cfg, mnt, reader, work, args, pfs, watch)
            print(f"  {c['row']}: {c['wall']:.2f} s, daemons up in {c['daemons_up_s']:.2f} s, snapshot "
                  f"{c.get('snapshot')}, ready {many.cell(c.get('ready'))} s, passes {c['pass1']:.3f} s, "
                  f"{c['pass2']:.3f} s (the slowest node's); stopped in {c['stop_s']:.2f} s", flush=True)
        rows = [find, c]
        rat = ratios(find, c)
        print(f"\n{args.files:,} files, {args.per_dir:,} a directory, {low}-{high} bytes; emulated PFS latency "
              f"{args.lookup_latency_ms:g} ms a metadata call, {args.open_latency_ms:g} ms an open; "
              f"{args.nodes} nodes, READER {args.sample_n:,} files x 2 passes on each; PFS meta: lookups + readdirs + "
              f"opendirs + statfs + accesses; the cluster's passes: the slowest node's, its daemon RSS: the largest")
        many.print_table(rows)
        print_ratios(find, c, rat, args)
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
        write_json(args.json, {"args": {k: v for k, v in vars(args).items() if k != "tree"}, "machine": many.machine(),
                               "capacity": capacity, "rows": rows, "ratios": rat,
                               "table": [dict(zip([x[0] for x in many.COLUMNS], line))
                                         for line in many.table_lines(rows)[1:]]})
        print(f"\nJSON: {args.json}")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if c["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
