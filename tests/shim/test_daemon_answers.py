"""What the shim does with the daemon's answers: heartbeats are waited for, silence is
not, and a forged, corrupt or foreign answer never changes the bytes the app reads."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from monarch import protocol

from .conftest import TIMEOUT, ShimEnv, md5

pytestmark = pytest.mark.shim

SIZE = 33_333

READ = textwrap.dedent("""
    import hashlib, sys
    for p in sys.argv[1:]:
        print(hashlib.md5(open(p, "rb").read()).hexdigest())
""")


def timed_read(env, *paths, **kw):
    start = time.monotonic()
    out = env.python(READ, *map(str, paths), **kw).stdout.decode().split()
    return out, time.monotonic() - start


def test_heartbeats_are_waited_for(shim_env):
    shim_env.start_daemon("heartbeat", beats=3.0)
    src = shim_env.write("hb.bin", SIZE)
    out, took = timed_read(shim_env, src)
    assert out == [md5(src.read_bytes())]
    assert took >= 3.0  # twice HEARTBEAT_TIMEOUT_MS: only the heartbeats kept the shim waiting
    assert shim_env.counts() == shim_env.expected(tier0=(1, SIZE))


def test_silent_daemon_costs_the_heartbeat_timeout_not_the_total(shim_env):
    shim_env.start_daemon("hang")
    src = shim_env.write("hang.bin", SIZE)
    out, took = timed_read(shim_env, src)  # MONARCH_SHIM_TIMEOUT_MS stays at its 60 s default
    assert out == [md5(src.read_bytes())]
    assert protocol.HEARTBEAT_TIMEOUT_MS / 1000 - 0.1 <= took < protocol.HEARTBEAT_TIMEOUT_MS / 1000 + 8
    assert shim_env.daemon.requests == ["0/hang.bin"]
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))


@pytest.mark.parametrize("mode", ["garbage", "oversized", "nul", "evil", "evil-dotdot", "evil-prefix"])
def test_bad_answers_read_the_pfs(shim_env, mode):
    src = shim_env.write("bad.bin", SIZE)
    forged = shim_env.write("forged.bin", SIZE, data=b"F" * SIZE, under=shim_env.other)
    evil = {
        "evil": forged,                                                       # outside every probe dir
        "evil-dotdot": Path(f"{shim_env.tiers[0]}/../elsewhere/forged.bin"),  # escapes through ".."
        "evil-prefix": Path(f"{shim_env.tiers[0]}-x/forged.bin"),             # a prefix, not a child
    }.get(mode)
    if mode == "evil-prefix":
        evil.parent.mkdir()
        evil.write_bytes(b"F" * SIZE)
    shim_env.start_daemon(mode.split("-")[0], evil_path=evil)
    out, _ = timed_read(shim_env, src)
    assert out == [md5(src.read_bytes())]
    assert shim_env.daemon.requests == ["0/bad.bin"]
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))


def test_daemon_of_another_uid_is_refused(shim_lib):
    """The stub (root, this process) answers a forged copy inside a probe dir; the app runs
    as nobody and must not ask it at all (SO_PEERCRED): it reads the PFS bytes."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv")
    base = Path(tempfile.mkdtemp(prefix="mon-uid-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        lib = base / "libmonarch_shim.so"      # root's cache is not readable by nobody
        shutil.copyfile(shim_lib, lib)
        env = ShimEnv(base / "t", str(lib), str(base))
        for d in (base / "t", *(p for p in (base / "t").rglob("*") if p.is_dir())):
            os.chmod(d, 0o755)
        nobody = pwd.getpwnam("nobody")
        os.chown(env.counters, nobody.pw_uid, nobody.pw_gid)  # the shim maps only its own user's counters
        src = env.write("u.bin", SIZE)
        os.chmod(src, 0o644)
        forged = env.tiers[0] / "forged.bin"
        forged.write_bytes(b"F" * SIZE)
        os.chmod(forged, 0o644)
        daemon = env.start_daemon("evil", evil_path=forged)
        os.chmod(env.sock, 0o777)
        argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat", str(src)]
        proc = subprocess.run(argv, env=env.environ(MONARCH_SHIM_DEBUG="1"), capture_output=True, timeout=TIMEOUT)
        env.close()
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == src.read_bytes()
        assert b"is not ours" in proc.stderr          # the shim was loaded, connected, and refused
        assert daemon.connections >= 1 and daemon.requests == []
        assert env.counts() == env.expected(pfs=(1, SIZE))
    finally:
        shutil.rmtree(base, ignore_errors=True)
