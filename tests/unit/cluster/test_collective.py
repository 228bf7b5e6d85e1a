"""The job's collectives (monarch/cluster/collective.py) over a fake communicator (no MPI): node 0's
value to every node, length first; every node's integers to every node; a collective that does
not complete is given up at its deadline, or at once when a node is lost."""

from __future__ import annotations

import array
import time
from types import SimpleNamespace

import pytest

from monarch.cluster.collective import Collectives
from monarch.errors import FailureReason, PeerError


class FakeMPI:
    BYTE, INT64_T = "byte", "int64"

    class Exception(Exception):
        pass


class Request:
    def __init__(self, test=lambda: True):
        self.Test = test


class Comm:
    """One node's view of a world whose broadcasts node 0 recorded in ``sent`` (shared)."""

    def __init__(self, rank: int, size: int, sent: list, rows: list[list[int]] | None = None,
                 request: Request | None = None):
        self.rank, self.size, self.sent, self.rows = rank, size, sent, rows
        self.request = request
        self.received = 0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Ibcast(self, spec, root):
        buf = spec[0]
        if self.request is not None:
            return self.request
        if self.rank == root:
            self.sent.append(bytes(buf))
        else:
            buf[:] = self.sent[self.received]
            self.received += 1
        return Request()

    def Iallgather(self, send, recv):
        out = recv[0]
        flat = [v for row in self.rows for v in row]
        assert len(flat) == len(out) and list(send[0]) == self.rows[self.rank]
        out[:] = array.array("q", flat)
        return self.request or Request()


class Engine:
    def run(self, fn):
        return fn()  # the test is the engine thread


def collectives(rank, size, sent, rows=None, request=None, lost=None):
    checks = []
    liveness = SimpleNamespace(lost=lost if lost is not None else {}, check_failed=lambda: checks.append(1))
    coll = Collectives(FakeMPI, Comm(rank, size, sent, rows, request), Engine(), liveness)
    return coll, checks


def test_node_0s_value_reaches_every_node():
    sent: list = []
    value = {"0/a": (1, 2), "0/b": b"x" * 100_000}
    assert collectives(0, 3, sent)[0].share(lambda: value, timeout=10) == value
    assert len(sent) == 2 and int.from_bytes(sent[0], "little") == len(sent[1])  # the length, then the bytes
    assert collectives(1, 3, sent)[0].share(None) == value
    assert collectives(2, 3, sent)[0].share(None) == value


def test_a_failed_snapshot_is_node_0s_own_error_and_a_peer_error_elsewhere():
    sent: list = []

    def take():
        raise FileNotFoundError("no /pfs/ds")

    with pytest.raises(FileNotFoundError):
        collectives(0, 2, sent)[0].share(take)
    with pytest.raises(PeerError, match="node 0 could not take the dataset snapshot: FileNotFoundError: no /pfs/ds") \
            as e:
        collectives(1, 2, sent)[0].share(None)
    assert e.value.reason is FailureReason.FAILED


def test_an_empty_payload_crosses_as_its_length_alone():
    sent: list = []
    assert collectives(0, 2, sent)[0].bcast_bytes(b"", None) == bytearray()
    assert collectives(1, 2, sent)[0].bcast_bytes(None, None) == bytearray() and sent[0] == bytes(8)


def test_with_on_files_the_share_is_streamed_as_the_walk_goes():
    sent: list = []
    lead, follow = [], []
    assert collectives(0, 2, sent)[0].share(lambda publish: publish({"0/a": 1}) or "done", on_files=lead.append) \
        == "done"
    assert collectives(1, 2, sent)[0].share(None, on_files=follow.append) == "done"
    assert lead == follow == [{"0/a": 1}]


def test_every_nodes_integers_reach_every_node_in_node_order():
    rows = [[100, 10, 4096], [200, 20, 512], [300, 30, 0]]
    for rank in range(3):
        assert collectives(rank, 3, [], rows)[0].allgather_ints(rows[rank], timeout=5) == rows


def test_a_collective_that_does_not_complete_times_out():
    coll, _ = collectives(1, 2, [], request=Request(lambda: False))
    start = time.monotonic()
    with pytest.raises(PeerError, match="share\\(\\): node 0 did not send the dataset snapshot in time") as e:
        coll.bcast_bytes(None, time.monotonic() + 0.05)
    assert e.value.reason is FailureReason.TIMEOUT and time.monotonic() - start < 5


def test_a_lost_node_ends_the_wait_at_once_without_waiting_for_the_deadline():
    coll, checks = collectives(0, 3, [], rows=[[1], [2], [3]], request=Request(lambda: False),
                               lost={2: {"node": 2, "at": 0.0, "why": "proc failed"}})
    start = time.monotonic()
    with pytest.raises(PeerError, match=r"allgather_ints\(\): nodes \[2\] lost before every node took part") as e:
        coll.allgather_ints([1], timeout=3)  # lost first: well before this deadline
    assert e.value.reason is FailureReason.PEER_LOST and checks and time.monotonic() - start < 2


def test_an_mpi_error_while_waiting_is_a_lost_peer():
    def test():
        raise FakeMPI.Exception("MPI_ERR_PROC_FAILED")

    coll, checks = collectives(1, 2, [], request=Request(test), lost={0: {}})
    with pytest.raises(PeerError, match=r"share\(\): a node failed \(MPI_ERR_PROC_FAILED\); lost: \[0\]") as e:
        coll.bcast_bytes(None, None)
    assert e.value.reason is FailureReason.PEER_LOST and checks == [1]
