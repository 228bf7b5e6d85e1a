#!/usr/bin/env python3
"""A restart's load on N simulated nodes, directly and from the nodes' kept copies, side by side.

One job saves a checkpoint under ``monarch serve``'s write-back with the shipped configuration
(``fsync: auto``: each node's files copied to its partner, node k+1): DCP's pattern, each rank its
shard (``--shard-mib``, fsynced), a barrier, then rank 0 ``.metadata`` (a temporary renamed) and a
file every rank will load (``model.pt``, ``--every-mib``: a Trainer's or Lightning's weights). Then
each case loads it, in each mode, interleaved over the rounds, each load a new job (its daemons
started by mpiexec, as a requeued job's are):

  same       every rank reads ``.metadata`` and its own shard, the nodes as they were
  replaced   the same, node N-1's tier wiped first (a node replaced: its kept copies gone)
  every      every rank reads ``model.pt`` whole

  direct     the ranks run plainly: every byte from the PFS
  monarch    each rank under ``monarch run`` on its node (MONARCH_NODE=k): a file kept on its node
             read from there, one kept on another node fetched from it over the peer plane (the
             partner first), the PFS only for what no node keeps as the PFS has it now

Per load: the slowest rank's load time (each rank times its own reads), the whole job's wall time
(monarch: the daemons' start and stop included), the PFS bytes read (the emulator's own count)
against the files loaded, every byte checked against the saved file; then the medians and the
ratios monarch/direct. The emulated PFS: ``monarch.tools.slowpfs`` (FUSE, no page cache), reads
and writes each capped (``--bandwidth``, every reader together), 2 ms an open.

    python3 scripts/writeback/bench_restart_nodes.py           # 4 nodes, 4 x 64 MiB, 512 MiB, 3 rounds
    python3 scripts/writeback/bench_restart_nodes.py --quick   # 4 x 4 MiB, 16 MiB, 1 round
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

from benchkit.cluster import bench_env, bench_places, start_daemons, stop_daemons, wait_for  # noqa: E402
from benchkit.options import fresh_bytecode, parse_with_quick, result_path, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dcp_nodes import machine_facts  # noqa: E402

JOB = "benchrestartnodes"
CASES = ("same", "replaced", "every")
MODES = ("direct", "monarch")

SAVE = r"""
import os, sys, time
ck, barrier, rank, ranks, shard, every = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])

def write(path, size, fill):
    with open(path, "wb") as f:
        block = bytes([fill]) * (1 << 20)
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())

write(os.path.join(ck, f"__{rank}_0.distcp"), shard, rank + 1)  # DCP: each shard under its name, fsynced
open(os.path.join(barrier, str(rank)), "w").close()
while len(os.listdir(barrier)) < ranks:
    time.sleep(0.01)
if rank == 0:
    write(os.path.join(ck, "model.pt"), every, 0xEE)
    with open(os.path.join(ck, ".metadata.tmp"), "wb") as f:
        f.write(b"metadata" * 512)
    os.replace(os.path.join(ck, ".metadata.tmp"), os.path.join(ck, ".metadata"))
"""

LOAD = r"""
import hashlib, json, os, sys, time
ck, rank, case = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = ["model.pt"] if case == "every" else [".metadata", f"__{rank}_0.distcp"]
t0 = time.perf_counter()
digests = {}
for name in names:
    h = hashlib.sha256()
    with open(os.path.join(ck, name), "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    digests[name] = h.hexdigest()
print(json.dumps({"load_s": time.perf_counter() - t0, "digests": digests}))
"""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4, help="simulated nodes, one rank each (default 4)")
    p.add_argument("--shard-mib", type=int, default=64, help="MiB a shard (default 64)")
    p.add_argument("--every-mib", type=int, default=512, help="MiB of the file every rank loads (default 512)")
    p.add_argument("--bandwidth", type=float, default=200.0, metavar="MBps",
                   help="the emulated PFS's read cap and write cap, every client together (default 200 MB/s)")
    p.add_argument("--open-latency-ms", type=float, default=2.0, help="the emulated PFS's ms per open (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="loads of each case in each mode (default 3)")
    p.add_argument("--cases", default=",".join(CASES), help=f"a subset of {','.join(CASES)}")
    p.add_argument("--timeout", type=float, default=600, help="seconds allowed to each job")
    p.add_argument("--json", default=result_path("bench_restart_nodes.json"))
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, reports)")
    args = parse_with_quick(p, argv, {"shard_mib": 4, "every_mib": 16, "rounds": 1})
    args.cases = [c for c in CASES if c in {x.strip() for x in args.cases.split(",")}]
    if not args.cases or args.nodes < 2 or min(args.shard_mib, args.every_mib, args.rounds) < 1:
        p.error("--cases: some of same,replaced,every; --nodes at least 2; sizes and --rounds at least 1")
    # each node keeps its shard, its partner's and model.pt: its write-back room (half its tier) holds them
    args.tier_mib = 2 * (2 * args.shard_mib + args.every_mib) + 256
    return args


class Bench:
    def __init__(self, args, pfs: SlowPFS, src: Path, shm: Path, work: Path):
        self.args, self.pfs, self.src, self.shm, self.work = args, pfs, src, shm, work
        self.ck = Path(pfs.mountpoint) / "ck"
        self.cfg = work / "monarch.yaml"
        self.cfg.write_text(f"""# written by scripts/writeback/bench_restart_nodes.py: the shipped configuration but its places
dataset: {{roots: ["{pfs.mountpoint}/data"]}}
run_base: "{work}/run${{MONARCH_NODE}}"
tiers:
  - {{name: ram, path: "{shm}/ram${{MONARCH_NODE}}", capacity: {args.tier_mib}MiB}}
peer: {{path: "{shm}/peer${{MONARCH_NODE}}", capacity: 64MiB}}
staging: {{share: false}}
writeback: {{paths: ["{self.ck}"]}}
""")
        for k in range(args.nodes):
            for d in (work / f"run{k}", self.tier(k), shm / f"peer{k}"):
                d.mkdir(exist_ok=True)
        self.jobs = 0

    def tier(self, k: int) -> Path:
        return self.shm / f"ram{k}"

    def job(self, cmd_of, monarch: bool) -> tuple[float, list[dict]]:
        """One job: ``cmd_of(k)`` on every node at once (under `monarch serve`'s daemons, new ones, when
        ``monarch``); its wall time and each rank's JSON line."""
        self.jobs += 1
        job = f"{JOB}{self.jobs}"
        deadline = time.monotonic() + self.args.timeout
        t0 = time.monotonic()
        serve = launch = None
        if monarch:
            serve, launch, _ = start_daemons(str(self.cfg), self.work, self.args.nodes, job, deadline,
                                             self.work / f"serve{self.jobs}.log")
        try:
            procs = []
            for k in range(self.args.nodes):
                cmd, env = cmd_of(k), bench_env(job, MONARCH_NODE=k)
                if monarch:
                    cmd = [sys.executable, "-m", "monarch", "run", "-c", str(self.cfg), "--no-progress", "--report",
                           str(self.work / f"job{self.jobs}-{k}.json"), "--", *cmd]
                else:
                    env["MONARCH_DISABLE"] = "1"
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              start_new_session=True, cwd=self.work))
            done = wait_for(procs, deadline)
        finally:
            if serve is not None:
                stop_daemons(serve)
                launch.close()
        wall = time.monotonic() - t0
        out = []
        for k, (code, stdout, stderr) in enumerate(done):
            lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
            if code != 0:
                raise RuntimeError(f"node {k}: exit code {code}:\n" + "\n".join(stderr.splitlines()[-15:]))
            out.append(json.loads(lines[-1]) if lines else {})
        return wall, out

    def save(self) -> None:
        barrier = self.work / "barrier"
        barrier.mkdir()
        self.ck.mkdir()
        a = self.args
        self.job(lambda k: [sys.executable, "-c", SAVE, str(self.ck), str(barrier), str(k), str(a.nodes),
                            str(a.shard_mib << 20), str(a.every_mib << 20)], monarch=True)

    def load(self, case: str, mode: str, expected: dict[str, str]) -> dict:
        if mode == "monarch" and case == "replaced":  # the new node's tier: there, empty
            last = self.tier(self.args.nodes - 1)
            shutil.rmtree(last)
            last.mkdir()
        self.pfs.reset_counters()
        wall, ranks = self.job(lambda k: [sys.executable, "-c", LOAD, str(self.ck), str(k), case], mode == "monarch")
        ok = all(rank["digests"] == {n: expected[n] for n in rank["digests"]} and rank["digests"] for rank in ranks)
        return {"load_s": max(r["load_s"] for r in ranks), "wall_s": wall, "pfs_bytes": self.pfs.counters()["bytes"],
                "ok": ok, "sources": self.sources() if mode == "monarch" else None}

    def sources(self) -> dict:
        """The restart's reads by source over the nodes, as the job's reports say them."""
        out: dict = {}
        for k in range(self.args.nodes):
            path = self.work / f"job{self.jobs}-{k}.json"
            wb = (json.loads(path.read_text()).get("writeback") or {}) if path.exists() else {}
            for key, v in wb.items():
                if key.startswith("restart_"):
                    out[key] = out.get(key, 0) + v
        return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def loaded_bytes(case: str, args, sizes: dict[str, int]) -> int:
    """The bytes every rank's load reads together, the files the PFS gives direct (each rank's)."""
    if case == "every":
        return sizes["model.pt"]
    return sum(sizes[n] for n in sizes if n.startswith("__")) + sizes[".metadata"]


def main(argv=None) -> int:
    args = parse_args(argv)
    print(machine_facts(), flush=True)
    fresh_bytecode()
    if pfs_unavailable("bench_restart_nodes"):
        return 2
    work, shm, src = bench_places("mbrn-")
    runs: dict = {case: {mode: [] for mode in MODES} for case in args.cases}
    try:
        with SlowPFS(src, work / "pfs", work / "pfs-counters.json", open_latency_ms=args.open_latency_ms,
                     bandwidth_mbps=args.bandwidth, writable=True, write_bandwidth_mbps=args.bandwidth) as pfs:
            bench = Bench(args, pfs, src, shm, work)
            bench.save()
            saved = src / "ck"
            sizes = {p.name: p.stat().st_size for p in saved.iterdir()}
            expected = {p.name: sha256_of(p) for p in saved.iterdir()}
            print(f"saved under write-back on {args.nodes} nodes: {', '.join(f'{n} {s / 2**20:.1f} MiB' for n, s in sorted(sizes.items()))}; "
                  f"the PFS at {args.bandwidth:g} MB/s read and write, {args.open_latency_ms:g} ms an open", flush=True)
            for _ in range(args.rounds):
                for case in args.cases:
                    for mode in MODES:
                        r = bench.load(case, mode, expected)
                        runs[case][mode].append(r)
                        print(f"  {case:<9}{mode:<8} load {r['load_s']:.3f} s, job {r['wall_s']:.2f} s, PFS "
                              f"{r['pfs_bytes'] / loaded_bytes(case, args, sizes):.3f}x, bytes "
                              f"{'OK' if r['ok'] else 'WRONG'}" + (f", sources {r['sources']}" if r["sources"] else ""),
                              flush=True)
    except RuntimeError as e:
        print(f"bench_restart_nodes: {e}")
        return 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    print(f"\nrestart on {args.nodes} nodes, median of {args.rounds}:")
    print(f"  {'case':<10}{'mode':<9}{'load s':>9}{'job s':>8}{'PFS read / loaded':>19}  bytes")
    summary = {}
    for case, modes in runs.items():
        med = {m: {k: statistics.median(r[k] for r in rs) for k in ("load_s", "wall_s", "pfs_bytes")}
               for m, rs in modes.items()}
        total = loaded_bytes(case, args, sizes)
        for mode, m in med.items():
            ok = sum(r["ok"] for r in modes[mode])
            print(f"  {case:<10}{mode:<9}{m['load_s']:>9.3f}{m['wall_s']:>8.2f}{m['pfs_bytes'] / total:>18.3f}x  "
                  f"{ok}/{len(modes[mode])} OK")
        summary[case] = {"load_ratio": med["monarch"]["load_s"] / med["direct"]["load_s"],
                         "pfs_ratio": med["monarch"]["pfs_bytes"] / total}
    print("monarch / direct: " + "; ".join(f"{case} load {s['load_ratio']:.3f}x, PFS {s['pfs_ratio']:.3f}x"
                                           for case, s in summary.items()))
    write_json(args.json, {"args": vars(args), "sizes": sizes, "runs": runs, "summary": summary})
    return 0 if all(r["ok"] for modes in runs.values() for rs in modes.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
