"""``monarch run``: attach to (or start) this node's daemon, run the command under the shim,
and print the report. The daemon's life from outside (finding, starting, attaching, waiting
for its exit, writing the report) is monarch/launch/service.py's; here is the launcher's part:
which daemon a run uses (a cluster job's waits for its node's standing one), the command,
its signals, and the report printed at its end.

No MPI here: in a cluster the daemons are started by ``monarch serve`` under mpiexec and
the launcher only attaches; alone it starts an embedded daemon that lives as long as
some launcher of the job is attached to it.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from monarch import environment, layout, protocol, topology
from monarch.launch import service, slurm
from monarch.launch.progress import first_local_rank
from monarch.launch.launchers import RunLaunchers
from monarch.launch.forked import Daemon
from monarch.launch.service import Session, attach
from monarch.config import Config
from monarch.errors import EXIT_UNPUBLISHED, DaemonError, MonarchError
from monarch.records.node_stats import NodeStats
from monarch.report.sharing import sharing_at_start
from monarch.report.build import session_delta
from monarch.report.bypass import bypass_warning
from monarch.report.fallbacks import entry, say
from monarch.report.text import no_room_words, print_report
from monarch.shim import shim_library

log = logging.getLogger(__name__)


def attach_or_start(config: Config, run: str, out=None) -> tuple[Session, Daemon | None]:
    """Attach to the daemon of this run (or of this job: a standing ``monarch serve``) on this
    node, if it serves this configuration; else start an embedded one for the run (monarch/launch/service.py),
    once what a killed daemon left of its write-back on the node is published (said on ``out``)."""
    session = service.find(config, run)
    if session is not None:
        return session, None
    if is_cluster_run(config):  # never a single-node daemon behind the cluster's back
        return wait_for_cluster_daemon(config, topology.node_index()), None
    if config.writeback.enabled:
        drain_left(config, run, sys.stderr if out is None else out)
    return service.start(config, run)


def drain_left(config: Config, run: str, out) -> None:
    """Publish what runs whose daemons are gone left pending in the write-back tier, as ``monarch
    drain`` does (monarch/writeback/orphans.py; W8), in one line on ``out``. Never fails the run:
    an area that could not be drained is kept, said, for ``monarch drain``. ``run``'s own areas are
    not touched (its daemon may be making one now)."""
    from monarch.sizes import human
    from monarch.writeback.across import drain_in_order
    from monarch.writeback.orphans import find_left, finished
    t0 = time.monotonic()
    try:
        _, areas = find_left(config.writeback_tier().path, but_run=run)
        drained = drain_in_order(areas, finished=finished(config.writeback_tier().path))
    except Exception as e:  # fail open: the job runs; the areas stay for `monarch drain`
        out.write(f"monarch: could not publish the write-back a previous run left pending ({e}); the job goes on "
                  f"(`monarch drain` publishes it)\n")
        return
    published = [d.outcome for d in drained if d.outcome is not None]
    files, nbytes = sum(len(o.published) for o in published), sum(o.published_bytes for o in published)
    failed = [d for d in drained if not d.complete]
    for d in failed:
        left = d.outcome or next((o for o in d.held.values() if not o.complete), None)
        why = d.error or "; ".join(p for p in (left.failed and f"stopped at {left.failed}", left.damaged) if p)
        out.write(f"monarch: write-back a previous run left pending is not all published ({why}); kept in "
                  f"{d.path}: `monarch drain` publishes it; the job goes on\n")
    if files:
        where = drained[0].path if len(drained) == 1 else f"{len(drained)} areas in {config.writeback_tier().path}"
        kept = [f"{d.never_closed} in {d.path}/data" for d in drained if d.never_closed]
        out.write(f"monarch: published {files} file{'' if files == 1 else 's'} a previous run left pending "
                  f"({human(nbytes)} in {time.monotonic() - t0:.1f} s, from {where})"
                  + (f"; kept, never closed by its job: {', '.join(kept)}" if kept else "") + "\n")
    out.flush()


# -- a cluster job's launcher waits for its node's standing daemon --------------------------
ENV_CLUSTER = "MONARCH_CLUSTER"  # "1": this run belongs to a cluster of `monarch serve`; "0": it does not
ENV_CLUSTER_WAIT = "MONARCH_CLUSTER_WAIT"  # seconds to wait, instead of CLUSTER_WAIT_TIMEOUT
CLUSTER_WAIT_TIMEOUT = float(environment.variable(ENV_CLUSTER_WAIT).default)  # seconds a cluster job's launcher waits
CLUSTER_WAIT_NOTE = 30.0         # said once, then a line this often at most, by a node's first rank only


def is_cluster_run(config: Config, env=None) -> bool:
    """Is this ``monarch run`` part of a cluster job (its node's daemon is a standing ``monarch
    serve`` of the job, never one it starts)? ``MONARCH_CLUSTER=1|0`` says so explicitly;
    otherwise yes when the node index is given (MONARCH_NODE or SLURM_NODEID) and the
    configuration file itself has a ``peer`` section (the shipped defaults' does not count)."""
    env = os.environ if env is None else env
    forced = env.get(ENV_CLUSTER, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return config.peer_given and topology.node_index_given(env)


def wait_for_cluster_daemon(config: Config, node: int, timeout: float | None = None, out=None) -> Session:
    """Attach to node ``node``'s standing daemon of this job, waiting for it to come up (the
    readers may start before or with the daemons), with a line on stderr every few seconds.
    DaemonError after ``timeout`` (then the command runs on the PFS: fail open)."""
    timeout = float(os.environ.get(ENV_CLUSTER_WAIT, CLUSTER_WAIT_TIMEOUT)) if timeout is None else timeout
    out = sys.stderr if out is None else out
    job = topology.job_id()
    path = layout.socket_path(config.run_base, job, node)
    t0 = time.monotonic()
    # said at once, then every CLUSTER_WAIT_NOTE, by the first rank of the node: not a line
    # per rank every few seconds (a wait must not flood the job's log)
    note = t0 if first_local_rank() else float("inf")
    # under Slurm the node's first rank asks whether the daemons' step is stuck (pending) and
    # leaves the answer for the node's other ranks, as a daemon that refused to start does
    stuck = slurm.PendingDaemons() if first_local_rank() and os.environ.get("SLURM_JOB_ID") else None
    dead_since = None
    while True:
        session = attach(path)
        if session is not None:
            if session.serves(config):
                return session
            session.close()
            raise DaemonError(f"node {node}'s daemon of job {job} at {path} serves another configuration; "
                              "give monarch serve and the job's monarch run the same one")
        refused = slurm.refusal(os.path.dirname(path))
        if refused is not None:  # its srun line cannot work: it will never come
            raise DaemonError(f"node {node}'s daemon of job {job} will not come: {refused}")
        now = time.monotonic()
        why = stuck.check(now - t0) if stuck is not None else None
        if why is not None:
            try:
                slurm.note(config, why, os.path.join(layout.run_dir(config.run_base, job, node), layout.REFUSED))
            except (MonarchError, OSError) as e:
                log.debug("no note for the node's other launchers: %s", e)
            raise DaemonError(f"node {node}'s daemon of job {job} will not come: {why}")
        if dead_since is None and _daemon_died(os.path.dirname(path)):
            dead_since = now
        if dead_since is not None and now - dead_since > CLUSTER_DEAD_WAIT:
            raise DaemonError(f"node {node}'s daemon of job {job} died (its socket {path} is left and nothing holds "
                              f"its lock) and no new one came within {CLUSTER_DEAD_WAIT:.0f} s")
        if now - t0 > timeout:
            how = ("`monarch serve --slurm -c CONFIG` in the batch script or salloc's shell (one daemon per node, "
                   "in a step that overlaps the training's: a step without --overlap waits for its CPUs)"
                   if os.environ.get("SLURM_JOB_ID") else
                   "`monarch serve -c CONFIG` on every node under mpiexec or srun, with the same job id")
            raise DaemonError(f"node {node}'s daemon of job {job} did not come up within {timeout:.0f} s at {path} "
                              f"(start {how}; or set {ENV_CLUSTER}=0 to run single-node)")
        if now >= note:
            out.write(f"monarch: waiting for node {node}'s daemon of job {job} ({now - t0:.0f} s; "
                      f"up to {timeout:.0f} s; said every {CLUSTER_WAIT_NOTE:.0f} s by this node's first rank): {path}\n")
            out.flush()
            note = now + CLUSTER_WAIT_NOTE
        time.sleep(0.05)


CLUSTER_DEAD_WAIT = 10.0  # seconds a launcher waits for a dead daemon (killed) to be replaced
_daemon_died = service.daemon_died


def app_env(session_env: dict[str, str], shim: str) -> dict[str, str]:
    env = dict(os.environ)
    # what the shim takes from the daemon, only from it: a user's own MONARCH_WRITEBACK configured the
    # daemon; the shim's copy says what this daemon answers for (nothing, when it is not in the answer)
    env.pop(protocol.ENV_WRITEBACK, None)
    env.pop(protocol.ENV_WRITEBACK_MARKS, None)
    env.pop(protocol.ENV_WRITEBACK_SOCKET, None)
    env.update(session_env)
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != shim]
    env["LD_PRELOAD"] = ":".join([shim, *preload])
    return env


class _Interrupted(BaseException):
    """A Ctrl-C (or SIGTERM) during the tear-down: cut it short (a BaseException, as
    KeyboardInterrupt: no ``except Exception`` on the way swallows it)."""


class _Signals:
    """SIGINT and SIGTERM for ``monarch run``, from the command's start to the launcher's end.

    While the command runs they are passed on to it; a second Ctrl-C means "now": it is
    killed. After it ended (the tear-down: the report, the embedded daemon's exit), the
    first one cuts the tear-down short (``_Interrupted``: the report is skipped, the daemon
    still stops and removes its tiers) and later ones are only noted: an impatient Ctrl-C
    never leaves a traceback or a half-stopped daemon. ``_Interrupted`` is raised from the
    handler only inside ``waiting()`` (a report the daemon holds, the daemon's exit), else
    at the next ``waiting()`` or ``check()``: never in the middle of a log line or a file.
    """

    def __init__(self):
        self.proc: subprocess.Popen | None = None  # the command, while it runs
        self.forwarded: collections.Counter[int] = collections.Counter()
        self.killed = False  # the command was killed by a second Ctrl-C
        self.cut: int | None = None  # the signal that cut the tear-down short
        self._waiting = False
        self._old: dict = {}

    def __enter__(self) -> "_Signals":
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, _frame) -> None:
        proc = self.proc
        if proc is not None:
            self.forwarded[signum] += 1
            if signum == signal.SIGINT and self.forwarded[signum] > 1:
                self.killed = True
                proc.kill()
            else:
                proc.send_signal(signum)
        elif self.cut is None:
            self.cut = signum
            if self._waiting:
                raise _Interrupted
        # later ones: the tear-down is already as short as it gets

    def check(self) -> None:
        if self.cut is not None:
            raise _Interrupted

    @contextmanager
    def passing_to(self, proc: subprocess.Popen):
        """While ``proc`` runs, signals go to it."""
        self.proc = proc
        try:
            yield
        finally:
            self.proc = None

    @contextmanager
    def waiting(self):
        """A wait the first signal breaks."""
        self.check()
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False


def run_command(cmd: list[str], env: dict[str, str], signals: _Signals) -> int:
    """Run ``cmd``, its signals passed on by ``signals``; return its exit code (128+N for a signal).

    The command inherits every descriptor ``monarch run`` inherited (close_fds=False): an MPI
    launcher's PMI_FD, a scheduler's or torchrun's sockets. Monarch's own descriptors are
    close-on-exec (PEP 446) and stay behind.
    """
    proc = subprocess.Popen(cmd, env=env, close_fds=False)
    with signals.passing_to(proc):
        code = proc.wait()
    return 128 - code if code < 0 else code


@dataclass
class _Ending:
    """What the end of one ``monarch run`` needs (the report, the embedded daemon's exit): what
    was asked for, and what the start found (filled in as the run goes)."""
    config: Config
    cmd: list[str]
    run: str
    t0: float  # time.time() at the start
    report_path: str | None  # --report
    html_path: str | None    # --report-html
    out: TextIO
    session: Session | None = None          # None: Monarch is not active for this run
    daemon: Daemon | None = None  # the embedded daemon this launcher started
    baseline: dict | None = None            # a standing daemon's counters at the start (this run's share)
    wall: float = 0.0                       # seconds from the start to the command's end
    progress: bool = False                  # live progress on ``out`` (the command's, then the drain's)
    staged_files: int = 0                   # the last REPORT's staging.files: the copies the daemon removes
    written_through: str | None = None      # why the job's write-back paths were written through (None: they were not)

    def heard(self, stats: dict | None) -> dict | None:
        """Note what a REPORT from the daemon says it staged (the tear-down's wait grows with it)."""
        staging = stats.get("staging") if isinstance(stats, dict) else None
        files = staging.get("files") if isinstance(staging, dict) else None
        if isinstance(files, int):
            self.staged_files = files
        return stats


def run(config: Config, cmd: list[str], report_path: str | None,
        run: str | None = None, out=sys.stderr, progress: bool = True, html_path: str | None = None) -> int:
    """The whole of ``monarch run``. Monarch trouble never stops the command: it runs on the PFS.

    ``progress``: show live progress on ``out`` while the command runs (monarch/launch/progress.py);
    ``html_path``: also write the report as HTML (else the configuration's ``report_html``).
    """
    end = _Ending(config, cmd, run or topology.run_id() or topology.new_run_id(), time.time(), report_path,
                  html_path, out, progress=progress)
    launchers = RunLaunchers(None, end.run)
    try:
        # the shim first: a checkout's changed shim builds for seconds, and a daemon started
        # before it would stage meanwhile what the job's first reads are to find not yet staged
        shim = str(shim_library())
        end.session, end.daemon = attach_or_start(config, end.run, end.out)
        session = end.session
        launchers = RunLaunchers(session.run_dir, end.run)
        if session.run.get("run") != end.run:  # the job's standing daemon: report this run's share
            end.baseline = session.stats(brief=True)  # the counters: answered at once, even during its walk
        env = app_env(session.env, shim)
        end.written_through = _write_through_unwatched(env, end.out)
        _say_unused_tiers(session)
    except Exception as e:  # fail open: the job runs unaccelerated
        log.error("Monarch is not active for this run (%s); reading the PFS directly", e)
        env = dict(os.environ)
    env[topology.ENV_RUN_ID] = end.run  # nested `monarch run` and the command's children share the run
    shown = None
    if end.session is not None and progress:
        from monarch.launch.progress import Progress
        shown = Progress(lambda: end.heard(end.session.stats(brief=True)), out,
                         saved_index=service.saved_index(config) is not None).start()
    log.debug("phase command.start")
    code = 128 + signal.SIGINT  # if a signal comes before the command even starts
    with _Signals() as signals:
        try:
            try:
                code = run_command(cmd, env, signals)
            finally:
                if shown is not None:
                    shown.stop()
            log.debug("phase command.end")
            end.wall = time.time() - end.t0
            code = _tear_down(end, signals, code, launchers.last_to_leave())
        except _Interrupted:
            last = launchers.last_to_leave()  # no report; the last removes the group's file all the same
            code = _cut_short(end, shown, code if signals.killed else 128 + signals.cut, last)
    return code


def _tear_down(end: _Ending, signals: _Signals, code: int, last: bool = True) -> int:
    """The command has ended with ``code``: the report (printed in full by the run's ``last``
    launcher on the node), then the embedded daemon's exit (its tiers removed); the run's exit
    code (EXIT_UNPUBLISHED for a command that succeeded but whose writes are not all on the PFS)."""
    session = end.session
    shown = _publishing(end)
    try:
        with signals.waiting():  # the daemon holds the final report until its snapshot and write-back are done
            stats = end.heard(session.stats(final=True)) if session is not None else None
    finally:
        if shown is not None:
            shown.stop()
    log.debug("phase report.fetched")
    if session is None:
        return code
    session.close()
    code = _writeback_code(stats, code, end.out, end.config)
    try:  # the report first: the daemon's exit (its tiers removed) is waited for after it
        signals.check()
        _print_and_write(end, code, stats, last)
    finally:
        if end.daemon is not None:
            with signals.waiting():
                service.wait_stopped(end.daemon, end.config, end.staged_files, last, end.run, end.out)
            log.debug("phase daemon.reaped")
    return code


def _publishing(end: _Ending):
    """The line while the final report waits for the job's write-back to reach the PFS (W7),
    polled on connections of its own (the session's waits); None without write-back or progress."""
    if end.session is None or not end.progress or not end.config.writeback.enabled:
        return None
    from monarch.launch.progress import Publishing
    return Publishing(end.session.poll, end.out).start()


def _writeback_code(stats: dict | None, code: int, out, config: Config) -> int:
    """A command whose writes under the write-back paths did not all reach the PFS ends with
    EXIT_UNPUBLISHED (unless it failed itself): each file named with where its bytes are kept."""
    if stats is None and config.writeback.enabled:  # the daemon was lost: what it held is in its area
        out.write(f"monarch: write-back: the node daemon was lost before it said the job's writes were on the "
                  f"PFS; what it had not published is kept in tier {config.writeback_tier().name}'s base "
                  f"({config.writeback_tier().path}): `monarch drain` publishes it\n")
        return EXIT_UNPUBLISHED if code == 0 else code
    wb = (stats or {}).get("writeback") or {}
    if not wb.get("failed") and not wb.get("unpublished"):
        return code
    out.write(f"monarch: write-back: {len(wb.get('unpublished') or {})} file(s) not published to the PFS"
              f"{': ' + wb['failed'] if wb.get('failed') else ''}; their bytes are kept in {wb.get('area')} "
              f"(`monarch drain` publishes them)\n")
    for path, where in (wb.get("unpublished") or {}).items():
        out.write(f"monarch:   {path}: {where}\n")
    return EXIT_UNPUBLISHED if code == 0 else code


def _cut_short(end: _Ending, shown, code: int, last: bool = True) -> int:
    """A signal during the tear-down: no report, but the daemon's exit still waited for (the
    signals meanwhile are only noted), so that nothing is left behind."""
    end.out.write("monarch: interrupted: the report is skipped; the node daemon stops\n")
    if shown is not None:
        shown.stop()
    if end.session is not None:
        end.session.close()  # the run's last session: the embedded daemon stops and removes its tiers
    if end.daemon is not None:
        service.wait_stopped(end.daemon, end.config, end.staged_files, last, end.run, end.out)
    return code


def _write_through_unwatched(env: dict[str, str], out) -> str | None:
    """Where the job's raw system calls cannot be watched, its write-back paths are written through:
    the shim of no process is given them, so every file there goes to the PFS as without Monarch
    (monarch/writeback/rawsys.py). Said here once; the report lists it. Returns why, or None."""
    if not env.get(protocol.ENV_WRITEBACK):
        return None
    from monarch.writeback.rawsys import unwatched_reason
    why = unwatched_reason(env)
    if why is not None:
        del env[protocol.ENV_WRITEBACK]
        env.pop(protocol.ENV_WRITEBACK_MARKS, None)
        env.pop(protocol.ENV_WRITEBACK_SOCKET, None)
        out.write("".join(say([entry("writeback-through", why)])) + "\n")
    return why


def _say_unused_tiers(session: Session) -> None:
    """One line per tier the daemon could not use, or whose filesystem leaves it no room beside the
    application's reserve, at the start: its own log is a file."""
    errors = session.run.get("tier_errors")
    for name, reason in (errors.items() if isinstance(errors, dict) else ()):
        log.warning("tier %s is not used (the run goes on without it): %s", name, reason)
    room = session.run.get("tier_room")
    for name, tier in (room.items() if isinstance(room, dict) else ()):
        if words := no_room_words([tier], now=True):
            log.warning("tier %s takes no file: %s", name, words)
    for line in sharing_at_start(session.run.get("tier_sharing")):
        log.warning("%s", line)


def _print_and_write(end: _Ending, code: int, stats: dict | None, last: bool = True) -> None:
    config, session, out = end.config, end.session, end.out
    node = NodeStats.from_wire(stats)
    if node is None:
        node = _stats_without_daemon(config, session)
        log.warning("the node daemon was lost during the run; the report holds the shim's counts only")
    meta = {"run_id": end.run, "job_id": topology.job_id(), "config": config.source, "command": end.cmd,
            "exit_code": code, "wall_seconds": round(end.wall, 3)}
    if end.baseline is not None and stats is not None:
        before = NodeStats.from_dict(end.baseline)
        node = session_delta(node, before)
        meta["scope"] = _session_scope(session, config, before)
    # the command line wins; a standing daemon's run directory keeps report.json for the node's
    # whole report (the daemon writes it at stop): this run's part goes beside it
    path = service.report_path(session.run_dir, end.report_path,
                               os.path.join(session.run_dir, layout.session_report(end.run)) if "scope" in meta
                               else config.report)
    report = service.build([node], meta)
    if end.written_through:
        report["fallbacks"].append(entry("writeback-through", end.written_through))
    try:
        service.save(report, path)
    except OSError as e:
        log.warning("cannot write the report to %s: %s", path, e)
    if last:
        print_report(report, out)
        out.write(f"report    : {path}\n")
        _warn_if_bypassed(report, out)
    else:
        _point_to_the_report(path, out)
    log.debug("phase report.printed")
    html_path = end.html_path or config.report_html
    if html_path:
        try:
            from monarch.report.html import write_html
            write_html(report, html_path)
            out.write(f"html      : {html_path}\n")
        except (OSError, MonarchError) as e:
            log.warning("cannot write the HTML report to %s: %s", html_path, e)


def _session_scope(session: Session, config: Config, before: NodeStats) -> dict:
    """What a report of one run on a standing daemon covers: this run's part only; what the
    daemon had staged before it attached; where the node's whole report goes at the daemon's
    stop (without it, a run that attached late printed "0.00x the dataset" for a dataset
    already staged)."""
    return {"part": "this run", "staged_before": {"files": before.staging.get("files", 0),
                                                  "bytes": before.staging.get("bytes", 0)},
            "node_report": service.report_path(session.run_dir, config.report)}


def _warn_if_bypassed(report: dict, out) -> None:
    """One line when the command's readers did not go through the shim (monarch/report/bypass.py)."""
    warning = bypass_warning(report)
    if warning:
        out.write(f"monarch: warning: {warning}\n")


def _point_to_the_report(path: str, out) -> None:
    """A launcher that is not the last of its run on the node: one line, not the whole report."""
    out.write(f"monarch: report of node {topology.node_index()}: printed by this run's last launcher on the node "
              f"to leave; JSON: {path}\n")


def _stats_without_daemon(config: Config, session: Session) -> NodeStats:
    """The shim's counters survive the daemon: report what the application read."""
    names = protocol.slot_names([t.name for t in config.tiers], with_peer=False)
    counters = session.env[protocol.ENV_COUNTERS]
    try:
        extra = protocol.read_extra_counters(counters)
        processes, said = extra[protocol.EXTRA_PROCESSES], extra[protocol.EXTRA_FALLBACKS]
    except (OSError, ValueError):
        processes, said = None, 0
    return NodeStats(node=0, host=socket.gethostname(),
                     opened_from=protocol.read_opened_from(counters, names),
                     staging={"files": 0, "bytes": 0, "pfs_files_read": 0, "pfs_bytes_read": 0,
                              "failures": {"daemon_lost": 1}},
                     processes_with_shim=processes, view={"fallbacks": said})  # what the shims said, with their fixes
