#!/usr/bin/env python3
"""Epoch benchmark: the same training-like workload read three ways, side by side.

  direct   straight from the emulated slow PFS (a FUSE mount, 2 ms per open by default)
  monarch  the same mount under ``monarch run`` (default configuration: read-ahead into a
           RAM tier with room for the dataset, unless --capacity says otherwise)
  ceiling  straight from a copy of the dataset in /dev/shm (what local RAM allows)

It prints each epoch's time and samples/s per mode; the first epoch (the cold path every
job pays) as its own figure, monarch against direct; the ratios over the steady-state
epochs (all but the first); and the bytes each mode read from the PFS as the emulator
counted them, against the dataset size. Several open latencies (``--open-latency-ms
2,50``) run one after the other on the same dataset, with a summary table at the end. It
writes the figures as JSON and a plot as PNG.

    python scripts/node/bench_epochs.py                      # ~3000 files of ~100 KiB, 3 epochs, 2 ms/open
    python scripts/node/bench_epochs.py --variant large      # 64 files of 16 MiB
    python scripts/node/bench_epochs.py --variant high-latency   # 1000 files, 20, 50 and 100 ms per open
    python scripts/node/bench_epochs.py --variant cold-path      # 800 x 64 KiB at 2, 20, 50, 200 ms per open
    python scripts/node/bench_epochs.py --capacity 0.5x --hints  # RAM tier of half the dataset, order hints
    python scripts/node/bench_epochs.py --client python      # monarch mode through support.pyshim
    python scripts/node/bench_epochs.py --quick              # a small smoke run
    python scripts/node/bench_epochs.py --variant compressible   # RAM tier of half the dataset, compression off vs zstd
    python scripts/node/bench_epochs.py --variant incompressible # the same with random bytes (stored raw)

``--client python`` runs the monarch mode with the C shim off (MONARCH_DISABLE=1) and the
workload opening files as the shim would, in Python, over the frame protocol
(tests/support/pyshim.py); it then also reports how each epoch's opens were served
(tier probe hit, staged by the daemon on a miss, PFS).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import REPO, checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)

from benchkit.options import fresh_bytecode, ready_to_write, result_path  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402
from monarch.tools.workload import make_dataset, parse_size  # noqa: E402

MODES = ("direct", "monarch", "zstd", "zstd-nocache", "ceiling")
# zstd: monarch with its RAM tier compressed (decoded files kept per --decoded-cache);
# zstd-nocache: the same with decoded_cache off (every open decompresses)
VARIANTS = {"small": dict(files=3000, size="100KiB", spread=0.5),
            "compressible": dict(files=400, size="256KiB", spread=0.3, content="compressible", capacity="0.5x",
                                 modes="monarch,zstd,zstd-nocache,ceiling"),
            "incompressible": dict(files=400, size="256KiB", spread=0.3, content="random", capacity="0.5x",
                                   modes="monarch,zstd,ceiling"),
            "large": dict(files=64, size="16MiB", spread=0.0),
            "high-latency": dict(files=1000, size="100KiB", spread=0.5, latencies="20,50,100", epochs=2),
            # the cold path at any latency: the emulated PFS at 400 MB/s, epoch 1 against
            # direct, the copies in flight Monarch's measure settled on and the PFS's own peak
            "cold-path": dict(files=800, size="64KiB", spread=0.0, latencies="2,20,50,200", epochs=2,
                              modes="direct,monarch", bandwidth=400.0)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=sorted(VARIANTS), default="small",
                   help="small: many ~100 KiB files (default); large: few 16 MiB files")
    p.add_argument("--files", type=int, help="number of files (overrides the variant)")
    p.add_argument("--size", help="mean file size, e.g. 100KiB (overrides the variant)")
    p.add_argument("--spread", type=float, help="log-normal spread of sizes (overrides the variant)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default 3; high-latency: 2)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--reader", choices=("python", "os", "mmap"), default="python")
    p.add_argument("--compute-ms", type=float, default=0.0, help="sleep per sample in the workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--open-latency-ms", default=None,
                   help="emulated PFS: ms per open, or several comma-separated (default 2; high-latency: 20,50,100)")
    p.add_argument("--read-latency-ms", type=float, default=0.0, help="emulated PFS: per read call")
    p.add_argument("--bandwidth", type=float, default=0.0, metavar="MBps", help="emulated PFS: cap (0 = none)")
    p.add_argument("--modes", default=None, help=f"comma-separated subset of {','.join(MODES)} "
                                                 "(default: direct,monarch,ceiling; compressible variants: monarch,zstd,ceiling)")
    p.add_argument("--content", choices=("random", "compressible", "mixed"), default=None,
                   help="file content (default random; compressible variants: see --variant)")
    p.add_argument("--compression", default="zstd", help="the zstd mode's tiers[].compression (zstd or auto)")
    p.add_argument("--decoded-cache", default=None,
                   help="the zstd mode's tiers[].decoded_cache: room (Monarch's default), off, a size, or a "
                        "multiple of the dataset like 1x")
    p.add_argument("--policy", default=None, help="Monarch staging.policy (default: Monarch's default, read-ahead)")
    p.add_argument("--threads", default=None, help="Monarch staging.threads (default: Monarch's default, auto)")
    p.add_argument("--capacity", help="Monarch RAM tier capacity, a size or a fraction of the dataset like 0.5x "
                                      "(default: room for the dataset)")
    p.add_argument("--hints", action="store_true", help="the workload tells Monarch each epoch's order (monarch.hints)")
    p.add_argument("--client", choices=("shim", "python"), default="shim",
                   help="monarch mode through the C shim (default) or support.pyshim")
    p.add_argument("--workdir", help="where the dataset and scratch go (default: a new temporary directory)")
    p.add_argument("--out", default=result_path("bench_epochs"),
                   help="prefix of the JSON and PNG written (default: results/bench_epochs of this checkout)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds allowed to each mode's run")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--quick", action="store_true", help="smoke run: 300 files of 32 KiB, 2 epochs")
    args = p.parse_args(argv)
    base = dict(VARIANTS[args.variant])
    if args.quick:
        base = dict(files=300, size="32KiB", spread=0.5, epochs=2)
    if args.epochs is None:
        args.epochs = base.get("epochs", 3)
    for key in ("files", "size", "spread"):
        if getattr(args, key) is None:
            setattr(args, key, base[key])
    args.content = args.content or base.get("content", "random")
    args.capacity = args.capacity or base.get("capacity")
    args.modes = args.modes or base.get("modes", "direct,monarch,ceiling")
    if not args.bandwidth:
        args.bandwidth = base.get("bandwidth", 0.0)
    text = args.open_latency_ms or base.get("latencies", "2")
    try:
        args.latencies = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        p.error(f"--open-latency-ms: expected milliseconds like 2 or 20,50,100, got {text!r}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = set(args.modes) - set(MODES)
    if bad:
        p.error(f"--modes: unknown {', '.join(sorted(bad))}; choose from {', '.join(MODES)}")
    return args


# --------------------------------------------------------------------------- running one mode


def workload_cmd(data_dir: str, manifest: Path, out_json: Path, args, reader: str | None = None,
                 hints: bool = False) -> list[str]:
    return [sys.executable, "-m", "monarch.tools.workload", "read", data_dir, "--epochs", str(args.epochs),
            "--workers", str(args.workers), "--seed", str(args.seed), "--reader", reader or args.reader,
            "--compute-ms", str(args.compute_ms), "--manifest", str(manifest), "--json", str(out_json),
            *(["--hints"] if hints else [])]


def child_env() -> dict[str, str]:
    env = checkout_env(tests=True)  # monarch from this checkout; support.pyshim for --client python
    env.pop("LD_PRELOAD", None)
    return env


def run_workload(cmd: list[str], out_json: Path, log_path: Path, timeout: float, extra_env=None) -> dict:
    """Run one mode's command; its per-epoch results, or the reason it failed."""
    t0 = time.perf_counter()
    with open(log_path, "w") as logf:
        try:
            proc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=child_env() | (extra_env or {}),
                                  timeout=timeout, cwd=REPO)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.perf_counter() - t0
    text = log_path.read_text(errors="replace")
    result = {"command": cmd, "returncode": rc, "wall_s": wall, "log": str(log_path)}
    if rc != 0 or not out_json.exists():
        why = f"timed out after {timeout:.0f} s" if rc is None else f"exit code {rc}"
        result["error"] = f"{why}; last lines of {log_path}:\n" + "\n".join(text.splitlines()[-15:])
        return result
    result["epochs"] = json.loads(out_json.read_text())["epochs"]
    return result


def monarch_config(path: Path, mount: str, work: Path, shm: Path, capacity: int, args, compression: str = "off",
                   decoded_cache: str | None = None) -> None:
    # JSON is YAML: no YAML writer needed, and paths with odd characters are quoted right.
    staging = {"share": False}  # each mode stages its own copies (a shared set would start the next one warm)
    if args.policy:
        staging["policy"] = args.policy
    if args.threads:
        staging["threads"] = args.threads if args.threads == "auto" else int(args.threads)
    config = {
        "dataset": {"roots": [mount]},
        "run_base": str(work / "run"),
        "tiers": [{"name": "ram", "path": str(shm / "tier-ram"), "capacity": f"{capacity}B", "keep": False,
                   "compression": compression}],
        "report": str(work / "monarch-report.json"),
    }
    if decoded_cache is not None:
        config["tiers"][0]["decoded_cache"] = decoded_cache
    if staging:
        config["staging"] = staging
    path.write_text("# written by scripts/node/bench_epochs.py\n" + json.dumps(config, indent=2) + "\n")
    for base in (work / "run", shm / "tier-ram"):  # Monarch uses bases that exist, never makes them
        base.mkdir(parents=True, exist_ok=True)


def check_config(path: Path) -> str | None:
    proc = subprocess.run([sys.executable, "-m", "monarch", "check-config", str(path)], capture_output=True,
                          text=True, env=child_env(), timeout=60, cwd=REPO)
    if proc.returncode != 0:
        return f"monarch check-config {path} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout}"
    return None


# --------------------------------------------------------------------------- figures


def steady(epochs: list[dict]) -> dict | None:
    """Aggregate throughput of the steady-state epochs (all but the first, if there are more)."""
    chosen = epochs[1:] if len(epochs) > 1 else epochs
    if not chosen:
        return None
    seconds = sum(e["seconds"] for e in chosen)
    samples = sum(e["samples"] for e in chosen)
    return {"epochs": [e["epoch"] for e in chosen], "seconds": seconds, "samples_per_s": samples / seconds}


def served_share(epoch: dict) -> str:
    """How the opens of one epoch were served: tier probe / daemon / PFS (pyshim), tier / PFS (C shim)."""
    how = epoch.get("served") or {}
    total = sum(how.values())
    if not total:
        return ""
    local = how.get("tier", 0) + how.get("daemon", 0)
    return (f"{100 * local / total:5.1f}% from a tier ({how.get('tier', 0)} probe hits, "
            f"{how.get('daemon', 0)} staged on a miss), {how.get('pfs', 0)} from the PFS")


def print_table(results: dict, dataset_bytes: int, args, latency: float) -> None:
    modes = [m for m in MODES if m in results]
    print()
    print(f"dataset: {args.files} files, {dataset_bytes / 1e6:.1f} MB; {args.epochs} epochs, "
          f"{args.workers} workers, reader {args.reader}; PFS: {latency:g} ms/open, "
          f"{args.read_latency_ms} ms/read, bandwidth {'unlimited' if not args.bandwidth else f'{args.bandwidth} MB/s'}")
    print(f"{'epoch':>5}  " + "  ".join(f"{m + ' s':>11} {m + ' smp/s':>14}" for m in modes))
    for e in range(args.epochs):
        cells = []
        for m in modes:
            ep = results[m].get("epochs") or []
            if e < len(ep):
                cells.append(f"{ep[e]['seconds']:>11.3f} {ep[e]['samples_per_s']:>14.1f}")
            else:
                cells.append(f"{'-':>11} {'-':>14}")
        print(f"{e:>5}  " + "  ".join(cells))
    print()
    for m in modes:
        r = results[m]
        pfs = r.get("pfs")
        pfs_txt = (f"PFS {pfs['bytes'] / 1e6:9.1f} MB = {pfs['bytes'] / dataset_bytes:5.2f} x dataset, "
                   f"{pfs['opens']:6d} opens, {pfs['reads']:7d} reads, peak {pfs.get('opening_peak', 0)} opens at once"
                   ) if pfs else "PFS not touched"
        if "error" in r:
            print(f"{m:>8}: FAILED: {r['error']}")
        s = r.get("steady")
        print(f"{m:>8}: steady {s['samples_per_s']:10.1f} samples/s; {pfs_txt}" if s else f"{m:>8}: {pfs_txt}")
        for ep in r.get("epochs") or []:
            share = served_share(ep)
            if share:
                print(f"{'':>10}epoch {ep['epoch']}: {share}")
    for name, value in results.get("ratios", {}).items():
        print(f"{name}: {value:.2f}")


def ratios(results: dict) -> dict:
    out = {}
    s = {m: results[m].get("steady") for m in MODES if m in results}
    first = {m: (results[m].get("epochs") or [None])[0] for m in MODES if m in results}
    if first.get("monarch") and first.get("direct"):
        out["epoch 1: monarch speed-up over direct (samples/s)"] = (
            first["monarch"]["samples_per_s"] / first["direct"]["samples_per_s"])
        out["launch to the end of epoch 1: direct / monarch (speed-up)"] = (
            to_first_epoch_end(results["direct"]) / to_first_epoch_end(results["monarch"]))
    if s.get("monarch") and s.get("direct"):
        out["steady: monarch speed-up over direct (samples/s)"] = s["monarch"]["samples_per_s"] / s["direct"]["samples_per_s"]
    if s.get("monarch") and s.get("ceiling"):
        out["steady: monarch / ceiling (fraction of RAM speed)"] = s["monarch"]["samples_per_s"] / s["ceiling"]["samples_per_s"]
    if s.get("zstd-nocache") and s.get("ceiling"):
        out["steady: zstd-nocache epoch time / ceiling epoch time"] = (
            s["ceiling"]["samples_per_s"] / s["zstd-nocache"]["samples_per_s"])
    if s.get("zstd") and s.get("ceiling"):
        out["steady: zstd epoch time / ceiling epoch time"] = s["ceiling"]["samples_per_s"] / s["zstd"]["samples_per_s"]
    if s.get("zstd") and s.get("monarch"):
        out["steady: zstd epoch time / monarch (compression off) epoch time"] = (
            s["monarch"]["samples_per_s"] / s["zstd"]["samples_per_s"])
    for m in ("monarch", "zstd"):
        tiers = (results.get(m, {}).get("report") or {}).get("tiers") or []
        if tiers:
            out[f"{m}: RAM tier logical / stored bytes"] = tiers[0]["ratio"]
    return out


def plot(runs: dict, dataset_bytes: int, args, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"direct": "tab:red", "monarch": "tab:blue", "zstd": "tab:purple", "zstd-nocache": "tab:pink",
              "ceiling": "tab:green"}
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4.2), squeeze=False)
    for ax, (latency, results) in zip(axes[0], runs.items()):
        modes = [m for m in MODES if m in results and results[m].get("epochs")]
        width = 0.8 / max(1, len(modes))
        for i, m in enumerate(modes):
            ep = results[m]["epochs"]
            xs = [e["epoch"] + (i - (len(modes) - 1) / 2) * width for e in ep]
            ax.bar(xs, [e["samples_per_s"] for e in ep], width, label=m, color=colors[m])
        ax.set_xlabel("epoch (0 = the cold first epoch)")
        ax.set_ylabel("samples/s (log scale)")
        ax.set_yscale("log")
        ax.set_xticks(range(args.epochs))
        ax.set_title(f"{latency:g} ms/open: {args.files} files ({dataset_bytes / 1e6:.0f} MB), {args.workers} workers")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    fresh_bytecode()
    if {"direct", "monarch", "zstd", "zstd-nocache"} & set(args.modes) and pfs_unavailable("bench_epochs", probe=False):
        return 2
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mbench-", dir="/tmp")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    shm = Path(tempfile.mkdtemp(prefix="mbench-", dir="/dev/shm"))
    src, manifest = work / "dataset", work / "dataset.manifest.json"
    out_json, out_png = ready_to_write(f"{args.out}.json"), ready_to_write(f"{args.out}.png")
    runs: dict[float, dict] = {}
    try:
        t0 = time.perf_counter()
        if manifest.exists() and src.is_dir():
            entries = json.loads(manifest.read_text())["files"]
            print(f"reusing the dataset in {src}")
        else:
            entries = make_dataset(src, args.files, args.size, args.spread, args.seed, manifest=manifest,
                                   content=args.content)
            print(f"made {len(entries)} files in {src} ({time.perf_counter() - t0:.1f} s)")
        dataset_bytes = sum(e["size"] for e in entries.values())
        args.files = len(entries)
        settle()

        ceiling = None
        if "ceiling" in args.modes:
            ram = shm / "dataset"
            shutil.copytree(src, ram)
            settle()
            print(f"ceiling: reading a RAM copy in {ram}", flush=True)
            ceiling = run_workload(workload_cmd(str(ram), manifest, work / "ceiling.json", args, reader="python"),
                                   work / "ceiling.json", work / "ceiling.log", args.timeout)
            shutil.rmtree(ram, ignore_errors=True)

        for latency in args.latencies:
            results: dict = {}
            if {"direct", "monarch", "zstd", "zstd-nocache"} & set(args.modes):
                with SlowPFS(src, work / "pfs", work / "pfs-counters.json", open_latency_ms=latency,
                             read_latency_ms=args.read_latency_ms, bandwidth_mbps=args.bandwidth) as pfs:
                    if "direct" in args.modes:
                        print(f"direct: reading the emulated PFS at {pfs.mountpoint}, {latency:g} ms/open", flush=True)
                        pfs.reset_counters()
                        results["direct"] = run_workload(
                            workload_cmd(pfs.mountpoint, manifest, work / "direct.json", args, reader="python"),
                            work / "direct.json", work / "direct.log", args.timeout)
                        results["direct"]["pfs"] = _pfs_totals(pfs.counters())
                    if "monarch" in args.modes:
                        results["monarch"] = run_monarch(pfs, manifest, work, shm, dataset_bytes, args)
                    if "zstd" in args.modes:
                        settle()
                        results["zstd"] = run_monarch(pfs, manifest, work, shm, dataset_bytes, args,
                                                      compression=args.compression, name="zstd",
                                                      decoded_cache=_decoded_cache(args.decoded_cache, dataset_bytes))
                    if "zstd-nocache" in args.modes:
                        settle()
                        results["zstd-nocache"] = run_monarch(pfs, manifest, work, shm, dataset_bytes, args,
                                                              compression=args.compression, name="zstd-nocache",
                                                              decoded_cache="off")
            if ceiling is not None:
                results["ceiling"] = ceiling
            for m in MODES:
                if results.get(m, {}).get("epochs"):
                    results[m]["steady"] = steady(results[m]["epochs"])
            results["ratios"] = ratios(results)
            print_table(results, dataset_bytes, args, latency)
            runs[latency] = results
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    print_summary(runs, dataset_bytes, args)
    summary = {"config": {k: v for k, v in vars(args).items()}, "dataset_bytes": dataset_bytes,
               "dataset_files": args.files, "runs": {str(k): v for k, v in runs.items()}}
    out_json.write_text(json.dumps(summary, indent=1, default=str))
    try:
        plot(runs, dataset_bytes, args, out_png)
        print(f"\nwrote {out_json} and {out_png}")
    except Exception as exc:  # a plot is a nicety: never lose the figures for it
        print(f"\nwrote {out_json}; no plot: {exc}")
    failed = [m for r in runs.values() for m in args.modes if "error" in r.get(m, {})]
    return 1 if failed else 0


def print_summary(runs: dict, dataset_bytes: int, args) -> None:
    """One line per open latency: the first epoch side by side, steady epochs, PFS bytes."""
    print()
    print(f"summary: {args.files} files ({dataset_bytes / 1e6:.1f} MB), {args.workers} workers, "
          f"monarch client {args.client}, capacity {args.capacity or 'the dataset'}"
          f"{', order hints' if args.hints else ''}, policy {args.policy or 'default'}")
    print("  (ep1 = the first epoch as the workload timed it; 'launch to ep1 end' adds everything before")
    print("   it and the tear-down after the last epoch: interpreter and daemon start-up, snapshot, report)")
    print(f"{'ms/open':>7} {'direct ep1 s':>12} {'monarch ep1 s':>13} {'ep1 speed-up':>12} "
          f"{'launch to ep1 end d/m s':>23} {'steady speed-up':>15} {'monarch PFS bytes':>17} {'ep1 from a tier':>15} "
          f"{'in flight: settled/peak':>23} {'PFS opens at once':>17}")
    for latency, r in runs.items():
        d = (r.get("direct", {}).get("epochs") or [None])[0]
        m = (r.get("monarch", {}).get("epochs") or [None])[0]
        rat = r.get("ratios", {})
        pfs = r.get("monarch", {}).get("pfs")
        how = (m or {}).get("served") or {}
        total = sum(how.values())
        share = f"{100 * (how.get('tier', 0) + how.get('daemon', 0)) / total:.1f}%" if total else "-"
        launch = "/".join(f"{to_first_epoch_end(r.get(mode, {})):.2f}" for mode in ("direct", "monarch"))
        flight = in_flight(r.get("monarch", {}))
        print(f"{latency:>7g} {d['seconds'] if d else float('nan'):>12.2f} {m['seconds'] if m else float('nan'):>13.2f} "
              f"{rat.get('epoch 1: monarch speed-up over direct (samples/s)', float('nan')):>12.2f} {launch:>23} "
              f"{rat.get('steady: monarch speed-up over direct (samples/s)', float('nan')):>15.2f} "
              f"{(pfs['bytes'] / dataset_bytes if pfs else float('nan')):>16.2f}x {share:>15} "
              f"{(f'{flight[0]}/{flight[1]}' if flight else '-'):>23} {(pfs or {}).get('opening_peak', '-'):>17}")


def in_flight(result: dict) -> tuple[int, int] | None:
    """The copies in flight toward the PFS that the front door's measure settled on and the
    most it reached (the report's nodes[].front_door.in_flight), or None."""
    for node in (result.get("report") or {}).get("nodes") or []:
        flight = (node.get("front_door") or {}).get("in_flight")
        if flight:
            return flight["limit"], flight["peak"]
    return None


def to_first_epoch_end(result: dict) -> float:
    """Seconds from launching the command to the end of its first epoch, tear-down included
    (the command's wall time less its later epochs): what the cold path costs a job."""
    epochs = result.get("epochs") or []
    if not epochs or "wall_s" not in result:
        return float("nan")
    return result["wall_s"] - sum(e["seconds"] for e in epochs[1:])


def settle() -> None:
    """Let the kernel write back what was just written: writeback of a freshly made dataset
    competes for the 2 cores with the first mode measured (it halved the ceiling's figures)."""
    os.sync()
    time.sleep(1.0)


def _decoded_cache(value: str | None, dataset_bytes: int) -> str | None:
    """--decoded-cache as the configuration writes it (a multiple of the dataset: bytes)."""
    if value and value.endswith("x"):
        return f"{int(dataset_bytes * float(value[:-1]))}B"
    return value


def _pfs_totals(counters: dict) -> dict:
    return {k: counters.get(k, 0) for k in ("opens", "reads", "bytes", "lookups", "readdirs", "opening_peak")}


def run_monarch(pfs: SlowPFS, manifest: Path, work: Path, shm: Path, dataset_bytes: int, args,
                compression: str = "off", name: str = "monarch", decoded_cache: str | None = None) -> dict:
    if args.capacity and args.capacity.endswith("x"):
        capacity = int(dataset_bytes * float(args.capacity[:-1]))
    else:
        capacity = parse_size(args.capacity) if args.capacity else int(dataset_bytes * 1.1) + (64 << 20)
    config = work / f"{name}.yaml"
    monarch_config(config, pfs.mountpoint, work, shm, capacity, args, compression, decoded_cache)
    problem = check_config(config)
    if problem:
        print(f"monarch: {problem}", flush=True)
        return {"error": problem}
    print(f"monarch: reading {pfs.mountpoint} under monarch run -c {config} (client {args.client})", flush=True)
    report_path = work / f"{name}-report.json"
    pfs.reset_counters()
    python_client = args.client == "python"
    cmd = [sys.executable, "-m", "monarch", "run", "-c", str(config), "--report", str(report_path), "--",
           *workload_cmd(pfs.mountpoint, manifest, work / f"{name}.json", args,
                         reader="support.pyshim:read_file" if python_client else None, hints=args.hints)]
    result = run_workload(cmd, work / f"{name}.json", work / f"{name}.log", args.timeout,
                          extra_env={"MONARCH_DISABLE": "1"} if python_client else None)
    result["pfs"] = _pfs_totals(pfs.counters())
    result["config"] = json.loads(config.read_text().split("\n", 1)[1])
    if report_path.exists():
        report = json.loads(report_path.read_text())
        result["report"] = {k: report.get(k) for k in ("opened_from", "pfs", "staging", "dataset", "tiers", "nodes")}
    return result


if __name__ == "__main__":
    sys.exit(main())
