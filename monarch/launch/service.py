"""A node daemon's life seen from outside: find it or start it, attach to it, stop it, wait
for its tear-down, serve as one, and write its report.

``monarch run`` (monarch/launch/run.py) finds its run's daemon (or its job's standing one) and
otherwise starts an embedded one (``start``), attaches (``Session``) and, when the command has
ended, waits for the embedded daemon's exit (``wait_stopped``); ``monarch serve`` runs a daemon
(``serve``) and ``monarch stop`` stops one (``stop``), both from monarch/cli.py. The report is
built and written here for both (``report_path``, ``build``, ``save``). The run directory's
files are named by monarch/layout.py and monarch/node/instance.py, never here.

No MPI and none of the daemon's modules on the launch path: ``serve`` imports them when called.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from threading import Lock

from monarch import layout, protocol, secure, topology
from monarch.config import Config, differences, from_json, served, to_json
from monarch.errors import ConfigError, DaemonError, MonarchError
from monarch.launch import forked
from monarch.node.tiers.shared_set import drop_expired

log = logging.getLogger(__name__)

# a daemon answers ATTACH before its snapshot walk (which runs while the command starts);
# starting is an interpreter, its imports and the tiers, but a loaded node can be slow
DAEMON_START_TIMEOUT = 600.0
ATTACH_TIMEOUT = 10.0          # a daemon answers ATTACH at once (its event loop never waits)
REPORT_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0            # `monarch stop`: the daemon answers STOP once it has stopped serving
MAX_ENV_VALUE = 1 << 16
MAX_DIFFERENCES_SAID = 3       # keys named when a daemon serves another configuration (one line)

# ``python -m MODULE`` as Monarch starts it: the working directory is not searched (``-m`` and ``-c``
# put it first on sys.path, where a ``monarch/`` folder of the user's would shadow this package),
# and ``monarch`` is imported from where this process imported it, whatever PYTHONPATH says (on
# Python 3.9 and later: ``-P`` is 3.11's; ``-I`` would drop PYTHONPATH, which HPC modules set)
_BOOT = ("import runpy, sys\n"
         "if sys.path[:1] == ['']: del sys.path[0]\n"
         "sys.path.insert(0, {root!r}); import monarch; del sys.path[0]\n"
         "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")


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
        self._lock = Lock()  # the progress thread polls on the same connection

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

    def poll(self) -> dict | None:
        """The daemon's brief statistics on a connection of its own, answered at once: what the
        launcher shows while this session's connection waits for its final REPORT (the drain)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(REPORT_TIMEOUT)
                sock.connect(self.socket_path)
                secure.check_peer_is_me(sock)
                sock.sendall(protocol.encode_request(protocol.VERB_REPORT, protocol.REPORT_BRIEF))
                status, body = protocol.recv_answer(sock)
            stats = json.loads(body) if status == 0 else None
            return stats if isinstance(stats, dict) else None
        except (OSError, ValueError, MonarchError):
            return None

    def serves(self, config: Config) -> bool:
        """Does the daemon serve this configuration: the same dataset, tiers, staging, peer and
        memory margin (``monarch.config.served``)? One that serves another would not do what
        this run's configuration says: the run does not use it (a line says what differs)."""
        theirs, mine = self.run.get("served"), served(config)
        if theirs == mine:
            return True
        if isinstance(theirs, dict):
            lines = differences(theirs, mine, ("in the daemon", "in this run"))
            why = "; ".join(lines[:MAX_DIFFERENCES_SAID]) + (
                f"; and {len(lines) - MAX_DIFFERENCES_SAID} more" if len(lines) > MAX_DIFFERENCES_SAID else "")
        else:
            why = "it does not say what it serves"
        log.warning("the daemon at %s serves another configuration (%s): this run does not use it",
                    self.socket_path, why)
        return False

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


# -- the dataset's saved index ---------------------------------------------------------------

SAVED_INDEXES = "snapshots"  # NodeDaemon._snapshot_cache's directory (tests/unit/node/snapshot/test_snapshot_kept.py holds them together)


def saved_index(config: Config) -> str | None:
    """The dataset's saved index this job's daemon starts from (it loads it unless a directory
    changed since), or None: it walks. Kept only with a ``keep: true`` tier (its walk is what a chain of jobs saves), never
    read with ``staging.validate: open``."""
    if config.staging.validate == "open" or not any(t.keep for t in config.tiers):
        return None
    try:
        path = os.path.join(layout.user_dir(config.run_base), SAVED_INDEXES,
                            f"{layout.dataset_id(config.dataset.roots)}.index")
    except (MonarchError, OSError):
        return None
    return path if os.path.isfile(path) else None


# -- find or start (monarch run) ------------------------------------------------------------

def find(config: Config, run: str) -> Session | None:
    """A session with the daemon of this job on this node (a standing ``monarch serve``) when one
    is up and serves this configuration (``Session.serves``; another's is left to its job and the
    run gets a daemon of its own); None: the run's own daemon is to be found or started (``start``)."""
    try:
        layout.user_dir(config.run_base)  # checked once here, so an unsafe base names its key
    except secure.UnsafeBaseError as e:
        raise MonarchError(f"config {config.source}: run_base: {e}") from None
    node = topology.node_index()
    for rid in [j for j in [topology.job_id()] if j != run]:
        session = attach(layout.socket_path(config.run_base, rid, node))
        if session is not None:
            if session.serves(config):
                return session
            session.close()
    return None


@contextmanager
def _start_lock(run_dir: str):
    path = os.path.join(run_dir, layout.START_LOCK)
    fd = secure.open_private_file(path)
    try:
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DaemonError(f"another launcher holds {path} for too long") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def python_command(module: str) -> list[str]:
    """The command line of ``python -m module`` running this very package (the one this process
    imported: the installed one, or a checkout's under its tests), never a ``monarch/`` of the
    working directory: the embedded daemon, the demo's workload and tools are started with it."""
    import monarch
    root = os.path.dirname(os.path.dirname(os.path.abspath(monarch.__file__)))
    return [sys.executable, "-c", _BOOT.format(root=root, module=module)]


def start(config: Config, run: str) -> tuple[Session, forked.Daemon | None]:
    """Attach to the run's daemon on this node, starting an embedded one if none runs yet (the
    process is returned only when this launcher started it: ``wait_stopped`` waits for it).
    The daemon receives ``config`` as this launcher checked it (forked, as it is; spawned, on
    its standard input: ``received_config``): it never reads the user's file again."""
    node = topology.node_index()
    run_dir = layout.run_dir(config.run_base, run, node)
    socket_path = layout.socket_path(config.run_base, run, node)
    with _start_lock(run_dir):  # several launchers of the run on a node start one daemon
        session = attach(socket_path)
        if session is not None:
            if session.serves(config):
                return session, None
            session.close()
            raise DaemonError(f"the run's daemon at {socket_path} serves another configuration; "
                              "give this job its own MONARCH_JOB_ID")
        # the daemon expands the configuration with the launcher's run id, whatever its parents
        env = _without_shim(os.environ) | {topology.ENV_RUN_ID: run}
        env.setdefault(topology.ENV_JOB_ID, run)
        log_path = os.path.join(run_dir, layout.DAEMON_LOG)
        log_fd = secure.open_private_file(log_path, os.O_WRONLY | os.O_APPEND)
        try:
            if forked.can_fork(config):  # no second interpreter to start (forked.py)
                proc = forked.fork_daemon(lambda: _serve_forked(config, run), env, log_fd)
            else:
                cmd = [*python_command("monarch"), *(["-vv"] if log.isEnabledFor(logging.DEBUG) else []),
                       "serve", "--embedded"]
                # close_fds: the daemon outlives the command and must not hold what the launcher
                # inherited (an MPI launcher's PMI socket, its stdout and stderr pipes)
                proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=log_fd,
                                        stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        finally:
            os.close(log_fd)
        if isinstance(proc, subprocess.Popen):
            _hand_over(proc, config)
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


def _serve_forked(config: Config, run: str) -> int:
    """The forked daemon's life (``monarch serve --embedded``'s): ``config`` through its text, as a
    spawned daemon receives it (the same expansions, nothing shared with the launcher)."""
    import_daemon()
    return serve(from_json(to_json(config)), run, None, True, None)


def _hand_over(proc: subprocess.Popen, config: Config) -> None:
    """Write the checked configuration to the daemon's standard input, and close it (a few KiB:
    the pipe holds it whether the daemon reads it yet or not)."""
    try:
        proc.stdin.write(to_json(config).encode())
    except OSError as e:  # it died at once: the wait for its socket says so, with its log
        log.debug("the daemon did not take its configuration: %s", e)
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


def received_config(stream=None) -> Config:
    """``monarch serve --embedded``: the configuration its launcher checked (``_hand_over``)."""
    stream = sys.stdin.buffer if stream is None else stream
    try:
        return from_json(stream.read())
    except ConfigError as e:
        raise ConfigError(f"monarch serve --embedded: its standard input: {e}") from None


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


def daemon_died(run_dir: str) -> bool:
    """Did this node's daemon die here (its published socket is left, its lock is free)? A
    daemon restarted after a crash replaces both: the caller waits a little for that."""
    from monarch.node.instance import LOCK  # the instance's own name (a light module: no daemon imports)
    if not os.path.exists(os.path.join(run_dir, layout.SOCKET)):
        return False
    try:
        fd = os.open(os.path.join(run_dir, LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False  # held: a live daemon (starting up)
    finally:
        os.close(fd)  # closing drops our shared lock
    return True


# The embedded daemon's tear-down removes every copy it staged; `monarch run` waits for it up
# to a bound that grows with the copies, since a million copies take longer to remove than any
# fixed wait. The allowance per file is `rm -rf`'s on a disk tier, rounded up (slower than
# tmpfs; docs/performance.md, "What the constants rest on").
TEARDOWN_BASE_SECONDS = 10.0          # the daemon's own ending (its threads, the report), as before
TEARDOWN_SECONDS_PER_FILE = 250e-6    # per staged copy (the last REPORT's ``staging.files``)


def teardown_bound(staged_files: int) -> float:
    """Seconds the launcher waits for its embedded daemon's exit once its last session closed."""
    from monarch.node.server import EMBEDDED_IDLE_SECONDS  # the daemon's modules stay off the launch path
    return EMBEDDED_IDLE_SECONDS + TEARDOWN_BASE_SECONDS + max(0, staged_files) * TEARDOWN_SECONDS_PER_FILE


def wait_stopped(daemon: forked.Daemon, config: Config, staged_files: int = 0, alone: bool = True,
                 run: str | None = None, out=None) -> bool:
    """Wait for the embedded daemon's tear-down: it stops by itself when the run's last session
    closes, and removes its copies (``staged_files`` of them: the bound grows with them). True:
    it has exited.

    Not ``alone`` (other launchers of the run are still attached): it goes on serving them;
    wait only the base bound, then leave it to them. If it does not exit within the bound
    although this launcher was the last, say so once on ``out`` (stderr): what is left, where.
    If it died, remove the copies it left (its tier directories name a process that is gone).
    """
    bound = teardown_bound(staged_files if alone else 0)
    t0 = time.monotonic()
    try:
        daemon.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        if alone:
            _say_still_tearing_down(daemon, config, staged_files, time.monotonic() - t0, run,
                                    sys.stderr if out is None else out)
        return False
    if daemon.returncode != 0:
        for base in {t.path for t in config.tiers} | {config.peer.path}:
            try:
                layout.remove_leftovers(layout.user_dir(base))
                drop_expired(layout.user_dir(base))  # its shared sets, if it was the last job on them, linger
            except (MonarchError, OSError):
                pass
    return True


def _say_still_tearing_down(daemon: forked.Daemon, config: Config, staged_files: int, waited: float,
                            run: str | None, out) -> None:
    """One line: the daemon has not exited; what it still holds (its run's tier directories) and where."""
    left = []
    for base in sorted({t.path for t in config.tiers} | {config.peer.path}):
        try:
            parent = layout.user_dir(base)
            names = os.listdir(parent)
        except (MonarchError, OSError):
            continue
        prefix = layout.run_name(run, topology.node_index()) + "-" if run else None
        left += [os.path.join(parent, n) for n in sorted(names)
                 if prefix is not None and n.startswith(prefix) and os.path.isdir(os.path.join(parent, n))]
    where = ", ".join(left) if left else "its tier directories under " + ", ".join(
        sorted({t.path for t in config.tiers}))
    try:
        out.write(f"monarch: the node daemon (pid {daemon.pid}) is still tearing down after {waited:.0f} s "
                  f"(it had staged {staged_files} files); not waiting longer: it goes on removing them in "
                  f"the background: {where}\n")
        out.flush()
    except (OSError, ValueError):
        pass


# -- stop (monarch stop) --------------------------------------------------------------------

def stop(config: Config) -> None:
    """Ask this node's standing daemon of the job to stop; MonarchError if none answers."""
    path = layout.socket_path(config.run_base, topology.job_id(), topology.node_index())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(STOP_TIMEOUT)
        sock.connect(path)
        secure.check_peer_is_me(sock)
        sock.sendall(protocol.encode_request(protocol.VERB_STOP))
        protocol.recv_answer(sock)
    except (OSError, ValueError) as e:
        raise MonarchError(f"no Monarch daemon answers at {path} ({getattr(e, 'strerror', None) or e})") from None
    finally:
        sock.close()


# -- serve (monarch serve) ------------------------------------------------------------------

def import_daemon() -> None:
    """Import the daemon's modules (a phase of its own in a debug log: scripts/node/bench_startup.py)."""
    import monarch.node.daemon  # noqa: F401
    import monarch.node.server  # noqa: F401
    log.debug("phase daemon.imported")


class _EarlyStop:
    """A SIGTERM or SIGINT that comes before the daemon serves (during MPI_Init, its imports,
    its tiers: `kill %1` of `monarch serve --slurm` at once, a job cancelled as it starts) is
    kept and acted on once it serves, instead of killing it before it can stop cleanly (its
    peers waiting for it, no report)."""
    signals: list[int] = []


def catch_stop_signals() -> list[int]:
    """From a standing daemon's very start: keep SIGTERM and SIGINT for ``serve`` (or for
    ``monarch serve --slurm``'s step, monarch/launch/slurm.py); the list they are kept in."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: _EarlyStop.signals.append(signum))
    return _EarlyStop.signals


OPEN_FILES_WANTED = 1 << 16  # the daemon's descriptors: copies in flight (4 each), connections, tiers


def raise_open_files_limit() -> None:
    """The daemon's soft descriptor limit raised toward its hard one: a slow PFS keeps hundreds
    of copies in flight, each with a few descriptors, and a node's soft limit is often 1,024
    (the front door starts only as many copiers as the limit allows either way)."""
    import resource
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as e:  # the limit stays: fewer copiers in flight, nothing else
        log.debug("the descriptor limit stays as it is: %s", e)


MALLOC_ARENAS = 2  # glibc malloc arenas the daemon's threads share (M_ARENA_MAX)


def limit_malloc_arenas() -> None:
    """The daemon's threads (up to 256 stager copies, the door's copiers) share MALLOC_ARENAS of
    glibc's arenas, not up to 8 a core, each keeping its freed memory resident (~10 MB). The
    environment's MALLOC_ARENA_MAX rules; without glibc's mallopt nothing changes."""
    import ctypes
    try:
        if not os.environ.get("MALLOC_ARENA_MAX"):
            ctypes.CDLL(None).mallopt(-8, MALLOC_ARENAS)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def serve(config: Config, rid: str, cluster, embedded: bool, report: str | None) -> int:
    """Run this node's daemon until it is stopped (``monarch stop``, a signal, or, embedded, its
    run's last launcher leaving); a standing one then writes the job's report (``report``: the
    ``--report`` option). ``cluster``: the peers under MPI (None: a node alone)."""
    from monarch.node.daemon import NodeDaemon
    from monarch.node.server import NodeServer
    from monarch.topology import node_index
    # the snapshot walk runs in the background: the socket answers and the command starts meanwhile
    # embedded: the node its launcher named (MONARCH_NODE / SLURM_NODEID), where the launcher looks for its socket
    from monarch.launch import mpi_shm
    raise_open_files_limit()
    limit_malloc_arenas()
    if not embedded:  # what killed daemons of the node left in memory (their MPI's shared-memory files)
        mpi_shm.remove_dead(layout.user_dir(config.run_base), rid)
    # (a store's snapshot is one GET of its manifest, made before the socket answers: there is no
    # PFS under a store's root for the command's first calls to fall back to)
    daemon = NodeDaemon(config, rid, cluster=cluster, node=node_index() if cluster is None else 0,
                        background=not config.dataset.stores)
    if cluster is not None:
        mpi_shm.record(daemon.run_dir)  # for the next daemon of the node, should this one be killed
    server = NodeServer(daemon, embedded=embedded)
    pid_file = os.path.join(daemon.run_dir, layout.PID_FILE)
    secure.write_file_atomically(pid_file, f"{os.getpid()}\n".encode())
    signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
    signal.signal(signal.SIGINT, lambda *_: server.request_stop())
    if _EarlyStop.signals:  # asked to stop while it was starting (catch_stop_signals)
        log.warning("stopping: signal %d came while starting", _EarlyStop.signals[0])
        server.request_stop()
    try:
        server.serve()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("CPU seconds by thread: %s", thread_cpu_seconds())
        if cluster is not None:  # the walk's thread may be in a collective (share): MPI is one thread's at a time
            daemon.gate.wait_settled()
        if not embedded:  # a standing daemon writes the job's report; embedded ones leave it to `monarch run`
            # finish() keeps serving peers until every node is done, so tiers stay until then
            nodes = cluster.finish(daemon.stats) if cluster is not None else [daemon.stats()]
            if nodes is not None:
                # a standing daemon's: the configuration's report wins over --report
                path = report_path(daemon.run_dir, config.report, report)
                save(build(nodes, {"job_id": rid, "config": config.source, "nodes": len(nodes)}), path)
                log.warning("report written to %s", path)
    finally:
        daemon.close()
        _remove(pid_file)
        log.debug("phase daemon.closed")
        if cluster is not None:
            cluster.close()
    return 0


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def thread_cpu_seconds() -> str:
    """The live threads' CPU seconds (user + system, from /proc), summed by name without its
    number (``monarch-stage-12`` counts as ``monarch-stage``; a thread of C, such as the front
    door's or the peer data path's, by the name it gave itself), and the rest of the
    process's (threads that have ended): where a daemon's CPU went."""
    import re
    import threading
    tick = os.sysconf("SC_CLK_TCK")
    python_names = {t.native_id: t.name for t in threading.enumerate()}
    by_name: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:  # not Linux
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                comm, fields = f.read().split("(", 1)[1].rsplit(")", 1)
            fields = fields.split()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        name = re.sub(r"[-_]\d+(_\d+)?$", "", python_names.get(int(tid), comm))
        by_name[name] = by_name.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    by_name["ended threads"] = time.process_time() - sum(by_name.values())
    return ", ".join(f"{n} {s:.2f}" for n, s in sorted(by_name.items(), key=lambda kv: -kv[1]))


# -- the report (monarch run and a standing monarch serve) ---------------------------------

def report_path(run_dir: str, *chosen: str | None) -> str:
    """Where the report goes: the first of ``chosen`` given (each caller's order of the command
    line and the configuration), else ``report.json`` in the run directory."""
    return next((path for path in chosen if path), os.path.join(run_dir, layout.REPORT))


def build(nodes: list, meta: dict) -> dict:
    """The report of ``nodes`` (NodeStats); of a cluster, also who was lost, when and why."""
    from monarch.report.build import build_report
    report = build_report(nodes, meta)
    if len(nodes) > 1:  # a cluster: who was lost, when and why (monarch/cluster/lost.py)
        from monarch.cluster.lost import add_to_report
        add_to_report(report, nodes)
    return report


def save(report: dict, path: str) -> None:
    """Write ``report`` as JSON at ``path`` (OSError: it could not be written)."""
    from monarch.report.store import write_report
    write_report(report, path)
