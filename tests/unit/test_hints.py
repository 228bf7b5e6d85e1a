"""Order hints: the HINT frames, the daemon acting on them, and the client API (monarch.hints)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from monarch import protocol
from monarch.config import load_config
from monarch.node.daemon import NodeDaemon
from monarch.hints import Hints, HintedSampler
from monarch.node.server import NodeServer
from support.harness import NO_RESERVE, make_bases


@pytest.fixture
def served(short_tmp):
    root = os.path.join(short_tmp, "pfs")
    os.makedirs(os.path.join(root, "d"))
    for i in range(40):
        with open(os.path.join(root, "d", f"f{i:02d}.bin"), "wb") as f:
            f.write(os.urandom(1000))
    cfg = os.path.join(short_tmp, "c.yaml")
    unit = os.statvfs(short_tmp).f_frsize  # each copy takes whole blocks of the tier's filesystem
    with open(cfg, "w") as f:  # room for 20 of the 40 files; no read-ahead of its own
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run"
tiers: [{{name: ram, path: "{short_tmp}/ram", capacity: {20 * unit}}}]
staging: {{policy: on-access, threads: 2, resolve_timeout: 5, share: false}}
{NO_RESERVE}""")
    make_bases(cfg)
    daemon = NodeDaemon(load_config(cfg, env={"USER": "u"}), "r1")
    server = NodeServer(daemon, embedded=False)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield daemon, server, root
    server.request_stop()
    thread.join(10)
    daemon.close()


def wait_idle(stager, timeout=20):
    deadline = time.monotonic() + timeout
    while not stager.idle():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def staged(daemon, paths, root):
    return [p for p in paths if daemon.stager.where("0/" + os.path.relpath(p, root)) is not None]


def test_hint_frames_round_trip_and_split_within_the_request_limit():
    keys = [os.fsencode(f"0/dir/{i:05d}-" + "x" * 200) for i in range(200)]
    frames = protocol.encode_hints(protocol.HINT_ORDER, 42, keys)
    assert len(frames) > 1 and all(len(f) <= protocol.REQUEST_HEADER.size + protocol.MAX_REQUEST for f in frames)
    got, ops = [], []
    for f in frames:
        verb, length = protocol.decode_request_header(f[:8])
        assert verb == protocol.VERB_HINT and length == len(f) - 8
        op, stream, body = protocol.decode_hint(f[8:])
        assert stream == 42
        ops.append(op)
        got += body
    assert ops == [protocol.HINT_ORDER] + [protocol.HINT_MORE] * (len(frames) - 1)
    assert [os.fsencode(k) for k in got] == keys
    (p,) = protocol.encode_hints(protocol.HINT_PROGRESS, 42, consumed=7)
    assert protocol.decode_hint(p[8:]) == (protocol.HINT_PROGRESS, 42, 7)
    for bad in (b"", b"\x09" + bytes(8), b"\x01" + bytes(8) + b"\x05\x00ab", b"\x03" + bytes(8) + b"\x01"):
        with pytest.raises(protocol.ProtocolError):
            protocol.decode_hint(bad)


def test_the_daemon_stages_in_the_hinted_order_and_drops_what_was_consumed(served):
    daemon, _, root = served
    order = [os.path.join(root, "d", f"f{i:02d}.bin") for i in reversed(range(40))]
    with Hints(env=daemon.client_env(), stream=5) as h:
        assert h.order(order) == 40
        wait_idle(daemon.stager)
        assert staged(daemon, order, root) == order[:20]
        h.progress(15)
        wait_idle(daemon.stager)
        assert staged(daemon, order, root) == order[15:35]
    assert daemon.stager.stats()["dropped"] == 15
    assert daemon.stager.stats()["pfs_files_read"] == 35  # each once
    assert daemon.stats()["resolves"]["hints"] >= 3


def test_a_malformed_hint_is_refused_and_the_daemon_serves_on(served):
    daemon, server, root = served
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(daemon.socket_path)
        s.sendall(protocol.encode_request(protocol.VERB_HINT, b"\x07" + bytes(8)))
        status, body = protocol.recv_answer(s)
    assert status == protocol.STATUS_ERROR and b"HINT" in body
    assert server.errors["bad_hint"] == 1
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(daemon.socket_path)
        s.sendall(protocol.encode_request(protocol.VERB_OPEN, b"0/d/f00.bin"))
        assert protocol.recv_answer(s)[0] == protocol.tier_slot(0)


def test_hinted_sampler_sends_each_epoch_order_and_yields_the_same_indices(served):
    daemon, _, root = served
    paths = [os.path.join(root, "d", f"f{i:02d}.bin") for i in range(40)]

    class Sampler:  # a torch-like sampler: a new order per epoch
        epoch = 0

        def set_epoch(self, e):
            self.epoch = e

        def __iter__(self):
            return iter(sorted(range(40), key=lambda i: (i * 7 + self.epoch * 13) % 40))

        def __len__(self):
            return 40

    sampler = HintedSampler(Sampler(), path_of=lambda i: paths[i], lag=4, every=8,
                            hints=Hints(env=daemon.client_env(), stream=9))
    sampler.set_epoch(1)
    first = list(Sampler.__iter__(sampler.sampler))
    got = []
    for i in sampler:
        got.append(i)
        if len(got) == 1:  # the order went before the first index
            wait_idle(daemon.stager)
            assert staged(daemon, paths, root) == sorted(paths[j] for j in first[:20])
    assert got == first and len(sampler) == 40
    wait_idle(daemon.stager)
    assert daemon.stager.schedule.orders[9].consumed == 40


def test_without_a_daemon_hints_do_nothing(short_tmp):
    h = Hints(env={})
    assert not h.enabled and h.order(["/x/y"]) == 0
    h.progress(3)
    h.close()
    gone = Hints(env={protocol.ENV_SOCKET: os.path.join(short_tmp, "none.sock"), protocol.ENV_ROOTS: "0=/data"})
    assert gone.enabled
    assert gone.order(["/data/a"]) == 1 and not gone.enabled  # could not connect: off, no error
    assert list(HintedSampler([3, 1, 2], path_of=str, hints=gone)) == [3, 1, 2]


def test_paths_map_to_keys_as_the_shim_matches_them():
    h = Hints(env={protocol.ENV_SOCKET: "/s", protocol.ENV_ROOTS: "0=/data:1=/data/sub:0=/scratch/ds"})
    assert h.key_of("/data/a/b.jpg") == b"0/a/b.jpg"
    assert h.key_of("/data/sub/x") == b"1/x"  # the longest root first
    assert h.key_of("/scratch/ds/y") == b"0/y"
    assert h.key_of("/datax/y") is None and h.key_of("/data") is None
    assert h.key_of(b"/data/\xff\n") == b"0/\xff\n"
