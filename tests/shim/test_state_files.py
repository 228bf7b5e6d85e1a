"""The files the shim maps -- the snapshot index and the counters -- are used only if they
are what the daemon made: a regular file of ours (a FIFO planted there must not hang every
process in its constructor; an index or counters file of another uid is not trusted), and
an index whose tables stay inside it (a directory claiming 2^32 children is not listed
from it)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

import pytest

from monarch import index_layout, protocol

from .conftest import md5
from .test_metadata import make_tree

pytestmark = pytest.mark.shim

SIZE = 40_000
WAIT = 20  # seconds: a process that hangs on a FIFO never ends by itself

READ = "import hashlib, os, sys; p = sys.argv[1]; print(os.stat(p).st_size, hashlib.md5(open(p, 'rb').read()).hexdigest())"


def _run(env: dict, *argv: str) -> str:
    try:
        proc = subprocess.run([sys.executable, "-c", *argv], env=env, capture_output=True, timeout=WAIT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the process hung for {WAIT} s (a FIFO opened in the shim's constructor?)") from None
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return proc.stdout.decode()


def _fifo_at(path: str) -> None:
    os.unlink(path)
    os.mkfifo(path, 0o600)


@pytest.mark.parametrize("which", ["index", "counters"])
def test_a_fifo_in_place_of_a_mapped_file_does_not_hang_the_process(staged_env, which):
    src = staged_env.write("k/a.bin", SIZE)
    env = staged_env.environ()
    _fifo_at(staged_env.index if which == "index" else staged_env.counters)
    assert _run(env, READ, str(src)).split() == [str(SIZE), md5(src.read_bytes())]


def _nobody() -> int:
    if os.getuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    return pwd.getpwnam("nobody").pw_uid


def test_an_index_of_another_uid_is_not_used(staged_env):
    src = staged_env.write("k/b.bin", SIZE)
    env = staged_env.environ()
    with open(src, "ab") as f:  # the index now says SIZE: a forged (or stale) size
        f.write(b"x" * 1000)
    data = src.read_bytes()
    assert _run(env, READ, str(src)).split() == [str(SIZE), md5(data)]  # ours: it answers stat
    os.chown(staged_env.index, _nobody(), -1)
    assert _run(env, READ, str(src)).split() == [str(SIZE + 1000), md5(data)]  # another's: the PFS answers


def test_counters_of_another_uid_are_not_used(staged_env):
    src = staged_env.write("k/c.bin", SIZE)
    env = staged_env.environ()
    os.chown(staged_env.counters, _nobody(), -1)
    assert _run(env, READ, str(src)).split() == [str(SIZE), md5(src.read_bytes())]
    assert staged_env.counts() == staged_env.expected()  # nothing counted into a file of another user's


def _claim_children(index_path: str, key: bytes, count: int, first: int = 0) -> None:
    """Rewrite the index with directory ``key``'s child count and first record forged."""
    data = bytearray(open(index_path, "rb").read())
    ix = index_layout.Index(bytes(data))
    n = ix.number(key)
    assert n and ix.entry(n)[13] & protocol.INDEX_FLAG_LISTED
    at = ix.entries_off + protocol.INDEX_ENTRY.size * (n - ix.files - 1) + protocol.INDEX_ENTRY.size - 12  # u32 children, u64 first
    data[at:at + 12] = count.to_bytes(4, "little") + first.to_bytes(8, "little")
    assert index_layout.Index(bytes(data)).entry(n)[17:] == (count, first)
    tmp = index_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, index_path)


def test_a_directory_claiming_more_children_than_the_index_holds_is_listed_by_the_kernel(shim_env):
    make_tree(shim_env)
    train = shim_env.root / "train"
    env = shim_env.environ()
    code = "import os, sys; print(sorted(os.listdir(sys.argv[1])), len(os.listdir(sys.argv[1] + '/class0')))"
    want = _run(env, code, str(train))
    assert want == "['class0', 'class1', 'class2'] 4\n"
    _claim_children(shim_env.index, b"0/train", 0xFFFFFFFF)
    assert _run(env, code, str(train)) == want  # not 2^32 records, nor other directories' names
