"""The write-back calls' own socket (node/writeback_door.py): calls answered one after another on
a kept connection, heartbeats while a call waits, and anything else closed and counted."""

import os
import shutil
import socket
import tempfile
import threading
import time

import pytest

from monarch import protocol
from monarch.node.writeback_door import WritebackDoor


@pytest.fixture
def door(tmp_path):
    calls = []
    release = threading.Event()  # a call of body b"wait" waits for it (as a call waits for the drain)

    def call(body: bytes) -> bytes:
        calls.append(body)
        if body == b"wait":
            release.wait(60)
        return protocol.encode_answer(len(calls), body[::-1])

    d = WritebackDoor(str(tmp_path / "wb.sock"), call)
    d.start()
    d.calls, d.release = calls, release
    yield d
    release.set()
    d.stop()


def connect(door):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(door.path)
    return s


def ask(s, body: bytes, verb=protocol.VERB_WB, beats: list | None = None):
    """The answer to one call: (status, body, heartbeats before it); ``beats``: each heartbeat appended as it comes."""
    s.sendall(protocol.REQUEST_HEADER.pack(verb, 0, 0, len(body)) + body)
    beats = [] if beats is None else beats
    while True:
        status, length = protocol.ANSWER_HEADER.unpack(recv(s, protocol.ANSWER_HEADER.size))
        if status != protocol.STATUS_PENDING:
            return status, recv(s, length), len(beats)
        beats.append(status)


def closed(s) -> bool:
    """Did the door close ``s`` (an end of stream, or a reset where a request was left unread)?"""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def recv(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "closed"
        data += chunk
    return data


def test_calls_are_answered_one_after_another_on_one_connection(door):
    s = connect(door)
    for i in range(1, 4):
        assert ask(s, b"call %d" % i) == (i, (b"call %d" % i)[::-1], 0)
    assert door.calls == [b"call 1", b"call 2", b"call 3"]


def test_a_call_that_waits_gets_heartbeats_and_the_others_go_on(door):
    """A call waiting (for the drain) holds its own connection only: another is answered meanwhile,
    and the waiting one's shim gets heartbeats, so it does not take the daemon for lost."""
    waiting, other = connect(door), connect(door)
    waiting.settimeout(60)
    beats, got = [], {}
    t = threading.Thread(target=lambda: got.update(waited=ask(waiting, b"wait", beats=beats)))
    t.start()
    assert ask(other, b"quick")[1] == b"kciuq" and "waited" not in got  # answered while the other waits
    deadline = time.monotonic() + 30  # (a bound against hanging, not a measurement)
    while len(beats) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(beats) >= 2 and "waited" not in got, (beats, got)
    door.release.set()
    t.join(30)
    assert got["waited"][1] == b"tiaw", got


@pytest.mark.parametrize("frame", [b"\xff" * 8, protocol.REQUEST_HEADER.pack(protocol.VERB_OPEN, 0, 0, 1) + b"x",
                                   protocol.REQUEST_HEADER.pack(protocol.VERB_WB, 0, 0, 1 << 20)])
def test_anything_but_a_write_back_call_closes_its_connection(door, frame):
    s = connect(door)
    s.sendall(frame)
    assert closed(s)
    assert door.refused["malformed"] == 1 and door.calls == []
    assert ask(connect(door), b"after")[1] == b"retfa"  # the door serves on


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_another_user_is_refused():
    where = tempfile.mkdtemp(prefix="wbdoor-")  # (pytest's own folders are its user's alone)
    os.chmod(where, 0o755)
    calls = []
    door = WritebackDoor(os.path.join(where, "wb.sock"), lambda body: calls.append(body) or protocol.encode_answer(0))
    door.start()
    try:
        os.chmod(door.path, 0o777)  # (it is 0600: opened here so that the uid check is what refuses)
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(65534)
                s = connect(door)
                try:
                    s.sendall(protocol.REQUEST_HEADER.pack(protocol.VERB_WB, 0, 0, 2) + b"hi")
                except (ConnectionResetError, BrokenPipeError):
                    os._exit(0)  # closed before the call was sent
                os._exit(0 if closed(s) else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert door.refused["other_user"] == 1 and calls == []
    finally:
        door.stop()
        shutil.rmtree(where)


def test_stop_closes_the_kept_connections(door):
    s = connect(door)
    assert ask(s, b"one")[0] == 1
    door.stop()
    assert closed(s)
    assert not os.path.exists(door.path)
