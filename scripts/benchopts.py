"""Options the benchmark scripts share (not a benchmark: scripts/ is on the path of each)."""

from __future__ import annotations

import argparse


def parse_with_quick(p: argparse.ArgumentParser, argv: list[str] | None, quick: dict) -> argparse.Namespace:
    """Parse ``argv`` with a ``--quick`` flag: a smoke run (seconds; tests/integration/
    test_bench_smoke.py) whose settings ``quick`` replaces the defaults; options given still win."""
    p.add_argument("--quick", action="store_true",
                   help="smoke run: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in quick.items()))
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**quick)
        args = p.parse_args(argv)
    return args
