#!/usr/bin/env python3
"""The C peer data path alone (monarch/cluster/datapath.c): what a remote file costs its two
ends per request and per file, with no shim, door or stager around it.

Two MPI ranks on this machine (``mpiexec -n 2``, started by this script): rank 1 offers
``--files`` staged files of ``--file-size`` from a RAM directory; rank 0 fetches each once with
``--threads`` threads, in batches of each ``--batches`` size (1: ``dp_fetch``, one request per
file; more: ``dp_fetch_many``, one request and one reply per batch), into a scratch memfd per
thread whose pages are written again (so a new page's cost, ``scripts/cluster/page_cost.c``, is left
out: what is measured is the protocol). Every byte is compared with the source.

Prints per batch size: files/s, and the CPU of each rank per file (user + system of the whole
process over the pass, its idle CPU over as long subtracted), the requests sent, and the
owner's and requester's sleeps per request.

    python scripts/cluster/bench_datapath.py                        # 20,000 x 16 KiB, 8 threads, batches 1,8,64
    python scripts/cluster/bench_datapath.py --files 4000 --batches 1,16 --threads 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=20000)
    p.add_argument("--file-size", default="16KiB")
    p.add_argument("--threads", type=int, default=8, help="fetching threads on rank 0")
    p.add_argument("--batches", default="1,8,64", help="files per request, comma-separated")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # one of the two ranks
    p.add_argument("--work", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fetch_pass(path, dp, keys: list[str], size: int, data: dict, threads: int, batch: int) -> bool:
    """Rank 0: every key once, ``batch`` per request, ``threads`` at once; True if every byte matched."""
    ok = [True] * threads

    def work(t: int) -> None:
        scratch = os.memfd_create("bench-datapath", os.MFD_CLOEXEC)
        fds = [os.memfd_create("bench-datapath", os.MFD_CLOEXEC) for _ in range(batch)] if batch > 1 else []
        try:
            mine = keys[t::threads]
            for at in range(0, len(mine), batch):
                group = mine[at:at + batch]
                if batch == 1:
                    got = [path.fetch(1, group[0], size, scratch, 10.0)]
                    outs = [scratch]
                    os.lseek(scratch, 0, os.SEEK_SET)
                else:
                    outs = fds[:len(group)]
                    got = path.fetch_many(1, [(k, size, fd) for k, fd in zip(group, outs)], 10.0)
                for key, n, fd in zip(group, got, outs):
                    if n != size or os.pread(fd, size, 0) != data[key]:
                        ok[t] = False
        finally:
            for fd in [scratch, *fds]:
                os.close(fd)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return all(ok)


def rank_main(args) -> int:
    from monarch.cluster import datapath as dp
    from monarch.cluster import world
    from monarch.tools.workload import parse_size
    MPI = world.load_mpi()
    comm = MPI.COMM_WORLD
    path = dp.DataPath.start(MPI, comm)
    if path is None:
        print(json.dumps({"error": "the C data path did not start (no MPI_THREAD_MULTIPLE, or not built)"}))
        return 1
    size = parse_size(args.file_size)
    keys = [f"0/d{i % 64:02d}/f{i:06d}.bin" for i in range(args.files)]
    data = {k: os.urandom(size) for k in keys} if comm.rank == 0 else None
    data = comm.bcast(data, root=0)
    if comm.rank == 1:
        tier = os.path.join(args.work, "tier")
        for k in keys:
            os.makedirs(os.path.dirname(os.path.join(tier, k)), exist_ok=True)
            with open(os.path.join(tier, k), "wb") as f:
                f.write(data[k])
        path.tier(0, tier)
        for k in keys:
            path.offer(k, 0)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        comm.Barrier()
        c0 = cpu()
        time.sleep(0.5)
        idle = (cpu() - c0) / 0.5  # per second: the path's own idle looks, and MPI's
        counts0 = path.counts()
        comm.Barrier()
        t0, c0 = time.perf_counter(), cpu()
        ok = fetch_pass(path, dp, keys, size, data, args.threads, batch) if comm.rank == 0 else True
        comm.Barrier()  # rank 1 answers meanwhile (its C thread); it waits here
        seconds = time.perf_counter() - t0
        spent = cpu() - c0 - idle * seconds
        counts = {k: v - counts0[k] for k, v in path.counts().items()}
        rows.append(comm.gather({"batch": batch, "seconds": seconds, "cpu": spent, "ok": ok, "counts": counts}, root=0))
    path.stop()
    if comm.rank == 0:
        print("RESULT " + json.dumps(rows), flush=True)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rank:
        return rank_main(args)
    from benchkit.cluster import mpiexec
    with tempfile.TemporaryDirectory(prefix="bench-datapath-", dir="/dev/shm") as work:
        cmd = [mpiexec("bench_datapath"), "-n", "2", sys.executable, __file__, "--rank", "--work", work,
               "--files", str(args.files), "--file-size", args.file_size, "--threads", str(args.threads),
               "--batches", args.batches]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return 1
    rows = json.loads(lines[-1][len("RESULT "):])
    print(f"bench_datapath: {args.files} x {args.file_size}, rank 0 fetches each once from rank 1 with "
          f"{args.threads} threads")
    ok = True
    for requester, owner in rows:
        n, b = args.files, requester["batch"]
        req = max(1, requester["counts"]["requests"])
        ok = ok and requester["ok"]
        print(f"  {b:3d} per request: {n / requester['seconds']:9,.0f} files/s; CPU per file: requester "
              f"{1e6 * requester['cpu'] / n:5.1f} us, owner {1e6 * owner['cpu'] / n:5.1f} us; "
              f"{requester['counts']['requests']} requests, sleeps per request: requester "
              f"{requester['counts']['waits'] / req:.2f}, owner {owner['counts']['idle_sleeps'] / req:.2f}; "
              f"bytes {'ok' if requester['ok'] else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
