"""What Monarch costs the PFS's metadata server, counted by the emulated PFS itself: the walk
stats each entry relative to its directory, the stager opens each file with one lookup and
checks the attributes that open fetched; and the directory descriptors behind that."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from monarch.node.snapshot.pfsmeta import DirFds, attrs_fresh_after_open, opened_stat
from monarch.node.snapshot.snapshot import take_snapshot, unchanged
from monarch.node.stage.sources import PFSSource, SourceChanged
from support.harness import CountingTally, door_on_socket

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(120)]

CLASSES, PER_CLASS = 4, 25


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "src" / "data"
    for c in range(CLASSES):
        for i in range(PER_CLASS):
            p = root / f"class{c}" / f"{i:03d}.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(1000 + i))
    return root


def _meta_ops(pfs) -> int:
    c = pfs.counters()
    return c["lookups"] + c["readdirs"]


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fds_under(path: str) -> int:
    """This process's descriptors of ``path`` and what is under it."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # listdir's own, closed since
            continue
        n += target == path or target.startswith(path + "/")
    return n


def test_walk_and_copies_cost_two_and_one_operations_per_file(slow_pfs, tree):
    pfs = slow_pfs(tree.parent, open_latency_ms=0)
    root = os.path.join(pfs.mountpoint, "data")
    fuse, local = os.open(root, os.O_RDONLY), os.open(tree, os.O_RDONLY)
    try:  # FUSE refreshes attributes at open (a lookup, entry timeout 0); local disks are asked
        assert attrs_fresh_after_open(fuse) and not attrs_fresh_after_open(local)
    finally:
        os.close(fuse)
        os.close(local)
    files = CLASSES * PER_CLASS
    before = _fds()
    pfs.reset_counters()
    snap = take_snapshot((root,))
    walk = _meta_ops(pfs)
    assert len(snap.files) == files and len(snap.dirs) == CLASSES + 1
    # two per file (a lookup and a getattr), a few per directory; by full path it was four per file
    assert walk <= 2 * files + 6 * (CLASSES + 1), walk

    source = PFSSource(snap)
    pfs.reset_counters()
    tally = CountingTally()
    copied = {}
    for key, info in sorted(snap.files.items()):
        out = copied[key] = io.BytesIO()
        assert source.copy(key, info, out, tally) == info.size
    source.close()
    copies = _meta_ops(pfs)
    assert pfs.counters()["reads"] == files  # a short read at the expected size ends a copy
    # one lookup per file; per directory its path once (its descriptor is kept); by full path
    # with an fstat it was four per file
    assert copies <= files + 3 * (CLASSES + 1), copies
    assert tally.files == files
    for key, out in copied.items():  # checked against the source tree, not through the mount
        want = hashlib.sha256((tree / key.partition("/")[2]).read_bytes()).digest()
        assert hashlib.sha256(out.getvalue()).digest() == want
    assert _fds() == before  # no directory descriptor left open


def test_a_reused_snapshot_checks_each_directory_once(slow_pfs, tree):
    pfs = slow_pfs(tree.parent, open_latency_ms=0)
    root = os.path.join(pfs.mountpoint, "data")
    snap = take_snapshot((root,))
    pfs.reset_counters()
    assert unchanged(snap)
    assert _meta_ops(pfs) <= 3 * (CLASSES + 1)
    os.utime(tree / "class1")  # its mtime moves, as when a name is added
    assert not unchanged(snap)


def test_a_file_replaced_after_the_walk_is_not_copied(tree):
    snap = take_snapshot((str(tree),))
    key = "0/class2/003.bin"
    path = tree / "class2" / "003.bin"
    new = tree / "class2" / "new"
    new.write_bytes(b"x" * snap.files[key].size)  # same size, another file (inode and mtime)
    os.utime(new, ns=(0, snap.files[key].mtime_ns + 10**9))
    os.rename(new, path)
    source = PFSSource(snap)
    with pytest.raises(SourceChanged):
        source.copy(key, snap.files[key], io.BytesIO(), CountingTally())
    source.close()


def test_a_directory_replaced_after_the_walk_is_opened_by_its_path(tree):
    snap = take_snapshot((str(tree),))
    key = "0/class0/001.bin"
    os.rename(tree / "class0", tree / "old")
    os.mkdir(tree / "class0")
    (tree / "class0" / "001.bin").write_bytes(b"new")
    dirs = DirFds(snap)
    with dirs.parent_of(key) as (fd, name, _):
        assert fd is None and name == "001.bin"  # not the directory the snapshot listed
    dirs.close()
    source = PFSSource(snap)
    with pytest.raises(SourceChanged):  # the path's file is not the snapshot's
        source.copy(key, snap.files[key], io.BytesIO(), CountingTally())
    source.close()


def test_directory_descriptors_are_bounded_and_never_closed_in_use(tree):
    snap = take_snapshot((str(tree),))
    before = _fds()
    dirs = DirFds(snap, limit=2)
    keys = [f"0/class{c}/000.bin" for c in range(CLASSES)]
    with dirs.parent_of(keys[0]) as (held, _, _):
        for key in keys[1:]:
            with dirs.parent_of(key) as (fd, name, _):
                assert fd is not None and os.stat(name, dir_fd=fd).st_size == snap.files[key].size
        assert _fds() <= before + 2
        dirs.forget("0/class0")  # in use: closed only when its user is done
        os.fstat(held)
        dirs.close()
        os.fstat(held)
    assert _fds() == before


def test_opened_stat_is_the_files_stat(tree):
    path = tree / "class3" / "007.bin"
    fd = os.open(path, os.O_RDONLY)
    try:
        got, st = opened_stat(fd), os.fstat(fd)
    finally:
        os.close(fd)
    assert (got.st_size, got.st_mtime_ns, got.st_ino, got.st_mode) == (st.st_size, st.st_mtime_ns,
                                                                        st.st_ino, st.st_mode)


def test_the_front_doors_copies_cost_one_operation_per_file(slow_pfs, tree, short_tmp):
    """The door's read-ahead lane copies as the stager does: one lookup per file (the open),
    its attributes checked as that open left them (no getattr round trip), a directory's path
    once per run of its files."""
    import time
    from monarch import frontdoor, protocol, routes
    if frontdoor.library() is None:
        pytest.skip("the front door cannot be built here")
    pfs = slow_pfs(tree.parent, open_latency_ms=0)
    root = os.path.join(pfs.mountpoint, "data")
    snap = take_snapshot((root,))
    files = CLASSES * PER_CLASS
    tier = os.path.join(short_tmp, "tier")
    os.mkdir(tier)
    slot = protocol.tier_slot(0)
    with door_on_socket(os.path.join(short_tmp, "door.sock"), [root], {slot: tier}, slot) as door:
        node = routes.NodeFacts(door=True)  # each file's route published as a lone node's daemon publishes it
        assert door.open("unused", bytearray(snap.index_bytes(routes.published(node, 1))))
        door.grant(64 << 20)
        door.copying(True)
        pfs.reset_counters()
        assert door.read_ahead(files, 1)  # one thread: the keys in index order, a directory at a time
        deadline = time.monotonic() + 60
        while door.read_ahead_state()["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert door.read_ahead_state()["copies"] == files
        copies = _meta_ops(pfs)
        assert copies <= files + 3 * (CLASSES + 1), copies  # an fstat after each open made it two per file
    for key in snap.files:
        assert (tree / key.partition("/")[2]).read_bytes() == (Path(tier) / key).read_bytes()


def _misses_in_random_order(slow_pfs, tmp_path, short_tmp, dirs: int, per_dir: int, keep_sources: bool):
    """Each file of ``dirs`` directories of ``per_dir`` read by its path, then asked of a front door
    (``keep_sources``: told it copies from the PFS, as the daemon tells it), both in one random
    order: the emulated PFS's counters of each pass, and the descriptors of the PFS held at the end
    of the door's pass and after it stopped. Every copy is checked against its source."""
    import random
    import socket
    from monarch import frontdoor, protocol, routes
    if frontdoor.library() is None:
        pytest.skip("the front door cannot be built here")
    root_src = tmp_path / "src" / "data"
    for d in range(dirs):
        for i in range(per_dir):
            p = root_src / f"d{d:02d}" / f"{i}.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(2000 + d + i))
    pfs = slow_pfs(root_src.parent, open_latency_ms=0)
    root = os.path.join(pfs.mountpoint, "data")
    snap = take_snapshot((root,))
    keys = sorted(snap.files)
    random.Random(5).shuffle(keys)
    tier = os.path.join(short_tmp, "tier")
    os.mkdir(tier)
    slot = protocol.tier_slot(0)
    sock = os.path.join(short_tmp, "door.sock")
    with door_on_socket(sock, [root], {slot: tier}, slot) as door:
        node = routes.NodeFacts(door=True)
        assert door.open("unused", bytearray(snap.index_bytes(routes.published(node, 1))))
        door.grant(64 << 20)
        door.copying(True)
        if keep_sources:
            door.keep_sources()
        pfs.reset_counters()  # direct: each file opened by its path, in the same order
        for key in keys:
            with open(os.path.join(root, key.partition("/")[2]), "rb") as f:
                f.read()
        direct = pfs.counters()
        pfs.reset_counters()
        for key in keys:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(sock)
                s.sendall(protocol.encode_request(protocol.VERB_OPEN, key.encode()))
                while protocol.recv_answer(s)[0] == protocol.STATUS_PENDING:
                    pass
        c = pfs.counters()
        held = _fds_under(root)
    for key in keys:
        assert (root_src / key.partition("/")[2]).read_bytes() == (Path(tier) / key).read_bytes()
    return c, direct, held, _fds_under(root)


def test_a_miss_in_random_order_costs_the_pfs_what_a_direct_open_does(slow_pfs, tmp_path, short_tmp):
    """Misses asked of the front door in random order over 50 directories: each costs the PFS the
    file's open and its lookups, as a direct open does. Before, the door opened each miss's source
    directory and asked its filesystem's type (a statfs), once per change of directory: one open
    of a directory and one statfs per miss in random order."""
    c, direct, _, _ = _misses_in_random_order(slow_pfs, tmp_path, short_tmp, 50, 2, keep_sources=False)
    assert c["opens"] == direct["opens"] == 100, (c, direct)
    assert c["statfs"] <= 1, c           # the root's filesystem asked once (was one per miss)
    assert c["opendirs"] <= 10, c        # a directory opened only for a run of its files (was one per miss)
    assert c["lookups"] <= direct["lookups"] + 10, (c, direct)


def test_a_miss_in_a_directory_the_door_keeps_costs_one_lookup_less_than_a_direct_open(slow_pfs, tmp_path,
                                                                                      short_tmp):
    """Told that it copies from the PFS, the door opens each of the index's directories once (O_PATH:
    a lookup, no open on the server) from its first miss, beside the job, and keeps it: a miss then
    costs the PFS its name's lookup and its open, where a direct open by path looks its directory
    up again too (the emulated PFS revalidates every name at every open, as its entry timeout is
    0). 50 directories of 4 files in random order: direct 2 lookups a file, the door 1 a file and
    1 a directory. Every descriptor is closed when the door stops."""
    files, dirs = 200, 50
    c, direct, held, left = _misses_in_random_order(slow_pfs, tmp_path, short_tmp, dirs, 4, keep_sources=True)
    assert c["opens"] == direct["opens"] == files, (c, direct)
    assert direct["lookups"] >= 2 * files, direct
    assert c["lookups"] <= files + dirs + 5, (c, direct)
    assert c["opendirs"] == 0 and c["statfs"] <= 1, c
    assert held == dirs + 1 and left == 0, (held, left)  # each directory and the root, then none


def test_a_job_given_a_manifest_asks_the_pfs_once_a_directory_not_once_a_file(slow_pfs, tree, short_tmp):
    """`monarch index` walks the dataset once; a job given its file (dataset.manifest) reads its
    snapshot from it, checked by one stat per directory: its namespace costs the PFS a few calls a
    directory where a walk costs two a file. Every byte a job reads is still the PFS's; a directory
    changed since the manifest was made is walked, and the report says why."""
    import json
    from support.harness import monarch, with_manifest, write_config
    pfs = slow_pfs(tree.parent, open_latency_ms=0)
    root = os.path.join(pfs.mountpoint, "data")
    files, dirs = CLASSES * PER_CLASS, CLASSES + 1
    manifest = os.path.join(short_tmp, "data.index")
    made = monarch("index", root, "-o", manifest)
    assert made.returncode == 0 and f"{files} files, {dirs} directories" in made.stdout, made.stdout + made.stderr
    cfg = with_manifest(write_config(short_tmp, root), root, manifest)
    one = os.path.join(root, "class0", "000.bin")
    stat_one = ["python3", "-c", f"import os; os.stat({one!r})"]

    def job(config, *cmd):
        report = os.path.join(short_tmp, "report.json")
        pfs.reset_counters()
        ran = monarch("run", "-c", config, "--no-progress", "--report", report, "--", *cmd)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        with open(report) as f:
            return _meta_ops(pfs), json.load(f)["nodes"][0]["snapshot"], ran.stdout
    calls, how, _ = job(cfg, *stat_one)
    assert how == "manifest" and calls <= 3 * dirs + 10, (how, calls)
    os.makedirs(os.path.join(short_tmp, "walk"))
    walked, how, _ = job(write_config(os.path.join(short_tmp, "walk"), root), *stat_one)  # the same, no manifest
    assert how.startswith("walked") and walked >= 2 * files, (how, walked)  # (its listings carry no d_type: each name stat'ed)
    print(f"the namespace's metadata calls: manifest {calls}, walk {walked} ({files} files, {dirs} directories)")
    digests = "; ".join(f"print(__import__('hashlib').sha256(open({os.path.join(root, f'class{c}', f'{i:03d}.bin')!r}, "
                        f"'rb').read()).hexdigest())" for c in range(CLASSES) for i in range(0, PER_CLASS, 5))
    _, how, out = job(cfg, "python3", "-c", digests)
    want = [hashlib.sha256((tree / f"class{c}" / f"{i:03d}.bin").read_bytes()).hexdigest()
            for c in range(CLASSES) for i in range(0, PER_CLASS, 5)]
    assert how == "manifest" and out.split()[:len(want)] == want
    (tree / "class2" / "new.bin").write_bytes(b"n")  # the dataset changed since the manifest
    _, how, _ = job(cfg, *stat_one)
    assert how.startswith("walked: a directory changed since the manifest"), how
