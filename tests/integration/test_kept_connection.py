"""The shim keeps its connection to the daemon for the next OPEN (REQUEST_KEEP), one per
thread: a thread's misses cost one connect, not one each; threads and forked children get
their own and the right bytes; a daemon stopped or restarted between two opens costs a fresh
connection or the PFS, never an error; the Python server (MONARCH_FRONT_DOOR=0) answers it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from monarch import protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.node.server import NodeServer
from monarch.shim import shim_library
from support.harness import NO_RESERVE, make_bases

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FILES = 60


class Served:
    def __init__(self, cfg: str):
        self.cfg = cfg
        self.start()

    def start(self) -> None:
        self.daemon = NodeDaemon(load_config(self.cfg, env={"USER": "u"}), "r1")
        self.server = NodeServer(self.daemon, embedded=False)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.request_stop()
        self.thread.join(10)
        self.daemon.close()


@pytest.fixture
def served(short_tmp):
    root = os.path.join(short_tmp, "pfs")
    os.makedirs(os.path.join(root, "d"))
    for i in range(FILES):
        with open(os.path.join(root, "d", f"{i}.bin"), "wb") as f:
            f.write(os.urandom(3000 + i))
    cfg = os.path.join(short_tmp, "c.yaml")
    with open(cfg, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run"
tiers: [{{name: ram, path: "{short_tmp}/ram", capacity: 4MiB}}]
staging: {{policy: on-access, threads: 2, resolve_timeout: 5, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)
    s = Served(cfg)
    s.root = root
    yield s
    s.stop()


def md5s(root: str, names) -> list[str]:
    return [hashlib.md5(open(os.path.join(root, "d", n), "rb").read()).hexdigest() for n in names]


def run(served: Served, code: str, *args, stdin: bytes | None = None) -> list[str]:
    env = dict(os.environ, **served.daemon.client_env(), LD_PRELOAD=str(shim_library()))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), served.root, *map(str, args)], env=env,
                       input=stdin, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode().split()


# how many sockets this process holds: the shim's kept connections are its only ones
SOCKETS = """
import hashlib, os, sys, threading
root = sys.argv[1]
def read(i):
    return hashlib.md5(open(f"{root}/d/{i}.bin", "rb").read()).hexdigest()
def sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n
"""


def test_one_thread_opens_many_misses_on_one_connection(served):
    door = served.server.front_door
    before = door.counts()
    out = run(served, SOCKETS + """
print(*[read(i) for i in range(int(sys.argv[2]))])
print("sockets", sockets())
""", FILES)
    assert out[:FILES] == md5s(served.root, [f"{i}.bin" for i in range(FILES)])
    assert out[FILES:] == ["sockets", "1"]  # the kept one
    after = door.counts()
    assert after["accepted"] - before["accepted"] == 1
    assert after["reused"] - before["reused"] == FILES - 1
    assert after["copies"] - before["copies"] == FILES  # every one a miss the door copied


def test_threads_and_forked_children_have_their_own_and_the_right_bytes(served):
    door = served.server.front_door
    before = door.counts()
    out = run(served, SOCKETS + """
print(read(0), "main", sockets())             # the main thread's connection, kept
barrier = threading.Barrier(5)
seen = {}
def reader(t):
    seen[t] = [read(i) for i in range(1 + t * 10, 11 + t * 10)]
    barrier.wait()                            # all alive: a connection each
    barrier.wait()
threads = [threading.Thread(target=reader, args=(t,)) for t in range(4)]
for t in threads:
    t.start()
barrier.wait()
print("alive", sockets())
barrier.wait()
for t in threads:
    t.join()
import time                                   # join returns before the thread's pthread end
deadline = time.monotonic() + 5
while sockets() > 1 and time.monotonic() < deadline:
    time.sleep(0.01)
print("joined", sockets())                    # an exiting thread's connection is closed
for t in range(4):
    print(*seen[t])
r, w = os.pipe()
pid = os.fork()
if pid == 0:                                  # the parent's connection is not the child's
    n = sockets()
    got = [read(i) for i in range(41, 51)]
    os.write(w, (" ".join(got) + f" child {n} {sockets()}").encode())
    os._exit(0)
os.close(w)
mine = [read(i) for i in range(51, 60)]
os.waitpid(pid, 0)
print(os.read(r, 1 << 16).decode())
print(*mine, "parent", sockets())
""")
    names = [f"{i}.bin" for i in range(FILES)]
    assert out[:3] == [md5s(served.root, names[:1])[0], "main", "1"]
    assert out[3:5] == ["alive", "5"]
    assert out[5:7] == ["joined", "1"]
    assert out[7:47] == md5s(served.root, names[1:41])
    assert out[47:57] == md5s(served.root, names[41:51])
    assert out[57:60] == ["child", "0", "1"]  # none inherited; its own once it asked
    assert out[60:69] == md5s(served.root, names[51:60])
    assert out[69:] == ["parent", "1"]
    after = door.counts()
    assert after["accepted"] - before["accepted"] == 6  # main, 4 threads, the child
    assert after["reused"] - before["reused"] == FILES - 6


def test_a_daemon_stopped_or_restarted_between_two_opens(served):
    """The reader's kept connection dies with its daemon: the next open reads the PFS, with
    the right bytes, and so does one after a new instance started (a connection the daemon
    closes while it lives costs a fresh one: tests/shim/test_fail_open.py)."""
    code = SOCKETS + """
for line in sys.stdin:                        # one file per line, after the test's change
    print(read(int(line)), sockets(), flush=True)
"""
    env = dict(os.environ, **served.daemon.client_env(), LD_PRELOAD=str(shim_library()))
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), served.root], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def ask(i: int) -> list[str]:
            p.stdin.write(f"{i}\n".encode())
            p.stdin.flush()
            return p.stdout.readline().decode().split()
        names = [f"{i}.bin" for i in range(3)]
        want = md5s(served.root, names)
        assert ask(0) == [want[0], "1"]
        served.stop()                         # the door closes its kept connection
        assert ask(1) == [want[1], "0"]       # the PFS: no daemon
        served.start()                        # another instance: the shim trusts none of its state
        assert ask(2)[0] == want[2]
    finally:
        p.stdin.close()
        assert p.wait(30) == 0, p.stderr.read().decode()


def test_the_python_server_answers_a_shim_that_asks_to_keep(served, monkeypatch):
    served.stop()
    monkeypatch.setenv("MONARCH_FRONT_DOOR", "0")
    served.start()
    assert served.server.front_door is None
    out = run(served, SOCKETS + """
print(*[read(i) for i in range(int(sys.argv[2]))])
print("sockets", sockets())
""", 20)
    assert out[:20] == md5s(served.root, [f"{i}.bin" for i in range(20)])
    assert out[20:] == ["sockets", "0"]  # Python never keeps one
    opened = protocol.read_opened_from(served.daemon.counters_path, {protocol.SLOT_PFS: "pfs",
                                                                      protocol.tier_slot(0): "ram"})
    assert opened["ram"]["opens"] == 20 and opened["pfs"]["opens"] == 0
