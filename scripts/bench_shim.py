#!/usr/bin/env python3
"""Shim micro-benchmark: what LD_PRELOAD of the Monarch shim costs per call.

Measured, each as the median of several interleaved runs (one fresh process per run):

  hit        open+read+close of small *staged* files through the shim: the app opens the
             dataset path, the shim opens the copy in the RAM tier (every open a tier hit,
             no daemon involved), against the app opening that same copy directly without
             the shim. The difference is the shim's added cost per open.
  pass-open  open+read+close of small files *outside* the dataset roots, with and without
             the shim: the pass-through overhead of a non-managed open.
  pass-read  many small pread calls on one fd outside the roots, with and without the
             shim: the pass-through overhead of the read wrappers (which count bytes).

Each is measured by a tiny C driver (the cost of the calls themselves) and by a Python
driver (what a Python data loader sees: open(), read(), close()).

    python scripts/bench_shim.py [--files 2000] [--size 4KiB] [--runs 7]
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # monarch from this checkout; test support (the emulated PFS)

from benchopts import parse_with_quick  # noqa: E402  (scripts/, beside this file)
from monarch import protocol  # noqa: E402
from monarch.node.snapshot import take_snapshot  # noqa: E402
from monarch.workload import parse_size  # noqa: E402

TIER_SLOT = protocol.tier_slot(0)

C_DRIVER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

int main(int argc, char **argv)
{
    /* files LIST PASSES | reads FILE CALLS BYTES: prints "<ns per op> <bytes> <checksum>" */
    static char buf[1 << 16];
    unsigned long long total = 0, sum = 0, ops = 0;
    if (argc == 4 && strcmp(argv[1], "files") == 0) {
        FILE *f = fopen(argv[2], "r");
        if (!f) { perror(argv[2]); return 2; }
        char **paths = NULL; size_t n = 0, cap = 0; char line[4096];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (n == cap) { cap = cap ? 2 * cap : 1024; paths = realloc(paths, cap * sizeof *paths); }
            paths[n++] = strdup(line);
        }
        fclose(f);
        int passes = atoi(argv[3]);
        double t0 = now();
        for (int p = 0; p < passes; p++)
            for (size_t i = 0; i < n; i++) {
                int fd = open(paths[i], O_RDONLY);
                if (fd < 0) { perror(paths[i]); return 2; }
                ssize_t r;
                while ((r = read(fd, buf, sizeof buf)) > 0) { total += r; sum += (unsigned char)buf[r - 1]; }
                close(fd);
                ops++;
            }
        double dt = now() - t0;
        printf("%.1f %llu %llu\n", dt * 1e9 / ops, total, sum);
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "reads") == 0) {
        int fd = open(argv[2], O_RDONLY);
        if (fd < 0) { perror(argv[2]); return 2; }
        long calls = atol(argv[3]), size = atol(argv[4]);
        off_t end = lseek(fd, 0, SEEK_END) - size, off = 0;
        double t0 = now();
        for (long i = 0; i < calls; i++) {
            ssize_t r = pread(fd, buf, size, off);
            if (r <= 0) { perror("pread"); return 2; }
            total += r; sum += (unsigned char)buf[0];
            off += size; if (off > end) off = 0;
            ops++;
        }
        double dt = now() - t0;
        close(fd);
        printf("%.1f %llu %llu\n", dt * 1e9 / ops, total, sum);
        return 0;
    }
    fprintf(stderr, "usage: driver files LIST PASSES | driver reads FILE CALLS BYTES\n");
    return 2;
}
"""

PY_DRIVER = r"""
import os, sys, time
mode = sys.argv[1]
if mode == "files":
    paths = open(sys.argv[2]).read().split()
    passes = int(sys.argv[3])
    total = s = 0
    t0 = time.perf_counter()
    for _ in range(passes):
        for p in paths:
            with open(p, "rb") as f:
                d = f.read()
            total += len(d); s += d[-1] if d else 0
    dt = time.perf_counter() - t0
    print(f"{dt * 1e9 / (passes * len(paths)):.1f} {total} {s}")
else:
    fd = os.open(sys.argv[2], os.O_RDONLY)
    calls, size = int(sys.argv[3]), int(sys.argv[4])
    end = os.fstat(fd).st_size - size
    total = s = off = 0
    pread = os.pread
    t0 = time.perf_counter()
    for _ in range(calls):
        d = pread(fd, size, off)
        total += len(d); s += d[0]
        off += size
        if off > end:
            off = 0
    dt = time.perf_counter() - t0
    print(f"{dt * 1e9 / calls:.1f} {total} {s}")
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=2000, help="small files per set (default 2000)")
    p.add_argument("--size", default="4KiB", help="size of each small file (default 4KiB)")
    p.add_argument("--passes", type=int, default=5, help="passes over the files per run (default 5)")
    p.add_argument("--reads", type=int, default=200_000, help="pread calls per run (default 200000)")
    p.add_argument("--read-size", type=int, default=64, help="bytes per pread (default 64)")
    p.add_argument("--runs", type=int, default=9, help="interleaved runs per measurement; the median is shown")
    p.add_argument("--json", default="bench_shim.json", help="where to write the figures")
    p.add_argument("--workdir", help="scratch directory (default: a new one in /dev/shm)")
    return parse_with_quick(p, argv, {"files": 50, "passes": 1, "reads": 1000, "runs": 1})


def make_files(root: Path, rels: list[str], size: int) -> None:
    for i, rel in enumerate(rels):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size - 1) + bytes([i % 251]))


def build_driver(work: Path) -> Path | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src, exe = work / "driver.c", work / "driver"
    src.write_text(C_DRIVER)
    subprocess.run([cc, "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    ns, rest = proc.stdout.split(maxsplit=1)
    return float(ns), rest.strip()


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        from monarch.shim.build import shim_library
        shim = str(shim_library())
    except Exception as exc:  # the C shim may not exist or not build here
        print(f"bench_shim: no shim to preload: {exc}", file=sys.stderr)
        return 2
    size = parse_size(args.size)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mshim-", dir="/dev/shm")).resolve()
    try:
        return _bench(args, shim, size, work)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _bench(args, shim: str, size: int, work: Path) -> int:
    rels = [f"d{i % 16:02d}/f{i:06d}.bin" for i in range(args.files)]
    pfs, tier, other = work / "pfs", work / "tier", work / "other"
    make_files(pfs, rels, size)
    staged = tier / "0"  # the key of root 0's files is "0/<rel>": staged at <tier>/0/<rel>
    shutil.copytree(pfs, staged)
    make_files(other, rels, size)
    big = other / "big.bin"
    big.write_bytes(os.urandom(8 << 20))
    counters = work / "counters"
    lists = {}
    for name, root in (("pfs", pfs), ("tier", staged), ("other", other)):
        lists[name] = work / f"{name}.list"
        lists[name].write_text("\n".join(str(root / r) for r in rels) + "\n")

    base_env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_") and k != "LD_PRELOAD"}
    index = work / "index"  # the snapshot index, as a daemon writes it (fstat and stat answers)
    take_snapshot((str(pfs),)).write_index(str(index))
    shim_env = dict(base_env, LD_PRELOAD=shim, MONARCH_ROOTS=protocol.format_roots([(0, str(pfs))]),
                    MONARCH_PROBE=protocol.format_probe([(TIER_SLOT, str(tier))]), MONARCH_COUNTERS=str(counters),
                    MONARCH_INDEX=str(index))
    shim_env.pop("MONARCH_SOCKET", None)  # every open is a tier hit: no daemon needed

    drivers = {"py": [sys.executable, "-c", PY_DRIVER]}
    exe = build_driver(work)
    if exe:
        drivers = {"c": [str(exe)], **drivers}
    else:
        print("no C compiler: measuring with the Python driver only")

    passes, reads = str(args.passes), [str(args.reads), str(args.read_size)]
    # name -> (argv tail, env); pairs below compare a "shim" case with its baseline
    cases = {
        "hit.shim": (["files", str(lists["pfs"]), passes], shim_env),
        "hit.direct": (["files", str(lists["tier"]), passes], base_env),
        "pass-open.shim": (["files", str(lists["other"]), passes], shim_env),
        "pass-open.direct": (["files", str(lists["other"]), passes], base_env),
        "pass-read.shim": (["reads", str(big), *reads], shim_env),
        "pass-read.direct": (["reads", str(big), *reads], base_env),
    }
    samples: dict[str, list[float]] = {f"{d}:{c}": [] for d in drivers for c in cases}
    outputs: dict[str, set[str]] = {k: set() for k in samples}
    protocol.create_counters(str(counters))
    for run in range(args.runs):
        for dname, dcmd in drivers.items():
            for cname, (tail, env) in cases.items():
                ns, out = run_once(dcmd + tail, env)
                samples[f"{dname}:{cname}"].append(ns)
                outputs[f"{dname}:{cname}"].add(out)
        print(f"run {run + 1}/{args.runs} done", flush=True)

    # Sanity: the same bytes either way, and every managed open was a tier hit.
    problems = []
    for d in drivers:
        for pair in ("hit", "pass-open", "pass-read"):
            if outputs[f"{d}:{pair}.shim"] != outputs[f"{d}:{pair}.direct"]:
                problems.append(f"{d} {pair}: different bytes with and without the shim")
    slots = protocol.read_counters(str(counters))
    hit_opens = len(drivers) * args.runs * args.passes * args.files
    if slots[TIER_SLOT][0] != hit_opens or slots[protocol.SLOT_PFS][0] != 0:
        problems.append(f"expected {hit_opens} tier hits and no PFS opens, the shim counted "
                        f"{slots[TIER_SLOT][0]} tier and {slots[protocol.SLOT_PFS][0]} PFS opens")
    expected_bytes = hit_opens * size
    if slots[TIER_SLOT][1] != expected_bytes:
        problems.append(f"expected {expected_bytes} bytes counted on the tier, the shim counted {slots[TIER_SLOT][1]}")

    med = {k: statistics.median(v) for k, v in samples.items()}
    figures = {}
    print()
    print(f"{args.files} files of {size} B, {args.passes} passes per run; {args.reads} preads of "
          f"{args.read_size} B; median of {args.runs} interleaved runs; shim {shim}")
    print("us per call: medians of the runs; added: median of the paired differences (shim - direct)")
    print(f"{'driver':>6} {'measurement':<34} {'direct us':>10} {'shim us':>10} {'added us':>9} {'overhead':>9}")
    labels = {"hit": "open+read+close, staged (tier hit)", "pass-open": "open+read+close, outside roots",
              "pass-read": f"pread {args.read_size} B, outside roots"}
    for d in drivers:
        for pair, label in labels.items():
            direct, shimmed = med[f"{d}:{pair}.direct"] / 1e3, med[f"{d}:{pair}.shim"] / 1e3
            # paired: each run measured both back to back, so the median of the differences
            # cancels the drift of a busy 2-core machine better than a difference of medians
            added = statistics.median(b - a for a, b in zip(samples[f"{d}:{pair}.direct"],
                                                            samples[f"{d}:{pair}.shim"])) / 1e3
            figures[f"{d}:{pair}"] = {"direct_us": direct, "shim_us": shimmed, "added_us": added,
                                      "overhead_pct": 100 * added / direct,
                                      "samples_ns": {"direct": samples[f"{d}:{pair}.direct"],
                                                     "shim": samples[f"{d}:{pair}.shim"]}}
            print(f"{d:>6} {label:<34} {direct:>10.3f} {shimmed:>10.3f} {added:>9.3f} {100 * added / direct:>8.1f}%")
    print(f"\nshim counters: tier slot {TIER_SLOT}: {slots[TIER_SLOT][0]} opens, {slots[TIER_SLOT][1]} bytes; "
          f"PFS slot: {slots[0][0]} opens")
    for p in problems:
        print(f"PROBLEM: {p}")
    Path(args.json).write_text(json.dumps({"config": vars(args), "shim": shim, "figures": figures,
                                           "counters": {"tier": slots[TIER_SLOT], "pfs": slots[0]},
                                           "problems": problems}, indent=1))
    print(f"wrote {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
