"""A cluster's namespace at the listings' pace: node 0 lists the dataset (no stat a file), every node
receives its index whole into the file it publishes, the files are placed by count on the hash ring,
and each file is opened on the PFS once, by its owner, which describes it as it copies it: a sharded
node reading another's file asks that owner for its stat over the peer plane (dp_describe), never the
PFS. Counted by the emulated PFS itself."""

import os
import subprocess
import sys
import time
from array import array

import pytest

from monarch import protocol
from monarch.cluster.capacity import SIZE_SAMPLES
from monarch.node.snapshot import walker
from monarch.tools.slowpfs_generated import Generated
from support.harness import load, monarch_env, ram_peer_config, write_config
from test_cluster_e2e import DaemonCluster, finish

pytestmark = pytest.mark.mpi

NODES = 3
TREE = Generated(files=1200, per_dir=200)  # 1-4 KiB; the emulator gives each entry's type: a listing stats nothing

# Every file of the tree, in an order of the node's own, twice; each byte checked against the generator's.
READER = r"""
import os, random, sys
from monarch.tools.slowpfs_generated import Generated
mnt, files, per_dir, node = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tree = Generated(files=files, per_dir=per_dir)
order = list(range(files))
random.Random(node).shuffle(order)
wrong = [i for _ in range(2) for i in order if open(os.path.join(mnt, tree.path(i)), "rb").read() != tree.data(i)]
sys.exit(1 if wrong else 0)
"""
METADATA = ("lookups", "readdirs", "opendirs", "statfs", "accesses")  # the emulator's metadata calls


def metadata(counted: dict) -> int:
    return sum(counted.get(k, 0) for k in METADATA)


def indexes_published(cluster: DaemonCluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    def published(k: int) -> bool:  # the instance's index, renamed into place (not the file it is built in)
        return any(n.startswith("index-") and ".tmp-" not in n for n in os.listdir(cluster.run_dir(k)))
    while not all(published(k) for k in range(cluster.nodes)):
        assert time.monotonic() < deadline, "the nodes did not publish their indexes"
        time.sleep(0.05)


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
@pytest.mark.parametrize("layout", ["replicate", "shard"])
def test_node_0_lists_the_dataset_and_each_file_is_opened_once_on_the_pfs(layout, short_tmp, slow_pfs):
    pfs = slow_pfs(TREE, open_latency_ms=1)
    root = str(pfs.mountpoint)
    pfs.reset_counters()
    found = subprocess.run(["find", root, "-type", "f"], capture_output=True, text=True, check=True)
    assert len(found.stdout.split()) == TREE.files
    find_calls = metadata(pfs.counters())
    total = sum(TREE.size(i) for i in range(TREE.files))
    if layout == "replicate":
        cfg = write_config(short_tmp, root)  # on-access, tiers far larger than the dataset
    else:  # each node's RAM tier half the dataset (a third and the estimate's margin): sharded, the door's peer lane
        cfg = ram_peer_config(short_tmp, root, 4096 * TREE.files // 2, 4096 * TREE.files // 4, NODES, "shard.yaml")
    pfs.reset_counters()
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        indexes_published(cluster)
        if layout == "replicate":  # on-access: nothing staged before the readers, so this is the namespace's cost
            namespace = metadata(pfs.counters())
            # the listing is find's; then a sample of sizes (a lookup of its directory and of the file each)
            # and each daemon's own start (its roots checked): a stat a file would be 1,200 calls more
            assert namespace <= find_calls + 3 * SIZE_SAMPLES + 20 * NODES < TREE.files, (namespace, find_calls)
        finish([subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--", sys.executable, "-c", READER,
                                  root, str(TREE.files), str(TREE.per_dir), str(k)],
                                 env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for k in range(NODES)])  # each checked every byte
    finally:
        assert cluster.stop(range(NODES)) == 0
    counted = pfs.counters()
    assert total <= counted["bytes"] <= 1.05 * total
    # each file opened on the PFS once, by its owner: a node reading another's file never opens it there
    assert counted["opens"] <= 1.05 * TREE.files, counted["opens"]
    if layout == "shard":  # and described once, by its owner as it copies it: the others ask the owner (a pass
        # that stats every file on every node, or each reader's node asking the PFS, would be thousands more)
        assert metadata(counted) <= find_calls + 3 * SIZE_SAMPLES + 20 * NODES + 1.5 * TREE.files, counted
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    # (a remote open that waits past its deadlines reads the PFS: fail open, a few on a loaded machine)
    assert rep["nodes_reporting"] == NODES and rep["opened_from"]["pfs"]["opens"] <= 0.01 * 2 * NODES * TREE.files
    assert rep["cluster"]["mode"] == layout and "placed by count" in rep["cluster"]["why"], rep["cluster"]["why"]
    assert all(n["snapshot"].startswith("walked") for n in rep["nodes"]), [n["snapshot"] for n in rep["nodes"]]
    rows = rep["cluster"]["per_node"]
    assert all(row["owned_estimated"] for row in rows)
    # placed by count: each node owns about a third of the files, and stages what it owns
    assert all(abs(row["owned_files"] - TREE.files / NODES) < 0.1 * TREE.files for row in rows), rows
    if layout == "shard":  # each door found its own files on the ring itself (no table of every file's owner):
        owners = [n["front_door"]["peer_owners"] for n in rep["nodes"]]  # together, every file once
        assert all(o["by"] == "ring" for o in owners) and sum(o["own"] for o in owners) == TREE.files, owners


def undescribed(cluster: DaemonCluster, k: int) -> int:
    """Files node ``k``'s published index has not described (their records' stat 0)."""
    name = next(n for n in os.listdir(cluster.run_dir(k)) if n.startswith("index-") and ".tmp-" not in n)
    with open(os.path.join(cluster.run_dir(k), name), "rb") as f:
        head = protocol.INDEX_HEADER.unpack(f.read(protocol.INDEX_HEADER.size))
        nfiles, files_off = head[11], head[13]
        f.seek(files_off)
        stats = array("I", f.read(8 * nfiles))[1::2]
    return stats.count(0)


def staged_files(base: str) -> int:
    return sum(1 for k in range(NODES) for _, _, fs in os.walk(f"/dev/shm{base}/ram{k}") for f in fs
               if not f.startswith(".monarch"))


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_a_node_reading_another_nodes_files_asks_their_owner_for_their_stats_not_the_pfs(short_tmp, slow_pfs):
    pfs = slow_pfs(TREE, open_latency_ms=0)
    root = str(pfs.mountpoint)
    cfg = ram_peer_config(short_tmp, root, 4096 * TREE.files // 2, 4096 * TREE.files // 4, NODES, "shard.yaml")
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        deadline = time.monotonic() + 120
        while staged_files(short_tmp) < TREE.files:  # each owner's read-ahead staged (and described) its share
            assert time.monotonic() < deadline, f"the owners staged {staged_files(short_tmp)} of {TREE.files} files"
            time.sleep(0.2)
        pfs.reset_counters()
        before = [undescribed(cluster, k) for k in range(NODES)]
        finish([subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--", sys.executable, "-c", READER,
                                  root, str(TREE.files), str(TREE.per_dir), str(k)],
                                 env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for k in range(NODES)])  # each read every file twice, every byte checked
        counted = pfs.counters()
        after = [undescribed(cluster, k) for k in range(NODES)]
    finally:
        assert cluster.stop(range(NODES)) == 0
    # two thirds of each node's opens are another node's files, each undescribed in this node's index: each
    # is described from its owner's index over the peer plane (asked of the PFS by name, 2 lookups, before)
    assert all(n > TREE.files / 2 for n in before) and after == [0] * NODES, (before, after)  # no pass described them
    assert counted["opens"] == 0 and counted["bytes"] == 0, counted
    assert metadata(counted) <= 0.05 * TREE.files, {k: counted[k] for k in METADATA}


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_a_file_another_node_opens_before_its_owner_copied_it_is_copied_first_and_costs_no_stat(short_tmp, slow_pfs):
    """The readers start with the daemons, whose read-ahead copies one file at a time (staging.threads:
    1, 5 ms an open): most files a node opens of another's are not copied yet. The owner copies such a
    file first, describing it from that open, and the reader's node asks it again until it has: no
    stat of it on either node (before: a lookup by name on the reader's node, then the owner's stat
    before its open, 2-3 calls each)."""
    pfs = slow_pfs(TREE, open_latency_ms=5)
    root = str(pfs.mountpoint)
    pfs.reset_counters()
    subprocess.run(["find", root, "-type", "f"], capture_output=True, check=True)
    find_calls = metadata(pfs.counters())
    cfg = ram_peer_config(short_tmp, root, 4096 * TREE.files // 2, 4096 * TREE.files // 4, NODES, "shard.yaml")
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text.replace("staging: {policy: read-ahead}", "staging: {policy: read-ahead, threads: 1}"))
    pfs.reset_counters()
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        finish([subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--", sys.executable, "-c", READER,
                                  root, str(TREE.files), str(TREE.per_dir), str(k)],
                                 env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for k in range(NODES)])  # each read every file twice, every byte checked
        staged_by_readers = staged_files(short_tmp)
    finally:
        assert cluster.stop(range(NODES)) == 0
    counted = pfs.counters()
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    # (a remote open that waits past its deadlines reads the PFS: fail open, a few on a loaded machine)
    assert staged_by_readers >= 0.99 * TREE.files and rep["opened_from"]["pfs"]["opens"] <= 0.01 * 2 * NODES * TREE.files
    assert counted["opens"] <= TREE.files + 0.01 * TREE.files, counted["opens"]  # each file opened once, by its owner
    # beyond each open's look-up, the namespace's calls alone (as the first test's): no stat of a file
    beyond = metadata(counted) - counted["opens"]
    assert beyond <= find_calls + 3 * SIZE_SAMPLES + 20 * NODES + 0.05 * TREE.files, (beyond, find_calls, counted)
