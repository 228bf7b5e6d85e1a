"""The block stager's pace (monarch/node/stage/read_pace.py): requests sized from the rate and round trip measured, on a link simulated on a clock of the test's."""

import heapq

from monarch.node.stage import read_pace
from monarch.node.stage.read_pace import READ_MIN, REQUESTS, WAIT, WINDOW, ReadPace

MiB = 1 << 20


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Link:
    """A PFS as the emulated one is: every request waits ``latency`` (in parallel), then its
    bytes take their turn on a wire of ``rate`` bytes/s (first come, first served), at most
    ``servers`` requests at once. The read-ahead keeps ``pace.blocks`` requests going; every
    ``probe_every`` s an application's read of ``probe`` bytes comes, and its wait beyond the
    latency and its own bytes is what the read-ahead cost it. ``turnaround``: the requester's time
    from a request's end to its next one (unseen in the requests' own times)."""

    def __init__(self, pace, clock, rate, latency=0.0, cost=0.0, servers=10_000, probe=4096, probe_every=0.01,
                 turnaround=0.0):
        self.pace, self.clock = pace, clock
        self.turnaround = turnaround
        self.rate, self.latency, self.cost, self.servers = rate, latency, cost, servers
        self.probe, self.probe_every = probe, probe_every
        self.wire_free = clock.now
        self.busy: list[float] = []  # when each server serving a request frees
        self.events: list = []       # (done, seq, bytes or None for a probe, issued)
        self.seq = 0
        self.running = 0
        self.waits: list[tuple[float, float]] = []  # (when, the application's read's wait)
        self.delivered = 0
        self.next_probe = clock.now

    def _issue(self, nbytes, probe=False):
        now = self.clock.now
        while self.busy and self.busy[0] <= now:
            heapq.heappop(self.busy)
        start = now if len(self.busy) < self.servers else heapq.heappop(self.busy)  # a free server
        on_wire = max(start + self.latency, self.wire_free)
        self.wire_free = on_wire + nbytes / self.rate
        done = self.wire_free + self.cost
        heapq.heappush(self.busy, done)
        self.seq += 1
        heapq.heappush(self.events, (done, self.seq, None if probe else nbytes, now))
        if not probe:
            self.running += 1

    def run(self, seconds, probes=True):
        end = self.clock.now + seconds
        while self.clock.now < end:
            while self.running < self.pace.blocks:
                self._issue(self.pace.request_bytes())
            if probes and self.next_probe <= self.events[0][0]:
                self.clock.now = max(self.clock.now, self.next_probe)
                self._issue(self.probe, probe=True)
                self.next_probe += self.probe_every
                continue
            done, _, nbytes, issued = heapq.heappop(self.events)
            self.clock.now = done
            if nbytes == -1:  # a turnaround's end: the requester asks again
                self.running -= 1
            elif nbytes is None:
                self.waits.append((done, done - issued - self.latency - self.probe / self.rate - self.cost))
            else:
                self.delivered += nbytes
                self.pace.delivered(nbytes, done - issued)
                self.seq += 1
                heapq.heappush(self.events, (done + self.turnaround, self.seq, -1, done))

    def mean_wait(self, since):
        waits = [w for t, w in self.waits if t >= since]
        return sum(waits) / len(waits)


def steady(rate, latency=0.0, cost=0.0, servers=10_000, warm=3.0, measured=2.0, block=MiB):
    """The read-ahead's rate and an application's mean wait behind it, after ``warm`` s."""
    clock = Clock()
    pace = ReadPace(block, clock)
    link = Link(pace, clock, rate, latency, cost, servers)
    link.run(warm)
    start, before = clock.now, link.delivered
    link.run(measured)
    return pace, (link.delivered - before) / (clock.now - start), link.mean_wait(start)


def test_before_the_link_is_measured_the_read_ahead_asks_little():
    pace = ReadPace(MiB, Clock())
    assert pace.rate is None and pace.latency is None
    assert pace.request_bytes() == READ_MIN and pace.blocks == REQUESTS


def test_the_link_is_filled_and_an_application_waits_a_few_milliseconds_behind_it():
    for rate in (50e6, 400e6):
        pace, got, wait = steady(rate)
        assert got > 0.9 * rate, (rate, got)
        assert wait < 2 * pace.wait, (rate, wait)
        assert pace.blocks == pace.requests
    pace, _, _ = steady(400e6)
    assert 256 << 10 < pace.request_bytes() < 320 << 10  # 3 ms of 400 MB/s, in four requests


def test_on_a_slow_link_an_application_waits_behind_half_as_much_in_two_requests():
    """At 50 MB/s a page fault behind 3 ms of read-ahead (twice for a window across two pages)
    costs more than direct's read-around of 128 KiB (2.6 ms): the read-ahead holds half as much,
    in two requests of the same size, and still fills the link."""
    pace, got, wait = steady(50e6)
    assert pace.requests == read_pace.SLOW_REQUESTS == 2 and pace.wait == WAIT / 2
    assert got > 0.9 * 50e6 and wait < WAIT, (got, wait)
    assert pace.in_flight_bytes < 50e6 * (pace.latency + WAIT) * 0.6
    fast, _, _ = steady(400e6)
    assert fast.requests == REQUESTS and fast.wait == WAIT


def test_a_round_trip_per_request_is_hidden_by_the_bytes_in_flight():
    """A PFS whose every read call costs 2 or 50 ms: the rate measured at first is the
    latency's, yet the read-ahead fills the link, and an application's read still waits only
    a few milliseconds behind it."""
    for latency in (0.002, 0.05):
        pace, got, wait = steady(400e6, latency)
        assert got > 0.85 * 400e6, (latency, got)
        assert wait < 2 * WAIT, (latency, wait)
        assert abs(pace.latency - latency) < 0.001


def test_a_server_that_serves_few_requests_at_once_is_filled_and_not_flooded():
    """Ten requests at once at 50 ms each (a server's threads): the rate stops growing with the
    bytes asked. The read-ahead alone keeps the ten busy; beside an application's reads, which
    take half of them, its requests do not keep the application's waiting for a round trip."""
    clock = Clock()
    pace = ReadPace(MiB, clock)
    link = Link(pace, clock, 400e6, 0.05, servers=10)
    link.run(5.0, probes=False)
    start, before = clock.now, link.delivered
    link.run(2.0, probes=False)
    assert (link.delivered - before) / (clock.now - start) > 0.8 * 10 * MiB / (0.05 + MiB / 400e6)
    _, _, wait = steady(400e6, 0.05, servers=10, warm=5.0)
    assert wait < 0.05 / 2


def test_each_request_costing_time_the_read_ahead_grows_from_the_smallest_to_fill_the_link():
    pace, got, wait = steady(400e6, cost=0.0015)
    assert got > 0.9 * 400e6
    assert pace.request_bytes() > 256 << 10
    assert wait < 2 * WAIT


def test_a_faster_link_reads_more_blocks_at_once_each_in_one_request():
    pace, got, _ = steady(4e9)
    assert got > 0.9 * 4e9
    assert pace.blocks > REQUESTS and 0.9 * MiB < pace.request_bytes() <= MiB
    fastest, _, _ = steady(40e9, warm=1.0, measured=0.5)
    assert fastest.blocks == read_pace.MAX_BLOCKS


def test_the_rate_is_the_most_of_the_recent_windows_and_forgets_older_ones():
    clock = Clock()
    pace = ReadPace(MiB, clock)
    Link(pace, clock, 400e6).run(1.0, probes=False)
    Link(pace, clock, 100e6).run(1.0, probes=False)  # the application takes most of the link for a second
    assert pace.rate > 390e6                            # small requests do not size smaller ones
    Link(pace, clock, 100e6).run(read_pace.KEPT * WINDOW + 0.2, probes=False)
    assert pace.rate < 110e6                            # but a link that stays slower is measured slower


def test_when_the_link_frees_up_the_read_ahead_grows_to_it_again():
    clock = Clock()
    pace = ReadPace(MiB, clock)
    Link(pace, clock, 50e6, 0.05).run(5.0)
    link = Link(pace, clock, 400e6, 0.05)
    link.run(3.0)
    start, before = clock.now, link.delivered
    link.run(1.0)
    assert (link.delivered - before) / (clock.now - start) > 0.85 * 400e6


def test_time_without_work_is_not_measured_as_a_slow_link():
    clock = Clock()
    pace = ReadPace(MiB, clock)
    Link(pace, clock, 400e6).run(0.5, probes=False)
    rate, in_flight = pace.rate, pace.in_flight_bytes
    pace.idle()
    clock.now += 5.0  # nothing to stage for 5 s
    Link(pace, clock, 400e6).run(WINDOW * 1.5, probes=False)
    assert pace.rate >= rate * 0.98 and min(pace._windows) > 380e6
    assert pace.in_flight_bytes >= in_flight * 0.9


def test_a_long_round_trip_lets_a_mappings_faults_read_around_from_the_first_request():
    """A fault reads a page (MADV_RANDOM) on a quick link, the kernel's read-around on one whose
    round trip is READAROUND or more: said once the first window measured the rate, and not
    for a slow link whose requests take long for their bytes."""
    for rate, latency, around in ((400e6, 0.0, False), (400e6, 0.002, False), (400e6, 0.006, True),
                                  (400e6, 0.05, True), (2e6, 0.0, False), (2e6, 0.05, True)):
        clock = Clock()
        pace = ReadPace(MiB, clock)
        Link(pace, clock, rate, latency).run(2 * WINDOW + 2 * latency, probes=False)
        assert pace.readaround == around and pace.state()["readaround"] == around, (rate, latency)
    pace = ReadPace(MiB, Clock())
    pace.delivered(READ_MIN, 0.05)
    assert pace.latency == 0.05 and not pace.readaround  # (no rate yet: a slow link's, or a round trip?)
    assert read_pace.READAROUND == 0.005


def test_yielding_to_a_reader_of_records_one_small_request_waits_ahead_of_its_reads_and_measures_nothing():
    """A random reader of records (an LMDB's 64 KiB values) waits for its faults one after the
    other: while its file stages the read-ahead holds one request of YIELD_REQUEST, so a read
    waits behind at most that, and what those requests deliver says nothing of the link."""
    clock = Clock()
    pace = ReadPace(MiB, clock)
    link = Link(pace, clock, 400e6, probe=128 << 10, probe_every=0.002)  # a read-around every 2 ms
    link.run(3.0)
    full_wait, rate = link.mean_wait(clock.now - 1.0), pace.rate
    pace.yield_to_records(True)
    assert pace.blocks == 1 and pace.request_bytes() == read_pace.YIELD_REQUEST
    start = clock.now
    link.run(2.0)
    yielded_wait = link.mean_wait(start + 0.1)
    assert yielded_wait < read_pace.YIELD_REQUEST / 400e6 + 1e-6 < full_wait / 4, (yielded_wait, full_wait)
    assert pace.rate == rate and pace.state()["yielding"]  # the yielded link is not measured
    pace.yield_to_records(False)
    assert pace.blocks >= REQUESTS and pace.request_bytes() > read_pace.YIELD_REQUEST


def test_a_yielding_request_the_applications_reads_held_back_is_followed_by_a_pause():
    """LEDBAT's rule: held back beyond YIELD_TARGET (the application's reads fill the link: an
    LMDB's gets at 50 MB/s), the read-ahead waits YIELD_GAIN times the excess; held back less
    (at 400 MB/s a fault rarely holds a request 1 ms), it goes on at once."""
    pace = ReadPace(MiB, Clock())
    assert pace.yield_pause() == 0.0  # not yielding: never
    pace.yield_to_records(True)
    alone = read_pace.YIELD_REQUEST / 50e6  # its bytes' time alone on a 50 MB/s link
    pace.delivered(read_pace.YIELD_REQUEST, alone)
    assert pace.yield_pause() == 0.0
    pace.delivered(read_pace.YIELD_REQUEST, alone + 0.0005)  # a page fault ahead of it
    assert pace.yield_pause() == 0.0
    pace.delivered(read_pace.YIELD_REQUEST, alone + 0.0026)  # a read-around of 128 KiB ahead of it
    assert abs(pace.yield_pause() - read_pace.YIELD_GAIN * (0.0026 - read_pace.YIELD_TARGET)) < 1e-9
    pace.delivered(read_pace.YIELD_REQUEST, alone + 1.0)
    assert pace.yield_pause() == read_pace.YIELD_PAUSE_MAX
    pace.delivered(4096, 0.00001)  # a file's short last request: no measure of the link
    assert pace.yield_pause() == read_pace.YIELD_PAUSE_MAX
    pace.yield_to_records(False)
    assert pace.yield_pause() == 0.0


def test_alone_on_a_slow_link_four_requests_keep_it_full_across_each_requests_turnaround():
    """A whole-file reader in small calls reads the copy as blocks land: no read of its queues
    behind the read-ahead. On a slow link two requests, each turned around in about its own
    time (a daemon's and a FUSE server's threads on a busy node), left the link part idle; alone
    on it the read-ahead keeps four and ALONE_WAIT of the link in flight and fills it. Back off it,
    the very next request is small again."""
    def run(alone):
        clock = Clock()
        pace = ReadPace(MiB, clock)
        pace.alone_on_link(alone)
        link = Link(pace, clock, 50e6, turnaround=0.0012)
        link.run(3.0, probes=False)
        start, before = clock.now, link.delivered
        link.run(2.0, probes=False)
        return pace, (link.delivered - before) / (clock.now - start)

    shared, shared_rate = run(False)
    alone, alone_rate = run(True)
    assert shared.requests == read_pace.SLOW_REQUESTS and shared_rate < 0.9 * 50e6, shared_rate
    assert alone.requests == REQUESTS and alone.wait == read_pace.ALONE_WAIT
    assert alone_rate > 0.97 * 50e6, alone_rate
    assert alone.request_bytes() > 96 << 10 and alone.state()["alone"]
    alone.alone_on_link(False)  # an application's read of the PFS came
    assert alone.blocks == read_pace.SLOW_REQUESTS and alone.request_bytes() <= shared.request_bytes() + 4096
    assert alone.in_flight_bytes < 50e6 * (alone.latency + WAIT)


def test_leaving_the_link_alone_early_keeps_a_long_round_trips_slow_start():
    """The read-ahead starts alone (the application has not read yet), then the application maps
    the file: on a round trip of 50 ms the first window's rate is the round trip's, and cutting the
    bytes in flight to a bound made of it ended the slow start (the copy beside a reader: 8.1-8.6 s
    where it took 6.1). Not yet found full, the probe goes on: the link is filled as quickly as
    without the switch."""
    def delivered(switch):
        clock = Clock()
        pace = ReadPace(MiB, clock)
        pace.alone_on_link(switch)
        link = Link(pace, clock, 400e6, 0.05)
        link.run(0.12, probes=False)
        pace.alone_on_link(False)
        link.run(1.5, probes=False)
        return link.delivered

    assert delivered(True) >= 0.98 * delivered(False)  # (the simulated clock: no noise; cut, 0.89)
