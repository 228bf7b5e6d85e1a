"""The sharded cluster's peer cache: from the owner into the area (LRU eviction), else a
transient sealed memfd; the PFS only when the owner fails."""

import os
import threading
import types

from monarch import protocol
from monarch.node.peer import peer_cache
from monarch.cluster.capacity import REPLICATE, SHARD, decide
from monarch.config import TierConfig
from monarch.errors import PeerError
from monarch.node.tiers.resources import allocated_size, allocation_unit
from monarch.node.tiers.tiers import Tier


def room_for(tmp_path, files):
    """Room for ``files`` files of 1000 bytes: what they take on the filesystem of ``tmp_path``."""
    return int(files * allocated_size(1000, allocation_unit(str(tmp_path))))


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

    def fetch(self, owner, key, dest, size=None):
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
    snap = types.SimpleNamespace(roots=("/pfs",), files={k: types.SimpleNamespace(size=1000, mtime_ns=0, mode=0o644)
                                                         for k in data})
    cache = peer_cache.PeerCache(Owner(data, fail={"k3"}), area(tmp_path, room_for(tmp_path, 2.5)), snap, threads=2)
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


class Gated(Owner):
    """An owner whose fetches wait for ``gate``; counts them by key."""

    def __init__(self, data, sizes=None):
        super().__init__(data)
        self.gate = threading.Event()
        self.fetches = {}
        self.sizes = sizes or {}

    def fetch(self, owner, key, dest, size=None):
        self.fetches[key] = self.fetches.get(key, 0) + 1
        assert self.gate.wait(10)
        n = super().fetch(owner, key, dest)
        return self.sizes.get(key, n)


def snapshot_of(data):
    return types.SimpleNamespace(roots=("/pfs",), files={k: types.SimpleNamespace(size=len(v), mtime_ns=0, mode=0o644)
                                                         for k, v in data.items()})


def test_concurrent_opens_of_one_key_share_one_fetch(tmp_path):
    data = {"k": b"x" * 1000}
    owner = Gated(data)
    cache = peer_cache.PeerCache(owner, area(tmp_path, 5000), snapshot_of(data), threads=4)
    got, lock, all_in = [], threading.Lock(), threading.Event()

    def done(answer, outcome):
        with lock:
            got.append((answer, outcome))
            if len(got) == 8:
                all_in.set()
    for _ in range(8):
        cache.resolve("k", done)
    assert len(cache.books.flights) == 1
    owner.gate.set()
    assert all_in.wait(10)
    assert owner.fetches == {"k": 1}
    assert set(got) == {((protocol.SLOT_PEER, cache.area.path_for("k")), "fetched")}
    assert ask(cache, "k") == ((protocol.SLOT_PEER, cache.area.path_for("k")), "already_fetched")
    st = cache.stats()
    assert (st["fetched"], st["fetched_bytes"], st["hits"], st["cached_files"]) == (1, 1000, 1, 1)
    assert cache.books.bytes_read["peer"] == 1000 and cache.books.files_read["peer"] == 1  # counted by source
    cache.close()


def test_concurrent_waiters_on_a_transient_copy_each_get_their_own_descriptor(tmp_path):
    data = {"k": bytes(range(256)) * 8}
    owner = Gated(data)
    cache = peer_cache.PeerCache(owner, area(tmp_path, 1000), snapshot_of(data), threads=2)  # never fits
    got, all_in = [], threading.Event()
    for _ in range(3):
        cache.resolve("k", lambda a, o: (got.append((a, o)), len(got) == 3 and all_in.set()))
    owner.gate.set()
    assert all_in.wait(10) and owner.fetches == {"k": 1}
    fds = [a[1] for a, o in got if o == "fetched:transient" and a[0] == protocol.SLOT_PEER | protocol.ANSWER_FD]
    try:
        assert len(set(fds)) == 3
        assert [os.read(fd, 5000) for fd in fds] == [data["k"]] * 3  # own offsets: each reads it whole
    finally:
        for fd in fds:
            os.close(fd)
    assert cache.area.used == 0 and not os.path.exists(cache.area.path_for("k"))
    assert cache.stats()["transient_bytes"] == 2048
    assert cache.area.refused == {}  # the cache's refusals are not the tier's
    cache.close()


def test_a_young_copy_is_not_evicted_and_a_wrong_size_is_corrupt(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_cache, "GRACE", 3600.0)
    data = {"a": b"a" * 1000, "b": b"b" * 1000}
    owner = Gated(data, sizes={"b": 999})
    owner.gate.set()
    cache = peer_cache.PeerCache(owner, area(tmp_path, room_for(tmp_path, 1.5)), snapshot_of(data), threads=2)
    assert ask(cache, "a")[1] == "fetched"
    data["c"] = b"c" * 1000
    cache.snapshot.files["c"] = types.SimpleNamespace(size=1000, mtime_ns=0, mode=0o644)
    assert ask(cache, "c")[1] == "fetched:transient"  # "a" is too young to go
    assert os.path.exists(cache.area.path_for("a")) and cache.stats().get("evictions", 0) == 0
    monkeypatch.setattr(peer_cache, "GRACE", 0.0)
    answer, outcome = ask(cache, "b")  # evicts "a", then the owner sends a wrong size: never published
    assert answer == (protocol.SLOT_PFS, "") and outcome == "pfs:peer_corrupt"
    assert cache.stats()["failures"] == {"corrupt": 1} and cache.stats()["evictions"] == 1
    assert not os.path.exists(cache.area.path_for("b")) and cache.area.used == 0
    assert [n for n in os.listdir(os.path.dirname(cache.area.path_for("b"))) if n.startswith(".monarch-tmp")] == []
    cache.close()


def test_close_answers_every_waiter(tmp_path):
    data = {f"k{i}": b"x" * 100 for i in range(4)}
    owner = Gated(data)
    cache = peer_cache.PeerCache(owner, area(tmp_path, 5000), snapshot_of(data), threads=1)
    got, all_in = {}, threading.Event()
    for key in data:
        cache.resolve(key, lambda a, o, key=key: (got.update({key: (a, o)}), len(got) == 4 and all_in.set()))
    cache.close()  # k0 is being fetched, the others wait for a thread
    owner.gate.set()
    assert all_in.wait(10)
    assert all(a == (protocol.SLOT_PFS, "") and o == "pfs:shutting_down" for a, o in got.values()), got
    assert not any(n for n in os.listdir(cache.area.path) if not n.startswith(".")) and cache.area.used == 0
    assert ask(cache, "k0") == ((protocol.SLOT_PFS, ""), "pfs:shutting_down")
