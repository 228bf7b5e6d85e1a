"""Live progress of ``monarch run`` on the launcher's stderr, while the command runs, then
while the launcher waits for the job's write-back to reach the PFS.

The launcher polls its session with a brief REPORT (the daemon's counters: a counters-file
read and a few locked copies, no timeline) at most once a second and says how far staging
is: files and bytes staged of the dataset, the staging rate, opens per place served from and
the PFS bytes so far. Once the command has ended, while the run's final report waits for the
write-back's drain (docs/consistency.md, W7), ``Publishing`` polls the same brief REPORT on a
connection of its own and says the bytes still to publish, the drain's rate and the time left.
On a terminal it is the terminal's bottom row, kept out of the
scrolling region (as apt does: DECSTBM), so the command's output scrolls above it and
never shares a line with it; otherwise a whole line every few seconds, written with one
call, so a log collecting the command's stderr gets whole lines. The command's own stdout
and stderr are untouched. Plain ANSI sequences, no library: tqdm and rich draw bars on a
line the program itself owns, which this one does not (the command writes to the same
terminal), and nothing heavy goes into the core.

Off with ``monarch run --no-progress`` or ``MONARCH_PROGRESS=0``; ``MONARCH_PROGRESS=1``
turns it on for every rank of a node (by default only the node's first local rank shows
it); ``MONARCH_PROGRESS_INTERVAL`` sets the seconds between lines (at least 1).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from typing import Callable, Mapping, TextIO

from monarch.records.node_stats import NodeStats, bytes_read_range
from monarch.sizes import human, human_range

ENV_PROGRESS = "MONARCH_PROGRESS"
ENV_INTERVAL = "MONARCH_PROGRESS_INTERVAL"
MIN_POLL_SECONDS = 1.0      # the daemon answers polls on its event loop: never more often than this
TERMINAL_SECONDS = 1.0      # a terminal line is rewritten this often
LINE_SECONDS = 5.0          # a log gets a line this often
_OFF = ("0", "off", "no", "false")
_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK")


def wanted(no_progress_flag: bool, env: Mapping[str, str] | None = None) -> bool:
    """Show progress? Not with the flag or MONARCH_PROGRESS=0; by default only on a node's first rank."""
    env = os.environ if env is None else env
    setting = env.get(ENV_PROGRESS, "").strip().lower()
    if no_progress_flag or setting in _OFF:
        return False
    if setting:
        return True
    return first_local_rank(env)


def first_local_rank(env: Mapping[str, str] | None = None) -> bool:
    """Is this the first rank of its node (or no launcher says)? Who speaks for the node."""
    env = os.environ if env is None else env
    for name in _LOCAL_RANK_VARS:
        if env.get(name, "").strip().isdigit():
            return int(env[name]) == 0
    return True


def interval(tty: bool, env: Mapping[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    try:
        seconds = float(env.get(ENV_INTERVAL, ""))
    except ValueError:
        seconds = TERMINAL_SECONDS if tty else LINE_SECONDS
    return max(MIN_POLL_SECONDS, seconds)


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Polls ``poll()`` (brief node statistics, or None) on a thread and writes to ``out``."""

    def __init__(self, poll: Callable[[], dict | None], out: TextIO, tty: bool | None = None,
                 every: float | None = None, saved_index: bool = False):
        self._poll = poll
        self.saved_index = saved_index  # the daemon starts by loading the dataset's saved index, not walking
        self.out = out
        self.tty = _isatty(out) if tty is None else tty
        self.every = interval(self.tty) if every is None else max(MIN_POLL_SECONDS, every)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monarch-progress", daemon=True)
        self._prev: tuple[float, int] | None = None  # (time, staged bytes) of the previous poll
        self._shown = False
        self._rows = 0  # the terminal's height when the bottom row was reserved

    def start(self) -> "Progress":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (waits for a poll under way); give the terminal its bottom row back."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.tty and self._shown:
            # save the cursor, whole screen scrolls again, clear the bottom row, restore the cursor
            rows = self._rows
            self._write(f"\x1b7\x1b[1;{rows}r\x1b[{rows};1H\x1b[K\x1b8")

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            stats = self._poll()
            if stats is None or self._stop.is_set():
                continue
            self.show(stats, time.monotonic())

    def show(self, stats: dict, now: float) -> None:
        """One poll's answer (the brief statistics as received) on ``out``."""
        text = self.text(NodeStats.from_dict(stats), now)
        if not self.tty:
            self._write(text + "\n")
            return
        size = shutil.get_terminal_size((100, 24))
        rows, text = max(2, size.lines), text[:max(20, size.columns - 1)]
        prefix = ""
        if not self._shown or rows != self._rows:
            # reserve the bottom row: a newline (scrolls if the cursor is on it), then the
            # scrolling region above it; DECSTBM homes the cursor, hence save/restore around it
            prefix = f"\n\x1b[1A\x1b7\x1b[1;{rows - 1}r\x1b8"
            self._rows = rows
        # one write: save the cursor, draw the bottom row, restore the cursor
        self._write(f"{prefix}\x1b7\x1b[{rows};1H\x1b[K{text}\x1b8")
        self._shown = True

    def text(self, stats: NodeStats, now: float) -> str:
        return line(stats, self._rate(stats, now), self.saved_index)

    def _rate(self, stats: NodeStats, now: float) -> float | None:
        staged = stats.staging.get("bytes", 0)
        prev, self._prev = self._prev, (now, staged)
        if prev is None or now <= prev[0]:
            return None
        return (staged - prev[1]) / (now - prev[0])

    def _write(self, text: str) -> None:
        try:
            self.out.write(text)  # one call: a whole line at once
            self.out.flush()
        except (OSError, ValueError):  # stderr closed: no progress, the job goes on
            self._stop.set()


def line(stats: NodeStats, rate: float | None, saved_index: bool = False) -> str:
    """One progress line from a node's statistics (``NodeDaemon.node_stats(brief=True)``);
    ``saved_index``: the daemon's snapshot starts from the dataset's saved index (a job with
    ``keep: true``, ``service.saved_index``), loaded unless a directory changed since."""
    st, ds = stats.staging, stats.dataset
    files, total_files = st.get("files", 0), ds.get("files", 0)
    pct = f" {100 * st.get('bytes', 0) / ds['bytes']:.0f}%" if ds.get("bytes") else ""
    if stats.snapshot == "walking" and saved_index:  # "walking": the daemon's state until its snapshot is ready
        parts = [f"monarch: loading the dataset's saved index ({stats.uptime_seconds:.0f} s; "
                 "walked again if a directory changed)"]
    elif stats.snapshot == "walking":  # the daemon's walk overlaps the command's start
        parts = [f"monarch: walking the dataset ({stats.uptime_seconds:.0f} s)"]
    else:
        parts = [f"monarch: staged {files}/{total_files} files, {human(st.get('bytes', 0))}/"
                 f"{human(ds.get('bytes', 0))}{pct}"]
    if rate is not None:
        parts.append(f"{human(rate)}/s")
    opened_from = stats.opened_from
    parts.append("opens " + " ".join(f"{name} {c.get('opens', 0)}" for name, c in opened_from.items()))
    # the application's PFS bytes as the report gives them: counted, up to the lengths mapped
    # (mmap), or at least what was counted (a stdio FILE's own reads)
    app_low, app_high = bytes_read_range(opened_from.get("pfs", {}))
    staged = st.get("pfs_bytes_read", 0)
    parts.append(f"PFS read {human_range(app_low + staged, None if app_high is None else app_high + staged)}")
    if st.get("store"):  # a root served from a key-value store: its bytes beside the PFS's
        parts.append(f"store read {human(st.get('store_bytes_read', 0))}")
    return " | ".join(parts)


class Publishing(Progress):
    """The line while ``monarch run`` waits for the job's write-back to reach the PFS (W7): the
    bytes still to publish, the drain's rate since the wait began (until a file was published in
    it: the daemon's average over the job), the time left. A wait shorter than one interval
    shows nothing."""

    def __init__(self, poll: Callable[[], dict | None], out: TextIO, tty: bool | None = None,
                 every: float | None = None):
        super().__init__(poll, out, tty, every)
        self._start: tuple[float, int] | None = None  # (time, bytes to publish) when the wait began

    def _run(self) -> None:
        stats = self._poll()  # the wait's start, not shown: where the rate is measured from
        if stats is not None:
            self.begin(stats, time.monotonic())
        super()._run()

    def begin(self, stats: dict, now: float) -> None:
        self._start = (now, _to_publish(NodeStats.from_dict(stats).writeback or {}))

    def text(self, stats: NodeStats, now: float) -> str:
        wb = stats.writeback or {}
        rate = None
        if self._start is not None and now > self._start[0] and _to_publish(wb) < self._start[1]:
            rate = (self._start[1] - _to_publish(wb)) / (now - self._start[0])
        else:  # the PFS's write rate as the drain met it during the job (the report's pfs_write_rate)
            copying = (wb.get("drain_seconds") or 0) - (wb.get("order_wait_seconds") or 0)
            rate = wb["bytes_copied"] / copying if copying > 0 and wb.get("bytes_copied") else None
        return publishing_line(wb, rate)


def _to_publish(wb: dict) -> int:
    """The bytes of the files closed and not yet on the PFS (a daemon before ``publishing_bytes``:
    every byte pending)."""
    return wb.get("publishing_bytes", wb.get("pending_bytes", 0)) or 0


def publishing_line(wb: dict, rate: float | None) -> str:
    """One line while the run waits for its write-back (``wb``: the node statistics' ``writeback``)."""
    pending = _to_publish(wb)
    files = wb.get("publishing_files")
    text = f"monarch: publishing the job's writes to the PFS: {human(pending)} pending"
    if files is not None:
        text += f" ({files} file{'' if files == 1 else 's'})"
    left_ops = (wb.get("records") or 0) - (wb.get("applied") or 0)
    if not pending and left_ops > 0:  # renames, removals, or a publish waiting for other nodes (W4)
        text += f", {left_ops} operation{'' if left_ops == 1 else 's'} to apply"
    if rate:
        text += f", {human(rate)}/s"
        if pending:
            text += f", about {duration(pending / rate)} left"
    return text


def duration(seconds: float) -> str:
    """Seconds for people: ``2 s``, ``3 min``, ``1 h 5 min``."""
    seconds = max(1, round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
