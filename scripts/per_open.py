#!/usr/bin/env python3
"""Per-open time, staged against direct, side by side (scripts/bench_million.py's row).

The staged passes run in the calling process (under `monarch run`: through the shim), the
direct passes in a child started without the shim (no LD_PRELOAD, no MONARCH_*), both with
``one_pass`` over the same files (Python open + read + close), alternated pass by pass (the
order swapped every round) so that what else the machine does at a moment (the daemon, a
neighbour) weighs on both alike. Each side first makes one untimed pass: page cache,
dentries, the shim's index pages.

    python scripts/per_open.py LIST     # the direct side: one timed pass per line on stdin
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time


def read_list(path: str) -> list[str]:
    with open(path) as f:
        return [p for p in f.read().split("\n") if p]


def one_pass(paths: list[str]) -> float:
    """Seconds per open + read + close over paths."""
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            f.read()
    return (time.perf_counter() - t0) / len(paths)


def side_by_side(list_file: str, rounds: int) -> dict:
    """``rounds`` staged passes here and as many direct passes in a child without the shim,
    interleaved; the medians, every pass, and the median of the rounds' ratios."""
    paths = read_list(list_file)
    one_pass(paths)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_") and k != "LD_PRELOAD"}
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), list_file], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
    staged: list[float] = []
    direct: list[float] = []
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the direct reader did not start")
        for r in range(rounds):
            for side in ("staged", "direct") if r % 2 == 0 else ("direct", "staged"):
                if side == "staged":
                    staged.append(one_pass(paths))
                else:
                    child.stdin.write("pass\n")
                    child.stdin.flush()
                    direct.append(float(child.stdout.readline()))
    finally:
        child.stdin.close()
        child.wait(60)
    return {"per_open_s": statistics.median(staged), "direct_per_open_s": statistics.median(direct),
            "per_open_passes": {"staged": staged, "direct": direct},
            "per_open_round_ratio": statistics.median(s / d for s, d in zip(staged, direct))}


if __name__ == "__main__":
    if os.environ.get("LD_PRELOAD", "").find("monarch") >= 0:
        sys.exit("per_open.py: the direct side must run without the shim")
    files = read_list(sys.argv[1])
    one_pass(files)
    print("ready", flush=True)
    for _ in sys.stdin:
        print(repr(one_pass(files)), flush=True)
