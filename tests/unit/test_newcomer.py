"""Issue 35, "What a newcomer meets": what a first user runs into, each held here.

The tier-occupancy timeline against the bytes a tier holds; ``check-config`` on the shipped
files, its exit codes and its sizes; messages that name only files the user gave.
"""

from __future__ import annotations

import os
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
staging: {{policy: on-access, threads: 2, resolve_timeout: 20}}
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
