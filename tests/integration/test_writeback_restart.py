"""A restart at node speed (docs/consistency.md, "Kept copies"): the files one run published under
its write-back paths stay on the node as checked copies of the PFS files, and the same user's next
run reads them from there, never old bytes: a file changed on the PFS between the runs is read from
the PFS. The emulated PFS counts what it is read, apart from Monarch's report."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from support import checkpoint_libraries
from support.harness import load, monarch, monarch_env
from support.writeback import writable_pfs
from test_writeback_jobs import config

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(300)]

SAVE = """
import os, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
for k in range(4):  # a checkpoint's shards, each a temporary renamed over its name (torch.save, then os.replace)
    tmp = os.path.join(d, f"shard{k}.bin.tmp")
    with open(tmp, "wb") as f:
        f.write(bytes([k + 1]) * (4 << 20) + os.urandom(4096))
    os.replace(tmp, os.path.join(d, f"shard{k}.bin"))
"""
LOAD = """
import hashlib, json, os, sys
d = sys.argv[1]
print(json.dumps({n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest() for n in sorted(os.listdir(d))}))
"""


def digests(d):
    return {n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest() for n in sorted(os.listdir(d))}


def job(base, root, ck, script, extra=""):
    report = os.path.join(base, "report.json")
    r = monarch("run", "-c", config(base, root, ck, extra), "--report", report, "--no-progress", "--",
                sys.executable, "-c", script, os.path.join(ck, "step"), timeout=120)
    assert r.returncode == 0, r.stderr
    return r, load(report)


def saved(dataset, short_tmp, slow_pfs):
    """Run 1 of a test: 4 shards saved under write-back on a writable emulated PFS, all kept. The
    dataset's root, the PFS's backing directory, the PFS, and its mount (the write-back path)."""
    ds = dataset(files=10)
    src, pfs = writable_pfs(short_tmp, slow_pfs, mbps=200)
    _, report = job(short_tmp, ds.root, str(pfs.mountpoint), SAVE)
    assert report["writeback"]["kept_files"] == 4, report["writeback"]
    return ds.root, src, pfs, str(pfs.mountpoint)


def test_the_next_run_reads_the_checkpoint_from_the_node_and_a_changed_file_from_the_pfs(dataset, short_tmp,
                                                                                           slow_pfs):
    """Run 1 saves 4 shards (16 MiB) under write-back; run 2 reads them back: the PFS gives none of
    their bytes (its own count), every byte is the PFS file's, and the report says 4 opens from kept
    copies. Then one shard is rewritten on the PFS behind Monarch's back, same size, its mtime set back:
    run 3 reads the new bytes (from the PFS) and the other three from the node."""
    root, src, pfs, ck = saved(dataset, short_tmp, slow_pfs)
    backing = os.path.join(src, "step")
    expected = digests(backing)

    pfs.reset_counters()
    r, report = job(short_tmp, root, ck, LOAD)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == expected
    assert pfs.counters()["bytes"] <= 0.05 * 4 * (4 << 20), pfs.counters()
    wb = report["writeback"]
    assert (wb["served_files"], wb["served_bytes"]) == (4, 4 * ((4 << 20) + 4096)), wb
    assert "read from kept copies instead of the PFS: 4 opens" in r.stderr

    shard = os.path.join(backing, "shard2.bin")
    before = os.stat(shard)
    with open(shard, "r+b") as f:  # rewritten in place: same size, same inode
        f.write(b"\xee" * 4096)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # and its time as it was: only ctime tells
    expected = digests(backing)
    pfs.reset_counters()
    r, report = job(short_tmp, root, ck, LOAD)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == expected
    assert (4 << 20) <= pfs.counters()["bytes"] <= 1.05 * ((4 << 20) + 4096), pfs.counters()
    wb = report["writeback"]
    assert (wb["served_files"], wb["stale"]) == (3, 1), wb


def test_keep_0_keeps_nothing_and_the_next_run_reads_the_pfs(dataset, short_tmp, slow_pfs):
    """`monarch cache drop` frees what a run kept; with `writeback.keep: 0` nothing is kept, and the
    next run reads the PFS."""
    root, _, pfs, ck = saved(dataset, short_tmp, slow_pfs)
    r = monarch("cache", "drop", "--base", f"/dev/shm{short_tmp}/ram0")  # write_config's first tier: write-back's
    assert "kept-writes (4 files" in r.stdout, r.stdout + r.stderr
    cfg = config(short_tmp, root, ck)
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text.replace("writeback: {paths: [", "writeback: {keep: 0, paths: ["))
    pfs.reset_counters()
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", cfg, "--report", report, "--no-progress", "--", sys.executable, "-c", SAVE,
                os.path.join(ck, "step"), timeout=120)
    assert r.returncode == 0, r.stderr
    r = monarch("run", "-c", cfg, "--report", report, "--no-progress", "--", sys.executable, "-c", LOAD,
                os.path.join(ck, "step"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert load(report)["writeback"]["served_files"] == 0
    assert pfs.counters()["bytes"] >= 4 * (4 << 20)
    assert not os.path.exists(os.path.join(f"/dev/shm{short_tmp}/ram0", f"monarch-{os.getuid()}", "kept-writes"))


@pytest.mark.parametrize("library", ["dcp", "trainer", "safetensors"])
def test_a_library_loads_its_checkpoint_from_the_node_in_the_next_run(library, dataset, short_tmp, slow_pfs):
    """Saved under write-back by one run, loaded by the next (DCP's load; a Trainer resuming from its
    checkpoint; safetensors): the load gets the saved tensors and reads them from the node's kept copies
    (the report's opens from them), the PFS giving at most a twentieth of the checkpoint's bytes."""
    missing = [m for m in {"dcp": ("torch",), "trainer": ("torch", "transformers", "accelerate"),
                           "safetensors": ("torch", "safetensors")}[library]
               if __import__("importlib").util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/install.sh installs them)")
    ds = dataset(files=10)
    src, pfs = writable_pfs(short_tmp, slow_pfs, mbps=200)
    mnt = str(pfs.mountpoint)
    cfg = config(short_tmp, ds.root, mnt)
    report = os.path.join(short_tmp, "report.json")
    env = monarch_env(PYTHONHASHSEED=0, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=1, CUDA_VISIBLE_DEVICES="")
    for action in ("save", "load"):
        if action == "load":
            pfs.reset_counters()
        r = subprocess.run([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", report, "--no-progress",
                            "--", sys.executable, checkpoint_libraries.__file__, library, os.path.join(mnt, "ck"),
                            action], env=env, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, f"{action}\n{r.stderr[-4000:]}"
    wb = load(report)["writeback"]
    assert wb["served_files"] >= 1, wb
    total = sum(os.path.getsize(os.path.join(dp, n)) for dp, _, ns in os.walk(os.path.join(src, "ck")) for n in ns)
    assert pfs.counters()["bytes"] <= 0.05 * total + 64 * 1024, (pfs.counters()["bytes"], total, wb)
