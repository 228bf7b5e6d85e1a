#!/usr/bin/env python3
"""What the shim costs a whole process that never touches a dataset root: start, fork, read, exit.

Inside one live ``monarch run`` (so the shim sees a real run: its roots, socket, counters, index),
the driver below times each workload as a whole command, alternately with the shim (the run's
LD_PRELOAD) and without it (LD_PRELOAD removed for that command), so both are measured side by
side under the same load. Wall time and the CPU-seconds of the command's whole process tree
(RUSAGE_CHILDREN) are given as medians, and their ratio with/without.

  spawn     a C program started and ended N times (the shim's start-up and exit)
  fork      a C program that forks N children, each exiting at once (the fork handlers)
  subshell  bash running `x=$(echo a | head -1)` N times (forks of forks, exec)
  reader    3 epochs over files outside the roots, a forked pool of 4 workers per epoch

    python3 scripts/shim/bench_pass_through.py [--runs 9] [--files 1500] [--size 32KiB]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import REPO, checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)

from benchkit.options import parse_with_quick, ready_to_write, result_path  # noqa: E402

FORK_C = r"""
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0)
            _exit(0);
        if (p < 0 || waitpid(p, NULL, 0) != p)
            return 1;
    }
    return 0;
}
"""


def workloads(args, work: Path) -> dict[str, list[str]]:
    fork_exe = work / "forker"
    subprocess.run(["cc", "-O2", "-x", "c", "-o", str(fork_exe), "-"], input=FORK_C, text=True, check=True)
    true_exe = work / "true_loop.sh"
    true_exe.write_text(f"for i in $(seq {args.spawns}); do /bin/true; done\n")
    return {
        "spawn": ["bash", str(true_exe)],
        "fork": [str(fork_exe), str(args.forks)],
        "subshell": ["bash", "-c", f"for i in $(seq {args.subshells}); do x=$(echo a | head -1); done"],
        "reader": [sys.executable, "-m", "monarch.tools.workload", "read", str(work / "outside"), "--epochs", "3",
                   "--workers", "4", "--manifest", str(work / "outside.manifest.json")],
    }


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of its process tree) of one run of cmd."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def drive(spec: str) -> int:
    """Under `monarch run`: each workload alternately with and without the run's shim."""
    conf = json.loads(Path(spec).read_text())
    with_shim = dict(os.environ)
    if "libmonarch_shim" not in with_shim.get("LD_PRELOAD", ""):
        raise SystemExit("bench_pass_through: the driver is not under `monarch run` (no shim in LD_PRELOAD)")
    without = {k: v for k, v in with_shim.items() if k != "LD_PRELOAD"}
    samples: dict[str, dict[str, list]] = {}
    for name, cmd in conf["workloads"].items():
        timed(cmd, with_shim), timed(cmd, without)  # warm: page cache, bytecode
        runs = samples[name] = {"shim": [], "none": []}
        for i in range(conf["runs"]):
            order = (("shim", with_shim), ("none", without)) if i % 2 == 0 else (("none", without), ("shim", with_shim))
            for label, env in order:
                runs[label].append(timed(cmd, env))
    Path(conf["out"]).write_text(json.dumps(samples))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=9, help="alternated runs of each workload per side (default 9)")
    p.add_argument("--files", type=int, default=1500, help="reader: files outside the roots (default 1500)")
    p.add_argument("--size", default="32KiB", help="reader: size of each file (default 32KiB)")
    p.add_argument("--spawns", type=int, default=500, help="spawn: programs started per run (default 500)")
    p.add_argument("--forks", type=int, default=2000, help="fork: children per run (default 2000)")
    p.add_argument("--subshells", type=int, default=300, help="subshell: command substitutions per run (default 300)")
    p.add_argument("--json", default=result_path("bench_pass_through.json"), help="where the figures go")
    p.add_argument("--drive", help=argparse.SUPPRESS)
    args = parse_with_quick(p, argv, {"runs": 1, "files": 60, "spawns": 20, "forks": 50, "subshells": 10})
    if args.drive:
        return drive(args.drive)
    from monarch.tools.workload import make_dataset
    with tempfile.TemporaryDirectory(prefix="bpt-") as tmp:
        work = Path(tmp)
        make_dataset(work / "outside", files=args.files, size=args.size, manifest=work / "outside.manifest.json")
        roots = work / "roots"  # the run's dataset: never read by any workload
        make_dataset(roots, files=20, size="4KiB", manifest=work / "roots.manifest.json")
        spec = work / "spec.json"
        out = work / "samples.json"
        spec.write_text(json.dumps({"workloads": workloads(args, work), "runs": args.runs, "out": str(out)}))
        env = checkout_env()
        r = subprocess.run([sys.executable, "-m", "monarch", "run", "--dataset", str(roots), "--no-progress", "--",
                            sys.executable, __file__, "--drive", str(spec)], env=env, cwd=REPO,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return r.returncode
        samples = json.loads(out.read_text())
    figures = {}
    print(f"{'workload':10} {'wall: none':>11} {'shim':>9} {'ratio':>7}   {'CPU: none':>10} {'shim':>9} {'ratio':>7}")
    for name, runs in samples.items():
        med = {label: [statistics.median(x[k] for x in runs[label]) for k in (0, 1)] for label in runs}
        ratio = [med["shim"][k] / med["none"][k] if med["none"][k] else float("nan") for k in (0, 1)]
        figures[name] = {"none": med["none"], "shim": med["shim"], "ratio": ratio}
        print(f"{name:10} {med['none'][0]:10.3f}s {med['shim'][0]:8.3f}s {ratio[0]:6.3f}x   "
              f"{med['none'][1]:9.3f}s {med['shim'][1]:8.3f}s {ratio[1]:6.3f}x")
    ready_to_write(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
