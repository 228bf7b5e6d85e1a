"""Shared pieces of the shim tests: a stub node daemon and a preloaded-process runner.

The stub daemon speaks monarch/protocol.py's framed socket protocol from a thread.
OPEN, by mode:
  "stage"      copies the PFS source into its tier directory (temporary name, then
               rename, as the real daemon does) and answers ``<slot>`` + the path;
  "heartbeat"  the same after sending STATUS_PENDING frames for ``beats`` seconds;
  "pfs"        answers SLOT_PFS;
  "hang"       accepts, reads the request and never answers;
  "garbage"    answers a frame whose length is far beyond any limit, then junk;
  "oversized"  answers a staged slot with a body of PATH_MAX bytes;
  "nul"        answers the right staged path followed by a NUL and more bytes;
  "evil"       answers ``evil_path`` (a file outside the probe dirs, or forged);
  "bogus"      names a path in the tier that does not exist;
  "vanish"     names the copy's path before it exists at a key's first OPEN (a copy evicted
               between the answer and the shim's open), then stages as "stage".
INVALIDATE removes the stub's copies of the key (a file or a tree) and answers 0; when
``confirm_invalidate`` is false it keeps them and answers STATUS_ERROR. It records the keys of every OPEN
(``requests``) and INVALIDATE (``invalidated``), as ``str`` (os.fsdecode), and counts
connections. INDEX (a process that found no index at start) is answered INDEX_READY at
once, or as ``index`` says: a callable run first (it may write the index, send heartbeats
on the connection it is given, or sleep) that returns the status to answer, or None to
close without an answer; ``index_asked`` counts the INDEX requests.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from monarch import protocol
from monarch.shim import shim_library

TIMEOUT = 60  # seconds, for every subprocess
TIER_SLOTS = (protocol.tier_slot(0), protocol.tier_slot(1))
SHIM_DIR = Path(__file__).parent
PATH_MAX = 4096


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def payload(name: str, size: int) -> bytes:
    """Deterministic bytes that differ per file."""
    seed = hashlib.sha256(os.fsencode(name)).digest()
    return (seed * (size // len(seed) + 1))[:size]


class StubDaemon:
    MODES = ("stage", "heartbeat", "pfs", "hang", "garbage", "oversized", "nul", "evil", "bogus", "kept-closed",
             "vanish")

    def __init__(self, sock_path: str, roots: list[Path], tier: Path, slot: int, mode: str = "stage", *,
                 beats: float = 0.0, evil_path: Path | None = None, confirm_invalidate: bool = True,
                 index=None):
        assert mode in self.MODES
        self.sock_path, self.roots, self.tier, self.slot, self.mode = sock_path, roots, tier, slot, mode
        self.beats, self.evil_path, self.confirm_invalidate = beats, evil_path, confirm_invalidate
        self.index = index
        self.index_asked = 0
        self.requests: list[str] = []
        self.invalidated: list[str] = []
        self.connections = 0
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
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(TIMEOUT)
            try:
                verb, length = protocol.decode_request_header(protocol.recv_exact(conn, protocol.REQUEST_HEADER.size))
                raw = protocol.recv_exact(conn, length) if length else b""
            except (protocol.ProtocolError, OSError):
                return  # a client that went away (or was refused) before asking
            key = protocol.key_str(raw)
            if verb == protocol.VERB_INDEX:
                with self._lock:
                    self.index_asked += 1
                status = self.index(conn) if self.index is not None else protocol.INDEX_READY
                if status is not None:
                    self._send(conn, protocol.encode_answer(status))
                return
            if verb == protocol.VERB_INVALIDATE:
                with self._lock:
                    self.invalidated.append(key)
                    if self.confirm_invalidate:
                        self._drop(raw)
                status = 0 if self.confirm_invalidate else protocol.STATUS_ERROR
                self._send(conn, protocol.encode_answer(status))
                return
            assert verb == protocol.VERB_OPEN, verb
            with self._lock:
                self.requests.append(key)
            if self.mode == "hang":
                self._stop.wait(TIMEOUT)
                return
            if self.mode == "heartbeat":
                end = time.monotonic() + self.beats
                while time.monotonic() < end and not self._stop.is_set():
                    self._send(conn, protocol.encode_answer(protocol.STATUS_PENDING))
                    time.sleep(protocol.HEARTBEAT_MS / 1000)
            self._send(conn, self._answer(raw))

    @staticmethod
    def _send(conn: socket.socket, data: bytes) -> None:
        try:
            conn.sendall(data)
        except OSError:
            pass  # the shim gave up on us: that is what some tests want

    def _drop(self, raw: bytes) -> None:
        dest = Path(os.fsdecode(bytes(self.tier) + b"/" + raw))
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()

    def _answer(self, raw: bytes) -> bytes:
        if self.mode == "pfs":
            return protocol.encode_answer(protocol.SLOT_PFS)
        if self.mode == "garbage":
            return struct.pack("<iI", self.slot, 0xFFFFFFF0) + os.urandom(64)
        if self.mode == "oversized":
            return protocol.encode_answer(self.slot, b"/" + b"a" * (PATH_MAX - 1))
        if self.mode == "evil":
            return protocol.encode_answer(self.slot, os.fsencode(self.evil_path))
        if self.mode == "bogus":
            return protocol.encode_answer(self.slot, os.fsencode(self.tier / "no" / "such" / "file"))
        k, _, rel = raw.partition(b"/")
        src = Path(os.fsdecode(bytes(self.roots[int(k)]) + b"/" + rel))
        if not src.is_file():
            return protocol.encode_answer(protocol.SLOT_PFS)
        dest = Path(os.fsdecode(bytes(self.tier) + b"/" + raw))
        if self.mode == "vanish" and self.requests.count(protocol.key_str(raw)) == 1:
            return protocol.encode_answer(self.slot, os.fsencode(dest))  # not there (yet): gone before the open
        with self._lock:
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".stage.{threading.get_ident()}.tmp")  # a 255-byte name has no room left
                shutil.copyfile(src, tmp)
                os.replace(tmp, dest)
        body = os.fsencode(dest)
        if self.mode == "nul":
            body += b"\0/../../elsewhere"
        if self.mode == "kept-closed":  # says it keeps the connection, then closes it (a door stopped, restarted)
            return protocol.encode_answer(self.slot | protocol.ANSWER_KEPT, body)
        return protocol.encode_answer(self.slot, body)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._srv.close()


class ShimEnv:
    """One PFS root, two tier directories (slots 2 and 3), a counters file, a socket path,
    and a snapshot index of the root, rewritten from os.stat before every process starts."""

    def __init__(self, base: Path, lib: str, sock_dir: str):
        self.base = base.resolve()
        self.root = self.base / "pfs" / "ds"
        self.other = self.base / "elsewhere"
        self.tiers = [self.base / "tier0", self.base / "tier1"]
        for d in (self.root, self.other, *self.tiers):
            d.mkdir(parents=True)
        self.counters = str(self.base / "counters")
        self.index = str(self.base / "index")
        self.roots = [(0, self.root)]  # MONARCH_ROOTS entries; tests may add spellings
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

    def start_daemon(self, mode: str = "stage", slot: int = TIER_SLOTS[0], into: Path | None = None,
                     **kw) -> StubDaemon:
        self.daemon = StubDaemon(self.sock, [self.root], into or self.tiers[0], slot, mode, **kw)
        return self.daemon

    def write_index(self) -> None:
        """The daemon's index of the root as it is now: monarch.node.snapshot.snapshot's walk, files,
        directories and listings (as Snapshot.write_index writes it)."""
        from monarch.node.snapshot.snapshot import take_snapshot
        tmp = self.index + ".tmp"
        with open(tmp, "wb") as f:
            f.write(take_snapshot((str(self.root),)).index_bytes())
        os.replace(tmp, self.index)

    # -- processes --
    def environ(self, **extra: str) -> dict[str, str]:
        self.write_index()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
        env.update({
            "LD_PRELOAD": self.lib,
            protocol.ENV_ROOTS: protocol.format_roots((k, str(d)) for k, d in self.roots),
            protocol.ENV_PROBE: protocol.format_probe(zip(TIER_SLOTS, map(str, self.tiers))),
            protocol.ENV_SOCKET: self.sock,
            protocol.ENV_COUNTERS: self.counters,
            protocol.ENV_INDEX: self.index,
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
        """(opens, bytes) per slot."""
        return [c[:2] for c in protocol.read_counters(self.counters)]

    def uncounted(self) -> list[int]:
        """Opens whose bytes the shim could not see (stdio, mmap), per slot."""
        return [c[2] for c in protocol.read_counters(self.counters)]

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


def compile_helper(tmp_path_factory, name: str) -> str:
    """tests/shim/<name>.c compiled once per session."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("bin") / name
    subprocess.run([cc, "-O1", "-U_FORTIFY_SOURCE", "-Wall", "-Werror", "-o", str(out),
                    str(SHIM_DIR / f"{name}.c")], check=True, timeout=TIMEOUT)
    return str(out)


@pytest.fixture(scope="session")
def families_bin(tmp_path_factory) -> str:
    """tests/shim/families.c compiled: one open family + one read family per run."""
    return compile_helper(tmp_path_factory, "families")


@pytest.fixture(scope="session")
def statfd_bin(tmp_path_factory) -> str:
    """tests/shim/statfd.c compiled: fstat/fstatat/statx of an open descriptor; creat."""
    return compile_helper(tmp_path_factory, "statfd")


@pytest.fixture(scope="session")
def meta_bin(tmp_path_factory) -> str:
    """tests/shim/meta.c compiled: stat, lstat, statx, access and listings of each path."""
    return compile_helper(tmp_path_factory, "meta")
