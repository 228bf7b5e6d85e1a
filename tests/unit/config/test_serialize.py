"""The checked configuration handed to a daemon as JSON, and what a daemon serves."""

import dataclasses
import json

import pytest

from monarch.config import ConfigError, differences, from_json, load_config, served, to_json


def _config(tmp_path, text=""):
    (tmp_path / "ds").mkdir(exist_ok=True)
    (tmp_path / "runs").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(f"dataset: {{roots: [{tmp_path}/ds]}}\nrun_base: {tmp_path}/runs\n{text}")
    return load_config(str(path))


def _every_field_set(tmp_path):
    """A configuration whose every field differs from its default (a field added later is caught)."""
    (tmp_path / "store_root").mkdir()
    (tmp_path / "ckpt").mkdir()
    config = _config(tmp_path, f"""tiers:
  - {{name: ram, path: /dev/shm, capacity: "50%", compression: zstd, decoded_cache: 1MiB}}
  - {{name: ssd, path: {tmp_path}, capacity: 3GiB, keep: false}}
staging: {{policy: on-access, threads: 3, resolve_timeout: 7.5, validate: none, share: false, linger: 0}}
peer: {{path: {tmp_path}, capacity: "25%", timeout: 2, replicas: 2, fetch_ahead: false}}
memory_margin: 1GiB
filesystem_reserve: 1GiB
writeback: {{paths: [{tmp_path}/ckpt], tier: ssd, room: 1GiB, fsync: local}}
report: {tmp_path}/r.json
report_html: {tmp_path}/r.html
""")
    return dataclasses.replace(config, dataset=dataclasses.replace(
        config.dataset, stores=((f"{tmp_path}/ds", "redis://localhost:6379/0?prefix=p"),)))


def test_the_daemons_rebuilt_configuration_equals_the_launchers_checked_one(tmp_path):
    for config in (_config(tmp_path), _every_field_set(tmp_path)):
        rebuilt = from_json(to_json(config))
        assert rebuilt == config
        assert type(rebuilt.dataset.roots) is tuple and type(rebuilt.tiers) is tuple  # frozen, hashable
        assert type(rebuilt.writeback.paths) is tuple
        assert hash(rebuilt.tiers) == hash(config.tiers)


def test_the_rebuilt_configuration_keeps_every_field_of_the_model(tmp_path):
    config = _every_field_set(tmp_path)
    default = _config(tmp_path)
    for name in (f.name for f in dataclasses.fields(config)):
        if name not in ("source", "run_base", "dataset"):
            assert getattr(config, name) != getattr(default, name), f"{name}: set it in _every_field_set"
        assert getattr(from_json(to_json(config)), name) == getattr(config, name), name


@pytest.mark.parametrize("text", ["", "{", "[]", '{"dataset": {}}', json.dumps({"dataset": {"roots": []}})])
def test_what_is_not_a_checked_configuration_is_refused_with_a_line(text):
    with pytest.raises(ConfigError, match="not a checked configuration"):
        from_json(text)


def test_unknown_fields_are_refused(tmp_path):
    data = json.loads(to_json(_config(tmp_path)))
    data["tiers"][0]["speed"] = 1
    with pytest.raises(ConfigError, match="not a checked configuration"):
        from_json(json.dumps(data))


def test_what_a_daemon_serves_is_every_setting_that_changes_what_it_does(tmp_path):
    tier = "tiers: [{name: ram, path: /dev/shm, capacity: 1GiB}]\n"
    base = served(_config(tmp_path, tier))
    assert set(base) == {"dataset", "tiers", "staging", "peer", "memory_margin", "memory_margin_share",
                         "filesystem_reserve", "filesystem_reserve_share", "writeback"}
    assert base == json.loads(json.dumps(base))  # as the daemon's ATTACH answer carries it
    for text, key in [("tiers: [{name: ram, path: /dev/shm, capacity: 2GiB}]", "tiers[0].capacity"),
                      ("tiers: [{name: ram, path: /dev/shm, capacity: 1GiB, keep: true}]", "tiers[0].keep"),
                      (tier + "staging: {policy: on-access}", "staging.policy"),
                      (tier + "staging: {threads: 5}", "staging.threads"),
                      (tier + "peer: {timeout: 3}", "peer.timeout"),
                      (tier + "memory_margin: 1GiB", "memory_margin"),
                      (tier + "filesystem_reserve: 1GiB", "filesystem_reserve"),
                      (tier + "writeback: {fsync: local}", "writeback.fsync")]:
        other = served(_config(tmp_path, text + "\n"))
        assert other != base, text
        assert key in [line.split(":")[0] for line in differences(base, other)], text


def test_a_root_spelt_another_way_and_the_reports_do_not_count(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "ds")
    config = _config(tmp_path)
    other = load_config(str(tmp_path / "job.yaml"), roots=[f"{tmp_path}/link"])
    other = dataclasses.replace(other, source="elsewhere.yaml", report="/x.json", report_html="/x.html")
    assert other.dataset.given != config.dataset.given
    assert served(other) == served(config)


def test_differences_name_the_key_and_both_values(tmp_path):
    a = served(_config(tmp_path, "tiers: [{name: ram, path: /dev/shm, capacity: 1GiB}]\n"))
    b = served(_config(tmp_path, "tiers: [{name: ram, path: /dev/shm, capacity: 2GiB}]\n"))
    assert differences(a, b) == ["tiers[0].capacity: 1073741824 there, 2147483648 here"]
    assert differences(a, a) == []
    c = served(_config(tmp_path, "tiers: [{name: ram, path: /dev/shm, capacity: 1GiB}, "
                                 f"{{name: ssd, path: {tmp_path}, capacity: 1GiB}}]\n"))
    assert [line.split(":")[0] for line in differences(a, c)] == ["tiers"]
