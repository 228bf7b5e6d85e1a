"""The daemon's resolve policy, with an in-process stand-in for the MPI peer layer."""

import collections
import hashlib
import os
import time

import pytest

from monarch import protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.resolver import PFS
from monarch.errors import PeerError
from monarch.node.snapshot.snapshot import take_snapshot
from support.harness import NO_RESERVE, make_bases, resolve


class FakeCluster:
    """Two nodes; keys are owned by the parity of their file number. ``mode`` makes the peer fail."""

    collective = False  # no collectives: no capacities exchanged, the walk not streamed
    datapath = None  # no C data path

    def __init__(self, node=0, mode="ok", delay=0.0):
        self.node, self.nodes, self.mode, self.delay = node, 2, mode, delay
        self.fetches = collections.Counter()
        self.loss_listeners = []

    def share(self, take):
        return take()

    def owner(self, key):
        return int(key.rsplit("f", 1)[1].split(".")[0]) % 2

    def start(self, provide, serve_threads=8, provide_range=None):
        self.provide, self.provide_range = provide, provide_range

    def on_loss(self, listener):
        self.loss_listeners.append(listener)

    def fetch(self, owner, key, dest, size=None):
        self.fetches[key] += 1
        time.sleep(self.delay)
        if self.mode != "ok":
            raise PeerError(f"node {owner}: {self.mode}")
        data = open(self.snapshot_source(key), "rb").read()
        with open(dest, "wb", closefd=False) as f:  # dest: the daemon's descriptor
            f.write(data)
        return len(data)

    def counters(self):
        return {"bytes_sent": 0, "bytes_received": 0}


@pytest.fixture
def setup(tmp_path):
    root = tmp_path / "pfs"
    root.mkdir()
    for i in range(8):
        (root / f"f{i}.bin").write_bytes(os.urandom(1000 + i))
    cfg = tmp_path / "c.yaml"
    unit = os.statvfs(tmp_path).f_frsize  # a copy takes whole blocks of the peer area's filesystem
    cfg.write_text(f"""dataset: {{roots: ["{root}"]}}
run_base: "{tmp_path}/run"
tiers: [{{name: ram, path: "{tmp_path}/ram", capacity: 1MiB}}]
peer: {{path: "{tmp_path}/peer", capacity: {2 * unit + unit // 2}, timeout: 0.2}}  # room for two files
staging: {{policy: on-access, threads: 2, resolve_timeout: 5, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)

    def make(cluster):
        config = load_config(str(cfg), env={"USER": "u"})
        snap = take_snapshot(config.dataset.roots)
        cluster.snapshot_source = snap.source_path
        return NodeDaemon(config, "r1", cluster=cluster)
    return make, root


def same_bytes(a, b):
    return hashlib.sha256(open(a, "rb").read()).digest() == hashlib.sha256(open(b, "rb").read()).digest()


def test_owned_files_are_staged_and_others_fetched_from_the_owner_once(setup):
    make, root = setup
    cluster = FakeCluster(node=0)
    d = make(cluster)
    slot, path = resolve(d, "0/f0.bin")
    assert slot == protocol.tier_slot(0) and same_bytes(path, root / "f0.bin")
    slot, path = resolve(d, "0/f1.bin")
    assert slot == protocol.SLOT_PEER and same_bytes(path, root / "f1.bin")
    assert resolve(d, "0/f1.bin") == (protocol.SLOT_PEER, path)
    assert cluster.fetches == {"0/f1.bin": 1}
    assert d.stager.stats()["pfs_bytes_read"] == 1000  # only the owned file came from the PFS
    assert cluster.provide("0/f2.bin") == d.tiers[0].path_for("0/f2.bin")


def test_a_dead_peer_is_waited_for_once_then_its_files_are_staged_here(setup):
    make, root = setup
    cluster = FakeCluster(node=0, mode="dead", delay=0.25)
    d = make(cluster)
    slot, path = resolve(d, "0/f1.bin")
    assert slot == protocol.tier_slot(0) and same_bytes(path, root / "f1.bin")
    t0 = time.monotonic()
    slot, path = resolve(d, "0/f3.bin")
    assert time.monotonic() - t0 < 0.2  # not waited for again
    assert slot == protocol.tier_slot(0) and same_bytes(path, root / "f3.bin")
    assert cluster.fetches == {"0/f1.bin": 1}
    assert d.stats()["resolves"]["peer_failed"] == 1 and d.peer_area.used == 0


def test_a_refusing_peer_is_asked_again_for_other_files(setup):
    make, _ = setup
    cluster = FakeCluster(node=0, mode="refused")
    d = make(cluster)
    assert resolve(d, "0/f1.bin")[0] == protocol.tier_slot(0)
    assert resolve(d, "0/f3.bin")[0] == protocol.tier_slot(0)
    assert cluster.fetches == {"0/f1.bin": 1, "0/f3.bin": 1}


def test_full_peer_area_keeps_the_peers_copy_in_a_tier(setup):
    """The peer area full, a file from its owner goes to the tiers (a replicated cluster
    holds the whole dataset from one PFS read), not to the PFS."""
    make, _ = setup
    cluster = FakeCluster(node=0)
    d = make(cluster)
    answers = [resolve(d, f"0/f{i}.bin")[0] for i in (1, 3, 5)]
    assert answers == [protocol.SLOT_PEER, protocol.SLOT_PEER, protocol.tier_slot(0)]
    stats = d.stats()
    assert "peer_area_full" not in stats["resolves"]
    assert stats["staging"]["peer_files_read"] == 3 and stats["staging"]["pfs_files_read"] == 0


def test_unknown_files_and_policy_off_read_the_pfs(setup, tmp_path):
    make, root = setup
    d = make(FakeCluster(node=0))
    assert resolve(d, "0/nope.bin") == PFS
    env = d.client_env()
    assert env[protocol.ENV_ROOTS] == f"0={root}"
    assert env[protocol.ENV_PROBE].endswith(f"{protocol.SLOT_PEER}={d.peer_area.path}")
    ram, peer = d.tiers[0].path, d.peer_area.path
    assert ram.startswith(f"{tmp_path}/ram/monarch-{os.getuid()}/r1-node0-")
    d.close()
    assert not os.path.exists(ram) and not os.path.exists(peer)
    assert os.path.isdir(tmp_path / "ram")  # the configured base itself stays


def test_a_peer_area_given_as_a_share_of_the_node_gets_that_share(tmp_path, monkeypatch):
    """peer.capacity: 50% is read when the daemon starts, as a tier's share is (here a node of 10,000 bytes)."""
    import monarch.node.tiers.tiers
    monkeypatch.setattr(monarch.node.tiers.tiers, "share_of_node", lambda path, share: (int(10_000 * share), "x"))
    root = tmp_path / "pfs"
    root.mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""dataset: {{roots: ["{root}"]}}
run_base: "{tmp_path}/run"
tiers: [{{name: ram, path: "{tmp_path}/ram", capacity: 1MiB}}]
peer: {{path: "{tmp_path}/peer", capacity: 50%}}
staging: {{policy: on-access, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)
    config = load_config(str(cfg), env={"USER": "u"})
    cluster = FakeCluster(node=0)
    cluster.snapshot_source = take_snapshot(config.dataset.roots).source_path
    d = NodeDaemon(config, "r1", cluster=cluster)
    try:
        assert d.peer_area.capacity == 5_000
    finally:
        d.close()


def test_the_snapshot_is_kept_out_of_the_garbage_collectors_walks(setup):
    """The snapshot's entries (millions for a large dataset) live for the job; a full collection
    walking them holds the GIL for every open being answered (0.23 s at 1M files), so the daemon
    freezes them once the snapshot is ready: they are in the collector's permanent generation."""
    import gc
    make, root = setup
    gc.unfreeze()  # what earlier tests froze: count only this daemon's
    try:
        d = make(FakeCluster(node=0))
        try:
            entries = list(d.snapshot.files.values())
            assert len(entries) == 8
            assert gc.get_freeze_count() >= len(entries) + 1  # the entries and their mapping, at least
        finally:
            d.close()
    finally:
        gc.unfreeze()


def test_a_fallback_for_an_undeclared_reason_is_counted_not_raised(setup):
    """The stager tells the daemon why a peer could not help (replicating); a reason that
    outcomes.py does not declare must still be counted, never fail the copy it came from."""
    make, _ = setup
    d = make(FakeCluster(node=0))
    d._count_fallback("peer_down")
    d._count_fallback("a_reason_from_the_future")
    assert d.stats()["resolves"] == {"peer_down": 1, "peer_failed": 1}
    d.close()
