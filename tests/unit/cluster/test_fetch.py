"""The requesting side of the peer protocol (monarch/cluster/fetch.py) against a fake owner on a
fake engine (no MPI): a file is written whole, a compressed one decompressed as it comes; each
failure is a PeerError with its reason, counted; a slow owner times out, a silent one sooner."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import zstandard

from monarch.cluster.counters import PeerCounters
from monarch.cluster.fetch import Fetcher
from monarch.cluster.transfer import FIRST_REPLY_TAG, ZSTD, encode_ok, encode_refusal
from monarch.errors import FailureReason, PeerError


class Status:
    def __init__(self, count):
        self.count = count

    def Get_count(self, datatype):
        return self.count

    def Is_cancelled(self):
        return False


class Owner:
    """The owning node, as its messages reach us: answers each request with ``answer(key)``, the
    list of messages of its reply (a header, then chunks), delivered as receives are posted."""

    MPI = SimpleNamespace(BYTE="byte")

    def __init__(self, answer):
        self.answer = answer
        self.comm = self
        self.running = True
        self.queued: dict[int, list[bytes]] = {}
        self.waiting: dict[int, list] = {}
        self.requests: list[tuple] = []

    def Irecv(self, spec, source, tag):
        return SimpleNamespace(buf=spec[0], tag=tag)

    def call(self, fn):
        fn()

    def post(self, req, on_done):
        self.waiting.setdefault(req.tag, []).append((req, on_done))
        self._deliver(req.tag)

    def send_obj(self, msg, dest):
        self.requests.append(msg)
        if msg[0] == "req":
            self.queued[msg[1]] = list(self.answer(msg[2]))
            self._deliver(msg[1])

    def _deliver(self, tag):
        while self.queued.get(tag) and self.waiting.get(tag):
            data = self.queued[tag].pop(0)
            req, on_done = self.waiting[tag].pop(0)
            req.buf[:len(data)] = data
            on_done(Status(len(data)))


class Liveness:
    def __init__(self, silent=False):
        self.lost: dict[int, dict] = {}
        self.down: set[int] = set()
        self.silent = silent
        self.suspected: list[int] = []

    def is_lost(self, node):
        return node in self.lost

    def why_lost(self, node):
        return self.lost[node]["why"]

    def is_down(self, node):
        return node in self.down

    def heard(self, node):
        pass

    def last_heard(self, node):
        return 0.0 if self.silent else time.monotonic()  # an owner that answers pings, or nothing at all

    def suspect(self, node):
        self.suspected.append(node)

    def ping(self, node):
        pass


def fetcher(answer, liveness=None, peer_timeout=5.0, heartbeat_timeout=5.0, tag_ub=32767):
    tuning = SimpleNamespace(node=0, nodes=3, peer_timeout=peer_timeout, heartbeat_timeout=heartbeat_timeout,
                             chunk_size=4, window=2)
    counters = PeerCounters({})
    f = Fetcher(Owner(answer), tag_ub, liveness or Liveness(), counters, tuning, lambda key: False)
    return f, counters


def raw(data: bytes):
    return lambda key: [encode_ok(len(data))] + [data[i:i + 4] for i in range(0, len(data), 4)]


def test_a_file_is_written_whole_counted_and_its_reply_tag_freed(tmp_path):
    f, counters = fetcher(raw(b"0123456789"))
    dest = tmp_path / "a"
    assert f.fetch(1, "0/a", str(dest)) == 10
    assert dest.read_bytes() == b"0123456789" and f._tags == {}
    c = counters.snapshot()
    assert (c["files_received"], c["bytes_received"], c["wire_bytes_received"]) == (1, 10, 10)


def test_a_compressed_copy_is_decompressed_as_it_comes(tmp_path):
    data = b"monarch " * 100
    frame = zstandard.ZstdCompressor().compress(data)
    f, counters = fetcher(lambda key: [encode_ok(len(frame), len(data), ZSTD)]
                          + [frame[i:i + 4] for i in range(0, len(frame), 4)])
    assert f.fetch(2, "0/z", str(tmp_path / "z")) == len(data)
    assert (tmp_path / "z").read_bytes() == data
    c = counters.snapshot()
    assert (c["bytes_received"], c["wire_bytes_received"]) == (len(data), len(frame))


@pytest.mark.parametrize("answer, reason, words", [
    (lambda key: [encode_refusal("no room")], FailureReason.REFUSED, "node 1 refused: no room"),
    (lambda key: [encode_ok(10), b"0123", b""], FailureReason.ABORTED, "aborted the transfer at 4 of 10 bytes"),
    (lambda key: [encode_ok(8, 6), b"0123", b"4567"], FailureReason.CORRUPT, "sent more than the 6 bytes"),
    (lambda key: [encode_ok(4, 9), b"0123"], FailureReason.CORRUPT, "sent 4 of the 9 bytes it announced"),
    (lambda key: [encode_ok(4, 4, 7), b"0123"], FailureReason.CORRUPT, "sent encoding 7"),
    (lambda key: [encode_ok(4, 4, ZSTD), b"0123"], FailureReason.CORRUPT, "'s frame"),
])
def test_each_failure_is_a_peer_error_with_its_reason_and_counted(tmp_path, answer, reason, words):
    f, counters = fetcher(answer)
    with pytest.raises(PeerError, match=words) as e:
        f.fetch(1, "0/a", str(tmp_path / "a"))
    assert e.value.reason is reason
    assert counters.snapshot()["fetch_failures"] == {reason.value: 1}
    assert f._tags == {}  # everything the owner sent has arrived: the reply tag is free again


def test_who_cannot_be_asked_fails_at_once(tmp_path):
    live = Liveness()
    f, counters = fetcher(raw(b"x"), live)
    for owner in (0, 3, -1):  # this node itself, no such node
        with pytest.raises(PeerError, match="is not a peer of node 0 of 3") as e:
            f.fetch(owner, "0/a", str(tmp_path / "a"))
        assert e.value.reason is FailureReason.FAILED
    live.down.add(1)
    live.lost[2] = {"why": "proc failed"}
    with pytest.raises(PeerError, match="node 1 is not answering"):
        f.fetch(1, "0/a", str(tmp_path / "a"))
    with pytest.raises(PeerError, match=r"node 2 is lost \(proc failed\)"):
        f.fetch(2, "0/a", str(tmp_path / "a"))
    f.close()
    with pytest.raises(PeerError, match="the peer layer is not running"):
        f.fetch(1, "0/a", str(tmp_path / "a"))
    assert f._engine.requests == []  # nobody was asked
    assert counters.snapshot()["fetch_failures"] == {"peer_down": 1, "peer_lost": 1, "not_running": 1}


def test_a_slow_owner_times_out_and_a_silent_one_is_given_up_sooner_and_suspected(tmp_path):
    f, counters = fetcher(lambda key: [], peer_timeout=0.3)
    with pytest.raises(PeerError, match="did not send the file header within 0.3s") as e:
        f.fetch(1, "0/a", str(tmp_path / "a"))
    assert e.value.reason is FailureReason.TIMEOUT and f._liveness.suspected == []  # it answers pings
    assert f._engine.requests[-1] == ("cancel", FIRST_REPLY_TAG)
    silent = Liveness(silent=True)
    f, counters = fetcher(lambda key: [], silent, peer_timeout=30.0, heartbeat_timeout=0.3)
    start = time.monotonic()
    with pytest.raises(PeerError, match="answered nothing, not even a ping") as e:
        f.fetch(1, "0/a", str(tmp_path / "a"))
    assert e.value.reason is FailureReason.NO_HEARTBEAT and silent.suspected == [1] and time.monotonic() - start < 5


def test_reply_tags_skip_those_in_use_and_wrap_at_the_upper_bound():
    f, _ = fetcher(raw(b""), tag_ub=FIRST_REPLY_TAG + 2)
    xfers = [SimpleNamespace(begin=lambda tag: None, tag=None) for _ in range(4)]
    tags = []
    for x in xfers[:3]:
        f._begin(x)
        tags.append(next(t for t, v in f._tags.items() if v is x))
    assert tags == [FIRST_REPLY_TAG, FIRST_REPLY_TAG + 1, FIRST_REPLY_TAG + 2]
    del f._tags[FIRST_REPLY_TAG + 1]  # that transfer ended
    f._begin(xfers[3])
    assert f._tags[FIRST_REPLY_TAG + 1] is xfers[3]  # wrapped, and skipped the tag still in use
