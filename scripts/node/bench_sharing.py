#!/usr/bin/env python3
"""Sharing benchmark: N concurrent jobs of one user over one dataset, then one later job, shared and not.

A hyper-parameter sweep packs N one-GPU jobs of one user on a node, all reading the same
dataset, and a chain's next job reads it again. For each N (default 1, 2, 4) and each mode

  shared   staging.share: true (the shipped default), staging.linger 600 s
  private  staging.share: false: every job stages its own copies

it starts N ``monarch run``s at once (each its own run identity, MONARCH_JOB_ID
sweep-1..N, each reading the dataset with forked workers for some epochs), waits for all,
then runs one later job of the same dataset, and prints

  - the PFS bytes the wave read / dataset (the emulated PFS's own count),
  - the RAM the tier in /dev/shm held at its peak during the wave / dataset (sampled),
  - the PFS bytes the later job read / dataset,
  - each job's epoch times, and the shared jobs' later epochs against the private ones'.

The jobs of a wave meet after their first epoch (a barrier, in both modes) and read their
later epochs together: otherwise shared jobs, warm at the same moment, would read their
later epochs all at once while private ones, each staging at its own pace, would spread
theirs out, and the comparison would measure that overlap on a node of few cores rather
than what a copy costs to read.

Every job's reader checks every byte against the dataset's manifest; a mismatch or a
failed job is reported and makes the script exit 1. The shared sets are dropped between
measurements (``monarch cache drop``).

    python scripts/node/bench_sharing.py                 # 1500 files of ~64 KiB, 2 ms per open, 400 MB/s, N = 1,2,4
    python scripts/node/bench_sharing.py --jobs 4        # one wave size
    python scripts/node/bench_sharing.py --quick         # a smoke run

``--chain``: a chain of jobs over a dataset with one large file (staged by blocks) that
changes after the first job: job 1 reads it, the large file is rewritten (same size, other
bytes, a later mtime), then jobs 2 and 3 read it, each after the one before, shared and
private. Per job, side by side: the PFS bytes it read / dataset (the emulated PFS's count)
and its report's ``pfs.reads_of_dataset``. Every byte checked against the manifest, which
follows the rewrite.

    python scripts/node/bench_sharing.py --chain         # 300 files of ~64 KiB and one of 64 MiB, 3 jobs
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
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)

from benchkit.options import fresh_bytecode, parse_with_quick, ready_to_write, result_path  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402
from monarch.tools.workload import make_dataset  # noqa: E402

MODES = ("shared", "private")
BARRIER_SECONDS = 300  # the longest a job waits for the wave's others after its first epoch
# a job's reader: its first epoch, the barrier, its later epochs (monarch.tools.workload checks every byte)
JOB_READER = r"""
import json, os, sys, time
from dataclasses import asdict
from monarch.tools.workload import read_dataset
root, manifest, epochs, workers, barrier, n, me, out = sys.argv[1:9]
first = read_dataset(root, 1, int(workers), seed=0, manifest=manifest)
open(os.path.join(barrier, me), "w").close()
deadline = time.monotonic() + float(sys.argv[9])
while len(os.listdir(barrier)) < int(n) and time.monotonic() < deadline:
    time.sleep(0.01)
rest = read_dataset(root, int(epochs) - 1, int(workers), seed=1, manifest=manifest) if int(epochs) > 1 else []
with open(out, "w") as f:
    json.dump({"epochs": [asdict(r) for r in first + rest]}, f)
sys.exit(1 if any(r.mismatches for r in first + rest) else 0)
"""
SAMPLE_SECONDS = 0.1  # how often the RAM tier's bytes are summed during a wave


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1500)
    p.add_argument("--size", default="64KiB", help="file size (all alike)")
    p.add_argument("--jobs", default="1,2,4", help="wave sizes, comma-separated")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="forked readers per job")
    p.add_argument("--open-latency-ms", type=float, default=2.0)
    p.add_argument("--bandwidth", type=float, default=400.0, help="emulated PFS MB/s")
    p.add_argument("--dir", default=None, help="where the dataset and the bases go (default: a temporary directory)")
    p.add_argument("--repeats", type=int, default=1,
                   help="waves per N and mode, alternating which mode goes first; the summary takes each job's "
                        "median epochs over them and the worst PFS and RAM figures")
    p.add_argument("--chain", action="store_true",
                   help="a chain of jobs over a large file changed after the first (--files default 300)")
    p.add_argument("--large-mib", type=int, default=64, help="--chain: the large file's size")
    p.add_argument("--chain-jobs", type=int, default=3, help="--chain: jobs in the chain")
    p.add_argument("--json", default=None, help="default: results/bench_sharing.json (--chain: bench_sharing_chain.json)")
    args = parse_with_quick(p, argv, dict(files=150, size="16KiB", jobs="2", epochs=2, large_mib=24))
    if args.chain and "--files" not in (argv if argv is not None else sys.argv[1:]) and not args.quick:
        args.files = 300
    args.json = args.json or result_path("bench_sharing_chain.json" if args.chain else "bench_sharing.json")
    return args


class RamSampler:
    """The peak of what the files under ``root`` take (allocated blocks), sampled on a thread."""

    def __init__(self, root: str):
        self.root, self.peak, self._stop = root, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _held(self) -> int:
        total = 0
        pending = [self.root]
        while pending:
            try:
                with os.scandir(pending.pop()) as it:
                    for e in it:
                        try:
                            if e.is_dir(follow_symlinks=False):
                                pending.append(e.path)
                            elif e.is_file(follow_symlinks=False):
                                total += e.stat(follow_symlinks=False).st_blocks * 512
                        except OSError:
                            continue
            except OSError:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._held())
            self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self) -> "RamSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._held())


def write_config(work: str, root: str, mode: str) -> str:
    path = os.path.join(work, f"{mode}.yaml")
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{work}/run"
tiers:
  - {{name: ram, path: "/dev/shm{work}/ram", capacity: 4GiB}}
  - {{name: ssd, path: "{work}/ssd", capacity: 32GiB}}
staging: {{policy: read-ahead, share: {str(mode == 'shared').lower()}, linger: 600}}
""")
    for d in (f"{work}/run", f"/dev/shm{work}/ram", f"{work}/ssd"):
        os.makedirs(d, exist_ok=True)
    return path


def start_job(cfg: str, root: str, manifest: str, job_id: str, out: str, args, barrier: str, n: int) -> subprocess.Popen:
    env = checkout_env(MONARCH_JOB_ID=job_id, MONARCH_PROGRESS="0")
    cmd = [sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", out + ".report.json", "--",
           sys.executable, "-c", JOB_READER, root, manifest, str(args.epochs), str(args.workers), barrier, str(n),
           job_id, out, str(BARRIER_SECONDS)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, out: str, problems: list[str], name: str, files: int) -> list[float]:
    """The job's epoch times; a failed job, a wrong byte or a file not read is a problem."""
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        problems.append(f"{name}: exit {proc.returncode}: {stderr.strip().splitlines()[-1:]}")
        return []
    with open(out) as f:
        epochs = json.load(f)["epochs"]
    bad = sum(len(e["mismatches"]) for e in epochs) + sum(files - e["samples"] for e in epochs)
    if bad:
        problems.append(f"{name}: {bad} files read with wrong bytes or not read")
    return [e["seconds"] for e in epochs]


def measure(n: int, mode: str, work: str, root: str, manifest: str, pfs: SlowPFS, total: int, args,
            problems: list[str]) -> dict:
    cfg = write_config(work, root, mode)
    pfs.reset_counters()
    outs = [os.path.join(work, f"{mode}-{n}-{i}.json") for i in range(n)]
    barrier = tempfile.mkdtemp(prefix="barrier-", dir=work)
    with RamSampler(f"/dev/shm{work}/ram") as ram:
        procs = [start_job(cfg, root, manifest, f"sweep-{i + 1}", outs[i], args, barrier, n) for i in range(n)]
        epochs = [finish(p, o, problems, f"{mode} N={n} job {i + 1}", args.files) for i, (p, o) in enumerate(zip(procs, outs))]
    wave = pfs.counters()["bytes"]
    pfs.reset_counters()
    later_out = os.path.join(work, f"{mode}-{n}-later.json")
    later_epochs = finish(start_job(cfg, root, manifest, "later", later_out, args, tempfile.mkdtemp(dir=work), 1),
                          later_out, problems,
                          f"{mode} N={n} later job", args.files)
    later = pfs.counters()["bytes"]
    subprocess.run([sys.executable, "-m", "monarch", "cache", "drop", "-c", cfg], capture_output=True,
                   env=checkout_env(), check=False)
    return {"n": n, "mode": mode, "wave_pfs": wave / total, "ram_peak": ram.peak / total, "later_pfs": later / total,
            "epochs": epochs, "later_epochs": later_epochs}


def later_epochs_ratio(shared: dict, private: dict) -> list[float | None]:
    """Per job: the median of its epochs after the first (the copies all staged), shared
    against private (a median: an epoch of 0.1 s on a busy node varies by half)."""
    out = []
    for s, p in zip(shared["epochs"], private["epochs"]):
        out.append(round(statistics.median(s[1:]) / statistics.median(p[1:]), 3) if len(s) > 1 and len(p) > 1
                   else None)
    return out


def wave_later(row: dict) -> float:
    """The seconds of every job's epochs after the first, summed over the wave."""
    return sum(sum(e[1:]) for e in row["epochs"])


def main(argv=None) -> int:
    args = parse_args(argv)
    if pfs_unavailable("bench_sharing"):
        return 2
    fresh_bytecode()
    if args.chain:
        return chain_main(args)
    work = tempfile.mkdtemp(prefix="mbs-", dir=args.dir or "/tmp")
    rows = []
    problems: list[str] = []
    try:
        src, manifest = os.path.join(work, "src"), os.path.join(work, "manifest.json")
        entries = make_dataset(src, files=args.files, size=args.size, manifest=manifest, spread=0.0)
        total = sum(e["size"] for e in entries.values())
        with SlowPFS(src, os.path.join(work, "pfs"), os.path.join(work, "pfs.json"),
                     open_latency_ms=args.open_latency_ms, bandwidth_mbps=args.bandwidth) as pfs:
            for n in (int(x) for x in args.jobs.split(",")):
                for repeat in range(args.repeats):  # the modes in turn, so that a busier minute hits both
                    for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                        rows.append(measure(n, mode, work, pfs.mountpoint, manifest, pfs, total, args, problems))
                        print_row(rows[-1], args.epochs)
        print_summary(rows, args, total)
        write_figures(args, {"bytes": total, "workers": args.workers, "rows": rows}, problems)
    finally:
        shutil.rmtree(f"/dev/shm{work}", ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return said(problems)


def write_figures(args, figures: dict, problems: list[str]) -> None:
    """The run's settings, its figures and its problems, as JSON at ``--json``."""
    settings = {"files": args.files, "size": args.size, "open_latency_ms": args.open_latency_ms,
                "bandwidth_mbps": args.bandwidth, "epochs": args.epochs}
    ready_to_write(args.json).write_text(json.dumps({**settings, **figures, "problems": problems}, indent=1))
    print(f"figures: {args.json}")


def said(problems: list[str]) -> int:
    """Each problem on stderr; the exit code."""
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if problems else 0


def print_row(r: dict, epochs: int) -> None:
    times = "; ".join(" ".join(f"{t:.2f}" for t in e) for e in r["epochs"])
    print(f"N={r['n']} {r['mode']:<8} wave PFS {r['wave_pfs']:.2f}x  RAM peak {r['ram_peak']:.2f}x  "
          f"later job PFS {r['later_pfs']:.2f}x  epochs (s, per job): {times}", flush=True)


def combine(rows: list[dict]) -> list[dict]:
    """One row per (N, mode): the worst PFS and RAM figures of its waves, each job's epochs
    the median over the waves, epoch by epoch."""
    out: dict[tuple, dict] = {}
    for r in rows:
        out.setdefault((r["n"], r["mode"]), []).append(r)
    combined = []
    for (n, mode), runs in out.items():
        epochs = [[statistics.median(x) for x in zip(*(run["epochs"][i] for run in runs if len(run["epochs"]) > i
                                                       and run["epochs"][i]))]
                  for i in range(n)]
        combined.append({"n": n, "mode": mode, "waves": len(runs), "wave_pfs": max(r["wave_pfs"] for r in runs),
                         "ram_peak": max(r["ram_peak"] for r in runs), "later_pfs": max(r["later_pfs"] for r in runs),
                         "epochs": epochs})
    return combined


def print_summary(rows: list[dict], args, total: int) -> None:
    rows = combine(rows)
    print(f"\n{args.files} files of {args.size} ({total / 2**20:.1f} MiB), emulated PFS {args.open_latency_ms:g} ms "
          f"per open, {args.bandwidth:g} MB/s; {args.epochs} epochs, {args.workers} workers per job; "
          f"{args.repeats} wave(s) per N and mode")
    print(f"{'N':>2} {'mode':<8}{'wave PFS/ds':>12}{'RAM peak/ds':>12}{'later PFS/ds':>13}  later epochs shared/private")
    by = {(r["n"], r["mode"]): r for r in rows}
    for r in rows:
        ratio = ""
        if r["mode"] == "shared" and (r["n"], "private") in by:
            private = by[(r["n"], "private")]
            ratio = ", ".join("-" if x is None else f"{x:.2f}" for x in later_epochs_ratio(r, private))
            ratio += f" (the wave's sum: {wave_later(r) / max(wave_later(private), 1e-9):.2f})"
        print(f"{r['n']:>2} {r['mode']:<8}{r['wave_pfs']:>11.2f}x{r['ram_peak']:>11.2f}x{r['later_pfs']:>12.2f}x  {ratio}")


# -- --chain: a chain of jobs over a large file that changed after the first ----------------------
LARGE = "large/tokens.bin"  # the large file (staged by blocks: 16 MiB or more)


def rewrite_large(src: str, manifest: str, seed: int) -> None:
    """The large file rewritten in place: same size, other bytes, an mtime a second later; the
    manifest follows it."""
    import random
    from monarch.tools.workload import digest
    path = os.path.join(src, LARGE)
    size = os.path.getsize(path)
    data = random.Random(seed).randbytes(size)
    before = os.stat(path).st_mtime_ns
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(before + 10**9, before + 10**9))
    with open(manifest) as f:
        doc = json.load(f)
    doc["files"][LARGE] = {"size": size, "xxh64": digest(data)}
    doc["total_bytes"] = sum(e["size"] for e in doc["files"].values())
    with open(manifest, "w") as f:
        json.dump(doc, f)


def chain_job(cfg: str, root: str, manifest: str, job_id: str, out: str, args, pfs: SlowPFS, total: int,
              problems: list[str], name: str) -> dict:
    """One job of the chain, alone: the PFS bytes it read (emulated PFS's count, and its report's)."""
    pfs.reset_counters()
    finish(start_job(cfg, root, manifest, job_id, out, args, tempfile.mkdtemp(dir=os.path.dirname(out)), 1),
           out, problems, name, args.files + 1)
    read = pfs.counters()["bytes"]
    try:
        with open(out + ".report.json") as f:
            report = json.load(f)
    except (OSError, ValueError):
        report = {}
    pfs_report = (report.get("pfs") or {}).get("reads_of_dataset")
    large = next((c for c in report.get("size_classes") or [] if c["class"] == ">=16MiB"), {})
    return {"job": name, "pfs": read / total, "report_pfs": pfs_report,
            "large_not_staged": (large.get("not_staged") or {}).get("files"),
            "restaged": sum((t.get("shared") or {}).get("restaged_files", 0)
                            for n in report.get("nodes") or [] for t in (n or {}).get("tiers", []))}


def chain_main(args) -> int:
    work = tempfile.mkdtemp(prefix="mbs-", dir=args.dir or "/tmp")
    problems: list[str] = []
    rows: dict[str, list[dict]] = {}
    try:
        src, manifest = os.path.join(work, "src"), os.path.join(work, "manifest.json")
        with SlowPFS(_chain_dataset(src, manifest, args), os.path.join(work, "pfs"),
                     os.path.join(work, "pfs.json"), open_latency_ms=args.open_latency_ms,
                     bandwidth_mbps=args.bandwidth) as pfs:
            for mode in MODES:
                _chain_dataset(src, manifest, args)
                total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
                cfg = write_config(work, pfs.mountpoint, mode)
                rows[mode] = []
                for i in range(args.chain_jobs):
                    if i == 1:
                        rewrite_large(src, manifest, seed=7)
                    out = os.path.join(work, f"chain-{mode}-{i + 1}.json")
                    rows[mode].append(chain_job(cfg, pfs.mountpoint, manifest, f"chain-{mode}-{i + 1}", out, args,
                                                pfs, total, problems, f"{mode} job {i + 1}"))
                subprocess.run([sys.executable, "-m", "monarch", "cache", "drop", "-c", cfg], capture_output=True,
                               env=checkout_env(), check=False)
        print(f"{args.files} files of {args.size} and one of {args.large_mib} MiB ({total / 2**20:.1f} MiB), "
              f"emulated PFS {args.open_latency_ms:g} ms per open, {args.bandwidth:g} MB/s; {args.epochs} epochs, "
              f"{args.workers} workers per job; the large file rewritten after job 1")
        print("PFS read / dataset per job: the emulated PFS's count (the report's)")
        print(f"{'mode':<9}" + "".join(f"{'job ' + str(i + 1):>16}" for i in range(args.chain_jobs)))
        for mode, jobs in rows.items():
            print(f"{mode:<9}" + "".join(
                f"{j['pfs']:>8.2f}x ({j['report_pfs'] if j['report_pfs'] is None else format(j['report_pfs'], '.2f')})"
                .rjust(16) for j in jobs))
        for mode, jobs in rows.items():
            print(f"{mode}: large file 'not staged' in the report, per job: "
                  + ", ".join(str(j["large_not_staged"]) for j in jobs)
                  + "; files re-staged (changed since the set's copy): " + ", ".join(str(j["restaged"]) for j in jobs))
        write_figures(args, {"large_mib": args.large_mib, "bytes": total, "rows": rows}, problems)
    finally:
        shutil.rmtree(f"/dev/shm{work}", ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return said(problems)


def _chain_dataset(src: str, manifest: str, args) -> str:
    """The chain's dataset (written anew): ``--files`` small files and the large one, in the manifest."""
    import random
    from monarch.tools.workload import digest
    make_dataset(src, files=args.files, size=args.size, manifest=manifest, spread=0.0)
    data = random.Random(3).randbytes(args.large_mib << 20)
    os.makedirs(os.path.join(src, os.path.dirname(LARGE)), exist_ok=True)
    with open(os.path.join(src, LARGE), "wb") as f:
        f.write(data)
    with open(manifest) as f:
        doc = json.load(f)
    doc["files"][LARGE] = {"size": len(data), "xxh64": digest(data)}
    doc["total_bytes"] = sum(e["size"] for e in doc["files"].values())
    with open(manifest, "w") as f:
        json.dump(doc, f)
    return src


if __name__ == "__main__":
    sys.exit(main())
