"""The shim's open path, in Python, over the frame protocol (a benchmark and test harness).

What ``libmonarch_shim.so`` does for a read-only open of a managed file (DESIGN.md, "Data
flow of one open"): probe the staged copy in each tier of MONARCH_PROBE, fastest first;
on a miss ask the daemon (OPEN over MONARCH_SOCKET) and open the path it names; when it
cannot help, open the original. It lets the daemon's cold path be measured end to end
under ``monarch run`` with ``MONARCH_DISABLE=1`` (the C shim off) where the C shim cannot
be used; it costs a few microseconds of Python per open more than the C shim.

As the C shim, it probes no tier before the daemon's snapshot is ready: a process started
during the daemon's walk waits for it (INDEX) at its first managed open, and reads the PFS
if the snapshot failed or the daemon is gone (kept copies are checked against the snapshot
before the index appears: without it nobody vouches for them).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Mapping

from monarch import protocol

HIT, STAGED, PFS = "tier", "daemon", "pfs"  # how an open was served


class PyShim:
    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self.socket_path = env.get(protocol.ENV_SOCKET, "")
        self.roots = []
        for entry in env.get(protocol.ENV_ROOTS, "").split(":"):
            k, sep, path = entry.partition("=")
            if sep and k.isdigit():
                self.roots.append((k.encode(), os.fsencode(path.rstrip("/"))))
        self.roots.sort(key=lambda r: -len(r[1]))
        self.probe = [os.fsencode(p.partition("=")[2]) for p in env.get(protocol.ENV_PROBE, "").split(":") if "=" in p]
        self.index_path = env.get(protocol.ENV_INDEX, "")
        try:
            self.index_wait = int(env.get(protocol.ENV_INDEX_WAIT, "")) / 1000
        except ValueError:
            self.index_wait = protocol.SHIM_INDEX_WAIT_MS_DEFAULT / 1000
        self._ready: bool | None = None  # the snapshot is ready (None: not known yet)

    def key_of(self, raw: bytes) -> bytes | None:
        for k, root in self.roots:
            if raw.startswith(root + b"/"):
                return k + b"/" + raw[len(root) + 1:]
        return None

    def open(self, path: str | bytes, flags: int = os.O_RDONLY) -> tuple[int, str]:
        """A descriptor for reading ``path`` and how it was served (HIT, STAGED or PFS)."""
        raw = os.fsencode(path)
        key = self.key_of(raw)
        if key is None or not self.socket_path:
            return os.open(raw, flags), PFS
        if not self.snapshot_ready():
            return os.open(raw, flags), PFS
        for tier in self.probe:
            try:
                return os.open(tier + b"/" + key, flags), HIT
            except OSError:
                pass
        try:
            status, body = self._ask(key)
        except (OSError, protocol.ProtocolError):
            status, body = protocol.SLOT_PFS, b""
        if status > protocol.SLOT_PFS and body:
            try:
                return os.open(body, flags), STAGED
            except OSError:
                pass
        return os.open(raw, flags), PFS

    def snapshot_ready(self) -> bool:
        """Is the daemon's snapshot ready (its index written)? Asked once per process, waiting
        for it if the walk is under way (heartbeats; at most ``index_wait`` seconds)."""
        if self._ready is None:
            if not self.index_path or os.path.exists(self.index_path):
                self._ready = True
            else:
                try:
                    status, _ = self._ask(b"", protocol.VERB_INDEX, self.index_wait)
                    self._ready = status != protocol.INDEX_NONE
                except (OSError, protocol.ProtocolError):
                    self._ready = False  # lost before its snapshot: the PFS
        return self._ready

    def _ask(self, key: bytes, verb: int = protocol.VERB_OPEN,
             timeout: float = protocol.SHIM_TIMEOUT_MS_DEFAULT / 1000) -> tuple[int, bytes]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(min(timeout, protocol.HEARTBEAT_TIMEOUT_MS / 1000))  # silence: the daemon is gone
            s.connect(self.socket_path)
            s.sendall(protocol.encode_request(verb, key))
            deadline = time.monotonic() + timeout
            while True:  # heartbeats restart the silence timer, up to the deadline
                status, length = protocol.ANSWER_HEADER.unpack(protocol.recv_exact(s, protocol.ANSWER_HEADER.size))
                if length > 8192:
                    raise protocol.ProtocolError(f"answer body of {length} bytes")
                body = protocol.recv_exact(s, length) if length else b""
                if status != protocol.STATUS_PENDING:
                    return status, body
                if time.monotonic() > deadline:
                    raise TimeoutError("the daemon took too long")


_shim: tuple[int, PyShim] | None = None  # (pid, shim): one per process, each forked worker its own


def read_file(path: str) -> tuple[bytes, str]:
    """A plug-in reader for ``monarch.tools.workload read --reader support.pyshim:read_file``: the
    whole file, opened as the shim would, and how the open was served (HIT, STAGED or PFS)."""
    global _shim
    if _shim is None or _shim[0] != os.getpid():
        _shim = (os.getpid(), PyShim())
    fd, how = _shim[1].open(path)
    with open(fd, "rb") as f:
        return f.read(), how
