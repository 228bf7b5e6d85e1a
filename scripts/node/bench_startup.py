#!/usr/bin/env python3
"""Where the cold path's fixed cost goes: ``monarch run`` around one epoch, phase by phase.

One epoch of the bench_epochs workload is run straight from the emulated PFS (direct) and
under ``monarch -vv run`` (the launcher passes debug to its embedded daemon); every phase
boundary is read from the time stamps of the launcher's and the daemon's debug lines
(``phase NAME``), never guessed. Each mode runs ``--repeat`` times, alternately, on the
same mount; the table gives the median and the range of each phase.

    python scripts/node/bench_startup.py                               # 1500 files, 2 ms/open, 3 repeats
    python scripts/node/bench_startup.py --open-latency-ms 50 --repeat 5
    python scripts/node/bench_startup.py --app-startup-s 2     # a command that starts like a PyTorch job

Phases (launcher L, daemon D), on the way to the command (the critical path):
  launcher start      L spawned -> L imported and configured (interpreter, imports, config)
  daemon start        L spawned the daemon -> D imported (interpreter, imports)
  tiers               D imported -> tiers made (the snapshot walk starts on its own thread)
  socket + attach     tiers made -> L attached (socket bound, ATTACH answered, L polling):
                      the daemon answers before its snapshot exists
  app                 the command, start to exit (its own epoch 1 inside; its first call
                      under the dataset root waits for the index if the walk is still on)
  final report        L asks REPORT (size classes, timeline) -> answer
  report print        L prints and writes the report
  tear-down           L waits for the daemon to exit (its tiers removed)
  exit                L's last line -> its process has exited
and in the background, overlapped with the above (D's snapshot thread):
  walk                the walk of the dataset (or the reuse of the last one)
  stager + index      stager made, kept copies adopted, the index the shim maps written
  ready               read-ahead started, the snapshot ready (the held requests are answered)
  command start -> snapshot ready: how long after its start the command could still wait
                      for the snapshot (negative: the snapshot was there first)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import shutil
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import REPO  # noqa: E402  (this checkout's monarch and tests/ first on the path)

from bench_epochs import child_env, monarch_config  # noqa: E402
from benchkit.options import fresh_bytecode, parse_with_quick, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402
from monarch.tools.workload import make_dataset  # noqa: E402

PHASE = re.compile(r"^\[monarch node \d+\] (\d+\.\d+) DEBUG phase (\S+)")

SEGMENTS = [  # (label, from, to): both ends are phase names (or "spawn"/"exit", measured here)
    ("launcher start", "spawn", "launcher.ready"),
    ("launcher: to daemon spawn", "launcher.ready", "daemon.spawned"),
    ("daemon start (interp+import)", "daemon.spawned", "daemon.imported"),
    ("daemon: config + tiers", "daemon.imported", "tiers.ready"),
    ("socket + first attach", "tiers.ready", "daemon.attached"),
    ("attach -> command start", "daemon.attached", "command.start"),
    ("app (command)", "command.start", "command.end"),
    ("final REPORT", "command.end", "report.fetched"),
    ("report print/write", "report.fetched", "report.printed"),
    ("tear-down wait (daemon exit)", "report.printed", "daemon.reaped"),
    ("exit", "daemon.reaped", "exit"),
]
BACKGROUND = [  # the daemon's snapshot thread, overlapped with the command's start
    ("walk", "snapshot.start", "snapshot.done"),
    ("stager + adoption + index", "snapshot.done", "index.written"),
    ("read-ahead start, ready", "index.written", "snapshot.ready"),
    ("command start -> snapshot ready", "command.start", "snapshot.ready"),
]


def phases(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = PHASE.match(line)
        if m:
            out.setdefault(m.group(2), float(m.group(1)))
    return out


# a framework's start-up before the command touches the dataset (PyTorch's imports take
# seconds of CPU): a busy loop of --app-startup-s seconds, then the workload
STARTUP = ("import runpy, sys, time\n"
           "end = time.perf_counter() + float(sys.argv[1])\n"
           "while time.perf_counter() < end: pass\n"
           "sys.argv = ['monarch.tools.workload', *sys.argv[2:]]\n"
           "runpy.run_module('monarch.tools.workload', run_name='__main__', alter_sys=True)\n")


def workload(data_dir: str, manifest: Path, out_json: Path, workers: int, startup: float = 0.0) -> list[str]:
    args = ["read", data_dir, "--epochs", "1", "--workers", str(workers), "--seed", "0", "--reader", "python",
            "--manifest", str(manifest), "--json", str(out_json)]
    if startup > 0:
        return [sys.executable, "-c", STARTUP, str(startup), *args]
    return [sys.executable, "-m", "monarch.tools.workload", *args]


def run_direct(pfs, manifest, work, args) -> dict:
    out = work / "direct.json"
    t0 = time.time()
    proc = subprocess.run(workload(pfs.mountpoint, manifest, out, args.workers, args.app_startup_s),
                          capture_output=True, text=True,
                          env=child_env(), cwd=REPO)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"direct failed: {proc.stderr[-2000:]}")
    return {"wall": wall, "epoch1": json.loads(out.read_text())["epochs"][0]["seconds"]}


def run_monarch(pfs, manifest, work, args, i) -> dict:
    config = work / "monarch.yaml"
    shm = Path(tempfile.mkdtemp(prefix="mstart-", dir="/dev/shm"))
    try:
        monarch_config(config, pfs.mountpoint, work, shm, 1 << 30, argparse.Namespace(policy=None, threads=None))
        out = work / "monarch.json"
        env = child_env() | {"MONARCH_JOB_ID": f"startup{os.getpid()}x{i}"}
        (work / "report.json").unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "monarch", "-vv", "run", "-c", str(config), "--no-progress",
               "--report", str(work / "report.json"), "--",
               *workload(pfs.mountpoint, manifest, out, args.workers, args.app_startup_s)]
        if not args.reuse:  # the cold path: the first job on this dataset walks it
            for kept in glob.glob(str(work / "run" / "monarch-*" / "snapshots")):
                shutil.rmtree(kept)
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        t1 = time.time()
        if proc.returncode != 0:
            raise SystemExit(f"monarch failed: {proc.stderr[-3000:]}")
        if not (work / "report.json").exists():  # Monarch fails open: the phases would be the PFS's
            raise SystemExit(f"monarch run wrote no report: Monarch was not active; its stderr:\n{proc.stderr[-3000:]}")
        logs = glob.glob(str(work / "run" / "monarch-*" / f"startup{os.getpid()}x{i}*" / "daemon.log"))
        daemon_text = Path(logs[0]).read_text() if logs else ""
        # a daemon that outlives the launcher (it stops by itself) has written its last lines by now
        ph = phases(daemon_text) | phases(proc.stderr) | {"spawn": t0, "exit": t1}
        if args.verbose:
            print(proc.stderr[-4000:], daemon_text[-4000:], sep="\n----\n")
        return {"wall": t1 - t0, "epoch1": json.loads(out.read_text())["epochs"][0]["seconds"], "phases": ph}
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def stat(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):7.3f}  [{min(values):.3f}-{max(values):.3f}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1500)
    p.add_argument("--size", default="100KiB")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--open-latency-ms", type=float, default=2.0)
    p.add_argument("--lookup-latency-ms", type=float, default=0.0,
                   help="emulated PFS: ms per lookup (getattr, readdir): the metadata round trip a walk pays")
    p.add_argument("--app-startup-s", type=float, default=0.0,
                   help="seconds of CPU the command spends before it touches the dataset, in both modes "
                        "(a framework's imports: PyTorch takes several); default 0")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--reuse", action="store_true",
                   help="let later runs reuse the snapshot kept by the first (default: every run walks)")
    p.add_argument("--json", help="write the raw figures here")
    p.add_argument("-v", "--verbose", action="store_true", help="print the logs of each monarch run")
    args = parse_with_quick(p, argv, {"files": 40, "size": "8KiB", "workers": 2, "repeat": 1})
    fresh_bytecode()
    if pfs_unavailable("bench_startup", probe=False):
        return 2
    work = Path(tempfile.mkdtemp(prefix="mstart-", dir="/tmp"))
    try:
        src, manifest = work / "dataset", work / "dataset.manifest.json"
        make_dataset(src, args.files, args.size, 0.5, 0, manifest=manifest, content="random")
        os.sync()
        time.sleep(1.0)
        direct, monarch = [], []
        with SlowPFS(src, work / "pfs", work / "pfs-counters.json", open_latency_ms=args.open_latency_ms,
                     lookup_latency_ms=args.lookup_latency_ms) as pfs:
            for i in range(args.repeat):
                direct.append(run_direct(pfs, manifest, work, args))
                monarch.append(run_monarch(pfs, manifest, work, args, i))
                print(f"run {i + 1}/{args.repeat}: direct {direct[-1]['wall']:.2f} s, "
                      f"monarch {monarch[-1]['wall']:.2f} s", flush=True)
        print(f"\n{args.files} files of ~{args.size}, {args.workers} workers, {args.open_latency_ms:g} ms/open, "
              f"{args.lookup_latency_ms:g} ms/lookup, {args.app_startup_s:g} s app start-up, "
              f"one epoch, {args.repeat} runs each: seconds, median [min-max]")
        print(f"{'direct: launch to exit':32} {stat([r['wall'] for r in direct])}")
        print(f"{'direct: its epoch 1':32} {stat([r['epoch1'] for r in direct])}")
        print(f"{'monarch: launch to exit':32} {stat([r['wall'] for r in monarch])}")
        print(f"{'monarch: its epoch 1':32} {stat([r['epoch1'] for r in monarch])}")
        print("monarch, phase by phase:")
        for label, a, b in SEGMENTS:
            vals = [r["phases"][b] - r["phases"][a] for r in monarch if a in r["phases"] and b in r["phases"]]
            print(f"  {label:30} {stat(vals)}")
        print("in the background (the daemon's snapshot thread):")
        for label, a, b in BACKGROUND:
            vals = [r["phases"][b] - r["phases"][a] for r in monarch if a in r["phases"] and b in r["phases"]]
            print(f"  {label:30} {stat(vals)}")
        extra = [("  (inside tear-down) D detach -> stopping", "detach", "daemon.stopping"),
                 ("  (inside tear-down) D stopping -> closed", "daemon.stopping", "daemon.closed")]
        for label, a, b in extra:
            vals = [r["phases"][b] - r["phases"][a] for r in monarch if a in r["phases"] and b in r["phases"]]
            print(f"{label:32} {stat(vals)}")
        write_json(args.json, {"args": vars(args), "direct": direct, "monarch": monarch}, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
