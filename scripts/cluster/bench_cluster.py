#!/usr/bin/env python3
"""Cluster benchmark: N simulated nodes on this machine, the sharded pattern, direct against Monarch.

One emulated PFS (FUSE with a per-open latency, ``monarch.tools.slowpfs``) counts every
byte read from it. Each epoch one global shuffle is split into N disjoint shards; node k
reads shard k (``support.shard_reader``, digests checked against the manifest).

  direct   N readers straight from the PFS mount
  monarch  ``mpiexec -disable-auto-cleanup -n N python -m monarch serve -c CFG`` (per-node bases
           via ${MONARCH_NODE}), one reader per node under ``monarch run`` with MONARCH_NODE=k

Each node's storage (ram + ssd + peer area, split 16:8:4 as in the users' setup) is
``--capacity-share`` of the dataset. ``--start`` says when the readers start: ``before``
(default: once the daemons answer), ``with`` (together with mpiexec) or ``after`` (once the
daemons have finished staging). Several values, comma-separated, run one after the other.

Prints per case: PFS bytes / dataset (from the emulator), each epoch's time (max over
nodes), launch to the end of epoch 1 (the job's launch: mpiexec for Monarch, the readers
for direct), whether every digest was right, and Monarch's per-node numbers.

    python scripts/cluster/bench_cluster.py                                  # 600 x 64 KiB, 4 nodes, 2 ms
    python scripts/cluster/bench_cluster.py --open-latency-ms 20 --start before,with
    python scripts/cluster/bench_cluster.py --capacity-share 2               # every node holds the whole dataset
    python scripts/cluster/bench_cluster.py --files 1200 --open-latency-ms 2 --hints   # the clairvoyant path
    python scripts/cluster/bench_cluster.py --files 1200 --open-latency-ms 2 --hints --peer-in-ram  # areas in /dev/shm
    python scripts/cluster/bench_cluster.py --files 1200 --hints --peer-in-ram --compute-ms 1  # a training step a file

The readers read as fast as the cores allow unless ``--compute-ms`` gives each reader thread a
training step's time per file (slept, the cores left to the daemons; the per-open latency and
the digests as without it).

``--hints`` adds two cases after the transparent one (with ``peer.fetch_ahead: true``): the readers tell their order
(``monarch.hints.DistributedHintedSampler``), once with each node's storage as given and once
with every node holding the whole dataset (``--capacity-share 2``), and prints per epoch the
share of other nodes' files opened as local hits (fetched ahead by the door's peer read-ahead),
the steady epoch against the whole-dataset job's, the daemons' CPU per remote file, and the CPU
of every process the job starts (launchers, mpiexec and its proxies, daemons, readers, the
emulated PFS: ``scripts/benchkit/cpuwatch.py``) for the epochs after the first and for the whole job,
the start-up (launch until every reader reads: interpreters, MPI, the walk) and the tear-down
(the last epoch's end until the launchers end: the readers' exit, the reports) on lines of their
own; the epochs after the first end when every node ended its last, beside direct's and the transparent case's. The peer areas are beside the ssd tiers, in /tmp
(on this project's VM an ext4 without a journal, where a create after many unlinks is dear:
docs/performance.md), or with ``--peer-in-ram`` in /dev/shm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

from benchkit.cluster import bench_env, mpiexec, shard_reader, stop_daemons, wait_for  # noqa: E402
from benchkit.options import fresh_bytecode, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from benchkit.cpuwatch import CpuWatch, wait_marks  # noqa: E402
from support.harness import sharded_config  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402
from monarch.tools.workload import make_dataset, parse_size  # noqa: E402

JOB = "benchcluster"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--files", type=int, default=600)
    p.add_argument("--file-size", default="64KiB")
    p.add_argument("--open-latency-ms", type=float, default=2.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4, help="reader threads per node")
    p.add_argument("--compute-ms", type=float, default=0.0,
                   help="a training step's time per file in each reader thread (slept: the cores left free); "
                        "0, the default, reads as fast as the cores allow")
    p.add_argument("--capacity-share", type=float, default=1 / 3,
                   help="each node's ram+ssd+peer as a share of the dataset (default 1/3; >= 1: every node can hold it)")
    p.add_argument("--start", default="before", help="before|with|after the daemons, or several comma-separated")
    p.add_argument("--modes", default="direct,monarch")
    p.add_argument("--peer-in-ram", action="store_true",
                   help="each node's peer area in /dev/shm (tmpfs) instead of beside its ssd tier (in /tmp)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it is killed")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--trace", action="store_true",
                   help="debug logs with time stamps (serve.log, run<k>.log) and each phase's time after launch")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--hints", action="store_true",
                   help="also the readers telling their order (DistributedHintedSampler), and the same at --capacity-share 2")
    return p.parse_args(argv)


def env(**extra) -> dict:
    return bench_env(JOB, **extra)


def write_config(base: str, root: str, node_bytes: int, nodes: int, fetch_ahead: bool = False,
                 peer_in_ram: bool = False) -> str:
    return sharded_config(base, root, node_bytes, nodes, floor=1 << 20, fetch_ahead=fetch_ahead,
                          peer_in_ram=peer_in_ram)


def hold_file(out: str) -> str:
    """The file every reader of ``out``'s case waits for after its first epoch (wait_marks makes it)."""
    return os.path.join(os.path.dirname(out), "epoch1.marked")


def reader_cmd(root: str, manifest: str, k: int, args, out: str, hints: bool = False) -> list[str]:
    """Node ``k``'s reader; it marks its start (``<out>.started``) and its epochs (``<out>.progress``),
    and starts its second epoch once every node ended its first (hold_file): the epochs after
    the first are then one window, whose CPU is theirs alone, as in a data-parallel job."""
    return shard_reader(root, manifest, k, args, "--json", out, "--started", out + ".started", "--progress",
                        out + ".progress", "--hold", hold_file(out), "--compute-ms", str(args.compute_ms),
                        *(["--hints"] if hints else []))


def watched(watch: CpuWatch, outs: list[str], procs, epochs: int) -> tuple[threading.Thread, threading.Event]:
    """Marks "reading", "epoch1" and "epochs" (the last ended) on ``watch`` as the readers of
    ``outs`` get there."""
    stop = threading.Event()
    t = threading.Thread(target=wait_marks, args=(watch, [o + ".started" for o in outs],
                                                  [o + ".progress" for o in outs], procs, stop, hold_file(outs[0]),
                                                  epochs),
                         daemon=True)
    t.start()
    return t, stop


def phases(watch: CpuWatch) -> dict:
    """CPU-seconds of every process by kind: start-up (launch until every reader reads), the
    epochs after the first (epoch 1's end on every node until every node ended its last
    epoch), and the tear-down (from there until the readers and their launchers end: their
    exit, the launchers' reports)."""
    last = "epochs" if "epochs" in watch.marks else "end"
    return {"startup": watch.between("launch", "reading"), "after_epoch1": watch.between("epoch1", last),
            "teardown": watch.between(last, "end"),
            "daemon_threads_after_epoch1": watch.by_thread("epoch1", last, "daemons"),
            "daemon_wakeups_after_epoch1": watch.by_thread("epoch1", last, "daemons", runs=True)}


def run_readers(cmds: list[list[str]], envs: list[dict], timeout: float) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for c, e in zip(cmds, envs)]
    return procs


def summarise(name: str, launched: float, results: list[dict | None], pfs_bytes: int, total: int,
              codes: list[int], extra: dict | None = None) -> dict:
    ok = all(r is not None and r["ok"] for r in results) and all(c == 0 for c in codes)
    epochs = []
    if all(r is not None for r in results):
        for e in range(len(results[0]["epochs"])):
            epochs.append(round(max(r["epochs"][e]["seconds"] for r in results), 3))
        first_end = max(r["epochs"][0]["end"] for r in results) - launched
    else:
        first_end = None
    return {"case": name, "pfs_over_dataset": round(pfs_bytes / total, 3), "pfs_bytes": pfs_bytes,
            "epoch_seconds": epochs, "launch_to_epoch1_end": round(first_end, 3) if first_end else None,
            "digests_ok": ok, "exit_codes": codes} | (extra or {})


def cpu_children() -> float:
    """CPU seconds (user + system) of every child process reaped so far, their descendants included."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pfs_cpu(pfs) -> float:
    """CPU seconds the emulated PFS's process has used so far."""
    import psutil
    t = psutil.Process(pfs.proc.pid).cpu_times()
    return t.user + t.system


def load_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_direct(args, base, pfs, root, manifest, total) -> dict:
    pfs.reset_counters()
    outs = [os.path.join(base, f"direct{k}.json") for k in range(args.nodes)]
    cpu0, fuse0 = cpu_children(), pfs_cpu(pfs)
    launched = time.time()
    with CpuWatch(pfs_pid=pfs.proc.pid) as watch:
        watch.mark("launch")
        procs = run_readers([reader_cmd(root, manifest, k, args, outs[k]) for k in range(args.nodes)],
                            [env(MONARCH_DISABLE=1)] * args.nodes, args.timeout)
        marker, stop = watched(watch, outs, procs, args.epochs)
        done = wait_for(procs, time.monotonic() + args.timeout)
        stop.set()
        marker.join()
        watch.mark("end")
    cpu = {"readers": round(cpu_children() - cpu0, 2), "pfs": round(pfs_cpu(pfs) - fuse0, 2)}
    return summarise("direct", launched, [load_json(o) for o in outs], pfs.counters()["bytes"], total,
                     [c for c, _, _ in done], {"cpu_seconds": cpu, "cpu_phases": phases(watch)})


def sockets(base: str, nodes: int) -> list[str]:
    """The daemons' sockets, named before their bases exist (layout.socket_path checks the base)."""
    from monarch.layout import SOCKET, run_name
    return [os.path.join(base, f"run{k}", f"monarch-{os.getuid()}", run_name(JOB, k), SOCKET) for k in range(nodes)]


def wait_quiet(pfs, seconds: float = 1.5, limit: float = 120.0) -> None:
    """Until the PFS has read nothing for ``seconds`` (the daemons' staging is done)."""
    last, since, t0 = -1, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < limit:
        now = pfs.raw_counters(settle=0)["bytes"]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return
        time.sleep(0.25)


def run_monarch(args, base, pfs, root, manifest, total, start: str, hints: bool = False,
                share: float | None = None) -> dict:
    share = args.capacity_share if share is None else share
    name = f"monarch/{start}" + ("+hints" if hints else "") + (f"@{share:g}" if share != args.capacity_share else "")
    case = os.path.join(base, name.replace("/", "-").replace("+", "-").replace("@", "-"))
    os.makedirs(case)
    cfg = write_config(case, root, int(share * total), args.nodes, fetch_ahead=hints, peer_in_ram=args.peer_in_ram)
    pfs.reset_counters()
    deadline = time.monotonic() + args.timeout
    cpu0, fuse0 = cpu_children(), pfs_cpu(pfs)
    launched = time.time()
    trace = ["-vv"] if args.trace else []
    watch = CpuWatch(pfs_pid=pfs.proc.pid).__enter__()
    watch.mark("launch")
    serve = subprocess.Popen([mpiexec("bench_cluster"), "-disable-auto-cleanup", "-n", str(args.nodes), sys.executable, "-m",
                              "monarch", *trace, "serve", "-c", cfg], env=env(), start_new_session=True,
                             stdout=open(os.path.join(case, "serve.log"), "w"), stderr=subprocess.STDOUT)
    socks = sockets(case, args.nodes)
    try:
        if start in ("before", "after"):
            while not all(os.path.exists(s) for s in socks):
                if serve.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the daemons did not come up; see {case}/serve.log")
                time.sleep(0.05)
        if start == "after":
            wait_quiet(pfs)
            launched = time.time()  # the readers' launch: the staging is not counted here
        outs = [os.path.join(case, f"reader{k}.json") for k in range(args.nodes)]
        cmds = [[sys.executable, "-m", "monarch", *trace, "run", "-c", cfg, "--report", os.path.join(case, f"run{k}.json"),
                 "--", *reader_cmd(root, manifest, k, args, outs[k], hints)] for k in range(args.nodes)]
        procs = run_readers(cmds, [env(MONARCH_NODE=k) for k in range(args.nodes)], args.timeout)
        marker, stop = watched(watch, outs, procs, args.epochs)
        done = wait_for(procs, deadline)
        stop.set()
        marker.join()
        watch.mark("end")
        cpu1 = cpu_children()
        for k, (code, _, err) in enumerate(done):
            if code != 0:
                print(f"  node {k} exited {code}:\n{err[-1500:]}", file=sys.stderr)
        stalled = [k for k, (_, _, err) in enumerate(done) if "Monarch is not active" in err]
        if args.trace:
            for k, (_, _, err) in enumerate(done):
                Path(case, f"run{k}.log").write_text(err)
    finally:
        stop_daemons(serve)
        watch.__exit__(None, None, None)
    cpu = {"readers": round(cpu1 - cpu0, 2), "daemons": round(cpu_children() - cpu1, 2),
           "pfs": round(pfs_cpu(pfs) - fuse0, 2)}
    report = load_json(os.path.join(os.path.dirname(socks[0]), "report.json")) or {}
    # remote opens: what the readers' launchers counted answered from another node's copy
    remote = sum(((load_json(os.path.join(case, f"run{k}.json")) or {}).get("opened_from", {})
                  .get("peer", {}).get("opens", 0)) for k in range(args.nodes))
    cpu["remote_opens"] = remote
    if args.trace:
        print_phases(case, launched, args.nodes)
    return summarise(name, launched, [load_json(o) for o in outs], pfs.counters()["bytes"], total,
                     [c for c, _, _ in done], {"nodes_without_monarch": stalled, "per_node": per_node(report),
                                                "cpu_seconds": cpu, "cpu_phases": phases(watch),
                                                "ahead": ahead_figures(report)})


def ahead_figures(report: dict) -> dict:
    """The peer read-ahead's figures over the nodes (the report's front_door.peer_ahead): per
    epoch, other nodes' files opened and those fetched at their open (the rest: local hits)."""
    epochs: list[list[int]] = []
    lane: dict[str, int] = {}
    for n in report.get("nodes", []):
        pa = (n.get("front_door") or {}).get("peer_ahead") or {}
        for i, e in enumerate(pa.get("epochs", [])):
            while len(epochs) <= i:
                epochs.append([0, 0, 0])
            epochs[i][0] += e["remote_opens"]
            epochs[i][1] += e["fetched_at_open"]
            epochs[i][2] += e.get("waited_for_ahead", 0)
        for k, v in (pa.get("lane") or {}).items():
            if k in ("fetched", "fetched_bytes", "batches", "failed", "room_waits"):
                lane[k] = lane.get(k, 0) + v
    # a local hit: neither fetched at its open nor waiting for the read-ahead's fetch of it
    return {"epochs": [{"remote_opens": r, "fetched_at_open": f, "waited_for_ahead": w,
                        "local_hit_share": round(1 - (f + w) / r, 4) if r else None} for r, f, w in epochs],
            "lane": lane}


def print_phases(case: str, launched: float, nodes: int) -> None:
    """Each logged phase's first time after launch, per node (the daemons' and the readers')."""
    import re
    stamp = re.compile(r"^\[monarch node (\d+)\] (\d+\.\d+) DEBUG phase (\S+)(?: cpu=(\S+))?")
    first: dict[tuple[str, str], tuple[float, str]] = {}
    for name in ["serve.log"] + [f"run{k}.log" for k in range(nodes)]:
        try:
            lines = Path(case, name).read_text().splitlines()
        except OSError:
            continue
        who = "daemon" if name == "serve.log" else "reader"
        for line in lines:
            m = stamp.match(line)
            if m:
                first.setdefault((f"{who} {m.group(1)}", m.group(3)),
                                 (float(m.group(2)) - launched, f"  (CPU {m.group(4)} s)" if m.group(4) else ""))
    for (who, phase), (t, cpu) in sorted(first.items(), key=lambda kv: kv[1]):
        print(f"   {t:7.3f} s  {who:<9} {phase}{cpu}")


def per_node(report: dict) -> list[dict]:
    """What each node owned, staged, sent and received (from the job's report, node 0's)."""
    out = []
    for n in report.get("nodes", []):
        peer = n.get("peer") or {}
        cl = n.get("cluster") or {}
        out.append({"node": n.get("node"), "mode": cl.get("mode"), "owned_files": cl.get("owned_files"),
                    "owned_bytes": cl.get("owned_bytes"), "staged_bytes": (n.get("staging") or {}).get("bytes"),
                    "pfs_bytes": (n.get("staging") or {}).get("pfs_bytes_read"),
                    "peer_sent": peer.get("bytes_sent"), "peer_received": peer.get("bytes_received"),
                    "cache": cl.get("peer_cache")})
    return out


def cpu_line(r: dict, direct: dict | None) -> str:
    """The whole job's CPU-seconds (every process: readers, launchers, daemons, the emulated
    PFS), against direct's; and the daemons' CPU per remote open (start-up and staging in)."""
    cpu = dict(r.get("cpu_seconds") or {})
    if not cpu:
        return ""
    remote = cpu.pop("remote_opens", None)
    whole = sum(cpu.values())
    line = f"  CPU s {cpu} = {whole:.2f} whole job"
    if direct is not None and r is not direct and direct.get("cpu_seconds"):
        line += f" ({whole / sum(direct['cpu_seconds'].values()):.2f}x direct's)"
    if remote:
        line += f"; daemons {1e3 * cpu['daemons'] / remote:.2f} ms per remote open ({remote} remote opens)"
    return line


def print_case(r: dict, direct: dict | None = None) -> None:
    print(f"{r['case']:<16} PFS/dataset {r['pfs_over_dataset']:6.3f}  epochs {r['epoch_seconds']}  "
          f"launch->end of epoch 1 {r['launch_to_epoch1_end']} s  digests {'OK' if r['digests_ok'] else 'BAD'}"
          + (f"  nodes without Monarch {r['nodes_without_monarch']}" if r.get("nodes_without_monarch") else "")
          + cpu_line(r, direct),
          flush=True)
    for n in r.get("per_node", []):
        print(f"   node {n['node']}: {n}", flush=True)


def steady(r: dict) -> float | None:
    """The mean of the epochs after the first (each the slowest node's)."""
    later = r["epoch_seconds"][1:]
    return sum(later) / len(later) if later else None


def remote_after_first(args, r: dict) -> int:
    """Opens of other nodes' files in the epochs after the first: the read-ahead's count, else
    the sharded pattern's (a node's shard holds (N-1)/N of other nodes' files)."""
    counted = sum(e["remote_opens"] for e in (r.get("ahead") or {}).get("epochs", [])[1:])
    return counted or int(args.files * (args.nodes - 1) / args.nodes * (args.epochs - 1))


def print_hints(args, direct: dict | None, transparent: dict, hinted: dict, whole: dict) -> None:
    """The clairvoyant path's figures (--hints), beside direct's and the transparent case's."""
    shares = [e["local_hit_share"] for e in hinted["ahead"]["epochs"]]
    later = hinted["ahead"]["epochs"][1:]
    r = sum(e["remote_opens"] for e in later)
    f = sum(e["fetched_at_open"] + e["waited_for_ahead"] for e in later)
    w = sum(e["waited_for_ahead"] for e in later)
    print("clairvoyant path (the readers tell their order):")
    print(f"  remote-owned opens answered as local hits, per epoch: {shares}; epoch 2 on: "
          f"{(1 - f / r) if r else float('nan'):.3f} of {r} (target >= 0.95; {w} waited for the read-ahead's "
          f"fetch, not counted as hits); lane {hinted['ahead']['lane']}")
    a, b = steady(hinted), steady(whole)
    if a and b:
        print(f"  steady epoch: {a:.3f} s against {b:.3f} s with every node holding the whole dataset: "
              f"{a / b:.2f}x (target <= 1.15x)")
    cases = [("direct", direct), ("transparent", transparent), ("hinted", hinted)]
    for name, c in cases[1:]:
        daemons = c["cpu_phases"]["after_epoch1"].get("daemons", 0.0)
        n = remote_after_first(args, c)
        print(f"  daemons' CPU per remote file, epochs 2 on ({name}): {1e6 * daemons / max(1, n):.1f} us "
              f"({daemons:.2f} s / {n} files; target <= 15 us)")
        threads = c["cpu_phases"].get("daemon_threads_after_epoch1") or {}
        print(f"    by thread, us per remote file: "
              + ", ".join(f"{t} {1e6 * v / max(1, n):.1f}" for t, v in threads.items()))
        wakeups = c["cpu_phases"].get("daemon_wakeups_after_epoch1") or {}
        print(f"    by thread, wake-ups per remote file: "
              + ", ".join(f"{t} {v / max(1, n):.2f}" for t, v in wakeups.items()))
    base = sum(direct["cpu_phases"]["after_epoch1"].values()) if direct else None
    for name, c in cases:
        if c is None:
            continue
        after = c["cpu_phases"]["after_epoch1"]
        ratio = f" = {sum(after.values()) / base:.2f}x direct's" if base else ""
        print(f"  CPU of every process, epochs 2 on ({name}): {sum(after.values()):.2f} s{ratio} {after}"
              + (" (target <= 0.5x)" if name == "hinted" else ""))
    whole_direct = sum(direct["cpu_seconds"].values()) if direct else None
    for name, c in cases:
        if c is None:
            continue
        cpu = {k: v for k, v in c["cpu_seconds"].items() if k != "remote_opens"}
        ratio = f" = {sum(cpu.values()) / whole_direct:.2f}x direct's" if whole_direct else ""
        print(f"  CPU of every process, whole job ({name}): {sum(cpu.values()):.2f} s{ratio}")
        startup = c["cpu_phases"]["startup"]
        print(f"    of which start-up (launch until every reader reads: interpreters, MPI, the walk) "
              f"({name}): {sum(startup.values()):.2f} s {startup}")
        teardown = c["cpu_phases"].get("teardown", {})
        print(f"    of which tear-down (the last epoch's end until the launchers end: the readers' exit, "
              f"the reports) ({name}): {sum(teardown.values()):.2f} s {teardown}")


def main(argv=None) -> int:
    args = parse_args(argv)
    fresh_bytecode()
    if pfs_unavailable("bench_cluster", probe=False):
        return 2
    base = tempfile.mkdtemp(prefix="mbc-", dir="/tmp")  # short: Unix socket paths are bounded
    results = []
    try:
        src = os.path.join(base, "src")
        manifest = os.path.join(base, "src.manifest.json")
        make_dataset(src, files=args.files, size=parse_size(args.file_size), spread=0.0, manifest=manifest)
        total = args.files * parse_size(args.file_size)
        print(f"{args.nodes} nodes, {args.files} files x {args.file_size} = {total / 2**20:.1f} MiB, "
              f"{args.open_latency_ms:g} ms per open, {args.epochs} epochs, each node's storage "
              f"{args.capacity_share:.2f} x the dataset", flush=True)
        with SlowPFS(src, os.path.join(base, "pfs"), open_latency_ms=args.open_latency_ms) as pfs:
            root = pfs.mountpoint
            modes = args.modes.split(",")
            if "direct" in modes:
                results.append(run_direct(args, base, pfs, root, manifest, total))
                print_case(results[-1])
            if "monarch" in modes:
                direct = results[0] if "direct" in modes else None
                for start in args.start.split(","):
                    results.append(run_monarch(args, base, pfs, root, manifest, total, start))
                    print_case(results[-1], direct)
                    if args.hints:
                        transparent = results[-1]
                        hinted = run_monarch(args, base, pfs, root, manifest, total, start, hints=True)
                        print_case(hinted, direct)
                        whole = run_monarch(args, base, pfs, root, manifest, total, start, hints=True, share=2.0)
                        print_case(whole, direct)
                        results += [hinted, whole]
                        print_hints(args, direct, transparent, hinted, whole)
        write_json(args.json, {"args": vars(args), "results": results}, indent=1)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(f"/dev/shm{base}", ignore_errors=True)
        else:
            print(f"kept {base}")
    return 0 if all(r["digests_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
