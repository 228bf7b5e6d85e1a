"""The write-back keys (``writeback.*``) and ``MONARCH_WRITEBACK``: their defaults, what each refuses
and how it says so, the variable replacing the paths, and ``monarch check-config``'s account of them."""

import os
import re
from pathlib import Path

import pytest

from monarch.config import WritebackConfig, load_config
from monarch.config.keys import MAX_WRITEBACK_PATHS
from monarch.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
TIERS = "tiers:\n  - {name: ram, path: /dev/shm, capacity: 1GiB}\n  - {name: ssd, path: /tmp, capacity: 8GiB}\n"


@pytest.fixture
def ds(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    return str(root)


@pytest.fixture
def env(ds):
    return {"MONARCH_DATASET": ds, "USER": "u", "MONARCH_JOB_ID": "j1", "MONARCH_NODE": "0"}


@pytest.fixture
def ckpt(tmp_path):
    """Two checkpoint directories outside the dataset."""
    dirs = [tmp_path / "ckpt" / "a", tmp_path / "ckpt" / "b"]
    for d in dirs:
        d.mkdir(parents=True)
    return [str(d) for d in dirs]


def write(tmp_path, text):
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return str(p)


def problems(path, env, **kw):
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env, **kw)
    return str(e.value)


def test_by_default_there_is_no_write_back_and_the_first_tier_would_hold_it(env):
    c = load_config(None, env=env)
    assert c.writeback == WritebackConfig(paths=(), tier=None, room=0, room_share=0.5, fsync="auto")
    assert not c.writeback.enabled
    assert c.writeback_tier().name == "ram"


def test_every_key_given(tmp_path, env, ckpt):
    path = write(tmp_path, TIERS + f"writeback: {{paths: [{ckpt[0]}, {ckpt[1]}/], tier: ssd, room: 2GiB, fsync: local}}\n")
    c = load_config(path, env=env)
    assert c.writeback == WritebackConfig(paths=tuple(ckpt), tier="ssd", room=2 << 30, room_share=None, fsync="local")
    assert c.writeback.enabled and c.writeback_tier().name == "ssd"
    c = load_config(write(tmp_path, TIERS + f"writeback: {{paths: {ckpt[0]}, room: 12.5%}}\n"), env=env)
    assert (c.writeback.paths, c.writeback.room, c.writeback.room_share) == ((ckpt[0],), 0, 0.125)


def test_an_entry_that_expands_to_nothing_is_left_out(tmp_path, env, ckpt):
    path = write(tmp_path, 'writeback: {paths: ["${CKPT:-}", "${MORE:-}"]}\n')
    assert load_config(path, env=env).writeback.paths == ()
    assert load_config(path, env=dict(env, CKPT=ckpt[0])).writeback.paths == (ckpt[0],)


@pytest.mark.parametrize("text,message", [
    ("writeback: {paths: [{tmp}/gone]}",
     "writeback.paths[0]: {tmp}/gone does not exist; create it before the job starts (mkdir -p {tmp}/gone) or check "
     "the path"),
    ("writeback: {paths: [{tmp}/file]}",
     "writeback.paths[0]: {tmp}/file is not a directory; a write-back path is the directory the job writes its files "
     "under; check the path"),
    ("writeback: {paths: [{ds}/out]}",
     "writeback.paths[0]: {ds}/out overlaps the dataset root {ds}: Monarch's copies of the dataset would go stale "
     "under the job's writes; write back a directory outside the dataset roots"),
    ("writeback: {paths: [{tmp}]}", "writeback.paths[0]: {tmp} overlaps the dataset root {ds}"),
    ("writeback: {paths: [{a}, {a}/]}", "writeback.paths[1]: {a} is writeback.paths[0] again; list each directory once"),
    ("writeback: {paths: [{ckpt}, {a}]}",
     "writeback.paths[1]: {a} is inside writeback.paths[0] ({ckpt}), which covers it already; list only {ckpt}"),
    ("writeback: {paths: [{a}, {ckpt}]}",
     "writeback.paths[1]: {ckpt} holds writeback.paths[0] ({a}), which it covers already; list only {ckpt}"),
    ("writeback: {paths: 5}", "writeback.paths: expected a list of directories, got 5"),
    ("writeback: {paths: ['{a}:{b}']}", "writeback.paths[0]: paths may not contain ':'"),
    ("writeback: {tier: nvme}",
     "writeback.tier: 'nvme' is not a tier of this configuration (ram, ssd); name one of them, or leave it out for "
     "the first"),
    ("writeback: {room: half}", 'writeback.room: expected a size like "64GiB"'),
    ("writeback: {room: 150%}",
     "writeback.room: a share of the write-back tier's capacity must be more than 0% and at most 100%, got '150%'"),
    ("writeback: {room: 0}", "writeback.room: 0 leaves no room, so every file would be written through to the PFS"),
    ("writeback: {fsync: disk}", "writeback.fsync: expected one of auto, pfs, partner, local, got 'disk'"),
    ("writeback: {fsync: no}", "writeback.fsync: expected a string, got False (YAML reads an unquoted"),
    ("writeback: {pathz: []}", "writeback.pathz: unknown key; known keys here: fsync, keep, paths, room, tier"),
])
def test_a_wrong_key_says_where_what_and_how_to_fix_it(tmp_path, env, ds, ckpt, text, message):
    (tmp_path / "file").write_text("")
    os.mkdir(os.path.join(ds, "out"))
    fill = dict(tmp=tmp_path, ds=ds, ckpt=tmp_path / "ckpt", a=ckpt[0], b=ckpt[1])
    for name, value in fill.items():
        text, message = text.replace(f"{{{name}}}", str(value)), message.replace(f"{{{name}}}", str(value))
    path = write(tmp_path, TIERS + text + "\n")
    assert f"config {path}: {message}" in problems(path, env)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_directory_the_user_cannot_write_is_refused(tmp_path, env, ckpt):
    os.chmod(ckpt[0], 0o500)
    try:
        path = write(tmp_path, f"writeback: {{paths: [{ckpt[0]}]}}\n")
        assert (f"writeback.paths[0]: {ckpt[0]} is not writable by you (the job's files are published there); fix its "
                "permissions or choose another directory") in problems(path, env)
    finally:
        os.chmod(ckpt[0], 0o700)


def test_every_wrong_entry_is_said_at_once_and_a_relative_one_says_where_it_was_looked_for(tmp_path, env, ckpt,
                                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, f"writeback: {{paths: [gone, {ckpt[0]}, {tmp_path}/also-gone]}}\n")
    message = problems(path, env)
    assert message.startswith(f"config {path}: 2 errors:\n")
    assert f"writeback.paths[0]: gone (relative, so taken from the current directory as {tmp_path}/gone) does not " \
           "exist" in message
    assert f"writeback.paths[2]: {tmp_path}/also-gone does not exist" in message


def test_at_most_as_many_paths_as_the_shims_table_holds(tmp_path, env):
    header = (REPO / "monarch" / "shim" / "shim_writeback.h").read_text()
    assert int(re.search(r"#define MONARCH_MAX_WB (\d+)", header).group(1)) == MAX_WRITEBACK_PATHS
    dirs = [tmp_path / f"c{i}" for i in range(MAX_WRITEBACK_PATHS + 1)]
    for d in dirs:
        d.mkdir()
    ok = write(tmp_path, f"writeback: {{paths: [{', '.join(map(str, dirs[:-1]))}]}}\n")
    assert len(load_config(ok, env=env).writeback.paths) == MAX_WRITEBACK_PATHS
    path = write(tmp_path, f"writeback: {{paths: [{', '.join(map(str, dirs))}]}}\n")
    assert f"writeback.paths: at most {MAX_WRITEBACK_PATHS} directories, got {MAX_WRITEBACK_PATHS + 1}" \
        in problems(path, env)


def test_paths_not_there_are_not_checked_where_no_job_starts(tmp_path, env):
    """``monarch stop``, ``monarch drain``: the write-back paths may be gone; nothing there needs them."""
    path = write(tmp_path, f"writeback: {{paths: [{tmp_path}/gone]}}\n")
    assert load_config(path, env=env, check_roots=False).writeback.paths == (f"{tmp_path}/gone",)


def test_monarch_writeback_replaces_the_paths_and_its_errors_name_it(tmp_path, env, ckpt):
    path = write(tmp_path, f"writeback: {{paths: [{ckpt[0]}], fsync: local}}\n")
    (tmp_path / "other").mkdir()
    c = load_config(path, env=dict(env, MONARCH_WRITEBACK=f"{ckpt[1]}::{tmp_path}/other"))
    assert c.writeback.paths == (ckpt[1], f"{tmp_path}/other") and c.writeback.fsync == "local"
    assert load_config(path, env=dict(env, MONARCH_WRITEBACK="")).writeback.paths == ()  # set and empty: none
    assert load_config(None, env=dict(env, MONARCH_WRITEBACK=ckpt[0])).writeback.paths == (ckpt[0],)
    message = problems(path, env=dict(env, MONARCH_WRITEBACK=f"{ckpt[0]}:{tmp_path}/gone"))
    assert message == (f"writeback.paths[1] (from MONARCH_WRITEBACK): {tmp_path}/gone does not exist; create it "
                       f"before the job starts (mkdir -p {tmp_path}/gone) or check MONARCH_WRITEBACK")


def test_check_config_shows_the_write_back_and_where_its_paths_came_from(tmp_path, ckpt, monkeypatch, capsys):
    from monarch.cli import main
    (tmp_path / "ds").mkdir()
    monkeypatch.setenv("MONARCH_DATASET", str(tmp_path / "ds"))
    monkeypatch.delenv("MONARCH_WRITEBACK", raising=False)
    path = write(tmp_path, TIERS + f"writeback: {{paths: [{ckpt[0]}], tier: ssd}}\n")

    def shown():
        assert main(["check-config", path]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        keys = {line.split()[0]: line.split(None, 1)[1] for line in out.split("every key (value, from):\n")[1].splitlines()}
        return next(line for line in out.splitlines() if line.startswith("  writeback:")), keys

    line, keys = shown()
    assert line == f"  writeback: {ckpt[0]} via tier ssd /tmp, room 50% of its capacity, fsync auto"
    assert keys["writeback.paths"] == f"{ckpt[0]}  ({path})"
    assert keys["writeback.tier"] == f"ssd  ({path})"
    assert keys["writeback.room"] == "50%  (default)" and keys["writeback.fsync"] == "auto  (default)"
    monkeypatch.setenv("MONARCH_WRITEBACK", ckpt[1])
    line, keys = shown()
    assert line.startswith(f"  writeback: {ckpt[1]} (from MONARCH_WRITEBACK) via tier ssd")
    assert keys["writeback.paths"] == f"{ckpt[1]}  (MONARCH_WRITEBACK)"
    monkeypatch.setenv("MONARCH_WRITEBACK", "")
    line, keys = shown()
    assert line == "  writeback: off (MONARCH_WRITEBACK is empty)"
    assert keys["writeback.paths"] == "[] (no write-back)  (MONARCH_WRITEBACK)"
