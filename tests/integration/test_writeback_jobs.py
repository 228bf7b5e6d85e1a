"""Write-back under `monarch run` (docs/consistency.md, "Write-back"): a job's checkpoints land
on the node and reach the PFS complete, in order, after its fsyncs, and nothing it closed is lost
when it is killed. The PFS here is a directory the test reads without the shim."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from support.harness import load, monarch, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def config(base, root, ck, extra=""):
    return write_config(base, root, extra=f"writeback: {{paths: [{json.dumps(str(ck))}]}}\n{extra}")


def run(base, root, ck, script, *args, extra=""):
    report = os.path.join(base, "report.json")
    r = monarch("run", "-c", config(base, root, ck, extra), "--report", report, "--no-progress", "--",
                sys.executable, "-c", textwrap.dedent(script), *map(str, args))
    return r, load(report) if os.path.exists(report) else None


def areas(base):
    """The write-back areas left under the RAM tier's base (the first tier: write_config's)."""
    found = []
    for dp, dns, _ in os.walk(f"/dev/shm{base}"):
        found += [os.path.join(dp, d) for d in dns if d.startswith("writeback-")]
    return found


SAVE = """
import hashlib, json, os, sys
import numpy as np
ck = sys.argv[1]
weights = np.random.default_rng(7).standard_normal(300_000)
os.makedirs(ck, exist_ok=True)
with open(os.path.join(ck, "model.npy.tmp"), "wb") as f:  # as torch.save: a temporary name, then replace
    np.save(f, weights)
os.replace(os.path.join(ck, "model.npy.tmp"), os.path.join(ck, "model.npy"))
back = np.load(os.path.join(ck, "model.npy"))       # the job's own write, read back at once
assert np.array_equal(back, weights)
assert sorted(os.listdir(ck)) == ["model.npy"], os.listdir(ck)
assert os.path.getsize(os.path.join(ck, "model.npy")) == weights.nbytes + 128
print(hashlib.md5(weights.tobytes()).hexdigest())
"""


def test_a_checkpoint_saved_then_renamed_is_read_back_at_once_and_published_complete(dataset, short_tmp):
    pytest.importorskip("numpy")
    import numpy as np
    ds = dataset(files=20)
    pfs = os.path.join(short_tmp, "pfs-out")
    os.makedirs(pfs)
    ck = os.path.join(pfs, "ck")
    r, report = run(short_tmp, ds.root, pfs, SAVE, ck)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(ck)) == ["model.npy"]  # on the PFS: the final name only, no temporary left
    assert hashlib.md5(np.load(os.path.join(ck, "model.npy")).tobytes()).hexdigest() == r.stdout.strip()
    wb = report["nodes"][0]["writeback"]
    assert wb["files_published"] == 1 and wb["failed"] is None and wb["unpublished"] == {}
    assert wb["bytes_written"] == os.path.getsize(os.path.join(ck, "model.npy"))
    assert areas(short_tmp) == []  # nothing left on the node once published


FSYNC = """
import os, subprocess, sys
path, data = sys.argv[1], os.urandom(1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
os.write(fd, data)
os.fsync(fd)
# without the shim, as another node would: the PFS holds the bytes under the name once fsync returned
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
seen = subprocess.run(["cat", path], env=env, capture_output=True).stdout
assert seen == data, (len(seen), len(data))
os.write(fd, b"more")
os.close(fd)
"""


def test_fsync_returns_once_the_pfs_holds_the_bytes(dataset, short_tmp):
    ds = dataset(files=20)
    pfs = os.path.join(short_tmp, "pfs-out")
    os.makedirs(pfs)
    r, report = run(short_tmp, ds.root, pfs, FSYNC, os.path.join(pfs, "state.bin"))
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(os.path.join(pfs, "state.bin")) == (1 << 20) + 4  # then whole at its close
    assert os.stat(os.path.join(pfs, "state.bin")).st_mode & 0o777 == 0o640
    assert report["nodes"][0]["writeback"]["syncs"] == 1


SHARDS = """
import multiprocessing as mp, os, sys
ck, size = sys.argv[1], int(sys.argv[2])
def shard(rank, barrier):
    with open(os.path.join(ck, f"__{rank}_0.distcp"), "wb") as f:
        for _ in range(size // (1 << 20)):
            f.write(bytes([rank]) * (1 << 20))
    barrier.wait()
    if rank == 0:  # every shard closed before .metadata is opened: the job orders them
        with open(os.path.join(ck, ".metadata"), "wb") as f:
            f.write(b"metadata")
os.makedirs(ck)
barrier = mp.get_context("fork").Barrier(4)
procs = [mp.get_context("fork").Process(target=shard, args=(r, barrier)) for r in range(4)]
for p in procs: p.start()
for p in procs: p.join()
assert all(p.exitcode == 0 for p in procs)
"""


def test_shards_then_metadata_are_never_seen_out_of_order_or_short(dataset, short_tmp):
    """torch.distributed.checkpoint's pattern, 4 writers on a node, a watcher polling the PFS."""
    ds = dataset(files=20)
    pfs = os.path.join(short_tmp, "pfs-out")
    os.makedirs(pfs)
    ck, size = os.path.join(pfs, "step_100"), 8 << 20
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            try:
                names = os.listdir(ck)
            except FileNotFoundError:
                names = []
            sizes = {}
            for n in names:
                try:
                    sizes[n] = os.path.getsize(os.path.join(ck, n))
                except FileNotFoundError:
                    pass
            shards = [n for n in sizes if n.endswith(".distcp")]
            if ".metadata" in sizes and (len(shards) < 4 or any(sizes[n] < size for n in shards)):
                seen.append(("metadata before its shards", sizes))
            seen.extend(("short", n, s) for n, s in sizes.items() if not n.startswith(".monarch")
                        and n.endswith(".distcp") and s < size)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r, report = run(short_tmp, ds.root, pfs, SHARDS, ck, size)
    finally:
        stop.set()
        watcher.join()
    assert r.returncode == 0, r.stderr
    assert seen == []
    assert sorted(os.listdir(ck)) == [".metadata"] + [f"__{k}_0.distcp" for k in range(4)]
    for k in range(4):
        with open(os.path.join(ck, f"__{k}_0.distcp"), "rb") as f:
            assert f.read() == bytes([k]) * size
    assert report["nodes"][0]["writeback"]["files_published"] == 5


KILLED = """
import os, signal, sys
ck = sys.argv[1]
with open(os.path.join(ck, "model.tmp"), "wb") as f:
    f.write(b"v1" * 100_000)
os.replace(os.path.join(ck, "model.tmp"), os.path.join(ck, "model"))
f = open(os.path.join(ck, "model.tmp"), "wb")  # the next save, killed half way
f.write(b"v2" * 50_000)
f.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_job_killed_mid_save_leaves_the_previous_checkpoint_whole(dataset, short_tmp):
    ds = dataset(files=20)
    pfs = os.path.join(short_tmp, "pfs-out")
    os.makedirs(pfs)
    r, report = run(short_tmp, ds.root, pfs, KILLED, pfs)
    assert r.returncode == 128 + signal.SIGKILL, r.stderr
    assert sorted(os.listdir(pfs)) == ["model"]  # what it was writing when killed is not published
    with open(os.path.join(pfs, "model"), "rb") as f:
        assert f.read() == b"v1" * 100_000
    wb = report["nodes"][0]["writeback"]
    assert wb["files_published"] == 1 and wb["not_closed"] == 1


def test_without_write_back_paths_the_writes_go_to_the_pfs_as_before(dataset, short_tmp):
    ds = dataset(files=20)
    out = os.path.join(short_tmp, "out")
    os.makedirs(out)
    report = os.path.join(short_tmp, "report.json")
    script = "import sys; open(sys.argv[1], 'wb').write(b'x' * 1000)"
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--no-progress", "--",
                sys.executable, "-c", script, os.path.join(out, "f"))
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(os.path.join(out, "f")) == 1000
    assert load(report)["nodes"][0].get("writeback") is None


def test_a_publish_the_pfs_refuses_exits_3_naming_the_file_and_where_its_bytes_are(dataset, short_tmp):
    """The PFS full (a 64 KiB filesystem here): the command succeeded, the run exits 3, and the
    file is named with where its bytes are kept, for `monarch drain` once there is room."""
    ds = dataset(files=20)
    pfs = os.path.join(short_tmp, "full")
    os.makedirs(pfs)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "none", pfs], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        script = "import sys; open(sys.argv[1], 'wb').write(b'x' * (1 << 20))"
        r, report = run(short_tmp, ds.root, pfs, script, os.path.join(pfs, "big"))
        assert r.returncode == 3, r.stderr
        wb = report["nodes"][0]["writeback"]
        kept = wb["unpublished"][os.path.join(pfs, "big")]
        assert f"{os.path.join(pfs, 'big')}: {kept}" in r.stderr and "No space left on device" in r.stderr
        with open(kept, "rb") as f:  # nothing unpublished is deleted
            assert f.read() == b"x" * (1 << 20)
        assert not os.path.exists(os.path.join(pfs, "big"))  # never short under its name
    finally:
        subprocess.run(["umount", "-l", pfs])
        for area in areas(short_tmp):
            subprocess.run(["rm", "-rf", area])


def test_a_write_back_path_exported_without_a_daemon_for_it_writes_directly(dataset, short_tmp):
    """MONARCH_WRITEBACK exported empty (write-back off) or never answered for: the command writes
    the PFS directly, and the shim's copy of the variable is only ever the daemon's."""
    from support.harness import monarch_env
    ds = dataset(files=20)
    out = os.path.join(short_tmp, "out")
    os.makedirs(out)
    script = "import os, sys; open(sys.argv[1], 'wb').write(b'x' * 1000); print(os.environ.get('MONARCH_WRITEBACK'))"
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--no-progress", "--", sys.executable, "-c", script,
                os.path.join(out, "f"), env=monarch_env() | {"MONARCH_WRITEBACK": ""})
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(os.path.join(out, "f")) == 1000 and r.stdout.strip() == "None"


KILL_DAEMON = """
import glob, os, signal, sys
path = sys.argv[1]
with open(path, "wb") as f:
    f.write(os.urandom(4 << 20))
run_dir = os.path.dirname(os.environ["MONARCH_SOCKET"])
with open(os.path.join(run_dir, "daemon.pid")) as f:
    os.kill(int(f.read().split()[0]), signal.SIGKILL)  # closed, then the daemon lost mid-drain
"""


def test_a_daemon_killed_mid_drain_leaves_its_write_back_to_monarch_drain(dataset, short_tmp, slow_pfs):
    """The PFS takes writes at 2 MB/s; the daemon is SIGKILLed just after the job closed a 4 MiB
    file: `monarch run` says the write-back is not on the PFS (exit 3), nothing shows short under
    its name, and `monarch drain` publishes it whole."""
    ds = dataset(files=20)
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(os.path.join(src, "ck"))
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=2, open_latency_ms=0)
    ck = os.path.join(str(pfs.mountpoint), "ck")
    r, _ = run(short_tmp, ds.root, ck, KILL_DAEMON, os.path.join(ck, "model"))
    assert r.returncode == 3, r.stderr
    assert "monarch drain" in r.stderr
    assert [n for n in os.listdir(os.path.join(src, "ck")) if not n.startswith(".")] == []  # never short
    (area,) = areas(short_tmp)
    assert os.stat(area).st_mode & 0o777 == 0o700
    d = monarch("drain", "-c", config(short_tmp, ds.root, ck))
    assert d.returncode == 0, d.stdout + d.stderr
    assert os.path.getsize(os.path.join(src, "ck", "model")) == 4 << 20
    assert areas(short_tmp) == []


def test_another_user_can_neither_read_nor_drain_a_jobs_pending_files(dataset, short_tmp):
    """A job's pending write-back (its daemon killed) is its user's alone: another user cannot list
    or read its area, and finds nothing of it to drain."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    ds = dataset(files=20)
    out = os.path.join(short_tmp, "out")
    os.makedirs(out, mode=0o777)
    os.chmod(out, 0o777)
    r, _ = run(short_tmp, ds.root, out, KILL_DAEMON, os.path.join(out, "model"))
    found = areas(short_tmp)
    if r.returncode == 0 and not found:
        pytest.skip("the drain finished before the daemon was killed (a fast PFS): nothing pending to guard")
    (area,) = found
    from monarch.writeback.area import Area
    pid = os.fork()
    if pid == 0:  # another user, in a child of this test
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            for attempt in (lambda: os.listdir(area), lambda: open(os.path.join(area, "journal"), "rb")):
                try:
                    attempt()
                    code = 1
                except PermissionError:
                    pass
            if Area.orphans(os.path.dirname(os.path.dirname(area))):
                code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert monarch("drain", "-c", config(short_tmp, ds.root, out)).returncode == 0  # its own user can


DIRS_WHILE_DRAINING = """
import os, sys
ck = sys.argv[1]
with open(os.path.join(ck, "big"), "wb") as f:  # its drain holds every later operation back a while
    f.write(b"b" * (4 << 20))
step = os.path.join(ck, "step_1")
os.makedirs(step)
assert os.path.isdir(step) and os.listdir(step) == [], os.listdir(step)
with open(os.path.join(step, "shard"), "wb") as f:
    f.write(b"s" * 1000)
assert sorted(os.listdir(ck)) == ["big", "step_1"] and os.listdir(step) == ["shard"]
assert os.path.getsize(os.path.join(step, "shard")) == 1000
os.makedirs(step, exist_ok=True)  # a framework's makedirs again: the view says it is there
"""


def test_a_directory_the_job_made_is_there_for_it_before_the_pfs_has_it(dataset, short_tmp, slow_pfs):
    ds = dataset(files=20)
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(os.path.join(src, "ck"))
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=4, open_latency_ms=0)
    ck = os.path.join(str(pfs.mountpoint), "ck")
    r, report = run(short_tmp, ds.root, ck, DIRS_WHILE_DRAINING, ck)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(os.path.join(src, "ck"))) == ["big", "step_1"]
    assert os.listdir(os.path.join(src, "ck", "step_1")) == ["shard"]
