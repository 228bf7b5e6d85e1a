"""Every process a benchmark's job starts, and their CPU-seconds by phase (bench_cluster.py).

A thread samples this process's descendants (launchers, mpiexec and its proxies, daemons,
readers, the emulated PFS) every ``period`` seconds with psutil, keeping each one's last
figure, so a process that has ended still counts what it used up to its last sample (its
last ``period`` at most is missed: the whole job's figure comes from the kernel's own
account of the reaped children, ``children_cpu``). ``mark(name)`` records the total at a
moment (the readers start, epoch 1 ends, the readers end); ``between(a, b)`` is the CPU of
every process in between, ``by_kind`` splits it by what the processes are.
"""

from __future__ import annotations

import os
import resource
import threading
import time

import psutil


def children_cpu() -> float:
    """CPU-seconds (user + system) of every descendant reaped so far (their descendants too)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def kind_of(cmdline: list[str]) -> str:
    """What a process of the job is, from its command line."""
    line = " ".join(cmdline)
    exe = os.path.basename(cmdline[0]) if cmdline else ""
    if any(name in exe for name in ("mpiexec", "hydra", "mpirun", "prterun", "prted", "orted")):
        return "mpiexec"
    if "serve" in cmdline and "monarch" in line:
        return "daemons"
    if "support.shard_reader" in line and "run" in cmdline and "monarch" in line:
        return "launchers"  # monarch run -- reader: the launcher (its reader is its child)
    if "support.shard_reader" in line:
        return "readers"
    if "slowpfs" in line or "mfusepy" in line or "fuse" in line:
        return "pfs"
    return "other"


class CpuWatch:
    def __init__(self, period: float = 0.05, pfs_pid: int | None = None):
        self.period = period
        self.me = psutil.Process(os.getpid())
        self.pfs_pid = pfs_pid
        self.last: dict[int, tuple[str, float]] = {}  # pid -> (kind, cpu-seconds at its last sample)
        self.marks: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "CpuWatch":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def sample(self) -> None:
        try:
            procs = self.me.children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    cpu = t.user + t.system
                    known = self.last.get(p.pid)
                    kind = known[0] if known else ("pfs" if p.pid == self.pfs_pid else kind_of(p.cmdline()))
            except psutil.Error:
                continue
            with self._lock:
                self.last[p.pid] = (kind, max(cpu, known[1] if known else 0.0))

    def mark(self, name: str) -> None:
        """The CPU of every process so far, by kind, as it is now."""
        self.sample()
        with self._lock:
            out: dict[str, float] = {}
            for kind, cpu in self.last.values():
                out[kind] = out.get(kind, 0.0) + cpu
        self.marks[name] = out

    def between(self, a: str, b: str) -> dict[str, float]:
        """CPU-seconds by kind between two marks (a process born in between counts from 0)."""
        first, second = self.marks.get(a, {}), self.marks.get(b, {})
        return {k: round(second.get(k, 0.0) - first.get(k, 0.0), 3) for k in second}


def wait_marks(watch: CpuWatch, started: list[str], progress: list[str], procs, stop: threading.Event) -> None:
    """Mark "reading" once every reader made its ``started`` file and "epoch1" once every one
    finished its first epoch (a line in its ``progress`` file); ends with ``stop`` or the readers."""
    def all_have(paths: list[str], line: bool) -> bool:
        try:
            return all(os.path.exists(p) and (not line or open(p).read().strip()) for p in paths)
        except OSError:
            return False

    for name, paths, line in (("reading", started, False), ("epoch1", progress, True)):
        while not all_have(paths, line):
            if stop.is_set() or all(p.poll() is not None for p in procs):
                return
            time.sleep(0.01)
        watch.mark(name)
