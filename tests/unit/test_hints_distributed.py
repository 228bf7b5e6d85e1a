"""DistributedHintedSampler: torch's DistributedSampler's shards, hinted (monarch.hints)."""

from __future__ import annotations

import os
import time

import pytest

from monarch import protocol
from monarch.hints import DistributedHintedSampler, Hints


def shards(n, replicas, **kw):
    return [list(DistributedHintedSampler(n, replicas, r, path_of=str, **kw)) for r in range(replicas)]


@pytest.mark.parametrize("n,replicas", [(12, 4), (10, 3), (1, 4), (1200, 4)])
def test_shards_are_disjoint_and_cover_the_dataset(n, replicas):
    parts = shards(n, replicas)
    assert len({len(p) for p in parts}) == 1 and len(parts[0]) == -(-n // replicas)
    flat = [i for p in parts for i in p]
    assert set(flat) == set(range(n))
    pad = len(flat) - n  # padded by repeating the permutation's head, as torch does
    assert pad < replicas or n < replicas
    if n % replicas == 0:
        assert sorted(flat) == list(range(n))


def test_drop_last_cuts_to_a_multiple_and_stays_disjoint():
    parts = shards(10, 3, drop_last=True)
    flat = [i for p in parts for i in p]
    assert [len(p) for p in parts] == [3, 3, 3] and len(set(flat)) == 9


def test_each_epoch_has_its_order_and_the_seed_repeats_it():
    s = DistributedHintedSampler(100, 2, 1, seed=7, path_of=str)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert first != second and sorted(first) != sorted(range(50))
    again = DistributedHintedSampler(100, 2, 1, seed=7, path_of=str)
    again.set_epoch(1)
    assert list(again) == second and s.epoch == 1
    assert list(DistributedHintedSampler(6, 2, 0, shuffle=False, path_of=str)) == [0, 2, 4]


def test_a_rank_outside_the_replicas_is_refused():
    with pytest.raises(ValueError, match="rank 4"):
        DistributedHintedSampler(10, 4, 4, path_of=str)


def test_the_shard_order_is_told_before_the_first_index_then_the_progress(tmp_path):
    root = tmp_path / "ds"
    sent = []

    class Recorder(Hints):
        def _send(self, frames, wait=True, channel=None):
            sent.extend(protocol.decode_hint(f[protocol.REQUEST_HEADER.size:]) for f in frames)

    hints = Recorder(env={protocol.ENV_SOCKET: str(tmp_path / "s"), protocol.ENV_ROOTS: f"0={root}"}, stream=5)
    s = DistributedHintedSampler(40, 4, 2, path_of=lambda i: root / f"f{i:02d}", lag=2, every=4, hints=hints)
    it = iter(s)
    first = next(it)
    op, stream, keys = sent[0]
    assert op == protocol.HINT_ORDER and stream == 5 and len(keys) == 10 and keys[0] == f"0/f{first:02d}"
    rest = list(it)
    assert [k for k in keys] == [f"0/f{i:02d}" for i in [first, *rest]]
    progress = [k for op, _, k in sent if op == protocol.HINT_PROGRESS]
    assert progress[-1] == 10 and progress == sorted(progress)


def test_progress_is_not_waited_for_and_its_answers_are_read_before_the_next_order(short_tmp):
    """The progress goes on a connection of its own (the front door answers it itself when its
    peer lane follows that order), its answers not waited for; they are read before the next
    order goes (on the first connection), and the next order's progress goes on a new one."""
    import socket
    import threading

    path = os.path.join(short_tmp, "d.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    release, got, lock = threading.Event(), [], threading.Lock()

    def serve(conn, number):
        with conn:
            while True:
                try:
                    head = protocol.recv_exact(conn, protocol.REQUEST_HEADER.size)
                except (protocol.ProtocolError, OSError):
                    return  # the reader closed it
                n = protocol.REQUEST_HEADER.unpack(head)[-1]
                op, stream, arg = protocol.decode_hint(protocol.recv_exact(conn, n))
                with lock:
                    got.append((number, op))
                if op == protocol.HINT_PROGRESS and not release.wait(3):  # answered once the reader went on
                    with lock:
                        got.append("the reader waited for a progress's answer")
                conn.sendall(protocol.ANSWER_HEADER.pack(0, 0))

    def daemon():
        for number in range(3):
            conn, _ = listener.accept()
            threading.Thread(target=serve, args=(conn, number), daemon=True).start()

    threading.Thread(target=daemon, daemon=True).start()
    h = Hints(env={protocol.ENV_SOCKET: path, protocol.ENV_ROOTS: f"0={short_tmp}"}, stream=3)
    h.order([os.path.join(short_tmp, "a"), os.path.join(short_tmp, "b")])
    h.progress(1, wait=False)
    h.progress(2, wait=False)  # returned without their answers: the daemon holds them until released
    release.set()
    h.order([os.path.join(short_tmp, "a")])  # reads the two answers first, then its own
    h.progress(1)
    h.close()
    deadline = time.monotonic() + 10
    while len(got) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    listener.close()
    assert got == [(0, protocol.HINT_ORDER), (1, protocol.HINT_PROGRESS), (1, protocol.HINT_PROGRESS),
                   (0, protocol.HINT_ORDER), (2, protocol.HINT_PROGRESS), (0, protocol.HINT_END)]
    assert h.enabled
