"""A reader that hands every file to its parent through /dev/shm, as PyTorch's DataLoader workers
hand their batches over: ``python shm_reader.py ROOT --manifest M [--epochs 2] [--workers 2]``.

Each epoch a new pool of forked workers (its semaphores in /dev/shm) reads the files in a
shuffled order, a batch of BATCH files a worker at a time; each file's bytes go into a POSIX
shared memory segment of their own (so a few MiB of /dev/shm in use at once), its room
taken at once (posix_fallocate: a full /dev/shm is ENOSPC here, where a DataLoader would die of
SIGBUS), and the parent checks the bytes against the manifest's digest and unlinks it. Exit 0
when every file was right, 1 on a wrong byte or a full /dev/shm. Runs in the container's Python
with Monarch's dependencies (xxhash)."""

import argparse
import json
import multiprocessing
import os
import random
import sys
from multiprocessing import shared_memory

import xxhash

BATCH = 2  # files a worker hands over at once: at most workers x BATCH files in /dev/shm


def hand_over(path: str) -> tuple[str, int]:
    with open(path, "rb") as f:
        data = f.read()
    shm = shared_memory.SharedMemory(create=True, size=max(1, len(data)))
    try:
        os.posix_fallocate(shm._fd, 0, shm.size)
        shm.buf[:len(data)] = data
        return shm.name, len(data)
    except OSError:
        shm.unlink()
        raise
    finally:
        shm.close()


def read_chunk(paths: list[str]) -> list[tuple[str, str, int]]:
    return [(p, *hand_over(p)) for p in paths]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("--manifest", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    with open(args.manifest) as f:
        files = json.load(f)["files"]
    rels = sorted(files)
    bad = 0
    for epoch in range(args.epochs):
        random.Random(epoch).shuffle(rels)
        chunks = [[os.path.join(args.root, r) for r in rels[i:i + BATCH]] for i in range(0, len(rels), BATCH)]
        try:
            with multiprocessing.get_context("fork").Pool(args.workers) as pool:
                for i in range(0, len(chunks), args.workers):  # one batch a worker in flight
                    pending = [pool.apply_async(read_chunk, (c,)) for c in chunks[i:i + args.workers]]
                    for handed in pending:
                        for path, name, size in handed.get():
                            shm = shared_memory.SharedMemory(name=name)
                            data = bytes(shm.buf[:size])
                            shm.close()
                            shm.unlink()
                            want = files[os.path.relpath(path, args.root)]
                            if size != want["size"] or xxhash.xxh64_hexdigest(data) != want["xxh64"]:
                                bad += 1
        except OSError as e:
            print(f"shm_reader: /dev/shm: {e}", file=sys.stderr)
            return 1
        print(f"epoch {epoch}: {len(rels)} files" + (f", {bad} DIGEST MISMATCHES" if bad else ""), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
