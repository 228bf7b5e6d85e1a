import os
from pathlib import Path

import pytest
import yaml

from monarch.config import DEFAULTS_FILE, expand_vars, load_config, parse_size, read_user
from monarch.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def ds(tmp_path):
    """An existing dataset root (roots must exist to validate)."""
    root = tmp_path / "ds"
    root.mkdir()
    return str(root)


@pytest.fixture
def env(ds):
    return {"MONARCH_DATASET": ds, "USER": "u", "MONARCH_JOB_ID": "j1", "MONARCH_NODE": "3"}


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


def test_defaults_load_with_builtin_variables(env, ds):
    c = load_config(None, env=env)
    assert c.dataset.roots == (os.path.realpath(ds),)
    # run_base and tier paths are base directories: Monarch makes its monarch-<uid>/... inside
    assert c.run_base == "/tmp"
    assert [t.name for t in c.tiers] == ["ram", "ssd"]
    assert [t.path for t in c.tiers] == ["/dev/shm", "/tmp"]
    assert c.peer.path == "/tmp"
    assert c.tiers[0].capacity == 4 * 2**30
    assert c.staging.policy == "read-ahead" and c.staging.threads == 0  # threads: auto


@pytest.mark.parametrize("extra,ssd,run_base", [
    ({}, "/tmp", "/tmp"),
    ({"TMPDIR": "/scratch/job7"}, "/scratch/job7", "/scratch/job7"),
    ({"TMPDIR": "/scratch/job7", "MONARCH_SSD": "/nvme"}, "/nvme", "/scratch/job7"),
])
def test_default_base_directories_follow_tmpdir_and_monarch_ssd(env, extra, ssd, run_base):
    c = load_config(None, env=dict(env, **extra))
    assert (c.tiers[1].path, c.peer.path, c.run_base, c.tiers[0].path) == (ssd, ssd, run_base, "/dev/shm")


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
    ("staging: {policy: lru}\n", "staging.policy: expected one of read-ahead, on-access, off, got 'lru'"),
    ("staging: {threads: 0}\n", "staging.threads: must be at least 1"),
    ("staging: {threads: many}\n", 'staging.threads: expected "auto" or a whole number'),
    ("stagin: {threads: 2}\n", "stagin: unknown key; known keys here: dataset, filesystem_reserve, memory_margin, peer, report, "
     "report_html, run_base, "
     "staging, tiers"),
    ("tiers:\n  - {name: ram, path: /dev/shm/x, capacity: 150%}\n",
     "tiers[0].capacity: a share of the node (of available memory for a tier on tmpfs/ramfs, else of free space) "
     "must be more than 0% and at most 100%, got '150%'"),
    ("tiers:\n  - {name: ram, path: /dev/shm/x, capacity: half}\n",
     'or a share of the node (of available memory for a tier on tmpfs/ramfs, else of free space) like "50%", '
     "got 'half'"),
    ("memory_margin: lots\n", "memory_margin: expected a size like \"64GiB\""),
    ("memory_margin: 0%\n", "memory_margin: a share of the node's total memory must be more than 0%"),
    ("filesystem_reserve: 0%\n", "filesystem_reserve: a share of the tier's filesystem's size must be more than 0%"),
    ("filesystem_reserve: some\n", "filesystem_reserve: expected a size like \"64GiB\""),
    ("staging: {validate: always}\n", "staging.validate: expected one of none, open, got 'always'"),
    ("tiers:\n  - {name: ram, path: /dev/shm/x}\n", "tiers[0].capacity: missing"),
    ("tiers:\n  - {name: pfs, path: /dev/shm/x, capacity: 1GiB}\n", "tiers[0].name: 'pfs' is not allowed"),
    ("tiers:\n  - {name: a, path: /data/ds/cache, capacity: 1GiB}\n", "overlaps the dataset root /data/ds"),
    ("run_base: ${NOT_SET_ANYWHERE}\n", "run_base: ${NOT_SET_ANYWHERE} is not set"),
    ("dataset: {roots: []}\n", "dataset.roots: no dataset roots"),
    ("dataset: {roots: [\"${EMPTY:-}\"]}\n", "dataset.roots: no dataset roots"),
    ("tiers: [\n", "not valid YAML"),
    ("dataset: {roots: [/data/ds], manifest: /nowhere/ds.index}\n",
     "dataset.manifest: /nowhere/ds.index is not a readable file; make it with `monarch index ROOT... -o /nowhere/ds.index`"),
    ("tiers:\n  - {name: a, path: /x, capacity: 1GiB, speed: 3}\n", "tiers[0].speed: unknown key"),
])
def test_bad_configs_say_where_what_and_how(tmp_path, env, ds, text, message):
    path = write(tmp_path, text.replace("/data/ds", ds))
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env)
    message = message.replace("/data/ds", ds)
    assert str(e.value).startswith(f"config {path}")
    assert message in str(e.value)


def test_a_list_given_as_the_manifest_says_how_to_make_one(tmp_path, env, ds):
    listing = tmp_path / "train.txt"
    listing.write_text("a/x.jpg\t12\n")
    path = write(tmp_path, f"dataset: {{roots: [{ds}], manifest: {listing}}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env)
    assert f"is no manifest `monarch index` wrote; a list of the files becomes one with `monarch index ROOT -o FILE " \
           f"--from-list {listing}`" in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path, env):
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(str(tmp_path / "nope.yaml"), env=env)


def test_user_values_override_defaults(tmp_path, env):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    path = write(tmp_path, f"dataset: {{roots: [{tmp_path}/a, {tmp_path}/b]}}\n"
                           "staging: {policy: prestage, threads: 2}\n"
                           "tiers:\n  - {name: fast, path: /dev/shm/t, capacity: 1MiB, keep: true}\n")
    c = load_config(path, env=env)
    assert c.dataset.roots == (f"{tmp_path}/a", f"{tmp_path}/b")
    assert c.staging.policy == "read-ahead" and c.staging.threads == 2  # prestage: read-ahead's older name
    assert c.staging.resolve_timeout == 30.0  # default kept
    assert len(c.tiers) == 1 and c.tiers[0].keep is True and c.tiers[0].capacity == 2**20


def test_check_config_cli(tmp_path, ds, capsys):
    from monarch.cli import main
    good = write(tmp_path, f"dataset: {{roots: [{ds}]}}\n")
    os.environ.setdefault("USER", "u")
    assert main(["check-config", good]) == 0
    bad = write(tmp_path, f"dataset: {{roots: [{ds}]}}\nstaging: {{policy: lru}}\n")
    assert main(["check-config", bad]) == 2
    assert "staging.policy" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["local.yaml", "cluster.yaml"])
def test_shipped_configs_validate(name, env):
    c = load_config(str(REPO / "configs" / name), env=env)
    assert c.run_base == "/tmp" and [t.path for t in c.tiers] == ["/dev/shm", "/tmp"] and c.peer.path == "/tmp"


def test_expand_vars_nested_defaults_are_expanded_only_when_used():
    nested = "${MONARCH_SSD:-${TMPDIR:-/tmp}}"
    assert expand_vars(nested, {}) == "/tmp"
    assert expand_vars(nested, {"TMPDIR": "/scratch"}) == "/scratch"
    assert expand_vars(nested, {"TMPDIR": "/scratch", "MONARCH_SSD": "/nvme"}) == "/nvme"
    assert expand_vars(nested + "/x", {"TMPDIR": ""}) == "/tmp/x"  # empty counts as unset, as in the shell
    assert expand_vars("${A:-${UNSET_NO_DEFAULT}}", {"A": "a"}) == "a"  # an unused default is not expanded
    with pytest.raises(ValueError, match="closing"):
        expand_vars("${A:-${B:-c}", {})


def test_malformed_variable_is_a_config_error(tmp_path, env):
    path = write(tmp_path, "run_base: ${TMPDIR-/tmp}\n")
    with pytest.raises(ConfigError, match=r"run_base: .*only \$\{TMPDIR\} and \$\{TMPDIR:-default\}"):
        load_config(path, env=env)


def test_missing_root_names_key_path_and_fix(tmp_path, env):
    path = write(tmp_path, "dataset: {roots: [/pfs/imagnet]}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env)
    assert str(e.value) == (f"config {path}: dataset.roots[0]: /pfs/imagnet does not exist; "
                            "check the path (the dataset must be reachable on this node)")


def test_missing_root_from_monarch_dataset_points_at_the_variable(env):
    with pytest.raises(ConfigError) as e:
        load_config(None, env=dict(env, MONARCH_DATASET="/pfs/imagnet"))
    assert "dataset.roots[0]: /pfs/imagnet does not exist; check MONARCH_DATASET or the path" in str(e.value)


def test_relative_root_is_taken_from_the_cwd_and_said_so_only_when_missing(tmp_path, env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    path = write(tmp_path, "dataset: {roots: [here, gone]}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env)
    assert str(e.value) == (f"config {path}: dataset.roots[1]: gone (relative, so taken from the current "
                            f"directory as {tmp_path}/gone) does not exist; "
                            "check the path (the dataset must be reachable on this node)")
    path = write(tmp_path, "dataset: {roots: [here]}\n")
    assert load_config(path, env=env).dataset.roots == (str(tmp_path / "here"),)


def test_root_that_is_a_file_or_unreadable(tmp_path, env, monkeypatch):
    (tmp_path / "file").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o300)  # writable and searchable, but not listable
    if os.geteuid() == 0:  # root may read everything: make os.access answer as for another user
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(locked) else real_access(p, mode))
    try:
        path = write(tmp_path, f"dataset: {{roots: [{tmp_path}/file, {locked}]}}\n")
        with pytest.raises(ConfigError) as e:
            load_config(path, env=env)
        msg = str(e.value)
        assert f"dataset.roots[0]: {tmp_path}/file is not a directory" in msg
        assert f"dataset.roots[1]: {locked} is not readable by you" in msg
    finally:
        locked.chmod(0o700)


def test_check_roots_false_accepts_a_root_not_there(tmp_path, env):
    path = write(tmp_path, "dataset: {roots: [/pfs/not/mounted/here]}\n")
    assert load_config(path, env=env, check_roots=False).dataset.roots == ("/pfs/not/mounted/here",)


def test_every_error_of_a_file_is_reported_one_line_each(tmp_path, env):
    path = write(tmp_path, "dataset: {roots: [/pfs/imagnet]}\n"
                           "tiers:\n  - {name: ram, path: /dev/shm, capacity: 64 G}\n"
                           "  - {name: ram, path: /tmp, capacity: 1GiB, keep: yes please}\n"
                           "staging: {policy: lru, threads: 0, validte: open}\n"
                           "peer: {timeout: -1}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env)
    head, *lines = str(e.value).splitlines()
    assert head == f"config {path}: 8 errors:"
    keys = [line.strip().removeprefix(f"config {path}: ").split(": ")[0] for line in lines]
    assert keys == ["staging.validte", "dataset.roots[0]", "tiers[0].capacity", "tiers[1].name", "tiers[1].keep",
                    "staging.policy", "staging.threads", "peer.timeout"]
    assert all(line.startswith(f"  config {path}: ") for line in lines)
    assert "'ram' is used by another tier" in lines[3]


def test_cli_dataset_override_replaces_the_roots(tmp_path, env, ds):
    other = tmp_path / "other"
    other.mkdir()
    path = write(tmp_path, f"dataset: {{roots: [{ds}]}}\n")
    assert load_config(path, env=env, roots=[str(other)]).dataset.roots == (str(other),)
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env, roots=["/pfs/imagnet"])
    assert "dataset.roots[0] (from --dataset): /pfs/imagnet does not exist; check the path given with --dataset" \
        in str(e.value)


@pytest.mark.parametrize("key,base,bad", [
    ("tiers[0].path", "{tmp}", False),          # the dataset below a base directory: fine, Monarch uses monarch-<uid>
    ("tiers[0].path", "{ds}/cache", True),      # Monarch's copies inside the dataset
    ("tiers[0].path", "{ds}/..", False),
    ("peer.path", "{ds}/peer", True),
])
def test_base_directories_may_hold_the_dataset_but_not_be_inside_it(tmp_path, env, ds, key, base, bad):
    base = base.format(tmp=tmp_path, ds=ds)
    text = (f"tiers:\n  - {{name: ram, path: {base}, capacity: 1GiB}}\n" if key.startswith("tiers")
            else f"peer: {{path: {base}}}\n")
    path = write(tmp_path, text)
    if not bad:
        load_config(path, env=env)
        return
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env)
    assert f"{key}: {base} would put Monarch's copies in {base}/monarch-{os.getuid()}, which overlaps " \
           f"the dataset root {ds}" in str(e.value)


def test_staging_validate(tmp_path, env, ds):
    assert load_config(None, env=env).staging.validate == "none"
    path = write(tmp_path, "staging: {validate: open}\n")
    assert load_config(path, env=env).staging.validate == "open"


def test_capacity_as_a_share_and_the_memory_margin(tmp_path, env):
    path = write(tmp_path, "tiers:\n  - {name: ram, path: /dev/shm/x, capacity: 50%}\n"
                           "  - {name: ssd, path: /tmp/x, capacity: 12.5 %}\nmemory_margin: 2GiB\n")
    c = load_config(path, env=env)
    assert [(t.capacity, t.capacity_share) for t in c.tiers] == [(0, 0.5), (0, 0.125)]
    assert (c.memory_margin, c.memory_margin_share) == (2 * 2**30, None)
    d = load_config(None, env=env)  # the default: 10% of the node's memory stays free
    assert (d.memory_margin, d.memory_margin_share) == (0, 0.10)
    assert d.tiers[0].capacity_share is None and d.report_html is None


def test_the_filesystem_reserve_a_share_a_size_or_none(tmp_path, env):
    d = load_config(None, env=env)  # the default: a quarter of each tier's filesystem stays free
    assert (d.filesystem_reserve, d.filesystem_reserve_share) == (0, 0.25)
    for text, want in [("filesystem_reserve: 10%\n", (0, 0.10)), ("filesystem_reserve: 1GiB\n", (2**30, None)),
                       ("filesystem_reserve: 0\n", (0, None))]:
        c = load_config(write(tmp_path, text), env=env)
        assert (c.filesystem_reserve, c.filesystem_reserve_share) == want, text


def test_the_older_policy_name_is_read_as_the_new_one_with_a_warning(tmp_path, env, caplog):
    (tmp_path / "a").mkdir()
    path = write(tmp_path, f"dataset: {{roots: [{tmp_path}/a]}}\nstaging: {{policy: prestage}}\n")
    with caplog.at_level("WARNING", logger="monarch.config"):
        c = load_config(path, env=env)
    assert c.staging.policy == "read-ahead"
    assert "staging.policy: 'prestage' is the older name of 'read-ahead'; write read-ahead" in caplog.text


def test_the_older_run_dir_key_is_read_as_run_base_with_a_warning(tmp_path, env, caplog):
    (tmp_path / "a").mkdir()
    path = write(tmp_path, f"dataset: {{roots: [{tmp_path}/a]}}\nrun_dir: {tmp_path}/runs\n")
    with caplog.at_level("WARNING", logger="monarch.config"):
        c = load_config(path, env=env)
    assert c.run_base == f"{tmp_path}/runs" and not hasattr(c, "run_dir")
    assert f"config {path}: run_dir: the older name of run_base; write run_base" in caplog.text
    assert read_user(path) == {"dataset": {"roots": [f"{tmp_path}/a"]}, "run_base": f"{tmp_path}/runs"}


def test_run_base_and_its_older_name_together_are_refused(tmp_path, env):
    (tmp_path / "a").mkdir()
    path = write(tmp_path, f"dataset: {{roots: [{tmp_path}/a]}}\nrun_base: /tmp\nrun_dir: /var/tmp\n")
    with pytest.raises(ConfigError, match="run_dir: the older name of run_base, which is given too; remove run_dir"):
        load_config(path, env=env)


def test_a_store_root_needs_no_directory_and_its_url_is_checked(tmp_path):
    """dataset.stores: a root served from a key-value store need not exist; its URL is parsed (no
    password in it), it must be one of the roots, and validate: open and keep: true are refused."""
    mount = tmp_path / "not" / "there"
    path = tmp_path / "s.yaml"
    path.write_text(f'dataset: {{roots: ["{mount}"], stores: {{"{mount}": "redis://kv:6379/2?prefix=ds/"}}}}\n')
    c = load_config(str(path))
    assert c.dataset.roots == (str(mount),) and c.dataset.store_urls() == {0: "redis://kv:6379/2?prefix=ds/"}
    path.write_text(f'dataset: {{roots: ["{mount}"], stores: {{"{mount}": "redis://u:pw@kv/0"}}}}\n')
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert "may not hold a password" in str(e.value) and "pw@" not in str(e.value) and "u:***@kv" in str(e.value)
    path.write_text(f'dataset: {{roots: ["{tmp_path}"], stores: {{"/elsewhere": "redis://kv"}}}}\n')
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert "/elsewhere is not one of dataset.roots" in str(e.value)
    path.write_text(f'dataset: {{roots: ["{mount}"], stores: {{"{mount}": "redis://kv"}}}}\n'
                    'staging: {validate: open}\ntiers: [{name: ram, path: /dev/shm, capacity: 1GiB, keep: true}]\n')
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert "staging.validate: open compares each file with the PFS" in str(e.value)
    assert "tiers[0].keep: true is not supported with dataset.stores" in str(e.value)
    path.write_text(f'dataset: {{roots: ["{mount}"], stores: {{"{mount}": "redis://kv"}}}}\nstaging: {{policy: off}}\n')
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert "staging.policy: off serves only kept copies" in str(e.value)
