"""The ``monarch`` command as a real process: exit codes and messages a user and a batch script see."""

import os

import pytest

from monarch import __version__
from support.harness import load, monarch, monarch_env, write_config

pytestmark = pytest.mark.integration


def test_monarch_alone_prints_help_exit_2():
    r = monarch(timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("usage: monarch") and "check-config" in r.stderr


def test_version():
    r = monarch("--version", timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, f"monarch {__version__}")


def test_command_not_found_is_127_in_one_line(short_tmp):
    env = monarch_env(MONARCH_DATASET=short_tmp)
    r = monarch("run", "--", "/nonexistent", "--flag", env=env, timeout=60)
    assert r.returncode == 127
    assert r.stderr == "monarch: /nonexistent: No such file or directory\n"
    r = monarch("run", "--", "no-such-command-monarch-test", env=env, timeout=60)
    assert r.returncode == 127
    assert r.stderr == "monarch: no-such-command-monarch-test: command not found\n"


def test_command_not_executable_is_126_in_one_line(short_tmp):
    script = os.path.join(short_tmp, "train.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o644)
    r = monarch("run", "--", script, env=monarch_env(MONARCH_DATASET=short_tmp), timeout=60)
    assert r.returncode == 126
    assert r.stderr == f"monarch: {script}: Permission denied\n"


def test_missing_dataset_root_stops_run_and_check_config_with_where_what_how(short_tmp):
    cfg = write_config(short_tmp, os.path.join(short_tmp, "imagnet"))
    marker = os.path.join(short_tmp, "ran")
    r = monarch("run", "-c", cfg, "--", "touch", marker, timeout=60)
    assert r.returncode == 2 and not os.path.exists(marker)
    want = f"config {cfg}: dataset.roots[0]: {short_tmp}/imagnet does not exist; check the path"
    assert want in r.stderr
    r = monarch("check-config", cfg, timeout=60)
    assert r.returncode == 2 and want in r.stderr


def test_dataset_flag_overrides_the_roots_of_the_configuration(dataset, short_tmp):
    ds = dataset(files=20, size="4KiB")
    cfg = write_config(short_tmp, os.path.join(short_tmp, "not-this-one"))  # replaced by --dataset
    report = os.path.join(short_tmp, "report.json")
    first = sorted(ds.files)[0]
    r = monarch("run", "-c", cfg, "--dataset", ds.root, "--report", report, "--",
                "sh", "-c", f"cat {os.path.join(ds.root, first)} >/dev/null", timeout=120)
    assert r.returncode == 0, r.stderr
    rep = load(report)
    # the walk listed the files; the one read was described (its size is the dataset's bytes known)
    assert rep["dataset"] == {"files": 20, "bytes": ds.files[first]["size"], "unsized": 19}
    assert rep["opened_from"]["ram"]["opens"] == 1  # the read was managed: the root was the --dataset one
