#!/usr/bin/env python3
"""Large-file benchmark: one token file read at random through np.memmap, directly, under Monarch and from /dev/shm.

An LLM's pre-training reads windows of tokens at random from one large file: Megatron-style
through one ``np.memmap`` for the whole run, nanoGPT-style through a new ``np.memmap`` per step.
The file sits behind the emulated PFS (FUSE, page-cached as a PFS client is, 2 ms per open, a
bandwidth cap, its own byte count). Each case runs the same reader, side by side in one run:
directly on the PFS, under ``monarch run`` with a RAM tier that holds the file and one that holds
half of it, and over a copy in /dev/shm (the ceiling). The reader runs in a memory cgroup
(--cgroup-mib, 512) so that no page cache holds the file for it, as on a node whose memory is far
smaller than the data; the daemon's tier is outside it. Every window's sum is checked against
the source's.

    python3 scripts/large/bench_large_reads.py                 # 2 GiB, 400 MB/s x 2,000 steps and 50 MB/s x 1,000
    python3 scripts/large/bench_large_reads.py --bandwidths 400 --readers megatron --tiers full
    python3 scripts/large/bench_large_reads.py --bandwidths 400 --steps 500 --read-latency-ms 2
    python3 scripts/large/bench_large_reads.py --quick         # a smoke run (64 MiB)
    python3 scripts/large/bench_large_reads.py --size-gib 1 --bandwidths 400 --readers lmdb,sequential,weights

Besides the token windows (``megatron``, ``nanogpt``), scripts/large/large_readers.py's readers of one
file of the same size: ``lmdb`` (random gets of 64 KiB values, --gets of them), ``sequential``
(16 MiB read() calls), ``weights`` (a one-pass weights load), ``md5sum`` (stdio) and ``cat``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import REPO  # noqa: E402  (this checkout's monarch and tests/ first on the path)

from benchkit.options import parse_with_quick  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from large_readers import KINDS, READER as OTHER_READER, make_lmdb, md5_of  # noqa: E402
from benchkit.memory_cgroup import MemoryCgroup  # noqa: E402
from monarch.node.stage.read_pace import describe  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

WINDOW = 1025     # tokens (uint16) per window: a context of 1,024 and its next token
PER_STEP = 32     # windows per step (a batch)

READER = r"""
import json, os, resource, sys, time
import numpy as np
path, kind, plan = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
offsets, sums = plan["offsets"], plan["sums"]
steps = len(offsets) // %(per_step)d
arr = np.memmap(path, dtype=np.uint16, mode="r") if kind == "megatron" else None
t = [time.monotonic()]
bad = 0
for s in range(steps):
    a = arr if arr is not None else np.memmap(path, dtype=np.uint16, mode="r")
    for i in range(s * %(per_step)d, (s + 1) * %(per_step)d):
        o = int(offsets[i])
        bad += int(a[o:o + %(window)d].sum(dtype=np.int64)) != int(sums[i])
    if arr is None:
        del a
    t.append(time.monotonic())
q = max(1, steps // 4)
ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps({"first": t[1] - t[0], "total": t[-1] - t[0], "q1": q / (t[q] - t[0]),
                  "q4": q / (t[-1] - t[-1 - q]), "bad": bad, "windows": len(offsets),
                  "cpu": sum(r.ru_utime + r.ru_stime for r in ru)}))
""" % {"per_step": PER_STEP, "window": WINDOW}


def make_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk = 64 << 20
    with open(path, "wb") as f:
        for off in range(0, size, chunk):
            f.write(os.urandom(min(chunk, size - off)))


def make_plan(src: Path, steps: int, seed: int, out: Path) -> None:
    """The windows' offsets (seeded) and their sums, from the source file."""
    import numpy as np
    tokens = np.memmap(src, dtype=np.uint16, mode="r")
    rng = random.Random(seed)
    offsets = np.array([rng.randrange(0, len(tokens) - WINDOW) for _ in range(steps * PER_STEP)], dtype=np.int64)
    sums = np.array([int(tokens[o:o + WINDOW].sum(dtype=np.int64)) for o in offsets], dtype=np.int64)
    with open(out, "wb") as f:
        np.savez(f, offsets=offsets, sums=sums)


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def evict(path: str) -> None:
    """The PFS client's cached pages of ``path`` dropped: each case starts cold (else the case
    before, in the same memory cgroup, leaves up to the cgroup's worth of the file cached)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run(cmd: list[str], env: dict, cold: str | None = None) -> dict:
    """The reader's figures, and ``job_cpu``: every process the command ran, Monarch's daemon
    included (the emulated PFS is not: it runs on). ``cold``: a file evicted first."""
    if cold:
        evict(cold)
    t0, cpu0 = time.monotonic(), children_cpu()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"the reader failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall"] = time.monotonic() - t0
    out["job_cpu"] = children_cpu() - cpu0
    out["stderr"] = proc.stderr
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gib", type=float, default=2.0, help="the token file's size (default 2)")
    p.add_argument("--bandwidths", default="400,50", help="PFS bandwidths in MB/s (default 400,50)")
    p.add_argument("--steps", default="2000,1000", help="steps at each bandwidth (default 2000,1000)")
    p.add_argument("--readers", default="megatron,nanogpt")
    p.add_argument("--tiers", default="full,half", help="a RAM tier that holds the file, half of it")
    p.add_argument("--read-latency-ms", type=float, default=0.0,
                   help="the PFS's latency per read call, besides its bandwidth (default 0)")
    p.add_argument("--cgroup-mib", type=int, default=512, help="the reader's memory cgroup (default 512)")
    p.add_argument("--gets", type=int, default=4000, help="the lmdb reader's random gets (default 4000)")
    p.add_argument("--json", help="write the figures here")
    return parse_with_quick(p, argv, {"size_gib": 1 / 16, "bandwidths": "200", "steps": "40", "cgroup_mib": 128,
                                      "gets": 300})


def main(argv=None) -> int:
    args = parse_args(argv)
    if pfs_unavailable("bench_large_reads"):
        return 2
    size = int(args.size_gib * (1 << 30)) // 2 * 2
    bandwidths = [float(b) for b in args.bandwidths.split(",")]
    steps_of = dict(zip(bandwidths, [int(s) for s in args.steps.split(",")]))
    readers, tiers = args.readers.split(","), args.tiers.split(",")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-large-reads-") as tmp, \
            tempfile.TemporaryDirectory(prefix="bench-large-reads-", dir="/dev/shm") as shm:
        work = Path(tmp)
        src = work / "src" / "data" / "tokens.bin"
        make_file(src, size)
        ceiling = Path(shm) / "tokens.bin"
        shutil.copyfile(src, ceiling)
        reader = work / "reader.py"
        reader.write_text(READER)
        other = work / "other_reader.py"
        other.write_text(OTHER_READER)
        md5 = md5_of(src) if {"sequential", "weights", "md5sum", "cat"} & set(readers) else "-"
        if "lmdb" in readers:
            mdb, _ = make_lmdb(src.parent.parent / "lmdb", size)  # a root of its own: the tiers hold one file
            (Path(shm) / "lmdb").mkdir()
            shutil.copyfile(mdb, Path(shm) / "lmdb" / "data.mdb")
        (work / "run").mkdir()
        cgroup = MemoryCgroup(args.cgroup_mib << 20, "bench-large-reads")
        try:
            for bw in bandwidths:
                plan = work / f"plan-{bw:g}.npz"
                make_plan(src, steps_of[bw], 1, plan)
                with SlowPFS(src.parent.parent, work / f"pfs-{bw:g}", work / f"pfs-{bw:g}.json", open_latency_ms=2,
                             read_latency_ms=args.read_latency_ms, bandwidth_mbps=bw, page_cache=True) as pfs:
                    for kind in readers:
                        rel = "lmdb/data.mdb" if kind == "lmdb" else "data/tokens.bin"
                        path = os.path.join(pfs.mountpoint, rel)
                        size = os.path.getsize(src.parent.parent / rel)
                        if kind in KINDS:
                            steps = str(args.gets if kind == "lmdb" else 0)
                            cmd, ceiling_cmd = ([sys.executable, str(other), p, kind, steps, md5, str(Path(__file__).parent)]
                                                for p in (path, str(Path(shm) / rel if kind == "lmdb" else ceiling)))
                        else:
                            cmd, ceiling_cmd = ([sys.executable, str(reader), p, kind, str(plan)]
                                                for p in (path, str(ceiling)))
                        row = {"reader": kind, "bandwidth": bw, "steps": args.gets if kind == "lmdb" else steps_of[bw],
                               "read_latency_ms": args.read_latency_ms}
                        pfs.reset_counters()
                        row["direct"] = run(cgroup.wrap(cmd), env, path)
                        row["direct"]["pfs"] = pfs.counters()["bytes"] / size
                        if kind in ("sequential", "weights", "md5sum", "cat"):
                            row["steps"] = row["direct"]["windows"]  # (its read calls; md5sum, cat: one)
                        row["shm"] = run(cgroup.wrap(ceiling_cmd), env)
                        for tier in tiers:
                            base = Path(shm) / f"ram-{kind}-{bw:g}-{tier}"
                            base.mkdir()
                            config = work / f"{kind}-{bw:g}-{tier}.yaml"  # (the reader's directory is the root)
                            capacity = size + (64 << 20) if tier == "full" else size // 2
                            config.write_text(json.dumps({
                                "dataset": {"roots": [os.path.dirname(path)]}, "run_base": str(work / "run"),
                                "tiers": [{"name": "ram", "path": str(base), "capacity": capacity}]}))
                            report = work / f"report-{kind}-{bw:g}-{tier}.json"
                            pfs.reset_counters()
                            m = run([sys.executable, "-m", "monarch", "run", "-c", str(config), "--no-progress",
                                     "--report", str(report), "--", *cgroup.wrap(cmd)],
                                    dict(env, MONARCH_JOB_ID=f"large-{kind}-{bw:g}-{tier}-{os.getpid()}"), path)
                            if not report.exists():
                                raise SystemExit(f"monarch run wrote no report: Monarch was not active\n{m['stderr']}")
                            m["pfs"] = pfs.counters()["bytes"] / size
                            doc = json.loads(report.read_text())
                            m["blocks"] = doc.get("blocks")
                            m["pace"] = ((doc.get("nodes") or [{}])[0].get("staging") or {}).get("blocks", {}).get("pace")
                            row[tier] = m
                            shutil.rmtree(base, ignore_errors=True)
                        rows.append(row)
                        print_row(row, tiers)
        finally:
            cgroup.remove()
    print_targets(rows, tiers)
    print_other_targets(rows, tiers)
    if args.json:
        for row in rows:
            for case in row.values():
                if isinstance(case, dict):
                    case.pop("stderr", None)
        Path(args.json).write_text(json.dumps({"rows": rows, "args": vars(args), "size": size}, indent=2))
    return 0


def print_row(row: dict, tiers: list[str]) -> None:
    d, s = row["direct"], row["shm"]
    latency = f", {row['read_latency_ms']:g} ms per read call" if row["read_latency_ms"] else ""
    print(f"\n{row['reader']}, {row['bandwidth']:g} MB/s{latency}, {row['steps']} steps (steps/s: first quarter, last "
          f"quarter; PFS bytes / file, the emulator's count; CPU s: the reader's, the whole job's)")
    print(f"  {'case':<16}{'first step':>11}{'whole job':>11}{'x direct':>9}{'q1':>9}{'q4':>9}{'PFS':>7}"
          f"{'CPU s':>7}{'job CPU':>8}  windows")
    for name, c in [("direct", d), ("/dev/shm copy", s)] + [(f"monarch, {t}", row[t]) for t in tiers]:
        pfs = f"{c['pfs']:.2f}x" if "pfs" in c else "-"
        ok = "OK" if c["bad"] == 0 else f"{c['bad']} WRONG"
        print(f"  {name:<16}{c['first']:>10.2f}s{c['total']:>10.1f}s{c['total'] / d['total']:>8.2f}x"
              f"{c['q1']:>9.1f}{c['q4']:>9.1f}{pfs:>7}{c['cpu']:>7.1f}{c['job_cpu']:>8.1f}  {ok}")
    for t in tiers:
        b = row[t].get("blocks") or {}
        if b:
            r = b.get("read", {})
            print(f"  monarch, {t}: partly staged {b['partly_staged_bytes'] / 2**20:.0f} of "
                  f"{b['partly_staged_of_bytes'] / 2**20:.0f} MiB; {r.get('remapped_bytes', 0) / 2**20:.0f} MiB of "
                  f"mappings moved onto the copy, {r.get('opens', 0)} opens while staging")
        pace = row[t].get("pace")
        if pace:
            print(f"  monarch, {t}: the read-ahead at the end: {describe(pace)}, "
                  f"faults read {'around' if pace.get('readaround') else 'pages'}")


def print_other_targets(rows: list[dict], tiers: list[str]) -> None:
    """The large-file readers' own targets: never slower than direct, the PFS read once."""
    for row in rows:
        d = row["direct"]
        for t in tiers:
            m = row[t]
            if row["reader"] == "lmdb" and t == "half":
                checks = [("whole job <= 1.0x direct", m["total"] <= d["total"]),
                          ("last quarter >= 1.0x direct", m["q4"] >= d["q4"])]
            elif row["reader"] in ("sequential", "weights", "md5sum", "cat"):
                checks = [("PFS <= 1.05x the file", m["pfs"] <= 1.05), ("time <= direct's", m["total"] <= d["total"])]
            elif row["reader"] == "megatron" and row["bandwidth"] == 50 and t == "full":
                checks = [("first quarter >= 0.9x direct", m["q1"] >= 0.9 * d["q1"])]
            else:
                continue
            checks.append(("every read right", m["bad"] == 0 and d["bad"] == 0))
            said = "; ".join(f"{name}: {'PASS' if ok else 'FAIL'}" for name, ok in checks)
            print(f"  holes: {row['reader']}, {row['bandwidth']:g} MB/s, tier {t}: {said}")


def print_targets(rows: list[dict], tiers: list[str]) -> None:
    print("\ntargets (each case):")
    for row in rows:
        if row["reader"] in KINDS:
            continue
        d, s = row["direct"], row["shm"]
        for t in tiers:
            m = row[t]
            checks = [("first step <= direct + 0.1 s", m["first"] <= d["first"] + 0.1),
                      ("first quarter >= 0.8x direct", m["q1"] >= 0.8 * d["q1"]),
                      ("whole job <= 1.0x direct", m["total"] <= d["total"]),
                      ("every window right", m["bad"] == 0 and d["bad"] == 0)]
            if t == "full":
                checks += [("last quarter >= 0.9x /dev/shm", m["q4"] >= 0.9 * s["q4"]),
                           ("PFS <= 1.05x the file", m["pfs"] <= 1.05)]
            else:
                checks += [("last quarter >= 1.5x direct", m["q4"] >= 1.5 * d["q4"])]
            said = "; ".join(f"{name}: {'PASS' if ok else 'FAIL'}" for name, ok in checks)
            print(f"  {row['reader']}, {row['bandwidth']:g} MB/s, tier {t}: {said}")


if __name__ == "__main__":
    sys.exit(main())
