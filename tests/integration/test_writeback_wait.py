"""While `monarch run` waits for the job's write-back to reach the PFS (docs/consistency.md,
"Write-back", W7): its progress line says the bytes pending, the drain's rate and the time left;
off with --no-progress, as the line while the command runs."""

import hashlib
import os
import sys

import pytest

from support.harness import monarch, monarch_env
from support.writeback import writable_pfs_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FILES, SIZE = 8, 1 << 20

WRITE = f"""
import hashlib, os, sys
ck = sys.argv[1]
for k in range({FILES}):  # at the node's speed: the drain to the 2 MB/s PFS is left for the end
    data = bytes([k]) * {SIZE}
    with open(os.path.join(ck, f"shard{{k}}"), "wb") as f:
        f.write(data)
    print(hashlib.md5(data).hexdigest())
"""


def job(short_tmp, dataset, slow_pfs, *options):
    src, ck, cfg = writable_pfs_job(short_tmp, dataset(files=20).root, slow_pfs, mbps=2)
    r = monarch("run", "-c", cfg, *options, "--", sys.executable, "-c", WRITE, ck,
                env=monarch_env(MONARCH_PROGRESS="1", MONARCH_PROGRESS_INTERVAL="1"))
    assert r.returncode == 0, r.stderr
    published = [hashlib.md5(open(os.path.join(src, "ck", f"shard{k}"), "rb").read()).hexdigest()
                 for k in range(FILES)]
    assert published == r.stdout.split()  # every shard on the PFS, byte for byte, when monarch run returned
    return r


def test_while_the_run_waits_for_its_drain_the_line_says_pending_rate_and_time_left(dataset, short_tmp, slow_pfs):
    """8 MiB to a PFS taking 2 MB/s: about 4 s of waiting once the command has ended, a line a second."""
    r = job(short_tmp, dataset, slow_pfs)
    lines = [x for x in r.stderr.splitlines() if x.startswith("monarch: publishing the job's writes to the PFS: ")]
    assert len(lines) >= 2, r.stderr  # whole lines (stderr is a pipe here), about one a second
    assert "\x1b[" not in r.stderr
    full = [x for x in lines if " pending (" in x and "/s, about " in x and x.endswith(" s left")]
    assert full, lines
    pending = [float(x.split(": ")[2].split(" MiB pending")[0]) for x in full if " MiB pending" in x]
    assert pending and all(0 < p <= FILES * SIZE / 2**20 for p in pending), lines
    assert pending == sorted(pending, reverse=True), lines  # it only goes down
    rate = float(full[-1].split(", ")[1].split(" ")[0]) * (1024 if "MiB/s" in full[-1] else 1)
    assert 0.5 * 1024 < rate < 8 * 1024, full  # KiB/s, about the PFS's 2 MB/s
    assert r.stderr.index(lines[-1]) < r.stderr.index("report    : "), r.stderr  # before the report


def test_no_progress_means_no_line_while_waiting_either(dataset, short_tmp, slow_pfs):
    r = job(short_tmp, dataset, slow_pfs, "--no-progress")
    assert "monarch: publishing" not in r.stderr and "monarch: staged" not in r.stderr
