"""The read-ahead starts with the Python walk's first directories: copies are made while the
walk goes on, none is served before the index exists, a write during the walk drops its
early copy, and a kept tier (adopted only once the walk is whole) is not streamed. (The C
walk, monarch/node/snapshot/walker.c, is not streamed: it is whole before a Python walk would have
told its first directories; these tests switch it off.)"""

from __future__ import annotations

import os
import threading
import time

import pytest

from monarch.node import daemon as daemon_module
from monarch.node import resolver as resolver_module
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.snapshot.gate import SnapshotState
from monarch.node.snapshot.snapshot import take_snapshot
from support.harness import NO_RESERVE, make_bases

pytestmark = pytest.mark.timeout(60)

DIRS = ("a", "b", "c")
FILES = {f"{d}/f{i}.bin": os.urandom(2000 + 10 * i) for d in DIRS for i in range(3)}


def _tree(base) -> str:
    root = os.path.join(base, "pfs")
    for rel, data in FILES.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return root


def test_the_walk_tells_each_directorys_files_once_it_is_whole(short_tmp):
    root = _tree(short_tmp)
    told = []
    into = type(take_snapshot(()))((root,), {})
    snap = take_snapshot((root,), into=into, on_directory=lambda keys: told.append(sorted(keys)))
    assert snap.files is into.files and snap.dirs is into.dirs
    assert sorted(k for keys in told for k in keys) == sorted(f"0/{rel}" for rel in FILES)
    assert all(len({k.rsplit("/", 1)[0] for k in keys}) == 1 for keys in told)  # one directory per call


@pytest.fixture
def paused_walk(short_tmp, monkeypatch):
    """A daemon whose (Python) walk stops after its first directory until ``go`` is set."""
    monkeypatch.setenv("MONARCH_C_WALK", "0")
    root = _tree(short_tmp)
    first, go = threading.Event(), threading.Event()
    real = daemon_module.load_or_walk

    def walk(roots, cache, fresh=False, into=None, on_directory=None, manifest="", **kw):
        def told(keys):
            if on_directory is not None:
                on_directory(keys)
            if not first.is_set():
                first.set()
                assert go.wait(30)
        return real(roots, cache, fresh, into, told, manifest, **kw)

    monkeypatch.setattr(daemon_module, "load_or_walk", walk)
    made = []

    def start(keep=False):
        cfg = os.path.join(short_tmp, "c.yaml")
        with open(cfg, "w") as f:
            f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run"
tiers: [{{name: ram, path: "{short_tmp}/ram", capacity: 1MiB, keep: {str(keep).lower()}}}]
staging: {{policy: read-ahead, threads: 2, share: false}}
{NO_RESERVE}""")
        make_bases(cfg)
        d = NodeDaemon(load_config(cfg, env={"USER": "u"}), "r1", background=True)
        made.append(d)
        assert first.wait(30)
        return d
    yield start, go
    go.set()
    for d in made:
        d.gate.wait_settled(30)
        d.close()


def _copies(d) -> set[str]:
    tier = d.tiers[0]
    return {f"0/{rel}" for rel in FILES if os.path.exists(tier.path_for(f"0/{rel}"))}


def _wait_for(cond, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_copies_begin_while_the_walk_goes_on_and_none_is_served_before_the_index(paused_walk):
    start, go = paused_walk
    d = start()
    _wait_for(lambda: len(_copies(d)) >= 3)  # the first directory's files, copied mid-walk
    assert d.gate.state is SnapshotState.WALKING and not os.path.exists(d.index_path)
    assert d.resolver.resolve_now("0/a/f0.bin") in (None, resolver_module.PFS)  # no copy answered before the index
    go.set()
    assert d.gate.wait_settled(30) and d.gate.state is SnapshotState.READY and os.path.exists(d.index_path)
    _wait_for(lambda: len(_copies(d)) == len(FILES))
    for key in _copies(d):
        with open(d.tiers[0].path_for(key), "rb") as f:
            assert f.read() == FILES[key[2:]]
    assert d.stager.stats()["pfs_files_read"] == len(FILES)  # each file read once


def test_a_write_during_the_walk_drops_its_early_copy(paused_walk):
    start, go = paused_walk
    d = start()
    _wait_for(lambda: len(_copies(d)) >= 3)
    early = sorted(_copies(d))[0]
    d.invalidate(early)  # the job writes to it before the index exists
    go.set()
    assert d.gate.wait_settled(30)
    _wait_for(lambda: len(_copies(d)) == len(FILES) - 1)
    assert early not in _copies(d) and d.stager.where(early) is None


def test_a_kept_tier_is_not_streamed(paused_walk):
    start, go = paused_walk
    d = start(keep=True)
    time.sleep(0.5)
    assert _copies(d) == set()  # its copies wait for the adoption, after the walk
    go.set()
    assert d.gate.wait_settled(30)
    _wait_for(lambda: len(_copies(d)) == len(FILES))
