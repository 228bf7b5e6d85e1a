"""Nothing left behind (DESIGN.md 6, 11): a run, a fast-exiting run and a run whose dataset
holds a FIFO leave nothing in the tier bases but what ``keep: true`` and the finished
runs' reports keep; and a run's report outlives the next run in a shared base."""

import os
import re
import sys

import pytest

from monarch.testing.harness import load, monarch

pytestmark = pytest.mark.integration

UID = os.getuid()


def shared_base_config(short_tmp, root, policy="read-ahead", threads="auto"):
    """The shipped defaults' shape in the test's own directories: run_dir and the SSD tier
    share one base (``${TMPDIR:-/tmp}``), the RAM tier has its own (``/dev/shm``)."""
    base, ram = os.path.join(short_tmp, "tmp"), f"/dev/shm{short_tmp}/shm"
    path = os.path.join(short_tmp, "monarch.yaml")
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_dir: "{base}"
tiers:
  - {{name: ram, path: "{ram}", capacity: 1GiB}}
  - {{name: ssd, path: "{base}", capacity: 1GiB}}
peer: {{path: "{base}", capacity: 1GiB}}
staging: {{policy: {policy}, threads: {threads}}}
""")
    return path, base, ram


def left_in(base):
    """What runs left in ``<base>/monarch-<uid>/``, but the run directories (their reports)
    and the kept snapshots of the dataset."""
    user = os.path.join(base, f"monarch-{UID}")
    if not os.path.isdir(user):
        return []
    return sorted(n for n in os.listdir(user) if n != "snapshots" and not re.fullmatch(r".+-node\d+", n))


def test_a_runs_report_outlives_the_next_run_in_a_shared_base(dataset, short_tmp):
    ds = dataset(files=20, size="4KiB")
    cfg, base, _ = shared_base_config(short_tmp, ds.root)
    reports = []
    for _ in range(2):
        r = monarch("run", "-c", cfg, "--", "true", timeout=120)
        assert r.returncode == 0, r.stderr
        reports.append(re.search(r"^report\s*: (.+)$", r.stderr, re.M).group(1))
    first, second = reports
    assert first != second and os.path.dirname(first).startswith(os.path.join(base, f"monarch-{UID}"))
    assert load(first)["dataset"]["files"] == 20  # not removed by the second run's tier clean-up
    r = monarch("report", first)
    assert r.returncode == 0 and "Monarch access report" in r.stdout, r.stderr
    assert left_in(base) == []
