#!/usr/bin/env python3
"""The least CPU a remote file can cost the two daemons on this machine (the peer path's floor).

Runs scripts/cluster/peer_floor.c (built against the MPI library mpi4py loads, started with its
mpiexec): two ranks of this host, an owner holding its files open and mapped in RAM, a
requester asking for them in batches and writing each into a kept mapping of a spare, with the
write lease and the times the lane must take; nothing of Monarch's (no names, index, shim,
Python). What it costs is what any design over MPI pays here before its own work: the emulated
network's copies (MPI's shared-memory transport copies each byte with the daemons' CPU; a real
interconnect's NIC would) and the wake-ups of threads that poll MPI (it offers nothing to sleep
on; 15-20 us each on this VM: scripts/cluster/wake_cost.c).

Two cases, each with its target beside it:
- hinted: 64 KiB files in batches of 16 and 64, flat out and at the pace of bench_cluster --hints
  at its target (``--hinted-rate``: 225 remote files a node an epoch, 1.15 x the 0.046 s epoch of
  the job whose nodes each hold the whole dataset), sleeping up to 0.5 ms (the lane's longest
  sleep) or, one message a batch, 20 ms between looks (fewer wake-ups than a lane with 13 ms of
  lead, 57 files of room, could afford: a bound, not a design);
- transparent: 16 KiB files one and four to a request at 20,000 a second (bench_peer's target),
  sleeping up to 0.5 ms (a reader waits on each).
Each line: the requester's and the owner's CPU and wake-ups per file, together, files a second,
and whether every file's bytes were the owner's.

    python scripts/cluster/bench_peer_floor.py
    python scripts/cluster/bench_peer_floor.py --files 10000 --hinted-rate 4250
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

from benchkit.options import parse_with_quick  # noqa: E402
from benchkit.cluster import mpiexec  # noqa: E402

LINE = re.compile(r"together\s+([\d.]+) us;\s+(\d+) files/s; (bytes OK|BYTES WRONG)")


def build(exe: Path) -> None:
    """peer_floor.c built against the libmpi mpi4py loads, with the mpi.h beside it."""
    from mpi4py import MPI  # noqa: F401  (loads the library loaded_libmpi looks for)
    from monarch.cluster.datapath import loaded_libmpi
    libmpi = loaded_libmpi()
    if libmpi is None:
        raise SystemExit("bench_peer_floor: no libmpi loaded by mpi4py (pip install mpich mpi4py)")
    include = libmpi.resolve().parent.parent / "include"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or not (include / "mpi.h").exists():
        raise SystemExit(f"bench_peer_floor: needs a C compiler and {include}/mpi.h")
    subprocess.run([cc, "-O2", f"-I{include}", "-o", str(exe), str(Path(__file__).with_name("peer_floor.c")), str(libmpi),
                    f"-Wl,-rpath,{libmpi.resolve().parent}"], check=True)


def run(exe: Path, layout: str, batch: int, size: int, files: int, rate: float, nap_us: int) -> tuple[float, bool]:
    cmd = [mpiexec("bench_peer_floor"), "-n", "2", str(exe), layout, str(batch), str(size), str(files), str(rate),
           str(nap_us)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if LINE.search(x)), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"bench_peer_floor: {' '.join(cmd)} failed ({proc.returncode})\n{proc.stdout}\n{proc.stderr}")
    pace = f"at {rate:,.0f}/s" if rate else "flat out"
    print(f"  {pace:>12}, sleeps up to {nap_us / 1000:g} ms: {line}", flush=True)
    m = LINE.search(line)
    return float(m.group(1)), m.group(3) == "bytes OK"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=40000, help="files fetched per line")
    p.add_argument("--hinted-rate", type=float, default=4250.0,
                   help="remote files a second a node's reader takes in bench_cluster --hints at its target")
    p.add_argument("--transparent-rate", type=float, default=20000.0, help="bench_peer's target, remote opens a second")
    args = parse_with_quick(p, argv, {"files": 2048})
    with tempfile.TemporaryDirectory(prefix="peer_floor.") as tmp:
        exe = Path(tmp) / "peer_floor"
        build(exe)
        ok = True
        print("hinted: 64 KiB files in batches (target: the daemons' CPU per remote file <= 15 us)")
        hinted = []
        for batch in (16, 64):
            for layout in ("packed", "direct"):
                # a message a file needs the owner's progress for each (MPI's rendezvous): sleeping 20 ms
                # between looks stalls it (a 64-file batch: 637 files/s, 1.5 ms of CPU a file)
                naps = (500, 20000) if layout == "packed" else (500,)
                for rate, nap in ((0, 500), *((args.hinted_rate, n) for n in naps)):
                    us, good = run(exe, layout, batch, 65536, args.files, rate, nap)
                    ok &= good
                    if rate:
                        hinted.append(us)
        print("transparent: 16 KiB files, a few to a request (target: requester + owner <= 40 us at 20,000/s)")
        transparent = []
        for batch in (1, 4):
            us, good = run(exe, "packed", batch, 16384, args.files, args.transparent_rate, 500)
            ok &= good
            transparent.append(us)
        print(f"least at the hinted pace: {min(hinted):.1f} us a remote 64 KiB file (target <= 15 us); "
              f"transparent at {args.transparent_rate:,.0f}/s: {min(transparent):.1f} us (target <= 40 us); "
              f"{'bytes OK' if ok else 'BYTES WRONG'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
