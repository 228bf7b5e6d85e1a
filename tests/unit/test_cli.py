"""The command line, in process: help, version, --dataset, and finding the command before running it."""

import os

import pytest

from monarch import __version__
from monarch.cli import build_parser, find_command, main


@pytest.fixture
def bindir(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    (d / "tool").write_text("#!/bin/sh\nexit 0\n")
    (d / "tool").chmod(0o755)
    (d / "plain").write_text("not a program\n")
    (d / "plain").chmod(0o644)
    (d / "sub").mkdir()
    return d


def test_find_command_on_path(bindir):
    assert find_command("tool", str(bindir)) is None
    assert find_command("nope", str(bindir)) == (127, "command not found")
    assert find_command("plain", str(bindir)) == (126, "Permission denied")  # no x bit: even root may not
    assert find_command("sub", str(bindir)) == (126, "Is a directory")


def test_find_command_takes_a_later_executable_over_an_earlier_plain_file(bindir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "plain").write_text("#!/bin/sh\n")
    (other / "plain").chmod(0o755)
    assert find_command("plain", f"{bindir}{os.pathsep}{other}") is None


def test_find_command_with_a_slash_is_a_path_not_a_search(bindir, monkeypatch):
    assert find_command(f"{bindir}/tool", "") is None
    assert find_command(f"{bindir}/missing", str(bindir)) == (127, "No such file or directory")
    assert find_command(f"{bindir}/plain", str(bindir))[0] == 126
    monkeypatch.chdir(bindir)
    assert find_command("./tool", "") is None
    assert find_command("tool", "") is None  # an empty PATH entry is the current directory


def test_monarch_alone_prints_the_help_and_exits_2(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: monarch")
    for command in ("run", "serve", "stop", "check-config", "report", "demo"):
        assert f"    {command}" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"monarch {__version__}"


def test_run_help_documents_examples_environment_and_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "mpiexec -n 4 monarch run -c cfg.yaml -- python train.py" in out
    assert "monarch run -c cfg.yaml -- torchrun" in out
    assert "--dataset PATH" in out
    for var in ("MONARCH_DATASET", "MONARCH_JOB_ID", "MONARCH_DISABLE", "MONARCH_SHIM_DEBUG",
                "MONARCH_SHIM_TIMEOUT_MS"):
        assert f"\n  {var}" in out
    for rule in ("128+N", "126 if CMD is not executable", "127 if CMD is not found",
                 "2 for a Monarch usage or\n  configuration error", "3 if files CMD wrote under writeback.paths"):
        assert rule in out


def test_run_dataset_is_repeatable_and_the_command_follows_the_double_dash():
    args = build_parser().parse_args(["run", "--dataset", "/a", "--dataset", "/b", "--", "python", "-c", "x"])
    assert args.dataset == ["/a", "/b"]
    assert args.command == ["--", "python", "-c", "x"]


def test_serve_takes_dataset_too():
    # a standing daemon's roots, given as its job's `monarch run --dataset` gives them
    assert build_parser().parse_args(["serve", "--dataset", "/a"]).dataset == ["/a"]


def test_the_embedded_daemon_serves_the_configuration_its_launcher_checked(tmp_path, monkeypatch):
    """``monarch serve --embedded`` reads no file: it serves what ``monarch run`` loaded and
    checked, handed over on its standard input."""
    import io
    from monarch.config import load_config, to_json
    from monarch.launch import service
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"dataset: {{roots: [{tmp_path}]}}\nstaging: {{threads: 3}}\n")
    checked = load_config(str(cfg))
    cfg.write_text("not: [what the launcher checked\n")  # never read again
    seen = []
    monkeypatch.setattr(service, "import_daemon", lambda: None)
    monkeypatch.setattr(service, "serve", lambda config, *a: seen.append(config) or 0)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(to_json(checked).encode())))
    monkeypatch.setenv("MONARCH_RUN_ID", "r1")
    assert main(["serve", "--embedded"]) == 0
    assert seen == [checked]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["serve", "--embedded"]) == 2  # nothing handed over: said, not served
    assert len(seen) == 1


def test_run_passes_the_dataset_roots_to_the_launcher(tmp_path, monkeypatch):
    import monarch.launch.run
    seen = {}
    monkeypatch.setattr(monarch.launch.run, "run",
                        lambda config, *a, **kw: seen.setdefault("roots", config.dataset.roots) and 0)
    cfg = tmp_path / "job.yaml"
    (tmp_path / "file_roots").mkdir()
    cfg.write_text(f"dataset: {{roots: [{tmp_path}/file_roots]}}\n")
    assert main(["run", "-c", str(cfg), "--dataset", str(tmp_path), "--", "true"]) == 0
    assert seen["roots"] == (str(tmp_path),)


def test_run_progress_and_html_options_reach_the_launcher(tmp_path, monkeypatch):
    import monarch.launch.run
    seen = []
    monkeypatch.setattr(monarch.launch.run, "run", lambda config, *a, **kw: seen.append(kw) or 0)
    monkeypatch.delenv("MONARCH_PROGRESS", raising=False)
    assert main(["run", "--dataset", str(tmp_path), "--no-progress", "--report-html", "r.html", "--", "true"]) == 0
    assert main(["run", "--dataset", str(tmp_path), "--", "true"]) == 0
    monkeypatch.setenv("MONARCH_PROGRESS", "0")
    assert main(["run", "--dataset", str(tmp_path), "--", "true"]) == 0
    assert [(kw["progress"], kw["html_path"]) for kw in seen] == [(False, "r.html"), (True, None), (False, None)]


def test_run_missing_dataset_stops_before_the_command(tmp_path, capsys):
    marker = tmp_path / "ran"
    assert main(["run", "--dataset", str(tmp_path / "gone"), "--", "touch", str(marker)]) == 2
    err = capsys.readouterr().err
    assert f"dataset.roots[0] (from --dataset): {tmp_path}/gone does not exist" in err
    assert not marker.exists()


def test_run_command_not_found_is_127_with_one_line_and_no_daemon(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MONARCH_DATASET", str(tmp_path))
    import monarch.launch.run
    monkeypatch.setattr(monarch.launch.run, "run", lambda *a: pytest.fail("the launcher must not start"))
    assert main(["run", "--", "no-such-command-anywhere", "arg"]) == 127
    assert capsys.readouterr().err == "monarch: no-such-command-anywhere: command not found\n"


def test_check_config_lists_every_error(tmp_path, capsys):
    bad = tmp_path / "job.yaml"
    bad.write_text("dataset: {roots: [/pfs/imagnet]}\nstaging: {policy: lru, threads: 0}\n")
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"monarch: error: config {bad}: 3 errors:"
    assert [line.split(": ")[1] for line in err[1:]] == ["dataset.roots[0]", "staging.policy", "staging.threads"]


def test_check_config_shows_validate(tmp_path, capsys):
    good = tmp_path / "job.yaml"
    good.write_text(f"dataset: {{roots: [{tmp_path}]}}\nstaging: {{validate: open}}\n")
    assert main(["check-config", str(good)]) == 0
    assert "validate open" in capsys.readouterr().out


def test_stop_without_a_configuration_needs_no_dataset_roots(tmp_path, capsys, monkeypatch):
    """`monarch stop` alone (no -c, no MONARCH_DATASET) looks for the daemon, not for a dataset."""
    monkeypatch.delenv("MONARCH_DATASET", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the default run_base: no daemon there
    monkeypatch.setenv("MONARCH_JOB_ID", "stop-test")
    assert main(["stop"]) == 2
    err = capsys.readouterr().err
    assert "dataset.roots" not in err
    assert "no Monarch daemon answers at" in err and str(tmp_path) in err


def _run_help(capsys) -> str:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    return capsys.readouterr().out


def test_run_help_and_the_readme_agree_on_what_they_both_state(capsys):
    """`monarch run --help` and README's "Use": the same options, the same MONARCH_* variables, the
    same sources of a run's identity, and no stale claim (a "local" default, copies on first open)."""
    import re
    from pathlib import Path
    from monarch.config import KEYS
    from monarch import topology
    help_text = _run_help(capsys)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    use = readme.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    environment = help_text.split("\nenvironment:\n", 1)[1].split("\n\n", 1)[0]
    variables = lambda text: set(re.findall(r"\bMONARCH_[A-Z_]+\b", text))  # noqa: E731
    # the users' rows (the others are named after them, and in docs/configuration.md's Environment)
    assert variables(environment.split("\n  (others)", 1)[0]) == variables(use)
    options = lambda text: set(re.findall(r"\[(--?[a-z-]+)", text))  # noqa: E731
    readme_usage = next(line for line in use.splitlines() if line.startswith("monarch run ["))
    assert options(help_text.splitlines()[0]) - {"-h"} == options(readme_usage)
    job_id = environment.split("MONARCH_JOB_ID", 1)[1].split("\n  MONARCH_", 1)[0]
    for var in ("SLURM_JOB_ID", "SLURM_STEP_ID", *topology._SCHEDULER_VARS):
        assert var in job_id and var in use, var
    assert '"local"' not in help_text and "on first open" not in help_text
    policy = next(k for k in KEYS if k.path == "staging.policy").default
    assert f"staging.policy {policy}" in " ".join(help_text.split())
    for rule in ("128+N", "126", "127", "2 for", "3 if", "monarch drain"):
        assert rule in help_text and rule in use


@pytest.mark.parametrize("how", ["option", "config"])
def test_report_html_without_matplotlib_stops_before_the_command(tmp_path, capsys, monkeypatch, how):
    """--report-html (or report_html) without matplotlib: exit 2 at the start, the command never runs."""
    import sys
    import monarch.launch.run
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setattr(monarch.launch.run, "run", lambda *a, **kw: pytest.fail("the command must not run"))
    marker = tmp_path / "ran"
    args = ["run", "--dataset", str(tmp_path)]
    if how == "option":
        args += ["--report-html", str(tmp_path / "r.html")]
    else:
        cfg = tmp_path / "job.yaml"
        cfg.write_text(f"report_html: {tmp_path}/r.html\n")
        args += ["-c", str(cfg)]
    assert main([*args, "--", "touch", str(marker)]) == 2
    err = capsys.readouterr().err
    assert "needs matplotlib, which is not installed" in err
    assert ("--report-html" if how == "option" else "report_html") in err
    assert not marker.exists() and not (tmp_path / "r.html").exists()


# -- monarch run waits for its embedded daemon's tear-down -------------------------------------

class _ClosingDaemon:
    """An embedded daemon's process as the launcher sees it: it exits ``close_seconds`` after
    the launcher starts waiting (simulated: ``wait`` never sleeps)."""

    def __init__(self, close_seconds: float):
        self.close_seconds, self.pid, self.returncode, self.waited = close_seconds, 4242, None, []

    def wait(self, timeout=None):
        import subprocess
        self.waited.append(timeout)
        if timeout is not None and timeout < self.close_seconds:
            raise subprocess.TimeoutExpired("monarch serve", timeout)
        self.returncode = 0
        return 0


def _tiers_config(tmp_path):
    from types import SimpleNamespace
    return SimpleNamespace(tiers=[SimpleNamespace(path=str(tmp_path / "shm")), SimpleNamespace(path=str(tmp_path))],
                           peer=SimpleNamespace(path=str(tmp_path)))


def test_the_launcher_waits_for_a_teardown_that_grows_with_the_staged_files(tmp_path):
    import io
    from monarch.launch import service
    out = io.StringIO()
    # removing 1M copies takes up to 12 s: the launcher's wait covers it, growing with the files
    daemon = _ClosingDaemon(close_seconds=12.0)
    assert service.wait_stopped(daemon, _tiers_config(tmp_path), 1_000_000, out=out) is True
    assert daemon.returncode == 0 and out.getvalue() == ""
    assert daemon.waited[0] >= 12.0 + 1_000_000 * 100e-6  # room for a disk tier's slower removal
    # few files: the bound is the base one
    assert service.teardown_bound(0) < service.teardown_bound(1_000_000) < 600


def test_a_launcher_that_gives_up_says_once_what_is_left_and_where(tmp_path):
    import io
    from monarch import layout
    from monarch.launch import service
    config = _tiers_config(tmp_path)
    (tmp_path / "shm").mkdir()
    left = os.path.join(layout.user_dir(str(tmp_path / "shm")), layout.run_name("r1", 0) + "-abc123")
    os.makedirs(left)
    out = io.StringIO()
    daemon = _ClosingDaemon(close_seconds=10_000.0)  # stuck
    assert service.wait_stopped(daemon, config, 100, run="r1", out=out) is False
    said = out.getvalue()
    assert said.count("\n") == 1 and said.startswith("monarch: the node daemon (pid 4242) is still tearing down")
    assert "staged 100 files" in said and left in said
    # not the run's last launcher: the daemon serves the others, nothing to say
    quiet = io.StringIO()
    assert service.wait_stopped(_ClosingDaemon(10_000.0), config, 100, alone=False, run="r1", out=quiet) is False
    assert quiet.getvalue() == ""


def test_monarch_index_says_where_it_cannot_write_before_it_walks(tmp_path, capsys):
    assert main(["index", str(tmp_path), "-o", str(tmp_path / "missing" / "ds.index")]) == 2
    assert f"cannot write in {tmp_path / 'missing'}; give a writable directory" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "nope"), "-o", str(tmp_path / "ds.index")]) == 2
    assert not (tmp_path / "ds.index").exists()
