"""How the command line fails: a configuration error exits 2 from every command that reads one,
a message names only a file the user gave (or says it is the shipped default), and a reader
that stops early (``| head -1``) is not an error."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- every command behaves in a pipe: `monarch report ... | head -1` -------------------------------

def _a_long_report(path: str) -> None:
    """A report whose text and JSON are each far more than a pipe holds (64 KiB)."""
    from monarch.report.build import build_report
    from monarch.report.store import write_report
    nodes = []
    for i in range(300):
        n = {"node": i, "host": f"h{i}", "opened_from": {"pfs": {"opens": 5, "bytes": 5 << 20},
                                                       "ram": {"opens": 30, "bytes": 30 << 20}},
             "staging": {"files": 10, "bytes": 10 << 20, "pfs_files_read": 10, "pfs_bytes_read": 10 << 20,
                         "failures": {}},
             "dataset": {"files": 10, "bytes": 10 << 20}, "peer": {}, "resolves": {"staged": 10}, "tiers": [],
             "timeline": {"start": 0.0, "interval": 1.0, "t": [float(t) for t in range(1, 101)],
                          "series": {"bytes.ram": [1 << 20] * 100, "used.ram": [t << 20 for t in range(100)]}}}
        nodes.append(n)
    write_report(build_report(nodes, {"job_id": "j", "config": "c.yaml", "command": ["python", "train.py"],
                                      "exit_code": 0, "wall_seconds": 100.0}), path)


@pytest.mark.parametrize("form", [[], ["--json"]], ids=["text", "json"])
def test_monarch_report_into_head_says_nothing_and_exits_0(tmp_path, form):
    report = str(tmp_path / "r.json")
    _a_long_report(report)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "monarch", "report", *form, report])
    for _ in range(20):  # the reader may close before, during or after the output: every time
        p = subprocess.run(["bash", "-o", "pipefail", "-c", f"{args} | head -1"], env=env, capture_output=True,
                           text=True, timeout=60)
        assert (p.returncode, p.stderr) == (0, ""), p.stderr
        assert p.stdout.count("\n") == 1


@pytest.mark.parametrize("command", [["run", "--help"]], ids=["help"])
def test_other_commands_into_a_reader_that_stops_say_nothing(command):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "monarch", *command])
    for _ in range(5):
        p = subprocess.run(["bash", "-o", "pipefail", "-c", f"{args} | true"], env=env, capture_output=True,
                           text=True, timeout=60)
        assert (p.returncode, p.stderr) == (0, ""), p.stderr


# -- every configuration error exits 2 ---------------------------------------------------------

CONFIG_ERRORS = {
    "typo": "tierz: []\n",
    "missing tier base": "tiers: [{name: ram, path: /nonexistent-nc35/shm, capacity: 1GiB}]\n",
    "bad size": "tiers: [{name: ram, path: /dev/shm, capacity: 64 G}]\n",
    "bad choice": "staging: {policy: lru}\n",
    "not YAML": "tiers: [\n",
    "missing root": "dataset: {roots: [/nonexistent-nc35/imagenet]}\n",
}


@pytest.mark.parametrize("problem", sorted(CONFIG_ERRORS))
def test_every_configuration_error_of_check_config_exits_2(tmp_path, problem, capsys):
    from monarch.cli import main
    ds = tmp_path / "ds"
    ds.mkdir()
    text = CONFIG_ERRORS[problem]
    if "dataset:" not in text:
        text = f"dataset: {{roots: [{ds}]}}\n" + text
    cfg = tmp_path / "job.yaml"
    cfg.write_text(text)
    assert main(["check-config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"monarch: error: config {cfg}") and "OK" not in err


@pytest.mark.parametrize("args", [["check-config", "/nonexistent-nc35.yaml"], ["run", "-c", "/nonexistent-nc35.yaml",
                                  "--", "true"], ["run", "--dataset", "/nonexistent-nc35", "--", "true"],
                                  ["check-config", "--dataset", "/nonexistent-nc35"]], ids=" ".join)
def test_configuration_errors_of_the_command_line_exit_2(args, monkeypatch, capsys):
    from monarch.cli import main
    import monarch.launch.run
    monkeypatch.setattr(monarch.launch.run, "run", lambda *a, **kw: pytest.fail("the command ran"))
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("monarch: error: ")


@pytest.fixture
def stop_signals_kept():
    """``main(["serve", ...])`` takes SIGTERM and SIGINT for the daemon (catch_stop_signals) in
    pytest's own process: given back after, or a later test's multiprocessing pool cannot stop
    its workers with SIGTERM (test_workload's hung at its pool's end)."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("command", [["run", "-c", "{cfg}", "--", "true"], ["check-config", "{cfg}"],
                                     ["plan", "-c", "{cfg}"], ["serve", "-c", "{cfg}"], ["stop", "-c", "{cfg}"],
                                     ["drain", "-c", "{cfg}"]],
                         ids=lambda c: c[0])
def test_a_configuration_error_exits_2_from_every_command_that_reads_one(tmp_path, command, monkeypatch, capsys,
                                                                         stop_signals_kept):
    from monarch.cli import main
    import monarch.launch.run
    monkeypatch.setattr(monarch.launch.run, "run", lambda *a, **kw: pytest.fail("the command ran"))
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"dataset: {{roots: [{tmp_path}]}}\ntierz: []\n")
    assert main([a.format(cfg=cfg) for a in command]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"monarch: error: config {cfg}") and "tierz: unknown key" in err


# -- a message names only a file the user gave, or says it is the shipped default ------------

@pytest.mark.parametrize("args", [["run", "--dataset", "/nonexistent-nc35", "--", "true"], ["run", "--", "true"],
                                  ["check-config", "--dataset", "/nonexistent-nc35"],
                                  ["plan", "--dataset", "/nonexistent-nc35"]], ids=" ".join)
def test_errors_name_no_file_the_user_did_not_give(args, no_dataset_variable, monkeypatch, capsys):
    from monarch.cli import main
    from monarch.config import DEFAULTS_FILE
    import monarch.launch.run
    monkeypatch.setattr(monarch.launch.run, "run", lambda *a, **kw: pytest.fail("the command ran"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("monarch: error: ")
    for line in err.splitlines():
        if DEFAULTS_FILE.name in line or "site-packages" in line:
            assert f"{DEFAULTS_FILE} (the shipped defaults)" in line, line
    if "--dataset" in args:
        assert "dataset.roots[0] (from --dataset): /nonexistent-nc35 does not exist" in err
        assert DEFAULTS_FILE.name not in err
