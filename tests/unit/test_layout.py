"""Run directories: finished ones are pruned to the newest few; live, foreign and unmarked
ones are never touched."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from monarch import layout


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _marked(parent, name, pid, when, host=None):
    path = parent / name
    path.mkdir()
    (path / "report.json").write_text("{}")
    marker = path / layout.MARKER
    marker.write_text(json.dumps({"pid": pid, "started": None, "host": host or socket.gethostname(), "run": name}))
    os.utime(marker, (when, when))
    return path


def test_only_the_newest_finished_runs_are_kept(tmp_path):
    dead = _dead_pid()
    finished = [_marked(tmp_path, f"run{i:02d}-node0", dead, 1_000_000 + i) for i in range(25)]
    alive = _marked(tmp_path, "live-node0", os.getpid(), 1)  # oldest of all, but running
    foreign = _marked(tmp_path, "other-node0", dead, 2, host="another-host")
    unmarked = tmp_path / "snapshots"
    unmarked.mkdir()
    removed = layout.prune_finished_runs(str(tmp_path), keep=20)
    assert sorted(removed) == sorted(str(p) for p in finished[:5])  # the five oldest finished
    assert all(p.exists() for p in finished[5:])
    assert alive.exists() and foreign.exists() and unmarked.exists()
    assert layout.prune_finished_runs(str(tmp_path), keep=20) == []


def test_the_current_run_is_spared(tmp_path):
    dead = _dead_pid()
    mine = _marked(tmp_path, "mine-node0", dead, 1)
    _marked(tmp_path, "newer-node0", dead, 2)
    assert layout.prune_finished_runs(str(tmp_path), keep=0, spare=str(mine)) == [str(tmp_path / "newer-node0")]
    assert mine.exists()


def _made(parent, name, kind, when):
    """A directory of ``kind`` marked by a process that is gone."""
    path = _marked(parent, name, _dead_pid(), when)
    marker = json.loads((path / layout.MARKER).read_text())
    (path / layout.MARKER).write_text(json.dumps(marker | {"kind": kind}))
    os.utime(path / layout.MARKER, (when, when))
    return path


def test_tier_clean_up_leaves_finished_runs_in_a_shared_base(tmp_path):
    # the shipped defaults: run_base and the SSD tier share ${TMPDIR:-/tmp}
    run = _made(tmp_path, "run-a-node0", "run", 1_000_000)
    tier = _made(tmp_path, "run-a-node0-0123abcd", "tier", 1_000_000)
    old_run = _marked(tmp_path, "run-b-node0", _dead_pid(), 1_000_001)         # a marker without a kind:
    old_tier = _marked(tmp_path, "run-b-node0-89abcdef", _dead_pid(), 1_000_001)  # told by the name
    assert sorted(layout.remove_leftovers(str(tmp_path))) == sorted([str(tier), str(old_tier)])
    assert run.exists() and old_run.exists() and (run / "report.json").exists()
    assert layout.prune_finished_runs(str(tmp_path), keep=20) == []  # only runs are pruned, to 20
    assert run.exists() and old_run.exists()


def test_more_than_twenty_finished_runs_prune_to_the_twenty_newest_and_no_tier_counts(tmp_path):
    runs = [_made(tmp_path, f"r{i:02d}-node0", "run", 1_000_000 + i) for i in range(23)]
    tier = _made(tmp_path, "r99-node0-00ff00ff", "tier", 2_000_000)  # newest, but not a run
    removed = layout.prune_finished_runs(str(tmp_path))
    assert sorted(removed) == sorted(str(p) for p in runs[:3])
    assert sum(p.exists() for p in runs) == layout.KEEP_FINISHED_RUNS == 20
    assert tier.exists()  # a tier's left-over goes with remove_leftovers, not here


def test_a_tier_directory_whose_marker_cannot_be_written_is_removed(tmp_path, monkeypatch):
    import errno

    import pytest

    def no_space(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(layout, "write_marker", no_space)
    with pytest.raises(OSError):
        layout.StorageDir.create(str(tmp_path), "run-x", 0)
    assert os.listdir(tmp_path / f"monarch-{os.getuid()}") == []  # no unmarked <run>-node0-<rand> left


def test_launchers_and_the_daemon_name_one_socket(tmp_path):
    """`monarch stop`, attaching launchers and the daemon's instance agree on one path."""
    from monarch.node.instance import Instance
    base = tmp_path / "base"
    base.mkdir()
    expected = os.path.join(os.path.realpath(base), f"monarch-{os.getuid()}", "job.3-node2", "daemon.sock")
    assert layout.socket_path(str(base), "job.3", 2) == expected
    instance = Instance(layout.run_dir(str(base), "job.3", 2))
    try:
        assert instance.public_socket_path == expected
    finally:
        instance.release()


# -- liveness across PID namespaces: a container's run shares the host's /dev/shm or /tmp ----------

OTHER_NS = "pid:[1]"  # never a real PID namespace's inode: another namespace than this test's
LOCKS = {"run": "daemon.lock", "tier": ".monarch-run.lock"}  # what each kind's maker holds, as markers name it


def _foreign(parent, name, kind, lock, when=1_000_000):
    """A directory marked by a process of another PID namespace (its pid, 10 there, names
    nothing or anything here), holding the kind's lock file if ``lock``; the lock's fd, held
    (exclusively, as its maker holds it) or None."""
    path = _marked(parent, name, 10, when)
    marker = json.loads((path / layout.MARKER).read_text())
    name_of_lock = LOCKS[kind]
    marker |= {"kind": kind, "pidns": OTHER_NS, "started": 12345.0}
    fd = None
    if lock:
        marker["lock"] = name_of_lock
        fd = os.open(path / name_of_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
    (path / layout.MARKER).write_text(json.dumps(marker))
    os.utime(path / layout.MARKER, (when, when))
    return path, fd


def test_a_live_run_of_another_pid_namespace_is_judged_by_its_lock_not_its_pid(tmp_path):
    tier, tier_fd = _foreign(tmp_path, "ctr-node0-0123abcd", "tier", lock=True)
    run, run_fd = _foreign(tmp_path, "ctr-node0", "run", lock=True)
    assert layout.remove_leftovers(str(tmp_path)) == []
    assert layout.prune_finished_runs(str(tmp_path), keep=0) == []
    assert tier.exists() and run.exists()
    os.close(tier_fd)  # its maker is gone: the kernel released the lock
    os.close(run_fd)
    assert layout.remove_leftovers(str(tmp_path)) == [str(tier)]
    assert layout.prune_finished_runs(str(tmp_path), keep=0) == [str(run)]
    assert not tier.exists() and not run.exists()


def test_a_marker_of_another_pid_namespace_without_a_lock_is_never_judged(tmp_path):
    tier, _ = _foreign(tmp_path, "ctr-node0-0123abcd", "tier", lock=False)
    run, _ = _foreign(tmp_path, "ctr-node0", "run", lock=False)
    assert layout.remove_leftovers(str(tmp_path)) == []
    assert layout.prune_finished_runs(str(tmp_path), keep=0) == []
    assert tier.exists() and run.exists()


def test_a_held_lock_keeps_a_directory_whose_maker_pid_is_gone(tmp_path):
    """In this namespace too: a process that inherited the lock (a fork) still uses it."""
    tier, fd = _foreign(tmp_path, "r-node0-0123abcd", "tier", lock=True)
    marker = json.loads((tier / layout.MARKER).read_text())
    here = os.readlink("/proc/self/ns/pid")
    (tier / layout.MARKER).write_text(json.dumps(marker | {"pid": _dead_pid(), "pidns": here}))
    assert layout.remove_leftovers(str(tmp_path)) == []
    os.close(fd)
    assert layout.remove_leftovers(str(tmp_path)) == [str(tier)]


def test_a_storage_directory_is_locked_for_its_makers_life(tmp_path):
    first = layout.StorageDir.create(str(tmp_path), "first", 0)
    marker = json.loads(open(os.path.join(first.path, layout.MARKER)).read())
    # as a second job in another PID namespace sees it: the pid is not its to judge
    (Path(first.path) / layout.MARKER).write_text(json.dumps(marker | {"pidns": OTHER_NS, "pid": 10}))
    second = layout.StorageDir.create(str(tmp_path), "second", 0)
    assert os.path.isdir(first.path)
    assert marker.get("lock") == LOCKS["tier"] and marker.get("pidns") == os.readlink("/proc/self/ns/pid")
    first.release()  # as its process's death would
    third = layout.StorageDir.create(str(tmp_path), "third", 0)
    assert not os.path.exists(first.path)
    for s in (second, third):
        s.remove()
        assert not os.path.exists(s.path)
