"""The stager's adaptive concurrency (monarch/node/stage/concurrency.py) on simulated sources, with
the clock injected: it stops where the rate stops growing and comes back down (with
``staging.threads: auto``, a source that saturates at 4 copies is staged with 4, not 256)."""

import collections
import random

from monarch.node.stage.concurrency import Concurrency


class Source:
    """Copies finish at ``per_copy`` copies/s each, up to ``saturation`` at once (more wait in
    line: the rate is flat beyond it); the rate is disturbed by +-``noise`` over stretches of
    0.1-0.5 s (other processes on the cores, the walk, a collection pause)."""

    def __init__(self, saturation: int, per_copy: float = 250.0, noise: float = 0.2, seed: int = 0):
        self.saturation, self.per_copy, self.noise = saturation, per_copy, noise
        self.now = 0.0
        self._rnd = random.Random(seed)
        self._factor, self._change = 1.0, 0.0
        self.time_at = collections.Counter()  # seconds spent at each limit

    def run(self, c: Concurrency, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            if self.now >= self._change:
                self._factor = 1 + self._rnd.uniform(-self.noise, self.noise)
                self._change = self.now + self._rnd.uniform(0.1, 0.5)
            rate = self.per_copy * min(c.limit, self.saturation) * self._factor
            self.now += 1 / rate
            self.time_at[c.limit] += 1 / rate
            c.completed(c.limit / rate)  # Little's law: in flight / rate


def share(time_at: collections.Counter, pred) -> float:
    return sum(v for k, v in time_at.items() if pred(k)) / sum(time_at.values())


def test_a_source_that_saturates_at_4_is_staged_with_4_not_256():
    # noise must not keep a doubling: a rule comparing one window against the best single window,
    # probing only upward, ends every one of these runs at 256, about half of the time there
    for seed in range(3):
        src = Source(saturation=4, seed=seed)
        c = Concurrency(clock=lambda: src.now)
        src.run(c, 200.0)  # minutes, as staging a million files takes
        assert c.limit in (4, 8), (seed, c.limit)  # 8: a round's probe of twice the limit
        # a lucky stretch may still pass for a gain, but it is measured again and undone
        assert max(src.time_at) <= 64 and share(src.time_at, lambda k: k > 8) < 0.2, (seed, src.time_at)
        assert share(src.time_at, lambda k: k == 4) > 0.6, (seed, src.time_at)


def test_started_deep_it_comes_back_down():
    src = Source(saturation=4, noise=0.05)
    c = Concurrency(start=64, clock=lambda: src.now)  # a sharded node starts deep toward the PFS
    src.run(c, 30.0)
    assert c.limit in (4, 8)


def test_it_climbs_while_more_copies_pay_and_comes_back_when_they_stop_paying():
    src = Source(saturation=64, noise=0.05)
    c = Concurrency(clock=lambda: src.now)
    src.run(c, 30.0)
    assert c.limit in (64, 128)  # 128: a round's probe above the plateau
    src.saturation = 4  # the source's latency changed: more copies no longer pay
    src.run(c, 60.0)
    assert c.limit in (4, 8)


def test_fixed_limits_and_starved_windows_do_not_move_it():
    assert Concurrency(fixed=5).limit == 5
    now = [0.0]
    c = Concurrency(clock=lambda: now[0])
    for _ in range(500):
        now[0] += 0.01
        c.starved()
        c.completed(0.01)
    assert c.limit == 8 and c.state()["windows_judged"] == 0


def test_a_high_latency_source_is_hidden_within_a_second():
    # 50 ms per open, a source that serves 256 at once (the emulated PFS): a doubling per 0.75 s
    # would take 3 s from 8 to 128, most of an epoch of 800 files; the slow start doubles per
    # generation of copies while their latency stays flat
    for latency in (0.05, 0.2):
        src = Source(saturation=256, per_copy=1 / latency, noise=0.05)
        c = Concurrency(clock=lambda: src.now)
        src.run(c, 5 * latency)
        assert c.limit >= 64, (latency, c.limit, c.state())
        src.run(c, 30.0)
        assert c.limit >= 128, (latency, c.limit, c.state())


def test_the_slow_start_stops_where_the_source_saturates():
    src = Source(saturation=32, per_copy=20.0, noise=0.05)  # 50 ms a copy, 32 at once at most
    c = Concurrency(clock=lambda: src.now)
    src.run(c, 1.0)
    assert 32 <= c.state()["peak"] <= 64 and c.limit in (32, 64), c.state()
    src.run(c, 60.0)
    assert c.limit in (32, 64), c.state()
