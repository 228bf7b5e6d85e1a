import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from monarch.config import DEFAULTS_FILE, expand_vars, load_config, parse_size
from monarch.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
ENV = {"MONARCH_DATASET": "/data/ds", "USER": "u", "MONARCH_JOB_ID": "j1", "MONARCH_NODE": "3"}


def keys(tree, prefix=""):
    out = set()
    if isinstance(tree, dict):
        for k, v in tree.items():
            out |= {f"{prefix}{k}"} | keys(v, f"{prefix}{k}.")
    elif isinstance(tree, list) and tree and isinstance(tree[0], dict):
        out |= keys(tree[0], f"{prefix}[].")
    return out


def test_shipped_local_config_documents_every_default_key():
    defaults = yaml.safe_load(DEFAULTS_FILE.read_text())
    local = yaml.safe_load((REPO / "configs/local.yaml").read_text())
    assert keys(local) == keys(defaults)
    assert local == defaults  # local.yaml *is* the defaults, with the documentation


def test_defaults_load_with_builtin_variables(tmp_path):
    c = load_config(None, env=ENV)
    assert c.dataset.roots == ("/data/ds",)
    assert c.run_dir == "/tmp"  # a base: the run's private directory is made under it (layout.py)
    assert [t.name for t in c.tiers] == ["ram", "ssd"]
    assert c.tiers[0].path == "/dev/shm"
    assert c.tiers[0].capacity == 4 * 2**30
    assert c.staging.policy == "read-ahead" and c.staging.threads == 0  # threads: auto


@pytest.mark.parametrize("text,value", [("64GiB", 64 * 2**30), ("1.5KiB", 1536), ("10 MB", 10**7), (42, 42), ("7", 7)])
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_expand_vars_defaults_and_missing():
    assert expand_vars("${A}/${B:-x}/${C:-}", {"A": "a"}) == "a/x/"
    with pytest.raises(KeyError):
        expand_vars("${NOPE}", {})


def write(tmp_path, text):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,message", [
    ("tiers:\n  - {name: ram, path: /dev/shm/x, capacity: 64 G}\n",
     'tiers[0].capacity: expected a size like "64GiB"'),
    ("staging: {policy: lru}\n", "staging.policy: expected one of read-ahead, on-access, prestage, off, got 'lru'"),
    ("staging: {threads: 0}\n", "staging.threads: must be at least 1"),
    ("staging: {threads: many}\n", 'staging.threads: expected "auto" or a whole number'),
    ("stagin: {threads: 2}\n", "stagin: unknown key; known keys here: dataset, peer, report, run_dir, staging, tiers"),
    ("tiers:\n  - {name: ram, path: /dev/shm/x}\n", "tiers[0].capacity: missing"),
    ("tiers:\n  - {name: pfs, path: /dev/shm/x, capacity: 1GiB}\n", "tiers[0].name: 'pfs' is not allowed"),
    ("tiers:\n  - {name: a, path: /data/ds/cache, capacity: 1GiB}\n", "overlaps the dataset root /data/ds"),
    ("run_dir: ${NOT_SET_ANYWHERE}\n", "run_dir: ${NOT_SET_ANYWHERE} is not set"),
    ("dataset: {roots: []}\n", "dataset.roots: no dataset roots"),
    ("dataset: {roots: [\"${EMPTY:-}\"]}\n", "dataset.roots: no dataset roots"),
    ("tiers: [\n", "not valid YAML"),
    ("tiers:\n  - {name: a, path: /x, capacity: 1GiB, speed: 3}\n", "tiers[0].speed: unknown key"),
])
def test_bad_configs_say_where_what_and_how(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path, env=ENV)
    assert str(e.value).startswith(f"config {path}")
    assert message in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(str(tmp_path / "nope.yaml"), env=ENV)


def test_user_values_override_defaults(tmp_path):
    path = write(tmp_path, "dataset: {roots: [/a, /b]}\nstaging: {policy: prestage, threads: 2}\n"
                           "tiers:\n  - {name: fast, path: /dev/shm/t, capacity: 1MiB, keep: true}\n")
    c = load_config(path, env=ENV)
    assert c.dataset.roots == ("/a", "/b")
    assert c.staging.policy == "prestage" and c.staging.threads == 2
    assert c.staging.resolve_timeout == 30.0  # default kept
    assert len(c.tiers) == 1 and c.tiers[0].keep is True and c.tiers[0].capacity == 2**20


def test_check_config_cli(tmp_path, capsys):
    from monarch.cli import main
    good = write(tmp_path, "dataset: {roots: [/a]}\n")
    os.environ.setdefault("USER", "u")
    assert main(["check-config", good]) == 0
    bad = write(tmp_path, "dataset: {roots: [/a]}\nstaging: {policy: lru}\n")
    assert main(["check-config", bad]) == 2
    assert "staging.policy" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["local.yaml", "cluster.yaml"])
def test_shipped_configs_validate(name):
    c = load_config(str(REPO / "configs" / name), env=ENV)
    if name == "local.yaml":  # the defaults, documented
        assert dataclasses.replace(c, source="") == dataclasses.replace(load_config(None, env=ENV), source="")
    else:
        assert c.run_dir.endswith("/node3") and c.tiers[0].path.endswith("/node3/ram")
