"""MPI program driven by test_cluster.py: each rank is one node with its own tier directory.

    mpiexec -n N python prog_cluster.py SCENARIO PFS_DIR WORK_DIR [CHUNK]

Each rank checks what it can see (checksums, exceptions, timings) and hands its findings to
``finish()``; node 0 checks the cluster-wide sums and prints one ``RESULT {json}`` line.
Any failed check raises, and an unhandled exception aborts the whole job.
"""

import hashlib
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from monarch.cluster import Cluster, abort_on_unhandled_exception, owner
from monarch.errors import PeerError

SLOW_SECONDS = 3.0


def walk(root):
    out = []
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            out.append((os.path.relpath(path, root), os.path.getsize(path)))
    return sorted(out)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class ToyDaemon:
    """Stages a key from the PFS into this node's tier once (single flight), like the daemon."""

    def __init__(self, pfs, tier):
        self.pfs, self.tier = pfs, tier
        self.pfs_reads = {}
        self.lock = threading.Lock()
        self.flights = {}

    def provide(self, key):
        if "deny" in key:
            return None
        if "boom" in key:
            raise RuntimeError("staging exploded")
        if "slow" in key:
            time.sleep(SLOW_SECONDS)
        with self.lock:
            flight = self.flights.setdefault(key, threading.Lock())
        with flight:
            dst = os.path.join(self.tier, key)
            if not os.path.exists(dst):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(os.path.join(self.pfs, key), dst + ".tmp")
                os.rename(dst + ".tmp", dst)
                with self.lock:
                    self.pfs_reads[key] = self.pfs_reads.get(key, 0) + 1
        return dst


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def fetch_checked(cluster, key, dest, pfs):
    n = cluster.fetch(cluster.owner(key), key, dest)
    check(n == os.path.getsize(os.path.join(pfs, key)), f"{key}: {n} bytes")
    check(digest(dest) == digest(os.path.join(pfs, key)), f"{key}: checksum differs")
    return n


def plain_keys(snapshot):
    return [k for k, _ in snapshot if not any(w in k for w in ("deny", "boom", "slow"))]


def scenario_fetch(cluster, daemon, snapshot, work, pfs, threads):
    """Fetch every key this node does not own; with threads > 1 each key twice at once."""
    me = cluster.node
    if me == cluster.nodes - 1:
        time.sleep(1.0)        # the others finish first: they must keep serving this node
    mine = [k for k in plain_keys(snapshot) if cluster.owner(k) != me]
    jobs = [(k, os.path.join(work, f"got{i}-{j}")) for i, k in enumerate(mine) for j in range(1 if threads == 1 else 2)]
    with ThreadPoolExecutor(threads) as pool:
        sizes = list(pool.map(lambda job: fetch_checked(cluster, job[0], job[1], pfs), jobs))
    return {"fetched": len(jobs), "bytes": sum(sizes)}


def scenario_refuse(cluster, daemon, snapshot, work, pfs, threads):
    seen = 0
    for key in [k for k, _ in snapshot if ("deny" in k or "boom" in k) and cluster.owner(k) != cluster.node]:
        try:
            cluster.fetch(cluster.owner(key), key, os.path.join(work, "refused"))
        except PeerError as exc:
            check("refused" in str(exc), f"{key}: unexpected error {exc}")
            seen += 1
        else:
            raise AssertionError(f"{key}: fetch should have been refused")
    # the owner is still fine afterwards
    out = scenario_fetch(cluster, daemon, snapshot, work, pfs, 1)
    out["refused"] = seen
    return out


def scenario_slow(cluster, daemon, snapshot, work, pfs, threads):
    timeouts = []
    for key in [k for k, _ in snapshot if "slow" in k and cluster.owner(k) != cluster.node]:
        t0 = time.monotonic()
        try:
            cluster.fetch(cluster.owner(key), key, os.path.join(work, "slow"))
        except PeerError as exc:
            elapsed = time.monotonic() - t0
            check("within" in str(exc), f"{key}: unexpected error {exc}")
            check(cluster.peer_timeout * 0.9 <= elapsed <= cluster.peer_timeout + 0.75,
                  f"{key}: PeerError after {elapsed:.2f}s, peer_timeout {cluster.peer_timeout}")
            timeouts.append(round(elapsed, 3))
        else:
            raise AssertionError(f"{key}: a slow provide() should time out")
        # a slow owner answers pings: it is usable again shortly
        deadline = time.monotonic() + 5
        while cluster.owner(key) in cluster.counters()["peers_down"]:
            check(time.monotonic() < deadline, "slow owner never came back")
            time.sleep(0.05)
    out = scenario_fetch(cluster, daemon, snapshot, work, pfs, 4)
    out["timeouts"] = timeouts
    time.sleep(SLOW_SECONDS)   # let abandoned replies drain before finish
    return out


SCENARIOS = {"fetch": (scenario_fetch, 1), "concurrent": (scenario_fetch, 8),
             "refuse": (scenario_refuse, 1), "slow": (scenario_slow, 1)}


def main():
    scenario, pfs, base = sys.argv[1:4]
    abort_on_unhandled_exception()
    cluster = Cluster.from_world(peer_timeout=1.0 if scenario == "slow" else 10.0)
    if len(sys.argv) > 4:
        cluster.chunk_size = int(sys.argv[4])
    me = cluster.node
    tier = os.path.join(base, f"node{me}", "tier")
    work = os.path.join(base, f"node{me}", "work")
    os.makedirs(work)
    daemon = ToyDaemon(pfs, tier)
    cluster.start(daemon.provide)          # started before share(), as the daemon does
    walks = []
    snapshot = cluster.share(lambda: walks.append(1) or walk(pfs))
    check(snapshot == walk(pfs), "snapshot differs from the PFS")
    check(len(walks) == (1 if me == 0 else 0), "only node 0 walks the PFS")
    owners = [cluster.owner(k) for k, _ in snapshot]
    check(owners == [owner(k, cluster.nodes) for k, _ in snapshot], "owner() differs from placement")
    fn, threads = SCENARIOS[scenario]
    t0 = time.monotonic()
    found = fn(cluster, daemon, snapshot, work, pfs, threads)
    seconds = time.monotonic() - t0
    # a callable: the files this node serves while waiting for the others count too
    nodes = cluster.finish(lambda: {"node": me, "found": found, "counters": cluster.counters(),
                                    "pfs_reads": daemon.pfs_reads, "seconds": seconds,
                                    "owners": hashlib.sha256(repr(owners).encode()).hexdigest()})
    if me == 0:
        check(len(nodes) == cluster.nodes and all(not s.get("missing") for s in nodes), f"missing nodes: {nodes}")
        check(len({s["owners"] for s in nodes}) == 1, "nodes disagree on owners")
        c = [s["counters"] for s in nodes]
        reads = {}
        for s in nodes:
            for k, v in s["pfs_reads"].items():
                reads[k] = reads.get(k, 0) + v
        result = {
            "nodes": cluster.nodes,
            "files_sent": sum(x["files_sent"] for x in c), "files_received": sum(x["files_received"] for x in c),
            "bytes_sent": sum(x["bytes_sent"] for x in c), "bytes_received": sum(x["bytes_received"] for x in c),
            "fetched": sum(s["found"]["fetched"] for s in nodes), "bytes": sum(s["found"]["bytes"] for s in nodes),
            "max_pfs_reads": max(reads.values(), default=0), "keys_staged": len(reads),
            "fetch_failures": [x["fetch_failures"] for x in c], "serve_failures": [x["serve_failures"] for x in c],
            "found": [s["found"] for s in nodes],
        }
        print("RESULT " + json.dumps(result), flush=True)
    cluster.close()


if __name__ == "__main__":
    main()
