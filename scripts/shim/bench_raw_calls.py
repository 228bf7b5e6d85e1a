#!/usr/bin/env python3
"""What a system call made without libc costs under the shim's syscall user dispatch, side by side.

A C program times N calls of ``getppid`` made by a raw ``syscall`` instruction (as Rust's rustix
and Go make theirs) and N made through libc, directly and under ``monarch run`` with a write-back
path (the dispatch on: every raw call is a SIGSYS the shim answers; libc's go to the kernel at
once). It prints ns per call for each, and the ratios. docs/consistency.md, "Calls Monarch cannot see".

    python3 scripts/shim/bench_raw_calls.py            # 200,000 calls of each, 5 runs
    python3 scripts/shim/bench_raw_calls.py --calls 50000 --runs 3
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static long raw_getppid(void)
{
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"((long)SYS_getppid) : "rcx", "r11", "memory");
    return r;
}
static double ns(struct timespec a, struct timespec b, long n)
{
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}
int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 200000, s = 0;
    struct timespec a, b, c;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        s += raw_getppid();
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (long i = 0; i < n; i++)
        s += getppid();
    clock_gettime(CLOCK_MONOTONIC, &c);
    printf("{\"raw_ns\": %.1f, \"libc_ns\": %.1f, \"ok\": %d}\n", ns(a, b, n), ns(b, c, n), s > 0);
    return 0;
}
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200_000, help="calls of each kind per run (default 200,000)")
    p.add_argument("--runs", type=int, default=5, help="runs of each mode (default 5; the median is printed)")
    args = p.parse_args(argv)
    if os.uname().machine != "x86_64":
        print("bench_raw_calls: syscall user dispatch is x86_64's: nothing to measure here")
        return 2
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        print("bench_raw_calls: no C compiler (cc)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="mbench-raw-"))
    try:
        (work / "raw.c").write_text(PROGRAM)
        exe = work / "raw"
        subprocess.run([cc, "-O2", "-o", str(exe), str(work / "raw.c")], check=True)
        (work / "data").mkdir()
        (work / "data" / "x").write_bytes(b"x")
        (work / "ck").mkdir()
        cfg = work / "monarch.yaml"
        cfg.write_text(f'dataset: {{roots: ["{work}/data"]}}\nrun_base: "{work}"\n'
                       f'tiers: [{{name: ram, path: "{work}", capacity: 64MiB}}]\n'
                       f'writeback: {{paths: ["{work}/ck"]}}\n')
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        modes = {"direct": [str(exe), str(args.calls)],
                 "monarch": [sys.executable, "-m", "monarch", "run", "-c", str(cfg), "--no-progress", "--",
                             str(exe), str(args.calls)]}
        figures: dict[str, dict[str, list[float]]] = {m: {"raw_ns": [], "libc_ns": []} for m in modes}
        for _ in range(args.runs):
            for mode, cmd in modes.items():
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
                line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
                if out.returncode != 0 or line is None:
                    print(f"bench_raw_calls: {mode} failed (exit {out.returncode}): {out.stderr[-2000:]}")
                    return 1
                got = json.loads(line)
                for k in ("raw_ns", "libc_ns"):
                    figures[mode][k].append(got[k])
        med = {m: {k: statistics.median(v) for k, v in f.items()} for m, f in figures.items()}
        print(f"{args.calls:,} calls of getppid each, median of {args.runs} runs (ns a call)")
        print(f"  {'':<28}{'direct':>10}{'monarch':>10}{'monarch - direct':>18}")
        for k, name in (("raw_ns", "raw syscall instruction"), ("libc_ns", "through libc")):
            d, m = med["direct"][k], med["monarch"][k]
            print(f"  {name:<28}{d:>10.0f}{m:>10.0f}{m - d:>+18.0f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
