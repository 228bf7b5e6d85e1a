"""The sharded reader of the cluster benchmark and tests: one per node, as DistributedSampler does.

Each epoch one global shuffle of the manifest's files (the same on every node: seeded by
the epoch), split into ``nodes`` disjoint shards; node ``node`` reads shard ``node``
(``order[node::nodes]``) with ``workers`` threads and checks every file's digest.

    python -m support.shard_reader ROOT MANIFEST --node K --nodes N [--epochs E] [--json OUT] [--hints]

``--hints``: the shards come from ``monarch.hints.DistributedHintedSampler`` (torch's
DistributedSampler's arithmetic, seeded by seed + epoch), which tells the node's daemon each
epoch's shard order before its first file and the progress as files are read (a bounded
number in flight, as a DataLoader's prefetching keeps).

Writes (``--json``) and prints one JSON object: the process's start time, each epoch's
seconds and end time (``time.time()``), files, bytes and mismatches. Exits 1 on any
mismatch, so a launcher's exit code says whether the bytes were right.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from monarch.tools.workload import digest, epoch_order, load_manifest


def shard(names: list[str], seed: int, epoch: int, node: int, nodes: int) -> list[str]:
    """Node ``node``'s files of epoch ``epoch``: its slice of the global shuffle."""
    return epoch_order(sorted(names), seed, epoch)[node::nodes]


def _check(root: str, manifest: dict, rel: str, compute: float = 0.0) -> tuple[int, str | None, float]:
    """Bytes read, a mismatch (or None), and the seconds the open took; then ``compute``
    seconds of a training step's time (sleeping)."""
    if compute:
        time.sleep(compute)
    t0 = time.perf_counter()
    with open(os.path.join(root, rel), "rb") as f:
        opened = time.perf_counter() - t0
        data = f.read()
    want = manifest[rel]
    if len(data) != want["size"] or digest(data) != want["xxh64"]:
        return len(data), f"{rel}: {len(data)} bytes xxh64 {digest(data)}, expected {want['size']} {want['xxh64']}", opened
    return len(data), None, opened


def _bounded(pool, fn, items, ahead: int):
    """``pool.map`` with at most ``ahead`` items in flight: the items are taken as reads end."""
    flight: deque = deque()
    for item in items:
        flight.append(pool.submit(fn, item))
        if len(flight) >= ahead:
            yield flight.popleft().result()
    while flight:
        yield flight.popleft().result()


def _held(path: str, limit: float = 600.0) -> None:
    """Until ``path`` exists (a benchmark made it once every node ended its first epoch), as
    the nodes of a data-parallel job, kept in step by their gradients' all-reduce, wait."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.002)


def read_shards(root: str, manifest_path: str, node: int, nodes: int, epochs: int = 3, workers: int = 4,
                seed: int = 0, progress: str | None = None, hints: bool = False, started_file: str | None = None,
                compute_ms: float = 0.0, hold: str | None = None) -> dict:
    started = time.time()
    manifest = load_manifest(manifest_path)
    names = list(manifest)
    out = {"node": node, "nodes": nodes, "started": started, "epochs": []}
    sampler = None
    if hints:
        from monarch.hints import DistributedHintedSampler
        ordered = sorted(names)
        sampler = DistributedHintedSampler(len(ordered), nodes, node, seed=seed, lag=2 * workers, every=8,
                                           path_of=lambda i: os.path.join(root, ordered[i]))
    if started_file:  # the reading starts (a benchmark samples the processes' CPU here)
        open(started_file, "w").close()
    with ThreadPoolExecutor(workers) as pool:
        for epoch in range(epochs):
            t0 = time.perf_counter()
            if sampler is not None:
                sampler.set_epoch(epoch)
                mine = [ordered[i] for i in sampler.sampler]  # the same order the sampler tells
                results = list(_bounded(pool, lambda i: _check(root, manifest, ordered[i], compute_ms / 1e3), sampler,
                                        2 * workers))
            else:
                mine = shard(names, seed, epoch, node, nodes)
                results = list(pool.map(lambda rel: _check(root, manifest, rel, compute_ms / 1e3), mine))
            seconds = time.perf_counter() - t0
            bad = [why for _, why, _ in results if why]
            out["epochs"].append({"epoch": epoch, "seconds": round(seconds, 4), "end": time.time(),
                                  "files": len(mine), "bytes": sum(n for n, _, _ in results),
                                  "slowest_open": round(max((t for _, _, t in results), default=0.0), 4),
                                  "mismatches": len(bad), "first_mismatches": bad[:3]})
            if progress:  # one line per epoch as it ends, for a test that acts mid-job
                with open(progress, "a") as f:
                    f.write(f"{epoch}\n")
            if hold and epoch == 0:
                _held(hold)
    if sampler is not None:
        sampler.hints.close()
    out["ok"] = all(e["mismatches"] == 0 for e in out["epochs"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("manifest")
    p.add_argument("--node", type=int, default=int(os.environ.get("MONARCH_NODE", "0")))
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--progress", default=None, help="append each finished epoch's number to this file")
    p.add_argument("--started", default=None, help="made once the manifest is read, as the reading starts")
    p.add_argument("--compute-ms", type=float, default=0.0, help="a training step's time per file (slept)")
    p.add_argument("--hints", action="store_true", help="tell the daemon each epoch's order (DistributedHintedSampler)")
    p.add_argument("--hold", default=None, help="after the first epoch, wait until this file exists (every node "
                   "ended it: a benchmark's window of the epochs after the first starts there)")
    a = p.parse_args(argv)
    result = read_shards(a.root, a.manifest, a.node, a.nodes, a.epochs, a.workers, a.seed, a.progress, a.hints,
                         a.started, a.compute_ms, a.hold)
    text = json.dumps(result)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    print(f"shard_reader {text}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
