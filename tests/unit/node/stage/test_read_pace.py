"""The block stager's pace (monarch/node/stage/read_pace.py): requests sized from the rate measured, on a clock of the test's."""

from monarch.node.stage import read_pace
from monarch.node.stage.read_pace import READ_MIN, REQUESTS, WAIT, WINDOW, ReadPace

MiB = 1 << 20


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def deliver(pace, clock, rate, seconds, request=None):
    """The link delivers ``rate`` bytes/s to the read-ahead for ``seconds``, in its requests."""
    end = clock.now + seconds
    while clock.now < end:
        n = request or pace.request_bytes()
        took = n / rate
        clock.now += took
        pace.delivered(n, took)


def test_before_the_link_is_measured_the_read_ahead_asks_little():
    pace = ReadPace(MiB, Clock())
    assert pace.rate is None
    assert pace.request_bytes() == READ_MIN and pace.blocks == REQUESTS


def test_the_bytes_in_flight_are_a_few_milliseconds_of_the_measured_rate():
    clock = Clock()
    pace = ReadPace(MiB, clock)
    deliver(pace, clock, 400e6, 1.0)
    assert abs(pace.rate - 400e6) < 400e6 * 0.02
    # 3 ms of 400 MB/s in four requests: an application's read waits behind about 3 ms of them
    assert pace.blocks == REQUESTS
    assert pace.request_bytes() == int(WAIT * pace.rate) // REQUESTS // 4096 * 4096
    assert 256 << 10 < pace.request_bytes() < 320 << 10
    slow = ReadPace(MiB, clock)
    deliver(slow, clock, 50e6, 1.0)
    assert slow.request_bytes() == 36 << 10  # 3 ms of 50 MB/s in four requests: 37.5 KB each, in pages


def test_a_faster_link_reads_more_blocks_at_once_each_in_one_request():
    clock = Clock()
    pace = ReadPace(MiB, clock)
    deliver(pace, clock, 4e9, 0.5)
    assert pace.blocks == -(-int(WAIT * pace.rate) // MiB) > REQUESTS
    assert 0.9 * MiB < pace.request_bytes() <= MiB
    fastest = ReadPace(MiB, clock)
    deliver(fastest, clock, 40e9, 0.5)
    assert fastest.blocks == read_pace.MAX_BLOCKS


def test_the_rate_is_the_most_of_the_recent_windows_and_forgets_older_ones():
    clock = Clock()
    pace = ReadPace(MiB, clock)
    deliver(pace, clock, 400e6, 0.5)
    deliver(pace, clock, 100e6, 1.0)  # the application takes most of the link for a second
    assert pace.rate > 390e6           # small requests do not size smaller ones
    deliver(pace, clock, 100e6, read_pace.KEPT * WINDOW + 0.2)
    assert pace.rate < 110e6           # but a link that stays slower is measured slower


def test_time_without_work_is_not_measured_as_a_slow_link():
    clock = Clock()
    pace = ReadPace(MiB, clock)
    deliver(pace, clock, 400e6, 0.5)
    rate = pace.rate
    pace.idle()
    clock.now += 5.0  # nothing to stage for 5 s
    deliver(pace, clock, 400e6, WINDOW * 1.5)
    assert pace.rate >= rate * 0.98 and min(pace._windows) > 390e6


def test_the_read_ahead_grows_from_the_smallest_requests_to_the_link_when_each_request_costs_time():
    """A request costs 2 ms besides its bytes (the client's and the server's work): the rate
    measured through small requests is low, yet the requests grow until the link is full."""
    clock = Clock()
    pace = ReadPace(MiB, clock)
    link, gap = 400e6, 0.0015
    while clock.now < 101.5:  # REQUESTS requests at once, each its bytes' time plus the gap
        n = pace.request_bytes()
        took = max(n / link + gap, REQUESTS * n / link)
        clock.now += took / REQUESTS
        pace.delivered(n, took)
    assert pace.rate > 0.9 * link
    assert pace.request_bytes() > 256 << 10
