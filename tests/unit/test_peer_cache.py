"""The sharded cluster's peer cache: from the owner into the area (LRU eviction), else a
transient sealed memfd; the PFS only when the owner fails."""

import os
import threading
import types

from monarch import protocol
from monarch.node import peer_cache
from monarch.cluster.capacity import REPLICATE, SHARD, decide
from monarch.config import TierConfig
from monarch.errors import PeerError
from monarch.node.tiers import Tier


def area(tmp_path, capacity):
    """A real peer-area tier (the cache reserves, publishes and evicts through the stager's books)."""
    (tmp_path / "peer").mkdir(exist_ok=True)
    return Tier.from_config(TierConfig("peer", str(tmp_path / "peer"), capacity), protocol.SLOT_PEER, "r1", 0, ())


class Owner:
    node = 0

    def __init__(self, data, fail=()):
        self.data, self.fail = data, set(fail)

    def owner(self, key):
        return 1

    def fetch(self, owner, key, dest):
        if key in self.fail:
            raise PeerError(f"fetch {key!r}: node 1 refused: no")
        with open(dest, "wb", closefd=not isinstance(dest, int)) as f:
            f.write(self.data[key])
        return len(self.data[key])


def ask(cache, key):
    got, ev = {}, threading.Event()
    cache.resolve(key, lambda a, o: (got.update(answer=a, outcome=o), ev.set()))
    assert ev.wait(10)
    return got["answer"], got["outcome"]


def test_cache_evicts_then_serves_transient_then_pfs_on_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_cache, "GRACE", 0.0)
    data = {f"k{i}": bytes([i]) * 1000 for i in range(4)}
    snap = types.SimpleNamespace(files={k: types.SimpleNamespace(size=1000, mtime_ns=0, mode=0o644) for k in data})
    cache = peer_cache.PeerCache(Owner(data, fail={"k3"}), area(tmp_path, 2500), snap, threads=2)
    for key in ("k0", "k1", "k2"):  # room for two: the third evicts the least recently used
        answer, outcome = ask(cache, key)
        assert outcome == "fetched" and open(answer[1], "rb").read() == data[key]
    assert not os.path.exists(cache.area.path_for("k0")) and cache.stats()["evictions"] == 1
    assert cache.area.used == 2000 and cache.area.files == 2
    monkeypatch.setattr(peer_cache, "GRACE", 3600.0)  # nothing may be evicted now: a transient copy
    answer, outcome = ask(cache, "k0")
    assert outcome == "fetched:transient" and answer[0] == protocol.SLOT_PEER | protocol.ANSWER_FD
    try:
        assert os.read(answer[1], 5000) == data["k0"]
    finally:
        os.close(answer[1])
    answer, outcome = ask(cache, "k3")
    assert answer == (protocol.SLOT_PFS, "") and outcome.startswith("pfs:peer_")
    st = cache.stats()
    assert (st["fetched"], st["transient"], sum(st["failures"].values())) == (3, 1, 1)
    cache.close()


def test_replicate_only_when_every_node_holds_the_dataset():
    assert decide([(60, 50), (100, 10)], 100)[0] == REPLICATE
    assert decide([(60, 50), (80, 10)], 100)[0] == SHARD
    assert decide([(1000, 0)], 100)[0] == SHARD  # one node: nothing to replicate
