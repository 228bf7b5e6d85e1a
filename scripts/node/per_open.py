#!/usr/bin/env python3
"""Per-open time, staged against direct, side by side (scripts/node/bench_million.py's row).

The staged side runs in the calling process (under `monarch run`: through the shim), the
direct side in a child started without the shim (no LD_PRELOAD, no MONARCH_*), both with
``timed`` over the same files (Python open + read + close). The files are cut into chunks
of ``CHUNK`` (about 10 ms of opens) and the two sides take turns chunk by chunk, the order
swapped every chunk, so that what else the machine does at a moment (the daemon, a
neighbour, the hypervisor) weighs on both alike: a pair of chunks is measured within a
few milliseconds, where whole passes (0.4 s each) swung the ratio by 10-20% on this shared
2-core VM. Each side's figure is the median over chunks of its time per open, wall and its
own thread's CPU; the ratio is the median of the pairs' ratios. Each side first makes one
untimed pass: page cache, dentries, the shim's index pages.

    python scripts/node/per_open.py LIST CHUNK  # the direct side: one timed chunk per line on stdin
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

CHUNK = 500


def read_list(path: str) -> list[str]:
    with open(path) as f:
        return [p for p in f.read().split("\n") if p]


def timed(paths: list[str]) -> tuple[float, float]:
    """Seconds per open + read + close over paths: wall, and this thread's CPU."""
    c0, t0 = time.thread_time(), time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            f.read()
    return (time.perf_counter() - t0) / len(paths), (time.thread_time() - c0) / len(paths)


def one_pass(paths: list[str]) -> float:
    """Seconds per open + read + close over paths (wall)."""
    return timed(paths)[0]


def chunks(paths: list[str], size: int) -> list[list[str]]:
    return [paths[i:i + size] for i in range(0, len(paths), size)]


def side_by_side(list_file: str, rounds: int, chunk: int = CHUNK) -> dict:
    """``rounds`` passes over the list on each side, taking turns chunk by chunk with a child
    without the shim: per side the median time per open (wall, CPU) and the median of the
    pairs' ratios."""
    parts = chunks(read_list(list_file), chunk)
    one_pass([p for part in parts for p in part])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_") and k != "LD_PRELOAD"}
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), list_file, str(chunk)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    staged: list[tuple[float, float]] = []
    direct: list[tuple[float, float]] = []
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the direct reader did not start")
        for r in range(rounds):
            for i, part in enumerate(parts):
                for side in ("staged", "direct") if (r + i) % 2 == 0 else ("direct", "staged"):
                    if side == "staged":
                        staged.append(timed(part))
                    else:
                        child.stdin.write(f"{i}\n")
                        child.stdin.flush()
                        wall, cpu = child.stdout.readline().split()
                        direct.append((float(wall), float(cpu)))
    finally:
        child.stdin.close()
        child.wait(60)

    def median(pairs: list[tuple[float, float]], k: int) -> float:
        return statistics.median(p[k] for p in pairs)

    return {"per_open_s": median(staged, 0), "direct_per_open_s": median(direct, 0),
            "per_open_cpu_s": median(staged, 1), "direct_per_open_cpu_s": median(direct, 1),
            "per_open_pair_ratio": statistics.median(s[0] / d[0] for s, d in zip(staged, direct)),
            "per_open_cpu_pair_ratio": statistics.median(s[1] / d[1] for s, d in zip(staged, direct) if d[1] > 0),
            "per_open_chunks": {"files": chunk, "pairs": len(staged)}}


if __name__ == "__main__":
    if os.environ.get("LD_PRELOAD", "").find("monarch") >= 0:
        sys.exit("per_open.py: the direct side must run without the shim")
    parts = chunks(read_list(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else CHUNK)
    one_pass([p for part in parts for p in part])
    print("ready", flush=True)
    for line in sys.stdin:
        wall, cpu = timed(parts[int(line)])
        print(repr(wall), repr(cpu), flush=True)
