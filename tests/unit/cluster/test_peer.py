"""Without MPI failure notices (no MPI_Comm_get_failed) the engine asks once, not every tick."""

from monarch.cluster.peer import Cluster


class FakeMPI:
    TAG_UB = 0
    UNDEFINED = -32766

    class Exception(Exception):
        pass


class NoFailureNotices:
    def __init__(self):
        self.asked = 0

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def Get_attr(self, key):
        return 32767

    def Ack_failed(self):
        # what mpi4py raises for an MPI routine the loaded library lacks (an MPI without ULFM's calls)
        self.asked += 1
        raise NotImplementedError("MPI_Comm_ack_failed")


def test_an_mpi_without_failure_notices_is_asked_once():
    comm = NoFailureNotices()
    cluster = Cluster(FakeMPI, comm)
    for _ in range(5):
        cluster._check_failed()
    assert comm.asked == 1 and not cluster._lost


class FailureNotices(NoFailureNotices):
    """An MPI that names no failed rank (MPICH 5 answers an empty group)."""

    def Ack_failed(self):
        self.asked += 1
        raise FakeMPI.Exception("no failure notices here")


def test_fetch_before_start_fails_with_its_reason_and_counts_it():
    from monarch.errors import FailureReason, PeerError
    cluster = Cluster(FakeMPI, NoFailureNotices(), peer_timeout=2.5)
    assert cluster.peer_timeout == 2.5
    try:
        cluster.fetch(1, "0/a", "/nonexistent")
    except PeerError as e:
        assert e.reason is FailureReason.NOT_RUNNING and "not running" in str(e)
    else:
        raise AssertionError("fetch() without a running peer layer must raise")
    try:
        cluster.fetch(0, "0/a", "/nonexistent")  # this node itself: not a peer (not counted)
    except PeerError as e:
        assert e.reason is FailureReason.FAILED
    assert cluster.counters()["fetch_failures"] == {"not_running": 1}


def test_every_loss_listener_hears_of_a_lost_node_once(monkeypatch):
    from monarch.cluster import world
    monkeypatch.setattr(world._state, "failure_seen", False)  # a loss marks the process: undone after the test
    cluster = Cluster(FakeMPI, FailureNotices())
    heard = []
    cluster.on_loss(lambda node, why: heard.append(("first", node, why)))
    cluster.on_loss(lambda node, why: 1 / 0)  # a listener that fails does not stop the others
    cluster.on_loss(lambda node, why: heard.append(("second", node, why)))
    cluster._liveness.lose(1, "no heartbeat")
    cluster._liveness.lose(1, "no heartbeat")
    assert heard == [("first", 1, "no heartbeat"), ("second", 1, "no heartbeat")]
    assert [n["node"] for n in cluster.lost()] == [1] and cluster.owner("0/any") == 0


def test_peer_errors_keep_their_reason_through_pickle():
    import pickle

    from monarch.errors import FailureReason, PeerError
    e = pickle.loads(pickle.dumps(PeerError("fetch '0/a': node 1 refused: no", FailureReason.REFUSED)))
    assert e.reason is FailureReason.REFUSED and str(e) == "fetch '0/a': node 1 refused: no"
    assert PeerError("x").reason is FailureReason.FAILED and f"{FailureReason.PEER_LOST}" == "peer_lost"


class FakeDataPath:
    """What the C data path counted: files and spans, each way."""

    def counts(self):
        return {"served_files": 3, "served_bytes": 300, "fetched_files": 5, "fetched_bytes": 500,
                "served_ranges": 2, "served_range_bytes": 16 << 20, "fetched_ranges": 4,
                "fetched_range_bytes": 32 << 20}


def test_the_data_paths_files_and_spans_are_counted_apart():
    cluster = Cluster(FakeMPI, NoFailureNotices(), datapath=FakeDataPath())
    cluster._datapath_at_loss = {"served_files": 1, "served_bytes": 100, "fetched_files": 5, "fetched_bytes": 500}
    c = cluster.counters()
    assert (c["files_sent"], c["files_received"], c["ranges_sent"], c["ranges_received"]) == (3, 5, 2, 4)
    assert c["bytes_sent"] == c["wire_bytes_sent"] == 300 + (16 << 20)
    assert c["bytes_received"] == c["wire_bytes_received"] == 500 + (32 << 20)
    # the files crossed since a node was lost (spans are not files: never among them)
    assert c["after_loss"] == {"files_sent": 2, "bytes_sent": 200, "files_received": 0, "bytes_received": 0}
