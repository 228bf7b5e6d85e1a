"""A cluster given a manifest (`dataset.manifest`), walked by `monarch index` as find lists or made
from a list of the files: its files are described at their owner's first need, every node reads
every byte right, and the cluster reads the PFS about once (the emulated PFS's own count)."""

import os

import pytest

from support.harness import load, monarch, with_manifest, write_config
from test_cluster_e2e import DaemonCluster, finish

pytestmark = pytest.mark.mpi

NODES = 2


@pytest.mark.parametrize("made_by", ["walk", "list"])
def test_every_node_of_a_cluster_given_a_manifest_reads_everything_once_from_the_pfs(made_by, dataset, short_tmp,
                                                                                     slow_pfs):
    ds = dataset(files=200, size="8KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=1)
    mounted = type(ds)(str(pfs.mountpoint), ds.manifest, ds.files, ds.total)
    manifest = os.path.join(short_tmp, "dataset.index")
    extra = []
    if made_by == "list":
        listing = os.path.join(short_tmp, "files.list")
        with open(listing, "w") as f:
            f.writelines(f"{rel}\t{entry['size']}\n" for rel, entry in ds.files.items())
        extra = ["--from-list", listing]
    made = monarch("index", mounted.root, "-o", manifest, *extra)
    assert made.returncode == 0, made.stdout + made.stderr
    cfg = with_manifest(write_config(short_tmp, mounted.root), mounted.root, manifest)
    pfs.reset_counters()
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        finish(cluster.readers(mounted, range(NODES), epochs=2, workers=2))  # each checks every file's digest
    finally:
        assert cluster.stop(range(NODES)) == 0
    counted = pfs.counters()
    # the cluster test's own bound (test_cluster_e2e): each byte about once, against NODES x 2 without Monarch
    assert ds.total <= counted["bytes"] <= 1.05 * ds.total
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_reporting"] == NODES and rep["nodes_lost"] == []
    assert all(node["snapshot"] == "manifest" for node in rep["nodes"]), [n["snapshot"] for n in rep["nodes"]]
    assert rep["opened_from"]["pfs"]["opens"] == 0
    # each node staged its share and read the rest from its peer, both epochs: measured exact for the list's
    # manifest and 0.9% under for the walked one (a few files read where they were staged)
    assert rep["opened_from"]["peer"]["bytes"] == pytest.approx(2 * (NODES - 1) * ds.total, rel=0.02)
