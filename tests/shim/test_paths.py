"""Keys are raw bytes, roots have several spellings, and a path means what the kernel
makes of it: symlinks before "..", O_NOFOLLOW served only where the kernel would open the file."""

from __future__ import annotations

import errno
import os
import textwrap

import pytest

from .conftest import md5

pytestmark = pytest.mark.shim

SIZE = 40_000

READ_BYTES = textwrap.dedent("""
    import hashlib, os, sys
    for p in sys.argv[1:]:
        print(hashlib.md5(open(os.fsencode(p), "rb").read()).hexdigest())
""")


@pytest.mark.parametrize("name", [
    "new\nline.bin",
    os.fsdecode(b"latin-\xe9\xff.bin"),   # not UTF-8
    "n" * 255,                            # the longest name Linux allows
    "dir with spaces/\ttab:colon=eq.bin",
])
def test_odd_names_are_served_from_a_tier(staged_env, name):
    src = staged_env.write(name, SIZE)
    for _ in range(2):  # a daemon miss, then a probe hit
        proc = staged_env.python(READ_BYTES, str(src))
        assert proc.stdout.decode().split() == [md5(src.read_bytes())]
    assert staged_env.daemon.requests == [f"0/{name}"]
    assert (staged_env.tiers[0] / "0" / name).read_bytes() == src.read_bytes()
    assert staged_env.counts() == staged_env.expected(tier0=(2, 2 * SIZE))


def test_root_through_a_symlinked_spelling(staged_env):
    """MONARCH_ROOTS may list root 0 twice: canonical and as configured through a symlink."""
    link = staged_env.base / "scratch"
    link.symlink_to(staged_env.base / "pfs")
    staged_env.roots.append((0, link / "ds"))
    src = staged_env.write("s/x.bin", SIZE)
    via_link = link / "ds" / "s" / "x.bin"
    proc = staged_env.python(READ_BYTES, str(via_link), str(src))
    assert proc.stdout.decode().split() == [md5(src.read_bytes())] * 2
    assert staged_env.daemon.requests == ["0/s/x.bin"]  # one key for both spellings
    assert staged_env.counts()[2][0] == 2


def test_dotdot_after_a_symlink_is_the_kernels_file(staged_env):
    """root/lnk/../x with lnk -> elsewhere/sub is elsewhere/x, not root/x."""
    staged_env.write("x.bin", SIZE)
    staged_env.stage("x.bin", tier=0)                     # root/x has a copy: it must not be served
    other = staged_env.write("x.bin", SIZE, data=b"E" * SIZE, under=staged_env.other)
    (staged_env.other / "sub").mkdir()
    (staged_env.root / "lnk").symlink_to(staged_env.other / "sub")
    tricky = f"{staged_env.root}/lnk/../x.bin"
    assert open(tricky, "rb").read() == other.read_bytes()  # what the kernel says
    proc = staged_env.python(READ_BYTES, tricky)
    assert proc.stdout.decode().split() == [md5(other.read_bytes())]
    assert staged_env.daemon.requests == []
    assert staged_env.counts() == staged_env.expected()   # not managed: elsewhere is no root


def test_dotdot_inside_the_root_still_managed(staged_env):
    src = staged_env.write("a/b/y.bin", SIZE)
    proc = staged_env.python(READ_BYTES, f"{staged_env.root}/a/b/../b/./y.bin", cwd=staged_env.root / "a")
    assert proc.stdout.decode().split() == [md5(src.read_bytes())]
    assert staged_env.daemon.requests == ["0/a/b/y.bin"]


def test_dotdot_to_a_missing_dir_passes_through(staged_env):
    proc = staged_env.python(textwrap.dedent("""
        import sys
        try:
            open(sys.argv[1], "rb")
        except FileNotFoundError:
            print("ENOENT")
    """), f"{staged_env.root}/missing/../x.bin")
    assert proc.stdout.decode().split() == ["ENOENT"]
    assert staged_env.daemon.requests == []


NOFOLLOW_MD5 = textwrap.dedent("""
    import hashlib, os, sys
    try:
        fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW)
        print(hashlib.md5(os.read(fd, 1 << 20)).hexdigest())
    except OSError as e:
        print(e.errno)
""")


def test_o_nofollow_of_a_plain_file_is_served_from_its_copy(staged_env):
    src = staged_env.write("nf.bin", SIZE)
    staged_env.stage("nf.bin", tier=0)
    proc = staged_env.python(NOFOLLOW_MD5, str(src))  # GNU tar opens every file this way
    assert proc.stdout.decode().split() == [md5(src.read_bytes())]
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))


def test_o_nofollow_of_a_symlink_is_the_kernels_eloop(staged_env):
    target = staged_env.write("target.bin", SIZE)
    link = staged_env.root / "link.bin"
    link.symlink_to(target)
    staged_env.stage("link.bin", tier=0, data=b"S" * SIZE)  # a copy of the link's target: must not be read
    proc = staged_env.python(NOFOLLOW_MD5, str(link))
    assert proc.stdout.decode().split() == [str(errno.ELOOP)]
    assert staged_env.daemon.requests == []
    assert staged_env.counts() == staged_env.expected()


def test_o_nofollow_without_an_index_passes_through(staged_env):
    src = staged_env.write("nf.bin", SIZE)
    staged_env.stage("nf.bin", tier=0, data=b"S" * SIZE)
    proc = staged_env.python(NOFOLLOW_MD5, str(src), env={**staged_env.environ(), "MONARCH_INDEX": "/nonexistent"})
    assert proc.stdout.decode().split() == [md5(src.read_bytes())]
    assert staged_env.counts() == staged_env.expected()
