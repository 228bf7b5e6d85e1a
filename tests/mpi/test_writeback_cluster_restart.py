"""A restart on a cluster reads its checkpoint from the nodes (docs/consistency.md, "Kept copies"):
DCP's pattern saved by one cluster of `monarch serve` daemons with write-back of its directory
(``fsync: auto``: partner copies), stopped; then a new cluster on the same nodes (a requeued job:
new daemons) whose every rank loads every file of it. The emulated PFS counts what it gives."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from support.harness import load, monarch_env, write_config
from test_writeback_cluster import NODES, lose_node, shard_size, start_ranks
from test_cluster_e2e import DaemonCluster, finish

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(400)]

LOAD = """
import hashlib, json, os, sys
ck, out = sys.argv[1], sys.argv[2]
digests = {}
for name in sorted(os.listdir(ck)):  # every rank loads every file (its shard, the others', `.metadata`)
    with open(os.path.join(ck, name), "rb") as f:
        digests[name] = hashlib.md5(f.read()).hexdigest()
with open(out, "w") as f:
    json.dump(digests, f)
"""


def save_then_restart(short_tmp, slow_pfs, ds, between=lambda src: None):
    """The save on one cluster, ``between(src)`` (the PFS's backing directory), then the load on a new
    one: (each rank's digests, each rank's write-back report, the PFS's counters during the load, src)."""
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(os.path.join(src, "ck"))
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=200, open_latency_ms=0)
    ck = os.path.join(str(pfs.mountpoint), "ck")
    barrier = os.path.join(short_tmp, "barrier")
    os.makedirs(barrier)
    cfg = write_config(short_tmp, ds.root, extra=f'writeback: {{paths: ["{ck}"]}}\n')
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        finish(start_ranks(cfg, ck, barrier))
    finally:
        assert cluster.stop(range(NODES)) == 0
    between(src)
    pfs.reset_counters()
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        jobs = [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--report",
                                  os.path.join(short_tmp, f"load{k}.json"), "--", sys.executable, "-c",
                                  textwrap.dedent(LOAD), ck, os.path.join(short_tmp, f"digests{k}.json")],
                                 env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for k in range(NODES)]
        finish(jobs)
    finally:
        assert cluster.stop(range(NODES)) == 0
    digests = [json.load(open(os.path.join(short_tmp, f"digests{k}.json"))) for k in range(NODES)]
    reports = [load(os.path.join(short_tmp, f"load{k}.json"))["writeback"] for k in range(NODES)]
    return digests, reports, pfs.counters(), src


def expected(src):
    ck = os.path.join(src, "ck")
    return {name: hashlib.md5(open(os.path.join(ck, name), "rb").read()).hexdigest() for name in os.listdir(ck)}


def checkpoint_bytes(src):
    ck = os.path.join(src, "ck")
    return sum(os.path.getsize(os.path.join(ck, n)) for n in os.listdir(ck))


def test_a_restart_reads_its_checkpoint_from_the_nodes_not_the_pfs(dataset, short_tmp, slow_pfs):
    """Every rank's shard from its own tier, every other file from a node that keeps it: the PFS gives
    none of the checkpoint's bytes, every byte is right, and the reports say where each came from."""
    digests, reports, counters, src = save_then_restart(short_tmp, slow_pfs, dataset(files=5))
    assert digests == [expected(src)] * NODES
    assert counters["bytes"] == 0, counters  # (the emulator's own count of the bytes it gave)
    files = len(expected(src))
    for k, wb in enumerate(reports):
        assert wb["restart_tier_files"] >= 1 and wb["restart_pfs_files"] == 0, (k, wb)
        assert sum(wb[f"restart_{s}_files"] for s in ("tier", "partner", "peer")) == files, (k, wb)
        assert sum(wb[f"restart_{s}_bytes"] for s in ("tier", "partner", "peer")) == checkpoint_bytes(src)


def test_a_replaced_node_reads_its_files_from_its_partner(dataset, short_tmp, slow_pfs):
    """Node 3's tier is wiped between the runs (a node replaced): its shard comes from its partner
    (node 0, which held it for node 3 and kept it), not the PFS."""
    last = NODES - 1

    def replace_node(src):
        lose_node(short_tmp, last)  # its tiers wiped; the new node's bases are there, empty
        for tier in (f"/dev/shm{short_tmp}/ram{last}", f"{short_tmp}/ssd{last}"):
            os.makedirs(tier)

    digests, reports, counters, src = save_then_restart(short_tmp, slow_pfs, dataset(files=5), between=replace_node)
    assert digests == [expected(src)] * NODES
    assert counters["bytes"] == 0, counters
    assert reports[last]["restart_tier_files"] == 0
    assert reports[last]["restart_partner_bytes"] >= shard_size(last), reports[last]


def test_a_checkpoint_changed_on_the_pfs_between_the_runs_is_read_from_the_pfs(dataset, short_tmp, slow_pfs):
    """A shard rewritten on the PFS (another job, an operator) between the runs: every rank reads
    the new bytes, from the PFS; the unchanged files still come from the nodes."""
    changed = "__1_0.distcp"

    def rewrite(src):
        with open(os.path.join(src, "ck", changed), "r+b") as f:
            f.write(b"new bytes")

    digests, reports, counters, src = save_then_restart(short_tmp, slow_pfs, dataset(files=5), between=rewrite)
    assert digests == [expected(src)] * NODES
    assert expected(src)[changed] != hashlib.md5(bytes([1]) * shard_size(1)).hexdigest()
    assert counters["bytes"] == NODES * shard_size(1), counters  # that file alone, once a rank
    assert all(wb["restart_pfs_files"] == 1 for wb in reports), reports


def test_a_node_and_its_partner_both_replaced_read_what_no_node_keeps_from_the_pfs(dataset, short_tmp, slow_pfs):
    """Nodes 3 and 0 (3's partner) both wiped: node 3's shard is kept nowhere, so every rank reads it
    from the PFS (right bytes, once a rank); node 0's shard still comes from its partner, node 1."""
    def replace_nodes(src):
        for k in (0, NODES - 1):
            lose_node(short_tmp, k)
            for tier in (f"/dev/shm{short_tmp}/ram{k}", f"{short_tmp}/ssd{k}"):
                os.makedirs(tier)

    digests, reports, counters, src = save_then_restart(short_tmp, slow_pfs, dataset(files=5), between=replace_nodes)
    assert digests == [expected(src)] * NODES
    assert counters["bytes"] == NODES * shard_size(NODES - 1), counters  # the lost shard alone, once a rank
    assert all(wb["restart_pfs_files"] == 0 for wb in reports), reports  # (kept nowhere: not asked for)
    assert reports[0]["restart_partner_bytes"] >= shard_size(0), reports[0]


EVERY = """
import hashlib, os, sys
ck, rank, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
path = os.path.join(ck, "model.pt")
if what == "save":
    if rank == 0:  # rank 0 saves the weights (a Trainer's, Lightning's): under its name, fsynced
        with open(path, "wb") as f:
            f.write(bytes(range(256)) * (32 << 12))
            os.fsync(f.fileno())
else:  # every rank loads them whole
    with open(path, "rb") as f:
        assert hashlib.md5(f.read()).digest() == hashlib.md5(bytes(range(256)) * (32 << 12)).digest()
"""


def wait_until_kept(tier, name, timeout=30):
    import glob
    import time
    deadline = time.monotonic() + timeout
    while not any(p.endswith("/" + name) for index in glob.glob(f"{tier}/monarch-*/kept-writes/index.json")
                  for p in json.load(open(index))):
        assert time.monotonic() < deadline, f"{name} never kept in {tier}"
        time.sleep(0.05)
    time.sleep(0.5)  # (the word goes to the other nodes right after the index is written)


def test_the_next_job_of_the_same_daemons_loads_a_file_another_node_kept(dataset, short_tmp, slow_pfs):
    """One allocation, two jobs on the same standing daemons: rank 0 saves `model.pt`, then every rank
    loads it. The nodes that did not write it read it from a node that keeps it (told as it was
    kept), not the PFS."""
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(os.path.join(src, "ck"))
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=200, open_latency_ms=0)
    ck = os.path.join(str(pfs.mountpoint), "ck")
    cfg = write_config(short_tmp, dataset(files=5).root, extra=f'writeback: {{paths: ["{ck}"]}}\n')
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        for what in ("save", "load"):
            if what == "load":  # the partner keeps its copy once it hears the drain applied it (after the job)
                for k in (0, 1):  # (rank 0's node and its partner; each tells the others as it records it)
                    wait_until_kept(f"/dev/shm{short_tmp}/ram{k}", "model.pt")
            pfs.reset_counters()
            finish([subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--report",
                                      os.path.join(short_tmp, f"{what}{k}.json"), "--", sys.executable, "-c",
                                      textwrap.dedent(EVERY), ck, str(k), what],
                                     env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True) for k in range(NODES)])
    finally:
        assert cluster.stop(range(NODES)) == 0
    wbs = [load(os.path.join(short_tmp, f"load{k}.json"))["writeback"] for k in range(NODES)]
    assert pfs.counters()["bytes"] == 0, [{k: v for k, v in w.items() if "restart" in k or "kept" in k} for w in wbs]  # the load's: none of the file's 32 MiB
    wb = [load(os.path.join(short_tmp, f"load{k}.json"))["writeback"] for k in range(NODES)]
    assert sum(w["restart_peer_files"] + w["restart_partner_files"] for w in wb) >= NODES - 2, wb
