"""The peer layer's knobs (monarch/cluster/tuning.py): stated once, on the ``Cluster`` façade, which
every part reads them from; the heartbeats' order holds (ping before giving up)."""

from __future__ import annotations

import typing

from monarch.cluster.peer import Cluster
from monarch.cluster.tuning import HEARTBEAT, HEARTBEAT_TIMEOUT, REOWNED_WAIT, Tuning


class MPI:
    TAG_UB = 0


class Comm:
    def Get_rank(self):
        return 1

    def Get_size(self):
        return 3

    def Get_attr(self, key):
        return 32767


def test_a_silent_owner_is_pinged_before_it_is_given_up():
    assert 0 < HEARTBEAT < HEARTBEAT_TIMEOUT  # a ping has the time to be answered
    assert REOWNED_WAIT > 0


def test_the_cluster_gives_every_part_each_knob_of_the_tuning_interface():
    cluster = Cluster(MPI, Comm(), peer_timeout=2.5)
    knobs = typing.get_type_hints(Tuning)
    assert set(knobs) >= {"node", "nodes", "peer_timeout", "heartbeat_timeout", "chunk_size", "window"}
    missing = {name for name in knobs if not hasattr(cluster, name)}
    assert missing == set()
    wrong = {name: getattr(cluster, name) for name, kind in knobs.items()
             if not isinstance(getattr(cluster, name), (int, float) if kind is float else kind)}
    assert wrong == {}
    assert (cluster.node, cluster.nodes, cluster.peer_timeout) == (1, 3, 2.5)
    assert cluster.heartbeat_timeout == HEARTBEAT_TIMEOUT and cluster.chunk_size > 0 and cluster.window > 0
