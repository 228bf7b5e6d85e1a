"""Shared pieces of the shim tests: a stub node daemon and a preloaded-process runner.

The stub daemon speaks monarch/protocol.py's socket protocol from a thread. In
mode "stage" it copies the PFS source into its tier directory (temporary name,
then rename, as the real daemon does) and answers ``<slot> <path>``; "pfs"
answers ``0``; "hang" accepts and never answers; "garbage" answers nonsense;
"bogus" names a path that does not exist. It records every key it is asked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from monarch import protocol
from monarch.shim.build import shim_library

TIMEOUT = 60  # seconds, for every subprocess
TIER_SLOTS = (protocol.tier_slot(0), protocol.tier_slot(1))
SHIM_DIR = Path(__file__).parent


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def payload(name: str, size: int) -> bytes:
    """Deterministic bytes that differ per file."""
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class StubDaemon:
    MODES = ("stage", "pfs", "hang", "garbage", "bogus")

    def __init__(self, sock_path: str, roots: list[Path], tier: Path, slot: int, mode: str = "stage"):
        assert mode in self.MODES
        self.sock_path, self.roots, self.tier, self.slot, self.mode = sock_path, roots, tier, slot, mode
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(sock_path)
        self._srv.listen(64)
        self._srv.settimeout(0.1)
        self._thread = threading.Thread(target=self._accept, name="stub-daemon", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(TIMEOUT)
            line = b""
            while not line.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    return
                line += chunk
            verb, _, key = line.decode().rstrip("\n").partition(" ")
            assert verb == "OPEN", line
            with self._lock:
                self.requests.append(key)
            if self.mode == "hang":
                self._stop.wait(TIMEOUT)
                return
            conn.sendall(self._answer(key))

    def _answer(self, key: str) -> bytes:
        if self.mode == "pfs":
            return protocol.format_answer(protocol.SLOT_PFS)
        if self.mode == "garbage":
            return b"what?\n"
        if self.mode == "bogus":
            return protocol.format_answer(self.slot, str(self.tier / "no" / "such" / "file"))
        k, _, rel = key.partition("/")
        src = self.roots[int(k)] / rel
        if not src.is_file():
            return protocol.format_answer(protocol.SLOT_PFS)
        dest = self.tier / key
        with self._lock:
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.tmp")
                shutil.copyfile(src, tmp)
                os.replace(tmp, dest)
        return protocol.format_answer(self.slot, str(dest))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._srv.close()


class ShimEnv:
    """One PFS root, two tier directories (slots 2 and 3), a counters file, a socket path."""

    def __init__(self, base: Path, lib: str, sock_dir: str):
        self.base = base.resolve()
        self.root = self.base / "pfs" / "ds"
        self.other = self.base / "elsewhere"
        self.tiers = [self.base / "tier0", self.base / "tier1"]
        for d in (self.root, self.other, *self.tiers):
            d.mkdir(parents=True)
        self.counters = str(self.base / "counters")
        protocol.create_counters(self.counters)
        self.sock = os.path.join(sock_dir, "daemon.sock")
        self.lib = lib
        self.daemon: StubDaemon | None = None

    # -- data --
    def write(self, rel: str, size: int = 100_000, data: bytes | None = None, under: Path | None = None) -> Path:
        path = (under or self.root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload(rel, size) if data is None else data)
        return path

    def stage(self, rel: str, tier: int, data: bytes | None = None) -> Path:
        """Put a copy of root file rel into tier (as the daemon would have)."""
        dest = self.tiers[tier] / "0" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((self.root / rel).read_bytes() if data is None else data)
        return dest

    def start_daemon(self, mode: str = "stage", slot: int = TIER_SLOTS[0], into: Path | None = None) -> StubDaemon:
        self.daemon = StubDaemon(self.sock, [self.root], into or self.tiers[0], slot, mode)
        return self.daemon

    # -- processes --
    def environ(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
        env.update({
            "LD_PRELOAD": self.lib,
            protocol.ENV_ROOTS: str(self.root),
            protocol.ENV_PROBE: ":".join(f"{s}={d}" for s, d in zip(TIER_SLOTS, self.tiers)),
            protocol.ENV_SOCKET: self.sock,
            protocol.ENV_COUNTERS: self.counters,
        })
        env.update(extra)
        return env

    def run(self, argv: list[str], *, cwd: Path | str | None = None, check: bool = True,
            env: dict[str, str] | None = None, **extra: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, cwd=cwd, env=self.environ(**extra) if env is None else env,
                              capture_output=True, timeout=TIMEOUT)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} exited {proc.returncode}\nstdout: {proc.stdout[-2000:]!r}\n"
                                 f"stderr: {proc.stderr.decode(errors='replace')[-4000:]}")
        return proc

    def python(self, code: str, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run([sys.executable, "-c", code, *args], **kw)

    # -- counters --
    def counts(self) -> list[tuple[int, int]]:
        return protocol.read_counters(self.counters)

    @staticmethod
    def expected(**slots: tuple[int, int]) -> list[tuple[int, int]]:
        """expected(pfs=(opens, bytes), tier0=(...), tier1=(...), peer=(...)) as a full slot list."""
        names = {"pfs": protocol.SLOT_PFS, "peer": protocol.SLOT_PEER, "tier0": TIER_SLOTS[0], "tier1": TIER_SLOTS[1]}
        out = [(0, 0)] * protocol.MAX_SLOTS
        for name, value in slots.items():
            out[names[name]] = value
        return out

    def close(self) -> None:
        if self.daemon:
            self.daemon.stop()


@pytest.fixture(scope="session")
def shim_lib() -> str:
    return str(shim_library())


@pytest.fixture
def shim_env(tmp_path, shim_lib):
    sock_dir = tempfile.mkdtemp(prefix="mon-", dir="/tmp")  # sun_path is 108 bytes: keep it short
    env = ShimEnv(tmp_path, shim_lib, sock_dir)
    try:
        yield env
    finally:
        env.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.fixture
def staged_env(shim_env):
    """A ShimEnv with the stub daemon staging into tier 0."""
    shim_env.start_daemon("stage")
    return shim_env


@pytest.fixture(scope="session")
def families_bin(tmp_path_factory) -> str:
    """tests/shim/families.c compiled: one open family + one read family per run."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("bin") / "families"
    subprocess.run([cc, "-O1", "-U_FORTIFY_SOURCE", "-Wall", "-Werror", "-o", str(out),
                    str(SHIM_DIR / "families.c")], check=True, timeout=TIMEOUT)
    return str(out)
