"""Every process a benchmark's job starts, and their CPU-seconds by phase (bench_cluster.py).

A thread samples this process's descendants (launchers, mpiexec and its proxies, daemons,
readers, the emulated PFS) every ``period`` seconds with psutil, keeping each one's last
figure, so a process that has ended still counts what it used up to its last sample (its
last ``period`` at most is missed: the whole job's figure comes from the kernel's own
account of the reaped children, ``children_cpu``). ``mark(name)`` records the total at a
moment (the readers start, epoch 1 ends, the readers end); ``between(a, b)`` is the CPU of
every process in between, ``by_kind`` splits it by what the processes are.

The kernel's per-process figures (psutil's) come in clock ticks, 10 ms: in a steady epoch of
0.05 s, four daemons' CPU would be known to +-40 ms, more than all they use. So a mark also
reads each thread's own account in nanoseconds (``/proc/PID/task/TID/schedstat``), and
``between`` counts in nanoseconds a process whose threads all lived through both marks; one
born or ended in between, or with a thread ended, counts in ticks as before.
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


def thread_ns(pid: int, names: dict[str, str] | None = None, runs: dict[str, int] | None = None) -> dict[str, int]:
    """Each thread's CPU-nanoseconds so far, by thread id ({} if the process is gone); each
    thread's name (its comm: ``monarch-data``, ``monarch-peerahd``, ...) into ``names``; how
    many times each was put on a CPU (a wake-up, mostly: a poll's sleep costs one) into ``runs``."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                stat = f.read().split()
            out[tid] = int(stat[0])
            if runs is not None:
                runs[tid] = int(stat[2])
            if names is not None:      # read at every mark: thread ids are reused once pids wrap
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    names[tid] = f.read().strip()
        except (OSError, ValueError, IndexError):
            pass  # ended meanwhile
    return out


class CpuWatch:
    def __init__(self, period: float = 0.05, pfs_pid: int | None = None):
        self.period = period
        self.me = psutil.Process(os.getpid())
        self.pfs_pid = pfs_pid
        self.last: dict[int, tuple[str, float]] = {}  # pid -> (kind, cpu-seconds at its last sample)
        self.marks: dict[str, dict[str, float]] = {}
        self.ticks: dict[str, dict[int, float]] = {}  # mark -> pid -> its figure in ticks then
        self.threads: dict[str, dict[int, dict[str, int]]] = {}  # mark -> pid -> tid -> CPU-ns
        self.runs: dict[str, dict[str, int]] = {}  # mark -> tid -> times put on a CPU
        self.names: dict[str, str] = {}  # tid -> the thread's name
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
        with self._lock:  # the sampling thread waits: ticks and nanoseconds of one moment
            out: dict[str, float] = {}
            for kind, cpu in self.last.values():
                out[kind] = out.get(kind, 0.0) + cpu
            self.ticks[name] = {pid: cpu for pid, (_, cpu) in self.last.items()}
            runs: dict[str, int] = {}
            self.threads[name] = {pid: t for pid in self.last if (t := thread_ns(pid, self.names, runs))}
            self.runs[name] = runs
        self.marks[name] = out

    def between(self, a: str, b: str) -> dict[str, float]:
        """CPU-seconds by kind between two marks (a process born in between counts from 0)."""
        first, second = self.marks.get(a, {}), self.marks.get(b, {})
        out = {k: second.get(k, 0.0) - first.get(k, 0.0) for k in second}
        threads_a, threads_b = self.threads.get(a, {}), self.threads.get(b, {})
        for pid, before in threads_a.items():
            after = threads_b.get(pid)
            if after is None or not before.keys() <= after.keys():
                continue  # ended, or a thread of it: in ticks
            precise = sum(ns - before.get(tid, 0) for tid, ns in after.items()) / 1e9
            out[self.last[pid][0]] += precise - (self.ticks[b][pid] - self.ticks[a][pid])
        return {k: round(v, 3) for k, v in out.items()}

    def by_thread(self, a: str, b: str, kind: str, runs: bool = False) -> dict[str, float]:
        """CPU-seconds between two marks of the processes of ``kind`` that lived through both,
        by thread name (Python's own threads all carry the interpreter's); with ``runs``, how
        many times those threads were put on a CPU instead (their wake-ups)."""
        out: dict[str, float] = {}
        threads_b = self.threads.get(b, {})
        runs_a, runs_b = self.runs.get(a, {}), self.runs.get(b, {})
        for pid, before in self.threads.get(a, {}).items():
            after = threads_b.get(pid)
            if after is None or self.last[pid][0] != kind:
                continue
            for tid, ns in after.items():
                name = self.names.get(tid, "?")
                got = runs_b.get(tid, 0) - runs_a.get(tid, 0) if runs else (ns - before.get(tid, 0)) / 1e9
                out[name] = out.get(name, 0.0) + got
        return {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def wait_marks(watch: CpuWatch, started: list[str], progress: list[str], procs, stop: threading.Event,
               hold: str | None = None, epochs: int = 0) -> None:
    """Mark "reading" once every reader made its ``started`` file and "epoch1" once every one
    finished its first epoch (a line in its ``progress`` file), then make ``hold`` (the readers
    wait for it before their second epoch), then mark "epochs" once every one finished its
    ``epochs``-th (the readers' exit, their launchers' reports after it, are not epochs); ends
    with ``stop`` or the readers."""
    def all_have(paths: list[str], lines: int) -> bool:
        try:
            return all(os.path.exists(p) and len(open(p).read().split()) >= lines for p in paths)
        except OSError:
            return False

    try:
        for name, paths, lines in (("reading", started, 0), ("epoch1", progress, 1), ("epochs", progress, epochs)):
            if name == "epochs" and epochs < 2:
                return
            while not all_have(paths, lines):
                if stop.is_set() or all(p.poll() is not None for p in procs):
                    return
                time.sleep(0.002 if name == "epochs" else 0.01)
            watch.mark(name)
            if name == "epoch1" and hold:
                open(hold, "w").close()
                hold = None
    finally:  # made whatever happened: a reader left waiting would wait in vain
        if hold:
            open(hold, "w").close()
