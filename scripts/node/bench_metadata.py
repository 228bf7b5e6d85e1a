#!/usr/bin/env python3
"""Metadata benchmark: an ImageFolder-like start-up and epochs that stat before they read,
direct from the emulated PFS and under ``monarch run``, with the PFS's own count of its
metadata operations (getattr, readdir, access: ``slowpfs`` counts every one and makes each
cost ``--lookup-latency-ms``).

  start-up  list the class directories, list each one, stat every file (what
            torchvision's ImageFolder / DatasetFolder does)
  epochs    shuffled; per sample os.path.getsize, then open and read it

Modes: ``direct`` (plain Python on the mount), ``monarch`` (first job: the daemon walks the
tree once), ``monarch-again`` (a second job of the same dataset, its tier kept: the kept snapshot is reused
after one stat per directory). Two references: the application's own tree walk (the
``direct`` start-up: what the issue calls one tree walk) and Monarch's leaner walk
(monarch.node.snapshot.snapshot's, measured on its own: one stat per entry relative to its directory).

    python scripts/node/bench_metadata.py                  # 20 classes x 100 files, 3 epochs
    python scripts/node/bench_metadata.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)
from benchkit.options import write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402

from monarch.tools.slowpfs import METADATA_KEYS, SlowPFS  # noqa: E402

WORKLOAD = r'''
import json, os, random, sys, time
root, counters, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
def meta_ops():
    time.sleep(0.05)  # the emulator flushes its counters every 10 ms
    with open(counters) as f:
        c = json.load(f)
    return sum(c.get(k, 0) for k in %(keys)r)
out = {"ops_at_start": meta_ops()}
t0 = time.perf_counter()
classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
samples = []
for c in classes:
    for e in sorted(os.scandir(os.path.join(root, c)), key=lambda e: e.name):
        if e.is_file() and os.stat(e.path).st_size >= 0:
            samples.append(e.path)
out["startup_s"] = time.perf_counter() - t0
out["startup_ops"] = meta_ops() - out["ops_at_start"]
out["samples"] = len(samples)
rng = random.Random(0)
out["epochs"] = []
for epoch in range(epochs):
    rng.shuffle(samples)
    before = meta_ops()
    t0 = time.perf_counter()
    total = 0
    for p in samples:
        n = os.path.getsize(p)
        with open(p, "rb") as f:
            total += len(f.read()) - n
    assert total == 0
    out["epochs"].append({"seconds": time.perf_counter() - t0, "ops": meta_ops() - before})
print("RESULT " + json.dumps(out))
''' % {"keys": METADATA_KEYS}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--size", type=int, default=2048, help="bytes per file")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lookup-latency-ms", type=float, default=2.0, help="per metadata operation (default 2)")
    p.add_argument("--open-latency-ms", type=float, default=2.0, help="per open (default 2)")
    p.add_argument("--quick", action="store_true", help="5 classes x 40 files")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if args.quick:
        args.classes, args.per_class = 5, 40
    return args


def make_tree(src: Path, args) -> None:
    for c in range(args.classes):
        d = src / "train" / f"n{c:08d}"
        d.mkdir(parents=True)
        for i in range(args.per_class):
            (d / f"img_{i:05d}.JPEG").write_bytes(os.urandom(args.size))


def ops(pfs: SlowPFS) -> int:
    c = pfs.raw_counters()
    return sum(c.get(k, 0) for k in METADATA_KEYS)


def env() -> dict[str, str]:
    return checkout_env({k: v for k, v in os.environ.items() if not k.startswith("MONARCH_") and k != "LD_PRELOAD"})


def run(cmd: list[str], pfs: SlowPFS, report: Path | None = None) -> dict:
    """One job's figures; with ``report`` (under ``monarch run``), fails unless Monarch was
    active: it fails open, so a refused config would measure the PFS direct as Monarch."""
    if report is not None:
        report.unlink(missing_ok=True)
    before = ops(pfs)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if report is not None and not report.exists():
        raise SystemExit(f"{cmd} wrote no report at {report}: Monarch was not active; its stderr:\n"
                         f"{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    out["before_app_ops"] = out.pop("ops_at_start") - before  # the daemon's walk (or its check of a kept one)
    out["total_ops"] = ops(pfs) - before
    out["wall_s"] = wall
    report = [x for x in proc.stdout.splitlines() + proc.stderr.splitlines() if x.startswith("metadata")]
    out["monarch_report"] = report[0] if report else ""
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if pfs_unavailable("bench_metadata"):
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-meta-") as tmp, \
            tempfile.TemporaryDirectory(prefix="bench-meta-", dir="/dev/shm") as shm:
        work = Path(tmp)
        src = work / "src"
        make_tree(src, args)
        nfiles = args.classes * args.per_class
        with SlowPFS(src, work / "pfs", work / "pfs.json", open_latency_ms=args.open_latency_ms,
                     lookup_latency_ms=args.lookup_latency_ms) as pfs:
            root = os.path.join(pfs.mountpoint, "train")
            script = work / "workload.py"
            script.write_text(WORKLOAD)
            before = ops(pfs)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import sys; from monarch.node.snapshot.snapshot import take_snapshot; "
                            "print(len(take_snapshot((sys.argv[1],)).files))", root], env=env(), check=True,
                           capture_output=True, timeout=1800)
            walk = {"seconds": time.perf_counter() - t0, "ops": ops(pfs) - before}
            config = work / "monarch.yaml"
            config.write_text(json.dumps({
                "dataset": {"roots": [root]}, "run_base": str(work / "run"),
                # keep: the snapshot is saved for the next job only beside kept copies,
                # and "monarch-again" measures that second job (the temporary base goes at the end)
                "tiers": [{"name": "ram", "path": f"{shm}/ram", "capacity": "4GiB", "keep": True}],
                "staging": {"policy": "on-access"}}))
            for base in (work / "run", Path(shm, "ram")):  # Monarch uses bases that exist, never makes them
                base.mkdir()
            app = [sys.executable, str(script), root, pfs.counters_path, str(args.epochs)]
            report = work / "report.json"
            monarch = [sys.executable, "-m", "monarch", "run", "-c", str(config), "--report", str(report), "--"]
            results = {"direct": run(app, pfs), "monarch": run(monarch + app, pfs, report),
                       "monarch-again": run(monarch + app, pfs, report)}
    print_table(results, walk, nfiles, args)
    write_json(args.json, {"walk": walk, "results": results, "args": vars(args)}, indent=2)
    return 0


def print_table(results: dict, walk: dict, nfiles: int, args) -> None:
    print(f"\n{args.classes} classes x {args.per_class} files of {args.size} B; {args.lookup_latency_ms:g} ms per "
          f"metadata operation, {args.open_latency_ms:g} ms per open; {args.epochs} epochs")
    print(f"one tree walk: the application's (direct start-up) {results['direct']['startup_ops']}, "
          f"monarch.node.snapshot.snapshot's {walk['ops']} PFS metadata operations ({walk['seconds']:.2f} s)\n")
    head = f"{'mode':<14}{'start-up s':>11}" + "".join(f"{f'epoch {i + 1} s':>10}" for i in range(args.epochs))
    head += f"{'PFS meta ops: before app':>26}{'start-up':>10}{'epochs':>9}{'total':>8}{'x app walk':>11}"
    head += f"{'x monarch walk':>15}"
    app_walk = results["direct"]["startup_ops"]
    print(head)
    for mode, r in results.items():
        epochs = sum(e["ops"] for e in r["epochs"])
        row = f"{mode:<14}{r['startup_s']:>11.3f}" + "".join(f"{e['seconds']:>10.2f}" for e in r["epochs"])
        row += f"{r['before_app_ops']:>26}{r['startup_ops']:>10}{epochs:>9}{r['total_ops']:>8}"
        row += f"{r['total_ops'] / app_walk:>11.2f}{r['total_ops'] / walk['ops']:>15.2f}"
        print(row)
    d, m = results["direct"], results["monarch"]
    print(f"\nstart-up: monarch {d['startup_s'] / m['startup_s']:.1f}x faster than direct "
          f"(second job {d['startup_s'] / results['monarch-again']['startup_s']:.1f}x)")
    for mode in ("monarch", "monarch-again"):
        if results[mode]["monarch_report"]:
            print(f"{mode} report: {results[mode]['monarch_report']}")


if __name__ == "__main__":
    sys.exit(main())
