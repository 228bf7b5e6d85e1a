"""The daemon's Unix socket: the shim's OPEN requests and the launchers' sessions.

An accept thread hands each connection to a pool of request threads made once (a thread
per connection cost more than the answer itself); a request waiting for its file to be
staged holds one of them. Launcher sessions are connections held open for a run, each on
a thread of its own: when the last one closes an embedded daemon stops by itself, so a
killed launcher never leaves a daemon behind.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from monarch.daemon import NodeDaemon
from monarch.errors import DaemonError
from monarch.protocol import format_answer

log = logging.getLogger(__name__)

MAX_LINE = 16384
REQUEST_THREADS = 64  # opens waiting for staging at once; DataLoader workers rarely exceed this per node
EMBEDDED_IDLE_SECONDS = 0.5     # grace after the last session, for launchers started a moment apart
EMBEDDED_FIRST_ATTACH_SECONDS = 120.0


class NodeServer:
    """Serves one NodeDaemon on its socket until stopped (or, embedded, until unused)."""

    def __init__(self, daemon: NodeDaemon, embedded: bool):
        self.daemon = daemon
        self.embedded = embedded
        self.path = daemon.config.socket_path
        self._sessions = 0
        self._ever_attached = False
        self._last_change = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        _claim_socket(self.path)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(1024)
        self._pool = ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="monarch-request")

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            conn.settimeout(None)
            self._pool.submit(self._handle, conn)

    def _handle(self, conn: socket.socket) -> None:
        try:
            verb, _, arg = _read_line(conn).partition(" ")
            if verb == "OPEN":
                slot, path = self.daemon.resolve(arg)
                conn.sendall(format_answer(slot, path))
            elif verb == "ATTACH":
                threading.Thread(target=self._session, args=(conn,), name="monarch-session", daemon=True).start()
                return  # the session owns the connection now
            elif verb == "REPORT":
                conn.sendall(json.dumps(self.daemon.stats()).encode() + b"\n")
            elif verb == "STOP":
                conn.sendall(b"OK\n")
                self.request_stop()
            else:
                conn.sendall(b"ERR unknown request\n")
        except OSError:
            pass  # the shim gave up waiting and read the PFS
        except Exception:  # a bug here must not take the daemon down: the shim falls back to the PFS
            log.exception("request failed")
        conn.close()

    def _session(self, conn: socket.socket) -> None:
        with self._lock:
            self._sessions += 1
            self._ever_attached = True
        try:
            conn.sendall(b"OK " + json.dumps(self.daemon.client_env()).encode() + b"\n")
            for line in conn.makefile("rb"):
                if line.strip() == b"REPORT":
                    conn.sendall(json.dumps(self.daemon.stats()).encode() + b"\n")
        except OSError:
            pass
        finally:
            conn.close()
            with self._lock:
                self._sessions -= 1
                self._last_change = time.monotonic()

    def request_stop(self) -> None:
        self._stop.set()

    def serve(self) -> None:
        thread = threading.Thread(target=self._accept, name="monarch-accept", daemon=True)
        thread.start()
        try:
            while not self._stop.wait(0.2):
                if self.embedded and self._unused():
                    log.info("last session closed: stopping")
                    break
        finally:
            self._stop.set()
            thread.join()
            self._listener.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def _unused(self) -> bool:
        with self._lock:
            idle = time.monotonic() - self._last_change
            if self._ever_attached:
                return self._sessions == 0 and idle > EMBEDDED_IDLE_SECONDS
            return idle > EMBEDDED_FIRST_ATTACH_SECONDS


def _read_line(conn: socket.socket) -> str:
    """One request line (a request arrives whole in one recv, nearly always)."""
    data = b""
    while not data.endswith(b"\n") and len(data) < MAX_LINE:
        chunk = conn.recv(MAX_LINE)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").rstrip("\n")


def _claim_socket(path: str) -> None:
    """Refuse to start over a live daemon; remove a socket file a dead one left."""
    if len(path.encode()) >= 108:
        raise DaemonError(f"socket path {path} is too long for a Unix socket (max 107 bytes); "
                          "choose a shorter run_dir in the configuration")
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise DaemonError(f"a Monarch daemon already serves {path}; stop it (monarch stop) or use another run_dir")
