"""coreutils under the shim: cat (open + read) and md5sum (fopen + fread)."""

from __future__ import annotations

import shutil

import pytest

from monarch import protocol

from .conftest import md5

pytestmark = pytest.mark.shim

SIZE = 777_777


def tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} not installed")
    return path


def test_cat(staged_env):
    src = staged_env.write("c/a.bin", SIZE)
    proc = staged_env.run([tool("cat"), str(src)])
    assert md5(proc.stdout) == md5(src.read_bytes())
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))


def test_cat_twice_second_is_probe_hit(staged_env):
    src = staged_env.write("c/b.bin", SIZE)
    staged_env.run([tool("cat"), str(src)])
    proc = staged_env.run([tool("cat"), str(src)])
    assert md5(proc.stdout) == md5(src.read_bytes())
    assert staged_env.daemon.requests == ["0/c/b.bin"]
    assert staged_env.counts() == staged_env.expected(tier0=(2, 2 * SIZE))


def test_md5sum(staged_env):
    srcs = [staged_env.write(f"m/{i}.bin", SIZE + i) for i in range(3)]
    proc = staged_env.run([tool("md5sum"), *map(str, srcs)])
    got = [line.split()[0] for line in proc.stdout.decode().splitlines()]
    assert got == [md5(s.read_bytes()) for s in srcs]
    # md5sum reads with fread: counted, and its opens also as uncounted (a FILE may be read otherwise)
    assert staged_env.counts() == staged_env.expected(tier0=(3, 3 * SIZE + 0 + 1 + 2))
    assert staged_env.uncounted()[protocol.tier_slot(0)] == 3
