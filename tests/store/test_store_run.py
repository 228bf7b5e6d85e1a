"""A dataset in a key-value store read as files under ``monarch run``: the bytes through every
way an application reads, the metadata, and each failure with its clear message and nothing
staged lost. A real redis-server on a private socket; the mount path has no directory on disk."""

import hashlib
import json
import os
import sys

import pytest

from monarch.store.load import put
from monarch.store.url import StoreURL
from support.harness import load, monarch, monarch_env
from support.redisstore import store_config

pytestmark = pytest.mark.integration

READ_EVERY_WAY = r"""
import errno, hashlib, json, mmap, os, sys
import numpy as np
src, mnt, out = sys.argv[1:4]

def walk(top):
    seen = []
    for d, dirs, files in os.walk(top):
        rel = os.path.relpath(d, top)
        seen.append([rel, sorted(dirs), sorted(files),
                     {f: os.stat(os.path.join(d, f)).st_size for f in files},
                     {f: os.lstat(os.path.join(d, f)).st_size for f in files}])
    return sorted(seen)

assert walk(src) == walk(mnt), "os.walk, stat, lstat differ"
assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))
assert os.path.isdir(mnt) and os.path.isdir(mnt + "/empty") and not os.path.exists(mnt + "/not-there")
assert os.stat(os.path.join(mnt, "class_0", "..")).st_ino == os.stat(mnt).st_ino  # ".." with no directory on disk
assert not os.path.exists(os.path.join(mnt, "class_0", "..", "not-there"))
try:
    open(mnt + "/not-there", "rb")
    sys.exit("a name the manifest lacks opened")
except FileNotFoundError:
    pass
files = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)
for rel in files:
    want = open(os.path.join(src, rel), "rb").read()
    p = os.path.join(mnt, rel)
    with open(p, "rb") as f:
        assert f.read() == want, ("open", rel)
    fd = os.open(p, os.O_RDONLY)
    assert os.fstat(fd).st_size == len(want)
    assert os.pread(fd, len(want) + 10, 0) == want, ("pread", rel)
    assert os.pread(fd, 100, 7) == want[7:107], ("pread at an offset", rel)
    os.close(fd)
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert bytes(m) == want, ("mmap", rel)
    if rel.endswith(".npy"):
        assert np.array_equal(np.load(p), np.load(os.path.join(src, rel))), ("np.load", rel)
with open(out, "w") as f:
    f.write("\n".join(os.path.join(mnt, rel) for rel in files) + "\n")
print("READ", len(files))
"""


def make_source(root: str, files: int = 60) -> dict[str, bytes]:
    import numpy as np
    out = {}
    for i in range(files):
        rel = f"class_{i % 3}/sample_{i:03d}.bin" if i % 7 else f"top {i}.bin"
        out[rel] = os.urandom(5000 + 97 * i)
    for i in range(3):
        path = os.path.join(root, f"arrays/a{i}.npy")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.save(path, np.arange(1000 * (i + 1), dtype=np.float32) * i)
        out[f"arrays/a{i}.npy"] = open(path, "rb").read()
    for rel, data in out.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(root, "empty"))
    return out


def loaded(server, base: str, prefix: str, files: int = 60):
    src = os.path.join(base, "src")
    data = make_source(src, files)
    url = server.url(prefix)
    put(src, StoreURL.parse(url), out=None)
    return src, data, url


def test_every_reader_gets_the_stores_bytes_and_the_store_is_read_once(redis_server, short_tmp):
    src, data, url = loaded(redis_server, short_tmp, "every/")
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, url)
    script, listing = os.path.join(short_tmp, "read.py"), os.path.join(short_tmp, "files.txt")
    with open(script, "w") as f:
        f.write(READ_EVERY_WAY)
    report = os.path.join(short_tmp, "report.json")
    got = os.path.join(short_tmp, "got.md5")
    hits = redis_server.client().info("stats")["keyspace_hits"]
    shell = (f"{sys.executable} {script} {src} {mnt} {listing} && xargs -d '\\n' md5sum < {listing} > {got} "
             f"&& cat {mnt}/class_1/sample_001.bin > {short_tmp}/cat.out && ls -lR {mnt} > {short_tmp}/ls.out")
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", "bash", "-c", shell, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"READ {len(data)}" in r.stdout
    assert not os.path.exists(mnt)  # nothing on disk: served from the snapshot and the tiers
    sums = dict(reversed(line.split(None, 1)) for line in open(got).read().splitlines())
    assert len(sums) == len(data)
    for rel, b in data.items():
        assert sums[os.path.join(mnt, rel)] == hashlib.md5(b).hexdigest(), rel
    assert open(f"{short_tmp}/cat.out", "rb").read() == data["class_1/sample_001.bin"]
    listed = open(f"{short_tmp}/ls.out").read()  # ls -l: stat, listings and (no) xattrs from the index
    assert f"{len(data['class_1/sample_001.bin'])} " in listed and "sample_001.bin" in listed and "a2.npy" in listed
    assert "No such file or directory" not in r.stderr
    # the server's own count: each value read once (read-ahead, demand and every reader together),
    # and the manifest twice (the launcher's check, the daemon's snapshot)
    assert redis_server.client().info("stats")["keyspace_hits"] - hits == len(data) + 2
    rep = load(report)
    total = sum(map(len, data.values()))
    assert rep["dataset"] == {"files": len(data), "bytes": total}
    assert rep["store"]["bytes_read"] == total and rep["store"]["reads_of_dataset"] == 1.0
    assert rep["store"]["refused_count"] == 0 and rep["store"]["lost_copies"] == 0
    assert rep["pfs"]["total_bytes"] == 0 and rep["opened_from"]["pfs"]["opens"] == 0
    assert "store traffic" in r.stderr and "= 1.00x the dataset" in r.stderr


CHECK_ALL = r"""
import errno, hashlib, json, os, sys
src, mnt = sys.argv[1:3]
result = {}
for d, _, fs in os.walk(src):
    for f in fs:
        rel = os.path.relpath(os.path.join(d, f), src)
        os.stat(os.path.join(mnt, rel))  # the manifest's metadata stands whatever the value
        try:
            with open(os.path.join(mnt, rel), "rb") as fh:
                ok = fh.read() == open(os.path.join(src, rel), "rb").read()
            result[rel] = "ok" if ok else "WRONG BYTES"
        except OSError as e:
            result[rel] = errno.errorcode[e.errno]
print(json.dumps(result))
"""

def check_all(short_tmp, src, url):
    """Every file of ``src`` read under the store's mount by CHECK_ALL under ``monarch run``:
    (the mount, the configuration, the report's path, rel -> "ok" or why not, what monarch run
    printed on stderr)."""
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, url)
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", sys.executable, "-c", CHECK_ALL,
                src, mnt, timeout=120)
    assert r.returncode == 0, r.stderr
    return mnt, cfg, report, json.loads(r.stdout.splitlines()[-1]), r.stderr



def test_a_corrupted_truncated_or_missing_value_is_never_served(redis_server, short_tmp):
    src, data, url = loaded(redis_server, short_tmp, "bad/")
    client = redis_server.client()
    corrupted, truncated, missing = "class_0/sample_003.bin", "class_1/sample_004.bin", "class_2/sample_005.bin"
    value = bytearray(data[corrupted])
    value[100] ^= 0xFF
    client.set(f"bad/{corrupted}".encode(), bytes(value))  # same size, other bytes
    client.set(f"bad/{truncated}".encode(), data[truncated][:-10])
    client.delete(f"bad/{missing}".encode())
    mnt, cfg, report, result, stderr = check_all(short_tmp, src, url)
    assert {rel: why for rel, why in result.items() if why != "ok"} == {corrupted: "EIO", truncated: "EIO",
                                                                          missing: "EIO"}
    store = load(report)["store"]
    assert store["refused_count"] == 3
    assert store["refused"] == {os.path.join(mnt, corrupted): "digest differs from the manifest's",
                                os.path.join(mnt, truncated): f"size {len(data[truncated]) - 10} in the store, "
                                                              f"{len(data[truncated])} in the manifest",
                                os.path.join(mnt, missing): "missing from the store"}
    for rel in (corrupted, truncated, missing):
        assert f"    {os.path.join(mnt, rel)}: " in stderr  # named in the printed report


def test_an_unreachable_store_stops_the_run_in_one_line_unless_fail_open(short_tmp):
    mnt = os.path.join(short_tmp, "mnt", "data")
    url = f"unix://{short_tmp}/no-server.sock?prefix=ds/&timeout=1"
    cfg = store_config(short_tmp, mnt, url)
    marker = os.path.join(short_tmp, "ran")
    r = monarch("run", "--no-progress", "-c", cfg, "--", "touch", marker, timeout=60)
    assert r.returncode == 2 and not os.path.exists(marker)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert f"monarch: store: {mnt}: the store at {url} is unreachable" in r.stderr
    r = monarch("run", "--no-progress", "--fail-open", "-c", cfg, "--", "touch", marker, timeout=60)
    assert r.returncode == 0 and os.path.exists(marker)
    assert f"the store at {url} is unreachable" in r.stderr and "going on (--fail-open)" in r.stderr


def test_a_store_without_a_manifest_stops_the_run_naming_it(redis_server, short_tmp):
    mnt = os.path.join(short_tmp, "mnt", "data")
    url = redis_server.url("never-loaded/")
    cfg = store_config(short_tmp, mnt, url)
    r = monarch("run", "--no-progress", "-c", cfg, "--", "true", timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"the store at {url} holds no Monarch dataset" in r.stderr


def test_a_wrong_password_is_one_line_and_the_password_is_never_printed(fresh_redis, short_tmp):
    server = fresh_redis(password="pw-Kq81xZ")
    src = os.path.join(short_tmp, "src")
    data = make_source(src, 10)
    url = server.url("pw/")
    put(src, StoreURL.parse(url), out=None, env={"MONARCH_STORE_PASSWORD": "pw-Kq81xZ"})
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, url)
    r = monarch("run", "--no-progress", "-c", cfg, "--", "true",
                env=monarch_env(MONARCH_STORE_PASSWORD="not-it-Zx9"), timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"the store at {url} refused the password" in r.stderr and "not-it-Zx9" not in r.stderr
    report = os.path.join(short_tmp, "report.json")
    # every file read under the mount (one compared with cmp alone ended while the read-ahead
    # still staged the others, and the report counted what had been read by then)
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", sys.executable, "-c", CHECK_ALL, src, mnt,
                env=monarch_env(MONARCH_STORE_PASSWORD="pw-Kq81xZ"), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(json.loads(r.stdout.splitlines()[-1]).values()) == {"ok"}  # the same bytes, every file
    assert load(report)["store"]["bytes_read"] == sum(map(len, data.values()))
    for d, _, fs in os.walk(os.path.join(short_tmp, "run")):  # the daemon's log, the report
        for f in fs:
            assert b"pw-Kq81xZ" not in open(os.path.join(d, f), "rb").read(), f
    assert "pw-Kq81xZ" not in open(report).read() + r.stderr


KILL_MID_EPOCH = r"""
import errno, os, signal, sys, time
src, mnt, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = sorted(os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs)
first, rest = files[:30], files[30:40]
def same(rel):
    with open(os.path.join(mnt, rel), "rb") as f:
        return f.read() == open(os.path.join(src, rel), "rb").read()
assert all(same(rel) for rel in first)        # staged as they are opened (on-access)
os.kill(pid, signal.SIGKILL)                  # the store is lost mid-epoch
time.sleep(0.2)
assert all(same(rel) for rel in first), "a staged file was lost with the store"
t0 = time.monotonic()
failed = []
for rel in rest:
    try:
        same(rel)
    except OSError as e:
        failed.append(e.errno)
took = time.monotonic() - t0
print("FAILED", len(failed), set(failed) == {errno.EIO}, round(took, 2))
"""


def test_a_store_lost_mid_epoch_fails_unstaged_opens_after_a_bounded_wait_and_keeps_the_staged(
        fresh_redis, short_tmp):
    server = fresh_redis()
    src = os.path.join(short_tmp, "src")
    make_source(src, 60)
    url = server.url("lost/", timeout=1)
    put(src, StoreURL.parse(url), out=None)
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, url, policy="on-access")
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", sys.executable, "-c", KILL_MID_EPOCH,
                src, mnt, str(server.proc.pid), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    _, n, all_eio, took = r.stdout.split()
    assert n == "10" and all_eio == "True"
    assert float(took) < 8  # about the URL's timeout (1 s) for the first, then at once
    store = load(report)["store"]
    assert store["lost_copies"] >= 10 and store["lost_at"] is not None
    assert "store lost: " in r.stderr and "copies failed because the store did not answer" in r.stderr


def test_a_key_of_another_type_is_refused_and_a_failed_snapshot_is_reported(redis_server, short_tmp):
    """A value replaced by a hash (WRONGTYPE) is refused like a corrupted one; a manifest that is
    not one makes the snapshot fail, said in the report's store section (every open EIO)."""
    src, data, url = loaded(redis_server, short_tmp, "types/", files=8)
    client = redis_server.client()
    odd = "class_1/sample_001.bin"
    client.delete(f"types/{odd}".encode())
    client.hset(f"types/{odd}".encode(), "x", "y")
    mnt, cfg, report, result, stderr = check_all(short_tmp, src, url)
    assert {rel for rel, why in result.items() if why != "ok"} == {odd} and result[odd] == "EIO"
    assert "WRONGTYPE" in load(report)["store"]["refused"][os.path.join(mnt, odd)]
    # a manifest that is not one: the launcher's check and the snapshot both say so
    client.set(b"types/.monarch/manifest", b"not a manifest")
    r = monarch("run", "--no-progress", "--fail-open", "--report", report, "-c", cfg, "--", "cat",
                f"{mnt}/{odd}", timeout=60)
    assert r.returncode == 1 and "Input/output error" in r.stderr
    assert "not a Monarch manifest" in r.stderr and "going on (--fail-open)" in r.stderr
    assert "the snapshot failed (" in r.stderr and load(report)["store"]["snapshot_failed"]


def test_values_a_full_ram_tier_refuses_are_staged_in_the_next_tier_read_once(redis_server, short_tmp):
    """The RAM tier's filesystem (a 64 KiB tmpfs, far under its 1 GiB capacity) has no room left
    for it (its reserve for the application reached): the values it refuses go to the SSD tier, each GET once (the server's own count), none "no room"."""
    import subprocess
    src, data, url = loaded(redis_server, short_tmp, "spill/")
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, url)
    ram = f"/dev/shm{short_tmp}/ram"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", ram], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {r.stderr.strip()}")
    try:
        hits = redis_server.client().info("stats")["keyspace_hits"]
        report = os.path.join(short_tmp, "report.json")
        r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", sys.executable, "-c", CHECK_ALL,
                    src, mnt, timeout=120)
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout.splitlines()[-1])
        assert set(result.values()) == {"ok"} and len(result) == len(data)
        assert redis_server.client().info("stats")["keyspace_hits"] - hits == len(data) + 2  # + the manifest twice
        rep = load(report)
        assert not rep["staging"]["failures"], rep["staging"]["failures"]
        ram_tier, ssd_tier = rep["nodes"][0]["tiers"]
        # the tier stops at its filesystem's reserve for the application (filesystem_reserve), or full
        assert ram_tier["stopped"] in ("filesystem_reserve", "full", "filesystem_full"), ram_tier
        assert ram_tier["files"] > 0 and ram_tier["files"] + ssd_tier["files"] == len(data)
    finally:
        subprocess.run(["umount", "-l", ram], capture_output=True)
