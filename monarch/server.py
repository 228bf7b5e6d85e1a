"""The daemon's Unix socket: the shim's OPEN requests and the launchers' sessions.

A thread per connection (requests are short; staging waits happen off the accept loop).
Launcher sessions are connections held open for a run: when the last one closes an
embedded daemon stops by itself, so a killed launcher never leaves a daemon behind.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
import time

from monarch.daemon import NodeDaemon
from monarch.errors import DaemonError
from monarch.protocol import format_answer

log = logging.getLogger(__name__)

MAX_LINE = 16384
EMBEDDED_IDLE_SECONDS = 0.5     # grace after the last session, for launchers started a moment apart
EMBEDDED_FIRST_ATTACH_SECONDS = 120.0


class _Handler(socketserver.StreamRequestHandler):
    server: "_Server"

    def handle(self) -> None:
        line = self.rfile.readline(MAX_LINE)
        verb, _, arg = line.decode(errors="replace").rstrip("\n").partition(" ")
        node = self.server.node
        try:
            if verb == "OPEN":
                slot, path = node.daemon.resolve(arg)
                self.wfile.write(format_answer(slot, path))
            elif verb == "ATTACH":
                node.session(self)
            elif verb == "REPORT":
                self.wfile.write(json.dumps(node.daemon.stats()).encode() + b"\n")
            elif verb == "STOP":
                self.wfile.write(b"OK\n")
                node.request_stop()
            else:
                self.wfile.write(b"ERR unknown request\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the shim gave up waiting and read the PFS


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512
    node: "NodeServer"


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
        self._server = _Server(self.path, _Handler)
        self._server.node = self

    def session(self, handler: _Handler) -> None:
        with self._lock:
            self._sessions += 1
            self._ever_attached = True
        try:
            handler.wfile.write(b"OK " + json.dumps(self.daemon.client_env()).encode() + b"\n")
            handler.wfile.flush()
            for line in handler.rfile:
                if line.strip() == b"REPORT":
                    handler.wfile.write(json.dumps(self.daemon.stats()).encode() + b"\n")
                    handler.wfile.flush()
        except OSError:
            pass
        finally:
            with self._lock:
                self._sessions -= 1
                self._last_change = time.monotonic()

    def request_stop(self) -> None:
        self._stop.set()

    def serve(self) -> None:
        thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                  name="monarch-socket", daemon=True)
        thread.start()
        try:
            while not self._stop.wait(0.2):
                if self.embedded and self._unused():
                    log.info("last session closed: stopping")
                    break
        finally:
            self._server.shutdown()
            self._server.server_close()
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
