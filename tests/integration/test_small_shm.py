"""A container's small ``/dev/shm`` (Podman's and Docker's ``--shm-size`` is 64 MiB by default):
the RAM tier there leaves the application its reserve of that filesystem (``filesystem_reserve``,
a quarter by default), so that the application's own files, semaphores and shared memory there
still find room, whatever the tier's capacity says. Each test runs ``monarch run`` in a private
mount namespace whose ``/dev/shm`` is a small tmpfs (``unshare -m``: root)."""

import os
import shutil
import subprocess
import sys

import pytest

from support.harness import REPO, load, monarch_env, write_config

pytestmark = pytest.mark.integration

MiB = 1 << 20

# Wait until /dev/shm's free space holds still (the read-ahead has placed what it places), so that
# what the application then asks of it does not race the tier.
SETTLE = """
import os, time
def settle():
    last, since, end = None, time.monotonic(), time.monotonic() + 10
    while time.monotonic() < end:
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize
        if free != last:
            last, since = free, time.monotonic()
        elif time.monotonic() - since > 0.5:
            return free
        time.sleep(0.05)
    return last
"""

# Reads every file of the dataset and checks its bytes against the manifest, then writes and reads
# back 1 MiB in /dev/shm, as an application's own scratch there.
READ_THEN_WRITE = SETTLE + """
import json, sys, xxhash
root, manifest = sys.argv[1], sys.argv[2]
files = json.load(open(manifest))["files"]
for epoch in range(2):
    for rel, want in sorted(files.items()):
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        assert len(data) == want["size"] and xxhash.xxh64_hexdigest(data) == want["xxh64"], rel
print("read", len(files), "files twice, right; /dev/shm free:", settle())
mine = os.urandom(1 << 20)
path = "/dev/shm/app-scratch-%d" % os.getpid()
with open(path, "wb") as f:
    f.write(mine)
assert open(path, "rb").read() == mine
os.unlink(path)
print("wrote 1 MiB to /dev/shm")
"""

# A reader like a framework's data loader: forked workers (multiprocessing's Pool, its locks
# POSIX semaphores in /dev/shm) read files and hand each one's bytes to the parent through a
# file in /dev/shm, a batch at a time; the parent checks them against the manifest. The second
# epoch holds more at once (more workers' batches in flight): 12 MiB, within the 16 MiB reserve
# of a 64 MiB /dev/shm, and more than a tier that filled the rest would leave.
POOL_READER = SETTLE + """
import json, multiprocessing, sys, xxhash
root, manifest = sys.argv[1], sys.argv[2]
files = json.load(open(manifest))["files"]

def load(rel):
    with open(os.path.join(root, rel), "rb") as f:
        data = f.read()
    out = "/dev/shm/batch-%d-%s" % (os.getpid(), rel.replace("/", "_"))
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return rel, out

def batches(order, most):
    batch, nbytes = [], 0
    for rel in order:
        if batch and nbytes + files[rel]["size"] > most:
            yield batch
            batch, nbytes = [], 0
        batch.append(rel)
        nbytes += files[rel]["size"]
    if batch:
        yield batch

def main():
    ctx = multiprocessing.get_context("fork")
    order = sorted(files)
    for epoch, most in enumerate((6 << 20, 12 << 20)):
        if epoch:
            print("/dev/shm free after the first epoch:", settle())
        limit = ctx.BoundedSemaphore(2)  # one more semaphore of the application's, made mid-job
        with ctx.Pool(4) as pool:
            for batch in batches(order, most):
                with limit:
                    for rel, out in pool.map_async(load, batch).get(timeout=60):
                        with open(out, "rb") as f:
                            data = f.read()
                        os.unlink(out)
                        want = files[rel]
                        assert len(data) == want["size"] and xxhash.xxh64_hexdigest(data) == want["xxh64"], rel
    print("read", len(files), "files twice through /dev/shm batches, right")

main()
"""


def in_small_shm(size: str, base: str, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m monarch ARGS`` in a private mount namespace whose /dev/shm is a tmpfs of ``size``,
    with the RAM tier's base (``/dev/shm<base>/ram0``, write_config's) made in it."""
    script = ('mount -t tmpfs -o size="$1",mode=1777 tmpfs /dev/shm && mkdir -p "/dev/shm$2/ram0" && shift 2 '
              '&& exec "$@"')
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", size, base,
                           sys.executable, "-m", "monarch", *args],
                          env=monarch_env(), capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture
def small_shm_allowed():
    """Skip, saying why, where a private mount namespace with its own tmpfs cannot be made."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"a private mount namespace with a tmpfs on /dev/shm needs root (CAP_SYS_ADMIN): "
                    f"{r.stderr.strip()}")


def ram_tier(report: dict) -> dict:
    (node,) = report["nodes"]
    return next(t for t in node["tiers"] if t["name"] == "ram")


def test_a_4mib_dev_shm_filled_by_the_tier_still_takes_the_applications_1mib(dataset, short_tmp, small_shm_allowed):
    ds = dataset(files=64, size="128KiB")  # 8 MiB: twice the tmpfs
    cfg = write_config(short_tmp, ds.root, ram="1GiB", policy="read-ahead", reserve=None)  # the shipped 25%
    report = os.path.join(short_tmp, "report.json")
    r = in_small_shm("4m", short_tmp, ["run", "-c", cfg, "--report", report, "--",
                                       sys.executable, "-c", READ_THEN_WRITE, ds.root, ds.manifest])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "wrote 1 MiB to /dev/shm" in r.stdout
    ram = ram_tier(load(report))
    print(f"ram tier: {ram['files']} files, {ram['allocated_bytes']} bytes of capacity {ram['capacity']}; "
          f"stopped: {ram['stopped']}; refused {ram['refused']}")
    assert ram["files"] > 0  # it served what fits
    assert ram["filesystem_reserve"] == MiB and ram["capacity"] == 3 * MiB
    assert ram["allocated_bytes"] + ram["reserved"] <= 3 * MiB


def test_a_64mib_dev_shm_and_a_200mib_dataset_read_by_forked_workers(dataset, short_tmp, small_shm_allowed):
    ds = dataset(files=200, size="1MiB")
    cfg = write_config(short_tmp, ds.root, ram="1GiB", policy="read-ahead", reserve=None)  # the shipped 25%
    report = os.path.join(short_tmp, "report.json")
    r = in_small_shm("64m", short_tmp, ["run", "-c", cfg, "--report", report, "--",
                                        sys.executable, "-c", POOL_READER, ds.root, ds.manifest])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "read 200 files twice through /dev/shm batches, right" in r.stdout
    rep = load(report)
    ram = ram_tier(rep)
    print(f"ram tier: {ram['files']} files, {ram['allocated_bytes']} bytes of capacity {ram['capacity']}; "
          f"stopped: {ram['stopped']}; refused {ram['refused']}")
    # the tier took what the reserve left it, and says it stopped there and why
    assert ram["filesystem_reserve"] == 16 * MiB
    assert ram["filesystem_reserve_from"] == "25% of the 64.0 MiB of /dev/shm (filesystem_reserve)"
    assert ram["capacity"] == 48 * MiB and "cut to its filesystem's size less the reserve" in ram["capacity_from"]
    assert 32 * MiB <= ram["allocated_bytes"] and ram["allocated_bytes"] + ram["reserved"] <= 48 * MiB
    assert ram["stopped"] == "filesystem_reserve" and ram["refused"].get("filesystem_reserve", 0) > 0
    assert set(ram["refused"]) <= {"filesystem_reserve"}
    assert rep["opened_from"]["ram"]["opens"] > 0
    assert "stopped at its filesystem's reserve for the application (filesystem_reserve)" in r.stderr
    assert "left 16.0 MiB of its filesystem free for the application: 25% of the 64.0 MiB of /dev/shm" in r.stderr
