"""A door worker that fetches another node's file waits for the answer on its own epoll,
serving the connections it holds meanwhile (bench_peer: the reader threads whose kept
connections sat on a fetching worker fell 1.9 s behind the rest). Each connection's event is
still served once: one the worker's loop already took is not served again by that inner wait.

The door runs alone on a socket (support.sharded_door, one worker: every connection is that
worker's); the data path's post, test and take are the test's, so a fetch is held at will."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from monarch import frontdoor, protocol
from support.harness import unix_connect as connect
from support.sharded_door import FETCH_MANY, GOT, POST, TAKE, TEST, make_sharded_door

pytestmark = pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")


@pytest.fixture
def one_worker_door(short_tmp):
    yield from make_sharded_door(short_tmp, workers=1)


def pfs_bytes(d, key: str) -> bytes:
    with open(os.path.join(d.root, key.split("/", 1)[1]), "rb") as f:
        return f.read()


def link_held(d, release: dict[int, threading.Event], stall: dict[int, threading.Event]):
    """The door's peer lane linked to requests in flight in dp_post's shape: each post recorded
    in ``d.posted`` (by handle, from 1), answered once ``release[handle]`` is set, its take
    (the reply written) first waiting for ``stall[handle]`` where there is one (the worker held
    outside its epoll). Each fetch must be one an open waits on (``waited``)."""
    d.posted = {}
    d.taking = threading.Event()

    def post(dp, owner, n, keys, lens, sizes, waited, timeout_ms, why):
        assert waited == 1  # an application's open waits on it: the owner looks more often
        d.posted[len(d.posted) + 1] = [keys[i][:lens[i]].decode() for i in range(n)]
        why[0] = 0
        return len(d.posted)

    def test(dp, handle):
        return int(release.setdefault(handle, threading.Event()).is_set())

    def take(dp, handle, sizes, results, got, arg):
        if handle in stall:
            d.taking.set()
            stall[handle].wait(20)
        data = [pfs_bytes(d, k) for k in d.posted[handle]]
        for i, b in enumerate(data):
            results[i] = len(b)
        GOT(got)(arg, (ctypes.c_char_p * len(data))(*data), results)

    callbacks = (d.callbacks[0], d.callbacks[1], FETCH_MANY(lambda *a: -1), POST(post), TEST(test), TAKE(take))
    d.linked = callbacks  # kept alive with the door
    address = [ctypes.cast(c, ctypes.c_void_p).value for c in callbacks]
    assert d.front_door.peers(address[0], address[1], None, d.owners, 0, protocol.SLOT_PEER, 5.0, 1, address[2],
                        tuple(address[3:]))
    d.front_door.peer_copying(True)


def open_request(key: str, keep: bool = False) -> bytes:
    body = key.encode()
    return protocol.REQUEST_HEADER.pack(protocol.VERB_OPEN, protocol.REQUEST_KEEP if keep else 0, 0, len(body)) + body


def answer_md5(s: socket.socket, area: str = "") -> tuple[int, str]:
    """The answer on ``s`` (its status without ANSWER_KEPT) and the md5 of the bytes it gives:
    a descriptor passed (ANSWER_FD) or a path."""
    frame, fds, _, _ = socket.recv_fds(s, 8 + 4096, 1)
    status = int.from_bytes(frame[:4], "little") & ~protocol.ANSWER_KEPT
    if fds:
        with os.fdopen(fds[0], "rb") as f:
            return status, hashlib.md5(f.read()).hexdigest()
    length = int.from_bytes(frame[4:8], "little")
    with open(frame[8:8 + length], "rb") as f:
        return status, hashlib.md5(f.read()).hexdigest()


def kept_open(s: socket.socket, key: str) -> tuple[int, str]:
    """An OPEN on a connection the door keeps (REQUEST_KEEP, as the shim's threads send them)."""
    s.sendall(open_request(key, keep=True))
    return answer_md5(s)


def test_a_worker_waiting_for_a_fetch_answers_the_connections_it_keeps(one_worker_door):
    """An open on a connection the fetching worker keeps is answered at once, not once the
    fetch is over (before, it timed out here: the worker blocked in the fetch)."""
    d = one_worker_door
    release: dict[int, threading.Event] = {}
    link_held(d, release, {})
    mine = sorted(d.mine)
    remote = next(k for k in sorted(d.sums) if k not in d.mine)
    with connect(d.socket) as a, connect(d.socket) as b:
        assert kept_open(a, mine[0]) == (d.slot, d.sums[mine[0]])  # both kept by the one worker
        assert kept_open(b, mine[1]) == (d.slot, d.sums[mine[1]])
        answer_b: list = []
        waiting = threading.Thread(target=lambda: answer_b.append(kept_open(b, remote)), daemon=True)
        waiting.start()
        for _ in range(1000):  # the worker fetches: its answer is held
            if d.posted:
                break
            time.sleep(0.01)
        try:
            got = kept_open(a, mine[2])  # the other reader's next open, on the same worker
            answered_while_held = not release[1].is_set()
        finally:
            release.setdefault(1, threading.Event()).set()
        waiting.join(10)
    assert got == (d.slot, d.sums[mine[2]]) and answered_while_held
    assert answer_b == [(protocol.SLOT_PEER | protocol.ANSWER_FD, d.sums[remote])], answer_b
    assert d.front_door.counts()["peer_waits"] >= 1


def request_in_pieces_while_fetching(short_tmp: str) -> dict:
    """The worker's loop takes two events at once: a new connection whose open is remote (a
    fetch, waited for on the worker's epoll) and the last piece of another connection's request,
    pending there (level-triggered). The inner wait must not serve that second one: the loop
    still holds its event, and would serve it again (freed: the daemon crashed, CI)."""
    gen = make_sharded_door(short_tmp, workers=1)
    d = next(gen)
    try:
        release = {1: threading.Event(), 2: threading.Event()}
        release[1].set()
        stall = {1: threading.Event()}
        link_held(d, release, stall)
        mine = sorted(d.mine)
        remote = [k for k in sorted(d.sums) if k not in d.mine][:2]
        with connect(d.socket) as a, connect(d.socket) as b:
            assert kept_open(a, mine[0]) == (d.slot, d.sums[mine[0]])  # a: kept in the worker's epoll
            piece = open_request(mine[1])
            b.sendall(piece[:3])  # b: pending, its request cut short
            answers: dict[str, tuple] = {}
            first = threading.Thread(target=lambda: answers.update(a=kept_open(a, remote[0])), daemon=True)
            first.start()  # a's fetch: its reply written once ``stall`` is set
            assert d.taking.wait(10)
            late = connect(d.socket)  # a new connection (the listener readable) with a remote open ...
            late.sendall(open_request(remote[1]))
            b.sendall(piece[3:])  # ... then b's request completed: both events in one wait
            time.sleep(0.1)
            stall[1].set()
            first.join(10)
            for _ in range(200):  # late's fetch posted; the worker waits for it
                if len(d.posted) == 2:
                    break
                time.sleep(0.01)
            time.sleep(0.2)
            release[2].set()
            answers["late"] = answer_md5(late)
            answers["b"] = answer_md5(b)
            late.close()
            answers["after"] = kept_open(a, mine[2])  # the door still answers
        return {"answers": answers, "posted": d.posted, "handed_over": d.front_door.counts()["handed_over"],
                "sums": {k: d.sums[k] for k in (remote + mine[:3])}, "remote": remote, "mine": mine[:3],
                "slot": d.slot}
    finally:
        gen.close()


def test_a_request_completed_while_its_worker_fetches_is_served_once(short_tmp):
    """In a process of its own: the old inner wait served the pending connection and freed it
    while the loop still held its event (use after free, double free)."""
    here = Path(__file__).resolve()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parents[3]), str(here.parents[2]), str(here.parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    code = ("import json, sys; from test_front_door_fetching_worker import request_in_pieces_while_fetching as t; "
            "print(json.dumps(t(sys.argv[1])))")
    proc = subprocess.run([sys.executable, "-c", code, short_tmp], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.splitlines()[-1])
    sums, remote, mine = r["sums"], r["remote"], r["mine"]
    peer = protocol.SLOT_PEER | protocol.ANSWER_FD
    assert r["answers"] == {"a": [peer, sums[remote[0]]], "late": [peer, sums[remote[1]]],
                            "b": [r["slot"], sums[mine[1]]], "after": [r["slot"], sums[mine[2]]]}, r
    assert r["posted"] == {"1": [remote[0]], "2": [remote[1]]} and r["handed_over"] == 0, r
