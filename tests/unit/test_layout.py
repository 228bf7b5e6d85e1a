"""Run directories: finished ones are pruned to the newest few; live, foreign and unmarked
ones are never touched."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

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
