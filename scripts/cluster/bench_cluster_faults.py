#!/usr/bin/env python3
"""A lost daemon: N simulated nodes, the sharded pattern, one `monarch serve` SIGKILLed.

One emulated PFS (FUSE, ``--open-latency-ms`` per open) counts every byte read from it.
Each epoch one global shuffle is split into N shards; node k reads shard k
(``support.shard_reader``: digests checked, the slowest open of each epoch timed).

  direct      N readers straight from the PFS mount
  monarch     the daemons launched by ``monarch.cluster.world.daemon_launch`` (Open MPI with
              ULFM when installed, else MPICH -disable-auto-cleanup), one reader per node
              under ``monarch run``; no fault
  kill        the same, daemon ``--victim`` SIGKILLed once its reader finished epoch
              ``--kill-after`` (default 1: mid-job)
  replicas    the kill case with ``peer.replicas: 2`` (sharded: each node keeps second copies
              of the files it takes over on a loss, in the room its share leaves in its tiers)

``--layout spread`` (default): each node's ram+ssd+peer is 1/3 of the dataset (16:8:4), so
each file has one owner and readers fetch most of their shard from peers; ``--layout
replicate``: every node can hold the dataset (copies come from the owners through the peers).
``--share F`` sets each node's storage to F of the dataset instead (e.g. 0.7: sharded, with
room in the tiers for a node's share and its second copies).

Prints per case: PFS bytes / dataset, the slowest open on a surviving node, each epoch's
time (max over nodes), `monarch stop` seconds, whether the other daemons were up at the end,
the lost nodes the report names (when and why) and whether every digest was right.

    python scripts/cluster/bench_cluster_faults.py                      # 480 x 16 KiB, 4 nodes, 20 ms per open
    python scripts/cluster/bench_cluster_faults.py --layout replicate --victim 0
    python scripts/cluster/bench_cluster_faults.py --share 0.7 --modes monarch,kill,replicas
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

from benchkit.cluster import bench_env, shard_reader, wait_for  # noqa: E402
from benchkit.options import fresh_bytecode, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from support.harness import sharded_config  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402
from monarch.cluster.world import daemon_launch  # noqa: E402
from monarch.tools.workload import make_dataset  # noqa: E402

JOB = "benchfaults"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--files", type=int, default=480)
    p.add_argument("--file-size", default="16KiB")
    p.add_argument("--open-latency-ms", type=float, default=20.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--layout", choices=("spread", "replicate"), default="spread")
    p.add_argument("--share", type=float, default=None,
                   help="each node's storage as a fraction of the dataset (default: 1/3 spread, 2 replicate)")
    p.add_argument("--victim", type=int, default=2)
    p.add_argument("--kill-after", type=int, default=1, help="kill once the victim's reader finished this many epochs")
    p.add_argument("--modes", default="direct,monarch,kill,replicas")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def env(**extra) -> dict:
    return bench_env(JOB, **extra)


def write_config(base: str, root: str, node_bytes: int, replicas: int = 1) -> str:
    return sharded_config(base, root, node_bytes, 8, floor=1 << 20, replicas=replicas)


def readers(args, root, manifest, base, wrap=None):
    procs = []
    for k in range(args.nodes):
        cmd = shard_reader(root, manifest, k, args, "--progress", os.path.join(base, f"progress{k}"))
        procs.append(subprocess.Popen((wrap or []) + cmd, env=env(MONARCH_NODE=k), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
    return procs


def wait_readers(procs, deadline):
    """Each reader's exit code and result (its ``shard_reader {json}`` line, stderr merged)."""
    out = []
    for code, text, _ in wait_for(procs, deadline):
        line = next((ln for ln in text.splitlines() if ln.startswith("shard_reader ")), None)
        out.append((code, json.loads(line[13:]) if line else None))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def run_dir(base, k):
    return os.path.join(base, f"run{k}", f"monarch-{os.getuid()}", f"{JOB}-node{k}")


def case(name, args, ds_root, manifest, total, base):
    """One case on a fresh emulated PFS; returns its row."""
    work = tempfile.mkdtemp(prefix="bf-", dir="/tmp")
    pfs = SlowPFS(ds_root, os.path.join(work, "mnt"), os.path.join(work, "counters.json"),
                  open_latency_ms=args.open_latency_ms)
    pfs.start()
    row = {"case": name}
    cluster = launch = None
    try:
        mount = str(pfs.mountpoint)
        deadline = time.monotonic() + args.timeout
        if name == "direct":
            results = wait_readers(readers(args, mount, manifest, work), deadline)
            victim = None
        else:
            share = args.share or (2.0 if args.layout == "replicate" else 1 / 3)
            cfg = write_config(work, mount, int(total * share), 2 if name == "replicas" else 1)
            launch = daemon_launch(args.nodes, one_host=True)
            row["engine"] = launch.engine
            cluster = subprocess.Popen([*launch.argv, sys.executable, "-m", "monarch", "serve", "-c", cfg],
                                       env=env(**launch.env), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            pid_files = [os.path.join(run_dir(work, k), "daemon.pid") for k in range(args.nodes)]
            while not all(os.path.exists(p) and open(p).read().strip() for p in pid_files):
                if time.monotonic() > deadline or cluster.poll() is not None:
                    raise RuntimeError("the daemons did not come up")
                time.sleep(0.05)
            pids = [int(open(p).read()) for p in pid_files]
            procs = readers(args, mount, manifest, work, [sys.executable, "-m", "monarch", "run", "-c", cfg, "--"])
            victim = args.victim if name in ("kill", "replicas") else None
            if victim is not None:
                progress = os.path.join(work, f"progress{victim}")
                while not (os.path.exists(progress) and len(open(progress).read().split()) >= args.kill_after):
                    if time.monotonic() > deadline or all(p.poll() is not None for p in procs):
                        break
                    time.sleep(0.02)
                os.kill(pids[victim], signal.SIGKILL)
                row["killed_at"] = time.time()
            results = wait_readers(procs, deadline)
            survivors = [k for k in range(args.nodes) if k != victim]
            row["daemons_up_at_end"] = all(alive(pids[k]) for k in survivors)
            t0 = time.monotonic()
            for k in survivors:
                subprocess.run([sys.executable, "-m", "monarch", "stop", "-c", cfg], env=env(MONARCH_NODE=k),
                               capture_output=True, timeout=120)
            try:
                cluster.wait(timeout=120)
            except subprocess.TimeoutExpired:
                row["stop_hung"] = True
            row["stop_seconds"] = round(time.monotonic() - t0, 2)
            writer = min(survivors)
            try:
                with open(os.path.join(run_dir(work, writer), "report.json")) as f:
                    rep = json.load(f)
                row["report_lost"] = (rep.get("lost") or {}).get("nodes")
                row["report_pfs_lower_bound"] = rep["pfs"].get("lower_bound")
                row["served_after_loss"] = (rep.get("lost") or {}).get("after_loss")
                clusters = [n.get("cluster") or {} for n in rep.get("nodes", []) if n and not n.get("missing")]
                row["reowned_files"] = sum(c.get("reowned_files", 0) for c in clusters)
                kept = [c["replicas"] for c in clusters if c.get("replicas")]
                if kept:
                    row["replicas_kept"] = [r["kept_files"] for r in kept]  # per surviving node
                    row["reowned_held"] = sum(r["reowned_held"] for r in kept)
                    row["replica_served_after_loss"] = sum(r["served_after_loss"]["files"] for r in kept)
            except (OSError, ValueError, KeyError) as e:
                row["report_lost"] = f"no report: {e}"
        row["ok"] = all(code == 0 and r is not None and r["ok"] for code, r in results)
        row["pfs_x"] = round(pfs.counters()["bytes"] / total, 3)
        row["slowest_open_survivors"] = max((e["slowest_open"] for k, (_, r) in enumerate(results)
                                             if r and k != victim for e in r["epochs"]), default=None)
        row["epoch_seconds"] = [round(max(r["epochs"][e]["seconds"] for _, r in results if r), 3)
                                for e in range(args.epochs)] if all(r for _, r in results) else None
    finally:
        if cluster is not None and cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()
        if launch is not None:
            launch.close()
        pfs.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{work}", ignore_errors=True)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    fresh_bytecode()
    if pfs_unavailable("bench_cluster_faults"):
        return 2
    base = tempfile.mkdtemp(prefix="bfd-", dir="/tmp")
    try:
        root, manifest = os.path.join(base, "pfs"), os.path.join(base, "pfs.manifest.json")
        entries = make_dataset(root, files=args.files, size=args.file_size, manifest=manifest)
        total = sum(e["size"] for e in entries.values())
        rows = [case(m, args, root, manifest, total, base) for m in args.modes.split(",")]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{args.nodes} nodes, {args.files} x {args.file_size}, {args.open_latency_ms:g} ms per open, "
          f"{args.epochs} epochs, layout {args.layout}" + (f" (share {args.share:g})" if args.share else "")
          + f", victim {args.victim} after epoch {args.kill_after}")
    keys = ["ok", "pfs_x", "slowest_open_survivors", "epoch_seconds", "stop_seconds", "daemons_up_at_end",
            "report_lost", "report_pfs_lower_bound", "reowned_files", "replicas_kept", "reowned_held",
            "replica_served_after_loss", "engine"]
    for k in keys:
        print(f"  {k:24s}" + "".join(f" | {r['case']}: {r.get(k, '-')}" for r in rows))
    write_json(args.json, rows, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
