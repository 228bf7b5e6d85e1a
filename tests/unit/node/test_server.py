"""The daemon's socket on its event loop, spoken to as the shim, a launcher, and hostile clients."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from monarch import protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.server import NodeServer
from support.harness import NO_RESERVE, unix_connect as connect, make_bases


@pytest.fixture(params=["front-door", "python-only"])
def served(short_tmp, request, monkeypatch):
    """A daemon on its socket, with the C front door (which hands over what it does not
    answer) and without it (MONARCH_FRONT_DOOR=0): every test here holds for both."""
    if request.param == "python-only":
        monkeypatch.setenv("MONARCH_FRONT_DOOR", "0")
    root = os.path.join(short_tmp, "pfs")
    os.makedirs(os.path.join(root, "d"))
    names = ["a.bin", "new\nline.bin", "\udcff\udcfe-latin1.bin", "n" * 255]
    for i, name in enumerate(names):
        with open(os.path.join(root, "d", name), "wb") as f:
            f.write(os.urandom(1000 + i))
    cfg = os.path.join(short_tmp, "c.yaml")
    with open(cfg, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run"
tiers: [{{name: ram, path: "{short_tmp}/ram", capacity: 1MiB}}]
staging: {{policy: on-access, threads: 2, resolve_timeout: 5, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)
    daemon = NodeDaemon(load_config(cfg, env={"USER": "u"}), "r1")
    server = NodeServer(daemon, embedded=False)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield daemon, server, root, names
    server.request_stop()
    thread.join(10)
    daemon.close()


def ask(path: str, verb: int, body: bytes = b"") -> tuple[int, bytes]:
    with connect(path) as s:
        s.sendall(protocol.encode_request(verb, body))
        return protocol.recv_answer(s)


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_any_name_the_filesystem_allows_is_staged_and_named_exactly(served):
    daemon, _, root, names = served
    for name in names:
        key = os.fsencode(f"0/d/{name}")
        status, body = ask(daemon.socket_path, protocol.VERB_OPEN, key)
        assert status == protocol.tier_slot(0)
        assert body == os.fsencode(daemon.tiers[0].path) + b"/" + key
        assert open(body, "rb").read() == open(os.path.join(root, "d", name), "rb").read()


def test_unknown_files_read_the_pfs(served):
    daemon, *_ = served
    assert ask(daemon.socket_path, protocol.VERB_OPEN, b"0/d/none") == (protocol.SLOT_PFS, b"")


@pytest.mark.parametrize("body", [b"", b"0/", b"/etc/passwd", b"0/../../etc/passwd", b"0/d/../a.bin",
                                  b"0/d/a.bin\0x", b"x/d/a.bin", b"0//d/a.bin"])
def test_keys_that_could_leave_a_root_are_refused_and_counted(served, body):
    daemon, server, *_ = served
    status, reason = ask(daemon.socket_path, protocol.VERB_OPEN, body)
    assert status == protocol.STATUS_ERROR and reason
    assert server.errors["bad_key"] == 1


@pytest.mark.parametrize("raw", [b"\xff" * 8, b"OPEN 0/d/a.bin\n", protocol.REQUEST_HEADER.pack(1, 0, 0, 1 << 20),
                                 b"\0" * 8])
def test_malformed_frames_get_an_error_and_the_daemon_goes_on(served, raw):
    daemon, server, *_ = served
    with connect(daemon.socket_path) as s:
        s.sendall(raw)
        status, length = protocol.ANSWER_HEADER.unpack(read_all(s)[:8])
    assert status == protocol.STATUS_ERROR and server.errors["malformed"] == 1
    assert ask(daemon.socket_path, protocol.VERB_OPEN, b"0/d/a.bin")[0] == protocol.tier_slot(0)


def test_a_megabyte_of_garbage_is_cut_off(served):
    daemon, server, *_ = served
    with connect(daemon.socket_path) as s:
        try:
            s.sendall(protocol.REQUEST_HEADER.pack(1, 0, 0, protocol.MAX_REQUEST + 1) + os.urandom(1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us mid-send: just as good
    assert server.errors["malformed"] == 1


def test_idle_clients_do_not_starve_the_daemon_and_are_closed(served, monkeypatch):
    daemon, server, *_ = served
    idle = [connect(daemon.socket_path) for _ in range(100)]
    for s in idle[:50]:
        s.sendall(protocol.REQUEST_HEADER.pack(1, 0, 0, 20))  # a header, then nothing
    t0 = time.monotonic()
    for name in ("a.bin", "n" * 255):
        assert ask(daemon.socket_path, protocol.VERB_OPEN, f"0/d/{name}".encode())[0] == protocol.tier_slot(0)
    assert time.monotonic() - t0 < 2.0
    idle[0].settimeout(15)
    assert read_all(idle[0]) == b""  # closed by the daemon after REQUEST_TIMEOUT
    deadline = time.monotonic() + 5
    while server.errors["request_timeout"] < 100 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.errors["request_timeout"] == 100
    for s in idle:
        s.close()


def test_a_waiting_client_gets_heartbeats_until_its_answer(served, monkeypatch):
    daemon, server, *_ = served
    if server.front_door is not None:  # it would copy the file in C, past the slow reader below
        monkeypatch.setattr(daemon.door_link, "may_copy", False)
        with daemon.door_link.stager.lock:  # a drain under way tells the door under this lock what it read before
            daemon.door_link.front_door.copying(False)
    real = daemon.stager.copier.read_pfs

    def slow(key, out):
        time.sleep(1.0)
        return real(key, out)

    monkeypatch.setattr(daemon.stager.copier, "read_pfs", slow)
    with connect(daemon.socket_path) as s:
        s.sendall(protocol.encode_request(protocol.VERB_OPEN, b"0/d/a.bin"))
        frames = []
        while True:
            status, length = protocol.ANSWER_HEADER.unpack(protocol.recv_exact(s, 8))
            frames.append(status)
            if status != protocol.STATUS_PENDING:
                protocol.recv_exact(s, length)
                break
    assert frames[-1] == protocol.tier_slot(0) and frames.count(protocol.STATUS_PENDING) >= 2


def test_a_last_report_is_made_beside_the_loop_which_answers_meanwhile(served, monkeypatch):
    """A last full REPORT (over an index of millions of files: seconds) is made on a request
    thread: the loop answers others and takes the front door's copies into the books meanwhile
    (made on the loop, the door's news piled up in it: 17 MB at 2 million files). Here the report
    waits until another client's progress poll (a brief REPORT, the loop's) has been answered: made
    on the loop, it never would be."""
    daemon, *_ = served
    answered, real = threading.Event(), daemon.stats

    def held(brief: bool = False):
        if not brief:
            answered.wait(30)
        return real(brief=brief)

    monkeypatch.setattr(daemon, "stats", held)
    report: list = []
    asker = threading.Thread(target=lambda: report.append(ask(daemon.socket_path, protocol.VERB_REPORT)))
    asker.start()
    try:
        time.sleep(0.2)  # the report asked first (its order does not matter to what is checked)
        with connect(daemon.socket_path) as s:
            s.settimeout(10)
            s.sendall(protocol.encode_request(protocol.VERB_REPORT, protocol.REPORT_BRIEF))
            assert protocol.recv_answer(s)[0] == 0
    finally:
        answered.set()
        asker.join(30)
    status, body = report[0]
    assert status == 0 and json.loads(body)["dataset"]["files"] == 4


def test_invalidate_drops_the_copy_before_answering(served):
    daemon, _, root, _ = served
    status, path = ask(daemon.socket_path, protocol.VERB_OPEN, b"0/d/a.bin")
    assert os.path.exists(path)
    assert ask(daemon.socket_path, protocol.VERB_INVALIDATE, b"0/d") == (0, b"")
    assert not os.path.exists(path)
    assert ask(daemon.socket_path, protocol.VERB_OPEN, b"0/d/a.bin") == (protocol.SLOT_PFS, b"")


def test_a_session_gets_only_monarch_keys_and_its_reports(served):
    daemon, *_ = served
    with connect(daemon.socket_path) as s:
        s.sendall(protocol.encode_request(protocol.VERB_ATTACH))
        status, body = protocol.recv_answer(s)
        attached = json.loads(body)
        assert status == 0 and set(protocol.CLIENT_ENV_KEYS) - set(attached["env"]) == {protocol.ENV_ASK_FIRST,
                                                                                         protocol.ENV_STORE_ROOTS,
                                                                                         protocol.ENV_SHARED_SLOTS,
                                                                                         protocol.ENV_WRITEBACK,
                                                                                         protocol.ENV_WRITEBACK_MARKS,
                                                                                         protocol.ENV_WRITEBACK_SOCKET}
        assert attached["run"]["roots"] == list(daemon.config.dataset.roots)
        for _ in range(2):
            s.sendall(protocol.encode_request(protocol.VERB_REPORT))
            status, body = protocol.recv_answer(s)
            assert status == 0 and json.loads(body)["dataset"]["files"] == 4
        s.sendall(protocol.encode_request(protocol.VERB_OPEN, b"0/d/a.bin"))
        assert protocol.recv_answer(s)[0] == protocol.STATUS_ERROR


def test_the_socket_and_its_directory_are_private(served):
    daemon, *_ = served
    assert os.stat(daemon.socket_path).st_mode & 0o077 == 0
    assert os.stat(daemon.run_dir).st_mode & 0o077 == 0


def test_another_user_is_refused_even_when_the_socket_is_reachable(served, as_other_user):
    daemon, server, *_ = served
    # open the way on purpose (as a careless umask or chmod would): SO_PEERCRED still refuses
    d = daemon.run_dir
    while d != "/tmp":
        os.chmod(d, 0o755)
        d = os.path.dirname(d)
    os.chmod(daemon.socket_path, 0o777)
    request = protocol.encode_request(protocol.VERB_OPEN, b"0/d/a.bin")
    code = f"""
import socket
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect({daemon.socket_path!r})
try:
    s.sendall({request!r})
    print("answered" if s.recv(100) else "closed")
except (ConnectionResetError, BrokenPipeError):
    print("closed")
"""
    r = as_other_user(["-c", code])
    assert r.stdout.strip() == "closed", r.stderr
    assert server.errors["other_user"] == 1


def ask_kept(s: socket.socket, key: bytes) -> tuple[int, bytes]:
    s.sendall(protocol.REQUEST_HEADER.pack(protocol.VERB_OPEN, protocol.REQUEST_KEEP, 0, len(key)) + key)
    return protocol.recv_answer(s)


def test_an_open_that_asks_to_keep_its_connection(served):
    """REQUEST_KEEP: the front door answers ANSWER_KEPT and serves the next OPENs on the same
    connection, idle longer than its PENDING_NS sweep between them (not handed to Python as
    slow), whichever request staged a copy; the Python server answers it and closes."""
    daemon, server, root, names = served
    slot = protocol.tier_slot(0)
    door = server.front_door
    before = door.counts() if door else None
    with connect(daemon.socket_path) as s:
        s.settimeout(10)
        status, body = ask_kept(s, b"0/d/a.bin")  # a miss: the door copies it
        if door is None:
            assert status == slot  # answered, not kept
            assert read_all(s) == b""
            return
        assert status == slot | protocol.ANSWER_KEPT
        assert open(body, "rb").read() == open(os.path.join(root, "d", "a.bin"), "rb").read()
        assert ask_kept(s, b"0/d/a.bin") == (slot | protocol.ANSWER_KEPT, body)  # a hit
        time.sleep(0.7)  # idle beyond PENDING_NS (0.5 s)
        status, body = ask_kept(s, os.fsencode("0/d/" + names[3]))
        assert status == slot | protocol.ANSWER_KEPT
        assert open(body, "rb").read() == open(os.path.join(root, "d", names[3]), "rb").read()
        status, body = ask_kept(s, b"0/d/nothing-there.bin")  # the door's odd case: Python's answer
        assert status == protocol.SLOT_PFS and not status & protocol.ANSWER_KEPT
        assert read_all(s) == b""  # Python closes it
    after = door.counts()
    assert after["accepted"] - before["accepted"] == 1
    assert after["reused"] - before["reused"] == 3
    assert after["handed_over"] - before["handed_over"] == 1


def test_a_launcher_reuses_the_daemon_only_for_the_same_configuration(served, caplog):
    """Same roots are not enough: a tier's capacity or a staging setting that differs is
    another daemon's work, and the line says which key differs."""
    import dataclasses
    from monarch.launch.service import attach
    daemon, *_ = served
    config = daemon.config
    other_tier = dataclasses.replace(config, tiers=(dataclasses.replace(config.tiers[0], capacity=2 << 20),))
    other_staging = dataclasses.replace(config, staging=dataclasses.replace(config.staging, policy="read-ahead"))
    spelt = dataclasses.replace(config, source="another.yaml", report="/elsewhere/report.json")
    session = attach(daemon.socket_path)
    try:
        assert session.serves(config) and session.serves(spelt)
        assert not caplog.records
        assert not session.serves(other_tier)
        assert "serves another configuration (tiers[0].capacity: 1048576 in the daemon, 2097152 in this run)" \
            in caplog.text
        assert not session.serves(other_staging)
        assert 'staging.policy: "on-access" in the daemon, "read-ahead" in this run' in caplog.text
    finally:
        session.close()
