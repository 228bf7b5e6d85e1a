"""The shim's open path, in Python, over the frame protocol (a benchmark and test harness).

What ``libmonarch_shim.so`` does for a read-only open of a managed file (DESIGN.md, "Data
flow of one open"): probe the staged copy in each tier of MONARCH_PROBE, fastest first;
on a miss ask the daemon (OPEN over MONARCH_SOCKET) and open the path it names; when it
cannot help, open the original. It lets the daemon's cold path be measured end to end
under ``monarch run`` with ``MONARCH_DISABLE=1`` (the C shim off) where the C shim cannot
be used; it costs a few microseconds of Python per open more than the C shim.
"""

from __future__ import annotations

import os
import socket
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

    def _ask(self, key: bytes) -> tuple[int, bytes]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(protocol.SHIM_TIMEOUT_MS_DEFAULT / 1000)
            s.connect(self.socket_path)
            s.sendall(protocol.encode_request(protocol.VERB_OPEN, key))
            return protocol.recv_answer(s, limit=8192)
