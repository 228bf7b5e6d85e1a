"""The owner's side of the peer protocol (monarch/cluster/provide.py) over a fake engine (no MPI): a
file goes as its header and chunks, bounded by the window; each request not served is refused
with its reason and counted by why; a requester that stops receiving costs one timeout."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from monarch.cluster.counters import PeerCounters
from monarch.cluster.provide import Compressed, Provider, ServeFailure
from monarch.cluster.transfer import RAW, ZSTD, decode_header, decode_ok


class Engine:
    """Sends complete at once (``stalled``: never); what was sent is kept per reply tag."""

    MPI = SimpleNamespace(BYTE="byte")

    def __init__(self, stalled: bool = False):
        self.comm = self
        self.stalled = stalled
        self.sent: list[tuple[int, int, bytes]] = []
        self.lock = threading.Lock()

    def Isend(self, spec, dest, tag):
        with self.lock:
            self.sent.append((dest, tag, bytes(spec[0])))
        return len(self.sent)

    def call(self, fn):
        fn()

    def post(self, req, on_done=None):
        if on_done is not None and not self.stalled:
            on_done(None)

    def messages(self, src: int, tag: int) -> list[bytes]:
        return [data for dest, t, data in self.sent if (dest, t) == (src, tag)]


def provider(provide, engine=None, chunk_size=4, window=2, peer_timeout=5.0):
    counters = PeerCounters({})
    tuning = SimpleNamespace(chunk_size=chunk_size, window=window, peer_timeout=peer_timeout)
    s = Provider(engine or Engine(), counters, tuning)
    s.start(provide, 2)
    return s, counters


def ask(s: Provider, key: str, src: int = 1, tag: int = 16) -> list[bytes]:
    s.on_request(src, tag, key)
    assert s.wait_idle(10)
    return s.engine.messages(src, tag)


@pytest.fixture
def staged(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"0123456789")
    return str(path)


def test_a_file_goes_as_its_header_then_its_chunks_and_is_counted(staged):
    s, counters = provider(lambda key: staged if key == "0/a" else None)
    header, *chunks = ask(s, "0/a")
    assert decode_ok(header, len(header)) == (10, 10, RAW)
    assert [len(c) for c in chunks] == [4, 4, 2] and b"".join(chunks) == b"0123456789"
    c = counters.snapshot()
    assert (c["files_sent"], c["bytes_sent"], c["wire_bytes_sent"], c["serve_failures"]) == (1, 10, 10, {})


def test_a_compressed_copy_crosses_as_stored_and_says_the_files_size(staged):
    s, counters = provider(lambda key: Compressed(staged, 25))
    header, *chunks = ask(s, "0/a")
    assert decode_ok(header, len(header)) == (10, 25, ZSTD) and b"".join(chunks) == b"0123456789"
    c = counters.snapshot()
    assert (c["bytes_sent"], c["wire_bytes_sent"]) == (25, 10)


def test_an_empty_file_is_its_header_alone(tmp_path):
    empty = tmp_path / "e"
    empty.write_bytes(b"")
    s, counters = provider(lambda key: str(empty))
    (header,) = ask(s, "0/e")
    assert decode_ok(header, len(header)) == (0, 0, RAW) and counters.snapshot()["files_sent"] == 1


def refusal(messages: list[bytes]) -> str:
    (header,) = messages
    size, reason = decode_header(header, len(header))
    assert size is None
    return reason


def test_each_request_not_served_is_refused_with_its_reason_and_counted_by_why(tmp_path):
    def provide(key):
        if key == "0/raises":
            raise RuntimeError("tier gone")
        return None if key == "0/none" else str(tmp_path / "not-there")

    s, counters = provider(provide)
    assert refusal(ask(s, "0/none", tag=16)) == "owner could not stage the file"
    assert refusal(ask(s, "0/raises", tag=17)) == "provide failed: RuntimeError: tier gone"
    assert refusal(ask(s, "0/gone", tag=18)).startswith("owner cannot open its staged copy: ")
    assert counters.snapshot()["serve_failures"] == {"refused": 2, "open": 1}


def test_a_request_before_start_is_dropped_and_after_stop_accepting_refused(staged):
    engine = Engine()
    s = Provider(engine, PeerCounters({}), SimpleNamespace(chunk_size=4, window=2, peer_timeout=1.0))
    s.on_request(1, 16, "0/a")
    assert engine.sent == []  # the requester's timeout answers it
    s.start(lambda key: staged, 1)
    s.stop_accepting()
    assert refusal(ask(s, "0/a")) == "node is not serving"


def test_a_request_cancelled_while_it_was_staged_is_refused_and_counted(staged):
    staging = threading.Event()
    go = threading.Event()

    def provide(key):
        staging.set()
        go.wait(10)
        return staged

    s, counters = provider(provide)
    s.on_request(1, 16, "0/a")
    assert staging.wait(10)
    s.on_cancel(1, 16)
    go.set()
    assert s.wait_idle(10)
    assert refusal(s.engine.messages(1, 16)) == "cancelled by the requester"
    assert counters.snapshot()["serve_failures"] == {"cancelled": 1}


def test_a_short_read_sends_an_empty_chunk_the_requester_takes_as_abort(staged):
    class Short:
        """A staged copy whose size says 10 bytes but whose reads give fewer."""

        def __init__(self):
            self.f = open(staged, "rb")

        def fileno(self):
            return self.f.fileno()

        def read(self, n):
            return self.f.read(n)[:-1]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    s, counters = provider(lambda key: Short())
    header, empty = ask(s, "0/a")
    assert decode_ok(header, len(header))[0] == 10 and empty == b""
    assert counters.snapshot()["serve_failures"] == {"short_read": 1} and counters.snapshot()["files_sent"] == 0


def test_a_requester_that_takes_nothing_costs_one_peer_timeout(staged):
    s, counters = provider(lambda key: staged, Engine(stalled=True), window=1, peer_timeout=0.5)
    sent = ask(s, "0/a")
    assert len(sent) == 2  # the header and the first chunk: the window is full, nothing more
    assert counters.snapshot()["serve_failures"] == {"stalled": 1} and counters.snapshot()["files_sent"] == 0


def test_a_lost_requesters_transfer_stops_without_waiting_out_the_timeout(staged):
    s, counters = provider(lambda key: staged, Engine(stalled=True), window=1, peer_timeout=60.0)
    s.on_request(1, 16, "0/a")
    s.on_request(2, 16, "0/a")  # another requester's transfer is not stopped
    deadline = time.monotonic() + 10
    while len(s.engine.messages(1, 16)) < 2 or len(s.engine.messages(2, 16)) < 2:  # each window full
        assert time.monotonic() < deadline
        time.sleep(0.01)
    s.on_lost(1)
    assert not s.wait_idle(1.0)  # node 2's transfer still waits on its window
    s.on_lost(2)
    assert s.wait_idle(5)
    assert counters.snapshot()["serve_failures"] == {"lost": 2}
    s.shutdown()


def test_a_range_goes_as_a_file_of_its_own_and_a_bad_one_is_refused(staged):
    """("range", tag, key, offset, length): the span of the copy provide_range names, counted as
    a range; a negative or non-integer span, or one the owner cannot serve, is refused."""
    asked = []
    s, counters = provider(lambda key: None)
    s.provide_range = lambda key, offset, length: asked.append((key, offset, length)) or \
        (staged if offset + length <= 10 else None)
    s.on_range(1, 16, "0/a", 3, 5)
    assert s.wait_idle(10)
    header, *chunks = s.engine.messages(1, 16)
    assert decode_ok(header, len(header)) == (5, 5, RAW) and b"".join(chunks) == b"34567"
    for tag, offset, length in ((17, -1, 5), (18, 2, "5"), (19, 8, 5)):
        s.on_range(1, tag, "0/a", offset, length)
        assert s.wait_idle(10)
        assert refusal(s.engine.messages(1, tag))
    assert asked == [("0/a", 3, 5), ("0/a", 8, 5)]  # the malformed spans never reached it
    c = counters.snapshot()
    assert (c["ranges_sent"], c["files_sent"], c["bytes_sent"]) == (1, 0, 5)
    assert s.engine.messages(1, 19) and c["serve_failures"] == {"refused": 1}
