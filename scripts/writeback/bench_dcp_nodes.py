#!/usr/bin/env python3
"""torch.distributed.checkpoint's pattern on N simulated nodes: direct against ``monarch serve``'s write-back.

One rank a node (scripts/writeback/checkpoint_app.py ``dcp-rank``, no torch): each writes its
shard under its final name (``__R_0.distcp``, ``--shard-mib`` MiB in 16 MiB writes), fsynced before
its close as DCP's default does (``--no-sync``: sync_files=False), a barrier
(a file per rank in a directory outside the checkpoint's), then rank 0 writes ``.metadata.tmp``
and renames it ``.metadata``. The emulated PFS (``monarch.tools.slowpfs --writable``: FUSE, no
page cache, writes capped at 200 MB/s in all, 2 ms per open) receives the checkpoint; a watcher
(this process, as another node would) lists and stats the checkpoint directory on the PFS every
5 ms and counts the polls that saw (a) ``.metadata`` while a shard was incomplete, (b) any file
under its final name shorter than its final size. docs/consistency.md, "Write-back", W2 and W4.

  direct   the N rank processes straight on the PFS mount
  monarch  ``mpiexec -n N monarch serve -c CFG`` (``monarch.cluster.world.daemon_launch``, one
           rank a node, per-node bases by ${MONARCH_NODE}, a RAM tier, ``writeback: {paths:
           [the checkpoint directory], fsync: --fsync}``), then one ``monarch run -c CFG --no-progress -- <rank>``
           per node with MONARCH_NODE=k, then the daemons stopped (one SIGTERM to mpiexec)

Per mode: launch until the last rank started (the launchers' start-up), the slowest rank's
shard write (as the rank reports it), launch until ``.metadata`` is
seen on the PFS and until every job returned (``monarch run`` returns once its node's write-back is
on the PFS, W7), the watcher's polls and its two counts, the PFS bytes written (the emulator's
count) against the shards' bytes, every published byte checked (right after the jobs returned,
the daemons still up), the CPU-seconds of the jobs' process trees (ranks; under Monarch their
``monarch run`` launchers too: the kernel's account of the reaped children, as bench_checkpoint.py),
of the daemons (mpiexec and ``monarch serve``, start to stop: psutil every 50 ms over mpiexec's
tree, scripts/benchkit/cpuwatch.py, since Open MPI's mpiexec does not pass its children's CPU on)
and of the emulated PFS (psutil); then monarch/direct. The figures go to results/bench_dcp_nodes.json.

    python3 scripts/writeback/bench_dcp_nodes.py                  # 4 nodes x 128 MiB: 11 s on 2 cores
    python3 scripts/writeback/bench_dcp_nodes.py --shard-mib 16   # smaller shards
    python3 scripts/writeback/bench_dcp_nodes.py --nodes 2 --modes monarch
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

from benchkit.cluster import bench_env, bench_places, daemon_run_dir, start_daemons, stop_daemons, wait_for  # noqa: E402
from benchkit.cpuwatch import CpuWatch, children_cpu  # noqa: E402
from benchkit.options import fresh_bytecode, parse_with_quick, result_path, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_checkpoint as single  # noqa: E402  (the single node's benchmark: its watcher, byte check, table rows)
import checkpoint_app as app  # noqa: E402

APP = str(Path(__file__).resolve().parent / "checkpoint_app.py")
MODES = ("direct", "monarch")
JOB = "benchdcpnodes"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes, one rank each (default 4)")
    p.add_argument("--shard-mib", type=int, default=128, help="MiB per shard (default 128)")
    p.add_argument("--chunk-mib", type=int, default=16, help="MiB per write call (default 16)")
    p.add_argument("--poll-ms", type=float, default=5.0, help="the watcher's period (default 5 ms)")
    p.add_argument("--write-bandwidth", type=float, default=200.0, metavar="MBps",
                   help="the emulated PFS's write cap, every writer together (default 200 MB/s)")
    p.add_argument("--open-latency-ms", type=float, default=2.0, help="the emulated PFS's ms per open (default 2)")
    p.add_argument("--tier-mib", type=int, default=0,
                   help="each node's RAM tier (default: 4 shards, at least 1024 MiB; write-back's room is half)")
    p.add_argument("--fsync", choices=("auto", "pfs", "partner", "local"), default="auto",
                   help="writeback.fsync of the monarch mode (default auto: partner on two or more nodes)")
    p.add_argument("--no-sync", dest="sync", action="store_false",
                   help="no fsync of the shards and .metadata (DCP's sync_files=False; default: fsynced, as DCP)")
    p.add_argument("--modes", default=",".join(MODES), help=f"a subset of {','.join(MODES)}")
    p.add_argument("--json", default=result_path("bench_dcp_nodes.json"),
                   help="where the figures go (default: results/bench_dcp_nodes.json of this checkout)")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed to each mode's jobs")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, reports)")
    args = parse_with_quick(p, argv, {"shard_mib": 4})
    asked = [x.strip() for x in args.modes.split(",") if x.strip()]
    if not asked or set(asked) - set(MODES):
        p.error(f"--modes: choose from {', '.join(MODES)}")
    if args.nodes < 1 or args.shard_mib < 1 or args.chunk_mib < 1:
        p.error("--nodes, --shard-mib and --chunk-mib: at least 1")
    args.modes = [m for m in MODES if m in asked]
    args.ranks = args.nodes  # the names bench_checkpoint's byte check reads
    args.tier_mib = args.tier_mib or max(1024, 4 * args.shard_mib)
    return args


def machine_facts() -> str:
    """The command line and what the figures depend on: cores, CPU, memory, kernel, Python."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    shm = shutil.disk_usage("/dev/shm").total / 2**30 if os.path.isdir("/dev/shm") else 0.0
    return (f"$ {shlex.join([os.path.basename(sys.executable), *sys.argv])}\n"
            f"machine: {os.cpu_count()} cores ({model}), {mem:.1f} GiB memory, /dev/shm {shm:.1f} GiB, "
            f"Linux {platform.release()}, Python {platform.python_version()}")


# --------------------------------------------------------------------------- one mode


def rank_cmd(directory: str, barrier: str, k: int, args) -> list[str]:
    return [sys.executable, APP, "dcp-rank", directory, "--rank", str(k), "--ranks", str(args.nodes),
            "--barrier", barrier, "--shard-mib", str(args.shard_mib), "--chunk-mib", str(args.chunk_mib),
            *([] if args.sync else ["--no-sync"])]


def monarch_config(work: Path, shm: Path, mount: str, ckpt: str, args) -> str:
    """Each node's run base, RAM tier and peer area by ${MONARCH_NODE} (made here, as their user
    would), write-back of ``ckpt``."""
    path = work / "monarch.yaml"
    path.write_text(f"""# written by scripts/writeback/bench_dcp_nodes.py
dataset: {{roots: ["{mount}/data"]}}
run_base: "{work}/run${{MONARCH_NODE}}"
tiers:
  - {{name: ram, path: "{shm}/ram${{MONARCH_NODE}}", capacity: {args.tier_mib}MiB, keep: false}}
peer: {{path: "{shm}/peer${{MONARCH_NODE}}", capacity: 64MiB, timeout: 10}}
staging: {{share: false}}
writeback: {{paths: ["{ckpt}"], fsync: {args.fsync}}}
""")
    for k in range(args.nodes):
        for d in (work / f"run{k}", shm / f"ram{k}", shm / f"peer{k}"):
            d.mkdir(exist_ok=True)
    return str(path)


def run_dir(work: Path, k: int) -> Path:
    return daemon_run_dir(work, JOB, k)


def run_mode(mode: str, args, pfs: SlowPFS, src: Path, shm: Path, work: Path) -> dict:
    where = src / "ckpt" / mode                   # what the PFS keeps
    seen = Path(pfs.mountpoint) / "ckpt" / mode   # what the ranks name
    barrier = work / f"barrier-{mode}"            # the job's barrier: outside the checkpoint directory
    os.makedirs(seen, exist_ok=True)              # the job's checkpoint directory, made before it starts
    barrier.mkdir()
    deadline = time.monotonic() + args.timeout
    r: dict = {}
    serve = launch = watch = None
    if mode == "monarch":
        cfg = monarch_config(work, shm, pfs.mountpoint, str(seen), args)
        watch = CpuWatch(pfs_pid=pfs.proc.pid).__enter__()  # the daemons: mpiexec does not pass their CPU on to ours
        watch.mark("launch")
        try:
            serve, launch, r["daemons_up_s"] = start_daemons(cfg, work, args.nodes, JOB, deadline, work / "serve.log")
        except RuntimeError:
            watch.__exit__(None, None, None)
            raise
    pfs.reset_counters()
    pfs_cpu0 = single.cpu_of(pfs.proc)
    finals = {app.shard_name(k): args.shard_mib << 20 for k in range(args.nodes)}
    finals[".metadata"] = len(app.metadata_bytes(args.nodes, args.shard_mib << 20))
    watcher = single.Watcher(str(seen), finals, [app.shard_name(k) for k in range(args.nodes)], args.poll_ms / 1e3)
    print(f"{mode}: {args.nodes} ranks -> {seen}", flush=True)
    try:
        cpu0 = children_cpu()
        watcher.t0 = time.perf_counter()  # its clock: the jobs' launch
        watcher.start()
        t0 = time.monotonic()
        procs = []
        for k in range(args.nodes):
            cmd, env = rank_cmd(str(seen), str(barrier), k, args), single.direct_env()
            if mode == "monarch":
                cmd = [sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress",
                       "--report", str(work / f"job{k}.json"), "--", *cmd]
                env = bench_env(JOB, MONARCH_NODE=k)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True, cwd=work))
        done = wait_for(procs, deadline)
        r["jobs_s"] = time.monotonic() - t0
        r["launched"] = t0  # CLOCK_MONOTONIC, the ranks' clock
        r["cpu_s"] = children_cpu() - cpu0
        r["watcher"] = watcher.stop()
        r["check"] = single.check_dcp(where, args)  # the daemons still up: what the returned jobs left
    finally:
        if watcher.is_alive():
            watcher.stop()
        if serve is not None:
            t1 = time.monotonic()
            stop_daemons(serve)
            launch.close()
            r["daemons_stop_s"] = time.monotonic() - t1
            watch.mark("stopped")
            watch.__exit__(None, None, None)
            by_kind = watch.between("launch", "stopped")
            r["daemons_cpu_s"] = by_kind.get("daemons", 0.0) + by_kind.get("mpiexec", 0.0)
    r["pfs_cpu_s"] = single.cpu_of(pfs.proc) - pfs_cpu0
    c = pfs.counters()
    r["pfs"] = {k: c[k] for k in ("bytes_written", "writes", "opens", "creates", "renames", "fsyncs")}
    r["ranks"], errors = [], []
    for k, (code, out, err) in enumerate(done):
        (work / f"node{k}.log").write_text(err)  # kept with --keep
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if code != 0 or not lines:
            tail = "\n".join(err.splitlines()[-10:])
            errors.append(f"node {k}: exit code {code}:\n{tail}")
            continue
        rank = json.loads(lines[-1])
        if rank["shim"] != (mode == "monarch"):
            errors.append(f"node {k}: Monarch's shim {'not ' if mode == 'monarch' else ''}in the rank's process")
        r["ranks"].append(rank)
    if len(r["ranks"]) == args.nodes:
        r["shard_write_s"] = max(x["shard_write_s"] for x in r["ranks"])
        r["ranks_started_s"] = max(x["shard_start"] for x in r["ranks"]) - t0
    if mode == "monarch":
        rep = json.loads((run_dir(work, 0) / "report.json").read_text()) \
            if (run_dir(work, 0) / "report.json").exists() else {}
        wb = [n.get("writeback") or {} for n in rep.get("nodes", [])]
        r["report"] = {k: sum(w.get(k, 0) for w in wb) for k in
                       ("files_closed", "files_published", "bytes_published", "ordered_files", "order_wait_seconds",
                        "partner_bytes_sent", "partner_seconds", "app_sync_seconds")}
        r["report"]["fsync"] = sorted({w.get("fsync") for w in wb if w.get("fsync")})
        r["report"]["nodes_reporting"] = rep.get("nodes_reporting")
    if errors:
        r["error"] = "\n".join(errors)
    if "check" not in r:
        r["check"] = {"files": args.nodes + 1, "ok": 0, "problems": ["not checked"]}
    r["bytes_right"] = (sum(finals[n] for n in finals if not any(p.startswith(n + ":") for p in r["check"]["problems"]))
                        if r["check"]["ok"] else 0)
    shutil.rmtree(where, ignore_errors=True)
    return r


# --------------------------------------------------------------------------- the table


def print_table(results: dict, args) -> None:
    modes = list(results)
    total = args.nodes * (args.shard_mib << 20)
    row = single.row
    print(f"\ndcp on {args.nodes} nodes: a rank each, {args.shard_mib} MiB shard in {args.chunk_mib} MiB writes, "
          f"a barrier, rank 0 .metadata; {total / 2**20:.0f} MiB of shards; a watcher polls the PFS every "
          f"{args.poll_ms:g} ms")
    print(f"  {'':<34}" + "".join(f"{m:>12}" for m in modes) + f"{'monarch/direct':>16}")
    get = lambda key: {m: r.get(key) for m, r in results.items()}  # noqa: E731
    print(row("last rank started, s after launch", get("ranks_started_s"), ".2f", modes))
    print(row("shards written s (slowest rank)", get("shard_write_s"), ".3f", modes))
    print(row(".metadata seen, s after launch", {m: r.get("watcher", {}).get("metadata_seen_after_s")
                                                 for m, r in results.items()}, ".2f", modes))
    print(row("every job returned, s", get("jobs_s"), ".2f", modes))
    print(row("daemons up s (mpiexec to sockets)", get("daemons_up_s"), ".2f", modes, ratio=False))
    print(row("daemons stopped s", get("daemons_stop_s"), ".2f", modes, ratio=False))
    print(row("jobs' CPU s (their process trees)", get("cpu_s"), ".2f", modes))
    print(row("daemons' CPU s (mpiexec, serve)", get("daemons_cpu_s"), ".2f", modes, ratio=False))
    print(row("jobs' + daemons' CPU s", {m: r.get("cpu_s", 0) + r.get("daemons_cpu_s", 0) for m, r in results.items()},
              ".2f", modes))
    print(row("emulated PFS CPU s", get("pfs_cpu_s"), ".2f", modes))
    print(row("PFS bytes written / shards", {m: r["pfs"]["bytes_written"] / total for m, r in results.items()},
              ".2f", modes, ratio=False, unit="x"))
    for key, name in (("polls", "watcher polls"), ("metadata_while_a_shard_incomplete", "(a) .metadata, a shard short"),
                      ("final_name_short", "(b) a final name, short")):
        print(row(name, {m: r.get("watcher", {}).get(key) for m, r in results.items()}, "d", modes, ratio=False))
    print(row("bytes checked right, MiB", {m: r["bytes_right"] / 2**20 for m, r in results.items()}, ".1f", modes,
              ratio=False))
    print(f"  {'published files, every byte':<34}" + "".join(f"{single.checked(results[m]):>12}" for m in modes))
    single.print_problems(results, modes)
    if "monarch" in results and "report" in results["monarch"]:
        rep = results["monarch"]["report"]
        print(f"monarch report: {rep['nodes_reporting']} nodes, {rep['files_published']} of {rep['files_closed']} "
              f"files published, {rep['ordered_files']} ordered after other nodes (waited "
              f"{rep['order_wait_seconds']:.2f} s); fsync {'/'.join(rep['fsync'])}: the jobs' fsyncs took "
              f"{rep['app_sync_seconds']:.2f} s, {rep['partner_bytes_sent'] / 2**20:.0f} MiB copied to partner nodes "
              f"in {rep['partner_seconds']:.2f} s")
    seen = {m: r.get("watcher", {}) for m, r in results.items()}
    print("dcp nodes: " + ", ".join(f"{m} polls {w.get('polls')} early {w.get('metadata_while_a_shard_incomplete')} "
                                    f"short {w.get('final_name_short')} bytes {single.checked(results[m])}"
                                    for m, w in seen.items()))


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    print(machine_facts(), flush=True)
    fresh_bytecode()
    if pfs_unavailable("bench_dcp_nodes"):
        return 2
    work, shm, src = bench_places("mbdcp-")
    results: dict = {}
    try:
        with SlowPFS(src, work / "pfs", work / "pfs-counters.json", open_latency_ms=args.open_latency_ms,
                     writable=True, write_bandwidth_mbps=args.write_bandwidth) as pfs:
            print(f"emulated PFS at {pfs.mountpoint}: writes capped at {args.write_bandwidth:g} MB/s in all, "
                  f"{args.open_latency_ms:g} ms per open, no page cache; each node's RAM tier {args.tier_mib} MiB",
                  flush=True)
            for mode in args.modes:
                try:
                    results[mode] = run_mode(mode, args, pfs, src, shm, work)
                except RuntimeError as e:
                    results[mode] = {"error": str(e), "pfs": {"bytes_written": 0}, "bytes_right": 0,
                                     "check": {"files": args.nodes + 1, "ok": 0, "problems": []}}
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    print_table(results, args)
    write_json(args.json, {"config": vars(args), "results": results})
    print(f"\nwrote {args.json}")
    failed = [m for m, r in results.items() if "error" in r or r["check"]["problems"]]
    failed += [m for m, r in results.items() if m == "monarch" and (  # direct shows its shards short: W2 is Monarch's
        r.get("watcher", {}).get("metadata_while_a_shard_incomplete") or r.get("watcher", {}).get("final_name_short"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
