#!/usr/bin/env python3
"""A restart's load on one node, directly and from the node's kept copies, side by side.

The emulated PFS (``monarch.tools.slowpfs --writable``: FUSE, no page cache, reads and writes each
capped, 2 ms an open) receives a checkpoint in DCP's pattern saved by one ``monarch run`` with its
directory as a write-back path (4 shards of 64 MiB, each fsynced, then ``.metadata`` written as a
temporary and renamed), as a job saves it before it is requeued. Then the next job loads it (every
file read whole), in each mode, interleaved over the rounds:

  direct   the load run plainly: every byte from the PFS
  monarch  the same under ``monarch run`` with the same configuration: the files the save published
           are read from the node's kept copies while the PFS files are unchanged (docs/consistency.md,
           "Kept copies")

Per load it prints the wall time, the PFS bytes read (the emulator's own count) against the
checkpoint's bytes, and a check of every byte; then the medians and the ratios monarch/direct.

    python3 scripts/writeback/bench_restart.py                   # 4 x 64 MiB, PFS at 200 MB/s, 3 rounds
    python3 scripts/writeback/bench_restart.py --quick           # 4 x 4 MiB, 1 round
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
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402

from benchkit.options import parse_with_quick, result_path, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

SAVE = r"""
import os, sys
d, shards, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d, exist_ok=True)
for k in range(shards):  # DCP's FileSystemWriter: each shard under its name, fsynced
    with open(os.path.join(d, f"__{k}_0.distcp"), "wb") as f:
        block = bytes([k + 1]) * (1 << 20)
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
with open(os.path.join(d, ".metadata.tmp"), "wb") as f:
    f.write(b"metadata" * 512)
os.replace(os.path.join(d, ".metadata.tmp"), os.path.join(d, ".metadata"))
"""
LOAD = r"""
import hashlib, json, os, sys, time
d = sys.argv[1]
t0 = time.perf_counter()
out = {}
for name in sorted(os.listdir(d)):
    h = hashlib.sha256()
    with open(os.path.join(d, name), "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    out[name] = h.hexdigest()
print(json.dumps({"load_s": time.perf_counter() - t0, "digests": out}))
"""


def digests(d: Path) -> dict[str, str]:
    out = {}
    for p in sorted(d.iterdir()):
        out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--shard-mib", type=int, default=64)
    p.add_argument("--bandwidth", type=float, default=200, help="the PFS's read and write caps, MB/s (default 200)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=result_path("bench_restart.json"))
    args = parse_with_quick(p, argv, {"shard_mib": 4, "rounds": 1})
    if pfs_unavailable("bench_restart"):
        return 2
    work = Path(tempfile.mkdtemp(prefix="mbench-restart-"))
    tier = Path(f"/dev/shm{work}")
    try:
        (work / "src").mkdir()
        (work / "data").mkdir()
        (work / "data" / "x").write_bytes(b"x")
        tier.mkdir(parents=True)
        with SlowPFS(work / "src", work / "mnt", open_latency_ms=2, bandwidth_mbps=args.bandwidth, writable=True,
                     write_bandwidth_mbps=args.bandwidth) as pfs:
            mnt = Path(pfs.mountpoint)
            cfg = work / "monarch.yaml"
            cfg.write_text(f'dataset: {{roots: ["{work}/data"]}}\nrun_base: "{work}"\n'
                           f'tiers: [{{name: ram, path: "{tier}", capacity: {4 * args.shards * args.shard_mib}MiB}}]\n'
                           f'filesystem_reserve: 0\nwriteback: {{paths: ["{mnt}"]}}\n')
            monarch = [sys.executable, "-m", "monarch", "run", "-c", str(cfg), "--no-progress", "--"]
            ck = mnt / "ck"
            r = subprocess.run([*monarch, sys.executable, "-c", SAVE, str(ck), str(args.shards),
                                str(args.shard_mib << 20)], capture_output=True, text=True, env=checkout_env())
            if r.returncode != 0:
                print(f"bench_restart: the save failed:\n{r.stderr[-3000:]}")
                return 1
            expected = digests(work / "src" / "ck")
            total = sum(p.stat().st_size for p in (work / "src" / "ck").iterdir())
            runs: dict[str, list[dict]] = {"direct": [], "monarch": []}
            for _ in range(args.rounds):
                for mode in runs:
                    pfs.reset_counters()
                    t0 = time.perf_counter()
                    r = subprocess.run([*(monarch if mode == "monarch" else []), sys.executable, "-c", LOAD, str(ck)],
                                       capture_output=True, text=True, env=checkout_env())
                    wall = time.perf_counter() - t0
                    if r.returncode != 0:
                        print(f"bench_restart: the {mode} load failed:\n{r.stderr[-3000:]}")
                        return 1
                    got = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("{")))
                    runs[mode].append({"load_s": got["load_s"], "wall_s": wall, "pfs_bytes": pfs.counters()["bytes"],
                                       "ok": got["digests"] == expected})
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tier, ignore_errors=True)
    print(f"checkpoint: {args.shards} x {args.shard_mib} MiB + .metadata ({total / 2**20:.1f} MiB), saved under "
          f"write-back; the PFS at {args.bandwidth:g} MB/s; median of {args.rounds}")
    print(f"  {'mode':<9}{'load s':>9}{'wall s':>9}{'PFS read / checkpoint':>23}  bytes")
    med = {}
    for mode, rs in runs.items():
        med[mode] = {k: statistics.median(r[k] for r in rs) for k in ("load_s", "wall_s", "pfs_bytes")}
        ok = sum(r["ok"] for r in rs)
        print(f"  {mode:<9}{med[mode]['load_s']:>9.3f}{med[mode]['wall_s']:>9.2f}"
              f"{med[mode]['pfs_bytes'] / total:>22.3f}x  {ok}/{len(rs)} OK")
    d, m = med["direct"], med["monarch"]
    print(f"monarch / direct: load {m['load_s'] / d['load_s']:.3f}x, PFS read {m['pfs_bytes'] / total:.3f}x the "
          f"checkpoint (direct {d['pfs_bytes'] / total:.3f}x)")
    write_json(args.json, {"args": vars(args), "checkpoint_bytes": total, "runs": runs})
    return 0 if all(r["ok"] for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
