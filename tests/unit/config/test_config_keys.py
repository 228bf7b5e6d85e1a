"""Each configuration key declared once (monarch/config/keys.py): the defaults files, the dataclasses,
`monarch check-config` and docs/configuration.md's table are held to the declarations."""

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from monarch.cli import main
from monarch.config import DEFAULTS_FILE, KEYS, load_config
from monarch.config import keys as keys_module
from monarch.config import model
from monarch.config.docs import TABLE_BEGIN, TABLE_END, table, yaml_text
from monarch.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


def flat(tree, prefix=""):
    """{"staging.policy": value, "tiers[].name": [each tier's value], ...} of a YAML tree."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:  # an empty mapping is a key's value (dataset.stores: {})
            out.update(flat(v, f"{prefix}{k}."))
        elif k == "tiers":
            for t in v:
                for name, value in t.items():
                    out.setdefault(f"tiers[].{name}", []).append(value)
        else:
            out[f"{prefix}{k}"] = v
    return out


def declared():
    """The same shape from the declarations: a tier key has each shipped tier's value."""
    return {k.path: (list(k.shipped) or [k.default] * keys_module.SHIPPED_TIERS) if k.per_tier else k.default
            for k in KEYS}


@pytest.mark.parametrize("path", [DEFAULTS_FILE, REPO / "configs" / "local.yaml"], ids=["defaults", "local"])
def test_shipped_files_hold_exactly_the_declared_keys_with_their_defaults(path):
    shipped = yaml.safe_load(Path(path).read_text())
    assert flat(shipped) == declared()
    assert shipped == keys_module.default_tree()


def test_every_declared_key_fills_its_dataclass_field_and_every_field_is_declared():
    sections = {"": model.Config, "dataset": model.DatasetConfig, "tiers": model.TierConfig,
                "staging": model.StagingConfig, "peer": model.PeerConfig, "writeback": model.WritebackConfig}
    derived = {"": {"source", "dataset", "tiers", "staging", "peer", "peer_given", "writeback"}, "dataset": {"given"}}
    for section, cls in sections.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        filled = {f for k in KEYS if k.section == section for f in k.fields}
        assert filled | derived.get(section, set()) == fields, section


def test_readme_table_is_the_declarations():
    """Fails when a key is added or changed without `python3 scripts/config_table.py`."""
    readme = (REPO / "docs" / "configuration.md").read_text()
    begin, end = readme.index(TABLE_BEGIN) + len(TABLE_BEGIN), readme.index(TABLE_END)
    assert readme[begin:end].strip() == table()
    for key in KEYS:  # one row each, with its default
        row = next(line for line in readme[begin:end].splitlines() if line.startswith(f"| `{key.path}` |"))
        assert f"`{yaml_text(key.shipped[0] if key.shipped else key.default)}`" in row


def test_check_config_lists_every_declared_key_with_its_value_and_source(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(f"dataset: {{roots: [{tmp_path}]}}\n"
                   "tiers:\n  - {name: fast, path: /dev/shm, capacity: 50%, compression: zstd}\n"
                   "staging: {threads: 8}\n")
    assert main(["check-config", str(job)]) == 0
    out = capsys.readouterr().out
    listed = {}
    for line in out.split("every key (value, from):\n")[1].splitlines():
        key, rest = line.split(None, 1)
        value, origin = rest.rsplit("  (", 1)
        listed[key] = (value.strip(), origin.rstrip(")"))
    expected = [k.path.replace("[]", "[0]") for k in KEYS]
    assert list(listed) == expected
    assert listed["tiers[0].capacity"] == ("50%", str(job))
    assert listed["tiers[0].compression"] == ("zstd", str(job))
    assert listed["tiers[0].keep"] == ("false", "default")
    assert listed["staging.threads"] == ("8", str(job))
    assert listed["staging.policy"] == ("read-ahead", "default")
    assert listed["peer.capacity"] == ("32GiB", "default")
    assert listed["memory_margin"] == ("10%", "default")
    assert listed["dataset.roots"] == (str(tmp_path), str(job))


def write(tmp_path, text):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return str(p)


@pytest.fixture
def env(tmp_path):
    (tmp_path / "ds").mkdir()
    return {"MONARCH_DATASET": str(tmp_path / "ds"), "USER": "u", "MONARCH_JOB_ID": "j1", "MONARCH_NODE": "0"}


def test_an_unquoted_off_is_read_as_off(tmp_path, env):
    """YAML reads a bare `off` as false: a key whose choices include "off" takes it as "off"."""
    path = write(tmp_path, "staging: {policy: off}\n"
                           "tiers:\n  - {name: ram, path: /dev/shm, capacity: 1GiB, compression: off, decoded_cache: off}\n")
    c = load_config(path, env=env)
    assert (c.staging.policy, c.tiers[0].compression, c.tiers[0].decoded_cache) == ("off", "off", 0)


def test_an_unquoted_yaml_boolean_for_a_string_key_says_to_quote_it(tmp_path, env):
    path = write(tmp_path, "staging: {validate: no}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env)
    assert str(e.value) == (f"config {path}: staging.validate: expected a string, got False (YAML reads an "
                            'unquoted off, on, no, yes as false or true: quote it, e.g. "off")')


def test_peer_capacity_takes_a_share_of_the_node_like_a_tier(tmp_path, env):
    path = write(tmp_path, "peer: {capacity: 50%}\n")
    c = load_config(path, env=env)
    assert (c.peer.capacity, c.peer.capacity_share) == (0, 0.5)
    path = write(tmp_path, "peer: {capacity: 150%}\n")
    with pytest.raises(ConfigError, match=r"peer.capacity: a share of the node .* must be more than 0% and at most "
                                          r"100%, got '150%'"):
        load_config(path, env=env)


def test_unknown_key_still_names_the_known_ones(tmp_path, env):
    path = write(tmp_path, "peer: {capacty: 1GiB}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env)
    assert str(e.value) == f"config {path}: peer.capacty: unknown key; known keys here: capacity, fetch_ahead, path, replicas, timeout"


def _comment_above(lines: list[str], i: int) -> str:
    """The comment lines directly above line ``i`` of a YAML file, joined."""
    out = []
    while i > 0 and lines[i - 1].startswith("#"):
        i -= 1
        out.insert(0, lines[i])
    return " ".join(out).lower()


def test_local_yaml_says_cluster_only_above_the_cluster_only_keys():
    """configs/local.yaml: the cluster-only comment sits above the section whose keys are cluster
    only (peer), never above one that applies on a single node (memory_margin)."""
    lines = (REPO / "configs" / "local.yaml").read_text().splitlines()
    top = {line.split(":", 1)[0]: i for i, line in enumerate(lines) if line[:1].isalpha() and ":" in line}
    for name, i in top.items():
        cluster_only = all(k.doc.startswith("cluster only") for k in KEYS if k.path.split(".")[0].split("[")[0] == name)
        assert ("cluster only" in _comment_above(lines, i)) == cluster_only, name
