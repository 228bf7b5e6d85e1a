"""scripts/benchkit/cpuwatch.py counts a process's CPU between two marks in nanoseconds, not ticks.

bench_cluster's steady epochs last a few hundredths of a second; in clock ticks (10 ms) four
daemons' CPU there was known to +-40 ms, more than they used. A child burns a known 34.9 ms
of CPU between two marks: in ticks that reads 30 or 40 ms (4.9 ms off or more), in
nanoseconds within a fraction of a millisecond.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from benchkit.cpuwatch import CpuWatch, wait_marks  # noqa: E402

BURN = 0.0349
CHILD = f"""
import sys, time
print("ready", flush=True)
sys.stdin.readline()
t0 = time.process_time()
while time.process_time() - t0 < {BURN}:
    pass
print(time.process_time() - t0, flush=True)
sys.stdin.readline()
"""


def burnt_between_marks(program: str) -> tuple[CpuWatch, float]:
    """A child running ``program`` burns CPU between marks "a" and "b": the watch, and the
    CPU-seconds the child says it burnt."""
    child = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        watch = CpuWatch()
        watch.mark("a")
        child.stdin.write("\n")
        child.stdin.flush()
        burnt = float(child.stdout.readline())
        watch.mark("b")
        return watch, burnt
    finally:
        child.kill()
        child.wait()


def test_a_process_cpu_between_two_marks_is_counted_in_nanoseconds():
    watch, burnt = burnt_between_marks(CHILD)
    counted = watch.between("a", "b")["other"]
    assert abs(counted - burnt) < 0.003, (counted, burnt)


def named_thread(name: str, body: str) -> str:
    """A child program whose thread ``name`` runs ``body`` (lines indented by 4, printing one
    figure) between the marks, and stays alive until the second."""
    return f"""
import sys, threading, time
go, done = threading.Event(), threading.Event()
def work():
    go.wait()
{body}
    done.wait()
t = threading.Thread(target=work)
t.start()
open(f"/proc/self/task/{{t.native_id}}/comm", "w").write("{name}")
print("ready", flush=True)
sys.stdin.readline()
go.set()
sys.stdin.readline()
done.set()
"""


NAMED = named_thread("monarch-burn", f"""    t0 = time.thread_time()
    while time.thread_time() - t0 < {BURN}:
        pass
    print(time.thread_time() - t0, flush=True)""")


def test_the_cpu_between_two_marks_by_thread_name():
    # bench_cluster prints where the daemons' CPU goes per thread (monarch-data, monarch-peerahd, ...)
    watch, burnt = burnt_between_marks(NAMED)
    threads = watch.by_thread("a", "b", "other")
    assert abs(threads.get("monarch-burn", 0.0) - burnt) < 0.003, (threads, burnt)


SLEEPS = 200
NAPPER = named_thread("monarch-nap", f"""    for _ in range({SLEEPS}):
        time.sleep(0.0005)
    print(0, flush=True)""")


def test_the_wake_ups_between_two_marks_by_thread_name():
    # a thread that polls pays per wake-up whatever it finds: bench_cluster prints them per file
    watch, _ = burnt_between_marks(NAPPER)
    runs = watch.by_thread("a", "b", "other", runs=True)
    assert SLEEPS <= runs.get("monarch-nap", 0) <= SLEEPS + 20, runs


class _Running:
    def poll(self):
        return None


def test_the_epochs_end_once_every_reader_ended_its_last_not_when_the_launchers_do(tmp_path):
    """bench_cluster's epochs after the first end at the "epochs" mark, made once every reader
    wrote its last epoch's line: the readers' exit and their launchers' reports after it are a
    tear-down of their own. The readers' hold is made at "epoch1", or they would wait for ever."""
    started = [tmp_path / f"r{k}.started" for k in range(2)]
    progress = [tmp_path / f"r{k}.progress" for k in range(2)]
    hold = tmp_path / "epoch1.marked"
    marked: list[str] = []
    watch = type("Watch", (), {"mark": lambda self, name: marked.append(name)})()
    stop = threading.Event()
    t = threading.Thread(target=wait_marks, args=(watch, [str(p) for p in started], [str(p) for p in progress],
                                                  [_Running()], stop, str(hold), 3), daemon=True)
    t.start()

    def settles(want: list[str]) -> bool:
        deadline = time.monotonic() + 5
        while marked != want and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # and no mark more
        return marked == want

    for p in started:
        p.write_text("")
    assert settles(["reading"])
    progress[0].write_text("0\n")
    assert settles(["reading"]) and not hold.exists()
    progress[1].write_text("0\n")
    assert settles(["reading", "epoch1"]) and hold.exists()
    progress[0].write_text("0\n1\n2\n")
    progress[1].write_text("0\n1\n")
    assert settles(["reading", "epoch1"])
    progress[1].write_text("0\n1\n2\n")
    assert settles(["reading", "epoch1", "epochs"])
    t.join(5)
    assert not t.is_alive()
