#!/usr/bin/env python3
"""A peer's test suite under the shim: CPython's own process, fork, signal, mmap and file tests,
run directly and under ``monarch run`` (the dataset a directory of its own, never read by the
tests, so every test process carries an active shim), each test module's outcome side by side.

    python3 scripts/shim/peer_suite.py [--tests test_fork1 test_wait4 ...] [--timeout 900]

Prints a table: module, direct's outcome, Monarch's, and whether they match; exits 1 when any
module's outcome differs. Each side is one ``python3 -m test -W`` run, the modules in order in
one process tree (``-W`` prints a failing module's output).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)

TESTS = ["test_fork1", "test_wait3", "test_wait4", "test_os", "test_posix", "test_signal", "test_threading",
         "test_mmap", "test_subprocess", "test_pty", "test_fileio", "test_tempfile", "test_shutil",
         "test_concurrent_futures", "test_multiprocessing_fork", "test_popen", "test_select", "test_selectors"]

# libregrtest's summary: "N tests OK.", "N tests failed:", "N tests skipped:" and the module names
# on the following indented lines
SECTION = re.compile(r"^(\d+|All \d+) tests? (OK|failed|skipped|altered the execution environment|"
                     r"failed again|run no tests|omitted|had no tests run|resource denied)[.:]?", re.M)


def outcomes(text: str, tests: list[str]) -> dict[str, str]:
    """Each test module's outcome from a libregrtest run's output."""
    out = {}
    for m in SECTION.finditer(text):
        kind = m.group(2)
        if kind == "OK":
            continue
        block = text[m.end():].split("\n\n", 1)[0]
        for name in re.findall(r"\btest_[A-Za-z0-9_]+\b", block):
            out.setdefault(name, kind)
    # the modules that passed are not named when others failed: "N tests OK." counts them
    passed = re.search(r"^(Result: SUCCESS|(All )?\d+ tests? OK\.)", text, re.M)
    for name in tests:
        out.setdefault(name, "OK" if passed else "?")
    return out


def present(name: str) -> bool:
    """Is test module (or package) ``name`` in this Python's test suite?"""
    import test
    return any((Path(d) / f"{name}.py").is_file() or (Path(d) / name / "__init__.py").is_file()
               for d in test.__path__)


def run(cmd: list[str], timeout: float) -> tuple[str, float, int]:
    # Monarch from this checkout, and the same environment for both sides
    env = checkout_env()
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True, env=env)
        return r.stdout + r.stderr, time.monotonic() - t0, r.returncode
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return text + f"\n(timed out after {timeout} s)", time.monotonic() - t0, -1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tests", nargs="+", default=TESTS, help="CPython test modules (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per side (default 1800)")
    args = p.parse_args(argv)
    missing = [t for t in args.tests if not present(t)]
    if missing:  # a Python installed without part of its test suite
        print(f"not in this Python's test suite (left out): {' '.join(missing)}")
    args.tests = [t for t in args.tests if t not in missing]
    base = [sys.executable, "-m", "test", "-W", *args.tests]
    with tempfile.TemporaryDirectory(prefix="peer-") as tmp:
        dataset = Path(tmp, "dataset")
        dataset.mkdir()
        (dataset / "x.bin").write_bytes(os.urandom(4096))
        direct_text, direct_s, direct_rc = run(base, args.timeout)
        monarch_text, monarch_s, monarch_rc = run([sys.executable, "-m", "monarch", "run", "--dataset",
                                                   str(dataset), "--no-progress", "--", *base], args.timeout)
    direct, under = outcomes(direct_text, args.tests), outcomes(monarch_text, args.tests)
    same = True
    print(f"{'module':28} {'direct':10} {'monarch run':12} same")
    for name in args.tests:
        ok = direct[name] == under[name]
        same &= ok
        print(f"{name:28} {direct[name]:10} {under[name]:12} {'yes' if ok else 'NO'}")
    print(f"whole run: direct {direct_s:.1f} s (exit {direct_rc}), under monarch run {monarch_s:.1f} s "
          f"(exit {monarch_rc})")
    if "processes with the shim" not in monarch_text and "(processes with the shim)" not in monarch_text:
        print("peer_suite: the report of monarch run was not found in its output", file=sys.stderr)
        same = False
    if not same:
        for label, text in (("direct", direct_text), ("monarch run", monarch_text)):
            print(f"---- {label}: last lines ----\n" + "\n".join(text.splitlines()[-40:]), file=sys.stderr)
    return 0 if same and direct_rc == monarch_rc else 1


if __name__ == "__main__":
    sys.exit(main())
