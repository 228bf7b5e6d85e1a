"""A torchrun-style launch for test_launch.py: this parent starts WORKERS processes with
multiprocessing's ``spawn`` start method (a fresh interpreter each, as torchrun's agent
does), with RANK, LOCAL_RANK and WORLD_SIZE in their environment; each reads its share of
the dataset for EPOCHS epochs through the shim and checks every file's digest.

    python spawn_reader.py ROOT MANIFEST WORKERS EPOCHS

Exits 0 only if every worker read every byte right under the shim.
"""

import multiprocessing
import os
import sys

from monarch.tools.workload import digest, load_manifest


def worker(root: str, manifest_path: str, epochs: int, results) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    manifest = load_manifest(manifest_path)
    names = sorted(manifest)
    files = nbytes = 0
    bad = []
    if "libmonarch_shim" not in os.environ.get("LD_PRELOAD", ""):
        bad.append("the shim is not preloaded in the worker")
    for epoch in range(epochs):
        for rel in names[(rank + epoch) % world::world]:
            with open(os.path.join(root, rel), "rb") as f:
                data = f.read()
            if len(data) != manifest[rel]["size"] or digest(data) != manifest[rel]["xxh64"]:
                bad.append(rel)
            files, nbytes = files + 1, nbytes + len(data)
    results.put((rank, files, nbytes, bad, os.environ.get("MONARCH_RUN_ID")))


def main() -> int:
    root, manifest, workers, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = []
    for rank in range(workers):
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(workers))
        p = ctx.Process(target=worker, args=(root, manifest, epochs, results))
        p.start()
        procs.append(p)
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    ok = True
    for rank, files, nbytes, bad, run in sorted(got):
        print(f"spawn_reader rank={rank} files={files} bytes={nbytes} bad={len(bad)} run={run} ;", flush=True)
        ok = ok and not bad
    ok = ok and len(got) == workers and all(p.exitcode == 0 for p in procs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
