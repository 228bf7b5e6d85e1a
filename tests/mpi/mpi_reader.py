"""MPI program for test_launch.py: every rank reads its share of a dataset and checks each
file's digest, then the ranks check each other with a collective and point-to-point.

    python mpi_reader.py ROOT MANIFEST [--epochs E]

Epoch e: rank r reads the sorted files i with i % size == (r + e) % size, so from the second
epoch on every rank reads files another rank read first. Then
- allreduce: the files, bytes and digest sum read by all ranks in the first epoch must be the
  manifest's (each file read exactly once);
- send/recv between rank pairs (0-1, 2-3, ...; an odd last rank pairs with itself): each
  sends its partner the bytes of the first file it read, the partner checks their digest.
Prints one record per rank ("mpi_reader k=v ... ;"); exits 0 only if every check on every rank passed.
"""

import argparse
import os
import sys

from mpi4py import MPI

from monarch.tools.workload import digest, load_manifest

MASK = (1 << 64) - 1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("manifest")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    manifest = load_manifest(args.manifest)
    names = sorted(manifest)
    bad, first = [], None
    files = nbytes = dsum = 0
    for epoch in range(args.epochs):
        for rel in names[(rank + epoch) % size::size]:
            with open(os.path.join(args.root, rel), "rb") as f:
                data = f.read()
            want = manifest[rel]
            if len(data) != want["size"] or digest(data) != want["xxh64"]:
                bad.append(f"{rel}: {len(data)} bytes xxh64 {digest(data)}, expected {want}")
            if epoch == 0:
                files, nbytes, dsum = files + 1, nbytes + len(data), (dsum + int(digest(data), 16)) & MASK
                if first is None:
                    first = (rel, data)
    # collective: the first epoch covered the dataset exactly once, across all ranks
    all_files = comm.allreduce(files, op=MPI.SUM)
    all_bytes = comm.allreduce(nbytes, op=MPI.SUM)
    all_dsum = sum(comm.allgather(dsum)) & MASK
    want_dsum = sum(int(e["xxh64"], 16) for e in manifest.values()) & MASK
    total = sum(e["size"] for e in manifest.values())
    if (all_files, all_bytes, all_dsum) != (len(manifest), total, want_dsum):
        bad.append(f"allreduce: {all_files} files {all_bytes} bytes digest sum {all_dsum:x}, expected "
                   f"{len(manifest)} files {total} bytes {want_dsum:x}")
    # point to point: pairs swap the first file each read, and check what they got
    partner = rank ^ 1 if (rank ^ 1) < size else rank
    got_rel, got = comm.sendrecv(first, dest=partner, source=partner)
    if digest(got) != manifest[got_rel]["xxh64"]:
        bad.append(f"from rank {partner}: {got_rel} has the wrong digest")
    ok = comm.allreduce(0 if bad else 1, op=MPI.MIN)
    print(f"mpi_reader rank={rank} size={size} files={files} bytes={nbytes} partner={partner} "
          f"bad={len(bad)} run={os.environ.get('MONARCH_RUN_ID')} ;", flush=True)
    for line in bad[:5]:
        print(f"mpi_reader rank={rank}: {line}", file=sys.stderr, flush=True)
    comm.Barrier()
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        code = main()
    except BaseException as e:  # one failing rank must not hang the others
        print(f"mpi_reader: {e!r}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(3)
    sys.exit(code)
