#!/usr/bin/env python3
"""Checkpoint benchmark: a training job's saves to the PFS, directly and under ``monarch run``, side by side.

The emulated PFS (``monarch.tools.slowpfs --writable``: FUSE, no page cache, writes capped at
200 MB/s in all, 2 ms per open) receives two workloads, each run in every mode:

  loop  200 steps of 80 ms (a sleep, as a step on a GPU leaves the CPU idle; ``--busy``: a busy
        loop) saving a checkpoint every 50 steps: 2 files of 256 MiB, each written as NAME.tmp in
        16 MiB writes, then ``os.replace`` to NAME (``torch.save``, then a rename)
  dcp   torch.distributed.checkpoint's pattern without torch: 4 writer processes each write a
        128 MiB shard under its final name, a barrier, then rank 0 writes ``.metadata``; a watcher
        (this process, as another node would) polls the PFS every 5 ms and counts the polls that
        saw (a) ``.metadata`` while a shard was incomplete, (b) any file under its final name
        shorter than its final size

Modes: ``direct`` (the application writes the mount), ``monarch`` (the same command under ``monarch
run -c CONFIG``, with ``writeback: {paths: [the checkpoint directory]}`` when this Monarch's
configuration accepts that key and ``--no-writeback`` is not given; otherwise one line says so and
the column is ``monarch run`` passing the writes through: the baseline write-back must beat),
and for the loop ``shm``: the same saves straight into /dev/shm, the limit. Per mode it prints each
save's blocking time (mean, max), the job's wall time and CPU-seconds (its whole process tree, from
the kernel's account of the reaped children, as scripts/benchkit/cpuwatch.py's ``children_cpu``),
the emulated PFS's own CPU, the PFS bytes written against the checkpoints' bytes (the emulator's
count), and a check of every byte of every published file once the command has returned; then the
ratios monarch/direct. The figures go to results/bench_checkpoint.json.

    python3 scripts/writeback/bench_checkpoint.py             # the loop (4 saves of 2 x 256 MiB) and dcp (4 x 128 MiB)
    python3 scripts/writeback/bench_checkpoint.py --no-writeback  # the monarch column passes the writes through
    python3 scripts/writeback/bench_checkpoint.py --busy      # steps as busy loops
    python3 scripts/writeback/bench_checkpoint.py --quick     # 20 steps, 2 saves of 2 x 32 MiB; 4 x 16 MiB shards
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import REPO, checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)

import psutil  # noqa: E402

from benchkit.cpuwatch import children_cpu  # noqa: E402
from benchkit.options import fresh_bytecode, parse_with_quick, result_path, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint_app as app  # noqa: E402  (the applications; they import nothing of Monarch's)

APP = str(Path(__file__).resolve().parent / "checkpoint_app.py")
MODES = ("direct", "monarch", "shm")  # shm: the loop's limit, straight into /dev/shm
WORKLOADS = ("loop", "dcp")
NOT_CONFIGURED = "writeback: unknown key"  # what check-config says where write-back does not exist yet


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="training steps of the loop (default 200)")
    p.add_argument("--step-ms", type=float, default=80.0, help="ms per step (default 80)")
    p.add_argument("--busy", action="store_true", help="a step is a busy loop (default: a sleep)")
    p.add_argument("--every", type=int, default=50, help="a save every N steps (default 50)")
    p.add_argument("--files", type=int, default=2, help="files per save (default 2)")
    p.add_argument("--file-mib", type=int, default=256, help="MiB per file (default 256)")
    p.add_argument("--chunk-mib", type=int, default=16, help="MiB per write call (default 16)")
    p.add_argument("--ranks", type=int, default=4, help="dcp: writer processes (default 4)")
    p.add_argument("--shard-mib", type=int, default=128, help="dcp: MiB per shard (default 128)")
    p.add_argument("--poll-ms", type=float, default=5.0, help="dcp: the watcher's period (default 5 ms)")
    p.add_argument("--write-bandwidth", type=float, default=200.0, metavar="MBps",
                   help="the emulated PFS's write cap, every writer together (default 200 MB/s)")
    p.add_argument("--open-latency-ms", type=float, default=2.0, help="the emulated PFS's ms per open (default 2)")
    p.add_argument("--fsync", choices=("pfs", "local"), default=None,
                   help="writeback.fsync of the monarch column (default: the configuration's default)")
    p.add_argument("--no-sync", dest="sync", action="store_false",
                   help="dcp: no fsync of its files (DCP's sync_files=False; default: fsynced, as DCP's default)")
    p.add_argument("--no-writeback", action="store_true",
                   help="the monarch column without writeback.paths: monarch run passing the writes through")
    p.add_argument("--modes", default=",".join(MODES), help=f"a subset of {','.join(MODES)}")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"a subset of {','.join(WORKLOADS)}")
    p.add_argument("--json", default=result_path("bench_checkpoint.json"),
                   help="where the figures go (default: results/bench_checkpoint.json of this checkout)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds allowed to each command")
    args = parse_with_quick(p, argv, {"steps": 20, "every": 10, "file_mib": 32, "shard_mib": 16})
    for name, known in (("modes", MODES), ("workloads", WORKLOADS)):
        asked = [x.strip() for x in getattr(args, name).split(",") if x.strip()]
        if set(asked) - set(known):
            p.error(f"--{name}: unknown {', '.join(sorted(set(asked) - set(known)))}; choose from {', '.join(known)}")
        setattr(args, name, [x for x in known if x in asked])
    return args


# --------------------------------------------------------------------------- the byte check


def check_loop(root: Path, args) -> dict:
    """Every file the loop publishes, read back from where the PFS keeps it: its bytes, and nothing else there."""
    names = app.loop_names(args.steps, args.every, args.files)
    return check(root, [(rel, tag, i, args.file_mib << 20) for rel, tag, i in names], {}, args.chunk_mib << 20)


def check_dcp(root: Path, args) -> dict:
    shards = [(app.shard_name(r), 0, r, args.shard_mib << 20) for r in range(args.ranks)]
    metadata = app.metadata_bytes(args.ranks, args.shard_mib << 20)
    return check(root, shards, {".metadata": metadata}, args.chunk_mib << 20)


def check(root: Path, stamped: list[tuple[str, int, int, int]], plain: dict[str, bytes], chunk: int) -> dict:
    """``stamped``: (name, tag, file, size) as checkpoint_app.py writes them in ``chunk`` writes;
    ``plain``: name -> its bytes. Which are whole and right, and what else is there."""
    base = app.base_bytes(chunk)
    bad = []
    for rel, tag, file, size in stamped:
        try:
            with open(root / rel, "rb") as f:
                if os.fstat(f.fileno()).st_size != size:
                    bad.append(f"{rel}: {os.fstat(f.fileno()).st_size} bytes, not {size}")
                    continue
                for index, off in enumerate(range(0, size, chunk)):
                    length = min(chunk, size - off)
                    if f.read(length) != app.expected_chunk(base, tag, file, index, length):
                        bad.append(f"{rel}: wrong bytes in [{off}, {off + length})")
                        break
        except OSError as exc:
            bad.append(f"{rel}: {exc.strerror}")
    for rel, data in plain.items():
        try:
            if (root / rel).read_bytes() != data:
                bad.append(f"{rel}: wrong bytes")
        except OSError as exc:
            bad.append(f"{rel}: {exc.strerror}")
    expected = {rel for rel, *_ in stamped} | set(plain)
    found = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()
    bad += [f"{rel}: left there, not published" for rel in sorted(found - expected)]
    total = len(expected)
    return {"files": total, "ok": total - len({b.split(":")[0] for b in bad} & expected), "problems": bad}


# --------------------------------------------------------------------------- the watcher


class Watcher(threading.Thread):
    """Polls a checkpoint directory of the PFS as another node would; counts what it should never see."""

    def __init__(self, directory: str, finals: dict[str, int], shards: list[str], period: float) -> None:
        super().__init__(name="watcher", daemon=True)
        self.directory, self.finals, self.shards, self.period = directory, finals, shards, period
        self.polls = self.metadata_early = self.short_seen = 0
        self.metadata_at: float | None = None
        self.t0 = time.perf_counter()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.period):
            self.poll()

    def poll(self) -> None:
        try:
            names = os.listdir(self.directory)
        except OSError:
            names = []
        sizes = {}
        for name in names:
            if name in self.finals:
                try:
                    sizes[name] = os.stat(os.path.join(self.directory, name)).st_size
                except OSError:
                    pass  # renamed or removed meanwhile
        self.polls += 1
        if ".metadata" in sizes:
            self.metadata_at = self.metadata_at or time.perf_counter() - self.t0
            if any(sizes.get(s, -1) < self.finals[s] for s in self.shards):
                self.metadata_early += 1
        if any(size < self.finals[name] for name, size in sizes.items()):
            self.short_seen += 1

    def stop(self) -> dict:
        self._done.set()
        self.join()
        return {"polls": self.polls, "metadata_while_a_shard_incomplete": self.metadata_early,
                "final_name_short": self.short_seen, "metadata_seen_after_s": self.metadata_at}


# --------------------------------------------------------------------------- running one command


def app_command(workload: str, directory: str, args) -> list[str]:
    common = ["--chunk-mib", str(args.chunk_mib)]
    if workload == "loop":
        return [sys.executable, APP, "loop", directory, "--steps", str(args.steps), "--step-ms", str(args.step_ms),
                "--every", str(args.every), "--files", str(args.files), "--file-mib", str(args.file_mib),
                *(["--busy"] if args.busy else []), *common]
    return [sys.executable, APP, "dcp", directory, "--ranks", str(args.ranks), "--shard-mib", str(args.shard_mib),
            *([] if args.sync else ["--no-sync"]), *common]


def direct_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_") and k != "LD_PRELOAD"}


def run(cmd: list[str], env: dict[str, str], log: Path, pfs_proc, timeout: float) -> dict:
    """One command: its wall time, the CPU of its process tree and of the emulated PFS, and under
    ``app`` the JSON line it printed (its own figures)."""
    pfs_cpu0 = cpu_of(pfs_proc)
    cpu0, t0 = children_cpu(), time.perf_counter()
    with open(log, "w") as err:
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, timeout=timeout,
                                  cwd=log.parent)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s; see {log}"}
    out = {"wall_s": time.perf_counter() - t0, "cpu_s": children_cpu() - cpu0, "pfs_cpu_s": cpu_of(pfs_proc) - pfs_cpu0}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        return {**out, "error": f"exit code {proc.returncode}; last lines of {log}:\n{tail}"}
    return {**out, "app": json.loads(lines[-1])}


def cpu_of(proc) -> float:
    if proc is None:
        return 0.0
    try:
        t = psutil.Process(proc.pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def monarch_config(work: Path, shm: Path, mount: str, ckpt: str, writeback: bool,
                   fsync: str | None = None) -> tuple[Path | None, str]:
    """A configuration for ``monarch run``, with write-back of ``ckpt`` if asked and this Monarch takes it:
    (its path or None, a line saying which)."""
    (work / "run").mkdir(exist_ok=True)
    (shm / "tier-ram").mkdir(exist_ok=True)  # Monarch uses bases that exist, never makes them
    config = {"dataset": {"roots": [os.path.join(mount, "data")]}, "run_base": str(work / "run"),
              "tiers": [{"name": "ram", "path": str(shm / "tier-ram"), "capacity": "4GiB", "keep": False}],
              "staging": {"share": False}, "report": str(work / "monarch-report.json")}
    if writeback:
        config["writeback"] = {"paths": [ckpt], **({"fsync": fsync} if fsync else {})}
    path = work / "monarch.yaml"
    note = (f"write-back of {ckpt} configured (writeback.paths, fsync: {fsync or 'default'})" if writeback else
            "write-back is not configured (--no-writeback): the monarch column passes the writes through")
    for _ in range(2):
        path.write_text("# written by scripts/writeback/bench_checkpoint.py\n" + json.dumps(config, indent=1) + "\n")
        proc = subprocess.run([sys.executable, "-m", "monarch", "check-config", str(path)], capture_output=True,
                              text=True, env=checkout_env(), timeout=120, cwd=REPO)
        if proc.returncode == 0:
            return path, note
        said = (proc.stderr.strip() or proc.stdout.strip())
        if NOT_CONFIGURED not in said or "writeback" not in config:
            return None, f"monarch check-config {path} failed (exit {proc.returncode}): {said}"
        del config["writeback"]
        note = ("write-back is not configured: this Monarch's configuration has no writeback key "
                f"(check-config: {NOT_CONFIGURED}): the monarch column passes the writes through")
    return None, note


# --------------------------------------------------------------------------- one mode


def run_mode(mode: str, args, pfs: SlowPFS | None, src: Path, shm: Path, work: Path, config: Path | None) -> dict:
    results: dict = {}
    for workload in args.workloads:
        if mode == "shm" and workload != "loop":
            continue
        where = (shm / "limit" if mode == "shm" else src / "ckpt" / mode) / workload  # what the PFS keeps
        seen = where if mode == "shm" else Path(pfs.mountpoint) / "ckpt" / mode / workload  # what the app names
        os.makedirs(seen, exist_ok=True)  # the job's checkpoint directory, made before it starts
        cmd = app_command(workload, str(seen), args)
        env = direct_env()
        if mode == "monarch":
            cmd = [sys.executable, "-m", "monarch", "run", "-c", str(config), "--no-progress",
                   "--report", str(work / f"report-{workload}.json"), "--", *cmd]
            env = checkout_env(MONARCH_JOB_ID=f"bench-checkpoint-{workload}-{os.getpid()}")
        if pfs is not None:
            pfs.reset_counters()
        print(f"{mode}: {workload} -> {seen}", flush=True)
        watcher = None
        if workload == "dcp":  # started with the command: its clock is the command's launch
            finals = {app.shard_name(r): args.shard_mib << 20 for r in range(args.ranks)}
            finals[".metadata"] = len(app.metadata_bytes(args.ranks, args.shard_mib << 20))
            watcher = Watcher(str(seen), finals, [app.shard_name(r) for r in range(args.ranks)], args.poll_ms / 1e3)
            watcher.start()
        r = run(cmd, env, work / f"{mode}-{workload}.log", pfs.proc if pfs else None, args.timeout)
        if watcher is not None:
            r["watcher"] = watcher.stop()
        if pfs is not None:
            c = pfs.counters()
            r["pfs"] = {k: c[k] for k in ("bytes_written", "writes", "opens", "creates", "renames", "fsyncs")}
        if "error" not in r and r["app"]["shim"] != (mode == "monarch"):
            r["error"] = ("Monarch's shim was not in the application under monarch run: the figures would be "
                          "direct's" if mode == "monarch" else "Monarch's shim was in a direct run")
        r["check"] = check_loop(where, args) if workload == "loop" else check_dcp(where, args)
        shutil.rmtree(where, ignore_errors=True)
        results[workload] = r
    return results


# --------------------------------------------------------------------------- the tables


def row(name: str, values: dict, fmt: str, modes: list[str], ratio: bool = True, unit: str = "") -> str:
    cells = [f"{format(values[m], fmt) + unit if values.get(m) is not None else '-':>12}" for m in modes]
    d, m = values.get("direct"), values.get("monarch")
    r = f"{m / d:.2f}x" if ratio and d and m is not None else "-"
    return f"  {name:<34}" + "".join(cells) + f"{r:>16}"


def checked(r: dict) -> str:
    c = r.get("check") or {}
    return f"{c.get('ok', 0)}/{c.get('files', 0)} {'OK' if c.get('files') and c['ok'] == c['files'] else 'WRONG'}"


def print_loop(results: dict, args) -> None:
    modes = [m for m in args.modes if "loop" in results.get(m, {})]
    runs = {m: results[m]["loop"] for m in modes}
    saved = args.files * (args.file_mib << 20) * (args.steps // args.every)
    print(f"\nloop: {args.steps} steps of {args.step_ms:g} ms ({'busy loop' if args.busy else 'sleep'}), a save every "
          f"{args.every}: {args.files} x {args.file_mib} MiB as NAME.tmp in {args.chunk_mib} MiB writes, "
          f"then os.replace; {saved / 2**20:.0f} MiB in all")
    print(f"  {'':<34}" + "".join(f"{m:>12}" for m in modes) + f"{'monarch/direct':>16}")
    blocking = {m: [s["blocking_s"] for s in r.get("app", {}).get("saves", [])] for m, r in runs.items()}
    print(row("save blocking, mean s", {m: statistics.mean(b) if b else None for m, b in blocking.items()}, ".3f",
              modes))
    print(row("save blocking, max s", {m: max(b) if b else None for m, b in blocking.items()}, ".3f", modes))
    print(row("job wall s (launch to exit)", {m: r.get("wall_s") for m, r in runs.items()}, ".2f", modes))
    print(row("job CPU s (its process tree)", {m: r.get("cpu_s") for m, r in runs.items()}, ".2f", modes))
    print(row("emulated PFS CPU s", {m: r.get("pfs_cpu_s") for m, r in runs.items() if m != "shm"}, ".2f", modes))
    ratio = {m: r["pfs"]["bytes_written"] / saved for m, r in runs.items() if "pfs" in r}
    print(row("PFS bytes written / checkpoints", ratio, ".2f", modes, ratio=False, unit="x"))
    print(row("PFS write calls", {m: r["pfs"]["writes"] for m, r in runs.items() if "pfs" in r}, "d", modes))
    print(f"  {'published files, every byte':<34}" + "".join(f"{checked(runs[m]):>12}" for m in modes))
    print_problems(runs, modes)
    pfs = ", ".join(f"{m} {ratio[m]:.2f}x" for m in modes if m in ratio)
    print("loop byte check: " + ", ".join(f"{m} {checked(runs[m])}" for m in modes)
          + f"; PFS bytes written / checkpoint bytes: {pfs}")


def print_problems(runs: dict, modes: list) -> None:
    """A mode's failure, and the first problems its byte check found."""
    for m in modes:
        if "error" in runs[m]:
            print(f"  {m}: FAILED: {runs[m]['error']}")
        for problem in runs[m]["check"]["problems"][:5]:
            print(f"  {m}: {problem}")


def print_dcp(results: dict, args) -> None:
    modes = [m for m in args.modes if "dcp" in results.get(m, {})]
    runs = {m: results[m]["dcp"] for m in modes}
    total = args.ranks * (args.shard_mib << 20)
    print(f"\ndcp: {args.ranks} writers x {args.shard_mib} MiB shard in {args.chunk_mib} MiB writes, a barrier, rank 0 "
          f".metadata; a watcher polls the PFS every {args.poll_ms:g} ms")
    print(f"  {'':<34}" + "".join(f"{m:>12}" for m in modes) + f"{'monarch/direct':>16}")
    print(row("shards written s (first to last)", {m: r["app"]["shards_s"] if "app" in r else None
                                                  for m, r in runs.items()}, ".3f", modes))
    print(row("job wall s (launch to exit)", {m: r.get("wall_s") for m, r in runs.items()}, ".2f", modes))
    print(row(".metadata seen, s after launch", {m: (r.get("watcher") or {}).get("metadata_seen_after_s")
                                         for m, r in runs.items()}, ".2f", modes))
    print(row("job CPU s (its process tree)", {m: r.get("cpu_s") for m, r in runs.items()}, ".2f", modes))
    print(row("emulated PFS CPU s", {m: r.get("pfs_cpu_s") for m, r in runs.items()}, ".2f", modes))
    print(row("PFS bytes written / checkpoint", {m: r["pfs"]["bytes_written"] / total for m, r in runs.items()
                                                 if "pfs" in r}, ".2f", modes, ratio=False, unit="x"))
    for key, name in (("polls", "watcher polls"), ("metadata_while_a_shard_incomplete", "(a) .metadata, a shard short"),
                      ("final_name_short", "(b) a final name, short")):
        print(row(name, {m: (r.get("watcher") or {}).get(key) for m, r in runs.items()}, "d", modes, ratio=False))
    print(f"  {'published files, every byte':<34}" + "".join(f"{checked(runs[m]):>12}" for m in modes))
    print_problems(runs, modes)


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    fresh_bytecode()
    on_pfs = bool({"direct", "monarch"} & set(args.modes))
    if on_pfs and pfs_unavailable("bench_checkpoint"):
        return 2
    work = Path(tempfile.mkdtemp(prefix="mbench-ckpt-", dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="mbench-ckpt-", dir="/dev/shm"))
    src = shm / "pfs-src"  # what the PFS keeps, in RAM: the emulator's cap, not a disk's write-back, sets the pace
    (src / "data").mkdir(parents=True)
    (src / "data" / "sample.bin").write_bytes(os.urandom(4096))  # the job's dataset root: monarch run wants one
    results: dict = {}
    note = None
    try:
        with (SlowPFS(src, work / "pfs", work / "pfs-counters.json", open_latency_ms=args.open_latency_ms,
                      writable=True, write_bandwidth_mbps=args.write_bandwidth) if on_pfs
              else contextlib.nullcontext()) as pfs:
            if pfs is not None:
                print(f"emulated PFS at {pfs.mountpoint}: writes capped at {args.write_bandwidth:g} MB/s in all, "
                      f"{args.open_latency_ms:g} ms per open, no page cache", flush=True)
            config = None
            if "monarch" in args.modes:
                ckpt = os.path.join(pfs.mountpoint, "ckpt")
                os.makedirs(ckpt, exist_ok=True)  # a write-back path exists before the job starts
                config, note = monarch_config(work, shm, pfs.mountpoint, ckpt, not args.no_writeback, args.fsync)
                print(f"monarch: {note}", flush=True)
                if config is None:
                    return 1
            for mode in args.modes:
                results[mode] = run_mode(mode, args, pfs if mode != "shm" else None, src, shm, work, config)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    if "loop" in args.workloads:
        print_loop(results, args)
    if "dcp" in args.workloads:
        print_dcp(results, args)
    write_json(args.json, {"config": vars(args), "monarch": note, "results": results})
    print(f"\nwrote {args.json}")
    failed = [f"{m} {w}" for m, per in results.items() for w, r in per.items()
              if "error" in r or r["check"]["problems"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
