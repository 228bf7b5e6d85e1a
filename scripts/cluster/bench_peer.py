#!/usr/bin/env python3
"""Remote opens per second: one node reading files another node holds staged.

Two simulated nodes on this machine (``mpiexec -n 2 monarch serve``), each owning half of a
dataset of small files in a local directory (no emulated PFS: what is measured is the peer
path, not the source). Once both have staged their halves, node 0 reads every file once
with ``--threads`` reader threads under ``monarch run``: its own half is answered from its
index (native speed), the other half is fetched from node 1 into node 0's peer area, which
holds three quarters of it (so each remote open is one fetch; the last quarter evicts the first).

Two readers (``--reader``), each with daemons of its own in every repeat: ``python`` (a
thread pool: open, read, digest, as a Python data loader does) and ``c`` (scripts/cluster/peer_reader.c:
pthreads, open, read, CRC-32: a reader that itself costs little, so what is left is the peer
path's own cost).

Prints per repeat: the reading pass's wall time, the remote opens (node 0's report), remote
opens per second, and the CPU-seconds of each daemon and of the reader during the pass (the
daemons' idle CPU over the same time subtracted; read when the reader prints its figures,
before the launcher asks for the run's report), with the CPU per remote open; then each
daemon's by thread (the door's workers, the data path's, Python's, MPI's), per remote open,
with the times each was put on a CPU (wake-ups, mostly), idle CPU not subtracted. Each byte
read is checked against the source (the manifest's digest, or its CRC-32 for the C reader).
Then, per reader, the ceiling those costs allow on this machine's cores: remote opens per
second if every open were remote and the job had every core, cores / (the reader's CPU per
file + the requesting daemon's + the owner's per remote open), and which of the three
bounds it.

    python scripts/cluster/bench_peer.py                      # 20,000 x 16 KiB, 8 threads, 3 repeats, both readers
    python scripts/cluster/bench_peer.py --files 4000 --repeats 1 --reader c
"""

from __future__ import annotations

import argparse
import json
import statistics
import zlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

from benchkit.cluster import bench_env, mpiexec, stop_daemons  # noqa: E402
from benchkit.cpuwatch import thread_ns  # noqa: E402
from benchkit.options import fresh_bytecode, write_json  # noqa: E402
from support.harness import ram_peer_config  # noqa: E402
from monarch.tools.workload import make_dataset, parse_size  # noqa: E402

JOB = "benchpeer"
NODES = 2

READER = r"""
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
from monarch.tools.workload import digest, load_manifest
root, manifest_path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
manifest = load_manifest(manifest_path)
names = sorted(manifest)
def check(rel):
    with open(os.path.join(root, rel), "rb") as f:
        data = f.read()
    return len(data) == manifest[rel]["size"] and digest(data) == manifest[rel]["xxh64"]
t0, c0 = time.perf_counter(), time.process_time()
with ThreadPoolExecutor(threads) as pool:
    ok = all(pool.map(check, names, chunksize=64))
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "files": len(names), "ok": ok}),
      flush=True)
sys.exit(0 if ok else 1)
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=20000)
    p.add_argument("--file-size", default="16KiB")
    p.add_argument("--threads", type=int, default=8, help="reader threads on node 0")
    p.add_argument("--repeats", type=int, default=3, help="daemons started anew for each")
    p.add_argument("--perf", action="store_true", help="record each daemon with perf during the reading pass "
                   "and print its costliest symbols")
    p.add_argument("--reader", default="python,c", help="python, c, or both comma-separated (default)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per repeat before it is killed")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    return p.parse_args(argv)


def write_config(base: str, root: str, total: int) -> str:
    """Each node: a RAM tier for its half (and some: placed by count, a node's half of 400 files is
    within 8 % of it), a peer area for most of the other half: less than the dataset in all, so
    the nodes shard it rather than each hold it."""
    return ram_peer_config(base, root, int(total * 0.60), int(total * 0.38), NODES, "peer.yaml")


def daemons(serve: subprocess.Popen) -> list:
    """The daemon processes under mpiexec (node order unknown; both are summed per side below)."""
    import psutil
    kids = psutil.Process(serve.pid).children(recursive=True)
    return [p for p in kids if "serve" in " ".join(p.cmdline()) and "python" in p.name()]


def cpu_of(procs: list) -> list[float]:
    out = []
    for p in procs:
        try:
            t = p.cpu_times()
            out.append(t.user + t.system)
        except Exception:
            out.append(float("nan"))
    return out


def reader_result(reader: subprocess.Popen, deadline: float) -> str | None:
    """The reader's line of figures (JSON), read as it is printed at the pass's end, or None
    if it ended without one; killed at ``deadline``."""
    timer = threading.Timer(max(1.0, deadline - time.monotonic()), reader.kill)
    timer.start()
    try:
        for line in reader.stdout:
            if line.startswith("{"):
                return line
        return None
    finally:
        timer.cancel()


def threads_of(procs: list) -> list[tuple[dict, dict, dict]]:
    """Each daemon's threads now: (CPU-ns by thread id, names, times put on a CPU)."""
    out = []
    for p in procs:
        names, runs = {}, {}
        out.append((thread_ns(p.pid, names, runs), names, runs))
    return out


def by_thread(before: tuple, after: tuple, remote: int) -> dict[str, list[float]]:
    """One daemon's CPU over the pass by thread name (the door's workers summed), per remote
    open: {name: [us, wake-ups]}; threads that used under 1% of the whole left out."""
    (ns0, _, runs0), (ns1, names, runs1) = before, after
    out: dict[str, list[float]] = {}
    for tid, ns in ns1.items():
        name = names.get(tid, "?")
        if name.startswith("python"):
            name = "python"
        acc = out.setdefault(name, [0.0, 0.0])
        acc[0] += (ns - ns0.get(tid, 0)) / 1e3 / max(1, remote)
        acc[1] += (runs1.get(tid, 0) - runs0.get(tid, 0)) / max(1, remote)
    whole = sum(us for us, _ in out.values())
    return {k: [round(us, 1), round(w, 2)] for k, (us, w) in sorted(out.items(), key=lambda kv: -kv[1][0])
            if us >= 0.01 * whole}


def staged_files(base: str) -> int:
    return sum(len(fs) for k in range(NODES) for _, _, fs in os.walk(f"/dev/shm{base}/ram{k}"))


def wait_staged(base: str, want: int, serve: subprocess.Popen, deadline: float) -> None:
    """Until both nodes' RAM tiers hold ``want`` files between them (each its half)."""
    while staged_files(base) < want:
        if serve.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"staging did not finish ({staged_files(base)} of {want}); see {base}/serve.log")
        time.sleep(0.2)


def build_c_reader(work: str) -> str:
    exe = os.path.join(work, "peer_reader")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("bench_peer: --reader c needs a C compiler (cc or gcc); or use --reader python")
    subprocess.run([cc, "-O2", "-pthread", "-o", exe, str(Path(__file__).with_name("peer_reader.c"))], check=True)
    return exe


def write_crc_list(work: str, root: str, manifest_path: str) -> str:
    """The C reader's list: "CRC32 SIZE PATH" per file, in the Python reader's order."""
    from monarch.tools.workload import load_manifest
    path = os.path.join(work, "crc_list.txt")
    with open(path, "w") as out:
        for rel in sorted(load_manifest(manifest_path)):
            full = os.path.join(root, rel)
            with open(full, "rb") as f:
                data = f.read()
            out.write(f"{zlib.crc32(data)} {len(data)} {full}\n")
    return path


def daemon_nodes(procs: list) -> list:
    """Each daemon's node (Hydra's PMI_RANK), or None if it cannot be read."""
    out = []
    for p in procs:
        try:
            out.append(int(p.environ().get("PMI_RANK", "")))
        except Exception:
            out.append(None)
    return out


def start_perf(wanted: bool, base: str, procs: list, nodes: list) -> list:
    """``perf record -g`` of each daemon for the reading pass (``--perf``): [(node, data, proc)]."""
    if not wanted:
        return []
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("bench_peer: --perf needs perf (apt-get install linux-perf)")
    out = []
    for p, node in zip(procs, nodes):
        data = os.path.join(base, f"perf-node{node}.data")
        rec = subprocess.Popen([perf, "record", "-g", "-F", "4999", "-p", str(p.pid), "-o", data],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out.append((node, data, rec))
    time.sleep(0.5)  # perf attached before the pass
    return out


def stop_perf(perf: list) -> None:
    """Stop the recordings and print each daemon's costliest symbols (self time) during the pass."""
    for node, data, rec in perf:
        rec.send_signal(signal.SIGINT)
        rec.wait(timeout=60)
        top = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "sym", "-g", "none",
                              "--percent-limit", "1.5", "--stdio"], capture_output=True, text=True).stdout
        rows = [line.strip() for line in top.splitlines() if "%" in line and not line.startswith("#")]
        print(f"  perf, node {node}'s daemon during the pass ({data}):")
        for line in rows[:25]:
            print(f"    {line}")


def one_repeat(args, work: str, root: str, manifest: str, total: int, files: int, r: int,
               reader_kind: str = "python", c_reader: tuple[str, str] | None = None) -> dict:
    base = os.path.join(work, f"r{r}-{reader_kind}")
    os.makedirs(base)
    cfg = write_config(base, root, total)
    env = bench_env(JOB)
    deadline = time.monotonic() + args.timeout
    serve = subprocess.Popen([mpiexec("bench_peer"), "-disable-auto-cleanup", "-n", str(NODES), sys.executable, "-m", "monarch",
                              "serve", "-c", cfg], env=env, start_new_session=True,
                             stdout=open(os.path.join(base, "serve.log"), "w"), stderr=subprocess.STDOUT)
    try:
        wait_staged(base, files, serve, deadline)
        procs = daemons(serve)
        idle0 = cpu_of(procs)
        time.sleep(1.0)
        idle = [b - a for a, b in zip(idle0, cpu_of(procs))]  # per second
        report = os.path.join(base, "run0.json")
        nodes = daemon_nodes(procs)
        perf = start_perf(args.perf, base, procs, nodes)
        before, threads_before = cpu_of(procs), threads_of(procs)
        t0 = time.monotonic()
        cmd = ([c_reader[0], c_reader[1], str(args.threads)] if reader_kind == "c" else
               [sys.executable, "-c", READER, root, manifest, str(args.threads)])
        reader = subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", report, "--", *cmd],
                                  env=bench_env(JOB, MONARCH_NODE=0), stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(base, "reader.log"), "w"), text=True)
        line = reader_result(reader, deadline)
        # the pass is over when the reader prints its figures: the daemons' CPU is read then,
        # before the launcher asks for the run's report (a fixed cost, not a remote open's)
        after, threads_after = cpu_of(procs), threads_of(procs)
        elapsed = time.monotonic() - t0
        stop_perf(perf)
        code = reader.wait(timeout=max(10.0, deadline - time.monotonic()))
        if code != 0 or line is None:
            with open(os.path.join(base, "reader.log")) as log:
                raise RuntimeError(f"the reader exited {code}:\n{log.read()[-2000:]}")
        result = json.loads(line)
        rep = json.load(open(report))
    finally:
        stop_daemons(serve)
    remote = remote_opens(rep)
    path = datapath_counts(rep)
    daemon_cpu = [b - a - i * result["seconds"] for a, b, i in zip(before, after, idle)]
    by_node = dict(zip(nodes, daemon_cpu)) if sorted(n for n in nodes if n is not None) == [0, 1] else {}
    threads = {node: by_thread(b, a, remote) for node, b, a in zip(nodes, threads_before, threads_after)}
    return {"reader": reader_kind, "pass_seconds": round(result["seconds"], 3), "launcher_seconds": round(elapsed, 3),
            "requester_cpu": round(by_node[0], 3) if by_node else None,
            "owner_cpu": round(by_node[1], 3) if by_node else None,
            "requester_threads": threads.get(0), "owner_threads": threads.get(1),
            "files": result["files"], "remote_opens": remote, "digests_ok": result["ok"],
            "remote_opens_per_s": round(remote / result["seconds"]) if result["seconds"] else None,
            "reader_cpu": round(result["cpu"], 3), "daemon_cpu": [round(c, 3) for c in daemon_cpu],
            "daemon_cpu_per_remote_open_us": round(1e6 * sum(daemon_cpu) / remote, 1) if remote else None,
            "files_per_request": round(path["fetched_files"] / path["requests"], 2) if path.get("requests") else None,
            "requester_sleeps_per_request": round(path["waits"] / path["requests"], 2) if path.get("requests") else None}


def print_ceiling(kind: str, runs: list[dict]) -> None:
    """The remote opens per second the measured CPU costs allow on this machine's cores, and
    which cost bounds it (medians over the repeats)."""
    cores = os.cpu_count() or 1
    remote = [r for r in runs if r["remote_opens"] and r["requester_cpu"] is not None]
    if not remote:
        print(f"{kind} reader: no remote opens measured by node; no ceiling")
        return
    costs = {"the reader (per file)": statistics.median(1e6 * r["reader_cpu"] / r["files"] for r in remote),
             "the requesting daemon (per remote open)": statistics.median(1e6 * r["requester_cpu"] / r["remote_opens"]
                                                                           for r in remote),
             "the owner's daemon (per remote open)": statistics.median(1e6 * r["owner_cpu"] / r["remote_opens"]
                                                                        for r in remote)}
    ceiling = cores * 1e6 / sum(costs.values())
    bound = max(costs, key=costs.get)
    rate = statistics.median(r["remote_opens_per_s"] for r in remote)
    print(f"{kind} reader: {rate:,.0f} remote opens/s measured; CPU "
          + ", ".join(f"{who} {us:.0f} us" for who, us in costs.items())
          + f" -> ceiling {ceiling:,.0f} remote opens/s on {cores} cores if every open were remote; "
            f"bound by {bound} ({costs[bound] / sum(costs.values()):.0%} of the CPU)")


def datapath_counts(report: dict) -> dict:
    """Node 0's C data path counts (its section of the run report), with ``waits`` counting the
    front door's waits for an answer too (its fetching workers wait on their own epoll)."""
    for node in report.get("nodes") or []:
        if node.get("node") == 0:
            counts = dict((node.get("peer") or {}).get("datapath") or {})
            counts["waits"] = counts.get("waits", 0) + (node.get("front_door") or {}).get("peer_waits", 0)
            return counts
    return {}


def remote_opens(report: dict) -> int:
    """Opens node 0 answered with a copy fetched from node 1 (the run report's peer figures)."""
    return int(((report.get("opened_from") or {}).get("peer") or {}).get("opens", 0))


def main(argv=None) -> int:
    args = parse_args(argv)
    fresh_bytecode()
    size = parse_size(args.file_size)
    work = tempfile.mkdtemp(prefix="benchpeer-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        root = os.path.join(work, "data")
        manifest = os.path.join(work, "manifest.json")
        make_dataset(root, args.files, size, spread=0.0, manifest=manifest)
        total = args.files * size
        print(f"bench_peer: {args.files} x {args.file_size}, {NODES} nodes, node 0 reads all with "
              f"{args.threads} threads (its half local, the other half from node 1)")
        kinds = [k.strip() for k in args.reader.split(",") if k.strip()]
        if not kinds or any(k not in ("python", "c") for k in kinds):
            raise SystemExit(f"bench_peer: --reader {args.reader!r}: python, c, or python,c")
        c_reader = (build_c_reader(work), write_crc_list(work, root, manifest)) if "c" in kinds else None
        results = []
        for r in range(args.repeats):
            for kind in kinds:
                res = one_repeat(args, work, root, manifest, total, args.files, r, kind, c_reader)
                results.append(res)
                print(f"  repeat {r + 1}, {kind} reader: {res['pass_seconds']:.3f} s for {res['files']} files, "
                      f"{res['remote_opens']} remote -> {res['remote_opens_per_s']} remote opens/s; "
                      f"CPU s: reader {res['reader_cpu']}, daemons {res['daemon_cpu']} "
                      f"= {res['daemon_cpu_per_remote_open_us']} us per remote open; files per request "
                      f"{res['files_per_request']}, sleeps per request {res['requester_sleeps_per_request']}; "
                      f"digests {'ok' if res['digests_ok'] else 'WRONG'}", flush=True)
                for side in ("requester", "owner"):
                    threads = res[f"{side}_threads"] or {}
                    print(f"    {side} by thread, us per remote open (times on a CPU): "
                          + ", ".join(f"{name} {us} ({runs})" for name, (us, runs) in threads.items()), flush=True)
        for kind in kinds:
            print_ceiling(kind, [r for r in results if r["reader"] == kind])
        write_json(args.json, {"args": vars(args), "results": results}, indent=1)
        return 0 if all(r["digests_ok"] for r in results) else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
