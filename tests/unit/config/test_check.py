"""``monarch check-config`` (monarch/config/check.py): it passes every shipped file, takes the
dataset as ``monarch run`` does, documents what it checks, and prints sizes for people."""

from __future__ import annotations

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


# -- check-config passes the shipped files, takes --dataset, documents itself, prints sizes --------

SHIPPED = sorted(os.path.join(REPO, "configs", n) for n in os.listdir(os.path.join(REPO, "configs"))
                 if n.endswith((".yaml", ".yml")))


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_check_config_passes_every_shipped_file(path, no_dataset_variable, capsys):
    from monarch.cli import main
    assert main(["check-config", path]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: OK\n")
    assert " bytes" not in out.split("every key")[0]  # capacities as written: "capacity 4GiB"
    assert "  tier    : ram /dev/shm capacity " in out and "MONARCH_DATASET" in out.splitlines()[1]


def test_check_config_takes_the_dataset_as_monarch_run_does(tmp_path, no_dataset_variable, capsys):
    from monarch.cli import main
    ds = tmp_path / "ds"
    ds.mkdir()
    local = os.path.join(REPO, "configs", "local.yaml")
    assert main(["check-config", local, "--dataset", str(ds)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == f"  roots   : {ds}"
    assert "  tier    : ram /dev/shm capacity 4GiB" in out and "  tier    : ssd " in out
    assert main(["check-config", "--dataset", str(ds)]) == 0  # no file: the shipped defaults, said so
    assert "(the shipped defaults): OK" in capsys.readouterr().out.splitlines()[0]
    assert main(["check-config", local, "--dataset", str(tmp_path / "gone")]) == 2
    assert f"{tmp_path}/gone does not exist" in capsys.readouterr().err


def test_check_config_help_says_what_it_checks_and_its_exit_status(capsys):
    from monarch.cli import main
    with pytest.raises(SystemExit):
        main(["check-config", "--help"])
    out = capsys.readouterr().out
    assert "--dataset PATH" in out and "CONFIG" in out and "exit status" in out and "MONARCH_DATASET" in out


def test_the_readme_use_shows_check_config_with_the_dataset_as_its_help_does(capsys):
    """README's Use: the usage line is the command's own, and the example checks the shipped file
    with a dataset (afcb5ea: `monarch check-config CONFIG`, no --dataset)."""
    import re
    from monarch.cli import main
    readme = open(os.path.join(REPO, "README.md")).read()
    use = readme.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    usage = next(line for line in use.splitlines() if line.startswith("monarch check-config "))
    with pytest.raises(SystemExit):
        main(["check-config", "--help"])
    shown = capsys.readouterr().out.split("\n", 1)[0]
    words = lambda text: re.findall(r"\[?(--?[a-z-]+|[A-Z]+)", text)  # noqa: E731
    assert [w for w in words(shown.split("check-config", 1)[1]) if w != "-h"] == words(usage.split("#")[0].split("check-config", 1)[1])
    assert "--dataset PATH" in usage
    assert "monarch check-config configs/local.yaml --dataset /" in " ".join(use.split())


def test_sizes_for_people():
    from monarch.config.check import size_for_people
    assert [size_for_people(n) for n in (4 << 30, 1000, 1_000_000)] == ["4GiB", "1000 B", "976.6 KiB (1000000 bytes)"]
