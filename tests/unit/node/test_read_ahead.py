"""This node's read-ahead started in the lanes the table names: alone the door's lane first (the
stager alone when the door cannot), nothing when the policy does not read ahead, a cluster's
stager this node's own files first then the second copies, a door started late runs its lane
only alone, and the door never copies where the table says it may not."""

from __future__ import annotations

from types import SimpleNamespace

from monarch.node.read_ahead import ReadAhead
from monarch.node.stage.read_ahead_modes import Where

FILES = {"b": SimpleNamespace(size=1), "a": SimpleNamespace(size=2)}


class Stager:
    def __init__(self):
        self.ahead: list[list[str]] = []
        self.replicas: list[list[str]] = []

    def read_ahead(self, keys):
        self.ahead.append(list(keys))


class Keeper:
    """The door's keeper: its lane runs (``runs``) or not (no raw first tier)."""

    def __init__(self, runs: bool):
        self.runs = runs
        self.asked: list = []

    def read_ahead(self, files, stager, sample, closing, absorb, order):
        self.asked.append(order)
        return self.runs


class Role:
    def __init__(self, sharded: bool, datapath=None):
        self._sharded = sharded
        self.cluster = SimpleNamespace(datapath=datapath, collective=True)
        self.peer_cache = self.peer_area = None  # no peer lane
        self.started = False

    def sharded(self) -> bool:
        return self._sharded

    def where(self) -> Where:
        return Where.SHARDED if self._sharded else Where.REPLICATING

    def start(self) -> None:
        self.started = True

    def owns(self, key: str) -> bool:
        return key == "a"

    def read_ahead_order(self, keys):
        return (k for k in keys if self.owns(k))

    def keep_replicas(self, stager, keys) -> None:
        stager.replicas.append(list(keys()))


def make(policy: str, keeper: Keeper | None = None, role: Role | None = None):
    stager = Stager()
    current = SimpleNamespace(ready=True, stager=stager, snapshot=SimpleNamespace(files=FILES),
                              gate=SimpleNamespace(closing=False))
    tiers = [SimpleNamespace(keep=False, codec=None)]
    opened = []
    ahead = ReadAhead(policy, current, tiers, role, False, None, "", lambda: keeper, lambda: opened.append(1),
                      lambda: None)
    return ahead, stager, opened


def test_alone_the_doors_lane_reads_ahead_and_the_stager_takes_what_it_cannot():
    ahead, stager, opened = make("read-ahead", keeper := Keeper(runs=True))
    ahead.start()
    assert keeper.asked == [iter] and opened == [1] and stager.ahead == []  # the large files are the keeper's to give
    ahead, stager, _ = make("read-ahead", keeper := Keeper(runs=False))
    ahead.start()
    assert len(keeper.asked) == 1 and stager.ahead == [["a", "b"]]  # every file, sorted
    ahead, stager, _ = make("read-ahead")
    ahead.start()
    assert stager.ahead == [["a", "b"]]


def test_nothing_reads_ahead_on_access_or_off():
    for policy in ("on-access", "off"):
        ahead, stager, _ = make(policy, keeper := Keeper(runs=True))
        ahead.start()
        ahead.door_started()
        assert keeper.asked == [] and stager.ahead == []


def test_a_cluster_node_reads_its_own_files_first_then_keeps_second_copies():
    for role in (Role(sharded=False, datapath=object()), Role(sharded=True)):
        ahead, stager, _ = make("read-ahead", keeper := Keeper(runs=True), role)
        ahead.start()
        assert role.started and keeper.asked == []  # no peer lane: the door does not know the owners
        assert stager.ahead == [["a"]] and stager.replicas == [["a", "b"]]


def test_a_door_started_late_runs_its_lane_alone_only():
    ahead, _, _ = make("read-ahead", keeper := Keeper(runs=True))
    ahead.door_started()
    assert keeper.asked == [iter]
    ahead, _, _ = make("read-ahead", keeper := Keeper(runs=True), Role(sharded=True, datapath=object()))
    ahead.door_started()  # the peer lane's to start
    assert keeper.asked == []


def test_the_door_copies_where_the_table_says():
    assert make("on-access", Keeper(runs=True))[0].door_may_copy()
    assert not make("off", Keeper(runs=True))[0].door_may_copy()
    assert not make("read-ahead", Keeper(runs=True), Role(sharded=False, datapath=object()))[0].door_may_copy()
    assert make("read-ahead", Keeper(runs=True), Role(sharded=True, datapath=object()))[0].door_may_copy()
    assert not make("read-ahead", Keeper(runs=True), Role(sharded=True))[0].door_may_copy()


def test_the_walks_questions_are_asked_before_the_layout():
    alone, _, _ = make("read-ahead", Keeper(runs=True))
    assert alone.streams() and not alone.walk_to_door()
    walking, _, _ = make("read-ahead", Keeper(runs=True), Role(sharded=False, datapath=object()))
    assert walking.streams() and walking.walk_to_door()
    assert not make("on-access", Keeper(runs=True))[0].streams()
