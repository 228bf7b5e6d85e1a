"""The timeline: per-interval counts from cumulative counters, bounded by merging neighbours."""

import pytest

from monarch.report.timeline import Timeline, combine_timelines


def test_counts_per_interval_and_gauges_as_levels():
    tl = Timeline(start=100.0)
    tl.add(101.0, {"bytes.ram": 10, "opens.ram": 1}, {"ram": 10})
    tl.add(102.0, {"bytes.ram": 25, "opens.ram": 3}, {"ram": 25})
    tl.add(103.0, {"bytes.ram": 25, "opens.ram": 3, "bytes.peer": 7}, {"ram": 25})  # a source appears late
    d = tl.to_dict()
    assert d["t"] == [1.0, 2.0, 3.0] and d["interval"] == 1.0 and d["start"] == 100.0
    assert d["series"]["bytes.ram"] == [10, 15, 0]
    assert d["series"]["opens.ram"] == [1, 2, 0]
    assert d["series"]["bytes.peer"] == [0, 0, 7]
    assert d["series"]["used.ram"] == [10, 25, 25]


def test_a_long_job_stays_bounded_and_keeps_its_totals():
    tl = Timeline(start=0.0, max_points=100)
    total, now = 0, 0.0
    while now < 1000:  # as the sampler does: one sample per (growing) interval
        now += tl.interval
        total += int(now)
        tl.add(now, {"bytes.ram": total}, {"ram": int(now)})
    d = tl.to_dict()
    assert 50 <= len(d["t"]) <= 100
    assert sum(d["series"]["bytes.ram"]) == total  # merging sums counts: nothing lost
    assert d["t"][-1] == now and d["series"]["used.ram"][-1] == int(now)  # the later gauge is kept
    assert d["interval"] >= 8.0  # sampled less often as the job grows
    steps = {round(b - a, 3) for a, b in zip(d["t"], d["t"][1:])}
    assert len(steps) == 1  # evenly spaced


def test_time_going_backwards_is_ignored():
    tl = Timeline(start=10.0)
    tl.add(11.0, {"bytes.ram": 5}, {})
    tl.add(10.5, {"bytes.ram": 9}, {})
    assert tl.to_dict()["series"]["bytes.ram"] == [5]


def test_nodes_combine_on_one_grid():
    a = {"start": 100.0, "interval": 1.0, "t": [1.0, 2.0], "series": {"bytes.ram": [4, 6], "used.ram": [4, 10]}}
    b = {"start": 101.0, "interval": 1.0, "t": [1.0, 2.0], "series": {"bytes.ram": [1, 1], "used.ram": [1, 2]}}
    c = combine_timelines([a, b])
    assert c["start"] == 100.0 and c["t"] == [1.0, 2.0, 3.0]
    assert c["series"]["bytes.ram"] == [4, 7, 1]
    assert sum(c["series"]["bytes.ram"]) == 12
    assert c["series"]["used.ram"] == [4, 11, 12]  # levels summed over nodes, held between samples
    assert combine_timelines([a]) is a


def test_too_small_a_timeline_is_refused():
    with pytest.raises(ValueError):
        Timeline(0.0, max_points=1)
