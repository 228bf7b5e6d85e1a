"""scripts/cpuwatch.py counts a process's CPU between two marks in nanoseconds, not ticks.

bench_cluster's steady epochs last a few hundredths of a second; in clock ticks (10 ms) four
daemons' CPU there was known to +-40 ms, more than they used. A child burns a known 34.9 ms
of CPU between two marks: in ticks that reads 30 or 40 ms (4.9 ms off or more), in
nanoseconds within a fraction of a millisecond.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from cpuwatch import CpuWatch  # noqa: E402

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


def test_a_process_cpu_between_two_marks_is_counted_in_nanoseconds():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        watch = CpuWatch()
        watch.mark("a")
        child.stdin.write("\n")
        child.stdin.flush()
        burnt = float(child.stdout.readline())
        watch.mark("b")
        counted = watch.between("a", "b")["other"]
        assert abs(counted - burnt) < 0.003, (counted, burnt)
    finally:
        child.kill()
        child.wait()
