#!/usr/bin/env python3
"""What the watch on raw system calls costs a training job's own compute, side by side.

A CPU training loop (training_loop_app.py: an MLP, torch's OpenMP intra-op threads, a DataLoader
with 2 worker processes, ``torch.save`` + ``os.replace`` every 100 steps) runs directly and under
``monarch run`` with its checkpoint directory as a write-back path (raw system calls watched: every
system call a thread makes outside libc is a SIGSYS the shim answers, unless the thread is paused in
a compute runtime), the modes interleaved, for each count of intra-op threads. Per run it takes the
loop's own seconds, the whole command's wall time and CPU-seconds (the kernel's account of the
reaped process tree), and the SIGSYS signals delivered to the whole job (``perf stat`` of
``signal:signal_deliver`` for signal 31, where perf can count it); under Monarch also the report's
raw calls and pauses. It prints the medians, the ratios to direct and the signals per step.

    python3 scripts/writeback/bench_training_loop.py                 # 2 and 4 threads, 2,000 steps, 5 rounds
    python3 scripts/writeback/bench_training_loop.py --threads 2 --rounds 3
    python3 scripts/writeback/bench_training_loop.py --quick         # a smoke run: 200 steps, 1 round
"""

from __future__ import annotations

import argparse
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
from benchkit import REPO, checkout_env  # noqa: E402

from benchkit.cpuwatch import children_cpu  # noqa: E402
from benchkit.options import parse_with_quick, result_path, write_json  # noqa: E402

APP = Path(__file__).resolve().parent / "training_loop_app.py"
SIGSYS = 31


def perf_counts_signals() -> bool:
    """Can ``perf stat`` count the signals delivered to a job here (perf installed, the tracepoint allowed)?"""
    if not shutil.which("perf"):
        return False
    r = subprocess.run(["perf", "stat", "-x,", "-e", "signal:signal_deliver", "--", "true"], capture_output=True,
                       text=True)
    return r.returncode == 0 and "not supported" not in r.stderr and "<not" not in r.stderr


def one_run(mode: str, threads: int, args, work: Path, perf: bool) -> dict:
    out = work / f"ck-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    app = [sys.executable, str(APP), str(threads), str(args.steps), str(args.every), str(out)]
    report = work / "report.json"
    if mode == "writeback":
        cfg = work / "monarch.yaml"
        cfg.write_text(f'dataset: {{roots: ["{work}/data"]}}\nrun_base: "{work}"\n'
                       f'tiers: [{{name: ram, path: "/dev/shm{work}", capacity: 1GiB}}]\nfilesystem_reserve: 0\n'
                       f'writeback: {{paths: ["{out}"]}}\n')
        app = [sys.executable, "-m", "monarch", "run", "-c", str(cfg), "--report", str(report), "--no-progress",
               "--", *app]
    counts = work / "perf.txt"
    cmd = ["perf", "stat", "-x,", "-o", str(counts), "-e", "signal:signal_deliver", "--filter",
           f"sig == {SIGSYS}", "--", *app] if perf else app
    cpu0, t0 = children_cpu(), time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=checkout_env(), timeout=1800)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if r.returncode != 0:
        raise SystemExit(f"bench_training_loop: {mode} with {threads} threads failed (exit {r.returncode}):\n"
                         f"{r.stderr[-3000:]}")
    loop = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("{")))
    saved = sorted(p.name for p in out.iterdir())
    if len(saved) != args.steps // args.every or any(n.endswith(".tmp") for n in saved):
        raise SystemExit(f"bench_training_loop: {mode}: the checkpoints on disk are {saved}")
    row = {"loop_s": loop["loop_s"], "save_s": loop["save_s"], "wall_s": wall, "cpu_s": cpu, "sigsys": None}
    if perf:
        line = next((ln for ln in counts.read_text().splitlines() if "signal_deliver" in ln), "")
        row["sigsys"] = int(line.split(",")[0]) if line.split(",")[0].isdigit() else None
    if mode == "writeback":
        doc = json.loads(report.read_text())
        wb = doc.get("writeback") or {}
        if wb.get("files_published") != args.steps // args.every:
            raise SystemExit(f"bench_training_loop: the saves did not go through write-back: {wb}\n{r.stderr[-2000:]}")
        raw = doc.get("raw_calls") or {}
        row |= {"raw_answered": raw.get("answered", 0), "raw_futex": (raw.get("by_call") or {}).get("futex", 0),
                "paused": raw.get("paused", 0)}
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="2,4", help="intra-op thread counts, comma-separated (default 2,4)")
    p.add_argument("--steps", type=int, default=2000, help="training steps a run (default 2,000)")
    p.add_argument("--every", type=int, default=100, help="steps between saves (default 100)")
    p.add_argument("--rounds", type=int, default=5, help="runs of each mode, interleaved (default 5)")
    p.add_argument("--json", default=result_path("bench_training_loop.json"), help="where the figures go")
    args = parse_with_quick(p, argv, {"steps": 200, "rounds": 1, "threads": "2"})
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_training_loop: torch is not installed (scripts/install.sh installs its CPU build)")
        return 2
    perf = perf_counts_signals()
    if not perf:
        print("bench_training_loop: perf cannot count signals here: the SIGSYS column is the report's raw calls")
    work = Path(tempfile.mkdtemp(prefix="mbench-loop-"))
    (work / "data").mkdir()
    (work / "data" / "x").write_bytes(b"x")
    os.makedirs(f"/dev/shm{work}")  # the write-back tier's base
    results: dict[str, dict] = {}
    try:
        for threads in [int(t) for t in args.threads.split(",")]:
            runs: dict[str, list[dict]] = {"direct": [], "writeback": []}
            for _ in range(args.rounds):
                for mode in runs:
                    runs[mode].append(one_run(mode, threads, args, work, perf))
            results[str(threads)] = runs
            print_table(threads, runs, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{work}", ignore_errors=True)
    write_json(args.json, {"args": vars(args), "runs": results})
    return 0


def print_table(threads: int, runs: dict[str, list[dict]], args) -> None:
    med = {m: {k: statistics.median(r[k] for r in rs) if all(r.get(k) is not None for r in rs) else None
               for k in rs[0]} for m, rs in runs.items()}
    d = med["direct"]
    print(f"\n{threads} intra-op threads, {args.steps:,} steps, a save every {args.every}; median of {args.rounds} "
          f"(interleaved)")
    print(f"  {'mode':<10}{'loop s':>9}{'x direct':>10}{'wall s':>9}{'CPU-s':>8}{'x direct':>10}{'SIGSYS':>9}"
          f"{'/ step':>8}{'raw answered':>14}{'futex':>7}{'paused':>8}")
    for mode, m in med.items():
        sig = m["sigsys"] if m["sigsys"] is not None else m.get("raw_answered")
        print(f"  {mode:<10}{m['loop_s']:>9.2f}{m['loop_s'] / d['loop_s']:>10.3f}{m['wall_s']:>9.2f}"
              f"{m['cpu_s']:>8.2f}{m['cpu_s'] / d['cpu_s']:>10.3f}"
              f"{sig if sig is not None else '-':>9}{(sig / args.steps) if sig is not None else 0:>8.2f}"
              f"{m.get('raw_answered', '-'):>14}{m.get('raw_futex', '-'):>7}{m.get('paused', '-'):>8}")
    print(f"  every run's loop s: " + "; ".join(f"{mode} " + ", ".join(f"{r['loop_s']:.2f}" for r in rs)
                                                for mode, rs in runs.items()))


if __name__ == "__main__":
    sys.exit(main())
