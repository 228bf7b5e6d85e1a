"""A large file across the cluster: staged by blocks on every node, each range's blocks read
from the PFS by its owner only and fetched by the other nodes from it (monarch/cluster/ranges.py,
node/peer/block_peers.py). `monarch serve` under mpiexec, each rank its own node, a reader on
every node under `monarch run`, the PFS counted by the emulated PFS itself."""

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from support.harness import load, monarch_env, write_cluster_config
from test_cluster_e2e import DaemonCluster

pytestmark = pytest.mark.mpi

MiB = 1 << 20


def make_large(root: str, size: int, name: str = "tok.bin") -> str:
    """A file of ``size`` pseudo-random bytes (and a small one beside it); its sha256."""
    os.makedirs(root, exist_ok=True)
    data = hashlib.shake_256(b"monarch").digest(size)
    with open(os.path.join(root, name), "wb") as f:
        f.write(data)
    with open(os.path.join(root, "small.txt"), "w") as f:
        f.write("x" * 1000)
    return hashlib.sha256(data).hexdigest()


def cluster_config(base: str, root: str, nodes: int, ram: int, policy: str = "read-ahead") -> str:
    return write_cluster_config(base, root, "blocks.yaml", nodes, f"""tiers:
  - {{name: ram, path: "/dev/shm{base}/ram${{MONARCH_NODE}}", capacity: {ram}}}
peer: {{path: "/dev/shm{base}/peer${{MONARCH_NODE}}", capacity: 8MiB, timeout: 10}}
staging: {{policy: {policy}}}
""")


def run_readers(cluster, cfg, base, path, digest, nodes, mode="pread", passes=2, extra=()):
    procs = [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report",
                               os.path.join(base, f"reader{k}.json"), "--", sys.executable, "-m",
                               "support.block_reader", path, "--sha256", digest, "--mode", mode,
                               "--passes", str(passes), *extra],
                              env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for k in nodes]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr  # every pass's digest was right
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def node_blocks(rep):
    """Each node's block figures (its stager's "blocks" entry)."""
    return [n["staging"]["blocks"] for n in rep["nodes"]]


@pytest.mark.parametrize("room", ["whole", "share"])
def test_a_large_file_is_staged_by_ranges_each_block_read_from_the_pfs_by_one_node(room, short_tmp, slow_pfs):
    """3 nodes, a 96 MiB file (6 ranges, 2 per node). ``whole``: each node has room for the
    file; ``share``: for its own ranges and 8 MiB more (the file fits only across the nodes).
    On the old code a cluster staged the file whole on one owner (``share``: not at all)."""
    nodes, size = 3, 96 * MiB
    src = os.path.join(short_tmp, "src")
    digest = make_large(src, size)
    pfs = slow_pfs(src, open_latency_ms=1, bandwidth_mbps=50)  # ~2 s of staging: the readers open the file meanwhile
    ram = 2 * size if room == "whole" else size // nodes + 8 * MiB
    cfg = cluster_config(short_tmp, str(pfs.mountpoint), nodes, ram)
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        run_readers(cluster, cfg, short_tmp, os.path.join(str(pfs.mountpoint), "tok.bin"), digest, range(nodes))
    finally:
        assert cluster.stop(range(nodes)) == 0
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_reporting"] == nodes
    blocks = node_blocks(rep)
    own = size // nodes // MiB
    # every node's reader was answered at once, its descriptor served by blocks (no whole copy waited for)
    for k in range(nodes):
        assert load(os.path.join(short_tmp, f"reader{k}.json"))["blocks"]["read"]["opens"] == 1
    for b in blocks:
        assert b["files"] == 1  # staged by blocks on every node
        assert b["blocks_staged"] >= own  # its own ranges at least
        if room == "share":
            assert b["blocks_staged"] <= own + 8  # and no more than its room
    # the daemons read each block from the PFS once for the whole cluster, the rest from peers
    daemons_pfs = sum(n["staging"]["pfs_bytes_read"] for n in rep["nodes"])
    assert size <= daemons_pfs <= 1.02 * size
    assert sum(b["bytes_from_peers"] for b in blocks) >= (nodes - 1) * size * (1 if room == "whole" else 0) \
        or room == "share"
    assert sum(b["bytes_served"] for b in blocks) == sum(b["bytes_from_peers"] for b in blocks)
    if room == "whole":  # the readers' large reads waited for the blocks from their owners: the PFS once in all
        assert pfs.counters()["files"]["tok.bin"]["bytes"] <= 1.05 * size


@pytest.mark.parametrize("mode", ["mmap", "mmap-random"])
def test_a_mappings_faults_wait_for_the_owners_blocks_and_the_cluster_reads_the_pfs_once(mode, short_tmp, slow_pfs):
    """3 nodes, each with room for the 96 MiB file, whose readers map it at once (before its
    blocks are staged: staged once opened, at 50 MB/s) and read it through the mapping, in order or in random 64 KiB
    windows. A fault on a block not yet local waits for it from its owner (shim_guard.c): the
    PFS is read once for the cluster, every byte right. On the old code the faults read the PFS
    through the kernel beside the owners (1.3x the file and more)."""
    nodes, size = 3, 96 * MiB
    src = os.path.join(short_tmp, "src")
    digest = make_large(src, size)
    pfs = slow_pfs(src, open_latency_ms=1, bandwidth_mbps=50, page_cache=True)  # (a FUSE mount maps only so)
    cfg = cluster_config(short_tmp, str(pfs.mountpoint), nodes, 2 * size, policy="on-access")  # staged once opened
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        run_readers(cluster, cfg, short_tmp, os.path.join(str(pfs.mountpoint), "tok.bin"), digest, range(nodes),
                    mode=mode, passes=1)
    finally:
        assert cluster.stop(range(nodes)) == 0
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_reporting"] == nodes
    held = [load(os.path.join(short_tmp, f"reader{k}.json"))["blocks"]["read"] for k in range(nodes)]
    assert pfs.counters()["files"]["tok.bin"]["bytes"] <= 1.05 * size, (held, node_blocks(rep))
    assert any(r["faults_held"] > 0 for r in held), held  # faults waited for blocks (a node whose reader
    # started late may find the file whole)


@pytest.mark.parametrize("mode", ["mmap", "pread"])
def test_a_file_larger_than_a_nodes_room_passes_through_a_window_and_the_cluster_reads_the_pfs_once(
        mode, short_tmp, slow_pfs):
    """3 nodes, a 192 MiB file, each node with room for its own ranges (64 MiB) and 40 MiB more:
    the file fits only across the nodes. Each node's reader reads it twice in order (through one
    mapping for both passes, or in 1 MiB preads). The other owners' blocks pass through each
    node's window (LENT, the oldest leaving for the next one the reader wants), and a mapping's
    copies of them are guarded again past 16 and copied anew: the PFS is read once for the
    cluster, every byte right. On the old code each node kept the first 40 MiB of the others'
    blocks and its reader read the rest from the PFS, at each pass (1.8x the file here, where the
    nodes share one mount and its page cache)."""
    nodes, size = 3, 192 * MiB
    src = os.path.join(short_tmp, "src")
    digest = make_large(src, size)
    pfs = slow_pfs(src, open_latency_ms=1, bandwidth_mbps=100, page_cache=True)
    cfg = cluster_config(short_tmp, str(pfs.mountpoint), nodes, size // nodes + 40 * MiB, policy="on-access")
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        run_readers(cluster, cfg, short_tmp, os.path.join(str(pfs.mountpoint), "tok.bin"), digest, range(nodes),
                    mode=mode, passes=2, extra=("--one-mapping",) if mode == "mmap" else ())
    finally:
        assert cluster.stop(range(nodes)) == 0
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_reporting"] == nodes
    reads = [load(os.path.join(short_tmp, f"reader{k}.json"))["blocks"]["read"] for k in range(nodes)]
    blocks = node_blocks(rep)
    assert pfs.counters()["files"]["tok.bin"]["bytes"] <= 1.05 * size, (reads, blocks)
    assert all(b["blocks_left_window"] > 0 for b in blocks), blocks  # the windows moved on
    if mode == "mmap":
        assert all(r["faults_held"] > 0 for r in reads), reads


def test_a_random_readers_faults_on_other_owners_blocks_are_served_with_their_pages_from_the_owners(
        short_tmp, slow_pfs):
    """3 nodes, a 192 MiB file, each node with room for its own ranges and 40 MiB more (a window),
    its ranges staged before the readers start. Each node's reader maps the file and reads 1,500
    random 4 KiB windows (a token reader's), every byte checked: its faults on other owners' blocks
    are served with their pages from those owners (shim_pages.c, the door's PAGES), so the cluster
    reads the PFS once. On the old code those faults read their pages from the PFS (1.1x the file
    and more here, where the nodes share one mount and its page cache)."""
    nodes, size = 3, 192 * MiB
    src = os.path.join(short_tmp, "src")
    make_large(src, size)
    pfs = slow_pfs(src, open_latency_ms=1, bandwidth_mbps=200, page_cache=True)
    cfg = cluster_config(short_tmp, str(pfs.mountpoint), nodes, size // nodes + 40 * MiB)
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        deadline = time.monotonic() + 60  # each owner reads its ranges ahead: the PFS once, then quiet
        while pfs.counters()["files"].get("tok.bin", {}).get("bytes", 0) < size and time.monotonic() < deadline:
            time.sleep(0.2)
        before = pfs.counters()["files"]["tok.bin"]["bytes"]
        run_readers(cluster, cfg, short_tmp, os.path.join(str(pfs.mountpoint), "tok.bin"), "-", range(nodes),
                    mode="mmap-windows", passes=1, extra=("--windows", "1500"))
    finally:
        assert cluster.stop(range(nodes)) == 0
    reads = [load(os.path.join(short_tmp, f"reader{k}.json"))["blocks"]["read"] for k in range(nodes)]
    assert before <= 1.01 * size, before
    assert pfs.counters()["files"]["tok.bin"]["bytes"] <= 1.02 * size, reads
    assert all(r["faults_pages"] > 500 for r in reads), reads  # (2/3 of the windows are other owners')


@pytest.mark.parametrize("room", ["file", "window"])
def test_every_process_shape_reads_a_guarded_mapping_right_and_the_applications_sigsegv_handler_is_kept(
        room, short_tmp, slow_pfs):
    """2 nodes, a file staged once opened (50 MB/s): node 0's reader maps it before its blocks
    are local and reads it by a write straight from the mapping (a kernel read), threads, a fork
    child; a child with faulthandler enabled faults for real and dies of SIGSEGV after
    faulthandler's report, as without Monarch (tests/support/guard_shapes.py). ``file``: 64 MiB,
    room for it; ``window``: 128 MiB, room for the node's own half and 40 MiB (other owners'
    blocks copied into the process's pages, some leaving the window meanwhile)."""
    nodes, size = 2, (64 if room == "file" else 128) * MiB
    src = os.path.join(short_tmp, "src")
    make_large(src, size)
    pfs = slow_pfs(src, open_latency_ms=1, bandwidth_mbps=50, page_cache=True)
    ram = 2 * size if room == "file" else size // nodes + 40 * MiB
    cfg = cluster_config(short_tmp, str(pfs.mountpoint), nodes, ram, policy="on-access")
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        p = subprocess.run([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report",
                            os.path.join(short_tmp, "shapes.json"), "--", sys.executable, "-m", "support.guard_shapes",
                            os.path.join(str(pfs.mountpoint), "tok.bin"), "--source", os.path.join(src, "tok.bin")],
                           env=monarch_env(MONARCH_NODE=0), capture_output=True, text=True, timeout=240)
    finally:
        assert cluster.stop(range(nodes)) == 0
    assert p.returncode == 0, p.stderr
    found = json.loads(p.stdout.strip().splitlines()[-1])
    assert found == {"write": True, "threads": True, "fork": 0, "whole": True,
                     "segfault": {"returncode": -11, "faulthandler": True}}, found
    rep = load(os.path.join(short_tmp, "shapes.json"))
    assert rep["blocks"]["read"]["faults_held"] > 0, p.stderr  # the mapping was guarded


@pytest.mark.parametrize("room", ["file", "window", "pages"])
def test_an_owner_killed_mid_job_its_ranges_are_read_elsewhere_and_every_byte_is_right(room, short_tmp, slow_pfs):
    """Node 2's daemon is SIGKILLed while the file is staged (a slow PFS: 60 MB/s): the readers on
    nodes 0 and 1 finish every pass with the right bytes; node 2's ranges are read from the PFS by
    the survivors that own them now, or by the readers (fail open). ``file``: 96 MiB, room for
    it; ``window``: 192 MiB, room for a node's own third and 40 MiB (other owners' blocks leaving
    the windows while the readers' 1 MiB preads wait for them and read them); ``pages``: as
    ``window``, the readers reading random 4 KiB windows of one mapping (their faults' pages asked
    of node 2 too, until it is lost, then of the survivors that own its ranges)."""
    nodes, size = 3, (96 if room == "file" else 192) * MiB
    src = os.path.join(short_tmp, "src")
    digest = make_large(src, size)
    pfs = slow_pfs(src, open_latency_ms=1, bandwidth_mbps=60, page_cache=room == "pages")  # (a FUSE mount maps only so)
    cfg = cluster_config(short_tmp, str(pfs.mountpoint), nodes, 2 * size if room == "file" else size // 3 + 40 * MiB)
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    path = os.path.join(str(pfs.mountpoint), "tok.bin")
    try:
        reader = ["--passes", "3"] if room != "pages" else ["--mode", "mmap-windows", "--windows", "3000"]
        procs = [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--", sys.executable, "-m",
                                   "support.block_reader", path, "--sha256", digest, *reader],
                                  env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for k in (0, 1)]
        import time
        time.sleep(0.5 if room != "pages" else 1.0)  # the file is a third staged at most: three links of 60 MB/s
        os.kill(cluster.pid(2), 9)
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err  # every pass's digest was right, every window's bytes
            assert len(json.loads(out.strip().splitlines()[-1])["passes"]) == (3 if room != "pages" else 1)
    finally:
        cluster.stop([0, 1])
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_lost"] == [2]
    survivors = [n["staging"]["blocks"] for n in rep["nodes"] if n is not None]
    # each survivor read its own ranges from the PFS, and one took over each of node 2's: no block
    # read twice by the daemons but those node 2 had read when it died
    own = size // nodes // MiB
    assert 2 * own <= sum(b["blocks_from_pfs"] for b in survivors) <= size // MiB + own
