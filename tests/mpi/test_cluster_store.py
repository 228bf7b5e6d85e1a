"""A dataset in a key-value store served by a cluster of daemons (`monarch serve` under mpiexec,
each rank its own node): every node's readers get the store's bytes, and the store is read once
for the whole cluster (the server's own count of GETs and the nodes' reports agree)."""

import os
import shutil
import types

import pytest

from support.harness import load, write_config
from support.redisstore import RedisServer
from monarch.store.load import put
from monarch.store.url import StoreURL
from monarch.tools.workload import make_dataset
from test_cluster_e2e import DaemonCluster, finish

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("policy,nodes", [("on-access", 2), ("read-ahead", 4)])
def test_a_cluster_reads_the_store_once(policy, nodes, short_tmp):
    pytest.importorskip("redis")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/install.sh installs it)")
    src, manifest = os.path.join(short_tmp, "src"), os.path.join(short_tmp, "src.manifest.json")
    entries = make_dataset(src, files=150, size="8KiB", manifest=manifest)
    total = sum(e["size"] for e in entries.values())
    os.makedirs(os.path.join(short_tmp, "redis"))
    server = RedisServer(os.path.join(short_tmp, "redis"))
    try:
        url = server.url("cluster/")
        put(src, StoreURL.parse(url), out=None)
        mount = os.path.join(short_tmp, "mnt", "data")
        cfg = write_config(short_tmp, mount, policy=policy)
        text = open(cfg).read().replace(f'dataset: {{roots: ["{mount}"]}}',
                                        f'dataset: {{roots: ["{mount}"], stores: {{"{mount}": "{url}"}}}}')
        open(cfg, "w").write(text)
        hits = server.client().info("stats")["keyspace_hits"]
        cluster = DaemonCluster(nodes, cfg, short_tmp)
        try:
            ds = types.SimpleNamespace(root=mount, manifest=manifest)
            finish(cluster.readers(ds, range(nodes), epochs=2, workers=2))  # every digest checked
        finally:
            assert cluster.stop(range(nodes)) == 0
        got = server.client().info("stats")["keyspace_hits"] - hits
    finally:
        server.stop()
    # each value once for the cluster; the manifest by node 0's snapshot, each other node's
    # digests and each reader's start check
    assert got == len(entries) + 1 + (nodes - 1) + nodes
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_reporting"] == nodes
    assert rep["store"]["bytes_read"] == total and rep["store"]["reads_of_dataset"] == 1.0
    assert rep["store"]["refused_count"] == 0 and rep["opened_from"]["pfs"]["opens"] == 0
    assert rep["peer"]["bytes_received"] > 0  # the other nodes' files came from their owners
