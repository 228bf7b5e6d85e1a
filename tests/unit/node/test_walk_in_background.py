"""The daemon answers on its socket while its snapshot walk runs in the background: what
needs the snapshot is held (heartbeats) and answered when it is ready; INVALIDATE and HINT
are answered at once and applied before anything is served; a failed walk ends in a
clear state (every open reads the PFS), never a hang."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from monarch.node import daemon as daemon_module
from monarch import protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.snapshot.gate import SnapshotState
from monarch.node.server import NodeServer
from support.harness import NO_RESERVE, unix_connect as connect, make_bases

pytestmark = pytest.mark.timeout(60)

FILES = {f"d/f{i}.bin": os.urandom(1000 + i) for i in range(6)}


@pytest.fixture
def gated(short_tmp, monkeypatch):
    """A served daemon whose walk waits for ``gate`` (or raises ``fail`` once let go)."""
    root = os.path.join(short_tmp, "pfs")
    for rel, data in FILES.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    cfg = os.path.join(short_tmp, "c.yaml")
    with open(cfg, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run"
tiers: [{{name: ram, path: "{short_tmp}/ram", capacity: 1MiB}}]
staging: {{policy: on-access, threads: 2, resolve_timeout: 20, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)
    gate = threading.Event()
    state = {"fail": None}
    real = daemon_module.load_or_walk

    def walk(*args, **kw):
        assert gate.wait(30)
        if state["fail"] is not None:
            raise state["fail"]
        return real(*args, **kw)

    monkeypatch.setattr(daemon_module, "load_or_walk", walk)
    made = []

    def start(fail: Exception | None = None):
        state["fail"] = fail
        d = NodeDaemon(load_config(cfg, env={"USER": "u"}), "r1", background=True)
        server = NodeServer(d, embedded=False)
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        made.append((d, server, thread))
        return d, server
    yield start, gate, root
    gate.set()
    for d, server, thread in made:
        server.request_stop()
        thread.join(10)
        d.close()


def send(path: str, verb: int, body: bytes = b"") -> socket.socket:
    s = connect(path)
    s.sendall(protocol.encode_request(verb, body))
    return s


def answer(s: socket.socket) -> tuple[int, bytes, int]:
    """(status, body, heartbeats before it)."""
    beats = 0
    with s:
        while True:
            status, length = protocol.ANSWER_HEADER.unpack(protocol.recv_exact(s, 8))
            body = protocol.recv_exact(s, length) if length else b""
            if status != protocol.STATUS_PENDING:
                return status, body, beats
            beats += 1


def ask(path: str, verb: int, body: bytes = b"") -> tuple[int, bytes]:
    return answer(send(path, verb, body))[:2]


def test_attach_and_progress_are_answered_during_the_walk_the_rest_when_it_is_ready(gated):
    start, gate, root = gated
    d, server = start()
    assert d.gate.state is SnapshotState.WALKING
    t0, wall0 = time.monotonic(), time.time()
    with connect(d.socket_path) as session:
        session.sendall(protocol.encode_request(protocol.VERB_ATTACH))
        status, body = protocol.recv_answer(session)
        assert status == 0 and json.loads(body)["env"][protocol.ENV_INDEX] == d.index_path
        session.sendall(protocol.encode_request(protocol.VERB_REPORT, protocol.REPORT_BRIEF))
        status, body = protocol.recv_answer(session)
        brief = json.loads(body)
        assert brief["snapshot"] == "walking" and brief["dataset"]["files"] == 0
        assert brief["snapshot_ready_at"] is None
        assert time.monotonic() - t0 < 5  # neither waited for the walk (it is held until the gate opens)
        assert not os.path.exists(d.index_path)

        index = send(d.socket_path, protocol.VERB_INDEX)
        opening = send(d.socket_path, protocol.VERB_OPEN, b"0/d/f1.bin")
        # written to during the walk: answered at once, and never served from a copy
        assert ask(d.socket_path, protocol.VERB_INVALIDATE, b"0/d/f2.bin") == (0, b"")
        hint = protocol.encode_hints(protocol.HINT_ORDER, 7, [b"0/d/f3.bin"])[0]
        with connect(d.socket_path) as h:
            h.sendall(hint)
            assert protocol.recv_answer(h) == (0, b"")
        session.sendall(protocol.encode_request(protocol.VERB_REPORT, protocol.REPORT_FINAL))
        time.sleep(0.8)  # held: heartbeats meanwhile
        assert d.gate.state is SnapshotState.WALKING
        gate.set()

        status, _, beats = answer(index)
        assert status == protocol.INDEX_READY and beats >= 2
        assert os.path.exists(d.index_path)  # written before the answer
        status, path, beats = answer(opening)
        assert status == protocol.tier_slot(0) and beats >= 2
        assert open(path, "rb").read() == FILES["d/f1.bin"]
        status, body = protocol.recv_answer(session)
        report = json.loads(body)
    assert report["dataset"]["files"] == len(FILES) and report["snapshot"].startswith("walked")
    assert report["snapshot_ready_at"] >= wall0 + 0.8  # after the requests that waited for it
    assert report["requests_held_for_snapshot"] == {"INDEX": 1, "OPEN": 1, "REPORT": 1}
    assert ask(d.socket_path, protocol.VERB_OPEN, b"0/d/f2.bin") == (protocol.SLOT_PFS, b"")
    assert d.outcomes["invalidated"] == 1
    deadline = time.monotonic() + 10  # the hint, applied once the snapshot was ready: f3 is staged
    while d.stager.where("0/d/f3.bin") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert d.stager.where("0/d/f3.bin") is not None
    assert ask(d.socket_path, protocol.VERB_INDEX) == (protocol.INDEX_READY, b"")  # at once, now


def test_a_failed_walk_answers_everything_with_the_pfs(gated):
    start, gate, root = gated
    d, server = start(fail=OSError(5, "Input/output error"))
    index = send(d.socket_path, protocol.VERB_INDEX)
    opening = send(d.socket_path, protocol.VERB_OPEN, b"0/d/f1.bin")
    gate.set()
    assert answer(index)[0] == protocol.INDEX_NONE
    assert answer(opening)[:2] == (protocol.SLOT_PFS, b"")
    assert ask(d.socket_path, protocol.VERB_OPEN, b"0/d/f2.bin") == (protocol.SLOT_PFS, b"")
    assert ask(d.socket_path, protocol.VERB_INVALIDATE, b"0/d/f2.bin") == (0, b"")
    assert d.gate.state is SnapshotState.FAILED and not os.path.exists(d.index_path)
    status, body = ask(d.socket_path, protocol.VERB_REPORT)
    report = json.loads(body)
    assert report["snapshot"].startswith("failed") and "Input/output error" in report["snapshot"]
    assert report["resolves"]["pfs:no_snapshot"] == 2 and report["staging"]["files"] == 0


def test_a_failed_index_write_is_a_failed_snapshot(gated):
    start, gate, root = gated
    d, server = start()
    os.mkdir(d.index_path)  # the index cannot be written there
    with open(os.path.join(d.index_path, "x"), "w"):
        pass
    gate.set()
    assert d.gate.wait_settled(20)
    assert d.gate.state is SnapshotState.FAILED
    assert ask(d.socket_path, protocol.VERB_INDEX) == (protocol.INDEX_NONE, b"")
    assert ask(d.socket_path, protocol.VERB_OPEN, b"0/d/f1.bin") == (protocol.SLOT_PFS, b"")


def test_an_open_held_too_long_reads_the_pfs(gated):
    start, gate, root = gated
    d, server = start()
    object.__setattr__(d.config.staging, "resolve_timeout", 0.6)  # frozen: set for this test only
    t0 = time.monotonic()
    assert ask(d.socket_path, protocol.VERB_OPEN, b"0/d/f1.bin") == (protocol.SLOT_PFS, b"")
    assert 0.5 < time.monotonic() - t0 < 5
    assert d.outcomes["pfs:snapshot_not_ready"] == 1
    gate.set()


def test_stopping_during_the_walk_does_not_wait_for_it(gated):
    start, gate, root = gated
    d, server = start()
    t0 = time.monotonic()
    assert ask(d.socket_path, protocol.VERB_STOP) == (0, b"")
    d.close()
    gate.set()  # the walk ends after close: nothing of it is used
    assert d.gate.wait_settled(20)
    assert time.monotonic() - t0 < 20 and not os.path.exists(d.index_path)
