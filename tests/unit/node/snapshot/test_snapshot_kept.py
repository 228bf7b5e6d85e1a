"""The saved index of a dataset (the last walk, reused by the next job when no directory
changed) stays after a job only when a tier has ``keep: true``; otherwise no copy of it (large
at a million files) is left in ``run_base/monarch-<uid>/snapshots`` after the job."""

from __future__ import annotations

import glob
import os

import pytest

from monarch.config import load_config
from monarch.launch import service
from monarch.node.daemon import NodeDaemon
from support.harness import NO_RESERVE, make_bases

pytestmark = pytest.mark.timeout(60)


def job(short_tmp: str, keep: bool, run: str) -> str:
    """One job's daemon on a small dataset, walked inline and closed; how it got its snapshot."""
    root = os.path.join(short_tmp, "pfs")
    for i in range(5):
        os.makedirs(os.path.join(root, "d"), exist_ok=True)
        with open(os.path.join(root, "d", f"f{i}.bin"), "wb") as f:
            f.write(bytes([i]) * 100)
    cfg = os.path.join(short_tmp, f"c-{keep}.yaml")
    with open(cfg, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run"
tiers: [{{name: ram, path: "{short_tmp}/ram-{keep}", capacity: 1MiB, keep: {str(keep).lower()}}}]
staging: {{policy: on-access, threads: 2, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)
    config = load_config(cfg, env={"USER": "u"})
    d = NodeDaemon(config, run)
    try:
        # the launcher's progress line names the same file (monarch/launch/service.py)
        assert service.saved_index(config) == (saved(short_tmp)[0] if keep and saved(short_tmp) else None)
        return d.snapshot_how
    finally:
        d.close()


def saved(short_tmp: str) -> list[str]:
    return glob.glob(os.path.join(short_tmp, "run", "monarch-*", "snapshots", "*"))


def test_without_keep_no_index_copy_stays_and_none_is_reused(short_tmp):
    assert job(short_tmp, keep=False, run="r1").startswith("walked")
    assert saved(short_tmp) == []
    assert job(short_tmp, keep=False, run="r2").startswith("walked")
    assert saved(short_tmp) == []


def test_with_keep_the_index_stays_and_the_next_job_reuses_it(short_tmp):
    assert job(short_tmp, keep=True, run="r1").startswith("walked")
    assert len(saved(short_tmp)) == 1
    assert job(short_tmp, keep=True, run="r2") == "reused"
    # a job without keep leaves the kept index alone (it is the keeping jobs'), and does not read it
    assert job(short_tmp, keep=False, run="r3").startswith("walked")
    assert len(saved(short_tmp)) == 1
