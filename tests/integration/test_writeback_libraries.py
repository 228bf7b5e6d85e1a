"""The checkpoint libraries training jobs save with, under `monarch run` with write-back, in each
fsync mode (docs/consistency.md, "Write-back"): safetensors (a raw renameat), h5py, a Megatron-style
tracker, torch.distributed.checkpoint with its defaults (every file fsynced), orbax's
CheckpointManager, Lightning's ModelCheckpoint (save_last as a symlink) and a Hugging Face Trainer
(rotation, then a job that resumes). Each saves directly and under write-back onto the same
emulated PFS; the trees are compared file by file, a fresh process without Monarch loads what
write-back published, and the PFS receives no more bytes than from the direct save."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from support import checkpoint_libraries
from support.harness import load, monarch_env, write_config
from support.writeback import published_tree, writable_pfs

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(300)]

SCRIPT = checkpoint_libraries.__file__
NEEDS = {"safetensors": ("torch", "safetensors"), "h5py": ("torch", "h5py"), "megatron": ("torch",),
         "dcp": ("torch",), "orbax": ("torch", "orbax.checkpoint"), "lightning": ("torch", "lightning"),
         "trainer": ("torch", "transformers", "accelerate")}


def missing(library):
    return [m for m in NEEDS[library]
            if importlib.util.find_spec(m.split(".")[0]) is None or importlib.util.find_spec(m) is None]


def env():
    return monarch_env(PYTHONHASHSEED=0, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE=1, JAX_PLATFORMS="cpu",
                       CUDA_VISIBLE_DEVICES="")


@pytest.mark.parametrize("library", checkpoint_libraries.LIBRARIES)
def test_a_library_saves_under_write_back_as_directly(library, dataset, short_tmp, slow_pfs):
    """Directly, then under write-back with `fsync: pfs` (the default on one node) and, where the
    library fsyncs, `fsync: local`: each job exits 0, the PFS holds the direct save's tree (the same names, symlinks and bytes), nothing of
    Monarch's is left there, a fresh process loads it, and the PFS took <= 1.05x the direct save's
    bytes (each fsynced file written once). Before, safetensors and the Trainer died at their first
    save (a raw renameat of a temporary the PFS had not got), and DCP's fsynced files were written
    twice."""
    if missing(library):
        pytest.skip(f"{', '.join(missing(library))} not installed (scripts/install.sh installs them)")
    ds = dataset(files=10)
    src, pfs = writable_pfs(short_tmp, slow_pfs)
    mnt = str(pfs.mountpoint)
    ignored = checkpoint_libraries.IGNORED.get(library, ())

    ck = os.path.join(mnt, "ck")  # every save at the same path: libraries write their paths into their files

    def save(mode, *launch):
        pfs.reset_counters()
        r = subprocess.run([*launch, sys.executable, SCRIPT, library, ck, "save"], env=env(), capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, f"{mode}\n{r.stderr[-4000:]}"
        written = pfs.counters()["bytes_written"]
        os.rename(os.path.join(src, "ck"), os.path.join(src, mode))  # (behind the mount: its view follows)
        if launch:  # what write-back published, loaded by a fresh process without Monarch
            r = subprocess.run([sys.executable, SCRIPT, library, os.path.join(mnt, mode), "load"], env=env(),
                               capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, f"{mode}: the load\n{r.stderr[-3000:]}"
        return written, published_tree(os.path.join(src, mode), ignored, checkpoint_libraries.RANDOM_NAMES.get(library))

    direct_bytes, expected = save("direct")
    for fsync in ("pfs", "local"):
        base = os.path.join(short_tmp, f"job-{fsync}")
        os.makedirs(base)
        cfg = write_config(base, ds.root, extra=f"writeback: {{paths: [{json.dumps(mnt)}], fsync: {fsync}}}\n")
        report = os.path.join(base, "report.json")
        written, got = save(f"fsync-{fsync}", sys.executable, "-m", "monarch", "run", "-c", cfg,
                                   "--report", report, "--no-progress", "--")
        wb = load(report)["nodes"][0]["writeback"]
        assert wb["failed"] is None and wb["unpublished"] == {}, wb
        assert got == expected, f"fsync: {fsync}"
        assert written <= 1.05 * direct_bytes, (fsync, written, direct_bytes)
        if not wb["syncs"]:
            break  # it made no fsync: the other mode would run the same job (the mode is what an fsync waits for)


@pytest.mark.parametrize("library,then", [("trainer", "resume"), ("dcp", "load")])
def test_the_next_job_loads_its_checkpoint_from_the_node(library, then, dataset, short_tmp, slow_pfs):
    """A save under `monarch run`, then the next job of the chain under `monarch run` with the same
    configuration (a Trainer that resumes from its last checkpoint, its first step the 41st; DCP's
    load, every tensor compared): its checkpoint's files come from the node's kept copies (the
    report's sources), the PFS gives none of their bytes."""
    if missing(library):
        pytest.skip(f"{', '.join(missing(library))} not installed (scripts/install.sh installs them)")
    src, pfs = writable_pfs(short_tmp, slow_pfs)
    ck = os.path.join(str(pfs.mountpoint), "ck")
    os.makedirs(ck)
    cfg = write_config(short_tmp, dataset(files=10).root, extra=f"writeback: {{paths: [{json.dumps(ck)}]}}\n")
    for what in ("save", then):
        pfs.reset_counters()
        report = os.path.join(short_tmp, f"{what}.json")
        r = subprocess.run([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", report, "--no-progress",
                            "--", sys.executable, SCRIPT, library, ck, what], env=env(), capture_output=True, text=True,
                           timeout=240)
        assert r.returncode == 0, f"{what}\n{r.stderr[-4000:]}"
    wb = load(report)["nodes"][0]["writeback"]
    assert wb["restart_tier_files"] >= 2 and wb["restart_pfs_files"] == 0, wb
    assert pfs.counters()["bytes"] == 0, pfs.counters()["files"]  # (every file it loads, the save published)


NO_DISPATCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "no_dispatch.py")


@pytest.mark.parametrize("library", ["safetensors", "trainer", "orbax", "dcp"])
def test_a_library_saves_where_raw_calls_cannot_be_watched(library, dataset, short_tmp, slow_pfs):
    """Under a seccomp filter that refuses syscall user dispatch (as a kernel before 5.11 does: RHEL 8,
    TOSS 4, arm64), with write-back configured: the job writes through, exits 0 with the direct save's
    tree on the PFS (a Trainer's resume included), and is told once. Before, safetensors' raw renameat
    of its temporary missed it (the Trainer died at its first save, its resume found no checkpoint)."""
    if missing(library):
        pytest.skip(f"{', '.join(missing(library))} not installed (scripts/install.sh installs them)")
    ds = dataset(files=10)
    src, pfs = writable_pfs(short_tmp, slow_pfs)
    mnt = str(pfs.mountpoint)
    ignored = checkpoint_libraries.IGNORED.get(library, ())
    ck = os.path.join(mnt, "ck")
    cfg = write_config(short_tmp, ds.root, extra=f"writeback: {{paths: [{json.dumps(mnt)}]}}\n")
    trees = {}
    for mode, launch in (("direct", []), ("filtered", [sys.executable, NO_DISPATCH, sys.executable, "-m", "monarch",
                                                       "run", "-c", cfg, "--no-progress", "--"])):
        r = subprocess.run([*launch, sys.executable, SCRIPT, library, ck, "save"], env=env(), capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, f"{mode}\n{r.stderr[-4000:]}"
        if launch:
            assert r.stderr.count("fallback (writeback-through)") == 1, r.stderr[-4000:]
        os.rename(os.path.join(src, "ck"), os.path.join(src, mode))
        trees[mode] = published_tree(os.path.join(src, mode), ignored, checkpoint_libraries.RANDOM_NAMES.get(library))
    assert trees["filtered"] == trees["direct"]
