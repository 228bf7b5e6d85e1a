#!/usr/bin/env python3
"""The applications scripts/writeback/bench_checkpoint.py times, run directly or under ``monarch run``
(they import nothing of Monarch's, so that both modes run the same program):

  loop  a training loop that saves a checkpoint every EVERY steps: each file written as NAME.tmp
        in CHUNK writes from one page-aligned buffer (a tensor's storage), then ``os.replace`` to
        NAME, as ``torch.save`` then a rename; no fsync (torch.save makes none)
  dcp   torch.distributed.checkpoint's pattern without torch: RANKS writer processes each write
        a shard under its final name (``__R_0.distcp``, as DCP's FileSystemWriter), fsynced before
        its close (DCP's default; ``--no-sync``: sync_files=False), a barrier, then rank 0 writes
        ``.metadata`` (as ``.metadata.tmp``, fsynced, then a rename, as DCP does)
  dcp-rank  one rank of ``dcp`` as a process of its own (one per node: scripts/writeback/
        bench_dcp_nodes.py): its shard, a barrier by files (each rank makes BARRIER/R, then waits
        for RANKS of them; the directory outside the checkpoint's), then rank 0's ``.metadata``

Every chunk is random bytes of a fixed seed under a stamp (save, file, chunk), so that
:func:`expected_chunk` gives back every byte a published file must hold. Each prints one JSON line.

    python3 scripts/writeback/checkpoint_app.py loop DIR --steps 200 --step-ms 80 --every 50 --files 2 --file-mib 256
    python3 scripts/writeback/checkpoint_app.py dcp DIR --ranks 4 --shard-mib 128
    python3 scripts/writeback/checkpoint_app.py dcp-rank DIR --rank 0 --ranks 4 --barrier BARRIER --shard-mib 128
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import random
import struct
import sys
import time

SEED = 20240611
STAMP = struct.Struct("<4Q")  # tag (the save's step; dcp: 0), file, chunk, magic
MAGIC = 0x6B70_7463_6B63_6568


def base_bytes(chunk: int) -> bytes:
    return random.Random(SEED).randbytes(chunk)


def expected_chunk(base: bytes, tag: int, file: int, index: int, length: int) -> bytes:
    """What chunk ``index`` (``length`` bytes) of file ``file`` of save ``tag`` holds."""
    return (STAMP.pack(tag, file, index, MAGIC) + base[STAMP.size:])[:length]


def write_file(path: str, buf: mmap.mmap, base: bytes, tag: int, file: int, size: int, sync: bool = False) -> None:
    """``size`` bytes in writes of the buffer's size (the last one shorter), each stamped first;
    ``sync``: fsynced before its close (DCP's FileSystemWriter, sync_files=True by default)."""
    chunk = len(buf)
    view = memoryview(buf)
    with open(path, "wb", buffering=0) as f:
        for index, off in enumerate(range(0, size, chunk)):
            buf[:STAMP.size] = expected_chunk(base, tag, file, index, STAMP.size)
            f.write(view[:min(chunk, size - off)])
        if sync:
            os.fsync(f.fileno())
    view.release()


def write_metadata(args) -> None:
    """Rank 0's ``.metadata``: as ``.metadata.tmp`` (fsynced, as DCP's default), then renamed."""
    tmp = os.path.join(args.dir, ".metadata.tmp")
    with open(tmp, "wb") as f:
        f.write(metadata_bytes(args.ranks, args.shard_mib << 20))
        if args.sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, os.path.join(args.dir, ".metadata"))


def new_buffer(base: bytes) -> mmap.mmap:
    buf = mmap.mmap(-1, len(base))  # page-aligned: each FUSE request a whole max_write
    buf.write(base)
    return buf


def shim_loaded() -> bool:
    """True when Monarch's shim is in this process (``monarch run``): the figures are Monarch's."""
    with open("/proc/self/maps") as f:
        return "monarch_shim" in f.read()


def compute(seconds: float, busy: bool) -> None:
    if not busy:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def loop_names(steps: int, every: int, files: int) -> list[tuple[str, int, int]]:
    """(relative name, tag, file) of every file the loop publishes."""
    return [(f"step-{s:06d}/model-{i}.pt", s, i) for s in range(every, steps + 1, every) for i in range(files)]


def run_loop(args) -> dict:
    base = base_bytes(args.chunk_mib << 20)
    buf = new_buffer(base)
    size = args.file_mib << 20
    saves = []
    t_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        compute(args.step_ms / 1e3, args.busy)
        if step % args.every:
            continue
        t0 = time.perf_counter()
        os.makedirs(os.path.join(args.dir, f"step-{step:06d}"), exist_ok=True)
        for i in range(args.files):
            final = os.path.join(args.dir, f"step-{step:06d}/model-{i}.pt")
            write_file(final + ".tmp", buf, base, step, i, size)
            os.replace(final + ".tmp", final)
        saves.append({"step": step, "blocking_s": time.perf_counter() - t0})
    return {"saves": saves, "inside_s": time.perf_counter() - t_start, "shim": shim_loaded()}


def shard_name(rank: int) -> str:
    return f"__{rank}_0.distcp"


def metadata_bytes(ranks: int, shard: int) -> bytes:
    return json.dumps({"shards": {shard_name(r): shard for r in range(ranks)}}, sort_keys=True).encode()


def dcp_rank(rank: int, args, base: bytes, barrier, out) -> None:
    buf = new_buffer(base)  # its own: a shared mapping would mix the ranks' stamps
    t0 = time.monotonic()  # one clock for every process
    write_file(os.path.join(args.dir, shard_name(rank)), buf, base, 0, rank, args.shard_mib << 20, args.sync)
    out.put((rank, t0, time.monotonic()))
    barrier.wait()
    if rank == 0:
        write_metadata(args)


def run_dcp(args) -> dict:
    os.makedirs(args.dir, exist_ok=True)
    ctx = multiprocessing.get_context("fork")  # as torch.multiprocessing's workers, under the shim alike
    barrier, out = ctx.Barrier(args.ranks), ctx.Queue()
    base = base_bytes(args.chunk_mib << 20)
    t0 = time.monotonic()
    procs = [ctx.Process(target=dcp_rank, args=(r, args, base, barrier, out)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    spans = {rank: (start, end) for rank, start, end in (out.get(timeout=3600) for _ in procs)}
    for p in procs:
        p.join()
    bad = [p.exitcode for p in procs if p.exitcode]
    return {"shard_write_s": [spans[r][1] - spans[r][0] for r in range(args.ranks)],
            "shards_s": max(e for _, e in spans.values()) - min(s for s, _ in spans.values()),
            "inside_s": time.monotonic() - t0, "shim": shim_loaded(), "failed_ranks": len(bad)}


def file_barrier(directory: str, rank: int, ranks: int, timeout: float) -> None:
    """Every rank's shard closed before any rank goes on: this rank's file made, then every rank's awaited."""
    open(os.path.join(directory, str(rank)), "w").close()
    deadline = time.monotonic() + timeout
    while len(os.listdir(directory)) < ranks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: {len(os.listdir(directory))} of {ranks} ranks at the barrier "
                               f"{directory} after {timeout:g} s")
        time.sleep(0.002)


def run_dcp_rank(args) -> dict:
    """One rank of ``dcp`` in this process: times on CLOCK_MONOTONIC, one clock for every process of the machine."""
    os.makedirs(args.dir, exist_ok=True)
    base = base_bytes(args.chunk_mib << 20)
    buf = new_buffer(base)
    t0 = time.monotonic()
    write_file(os.path.join(args.dir, shard_name(args.rank)), buf, base, 0, args.rank, args.shard_mib << 20,
               args.sync)
    t1 = time.monotonic()
    file_barrier(args.barrier, args.rank, args.ranks, args.barrier_timeout)
    t2 = time.monotonic()
    if args.rank == 0:
        write_metadata(args)
    t3 = time.monotonic()
    return {"rank": args.rank, "shard_write_s": t1 - t0, "shard_start": t0, "shard_end": t1, "barrier_s": t2 - t1,
            "metadata_s": t3 - t2, "inside_s": t3 - t0, "shim": shim_loaded(), "failed_ranks": 0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    loop = sub.add_parser("loop", help="a training loop saving a checkpoint every EVERY steps")
    loop.add_argument("dir")
    loop.add_argument("--steps", type=int, default=200)
    loop.add_argument("--step-ms", type=float, default=80.0)
    loop.add_argument("--busy", action="store_true", help="a step is a busy loop (default: a sleep, as a GPU step)")
    loop.add_argument("--every", type=int, default=50)
    loop.add_argument("--files", type=int, default=2)
    loop.add_argument("--file-mib", type=int, default=256)
    dcp = sub.add_parser("dcp", help="torch.distributed.checkpoint's pattern: shards, a barrier, .metadata")
    dcp.add_argument("dir")
    dcp.add_argument("--ranks", type=int, default=4)
    dcp.add_argument("--shard-mib", type=int, default=128)
    one = sub.add_parser("dcp-rank", help="one rank of dcp as its own process, a barrier by files in BARRIER")
    one.add_argument("dir")
    one.add_argument("--rank", type=int, required=True)
    one.add_argument("--ranks", type=int, default=4)
    one.add_argument("--barrier", required=True, help="a directory outside DIR, empty before the ranks start")
    one.add_argument("--barrier-timeout", type=float, default=600.0, help="seconds a rank waits there (default 600)")
    one.add_argument("--shard-mib", type=int, default=128)
    for s in (loop, dcp, one):
        s.add_argument("--chunk-mib", type=int, default=16, help="bytes per write call (default 16 MiB)")
    for s in (dcp, one):
        s.add_argument("--no-sync", dest="sync", action="store_false",
                       help="no fsync of the shards and .metadata (DCP's sync_files=False; default: fsynced, as DCP)")
    args = p.parse_args(argv)
    result = {"loop": run_loop, "dcp": run_dcp, "dcp-rank": run_dcp_rank}[args.what](args)
    print(json.dumps(result), flush=True)
    return 1 if result.get("failed_ranks") else 0


if __name__ == "__main__":
    sys.exit(main())
