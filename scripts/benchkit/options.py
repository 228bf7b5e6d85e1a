"""What every benchmark's command line has, and where its figures go."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# where a script's figures go unless an option names a place: outside the tracked tree
# (.gitignore covers it), so that a benchmark run leaves the checkout as it was
RESULTS = Path(__file__).resolve().parents[2] / "results"


def result_path(name: str) -> str:
    """The default path of an output ``name`` (``bench_shim.json``): under ``results/`` of this checkout."""
    return str(RESULTS / name)


def ready_to_write(path: str | Path) -> Path:
    """``path``, its directory made if missing (``results/`` on a first run)."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: str | Path | None, doc: object, indent: int = 1) -> None:
    """The figures ``doc`` written as JSON at ``path`` (its directory made), or nowhere when it is None."""
    if path:
        ready_to_write(path).write_text(json.dumps(doc, indent=indent, default=str))


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


def fresh_bytecode() -> None:
    """This checkout's bytecode brought up to date before anything is measured. Where
    PYTHONDONTWRITEBYTECODE is set (install.sh compiles the checkout once), a module changed
    since is compiled again by every process that imports it, at every start: measured with
    bench_cluster on 40 files, the daemons' CPU 4.5-4.8 s and the launchers' 2.4-2.5 s with
    stale bytecode, 3.2 s and 1.9 s with fresh. Quick when nothing changed."""
    import compileall
    repo = Path(__file__).resolve().parents[2]
    for tree in (repo / "monarch", repo / "tests" / "support"):
        compileall.compile_dir(str(tree), quiet=1)
