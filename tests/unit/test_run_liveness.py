"""Whether another run is alive is told by a lock it holds, never by a pid alone: a job in a
container (its own PID namespace) shares the host's /dev/shm and /tmp with other jobs whose
pids may be its own. The markers' part is in test_layout.py."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from monarch.errors import DaemonError
from monarch.node.instance import LOCK, Instance
from monarch.node.tiers.shared_set import LEASES, SharedSet, list_sets


@pytest.fixture
def base(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "root").mkdir()
    return str(tmp_path / "base"), (str(tmp_path / "root"),)


def test_a_job_with_another_live_jobs_run_and_pid_joins_beside_it(base):
    """Two containers' jobs: the same run id (MONARCH_JOB_ID), the same pid in each namespace."""
    b, roots = base
    first = SharedSet.join(b, roots, "other", 100, 0.0, 0.2)
    # the other namespace's job holds a lease with this job's name (its run, its pid)
    twin = f"train-{os.getpid()}"
    fd = os.open(os.path.join(first.control, LEASES, twin), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    joined: list[SharedSet] = []
    t = threading.Thread(target=lambda: joined.append(SharedSet.join(b, roots, "train", 100, 0.0, 0.2)),
                         daemon=True)
    t.start()
    t.join(10)
    assert joined, "the join waited for the other job's lease lock"
    second = joined[0]
    assert second.others_at_join == 2 and second.lease.startswith(f"{twin}-")
    assert sorted(os.listdir(os.path.join(second.control, LEASES))) == sorted([first.lease, twin, second.lease])
    assert [s.jobs for s in list_sets(os.path.dirname(second.path), count=False)] == [3]
    assert first.leave() is None and second.leave() is None and os.path.isdir(second.path)  # the twin's
    os.close(fd)


def test_a_lease_is_locked_before_it_is_seen(base, monkeypatch):
    """A job counting leases (outside the join lock) never finds a joining job's lease unlocked."""
    b, roots = base
    first = SharedSet.join(b, roots, "a", 100, 0.0, 0.2)
    leases = os.path.join(first.control, LEASES)
    seen: list[int] = []
    real_open = os.open

    def counting_open(path, flags, *args, **kw):  # another job counts at each file the joining one makes
        fd = real_open(path, flags, *args, **kw)
        if flags & os.O_CREAT and str(path).startswith(first.control + os.sep):
            seen.append(first.others_live())
        return fd
    monkeypatch.setattr(os, "open", counting_open)
    second = SharedSet.join(b, roots, "b", 100, 0.0, 0.2)
    monkeypatch.undo()
    assert seen and sorted(os.listdir(leases)) == sorted([first.lease, second.lease])
    assert first.others_live() == 1 and second.others_live() == 1
    second.leave()
    first.leave()


def test_a_claim_waits_out_a_judge_holding_the_lock_a_moment(tmp_path):
    """Others tell the run directory's daemon alive by taking its lock shared for a moment."""
    run_dir = str(tmp_path)
    fd = os.open(os.path.join(run_dir, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    threading.Timer(0.1, os.close, (fd,)).start()
    instance = Instance(run_dir)
    with pytest.raises(DaemonError, match="already serves"):
        Instance(run_dir)  # a live instance is still refused
    instance.release()
