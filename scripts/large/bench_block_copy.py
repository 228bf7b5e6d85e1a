#!/usr/bin/env python3
"""Block-copy benchmark: how fast a large file is staged by blocks, alone or beside a reader, and what it costs.

One file behind the emulated PFS (FUSE, page-cached, 2 ms per open, a bandwidth cap) under
``monarch run`` with a RAM tier that holds it. The command is either a waiter (the copy alone)
or a nanoGPT-style reader (a new mmap each step, 32 windows of 2 KiB at random, each checked
against the source) that steps until the copy is whole. It prints the copy's time (until the
published whole copy appears), the reader's steps meanwhile and its first step, and the
CPU-seconds of the job (the daemon and the command) and of the emulated PFS, whose work per
request is part of every request's cost on this machine (docs/large-files.md, "How much the
read-ahead asks for at once").

    python3 scripts/large/bench_block_copy.py                      # 2 GiB at 400 MB/s, alone and beside a reader
    python3 scripts/large/bench_block_copy.py --bandwidth 50 --size-gib 0.5
    python3 scripts/large/bench_block_copy.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)

import psutil  # noqa: E402

from benchkit.options import parse_with_quick  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from benchkit.cpuwatch import children_cpu  # noqa: E402
from monarch.node.stage.read_pace import describe  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

COMMAND = r"""
import glob, hashlib, json, mmap, os, random, sys, time
path, tier, reader, digests = sys.argv[1], sys.argv[2], sys.argv[3] == "reader", json.load(open(sys.argv[4]))
rng = random.Random(1)
t0 = time.monotonic()
first, steps, bad = None, 0, 0
def whole():
    return [p for p in glob.glob(tier + "/**/" + os.path.basename(path), recursive=True) if "/.blocks/" not in p]
while not whole():
    if time.monotonic() - t0 > 900:
        sys.exit("the copy was not whole after 900 s")
    if not reader:
        time.sleep(0.02)
        continue
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    for _ in range(32):
        block = rng.randrange(len(digests))
        within = rng.choice(list(digests[block]))  # a window whose md5 is known
        o = block * (1 << 20) + int(within)
        bad += hashlib.md5(m[o:o + 2048]).hexdigest() != digests[block][within]
    m.close()
    os.close(fd)
    steps += 1
    first = time.monotonic() - t0 if first is None else first
print(json.dumps({"copy": time.monotonic() - t0, "steps": steps, "first": first, "bad": bad}))
"""


def make_file(path: Path, size: int, samples: int = 64) -> list[dict[int, str]]:
    """The source, and per 1 MiB block the md5 of ``samples`` 2 KiB windows (the reader draws
    its windows among them: every window it reads is checked)."""
    import hashlib
    import random
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    digests = []
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            block = os.urandom(1 << 20)
            f.write(block)
            digests.append({o: hashlib.md5(block[o:o + 2048]).hexdigest()
                            for o in (rng.randrange(0, (1 << 20) - 2048) for _ in range(samples))})
    return digests


def pace_text(run_base: Path) -> str:
    """The read-ahead's pace as the newest run's report gave it: the rate and round trip it
    measured, its requests' size x the blocks read at once (the most at once)."""
    reports = sorted(run_base.glob("**/report.json"), key=lambda r: r.stat().st_mtime)
    try:
        return describe(json.loads(reports[-1].read_text())["nodes"][0]["staging"]["blocks"]["pace"])
    except (IndexError, KeyError, TypeError, ValueError, OSError):
        return "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=float, default=2.0)
    p.add_argument("--bandwidth", type=float, default=400.0, help="the PFS's MB/s (default 400)")
    p.add_argument("--read-latency-ms", type=float, default=0.0, help="the PFS's latency per read call (default 0)")
    p.add_argument("--modes", default="alone,reader", help="the copy alone, beside a reader")
    args = parse_with_quick(p, argv, {"size_gib": 1 / 8, "bandwidth": 50})  # a copy of 2.7 s: the reader steps beside it
    if pfs_unavailable("bench_block_copy"):
        return 2
    size = int(args.size_gib * (1 << 30)) >> 20 << 20
    print(f"{size >> 20} MiB at {args.bandwidth:g} MB/s, {args.read_latency_ms:g} ms per read call, a RAM tier that holds it")
    print(f"  {'mode':<8}{'copy':>8}{'MB/s':>8}{'steps':>7}{'first step':>12}{'job CPU':>9}{'PFS CPU':>9}{'PFS':>7}  windows  pace at the end")
    with tempfile.TemporaryDirectory(prefix="bench-block-copy-") as tmp, \
            tempfile.TemporaryDirectory(prefix="bench-block-copy-", dir="/dev/shm") as shm:
        work = Path(tmp)
        src = work / "src" / "data" / "big.bin"
        (work / "run").mkdir()
        samples = work / "digests.json"
        samples.write_text(json.dumps(make_file(src, size)))  # per block: {offset: md5 of its window}
        command = work / "command.py"
        command.write_text(COMMAND)
        with SlowPFS(src.parent.parent, work / "pfs", work / "pfs.json", open_latency_ms=2,
                     read_latency_ms=args.read_latency_ms, bandwidth_mbps=args.bandwidth, page_cache=True) as pfs:
            server = [pr for pr in psutil.process_iter(["cmdline"])
                      if str(work / "pfs") in " ".join(pr.info["cmdline"] or []) and pr.pid != os.getpid()]
            path = os.path.join(pfs.mountpoint, "data", "big.bin")
            for i, mode in enumerate(args.modes.split(",")):
                tier = Path(shm) / f"ram-{i}-{mode}"  # a RAM tier: tmpfs
                tier.mkdir()
                config = work / f"{i}-{mode}.yaml"
                config.write_text(json.dumps({"dataset": {"roots": [os.path.dirname(path)]}, "run_base": str(work / "run"),
                                              "tiers": [{"name": "ram", "path": str(tier), "capacity": size + (64 << 20)}]}))
                pfs.reset_counters()
                pfs_cpu0 = sum(sum(pr.cpu_times()[:2]) for pr in server)
                cpu0 = children_cpu()
                proc = subprocess.run(
                    [sys.executable, "-m", "monarch", "run", "-c", str(config), "--no-progress", "--",
                     sys.executable, str(command), path, str(tier), mode, str(samples)],
                    capture_output=True, text=True, timeout=1200,
                    env=checkout_env(MONARCH_JOB_ID=f"block-copy-{i}-{mode}-{os.getpid()}"))
                if proc.returncode != 0:
                    raise SystemExit(f"the {mode} run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
                out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
                job_cpu = children_cpu() - cpu0
                pfs_cpu = sum(sum(pr.cpu_times()[:2]) for pr in server) - pfs_cpu0
                first = f"{out['first']:.3f}s" if out["first"] is not None else "-"
                windows = "-" if mode == "alone" else ("OK" if out["bad"] == 0 else f"{out['bad']} WRONG")
                print(f"  {mode:<8}{out['copy']:>7.2f}s{size / out['copy'] / 1e6:>8.0f}{out['steps']:>7}{first:>12}"
                      f"{job_cpu:>8.1f}s{pfs_cpu:>8.1f}s{pfs.counters()['bytes'] / size:>6.2f}x  {windows:<7}  "
                      f"{pace_text(work / 'run')}")
                shutil.rmtree(tier, ignore_errors=True)
                if out["bad"]:
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
