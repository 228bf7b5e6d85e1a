"""What killed daemons left, drained in the job's order across the nodes (monarch/writeback/across.py):
a file ordered after another node's operation is published only once that operation is known on
the PFS (drained now by another node, heard by its daemon, or left by a run that finished), else
kept and named; a partner's copy is drained only where no node holds its node's own area. Two
nodes' drains run here in threads, joined by an exchange in memory (MPI's: tests/mpi)."""

import os
import queue
import threading

from monarch.writeback.across import Exchange, drain_in_order, write_heard
from monarch.writeback.area import Area
from monarch.writeback.journal import Journal
from monarch.writeback.orphans import finished
from support.writeback import pending, tier_and_pfs

RUN = "job"


def left(base, node, files, after=()):
    """Node ``node``'s area as its killed daemon left it: ``files`` (name -> (path, bytes)) closed, none
    published, each ordered after ``after`` [(node, n)]."""
    area = Area.create(base, RUN, node)
    j = Journal(area.journal_path, durable=True)
    for seq, (path, data) in enumerate(files, 1):
        with open(area.data_path(seq), "wb") as f:
            f.write(data)
        j.append("close", seq=seq, path=str(path), mode=0o644, size=len(data), after=[list(a) for a in after])
    j.close()
    area.release()
    return area.path


class Pair(Exchange):
    """Two ranks' drains in one process: what one tells, the other hears (and the order it heard it in)."""

    def __init__(self, rank, boxes, gathered):
        self.rank, self.size, self._boxes, self._gathered = rank, 2, boxes, gathered
        self.heard_log = []

    def allgather(self, obj):
        self._gathered[self.rank] = obj
        self._gathered["barrier"].wait()
        return [self._gathered[0], self._gathered[1]]

    def start(self, heard):
        def receive():
            while (msg := self._boxes[self.rank].get()) is not None:
                self.heard_log.append(msg)
                heard(*msg)
        self._thread = threading.Thread(target=receive, daemon=True)
        self._thread.start()

    def tell(self, key, applied, failed, done):
        self._boxes[1 - self.rank].put((key, applied, failed, done))

    def finish(self):
        self._gathered["barrier"].wait()
        self._boxes[self.rank].put(None)
        self._thread.join()


def test_a_file_ordered_after_another_nodes_waits_for_that_nodes_drain(tmp_path):
    """Node 0's `.metadata` after node 1's shard (its operation 1): published only after node 1's
    drain published the shard, though node 0's drain starts with nothing to wait for on its own."""
    (tmp_path / "n0").mkdir()
    base0, pfs = tier_and_pfs(tmp_path / "n0")
    base1 = str(tmp_path / "n1-tier")
    os.mkdir(base1)
    left(base0, 0, [(pfs / ".metadata", b"meta")], after=[(1, 1)])
    left(base1, 1, [(pfs / "shard1", b"s" * 5_000_000)])
    order = []
    real = os.rename

    def rename(src, dst, *a, **kw):
        order.append(os.path.basename(dst))
        return real(src, dst, *a, **kw)
    boxes, gathered = [queue.Queue(), queue.Queue()], {"barrier": threading.Barrier(2)}
    results = {}

    def node(k, base):
        results[k] = drain_in_order(Area.orphans(base), Pair(k, boxes, gathered))
    os.rename = rename
    try:
        threads = [threading.Thread(target=node, args=(k, b)) for k, b in ((0, base0), (1, base1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        os.rename = real
    assert results[0][0].complete and results[1][0].complete and results[0][0].removed
    assert order == ["shard1", ".metadata"]
    assert (pfs / ".metadata").read_bytes() == b"meta" and (pfs / "shard1").stat().st_size == 5_000_000


def test_alone_a_file_ordered_after_an_unknown_operation_is_kept_and_named(tmp_path):
    base, pfs = tier_and_pfs(tmp_path)
    path = left(base, 0, [(pfs / "shard0", b"a"), (pfs / ".metadata", b"meta")], after=[(1, 1)])
    (d,) = drain_in_order(Area.orphans(base))
    assert not d.complete and not d.removed and os.path.isdir(path)
    assert list(d.outcome.unpublished) == [str(pfs / "shard0"), str(pfs / ".metadata")]
    assert "node 1's write-back operation 1" in d.outcome.failed and "every node at once" in d.outcome.failed
    assert os.listdir(pfs) == []


def test_what_the_daemon_heard_published_lets_the_file_go(tmp_path):
    base, pfs = tier_and_pfs(tmp_path)
    path = left(base, 0, [(pfs / ".metadata", b"meta")], after=[(1, 4), (2, 2)])
    fd = os.open(os.path.join(path, "heard"), os.O_RDWR | os.O_CREAT, 0o600)
    write_heard(fd, {1: 9, 2: 1})   # node 2 only up to 1: kept
    (d,) = drain_in_order(Area.orphans(base))
    assert not d.complete and "node 2's write-back operation 2" in d.outcome.failed
    write_heard(fd, {1: 9, 2: 2})
    os.close(fd)
    (d,) = drain_in_order(Area.orphans(base))
    assert d.complete and d.removed and (pfs / ".metadata").read_bytes() == b"meta"


def test_a_run_that_finished_on_another_node_left_what_it_published_beside_its_area(tmp_path):
    """Node 1's daemon finished cleanly: its area removed, what it published left beside it (DONE);
    a drain where both nodes' tiers are seen takes it."""
    base, pfs = tier_and_pfs(tmp_path)
    left(base, 0, [(pfs / ".metadata", b"meta")], after=[(1, 3)])
    done = Area.create(base, RUN, 1)
    done.remove(done={"applied": 3, "heard": {}})
    assert finished(base) == {(RUN, 1): {"applied": 3, "heard": {}}}
    (d,) = drain_in_order(Area.orphans(base), finished=finished(base))
    assert d.complete and (pfs / ".metadata").exists()


def test_alone_a_partners_copy_is_not_drained(tmp_path):
    """Node 1 holds node 0's copies: a drain of node 1 alone leaves them (node 0 may be draining its own
    area now); its own files are published and the area removed."""
    base, pfs = tier_and_pfs(tmp_path)
    path = left(base, 1, [(pfs / "own", b"mine")])
    copy = os.path.join(path, "held", "node0")
    os.makedirs(os.path.join(copy, "data"))
    j = Journal(os.path.join(copy, "journal"), durable=True)
    pending(Area(copy, -1), j, 1, pfs / "theirs", b"t")
    j.close()
    (d,) = drain_in_order(Area.orphans(base))
    assert d.complete and d.removed and d.held == {}
    assert sorted(os.listdir(pfs)) == ["own"]


def test_a_lost_nodes_copy_is_drained_where_no_node_holds_its_own_area(tmp_path):
    """Node 0 lost with its tier; node 1 (its partner) killed, its tier kept with node 0's copy. The
    drains of both nodes: node 1's drain publishes node 0's file from the copy, then its own file,
    ordered after it."""
    (tmp_path / "n1").mkdir()
    base1, pfs = tier_and_pfs(tmp_path / "n1")
    base0 = str(tmp_path / "n0-tier")  # wiped: nothing there
    os.mkdir(base0)
    path = left(base1, 1, [(pfs / ".metadata", b"meta")], after=[(0, 1)])
    copy = os.path.join(path, "held", "node0")
    os.makedirs(os.path.join(copy, "data"))
    j = Journal(os.path.join(copy, "journal"), durable=True)
    pending(Area(copy, -1), j, 1, pfs / "shard0", b"z" * 3_000_000)
    j.close()
    boxes, gathered = [queue.Queue(), queue.Queue()], {"barrier": threading.Barrier(2)}
    results = {}

    def node(k, base):
        results[k] = drain_in_order(Area.orphans(base), Pair(k, boxes, gathered))
    threads = [threading.Thread(target=node, args=(k, b)) for k, b in ((0, base0), (1, base1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    (d,) = results[1]
    assert d.complete and d.removed and d.held[0].published == [str(pfs / "shard0")]
    assert (pfs / "shard0").stat().st_size == 3_000_000 and (pfs / ".metadata").read_bytes() == b"meta"
    assert (pfs / "shard0").stat().st_ctime_ns <= (pfs / ".metadata").stat().st_ctime_ns  # (renamed first)


def test_what_an_earlier_run_of_the_same_name_left_is_not_taken_for_this_ones(tmp_path):
    """A standing cluster's runs share a name ("local"): the line an earlier one left when it finished
    is dropped when the run makes its area again, and never counts where the run's own area is left
    (else its files would be taken as published, their bytes removed)."""
    base, pfs = tier_and_pfs(tmp_path)
    Area.create(base, RUN, 1).remove(done={"applied": 50, "heard": {0: 50}})  # the earlier run's
    assert finished(base) == {(RUN, 1): {"applied": 50, "heard": {0: 50}}}
    Area.create(base, RUN, 1).release()  # this run's: the earlier line dropped
    assert finished(base) == {}
    left(base, 1, [(pfs / "shard1", b"s")])
    (tmp_path / "tier" / f"monarch-{os.getuid()}" / f"writeback-{RUN}-node1.done").write_text(
        '{"applied":50,"heard":{}}\n')  # (one left by any means beside this run's own area)
    assert finished(base) == {(RUN, 1): {"applied": 50, "heard": {}}}
    (d,) = drain_in_order(Area.orphans(base), finished=finished(base))
    assert d.complete and d.outcome.published == [str(pfs / "shard1")] and (pfs / "shard1").read_bytes() == b"s"
