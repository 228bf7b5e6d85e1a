"""Tier bases that cannot be used: the run says so on the terminal, once, in the report, and
goes on without them (fail open); nothing is made where no base exists."""

import os
import subprocess
import uuid

import pytest

from support.harness import NO_RESERVE, load, monarch, reader

pytestmark = pytest.mark.integration


def two_tiers(short_tmp, root, ram_base, ssd_base) -> str:
    run_base = os.path.join(short_tmp, "run")
    os.makedirs(run_base, exist_ok=True)
    path = os.path.join(short_tmp, "c.yaml")
    with open(path, "w") as f:
        f.write(f'dataset: {{roots: ["{root}"]}}\nrun_base: "{run_base}"\n'
                f'tiers:\n  - {{name: ram, path: "{ram_base}", capacity: 1GiB}}\n'
                f'  - {{name: ssd, path: "{ssd_base}", capacity: 1GiB}}\n'
                'staging: {policy: on-access, threads: 2, share: false}\n' + NO_RESERVE)
    return path


def lines_with(text: str, *words: str) -> list[str]:
    return [line for line in text.splitlines() if all(w in line for w in words)]


@pytest.fixture
def read_only_dir(short_tmp):
    if os.getuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    path = os.path.join(short_tmp, "ro")
    os.makedirs(path)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", path], capture_output=True, text=True,
                       timeout=30)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", path], timeout=30, check=True)


def test_a_tier_on_a_read_only_filesystem_is_named_at_the_start_and_in_the_report(dataset, short_tmp, read_only_dir):
    ds = dataset(files=40, size="4KiB")
    ssd = os.path.join(short_tmp, "ssd")
    os.makedirs(ssd)
    report = os.path.join(short_tmp, "r.json")
    cfg = two_tiers(short_tmp, ds.root, read_only_dir, ssd)
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=2))
    assert r.returncode == 0, r.stderr  # every digest checked: the bytes are the PFS's
    said = lines_with(r.stderr, "tier ram is not used", read_only_dir, "Read-only file system")
    assert len(said) == 1, r.stderr
    assert len(lines_with(r.stderr, "tier ram not used:", "Read-only file system")) == 1, r.stderr  # the report
    rep = load(report)
    assert "Read-only file system" in rep["tier_errors"]["ram"]["reason"]
    assert rep["opened_from"]["ssd"]["opens"] == 80 and "ram" not in rep["opened_from"]  # the other tier serves


def test_a_missing_tier_base_is_named_by_check_config_and_the_run_and_never_made(dataset, short_tmp):
    ds = dataset(files=40, size="4KiB")
    missing = f"/nonexistent-{uuid.uuid4().hex[:8]}/shm"
    ssd = os.path.join(short_tmp, "ssd")
    os.makedirs(ssd)
    cfg = two_tiers(short_tmp, ds.root, missing, ssd)
    line = f"config {cfg}: tiers[0].path: {missing} does not exist; create it or fix the path"
    r = monarch("check-config", cfg)
    assert r.returncode == 2 and line in r.stderr and "OK" not in r.stdout, (r.stdout, r.stderr)  # a configuration error
    report = os.path.join(short_tmp, "r.json")
    r = monarch("run", "-c", cfg, "--report", report, "--", *reader(ds, epochs=2))
    assert r.returncode == 0, r.stderr
    assert len(lines_with(r.stderr, "tier ram is not used", line)) == 1, r.stderr
    assert load(report)["opened_from"]["ssd"]["opens"] == 80
    assert not os.path.exists(os.path.dirname(missing))


def test_a_missing_run_base_is_named_and_the_command_reads_the_pfs(dataset, short_tmp):
    ds = dataset(files=20, size="4KiB")
    cfg = two_tiers(short_tmp, ds.root, os.path.join(short_tmp, "ssd"), os.path.join(short_tmp, "ssd"))
    os.makedirs(os.path.join(short_tmp, "ssd"))
    os.rmdir(os.path.join(short_tmp, "run"))
    r = monarch("run", "-c", cfg, "--", *reader(ds, epochs=1))
    assert r.returncode == 0, r.stderr
    run_base = os.path.join(short_tmp, "run")
    assert len(lines_with(r.stderr, "not active for this run", f"run_base: {run_base} does not exist")) == 1, r.stderr
    assert not os.path.exists(run_base)
