"""``monarch run``: attach to (or start) this node's daemon, run the command under the shim,
and print the report.

No MPI here: in a cluster the daemons are started by ``monarch serve`` under mpiexec and
the launcher only attaches; alone it starts an embedded daemon that lives as long as
some launcher of the job is attached to it.
"""

from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

from monarch import layout, protocol, secure
from monarch.launch import topology
from monarch.launch.launchers import RunLaunchers
from monarch.config import Config
from monarch.errors import DaemonError, MonarchError
from monarch.node.stats import NodeStats
from monarch.report.build import build_report, session_delta
from monarch.report.bypass import bypass_warning
from monarch.report.store import write_report
from monarch.report.text import print_report
from monarch.shim import shim_library

log = logging.getLogger(__name__)

# a daemon answers ATTACH before its snapshot walk (which runs while the command starts);
# starting is an interpreter, its imports and the tiers, but a loaded node can be slow
DAEMON_START_TIMEOUT = 600.0


ATTACH_TIMEOUT = 10.0          # a daemon answers ATTACH at once (its event loop never waits)
REPORT_TIMEOUT = 30.0
MAX_ENV_VALUE = 1 << 16


class Session:
    """One launcher's attachment to a daemon (an open connection), checked before it is trusted."""

    def __init__(self, sock: socket.socket, socket_path: str):
        self.sock = sock
        self.socket_path = socket_path
        sock.settimeout(ATTACH_TIMEOUT)
        secure.check_peer_is_me(sock)
        sock.sendall(protocol.encode_request(protocol.VERB_ATTACH))
        status, body = protocol.recv_answer(sock)
        if status != 0:
            raise DaemonError(f"the daemon at {socket_path} refused to attach: {body[:200]!r}")
        answer = json.loads(body)
        self.env = _client_env(answer.get("env"), socket_path)
        self.run = answer.get("run") if isinstance(answer.get("run"), dict) else {}
        self.run_dir = os.path.dirname(socket_path)
        self._lock = threading.Lock()  # the progress thread polls on the same connection

    def stats(self, brief: bool = False, final: bool = False) -> dict | None:
        """The daemon's statistics; ``brief``: counters only (for progress), cheap to answer;
        ``final``: the session's last request (it closes next: an embedded daemon with no
        other session then stops at once, without its grace for launchers yet to attach)."""
        body = protocol.REPORT_BRIEF if brief else protocol.REPORT_FINAL if final else b""
        try:
            with self._lock:
                self.sock.settimeout(REPORT_TIMEOUT)
                self.sock.sendall(protocol.encode_request(protocol.VERB_REPORT, body))
                status, body = protocol.recv_answer(self.sock)
            stats = json.loads(body) if status == 0 else None
            return stats if isinstance(stats, dict) else None
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        self.sock.close()


def _client_env(env, socket_path: str) -> dict[str, str]:
    """Only Monarch's own keys, as strings of bounded length, naming the socket we asked."""
    if not isinstance(env, dict) or set(env) - set(protocol.CLIENT_ENV_KEYS):
        raise DaemonError(f"the daemon at {socket_path} sent an environment with unexpected keys")
    for key, value in env.items():
        if not isinstance(value, str) or "\0" in value or len(value) > MAX_ENV_VALUE:
            raise DaemonError(f"the daemon at {socket_path} sent a malformed {key}")
    if not _same_socket(env.get(protocol.ENV_SOCKET), socket_path):
        raise DaemonError(f"the daemon at {socket_path} names another socket")
    return dict(env)


def _same_socket(named, socket_path: str) -> bool:
    """Is ``named`` (the daemon instance's own socket, for the shim) the socket we asked,
    under its instance's name: in the same directory, the same inode (monarch/node/instance.py)?"""
    if not isinstance(named, str) or os.path.dirname(named) != os.path.dirname(socket_path):
        return False
    try:
        a, b = os.stat(named), os.stat(socket_path)
    except OSError:
        return False
    return stat.S_ISSOCK(a.st_mode) and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def attach(socket_path: str) -> Session | None:
    """A session with the daemon at ``socket_path``, or None if none answers there."""
    if not os.path.exists(socket_path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(ATTACH_TIMEOUT)
        sock.connect(socket_path)
        return Session(sock, socket_path)
    except (OSError, ValueError) as e:
        log.debug("no daemon at %s: %s", socket_path, e)
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise


def _serves(session: Session, config: Config) -> bool:
    """Does the daemon serve this configuration's dataset? (one job, one namespace)"""
    roots = session.run.get("roots")
    if roots == list(config.dataset.roots):
        return True
    log.warning("the daemon at %s serves the dataset %s, not %s: this run does not use it",
                session.socket_path, roots, list(config.dataset.roots))
    return False


@contextmanager
def _start_lock(run_dir: str):
    fd = secure.open_private_file(os.path.join(run_dir, "start.lock"))
    try:
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DaemonError(f"another launcher holds {run_dir}/start.lock for too long") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def attach_or_start(config: Config, config_file: str | None, run: str) -> tuple[Session, subprocess.Popen | None]:
    """Attach to the daemon of this run (or of this job: a standing ``monarch serve``) on this
    node, if it serves this dataset; else start an embedded one for the run."""
    node = topology.node_index()
    try:
        layout.user_dir(config.run_base)  # checked once here, so an unsafe base names its key
    except secure.UnsafeBaseError as e:
        raise MonarchError(f"config {config.source}: run_base: {e}") from None
    candidates = [run] + [j for j in [topology.job_id()] if j != run]
    for rid in candidates[1:]:
        session = attach(layout.socket_path(config.run_base, rid, node))
        if session is not None:
            if _serves(session, config):
                return session, None
            session.close()
    if is_cluster_run(config_file):  # never a single-node daemon behind the cluster's back
        return wait_for_cluster_daemon(config, node), None
    run_dir = layout.run_dir(config.run_base, run, node)
    socket_path = layout.socket_path(config.run_base, run, node)
    with _start_lock(run_dir):  # several launchers of the run on a node start one daemon
        session = attach(socket_path)
        if session is not None:
            if _serves(session, config):
                return session, None
            session.close()
            raise DaemonError(f"the run's daemon at {socket_path} serves another dataset; "
                              "give this job its own MONARCH_JOB_ID")
        cmd = [sys.executable, "-m", "monarch", *(["-vv"] if log.isEnabledFor(logging.DEBUG) else []),
               "serve", "--embedded"]
        if config_file:
            cmd += ["-c", config_file]
        cmd += [a for root in config.dataset.given for a in ("--dataset", root)]  # what this launcher validated
        # the daemon expands the configuration with the launcher's run id, whatever its parents
        env = _without_shim(os.environ) | {topology.ENV_RUN_ID: run}
        env.setdefault(topology.ENV_JOB_ID, run)
        log_path = os.path.join(run_dir, "daemon.log")
        log_fd = secure.open_private_file(log_path, os.O_WRONLY | os.O_APPEND)
        try:
            # close_fds: the daemon outlives the command and must not hold what the launcher
            # inherited (an MPI launcher's PMI socket, its stdout and stderr pipes)
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log_fd,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        finally:
            os.close(log_fd)
        log.debug("phase daemon.spawned")
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DaemonError(f"the node daemon exited with code {proc.returncode} while starting; "
                                  f"see {log_path}:\n{_tail(log_path)}")
            session = attach(socket_path)
            if session is not None:
                log.debug("phase daemon.attached")
                return session, proc
            time.sleep(0.02)
        proc.kill()
        raise DaemonError(f"the node daemon did not answer within {DAEMON_START_TIMEOUT:.0f} s; see {log_path}")


# -- a cluster job's launcher waits for its node's standing daemon (issue 20) -----------------
ENV_CLUSTER = "MONARCH_CLUSTER"  # "1": this run belongs to a cluster of `monarch serve`; "0": it does not
CLUSTER_WAIT_TIMEOUT = 300.0     # seconds a cluster job's launcher waits for its node's daemon
CLUSTER_WAIT_NOTE = 5.0          # a progress line on stderr this often while it waits


def is_cluster_run(config_file: str | None, env=None) -> bool:
    """Is this ``monarch run`` part of a cluster job (its node's daemon is a standing ``monarch
    serve`` of the job, never one it starts)? ``MONARCH_CLUSTER=1|0`` says so explicitly;
    otherwise yes when the node index is given (MONARCH_NODE or SLURM_NODEID) and the
    configuration file itself has a ``peer`` section (the shipped defaults' does not count)."""
    env = os.environ if env is None else env
    forced = env.get(ENV_CLUSTER, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if not config_file or not any(env.get(v, "").isdigit() for v in topology._NODE_VARS):
        return False
    try:
        import yaml
        with open(config_file) as f:
            raw = yaml.safe_load(f)
    except (OSError, ValueError, ImportError) as e:
        log.debug("cannot tell whether %s configures a cluster: %s", config_file, e)
        return False
    return isinstance(raw, dict) and raw.get("peer") is not None


def wait_for_cluster_daemon(config: Config, node: int, timeout: float | None = None, out=None) -> Session:
    """Attach to node ``node``'s standing daemon of this job, waiting for it to come up (the
    readers may start before or with the daemons), with a line on stderr every few seconds.
    DaemonError after ``timeout`` (then the command runs on the PFS: fail open)."""
    timeout = float(os.environ.get("MONARCH_CLUSTER_WAIT", CLUSTER_WAIT_TIMEOUT)) if timeout is None else timeout
    out = sys.stderr if out is None else out
    job = topology.job_id()
    path = layout.socket_path(config.run_base, job, node)
    t0 = time.monotonic()
    note = t0 + CLUSTER_WAIT_NOTE
    dead_since = None
    while True:
        session = attach(path)
        if session is not None:
            if _serves(session, config):
                return session
            session.close()
            raise DaemonError(f"node {node}'s daemon of job {job} at {path} serves another dataset")
        now = time.monotonic()
        if dead_since is None and _daemon_died(os.path.dirname(path)):
            dead_since = now
        if dead_since is not None and now - dead_since > CLUSTER_DEAD_WAIT:
            raise DaemonError(f"node {node}'s daemon of job {job} died (its socket {path} is left and nothing holds "
                              f"its lock) and no new one came within {CLUSTER_DEAD_WAIT:.0f} s")
        if now - t0 > timeout:
            raise DaemonError(f"node {node}'s daemon of job {job} did not come up within {timeout:.0f} s at {path} "
                              "(start `monarch serve -c CONFIG` on every node under mpiexec or srun, with the same "
                              f"job id; or set {ENV_CLUSTER}=0 to run single-node)")
        if now >= note:
            out.write(f"monarch: waiting for node {node}'s daemon of job {job} ({now - t0:.0f} s; "
                      f"up to {timeout:.0f} s): {path}\n")
            out.flush()
            note = now + CLUSTER_WAIT_NOTE
        time.sleep(0.05)


CLUSTER_DEAD_WAIT = 10.0  # seconds a launcher waits for a dead daemon (killed) to be replaced


def _daemon_died(run_dir: str) -> bool:
    """Did this node's daemon die here (its published socket is left, its lock is free)? A
    daemon restarted after a crash replaces both: the caller waits a little for that."""
    if not os.path.exists(os.path.join(run_dir, "daemon.sock")):
        return False
    try:
        fd = os.open(os.path.join(run_dir, "daemon.lock"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False  # held: a live daemon (starting up)
    finally:
        os.close(fd)  # closing drops our shared lock
    return True


def _without_shim(env) -> dict[str, str]:
    """The daemon reads the PFS itself: it must never run under the shim."""
    env = dict(env)
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and "libmonarch_shim" not in p]
    env["LD_PRELOAD"] = ":".join(preload)
    env[protocol.ENV_DISABLE] = "1"
    return env


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def app_env(session_env: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(session_env)
    shim = str(shim_library())
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
    signals.proc = proc
    try:
        code = proc.wait()
    finally:
        signals.proc = None
    return 128 - code if code < 0 else code


def run(config: Config, config_file: str | None, cmd: list[str], report_path: str | None,
        run: str | None = None, out=sys.stderr, progress: bool = True, html_path: str | None = None) -> int:
    """The whole of ``monarch run``. Monarch trouble never stops the command: it runs on the PFS.

    ``progress``: show live progress on ``out`` while the command runs (monarch/launch/progress.py);
    ``html_path``: also write the report as HTML (else the configuration's ``report_html``).
    """
    t0 = time.time()
    session = daemon = None
    run = run or topology.run_id() or topology.new_run_id()
    baseline = None
    launchers = RunLaunchers(None, run)
    try:
        session, daemon = attach_or_start(config, config_file, run)
        launchers = RunLaunchers(session.run_dir, run)
        if session.run.get("run") != run:  # the job's standing daemon: report this run's share
            baseline = session.stats(brief=True)  # the counters: answered at once, even during its walk
        env = app_env(session.env)
        _say_unused_tiers(session)
    except Exception as e:  # fail open: the job runs unaccelerated
        log.error("Monarch is not active for this run (%s); reading the PFS directly", e)
        env = dict(os.environ)
    env[topology.ENV_RUN_ID] = run  # nested `monarch run` and the command's children share the run
    shown = None
    if session is not None and progress:
        from monarch.launch.progress import Progress
        shown = Progress(lambda: session.stats(brief=True), out).start()
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
            _tear_down(config, session, daemon, signals, cmd, code, run, time.time() - t0, baseline, report_path,
                       html_path, out, launchers.last_to_leave())
        except _Interrupted:
            launchers.last_to_leave()  # no report; the last removes the group's file all the same
            code = _cut_short(config, session, daemon, shown, code if signals.killed else 128 + signals.cut, out)
    return code


def _tear_down(config: Config, session: Session | None, daemon: subprocess.Popen | None, signals: _Signals,
               cmd: list[str], code: int, run: str, wall: float, baseline: dict | None, report_path: str | None,
               html_path: str | None, out, last: bool = True) -> None:
    """The command has ended: the report (printed in full by the run's ``last`` launcher on the
    node), then the embedded daemon's exit (its tiers removed)."""
    with signals.waiting():  # the daemon holds the final report until its snapshot is ready
        stats = session.stats(final=True) if session is not None else None
    log.debug("phase report.fetched")
    if session is None:
        return
    session.close()
    try:  # the report first: the daemon's exit (its tiers removed) is waited for after it
        signals.check()
        _print_and_write(config, session, cmd, code, run, wall, stats, baseline, report_path, html_path, out, last)
    finally:
        if daemon is not None:
            with signals.waiting():
                _reap(daemon, config)
            log.debug("phase daemon.reaped")


def _cut_short(config: Config, session: Session | None, daemon: subprocess.Popen | None, shown, code: int,
               out) -> int:
    """A signal during the tear-down: no report, but the daemon's exit still waited for (the
    signals meanwhile are only noted), so that nothing is left behind."""
    out.write("monarch: interrupted: the report is skipped; the node daemon stops\n")
    if shown is not None:
        shown.stop()
    if session is not None:
        session.close()  # the run's last session: the embedded daemon stops and removes its tiers
    if daemon is not None:
        _reap(daemon, config)
    return code


def _say_unused_tiers(session: Session) -> None:
    """One line per tier the daemon could not use, at the start: its own log is a file."""
    errors = session.run.get("tier_errors")
    for name, reason in (errors.items() if isinstance(errors, dict) else ()):
        log.warning("tier %s is not used (the run goes on without it): %s", name, reason)


def _print_and_write(config: Config, session: Session, cmd: list[str], code: int, run: str, wall: float,
                     stats: dict | None, baseline: dict | None, report_path: str | None, html_path: str | None,
                     out, last: bool = True) -> None:
    node = NodeStats.from_wire(stats)
    if node is None:
        node = _stats_without_daemon(config, session)
        log.warning("the node daemon was lost during the run; the report holds the shim's counts only")
    elif baseline is not None:
        node = session_delta(node, NodeStats.from_dict(baseline))
    report = build_report([node], {"run_id": run, "job_id": topology.job_id(),
                                    "config": config.source, "command": cmd, "exit_code": code,
                                    "wall_seconds": round(wall, 3)})
    path = report_path or config.report or os.path.join(session.run_dir, "report.json")
    try:
        write_report(report, path)
    except OSError as e:
        log.warning("cannot write the report to %s: %s", path, e)
    if last:
        print_report(report, out)
        out.write(f"report    : {path}\n")
        _warn_if_bypassed(report, out)
    else:
        _point_to_the_report(path, out)
    log.debug("phase report.printed")
    html_path = html_path or config.report_html
    if html_path:
        try:
            from monarch.report.html import write_html
            write_html(report, html_path)
            out.write(f"html      : {html_path}\n")
        except (OSError, MonarchError) as e:
            log.warning("cannot write the HTML report to %s: %s", html_path, e)


def _warn_if_bypassed(report: dict, out) -> None:
    """One line when the command's readers did not go through the shim (monarch/report/bypass.py)."""
    warning = bypass_warning(report)
    if warning:
        out.write(f"monarch: warning: {warning}\n")


def _point_to_the_report(path: str, out) -> None:
    """A launcher that is not the last of its run on the node: one line, not the whole report."""
    out.write(f"monarch: report of node {topology.node_index()}: printed by this run's last launcher on the node "
              f"to leave; JSON: {path}\n")


def _reap(daemon: subprocess.Popen, config: Config) -> None:
    """The embedded daemon stops by itself when the run's last session closes.

    If it is still running, other launchers of the run are attached: leave it to them.
    If it died, remove the copies it left (its tier directories name a process that is gone).
    """
    from monarch.node.server import EMBEDDED_IDLE_SECONDS  # the daemon's modules stay off the launch path
    try:
        daemon.wait(timeout=EMBEDDED_IDLE_SECONDS + 10)
    except subprocess.TimeoutExpired:
        return
    if daemon.returncode != 0:
        for base in {t.path for t in config.tiers} | {config.peer.path}:
            try:
                layout.remove_leftovers(layout.user_dir(base))
            except MonarchError:
                pass


def _stats_without_daemon(config: Config, session: Session) -> NodeStats:
    """The shim's counters survive the daemon: report what the application read."""
    names = protocol.slot_names([t.name for t in config.tiers], with_peer=False)
    counters = session.env[protocol.ENV_COUNTERS]
    try:
        processes = protocol.read_extra_counters(counters)[protocol.EXTRA_PROCESSES]
    except (OSError, ValueError):
        processes = None
    return NodeStats(node=0, host=socket.gethostname(),
                     opened_from=protocol.read_opened_from(counters, names),
                     staging={"files": 0, "bytes": 0, "pfs_files_read": 0, "pfs_bytes_read": 0,
                              "failures": {"daemon_lost": 1}},
                     processes_with_shim=processes)
