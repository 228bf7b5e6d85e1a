"""A dataset spread over the nodes' aggregate storage: each node holds ~1/3 of it,
the readers run the sharded pattern (one global shuffle per epoch, node k reads shard k),
digests checked by the reader, the PFS counted by the emulated PFS itself."""

import json
import os
import sys
import time

import pytest

from support.harness import TEST_NODES, load, monarch_env, sharded_config
from test_cluster_e2e import DaemonCluster, finish

pytestmark = pytest.mark.mpi


def shard_config(base, root, node_bytes, replicas=1):
    return sharded_config(base, root, node_bytes, TEST_NODES, name="shard.yaml", replicas=replicas)


def shard_readers(cluster, ds, nodes, epochs):
    import subprocess
    return [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cluster.cfg, "--", sys.executable, "-m",
                              "support.shard_reader", ds.root, ds.manifest, "--node", str(k), "--nodes",
                              str(nodes), "--epochs", str(epochs), "--workers", "4"],
                             env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for k in range(nodes)]


def test_sharded_dataset_over_the_nodes_storage_reads_the_pfs_once(dataset, short_tmp, slow_pfs):
    nodes, files = 4, 240
    ds = dataset(files=files, size="16KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=1)
    mounted = type(ds)(str(pfs.mountpoint), ds.manifest, ds.files, ds.total)
    cfg = shard_config(short_tmp, mounted.root, ds.allocated // 3)
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        outs = finish(shard_readers(cluster, mounted, nodes, epochs=3))  # exit 0: every digest right
    finally:
        assert cluster.stop(range(nodes)) == 0
    results = [json.loads(next(line for line in out.splitlines() if line.startswith("shard_reader "))[13:])
               for out in outs]
    assert sum(e["files"] for r in results for e in r["epochs"]) == 3 * files
    assert all(r["ok"] for r in results)
    counted = pfs.counters()
    # each byte once for the cluster (against 3x without Monarch: the shards move between nodes)
    assert ds.total <= counted["bytes"] <= 1.05 * ds.total
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_reporting"] == nodes
    owned = 0
    for node in rep["nodes"]:
        cl = node["cluster"]
        assert cl["mode"] == "shard"
        assert cl["owned_staged_files"] == cl["owned_files"] > 0  # each owner staged its whole share
        owned += cl["owned_files"]
        cache = cl["peer_cache"]
        assert cache["fetched"] + cache["transient"] > 0 and not cache["failures"]
    assert owned == files  # one owner per file
    summary = rep["cluster"]  # the report module combines the nodes' numbers
    assert summary["mode"] == "shard" and sum(r["owned_files"] for r in summary["per_node"]) == files
    assert sum(r["transient"] + r["cache_fetched"] for r in summary["per_node"]) > 0
    assert rep["opened_from"]["pfs"]["opens"] == 0
    # other nodes' files crossed through the C data path: fetched by the front doors themselves
    # (no Python on the requesting side), answered from C on the owning side
    nodes_report = {node["node"]: node for node in rep["nodes"]}
    lanes = {k: (n["front_door"]["peer_fetches"], n["peer"].get("datapath")) for k, n in nodes_report.items()}
    assert sum(fetched for fetched, _ in lanes.values()) > 0, lanes
    assert sum(dp["served_files"] for _, dp in lanes.values()) > 0, lanes
    # a peer area full of young copies: the door answers a memfd itself (no Python on either side),
    # counted as the cache's transient copies
    transient = {k: (n["front_door"]["peer_transient"], n["cluster"]["peer_cache"]["transient"])
                 for k, n in nodes_report.items()}
    assert sum(door for door, _ in transient.values()) > 0, transient
    assert all(door <= cache for door, cache in transient.values()), transient
    # each node's own files past the walk copied by its door's lane (no Python per file), and
    # only its own: the PFS read once above
    lane = {k: n["front_door"]["read_ahead"] for k, n in nodes_report.items()}
    assert sum(r["copies"] for r in lane.values()) > 0, lane
    assert all(r["copies"] <= nodes_report[k]["cluster"]["owned_files"] for k, r in lane.items()), lane


def test_readers_started_with_the_daemons_wait_for_them_and_read_the_pfs_once(dataset, short_tmp, slow_pfs):
    """The readers' `monarch run` come first: each waits for its node's standing daemon (a
    cluster job: its config has a peer section and MONARCH_NODE is set) and never starts a
    single-node daemon that would read the whole dataset behind the cluster's back."""
    nodes, files = 4, 160
    ds = dataset(files=files, size="16KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=1)
    mounted = type(ds)(str(pfs.mountpoint), ds.manifest, ds.files, ds.total)
    cfg = shard_config(short_tmp, mounted.root, ds.allocated // 3)
    holder = type("H", (), {"cfg": cfg})
    procs = shard_readers(holder, mounted, nodes, epochs=2)  # before mpiexec even starts
    time.sleep(2)  # the launchers are up and looking before any daemon is
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        outs = finish(procs)
    finally:
        assert cluster.stop(range(nodes)) == 0
    assert not any("Monarch is not active" in out for out in outs), outs
    assert ds.total <= pfs.counters()["bytes"] <= 1.05 * ds.total
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    # (a copy the peer lane removed for want of room after its path was answered would show here)
    assert rep["opened_from"]["pfs"]["opens"] == 0, [(n["node"], n.get("resolves"), n.get("front_door"))
                                                     for n in rep["nodes"]]
    assert sum(c["opens"] for c in rep["opened_from"].values()) == 2 * files


def test_every_node_can_hold_the_dataset_each_keeps_a_full_copy_from_one_pfs_read(dataset, short_tmp, slow_pfs):
    """Each node's ram+ssd+peer is twice the dataset but its peer area alone is not enough for
    the other nodes' files: replicated, the rest of them go to its tiers, not to the PFS."""
    nodes, files = 4, 160
    ds = dataset(files=files, size="16KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=1)
    mounted = type(ds)(str(pfs.mountpoint), ds.manifest, ds.files, ds.total)
    cfg = shard_config(short_tmp, mounted.root, 2 * ds.total)
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        finish(shard_readers(cluster, mounted, nodes, epochs=2))
    finally:
        assert cluster.stop(range(nodes)) == 0
    assert ds.total <= pfs.counters()["bytes"] <= 1.05 * ds.total
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    for node in rep["nodes"]:
        assert node["cluster"]["mode"] == "replicate"
        assert node["staging"]["files"] == files  # a full copy on every node
