"""Start-up on a large tree: while the daemon walks 200,000 files, the command's
first stat is answered within a second -- from the snapshot index or, before it is written,
from the PFS -- and counted either way (the report says which, and why)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import pytest

from support.harness import load, monarch, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DIRS, PER_DIR = 200, 1000  # 200,000 empty files: ~8 s to make on tmpfs, ~30 s on a disk


@pytest.fixture(scope="module")
def big_tree():
    """200 directories of 1,000 empty files, made once for the module (tmpfs when there is one)."""
    base = tempfile.mkdtemp(prefix="mt-big-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    root = os.path.join(base, "ds")
    flags = os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC
    for d in range(DIRS):
        dp = os.path.join(root, f"d{d:03d}")
        os.makedirs(dp)
        for f in range(PER_DIR):
            os.close(os.open(os.path.join(dp, f"f{f:04d}"), flags, 0o644))
    yield root
    shutil.rmtree(base, ignore_errors=True)


APP = r"""
import os, sys, time
t0 = time.monotonic()
st = os.stat(sys.argv[1])
print(f"{time.monotonic() - t0:.3f}", st.st_size, flush=True)
"""


def test_the_first_stat_during_a_200k_walk_is_answered_within_a_second_and_counted(big_tree, short_tmp):
    cfg = write_config(short_tmp, big_tree, policy="on-access")
    report = os.path.join(short_tmp, "report.json")
    target = os.path.join(big_tree, f"d{DIRS - 1:03d}", f"f{PER_DIR - 1:04d}")
    t0 = time.monotonic()
    r = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, "-c", APP, target)
    assert r.returncode == 0, r.stderr
    took, size = r.stdout.split()
    assert float(took) < 1.0 and size == "0", (took, time.monotonic() - t0)
    rep = load(report)
    meta, early = rep["metadata"], rep["pfs_before_index"]
    assert meta["local"] + meta["pfs"] == 1  # the one stat, counted where it was answered
    assert early["metadata"] == meta["pfs"] and early["opens"] == 0  # from the PFS only before the index
    assert rep["pfs_daemon_lost"] == {"opens": 0, "metadata": 0}
    if meta["pfs"]:
        assert "1 stat went to the PFS before the index was ready" in r.stderr
