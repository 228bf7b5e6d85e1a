"""Fail open: whatever goes wrong on Monarch's side, the application reads the PFS
original and sees exactly the errors the original open gives."""

from __future__ import annotations

import re
import textwrap

import pytest

from .conftest import md5

pytestmark = pytest.mark.shim

SIZE = 65_537

READ = textwrap.dedent("""
    import hashlib, sys
    for p in sys.argv[1:]:
        print(hashlib.md5(open(p, "rb").read()).hexdigest())
""")


def read_all(env, *paths, **kw) -> list[str]:
    return env.python(READ, *map(str, paths), **kw).stdout.decode().split()


def test_disabled_passes_everything_through(staged_env):
    src = staged_env.write("d.bin", SIZE)
    staged_env.stage("d.bin", tier=0, data=b"stale")
    assert read_all(staged_env, src, MONARCH_DISABLE="1") == [md5(src.read_bytes())]
    assert staged_env.daemon.requests == []
    assert staged_env.counts() == staged_env.expected()


def test_no_daemon_reads_the_pfs(shim_env):
    srcs = [shim_env.write(f"n/{i}.bin", SIZE) for i in range(3)]
    assert read_all(shim_env, *srcs) == [md5(s.read_bytes()) for s in srcs]
    assert shim_env.counts() == shim_env.expected(pfs=(3, 3 * SIZE))
    assert not any(t.joinpath("0").exists() for t in shim_env.tiers)


def test_cat_without_daemon_reads_the_pfs(shim_env):
    src = shim_env.write("n/cat.bin", SIZE)
    proc = shim_env.run(["cat", str(src)])
    assert md5(proc.stdout) == md5(src.read_bytes())
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))


@pytest.mark.parametrize("mode", ["pfs", "garbage", "bogus"])
def test_daemon_that_cannot_help_means_pfs(shim_env, mode):
    shim_env.start_daemon(mode)
    src = shim_env.write("h.bin", SIZE)
    assert read_all(shim_env, src) == [md5(src.read_bytes())]
    # a named copy that does not open is asked for once more (it may have been evicted meanwhile)
    assert shim_env.daemon.requests == ["0/h.bin"] * (2 if mode == "bogus" else 1)
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))


def test_a_copy_gone_between_the_answer_and_the_open_is_asked_for_again(shim_env):
    """The daemon names a copy that is gone when the shim opens it (a decoded file trimmed
    as its tier filled, in between): the shim asks once more and opens the copy staged
    anew, not the PFS (test_compression's small budget met it about once in ten runs under load)."""
    shim_env.start_daemon("vanish")
    srcs = [shim_env.write(f"v/{i}.bin", SIZE) for i in range(3)]
    assert read_all(shim_env, *srcs) == [md5(s.read_bytes()) for s in srcs]
    assert shim_env.daemon.requests == [f"0/v/{i}.bin" for i in range(3) for _ in range(2)]
    assert shim_env.counts() == shim_env.expected(tier0=(3, 3 * SIZE))


def test_a_kept_connection_closed_by_the_daemon_costs_a_fresh_one(shim_env):
    """The daemon answers ANSWER_KEPT, then closes the connection (a door stopped or
    restarted): each next open finds it closed and asks once more on a fresh connection."""
    shim_env.start_daemon("kept-closed")
    srcs = [shim_env.write(f"kc/{i}.bin", SIZE) for i in range(4)]
    assert read_all(shim_env, *srcs) == [md5(s.read_bytes()) for s in srcs]
    assert shim_env.daemon.requests == [f"0/kc/{i}.bin" for i in range(4)]
    assert shim_env.daemon.connections == 4
    assert shim_env.counts() == shim_env.expected(tier0=(4, 4 * SIZE))


def test_hanging_daemon_times_out_to_pfs(shim_env):
    shim_env.start_daemon("hang")
    srcs = [shim_env.write(f"hang/{i}.bin", SIZE) for i in range(2)]
    assert read_all(shim_env, *srcs, MONARCH_SHIM_TIMEOUT_MS="200") == [md5(s.read_bytes()) for s in srcs]
    assert shim_env.daemon.requests == ["0/hang/0.bin", "0/hang/1.bin"]
    assert shim_env.counts() == shim_env.expected(pfs=(2, 2 * SIZE))


@pytest.mark.parametrize("bad", [
    {"MONARCH_ROOTS": ""},
    {"MONARCH_ROOTS": "relative/root"},
    {"MONARCH_PROBE": "x=y:0=/tmp:99=/tmp:2"},
    {"MONARCH_COUNTERS": "/nonexistent/counters"},
    {"MONARCH_SHIM_TIMEOUT_MS": "soon"},
    {"MONARCH_SOCKET": "/tmp/" + "s" * 200},
])
def test_invalid_environment_never_breaks_the_app(staged_env, bad):
    src = staged_env.write("inv.bin", SIZE)
    assert read_all(staged_env, src, **bad) == [md5(src.read_bytes())]


def test_writes_under_the_root_go_to_the_pfs_file(staged_env):
    src = staged_env.write("w/data.bin", SIZE)
    original = src.read_bytes()
    copy = staged_env.stage("w/data.bin", tier=0)  # a staged copy exists: it must not be written
    staged_env.python(textwrap.dedent("""
        import os, sys
        with open(sys.argv[1], "r+b") as f:
            f.write(b"MODIFIED")
        with open(sys.argv[2], "wb") as f:
            f.write(b"new file")
        fd = os.open(sys.argv[3], os.O_RDONLY | os.O_CREAT, 0o644)
        os.close(fd)
        with open(sys.argv[1], "ab") as f:
            f.write(b"TAIL")
    """), str(src), str(staged_env.root / "w" / "new.bin"), str(staged_env.root / "w" / "created.bin"))
    assert src.read_bytes() == b"MODIFIED" + original[8:] + b"TAIL"
    assert (staged_env.root / "w" / "new.bin").read_bytes() == b"new file"
    assert (staged_env.root / "w" / "created.bin").exists()
    assert not copy.exists()  # invalidated: the shim removed the stale copy
    assert staged_env.daemon.invalidated == ["0/w/data.bin", "0/w/new.bin", "0/w/created.bin", "0/w/data.bin"]
    assert staged_env.daemon.requests == []
    assert staged_env.counts() == staged_env.expected()


def test_files_outside_the_roots_are_untouched(staged_env):
    out = staged_env.write("o.bin", SIZE, under=staged_env.other)
    near = staged_env.write("o.bin", SIZE, under=staged_env.root.parent / "ds-sibling")  # prefix, not a child
    assert read_all(staged_env, out, near) == [md5(out.read_bytes()), md5(near.read_bytes())]
    assert staged_env.daemon.requests == []
    assert staged_env.counts() == staged_env.expected()


def test_debug_lines_only_when_asked(staged_env):
    src = staged_env.write("dbg.bin", 10)
    quiet = staged_env.python(READ, str(src))
    loud = staged_env.python(READ, str(src), MONARCH_SHIM_DEBUG="1")
    assert b"[monarch" not in quiet.stderr
    lines = [ln for ln in loud.stderr.decode().splitlines() if ln.startswith("[monarch ")]
    assert any(re.search(r"(monarch|shim_\w+)\.c:\d+", ln) and "dbg.bin" in ln for ln in lines), loud.stderr
