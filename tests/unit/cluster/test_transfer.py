"""One file's transfer between two daemons (monarch/cluster/transfer.py): the header's framing,
the chunks, and the receiving side's window, refusal and abort, driven by a fake engine (no MPI)."""

from __future__ import annotations

import pytest

from monarch.cluster.transfer import (HEADER, HEADER_MAX, OK, RAW, ZSTD, Incoming, chunk_count, chunk_len,
                                      decode_header, decode_ok, encode_ok, encode_refusal)


def test_an_accepted_header_carries_the_wire_size_the_file_size_and_the_encoding():
    buf = encode_ok(300, 1000, ZSTD)
    assert len(buf) == OK.size == 17
    assert decode_header(buf, len(buf)) == (300, None)
    assert decode_ok(buf, len(buf)) == (300, 1000, ZSTD)
    assert decode_ok(encode_ok(42), OK.size) == (42, 42, RAW)  # stored raw: the file crosses as it is
    assert decode_ok(HEADER.pack(42), HEADER.size) == (42, 42, RAW)  # a bare size: raw bytes of that size


def test_a_refusal_is_a_negative_size_and_its_reason_cut_to_what_a_header_receive_holds():
    buf = encode_refusal("no room in any tier")
    assert decode_header(buf, len(buf)) == (None, "no room in any tier")
    long = encode_refusal("x" * 10_000)
    assert len(long) == HEADER_MAX
    size, reason = decode_header(long, len(long))
    assert size is None and reason == "x" * (HEADER_MAX - HEADER.size)


@pytest.mark.parametrize("size, chunk, lens", [(0, 4, []), (4, 4, [4]), (10, 4, [4, 4, 2]), (3, 4, [3])])
def test_a_file_goes_in_chunks_of_the_chunk_size_the_last_shorter(size, chunk, lens):
    assert chunk_count(size, chunk) == len(lens)
    assert [chunk_len(i, size, chunk) for i in range(chunk_count(size, chunk))] == lens


class Status:
    def __init__(self, count: int, cancelled: bool = False):
        self.count, self.cancelled = count, cancelled

    def Get_count(self, datatype):
        return self.count

    def Is_cancelled(self):
        return self.cancelled


class Request:
    def __init__(self, buf: bytearray, tag: int):
        self.buf, self.tag, self.cancelled = buf, tag, False

    def Cancel(self):
        self.cancelled = True


class FakeEngine:
    """The engine's part Incoming uses: receives posted with their completion, objects sent."""

    class MPI:
        BYTE = "byte"

    def __init__(self):
        self.comm = self
        self.posted: list[tuple[Request, object]] = []
        self.sent: list[tuple[tuple, int]] = []

    def Irecv(self, spec, source, tag):
        return Request(spec[0], tag)

    def post(self, req, on_done):
        self.posted.append((req, on_done))

    def send_obj(self, msg, dest):
        self.sent.append((msg, dest))

    def complete(self, data: bytes | None = None, count: int | None = None, cancelled: bool = False):
        """The oldest posted receive completes with ``data`` (its count that of ``data``)."""
        req, on_done = self.posted.pop(0)
        if data is not None:
            req.buf[:len(data)] = data
        on_done(Status(len(data or b"") if count is None else count, cancelled))
        return req


def incoming(engine: FakeEngine, chunk: int = 4, window: int = 2):
    done, heard = [], []
    inc = Incoming(engine, 1, "0/a", chunk, window, done.append, heard.append)
    inc.begin(16)
    return inc, done, heard


def events(inc: Incoming) -> list:
    out = []
    while not inc.events.empty():
        out.append(inc.events.get())
    return out


def test_a_file_arrives_in_order_with_no_more_than_the_window_in_flight():
    engine = FakeEngine()
    inc, done, heard = incoming(engine)
    assert engine.sent == [(("req", 16, "0/a"), 1)] and len(engine.posted) == 1
    engine.complete(encode_ok(10))
    assert events(inc) == [("header", 10, 10, RAW)]
    assert [len(r.buf) for r, _ in engine.posted] == [4, 4]  # the window: two chunks posted, not three
    engine.complete(b"abcd")
    inc.credit()  # the fetcher wrote chunk 0: chunk 2 may be posted
    assert [len(r.buf) for r, _ in engine.posted] == [4, 2]
    engine.complete(b"efgh")
    assert done == []
    engine.complete(b"ij")
    got = events(inc)
    assert [e[1] for e in got] == [0, 1, 2]
    assert b"".join(bytes(e[2][:e[3]]) for e in got) == b"abcdefghij"
    assert done == [inc] and inc.done and heard == [1, 1, 1, 1]  # the header and each chunk: the owner lives


def test_a_refused_file_frees_its_tag_at_once():
    engine = FakeEngine()
    inc, done, _ = incoming(engine)
    engine.complete(encode_refusal("not staged: no room"))
    assert events(inc) == [("refused", "not staged: no room")] and done == [inc] and engine.posted == []


def test_an_empty_file_is_done_with_its_header():
    engine = FakeEngine()
    inc, done, _ = incoming(engine)
    engine.complete(encode_ok(0))
    assert events(inc) == [("header", 0, 0, RAW)] and done == [inc] and engine.posted == []


def test_a_short_chunk_aborts_cancels_the_rest_and_frees_the_tag_once_they_are_gone():
    engine = FakeEngine()
    inc, done, _ = incoming(engine, window=3)
    engine.complete(encode_ok(12))
    events(inc)
    engine.complete(b"", count=0)  # the owner failed mid-file: an empty chunk
    assert inc.aborted and [r.cancelled for r, _ in engine.posted] == [True, True]
    assert done == []  # two receives still posted: the tag is not free yet
    engine.complete(cancelled=True)
    engine.complete(cancelled=True)
    assert done == [inc] and [e[0] for e in events(inc)] == ["chunk"]


def test_a_fetcher_that_gives_up_says_cancel_and_drains_what_is_under_way():
    engine = FakeEngine()
    inc, done, _ = incoming(engine, window=2)
    engine.complete(encode_ok(12))
    events(inc)
    inc.abandon()
    inc.abandon()  # said once
    assert engine.sent[1:] == [(("cancel", 16), 1)]
    for data in (b"abcd", b"efgh", b"ijkl"):  # drained, not handed to the fetcher
        engine.complete(data)
    assert events(inc) == [] and done == [inc] and engine.posted == []


def test_a_lost_owner_stops_the_wait_at_once():
    engine = FakeEngine()
    inc, done, _ = incoming(engine)
    engine.complete(encode_ok(10))
    events(inc)
    inc.lost("no heartbeat")
    inc.lost("no heartbeat")
    assert events(inc) == [("lost", "no heartbeat")] and done == [inc] and inc.in_flight == {}
