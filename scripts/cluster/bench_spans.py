#!/usr/bin/env python3
"""A large file's spans between two nodes, side by side: through the C data path and through
Python's protocol (the peer verb ``range``), what each costs per GiB, with no shim or stager
around them.

Two MPI ranks on this machine, launched as the daemons are (``daemon_launch``: Open MPI with
ULFM when installed, else MPICH), each a ``Cluster`` of the peer layer with its C data path.
Rank 1 holds a large file staged by blocks in a RAM directory (its copy and its map, every
block STAGED, offered to the C path as the block stager offers it) and serves Python's protocol
from the same copy. Rank 0 fetches every span of ``--span-mib`` once per pass into a memfd,
through the C path (``fetch_range`` with the file's version) or Python's protocol (without),
the two alternating pass by pass; every byte is compared with the source.

Prints per path: MB/s, and the CPU-seconds per GiB of each rank (user + system of the whole
process over the pass: the engine's and the data path's threads included).

    python3 scripts/cluster/bench_spans.py                   # 512 MiB in 8 MiB spans, 3 passes each
    python3 scripts/cluster/bench_spans.py --size-mib 1024 --passes 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

KEY = "0/tok.bin"
MTIME_NS = 1_700_000_000_000_000_000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--span-mib", type=int, default=8, help="bytes per request (the stager's run of blocks)")
    p.add_argument("--passes", type=int, default=3, help="passes of each path, alternating")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # one of the two ranks
    p.add_argument("--work", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def stage_copy(tier: str, data: bytes) -> str:
    """The file as the block stager leaves it in a tier: its copy and its map, every block STAGED."""
    from monarch.node.stage.block_map import (BLOCK, BLOCK_SHIFT, BLOCK_STAGED, BLOCKMAP_HEADER, BLOCKMAP_MAGIC,
                                              BLOCKMAP_VERSION)
    from monarch.node.tiers.tiers import BLOCKMAP_DIR, BLOCKS_DIR
    blocks = -(-len(data) // BLOCK)
    for sub, body in ((BLOCKS_DIR, data), (BLOCKMAP_DIR, BLOCKMAP_HEADER.pack(
            BLOCKMAP_MAGIC, BLOCKMAP_VERSION, BLOCK_SHIFT, len(data), MTIME_NS, blocks, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0)
            + bytes([BLOCK_STAGED]) * blocks)):
        path = os.path.join(tier, sub, KEY)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(body)
    return os.path.join(tier, BLOCKS_DIR, KEY)


def rank_main(args) -> int:
    import xxhash

    from monarch.cluster import Cluster, world
    cluster = Cluster.from_world(peer_timeout=60.0)
    comm = world.load_mpi().COMM_WORLD.Dup()  # this thread's barriers, apart from the engine's communicator
    size, span = args.size_mib << 20, args.span_mib << 20
    data = os.urandom(size) if cluster.node == 1 else None
    digest = comm.bcast(xxhash.xxh3_128_hexdigest(data) if data is not None else None, root=1)
    copy = None
    if cluster.node == 1:
        tier = os.path.join(args.work, "tier")
        copy = stage_copy(tier, data)
        if cluster.datapath is not None:
            cluster.datapath.tier(0, tier)
        cluster.offer_blocks(KEY, 0)
    cluster.start(lambda key: None, provide_range=lambda key, offset, length: copy if key == KEY else None)
    if cluster.datapath is None:
        print("RESULT " + json.dumps({"error": "the C data path did not start"}), flush=True)
    rows = []
    out = os.memfd_create("bench-spans", os.MFD_CLOEXEC)
    os.ftruncate(out, size)
    for p in range(2 * args.passes):
        way = ("c", "python")[p % 2]
        comm.Barrier()
        t0, c0 = time.perf_counter(), cpu()
        ok = True
        if cluster.node == 0:
            for offset in range(0, size, span):
                n = min(span, size - offset)
                version = (size, MTIME_NS) if way == "c" else None
                ok = ok and cluster.fetch_range(1, KEY, offset, n, out, 60.0, version) == n
            h = xxhash.xxh3_128()
            for at in range(0, size, 16 << 20):
                h.update(os.pread(out, 16 << 20, at))
            ok = ok and h.hexdigest() == digest
            os.ftruncate(out, 0)  # the next pass writes new pages, as a copy's first fill does
            os.ftruncate(out, size)
        seconds = time.perf_counter() - t0
        comm.Barrier()
        spent = cpu() - c0
        rows.append(comm.gather({"way": way, "seconds": seconds, "cpu": spent, "ok": ok}, root=0))
    counters = cluster.counters()
    cluster.finish(lambda: {})
    cluster.close()
    if cluster.node == 0:
        print("RESULT " + json.dumps({"rows": rows, "datapath": counters.get("datapath", {})}), flush=True)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rank:
        return rank_main(args)
    from monarch.cluster.world import daemon_launch
    launch = daemon_launch(2, one_host=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-spans-", dir="/dev/shm") as work:
            cmd = launch.argv + [sys.executable, __file__, "--rank", "--work", work, "--size-mib",
                                 str(args.size_mib), "--span-mib", str(args.span_mib), "--passes", str(args.passes)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env={**os.environ, **launch.env})
    finally:
        launch.close()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return 1
    result = json.loads(lines[-1][len("RESULT "):])
    if "error" in result:
        print(f"bench_spans: {result['error']}", file=sys.stderr)
        return 1
    gib = args.size_mib / 1024
    print(f"bench_spans: {args.size_mib} MiB in {args.span_mib} MiB spans, rank 0 fetches each from rank 1 "
          f"({launch.engine}); {args.passes} passes of each path, alternating")
    ok, best = True, {}
    for requester, owner in result["rows"]:
        way = requester["way"]
        ok = ok and requester["ok"]
        mbs = args.size_mib * 1.048576 / requester["seconds"]
        best.setdefault(way, []).append((mbs, requester["cpu"] / gib, owner["cpu"] / gib))
        print(f"  {way:6s}: {mbs:7.0f} MB/s; CPU-s per GiB: requester {requester['cpu'] / gib:5.2f}, owner "
              f"{owner['cpu'] / gib:5.2f}; bytes {'ok' if requester['ok'] else 'WRONG'}")
    if set(best) == {"c", "python"}:
        med = {way: sorted(rows)[len(rows) // 2] for way, rows in best.items()}
        print(f"  median pass: C {med['c'][0]:.0f} MB/s, Python {med['python'][0]:.0f} MB/s "
              f"({med['c'][0] / med['python'][0]:.1f}x); CPU per GiB (both ranks): C "
              f"{med['c'][1] + med['c'][2]:.2f} s, Python {med['python'][1] + med['python'][2]:.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
