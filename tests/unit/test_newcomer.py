"""Issue 35, "What a newcomer meets": what a first user runs into, each held here.

The tier-occupancy timeline against the bytes a tier holds; ``check-config`` on the shipped
files, its exit codes and its sizes; messages that name only files the user gave.
"""

from __future__ import annotations

import os
import signal
import shlex
import subprocess
import sys
import threading

import pytest

from monarch import frontdoor, protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.server import NodeServer
from support.harness import unix_connect as connect, make_bases

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- 1. the timeline's used.<tier> is bytes in the tier, not room lent to the front door -----------

@pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")
def test_the_timeline_counts_bytes_in_the_tier_not_room_lent_to_the_front_door(short_tmp):
    from monarch.layout import MARKER
    root = f"/dev/shm{short_tmp}/pfs" if os.path.isdir("/dev/shm") else os.path.join(short_tmp, "pfs")
    os.makedirs(root)
    sizes = {}
    for i in range(40):
        with open(os.path.join(root, f"f{i:03d}.bin"), "wb") as f:
            f.write(os.urandom(3000 + i))
        sizes[f"0/f{i:03d}.bin"] = 3000 + i
    cfg = os.path.join(short_tmp, "c.yaml")
    with open(cfg, "w") as f:  # 1 GiB: the door is lent 16 MiB (LEASE_MAX) at a time
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run"
tiers: [{{name: ram, path: "{short_tmp}/ram", capacity: 1GiB}}]
staging: {{policy: on-access, threads: 2, resolve_timeout: 20, share: false}}
""")
    make_bases(cfg)
    daemon = NodeDaemon(load_config(cfg, env={"USER": "u"}), "r0")
    server = NodeServer(daemon, embedded=False)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        tier = daemon.tiers[0]

        def in_tier() -> int:
            total = 0
            for dirpath, dirnames, names in os.walk(tier.path):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                total += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names
                             if n != MARKER and not n.startswith("."))
            return total

        samples = []
        for key in sizes:
            with connect(daemon.socket_path) as s:
                s.sendall(protocol.encode_request(protocol.VERB_OPEN, key.encode()))
                while protocol.recv_answer(s)[0] == protocol.STATUS_PENDING:
                    pass
            daemon.absorb_front_door()  # the door's copies in the books, as a report takes them
            daemon._sampler.sample()  # a point of the timeline, as the daemon's sampler takes it
            samples.append((in_tier(), tier.describe()["used"]))
        series = daemon.timeline.to_dict()["series"]["used.ram"]
        assert [u for _, u in samples] == [b for b, _ in samples]  # the tier's used: its copies' bytes
        assert series[-len(samples):] == [b for b, _ in samples]  # every point of the plot, too
        assert series[-1] == sum(sizes.values())
        report_used = next(t for t in daemon.stats()["tiers"] if t["name"] == "ram")["used"]
        assert report_used == series[-1]
    finally:
        server.request_stop()
        thread.join(10)
        daemon.close()


# -- 3. every command behaves in a pipe: `monarch report ... | head -1` -------------------------------

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


# -- 2. check-config passes the shipped files, takes --dataset, documents itself, prints sizes --------

SHIPPED = sorted(os.path.join(REPO, "configs", n) for n in os.listdir(os.path.join(REPO, "configs"))
                 if n.endswith((".yaml", ".yml")))


@pytest.fixture
def no_dataset_variable(monkeypatch):
    monkeypatch.delenv("MONARCH_DATASET", raising=False)


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


# -- 4. every configuration error exits 2 ---------------------------------------------------------

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
                                     ["plan", "-c", "{cfg}"], ["serve", "-c", "{cfg}"], ["stop", "-c", "{cfg}"]],
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


# -- 5. a message names only a file the user gave, or says it is the shipped default ------------

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


# -- 6. the words a newcomer reads ----------------------------------------------------------------

MiB = 1 << 20


def _report(**extra):
    from monarch.report.build import build_report
    command = extra.pop("command", ["true"])
    n = {"node": 0, "host": "h0", "opened_from": {"pfs": {"opens": 1, "bytes": MiB}, "ram": {"opens": 3, "bytes": 3 * MiB}},
         "staging": {"files": 1, "bytes": MiB, "pfs_files_read": 1, "pfs_bytes_read": MiB, "failures": {}},
         "dataset": {"files": 1, "bytes": MiB}, "peer": {}, "resolves": {}, "tiers": []} | extra
    return build_report([n], {"job_id": "j", "config": "c.yaml", "command": command,
                              "exit_code": 0, "wall_seconds": 1.0})


def _text(report) -> str:
    import io
    from monarch.report.text import print_report
    out = io.StringIO()
    print_report(report, out)
    return out.getvalue()


def test_one_is_singular():
    t = _text(_report(metadata={"local": 1, "pfs": 0}))
    assert "metadata  : 1 call answered from the snapshot" in t
    assert "dataset   : 1 file, 1.0 MiB" in t and "staged    : 1 file, 1.0 MiB" in t


TIERS = [{"name": "ram", "capacity": 4 * MiB, "used": MiB, "files": 1, "full": None, "refused": {}, "stopped": None},
         {"name": "ssd", "capacity": 8 * MiB, "used": 0, "files": 0, "full": None, "refused": {}, "stopped": None},
         {"name": "nvme", "capacity": MiB, "used": MiB, "files": 1, "full": None, "refused": {"full": 2},
          "stopped": "full"}]


def test_a_tier_offered_no_file_says_so_in_the_text_and_the_html_alike():
    from monarch.report import html
    from monarch.report.text import OFFERED_NONE
    r = _report(tiers=TIERS)
    rows = {line.split()[0]: line for line in _text(r).splitlines() if line.split()[:1] in (["ram"], ["ssd"], ["nvme"])}
    assert rows["ssd"].endswith(OFFERED_NONE) and "took every file" not in rows["ssd"]
    assert rows["ram"].endswith("took every file offered")
    page = "".join(html._tiers(r, None, None))
    for name, words in (("ram", "took every file offered"), ("ssd", OFFERED_NONE)):  # the same words in both
        assert words in rows[name] and html.html.escape(words) in page, (name, page)
    assert "full (its capacity is reached)" in rows["nvme"] and "full (capacity)" in page
    assert "taking files" not in page


def test_the_html_summary_labels_its_estimate_note_as_it_labels_the_figures():
    from monarch.report import html
    r = _report(opened_from={"pfs": {"opens": 0, "bytes": 0, "opens_uncounted": 0},
                             "ram": {"opens": 40, "bytes": 17 * MiB, "opens_uncounted": 0}})
    page = "".join(html._summary(r, r["job"], r["dataset"], r["pfs"]))
    assert f"PFS without Monarch ({html.ESTIMATE})" in page
    assert f'<p class="note">{html.ESTIMATE}: as if every byte the command read had been read from the PFS' in page


def test_a_script_in_the_command_reads_as_written_and_as_a_shell_takes_it():
    script = "for f in *; do\n  echo \"it's $f\"\ndone"
    command = ["sh", "-c", script]
    t = _text(_report(command=command))
    assert "'\"'\"'" not in t
    assert 'command   : sh -c "for f in *; do\n              echo \\"it\'s \\$f\\"\n            done"  (exit 0' in t
    from monarch.report.text import command_text
    said = subprocess.run(["bash", "-c", "printf '%s\\0' " + command_text(command)], capture_output=True,
                          text=True, timeout=30).stdout
    assert said.split("\0")[:-1] == command
    from monarch.report import html
    r = _report(command=command)
    assert html.html.escape(command_text(command)) in "".join(html._summary(r, r["job"], r["dataset"], r["pfs"]))


def test_plan_says_a_replicated_loss_moves_nothing_and_what_its_seconds_are():
    from monarch import plan
    stores = [plan.Store("ram", 100 * MiB)]
    replicated = plan.format_plan(plan.make_plan(plan.synthetic(100, 100_000), 4, stores))
    assert "layout  : replicate" in replicated
    place = next(line for line in replicated.splitlines() if line.startswith("place"))
    assert "re-owns" not in place and "losing a node moves nothing" in place
    assert "s to place" not in place and "computing this placement took" in place
    sharded = plan.format_plan(plan.make_plan(plan.synthetic(100, 100_000), 4, stores, shard=True))
    place = next(line for line in sharded.splitlines() if line.startswith("place"))
    assert "(the largest share) is lost" in place and "s to place" not in place


def test_the_demo_numbers_epochs_as_its_workload_prints_them():
    from monarch.tools.demo import summary
    runs = [{"epoch": e, "seconds": 1.0 + e, "samples": 10, "bytes": 100, "mismatches": []} for e in range(3)]
    table = summary(runs, runs, 10).split("epoch       direct   monarch  speed-up\n")[1].splitlines()
    assert [line.split()[0] for line in table[:3]] == ["0", "1", "2"]


def test_the_glibc_skip_says_why_the_front_door_is_not_checked():
    text = open(os.path.join(REPO, "tests", "shim", "test_glibc_compat.py")).read()
    assert "the front door imports what it calls)" not in text
    assert "applies to the shim only: the front door is not an interposer" in text


def test_the_demo_says_in_one_line_when_fuse_cannot_give_it_a_slow_pfs(tmp_path, monkeypatch, capsys):
    """No FUSE here (no /dev/fuse, no mfusepy): one line saying so and why; the demo goes on on the disk."""
    from contextlib import ExitStack
    from monarch.tools import demo, slowpfs
    monkeypatch.setattr(slowpfs, "fuse_unavailable_reason", lambda probe=False: "no /dev/fuse on this machine")
    with ExitStack() as stack:
        assert demo._mount(stack, str(tmp_path), str(tmp_path), 4.0) is None
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("demo: no emulated slow PFS here") and line.endswith("no /dev/fuse on this machine)")


def test_the_demo_prints_the_pfs_traffic_the_emulated_pfs_counted_beside_the_speed_up():
    from monarch.tools.demo import summary
    direct = [{"epoch": e, "seconds": 2.0, "samples": 10, "bytes": 100, "mismatches": []} for e in range(2)]
    under = [{"epoch": e, "seconds": 1.0 if e else 0.5, "samples": 10, "bytes": 100, "mismatches": []} for e in range(2)]
    text = summary(direct, under, 10, (200, 100, 100), 4.0)
    assert "0           2.00 s    0.50 s      4.0x" in text and "1           2.00 s    1.00 s      2.0x" in text
    assert text.endswith("PFS read, as the emulated PFS counted it (4 ms per open): directly 200 B = 2.00x the "
                         "dataset; under Monarch 100 B = 1.00x the dataset")
