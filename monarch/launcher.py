"""``monarch run``: attach to (or start) this node's daemon, run the command under the shim,
and print the report.

No MPI here: in a cluster the daemons are started by ``monarch serve`` under mpiexec and
the launcher only attaches; alone it starts an embedded daemon that lives as long as
some launcher of the job is attached to it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

from monarch import protocol, topology
from monarch.config import Config, load_config
from monarch.errors import DaemonError
from monarch.report import build_report, print_report, write_report
from monarch.server import EMBEDDED_IDLE_SECONDS
from monarch.shim import shim_library

log = logging.getLogger(__name__)

DAEMON_START_TIMEOUT = 600.0  # the snapshot of a large dataset takes a while


class Session:
    """One launcher's attachment to the daemon (an open connection)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = sock.makefile("rb")
        line = self.reader.readline()
        if not line.startswith(b"OK "):
            raise DaemonError(f"unexpected answer from the daemon: {line[:200]!r}")
        self.env: dict[str, str] = json.loads(line[3:])

    def stats(self) -> dict | None:
        try:
            self.sock.sendall(b"REPORT\n")
            line = self.reader.readline()
            return json.loads(line) if line else None
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def attach(config: Config) -> Session | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(config.socket_path)
        sock.sendall(b"ATTACH\n")
        return Session(sock)
    except OSError:
        sock.close()
        return None


@contextmanager
def _start_lock(config: Config):
    os.makedirs(config.run_dir, exist_ok=True)
    with open(os.path.join(config.run_dir, "start.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def attach_or_start(config: Config, config_file: str | None,
                    run_id: str | None = None) -> tuple[Session, subprocess.Popen | None]:
    """Attach to the run's daemon on this node, starting an embedded one if none runs."""
    session = attach(config)
    if session is not None:
        return session, None
    with _start_lock(config):  # several launchers on a node start one daemon
        session = attach(config)
        if session is not None:
            return session, None
        cmd = [sys.executable, "-m", "monarch", "serve", "--embedded"]
        if config_file:
            cmd += ["-c", config_file]
        env = _without_shim(os.environ)
        if run_id:  # the daemon expands the configuration with the launcher's run id, whatever its parents
            env[topology.ENV_RUN_ID] = run_id
            env.setdefault(topology.ENV_JOB_ID, run_id)
        log_path = os.path.join(config.run_dir, "daemon.log")
        with open(log_path, "ab") as log_file:
            # close_fds: the daemon outlives the command and must not hold what the launcher
            # inherited (an MPI launcher's PMI socket, its stdout and stderr pipes)
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DaemonError(f"the node daemon exited with code {proc.returncode} while starting; "
                                  f"see {log_path}:\n{_tail(log_path)}")
            session = attach(config)
            if session is not None:
                return session, proc
            time.sleep(0.02)
        proc.kill()
        raise DaemonError(f"the node daemon did not answer within {DAEMON_START_TIMEOUT:.0f} s; see {log_path}")


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


def run_command(cmd: list[str], env: dict[str, str]) -> int:
    """Run ``cmd``, forwarding SIGINT/SIGTERM; return its exit code (128+N for a signal).

    The command inherits every descriptor ``monarch run`` inherited (close_fds=False): an MPI
    launcher's PMI_FD, a scheduler's or torchrun's sockets. Monarch's own descriptors are
    close-on-exec (PEP 446) and stay behind.
    """
    proc = subprocess.Popen(cmd, env=env, close_fds=False)
    forwarded = {}

    def forward(signum, _frame):
        forwarded[signum] = forwarded.get(signum, 0) + 1
        # first signal: pass it on; a second Ctrl-C means "now": kill
        if signum == signal.SIGINT and forwarded[signum] > 1:
            proc.kill()
        else:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def run(config: Config, config_file: str | None, cmd: list[str], report_path: str | None,
        out=sys.stderr) -> int:
    """The whole of ``monarch run``. Monarch trouble never stops the command: it runs on the PFS."""
    t0 = time.time()
    session = daemon = None
    run_id = topology.run_id()
    try:
        if run_id is None:  # the outermost run of an unnamed job names it, and its config sees the name
            run_id = topology.new_run_id()
            config = load_config(config_file, env=dict(os.environ, **{topology.ENV_RUN_ID: run_id}))
        session, daemon = attach_or_start(config, config_file, run_id)
        env = app_env(session.env)
    except Exception as e:  # fail open: the job runs unaccelerated
        log.error("Monarch is not active for this run (%s); reading the PFS directly", e)
        env = dict(os.environ)
    env[topology.ENV_RUN_ID] = run_id  # nested `monarch run` and the command's children share the run
    code = run_command(cmd, env)
    wall = time.time() - t0
    stats = session.stats() if session is not None else None
    if session is not None:
        session.close()
    if daemon is not None:
        _reap(daemon, config)
    if session is None:
        return code
    if stats is None:
        stats = _stats_without_daemon(config)
        log.warning("the node daemon was lost during the run; the report holds the shim's counts only")
    report = build_report([stats], {"job_id": run_id,
                                    "config": config.source, "command": cmd, "exit_code": code,
                                    "wall_seconds": round(wall, 3)})
    path = report_path or config.report_path
    try:
        write_report(report, path)
    except OSError as e:
        log.warning("cannot write the report to %s: %s", path, e)
    print_report(report, out)
    out.write(f"report    : {path}\n")
    return code


def _reap(daemon: subprocess.Popen, config: Config) -> None:
    """The embedded daemon stops by itself when the job's last session closes.

    If it is still running, other launchers of the job are attached: leave it to them.
    If it died, clean up the tiers it could not.
    """
    try:
        daemon.wait(timeout=EMBEDDED_IDLE_SECONDS + 10)
    except subprocess.TimeoutExpired:
        return
    if daemon.returncode != 0:
        for tier in config.tiers:
            if not tier.keep:
                shutil.rmtree(tier.path, ignore_errors=True)


def _stats_without_daemon(config: Config) -> dict:
    """The shim's counters survive the daemon: report what the application read."""
    names = protocol.slot_names([t.name for t in config.tiers], with_peer=False)
    return {"node": 0, "host": socket.gethostname(),
            "sources": protocol.read_sources(config.counters_path, names),
            "staging": {"files": 0, "bytes": 0, "pfs_files_read": 0, "pfs_bytes_read": 0,
                        "failures": {"daemon_lost": 1}},
            "dataset": {"files": 0, "bytes": 0}, "peer": {}, "resolves": {}, "tiers": []}
