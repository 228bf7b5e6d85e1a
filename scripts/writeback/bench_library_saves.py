#!/usr/bin/env python3
"""The checkpoint libraries' saves, directly and under write-back, side by side.

orbax's CheckpointManager (tensorstore underneath: 4 saves, two kept) and torch.distributed.checkpoint
with its defaults (2 saves, every file fsynced) save the libraries test's state
(tests/support/checkpoint_libraries.py) onto an emulated PFS (``monarch.tools.slowpfs --writable``:
FUSE, no page cache, writes capped, a latency per open and per name looked up). Each runs
directly and under ``monarch run`` with the checkpoint directory as a write-back path, in each
fsync mode (``pfs``: an fsync returns once the PFS holds the bytes; ``local``: once the node does),
the modes interleaved, ``--rounds`` times. Per run: the seconds the saves blocked the job (the
library's save calls and its final wait, timed inside the job), the whole command's wall time and
CPU-seconds (the kernel's account of the reaped process tree, the emulated PFS's own apart), and
the PFS tree checked against the direct save's. It prints the medians and the ratios to direct.

    python3 scripts/writeback/bench_library_saves.py                  # orbax and dcp, 5 rounds
    python3 scripts/writeback/bench_library_saves.py --libraries orbax --rounds 3
    python3 scripts/writeback/bench_library_saves.py --state-mib 64  # a model of 64 MiB
    python3 scripts/writeback/bench_library_saves.py --open-latency-ms 0 --lookup-latency-ms 0
    python3 scripts/writeback/bench_library_saves.py --quick          # a smoke run: dcp, 1 round
"""

from __future__ import annotations

import argparse
import importlib.util
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
from benchkit.pfs import pfs_unavailable  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from support.checkpoint_libraries import IGNORED, RANDOM_NAMES  # noqa: E402
from support.writeback import published_tree  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

LIBRARIES = ("orbax", "dcp")
NEEDS = {"orbax": ("torch", "orbax.checkpoint"), "dcp": ("torch",)}
MODES = ("direct", "fsync-pfs", "fsync-local")
# the job: the library's saves, timed inside it (its imports and torch's warm-up are not the save's)
JOB = """
import sys, time
from support import checkpoint_libraries as c
library, d = sys.argv[1], sys.argv[2]
import torch
if library == "orbax":
    import orbax.checkpoint
else:
    import torch.distributed.checkpoint
c.state(0)  # (torch's first tensors: not the save's)
started = time.monotonic()
getattr(c, library + "_save")(d)
print("SAVED", time.monotonic() - started)
"""


def missing(library: str) -> list[str]:
    return [m for m in NEEDS[library]
            if importlib.util.find_spec(m.split(".")[0]) is None or importlib.util.find_spec(m) is None]


def config(work: Path, ck: str, fsync: str) -> str:
    """A configuration whose only business is the write-back of ``ck`` (its dataset: an empty folder)."""
    data = work / "dataset"
    for d in (data, work / "run", Path(f"/dev/shm{work}/ram")):
        d.mkdir(parents=True, exist_ok=True)
    path = work / f"monarch-{fsync}.yaml"
    path.write_text(f"""dataset: {{roots: [{json.dumps(str(data))}]}}
run_base: {json.dumps(str(work / 'run'))}
tiers:
  - {{name: ram, path: {json.dumps('/dev/shm' + str(work) + '/ram')}, capacity: 1GiB}}
staging: {{policy: on-access, share: false}}
filesystem_reserve: 0
writeback: {{paths: [{json.dumps(ck)}], fsync: {fsync}}}
""")
    return str(path)


def run_once(library: str, mode: str, pfs, src: Path, work: Path, timeout: float, state_mib: float) -> dict:
    ck = os.path.join(str(pfs.mountpoint), "ck")
    os.makedirs(ck)
    report = work / "report.json"
    launch = [] if mode == "direct" else [sys.executable, "-m", "monarch", "run", "-c", config(work, ck, mode.split("-")[1]),
                                          "--report", str(report), "--no-progress", "--"]
    env = checkout_env(tests=True, PYTHONHASHSEED=0, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="",
                       TOKENIZERS_PARALLELISM="false")
    if state_mib:  # the model's embedding grown to that size (rows of 128 float32)
        env["CHECKPOINT_EMBED_ROWS"] = str(max(1, int(state_mib * 2**20 / 512)))
    cpu0, t0 = children_cpu(), time.monotonic()
    r = subprocess.run([*launch, sys.executable, "-c", JOB, library, os.path.join(ck, "x")], env=env,
                       capture_output=True, text=True, timeout=timeout)
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    if r.returncode != 0:
        raise SystemExit(f"{library} {mode}: exit {r.returncode}\n{r.stderr[-3000:]}")
    saved = float(next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("SAVED")))
    if launch:  # the saves went through write-back (not written through, nor past the shim)
        if not report.exists():
            raise SystemExit(f"{library} {mode}: no report\n{r.stderr[-3000:]}")
        wb = json.loads(report.read_text())["nodes"][0]["writeback"]
        if not wb or not wb.get("files_closed") or wb.get("failed"):
            raise SystemExit(f"{library} {mode}: the saves did not go through write-back: {wb}\n{r.stderr[-3000:]}")
    tree = published_tree(str(src / "ck"), IGNORED.get(library, ()), RANDOM_NAMES.get(library))
    shutil.rmtree(src / "ck")
    return {"save_s": saved, "wall_s": wall, "cpu_s": cpu, "tree": tree}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--libraries", default=",".join(LIBRARIES), help=f"a subset of {','.join(LIBRARIES)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"a subset of {','.join(MODES)}")
    p.add_argument("--rounds", type=int, default=5, help="runs of each mode, interleaved (default 5)")
    p.add_argument("--open-latency-ms", type=float, default=2.0, help="the emulated PFS's ms per open (default 2)")
    p.add_argument("--lookup-latency-ms", type=float, default=0.2,
                   help="the emulated PFS's ms per name looked up (default 0.2)")
    p.add_argument("--write-bandwidth", type=float, default=150.0, metavar="MBps",
                   help="the emulated PFS's write cap (default 150)")
    p.add_argument("--state-mib", type=float, default=0.0,
                   help="the saved state's size in MiB (default: the libraries test's, 0.17 MB)")
    p.add_argument("--json", default=result_path("bench_library_saves.json"), help="where the figures go")
    p.add_argument("--timeout", type=float, default=300, help="seconds allowed to each run")
    args = parse_with_quick(p, argv, {"libraries": "dcp", "rounds": 1})
    if pfs_unavailable("bench_library_saves"):
        return 0
    libraries = [lib for lib in args.libraries.split(",") if lib]
    for lib in [lib for lib in libraries if missing(lib)]:
        print(f"{lib}: skipped ({', '.join(missing(lib))} not installed; scripts/install.sh installs them)")
        libraries.remove(lib)
    modes = [m for m in args.modes.split(",") if m]
    work = Path(tempfile.mkdtemp(prefix="bench-saves-"))
    src = work / "pfs-src"
    src.mkdir()
    results: dict = {}
    print(f"emulated PFS: {args.open_latency_ms:g} ms per open, {args.lookup_latency_ms:g} ms per name "
          f"looked up, writes capped at {args.write_bandwidth:g} MB/s, no page cache; the state saved: "
          f"{f'{args.state_mib:g} MiB' if args.state_mib else '0.17 MB'}", flush=True)
    try:
        for lib in libraries:  # each on a PFS of its own: its counters of every file one library made slow the next's
            with SlowPFS(src, work / "pfs", work / f"pfs-counters-{lib}.json", open_latency_ms=args.open_latency_ms,
                         lookup_latency_ms=args.lookup_latency_ms, writable=True,
                         write_bandwidth_mbps=args.write_bandwidth) as pfs:
                runs: dict[str, list[dict]] = {m: [] for m in modes}
                for rnd in range(args.rounds):
                    for mode in modes:
                        out = run_once(lib, mode, pfs, src, work, args.timeout, args.state_mib)
                        runs[mode].append(out)
                        print(f"{lib} round {rnd + 1} {mode:<12} saves {out['save_s']:.2f} s, command "
                              f"{out['wall_s']:.2f} s, {out['cpu_s']:.2f} CPU-s", flush=True)
                trees = {m: [r.pop("tree") for r in runs[m]] for m in modes}
                if "direct" in modes:
                    for m in modes:
                        if any(t != trees["direct"][0] for t in trees[m]):
                            raise SystemExit(f"{lib} {m}: the PFS tree differs from the direct save's")
                results[lib] = {m: {k: statistics.median(r[k] for r in runs[m]) for k in ("save_s", "wall_s", "cpu_s")}
                                | {"runs": runs[m]} for m in modes}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{work}", ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds (saves: the seconds the library's saves blocked the job)")
    print(f"{'library':<8} {'mode':<12} {'saves':>8} {'x direct':>9} {'command':>9} {'CPU-s':>7} {'x direct':>9}")
    for lib, by_mode in results.items():
        base = by_mode.get("direct")
        for m, f in by_mode.items():
            ratio = f"{f['save_s'] / base['save_s']:.2f}x" if base else "-"
            cpu_ratio = f"{f['cpu_s'] / base['cpu_s']:.2f}x" if base else "-"
            print(f"{lib:<8} {m:<12} {f['save_s']:>7.2f}s {ratio:>9} {f['wall_s']:>8.2f}s {f['cpu_s']:>7.2f} {cpu_ratio:>9}")
    print("(every run's PFS tree: the direct save's, names and bytes, but for the libraries' time stamps and random names)")
    write_json(args.json, {"settings": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
