#!/usr/bin/env python3
"""Shard benchmark: datasets of a few large files, larger than the node's tiers, over epochs.

Two readers behind the emulated PFS (FUSE, page-cached as a PFS client is, its own byte
count), each directly and under ``monarch run`` with a RAM tier of half the dataset, side by
side in one run:

- LMDB (the LMDBIO seed): one ``data.mdb`` of --lmdb-mib read by random gets of every record,
  in a new order each epoch, through LMDB's own mmap;
- webdataset-style tar shards of --shard-mib each, every epoch in a shuffled shard order,
  each shard streamed member by member (``tarfile`` "r|", as webdataset reads them).

Every value read is checked against the bytes it was written with. The reader runs in a
memory cgroup of a quarter of the dataset (root; else said), so that the page cache cannot
hold the dataset for direct reads. Monarch stages as much of the dataset as the tier holds
(by blocks), once; the rest is read as direct reads it, so the PFS serves about
tier share + epochs x (the rest as direct reads it).

    python3 scripts/large/bench_shards.py                   # LMDB 512 MiB, 4 shards of 256 MiB, 3 epochs
    python3 scripts/large/bench_shards.py --quick           # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)

from benchkit.options import parse_with_quick, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from benchkit.memory_cgroup import MemoryCgroup  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402

VALUE = 64 << 10  # an LMDB record's value
MEMBER = 1 << 20  # a tar member


def value_of(name: str, size: int) -> bytes:
    """The bytes a record or member named ``name`` was written with (regenerated to check)."""
    return random.Random(name).randbytes(size)


def make_lmdb(directory: Path, mib: int) -> int:
    import lmdb
    directory.mkdir(parents=True)
    records = (mib << 20) // (VALUE + 4096)
    env = lmdb.open(str(directory), map_size=(mib + 64) << 20)
    with env.begin(write=True) as txn:
        for i in range(records):
            key = f"{i:08d}"
            txn.put(key.encode(), value_of(key, VALUE))
    env.close()
    return records


def make_shards(directory: Path, shards: int, mib: int) -> list[str]:
    import io
    import tarfile
    directory.mkdir(parents=True)
    names = []
    for s in range(shards):
        name = f"shard-{s:04d}.tar"
        with tarfile.open(directory / name, "w") as tar:
            for m in range((mib << 20) // (MEMBER + 1024)):
                member = f"{s:04d}_{m:05d}.bin"
                data = value_of(member, MEMBER)
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        names.append(name)
    return names


READER = r"""
import json, os, random, sys, tarfile, time
sys.path.insert(0, sys.argv[1])
from bench_shards import value_of, VALUE, MEMBER
kind, root, epochs = sys.argv[2], sys.argv[3], int(sys.argv[4])
bad = n = 0
times = []
for epoch in range(epochs):
    t0 = time.monotonic()
    rng = random.Random(epoch)
    if kind == "lmdb":
        import lmdb
        env = lmdb.open(root, readonly=True, lock=False, readahead=False, max_readers=4)
        with env.begin() as txn:
            order = [f"{i:08d}".encode() for i in range(env.stat()["entries"])]
            rng.shuffle(order)
            for k in order:
                n += 1
                bad += txn.get(k) != value_of(k.decode(), VALUE)
        env.close()
    else:
        shards = sorted(os.listdir(root))
        rng.shuffle(shards)
        for shard in shards:
            with tarfile.open(os.path.join(root, shard), "r|") as tar:
                for member in tar:
                    n += 1
                    bad += tar.extractfile(member).read() != value_of(member.name, MEMBER)
    times.append(time.monotonic() - t0)
print(json.dumps({"bad": bad, "reads": n, "epochs": times}))
"""


def run_case(kind, root, args, pfs, cgroup, config=None, work=None):
    cmd = cgroup.wrap([sys.executable, "-c", READER, str(Path(__file__).parent), kind, root, str(args.epochs)])
    env = checkout_env(MONARCH_JOB_ID=f"shards-{kind}-{time.monotonic_ns()}")
    report = None
    if config is not None:
        report = work / f"report-{kind}.json"
        cmd = [sys.executable, "-m", "monarch", "run", "-c", str(config), "--no-progress", "--report", str(report),
               "--", *cmd]
    pfs.reset_counters()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{kind} reader failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out.update(seconds=seconds, pfs_bytes=pfs.counters()["bytes"])
    if report is not None:
        if not report.exists():
            raise SystemExit(f"monarch run wrote no report: Monarch was not active\n{proc.stderr}")
        out["blocks"] = json.loads(report.read_text()).get("blocks")
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lmdb-mib", type=int, default=512, help="size of the LMDB file (default 512)")
    p.add_argument("--shards", type=int, default=4, help="tar shards (default 4)")
    p.add_argument("--shard-mib", type=int, default=256, help="size of a shard (default 256)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--bandwidth", type=float, default=400, help="the PFS's MB/s (default 400)")
    p.add_argument("--kinds", default="lmdb,webdataset")
    p.add_argument("--json", help="write the figures here")
    return parse_with_quick(p, argv, {"lmdb_mib": 48, "shards": 2, "shard_mib": 24, "epochs": 2})


def main(argv=None) -> int:
    args = parse_args(argv)
    if pfs_unavailable("bench_shards"):
        return 2
    kinds = args.kinds.split(",")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as tmp, \
            tempfile.TemporaryDirectory(prefix="bench-shards-", dir="/dev/shm") as shm:
        work = Path(tmp)
        src = work / "src"
        sizes = {}
        if "lmdb" in kinds:
            make_lmdb(src / "lmdb", args.lmdb_mib)
            sizes["lmdb"] = sum(f.stat().st_size for f in (src / "lmdb").iterdir())
        if "webdataset" in kinds:
            make_shards(src / "webdataset", args.shards, args.shard_mib)
            sizes["webdataset"] = sum(f.stat().st_size for f in (src / "webdataset").iterdir())
        with SlowPFS(src, work / "pfs", work / "pfs.json", open_latency_ms=2, bandwidth_mbps=args.bandwidth,
                     page_cache=True) as pfs:
            for kind in kinds:
                size = sizes[kind]
                root = os.path.join(pfs.mountpoint, kind)
                cgroup = MemoryCgroup(max(size // 4, 96 << 20), "bench-shards")  # room for the interpreter itself
                try:
                    direct = run_case(kind, root, args, pfs, cgroup)
                    base = Path(shm, f"ram-{kind}")
                    base.mkdir()
                    (work / "run").mkdir(exist_ok=True)
                    config = work / f"{kind}.yaml"
                    config.write_text(json.dumps({
                        "dataset": {"roots": [root]}, "run_base": str(work / "run"),
                        "tiers": [{"name": "ram", "path": str(base), "capacity": size // 2}]}))
                    under = run_case(kind, root, args, pfs, cgroup, config, work)
                finally:
                    cgroup.remove()
                results[kind] = {"size": size, "direct": direct, "monarch": under}
    print(f"\n{args.epochs} epochs at {args.bandwidth:g} MB/s, RAM tier = half the dataset; PFS bytes / dataset "
          "(the emulator's count)")
    print(f"{'reader':<11}{'dataset':>10}  {'direct':>8}  {'monarch':>8}  {'bound':>8}  {'s direct':>9}  "
          f"{'s monarch':>9}  values")
    for kind, r in results.items():
        size, d, m = r["size"], r["direct"], r["monarch"]
        # the tier's half read once, the other half as direct reads it each epoch
        bound = 0.5 + 0.5 * d["pfs_bytes"] / size
        ok = "OK" if d["bad"] == m["bad"] == 0 else f"{d['bad'] + m['bad']} WRONG"
        print(f"{kind:<11}{size / 2**20:>8.0f} MiB  {d['pfs_bytes'] / size:>7.2f}x  {m['pfs_bytes'] / size:>7.2f}x  "
              f"{bound:>7.2f}x  {d['seconds']:>8.1f}  {m['seconds']:>9.1f}  {ok}")
        if m.get("blocks"):
            b = m["blocks"]
            print(f"{'':<11}monarch: {b['files']} files by blocks, {b['whole_files']} whole, "
                  f"{b['partly_staged_files']} partly ({b['partly_staged_bytes'] / 2**20:.0f} of "
                  f"{b['partly_staged_of_bytes'] / 2**20:.0f} MiB); read {b['read']['local_bytes'] / 2**20:.0f} MiB "
                  f"from staged blocks, {b['read']['pfs_bytes'] / 2**20:.0f} MiB from the PFS, "
                  f"{b['read']['remapped_bytes'] / 2**20:.0f} MiB of mappings moved onto the copy")
        print(f"{'':<11}within the bound: {'yes' if m['pfs_bytes'] / size <= 1.05 * bound else 'NO'} "
              f"(monarch <= 1.05x the bound)")
        print(f"{'':<11}epochs (s): direct {', '.join(f'{t:.1f}' for t in d['epochs'])}; "
              f"monarch {', '.join(f'{t:.1f}' for t in m['epochs'])}")
    write_json(args.json, {"results": results, "args": vars(args)}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
