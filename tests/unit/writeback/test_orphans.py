"""What dead runs left of their write-back on a node (monarch/writeback/orphans.py): found apart
from live runs' areas and from the starting run's own, drained whole and removed, or kept and why."""

import fcntl
import os

from monarch.writeback.area import Area, run_and_node
from monarch.writeback.journal import Journal
from monarch.writeback.across import drain_in_order
from monarch.writeback.orphans import find_left
from support.writeback import checkpoint_journal, pending, tier_and_pfs


def test_an_areas_name_gives_its_run_and_node():
    assert run_and_node("writeback-job-2-node3") == ("job-2", "3")
    assert run_and_node("writeback-a-node5-node0") == ("a-node5", "0")
    assert run_and_node("writeback-x") == ("", "") and run_and_node("other-job-node0") == ("", "")


def test_the_starting_runs_own_areas_are_neither_drained_nor_held(tmp_path):
    base, pfs = tier_and_pfs(tmp_path)
    checkpoint_journal(base, pfs)  # run job1's, its daemon gone
    Area.create(base, "now", 0).release()  # the starting run's, being made by its daemon
    live = Area.create(base, "alive", 1)
    try:
        left_to_live, areas = find_left(base, but_run="now")
        assert [os.path.basename(p) for p in left_to_live] == ["writeback-alive-node1"]
        assert [os.path.basename(a.path) for a in areas] == ["writeback-job1-node0"]
        mine = os.path.join(os.path.dirname(areas[0].path), "writeback-now-node0", "owner.lock")
        fd = os.open(mine, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # not held by the drain: its daemon takes it
        finally:
            os.close(fd)
        (d,) = drain_in_order(areas)
        assert d.complete and d.removed and len(d.outcome.published) == 3
        assert (pfs / "ck" / "latest").read_bytes() == b"2\n"
    finally:
        live.release()


def test_a_refused_publish_keeps_the_area_and_says_what_stopped_it(tmp_path):
    base, pfs = tier_and_pfs(tmp_path)
    area = Area.create(base, "job", 0)
    j = Journal(area.journal_path, durable=True)
    pending(area, j, 1, pfs / "missing" / "model", b"m" * 10)
    j.close()
    area.release()
    (found,) = find_left(base)[1]
    (d,) = drain_in_order([found])
    assert not d.complete and not d.removed and d.error is None
    assert d.outcome.failed.startswith("close ") and list(d.outcome.unpublished) == [str(pfs / "missing" / "model")]
    (again,) = find_left(base)[1]  # released: the next drain takes it
    assert again.path == d.path and os.path.isdir(d.path)
    again.release()
