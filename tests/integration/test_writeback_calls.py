"""The calls under a write-back path beyond open, close and rename (docs/consistency.md, "Write-back",
W1 and W5): chmod, utime, truncate, link and symlink act on the job's view in the job's order, and
msync(MS_SYNC) and sync_file_range(WAIT_AFTER) return once the PFS holds the bytes. Real jobs under
`monarch run`; the PFS is a directory the test (and the job, without the shim) reads directly."""

import hashlib
import os
import stat
import sys
import textwrap
import time

import pytest

from support.harness import finish_group, load, monarch, monarch_env, start_group
from support.writeback import writable_pfs_job
from test_writeback_jobs import config, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

METADATA = """
import os, stat, sys
ck = sys.argv[1]
os.umask(0o022)
big = os.path.join(ck, "big")
with open(big, "wb") as f:                 # pending a while: what follows names it
    f.write(os.urandom(4 << 20))
assert stat.S_IMODE(os.stat(big).st_mode) == 0o644   # pending: the mode it is published with
os.chmod(big, 0o604)
assert stat.S_IMODE(os.stat(big).st_mode) == 0o604
os.utime(big, ns=(1_000_000_000, 2_000_000_000))
assert os.stat(big).st_mtime_ns == 2_000_000_000
os.link(big, os.path.join(ck, "big.link"))
os.makedirs(os.path.join(ck, "step_2"))
os.symlink("../big", os.path.join(ck, "step_2", "latest"))
with open(os.path.join(ck, "step_2", "latest"), "rb") as f:
    assert len(f.read()) == 4 << 20
fd = os.open(os.path.join(ck, "open"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, b"x" * 1000)
os.truncate(os.path.join(ck, "open"), 10)  # by its path, while it is being written
os.fchmod(fd, 0o640)                       # the mode it is published with
os.close(fd)
assert os.path.getsize(os.path.join(ck, "open")) == 10
"""


def slow_writable_pfs(short_tmp, slow_pfs):
    """A PFS taking writes at 8 MB/s (a file is still pending when the calls after it come): its own
    directory, and the mount the job writes to."""
    pfs = os.path.join(short_tmp, "pfs-src")
    os.makedirs(pfs)
    return pfs, str(slow_pfs(pfs, writable=True, write_bandwidth_mbps=8, open_latency_ms=0).mountpoint)


def test_chmod_utime_link_symlink_and_truncate_act_on_the_jobs_view(dataset, short_tmp, slow_pfs):
    """A pending file's stat shows the mode it is published with; each call acts at once for the job and reaches the PFS after the data it names (the PFS takes
    writes at 8 MB/s: the file is still pending when they come; before, the calls went straight
    to the PFS, where it was not yet: ENOENT)."""
    ds = dataset(files=20)
    pfs, mounted = slow_writable_pfs(short_tmp, slow_pfs)
    r, report = run(short_tmp, ds.root, mounted, METADATA, mounted)
    assert r.returncode == 0, r.stderr
    big = os.stat(os.path.join(pfs, "big"))
    assert stat.S_IMODE(big.st_mode) == 0o604 and big.st_mtime_ns == 2_000_000_000 and big.st_size == 4 << 20
    assert os.path.samefile(os.path.join(pfs, "big"), os.path.join(pfs, "big.link"))
    assert os.readlink(os.path.join(pfs, "step_2", "latest")) == "../big"
    opened = os.stat(os.path.join(pfs, "open"))
    assert opened.st_size == 10 and stat.S_IMODE(opened.st_mode) == 0o640
    assert sorted(os.listdir(pfs)) == ["big", "big.link", "open", "step_2"]  # no temporary left
    assert report["nodes"][0]["writeback"]["failed"] is None


SYNCS = """
import ctypes, mmap, os, subprocess, sys
path, backing = sys.argv[1], sys.argv[2]
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
def on_pfs():  # as another node would read it: without the shim
    return subprocess.run(["cat", backing], env=env, capture_output=True).stdout
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED)
m[:5] = b"hello"
m.flush()                                  # msync(MS_SYNC)
assert on_pfs()[:5] == b"hello" and len(on_pfs()) == 1 << 20
m[5:11] = b" world"
m.close()
os.pwrite(fd, b"tail", (1 << 20) - 4)
libc = ctypes.CDLL(None, use_errno=True)
WAIT_BEFORE, WRITE, WAIT_AFTER = 1, 2, 4
assert libc.sync_file_range(fd, ctypes.c_int64(0), ctypes.c_int64(0), WAIT_BEFORE | WRITE | WAIT_AFTER) == 0
seen = on_pfs()
assert seen[:11] == b"hello world" and seen[-4:] == b"tail", seen[:11]
os.close(fd)
"""


def test_msync_and_sync_file_range_return_once_the_pfs_holds_the_bytes(dataset, short_tmp):
    ds = dataset(files=20)
    pfs = os.path.join(short_tmp, "pfs-out")
    os.makedirs(pfs)
    path = os.path.join(pfs, "mapped.bin")
    r, report = run(short_tmp, ds.root, pfs, SYNCS, path, path)
    assert r.returncode == 0, r.stderr
    with open(path, "rb") as f:
        data = f.read()
    assert data[:11] == b"hello world" and data[-4:] == b"tail" and len(data) == 1 << 20
    assert report["nodes"][0]["writeback"]["syncs"] == 2


ROOM = """
import hashlib, os, sys
ck, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
block = bytearray(1 << 20)
for i, size in enumerate(sizes):                 # each closed before the next: the drain frees room
    with open(os.path.join(ck, f"part-{i}"), "wb", buffering=0) as f:
        for k in range(size >> 20):
            block[:8] = (i * 1000 + k).to_bytes(8, "little")
            f.write(block)
    assert os.path.getsize(os.path.join(ck, f"part-{i}")) == size   # the job's view: whole at once
doomed = os.open(os.path.join(ck, "doomed"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for k in range(12):
    os.write(doomed, bytes(1 << 20))
os.unlink(os.path.join(ck, "doomed"))            # removed before its close: never published
os.close(doomed)
"""


def expected(i, size):
    block = bytearray(1 << 20)
    out = hashlib.md5()
    for k in range(size >> 20):
        block[:8] = (i * 1000 + k).to_bytes(8, "little")
        out.update(block)
    return out.hexdigest()


def test_a_full_room_makes_writes_wait_and_a_file_larger_than_it_is_written_through(dataset, short_tmp, slow_pfs):
    """Room 8 MiB, the PFS at 16 MB/s: 6 MiB files wait for the ones before them to drain (the bytes
    pending never pass the room); a 20 MiB file is written through to the PFS as it goes, and the
    report says so; a file written through that the job removed is gone from the PFS too."""
    src, ck, cfg = writable_pfs_job(short_tmp, dataset(files=20).root, slow_pfs, mbps=16, room="8MiB")
    src = os.path.join(src, "ck")
    sizes = [6 << 20, 6 << 20, 20 << 20, 6 << 20]
    r = monarch("run", "-c", cfg, "--report", os.path.join(short_tmp, "report.json"), "--no-progress", "--",
                sys.executable, "-c", textwrap.dedent(ROOM), ck, ",".join(map(str, sizes)))
    report = load(os.path.join(short_tmp, "report.json"))
    assert r.returncode == 0, r.stderr
    for i, size in enumerate(sizes):
        with open(os.path.join(src, f"part-{i}"), "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == expected(i, size), i
    assert sorted(os.listdir(src)) == [f"part-{i}" for i in range(len(sizes))]  # no temporary, no "doomed"
    wb = report["nodes"][0]["writeback"]
    assert wb["files_written_through"] == 2  # the 20 MiB file, and the 12 MiB one removed
    assert wb["peak_pending_bytes"] <= 8 << 20
    assert wb["waited_for_room"] >= 1
    assert wb["files_published"] == len(sizes) and wb["failed"] is None
    assert wb["app_write_seconds"] > 0


def test_a_job_that_only_saves_checkpoints_is_not_said_to_bypass_monarch(dataset, short_tmp):
    """The shim took the job's writes: no "not read through Monarch" warning, no shim-idle fallback."""
    ds = dataset(files=20)
    pfs = os.path.join(short_tmp, "pfs-out")
    os.makedirs(pfs)
    r, report = run(short_tmp, ds.root, pfs, "import sys; open(sys.argv[1], 'wb').write(b'x' * 4096)",
                    os.path.join(pfs, "only.ckpt"))
    assert r.returncode == 0, r.stderr
    assert "not read through Monarch" not in r.stderr
    assert [f["reason"] for f in report.get("fallbacks") or ()] == []


RENAMED_OPEN = """
import os, sys
ck = sys.argv[1]
tmp, final = os.path.join(ck, "model.tmp"), os.path.join(ck, "model")
f = open(tmp, "wb")
f.write(b"a" * (1 << 20))
f.flush()
os.fsync(f.fileno())           # its bytes so far on the PFS, under model.tmp
os.rename(tmp, final)          # still open (tempfile's persist, safetensors' save)
assert not os.path.exists(tmp) and os.path.getsize(final) == 1 << 20
f.write(b"tail")
f.close()
assert sorted(os.listdir(ck)) == ["model"], os.listdir(ck)
"""


def test_a_file_renamed_while_open_after_its_fsync_leaves_one_name(dataset, short_tmp, slow_pfs):
    """fsync, then a rename of the still open file, then more bytes: the PFS ends with the new name
    only, holding every byte (before, the fsync's copy stayed under the old name beside it)."""
    ds = dataset(files=10)
    pfs, mounted = slow_writable_pfs(short_tmp, slow_pfs)
    r, report = run(short_tmp, ds.root, mounted, RENAMED_OPEN, mounted)
    assert r.returncode == 0, r.stderr
    assert sorted(n for n in os.listdir(pfs) if not n.startswith(".")) == ["model"], os.listdir(pfs)
    with open(os.path.join(pfs, "model"), "rb") as f:
        assert f.read() == b"a" * (1 << 20) + b"tail"
    assert report["nodes"][0]["writeback"]["failed"] is None


SOLE_OPENER = """
import os, sys, threading
from monarch.node.writeback import sole_opener
path, stop = sys.argv[1], []
open(path, "wb").close()
def opener():  # another descriptor opened now and then: the partner copy's, the drain's, the job's
    while not stop:
        os.close(os.open(path, os.O_RDONLY))
t = threading.Thread(target=opener)
t.start()
held = sum(not sole_opener(path) for _ in range(20000))
stop.append(1)
t.join()
print("alive", held)
"""


def test_the_daemons_check_that_no_one_holds_a_file_survives_an_open_meanwhile(tmp_path):
    """The daemon asks whether a closed file is still held elsewhere by taking a lease and giving it
    back at once; an open in between breaks the lease and the kernel signals the holder. Before, that
    signal was SIGIO, whose default action ended the daemon (seen on 8 nodes: a daemon gone mid-save,
    its shard never published); now SIGURG, ignored."""
    import subprocess
    from support.harness import monarch_env
    ran = subprocess.run([sys.executable, "-c", SOLE_OPENER, str(tmp_path / "f")], env=monarch_env(),
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout.startswith("alive "), (ran.returncode, ran.stderr[-2000:])


ASKED = """
import os, sys
ck = sys.argv[1]
old = os.path.join(ck, "old")
for _ in range(20):                        # the PFS's own file: its stats and reads ask no one
    assert os.stat(old).st_size == 3
    with open(old, "rb") as f:
        assert f.read() == b"old"
os.mkdir(os.path.join(ck, "d"))            # pending: the PFS has none of these yet
fd = os.open(os.path.join(ck, "new.tmp"), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"new")
os.rename(os.path.join(ck, "new.tmp"), os.path.join(ck, "d", "new"))
assert os.path.isdir(os.path.join(ck, "d")) and sorted(os.listdir(ck)) == ["d", "old"], os.listdir(ck)
assert os.stat(os.path.join(ck, "d", "new")).st_size == 3 and os.listdir(os.path.join(ck, "d")) == ["new"]
assert not os.path.exists(os.path.join(ck, "new.tmp"))
os.close(fd)
"""


def test_the_shim_asks_the_daemon_only_for_the_paths_the_job_changed(dataset, short_tmp):
    """A stat, a read-only open or a listing of a path the job has not changed is the PFS's own: the
    shim answers it without a round trip to the daemon (the daemon's marks, writeback/marks.py, read
    in C); the paths the job changed and the PFS does not show yet are asked for, and seen as the job
    left them (a marked path the shim missed would be ENOENT here: the PFS has none of them). The
    calls go to the write-back calls' own socket."""
    ds = dataset(files=10)
    pfs = os.path.join(short_tmp, "pfs-out")
    os.makedirs(pfs)
    with open(os.path.join(pfs, "old"), "wb") as f:
        f.write(b"old")
    r = monarch("run", "-c", config(short_tmp, ds.root, pfs), "--no-progress", "--", sys.executable, "-c", ASKED, pfs,
                env=monarch_env(MONARCH_SHIM_DEBUG=2))
    assert r.returncode == 0, r.stderr[-4000:]
    asked = [line.split("write-back call ", 1)[1] for line in r.stderr.splitlines() if "write-back call " in line]
    resolved = [a.split(": ")[0][2:] for a in asked if a.startswith(("3 ", "9 "))]  # RESOLVE, LIST: the path
    assert not [p for p in resolved if p == os.path.join(pfs, "old")], resolved
    assert os.path.join(pfs, "d", "new") in resolved, resolved  # (open: pending until its close)
    assert asked and all(a.endswith("(its own socket)") for a in asked), asked  # (node/writeback_door.py)
    with open(os.path.join(pfs, "d", "new"), "rb") as f:
        assert f.read() == b"new"


AHEAD = """
import os, sys, time
ck, flag = sys.argv[1], sys.argv[2]
fd = os.open(os.path.join(ck, "model.pt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"m" * 100000)
deadline = time.time() + 60
while not os.path.exists(flag) and time.time() < deadline:  # the test looks at the PFS meanwhile
    assert os.listdir(ck) == ["model.pt"], os.listdir(ck)   # (the drain's temporary is not the job's)
    time.sleep(0.05)
os.fsync(fd)
with open(os.path.join(ck, "model.pt"), "rb") as f:
    assert f.read() == b"m" * 100000
os.write(fd, b"n" * 10)
os.close(fd)
"""


def test_under_fsync_pfs_a_files_create_on_the_pfs_is_made_while_the_job_writes(dataset, short_tmp, slow_pfs):
    """A direct job pays a file's create on the PFS at its open; under `fsync: pfs` the job's fsync
    waits for the PFS: the drain makes the file's hidden temporary there at its open, while the
    job writes (before, at the fsync: the create's round trips in the fsync's wait), and the fsync
    renames it over the name. The job never sees it; the PFS ends with the file alone, whole."""
    src, ck, cfg = writable_pfs_job(short_tmp, dataset(files=5).root, slow_pfs, mbps=64)
    flag = os.path.join(short_tmp, "go")
    job = start_group([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--",
                       sys.executable, "-c", AHEAD, ck, flag])
    made, deadline = [], time.time() + 30
    while not made and time.time() < deadline and job.poll() is None:
        made = [n for n in os.listdir(os.path.join(src, "ck")) if n.startswith(".model.pt.monarch-")]
        time.sleep(0.05)
    open(flag, "w").close()
    r = finish_group(job)
    assert r.returncode == 0, r.stderr[-3000:]
    assert made, "no temporary on the PFS before the job's fsync"
    assert os.listdir(os.path.join(src, "ck")) == ["model.pt"]
    with open(os.path.join(src, "ck", "model.pt"), "rb") as f:
        assert f.read() == b"m" * 100000 + b"n" * 10
