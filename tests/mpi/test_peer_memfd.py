"""Which remote files the peer area keeps, and one request per owner for many opens.

Two simulated nodes, each owning half of a small dataset staged in its RAM tier; node 0 reads
every file with 8 threads under `monarch run` (digests checked by the reader), one epoch per
run, so each run's report gives the front door's counts after that epoch. A remote file the
area would not serve again is answered as a sealed memfd (only the door's 1-in-8 sample is
kept there, to measure reuse); a dataset reread epoch after epoch ends up kept in the area
and read from it. The door gathers the opens that wait for one owner into one request."""

import json
import os
import subprocess
import sys
import time

import pytest

from support.harness import monarch_env, ram_peer_config
from test_cluster_e2e import DaemonCluster

pytestmark = pytest.mark.mpi

NODES, FILES, THREADS = 2, 2000, 8
SAMPLE = 8  # door_peer.c's PEER_SAMPLE

READER = r"""
import os, sys
from concurrent.futures import ThreadPoolExecutor
from monarch.tools.workload import digest, load_manifest
root, manifest = sys.argv[1], load_manifest(sys.argv[2])
names = sorted(manifest)[:int(sys.argv[4])]
def check(rel):
    with open(os.path.join(root, rel), "rb") as f:
        data = f.read()
    return len(data) == manifest[rel]["size"] and digest(data) == manifest[rel]["xxh64"]
with ThreadPoolExecutor(int(sys.argv[3])) as pool:
    ok = all(pool.map(check, names))
sys.exit(0 if ok else 1)
"""


def config(base, root, total):
    """Each node: a RAM tier for its half and some (placed by count, a node's half of the files may
    be 51 % of their bytes), a peer area for most of the other half: less than the dataset in all,
    so the nodes shard it (bench_peer's layout)."""
    return ram_peer_config(base, root, int(total * 0.60), int(total * 0.38), NODES, "memfd.yaml")


def files_under(path):
    return sum(1 for _, _, fs in os.walk(path) for f in fs if not f.startswith(".monarch"))  # no marker, lock, temporary


def start(short_tmp, ds):
    cfg = config(short_tmp, ds.root, ds.allocated)
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    deadline = time.monotonic() + 60
    while sum(files_under(f"/dev/shm{short_tmp}/ram{k}") for k in range(NODES)) < FILES:  # each owner staged its half
        if time.monotonic() > deadline:
            cluster.kill()
            pytest.fail("the owners did not stage their halves in 60 s")
        time.sleep(0.1)
    return cluster


def epoch(cluster, ds, n, files=FILES):
    """Node 0 reads the first ``files`` files once (8 threads); its report after the epoch: the door's counts
    and the opens by where they were served."""
    report = os.path.join(cluster.base, f"epoch{n}.json")
    run = subprocess.run([sys.executable, "-m", "monarch", "run", "-c", cluster.cfg, "--report", report, "--",
                          sys.executable, "-c", READER, ds.root, ds.manifest, str(THREADS), str(files)],
                         env=monarch_env(MONARCH_NODE=0), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr  # every digest right
    rep = json.load(open(report))
    door = next(node["front_door"] for node in rep["nodes"] if node["node"] == 0)
    return door, rep["opened_from"]


def test_files_read_once_are_answered_as_memfds_in_batches(dataset, short_tmp):
    ds = dataset(files=FILES, size="4KiB")
    cluster = start(short_tmp, ds)  # room for 9 in 10 remote files: the rule, not the room, decides
    try:
        door, opened = epoch(cluster, ds, 1)
        area = files_under(f"/dev/shm{short_tmp}/peer0")
    finally:
        assert cluster.stop(range(NODES)) == 0
    remote = opened["peer"]["opens"]
    assert remote > FILES // 3 and opened["pfs"]["opens"] == 0, opened
    assert not door["peer_fetch_failures"]
    # the area holds only the sample the door measures reuse with; every other file was a memfd
    # (but an open the door handed to Python while it was not copying, which Python's path
    # serves: one such in a run of the whole suite on 2 cores)
    python = door["handed_over_because"].get("not_copying", 0)
    assert remote - python <= door["peer_fetches"] + door["peer_transient"] <= remote, json.dumps(door)
    assert door["peer_fetches"] <= remote // SAMPLE + 1 and area <= remote // SAMPLE + 2, (area, door["peer_fetches"])
    assert door["peer_area_rule"]["keep_all"] is False and door["peer_area_rule"]["reuse"] < 0.5, door["peer_area_rule"]
    # 8 readers, one owner: their opens went to it gathered, more than one file per request
    assert door["peer_batched"] == remote and door["peer_batches"] < remote


def test_a_dataset_reread_epoch_after_epoch_ends_up_read_from_the_peer_area(dataset, short_tmp):
    ds = dataset(files=FILES, size="4KiB")
    cluster = start(short_tmp, ds)
    try:  # the first 60%: the area holds every remote file among them
        counts = [epoch(cluster, ds, n, files=FILES * 6 // 10) for n in range(1, 6)]
        area = files_under(f"/dev/shm{short_tmp}/peer0")
    finally:
        assert cluster.stop(range(NODES)) == 0
    remote = counts[0][1]["peer"]["opens"]
    per_epoch = [door["peer_fetches"] + door["peer_transient"] for door, _ in counts]  # a run's report: its own
    assert per_epoch[0] == remote  # epoch 1: every remote file fetched, most of them as memfds ...
    assert counts[0][0]["peer_fetches"] <= remote // SAMPLE + 1
    # ... then the sample kept in the area was opened again: the door keeps every fetch there
    seen = [(door["peer_fetches"], door["peer_transient"], door["peer_area_rule"], opened["peer"]["opens"])
            for door, opened in counts]
    assert counts[-1][0]["peer_area_rule"]["keep_all"] is True, seen
    # and the last epoch is served from the area (the shim opens the copies itself): fetched, only
    # what did not get in before (no room lent at the time: the door answered a memfd)
    assert per_epoch[-1] <= remote // 10, seen
    assert area >= remote - remote // 20, (area, seen)
    assert all(opened["pfs"]["opens"] == 0 for _, opened in counts)
