"""Python's own ways of reading a file, in a real preloaded interpreter.

CPython 3.11 (libpython3.11.so) imports open64, openat64, read, pread64, readv,
preadv64v2, fopen64, close, fclose, dup2/dup3, fcntl64 and mmap64 from glibc.
"""

from __future__ import annotations

import errno
import io
import textwrap

import pytest

from monarch import protocol

from .conftest import TIER_SLOTS, md5

pytestmark = pytest.mark.shim

SIZE = 300_001


def py(env, code: str, *args: str, **kw):
    return env.python(textwrap.dedent(code), *args, **kw)


def test_builtin_open_read(staged_env):
    src = staged_env.write("train/0001.bin", SIZE)
    proc = py(staged_env, """
        import hashlib, sys
        with open(sys.argv[1], "rb") as f:
            print(hashlib.md5(f.read()).hexdigest())
    """, str(src))
    assert proc.stdout.decode().strip() == md5(src.read_bytes())
    assert staged_env.daemon.requests == ["0/train/0001.bin"]
    assert (staged_env.tiers[0] / "0/train/0001.bin").read_bytes() == src.read_bytes()
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))


def test_os_open_pread_and_preadv(staged_env):
    src = staged_env.write("p.bin", SIZE)
    proc = py(staged_env, """
        import hashlib, os, sys
        fd = os.open(sys.argv[1], os.O_RDONLY)
        half = os.pread(fd, 150_000, 0)
        rest = bytearray(200_000)
        n = os.preadv(fd, [rest], 150_000)          # preadv64v2 in CPython 3.11
        os.close(fd)
        print(hashlib.md5(half + rest[:n]).hexdigest())
    """, str(src))
    assert proc.stdout.decode().strip() == md5(src.read_bytes())
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))


def test_second_open_is_a_probe_hit(staged_env):
    src = staged_env.write("twice.bin", SIZE)
    proc = py(staged_env, """
        import hashlib, sys
        a = open(sys.argv[1], "rb").read()
        b = open(sys.argv[1], "rb").read()
        print(hashlib.md5(a).hexdigest(), hashlib.md5(b).hexdigest())
    """, str(src))
    assert proc.stdout.decode().split() == [md5(src.read_bytes())] * 2
    assert staged_env.daemon.requests == ["0/twice.bin"]  # the second open never asked
    assert staged_env.counts() == staged_env.expected(tier0=(2, 2 * SIZE))


def test_numpy_load(staged_env):
    np = pytest.importorskip("numpy")
    arr = np.arange(250_000, dtype=np.float64).reshape(500, 500)
    path = staged_env.root / "arrays" / "a.npy"
    path.parent.mkdir()
    np.save(path, arr)
    size = path.stat().st_size
    proc = py(staged_env, """
        import hashlib, sys, numpy
        a = numpy.load(sys.argv[1])
        print(a.shape, hashlib.md5(a.tobytes()).hexdigest())
    """, str(path))
    assert proc.stdout.decode().strip() == f"(500, 500) {md5(arr.tobytes())}"
    assert staged_env.daemon.requests == ["0/arrays/a.npy"]
    opens, nbytes = staged_env.counts()[2]
    # numpy reads the header with read() (one buffer of Python's), then the body with fread()
    # on a FILE* fdopen'd on an fcntl(F_DUPFD_CLOEXEC) duplicate: both are counted; the open
    # is also uncounted (a FILE may be read by stdio's internal reads): a tight lower bound
    assert opens == 1
    assert size <= nbytes <= arr.nbytes + io.DEFAULT_BUFFER_SIZE
    assert staged_env.uncounted()[2] == 1
    assert staged_env.counts()[0] == (0, 0)


def test_mmap_counts_the_open_only(staged_env):
    src = staged_env.write("m.bin", SIZE)
    proc = py(staged_env, """
        import hashlib, mmap, sys
        with open(sys.argv[1], "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            print(hashlib.md5(m[:]).hexdigest())
    """, str(src))
    assert proc.stdout.decode().strip() == md5(src.read_bytes())
    assert staged_env.counts() == staged_env.expected(tier0=(1, 0))


def test_relative_paths_from_a_cwd_inside_the_root(staged_env):
    src = staged_env.write("sub/dir/r.bin", SIZE)
    proc = py(staged_env, """
        import hashlib
        for p in ["r.bin", "./r.bin", "../dir//r.bin", "../../sub/./dir/r.bin"]:
            print(hashlib.md5(open(p, "rb").read()).hexdigest())
    """, cwd=src.parent)
    assert proc.stdout.decode().split() == [md5(src.read_bytes())] * 4
    assert staged_env.daemon.requests == ["0/sub/dir/r.bin"]
    assert staged_env.counts() == staged_env.expected(tier0=(4, 4 * SIZE))


def test_openat_with_a_directory_fd(staged_env):
    src = staged_env.write("deep/er/o.bin", SIZE)
    proc = py(staged_env, """
        import hashlib, os, sys
        d = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
        fd = os.open("er/o.bin", os.O_RDONLY, dir_fd=d)     # openat64
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        os.close(fd); os.close(d)
        print(hashlib.md5(data).hexdigest())
    """, str(staged_env.root / "deep"))
    assert proc.stdout.decode().strip() == md5(src.read_bytes())
    assert staged_env.daemon.requests == ["0/deep/er/o.bin"]
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))


def test_directory_under_root_opened_without_o_directory_is_the_pfs_one(staged_env):
    staged_env.write("dd/one.bin", 10)
    staged_env.write("dd/two.bin", 10)
    proc = py(staged_env, """
        import os, sys
        open(os.path.join(sys.argv[1], "one.bin"), "rb").read()   # stages dd/ into the tier
        fd = os.open(sys.argv[1], os.O_RDONLY)
        print(" ".join(sorted(os.listdir(fd))))
    """, str(staged_env.root / "dd"))
    assert proc.stdout.decode().split() == ["one.bin", "two.bin"]


def test_missing_file_raises_enoent(staged_env):
    proc = py(staged_env, """
        import sys
        try:
            open(sys.argv[1], "rb")
        except OSError as e:
            print(e.errno)
    """, str(staged_env.root / "missing.bin"))
    assert proc.stdout.decode().strip() == str(errno.ENOENT)
    assert staged_env.counts() == staged_env.expected()


def test_subprocess_in_between_keeps_counting(staged_env):
    """A vfork'ed child closing every descriptor must not clear the parent's fd table."""
    src = staged_env.write("v.bin", SIZE)
    proc = py(staged_env, """
        import hashlib, subprocess, sys
        with open(sys.argv[1], "rb", buffering=0) as f:
            a = f.read(1000)
            subprocess.run(["true"], check=True, close_fds=True, timeout=30)
            b = f.read()
        print(hashlib.md5(a + b).hexdigest())
    """, str(src))
    assert proc.stdout.decode().strip() == md5(src.read_bytes())
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))


def test_stdio_and_mmap_opens_are_counted_as_bytes_unknown(staged_env):
    """stdio may read a FILE through glibc's internal __read, and mmap reads through page
    faults: the shim cannot see all of either, so such an open is counted once as one whose
    bytes are not all known (what fread delivered is counted all the same)."""
    a = staged_env.write("u/a.bin", 50_000)
    b = staged_env.write("u/b.bin", 50_000)
    c = staged_env.write("u/c.bin", 50_000)
    staged_env.python(textwrap.dedent("""
        import mmap, subprocess, sys
        a, b, c = sys.argv[1:]
        subprocess.run(["md5sum", a], check=True, capture_output=True)        # fopen + fread: counted
        with open(b, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            m[:10]; m[10:20]                                                   # one open, mapped
        with open(c, "rb") as f:
            f.read()                                                           # counted bytes
    """), str(a), str(b), str(c))
    tier0 = TIER_SLOTS[0]
    assert staged_env.uncounted()[tier0] == 2
    assert staged_env.counts()[tier0] == (3, 2 * 50_000)
    # of the two, one is read through a FILE (no upper bound), one mapped: its length bounds its bytes
    opens_stdio, mapped_bytes = protocol.read_counters(staged_env.counters)[tier0][3:]
    assert (opens_stdio, mapped_bytes) == (1, 50_000)


def test_every_mapping_adds_its_length_and_an_open_is_uncounted_once(staged_env):
    """Two maps of one descriptor and one of its duplicate: the open is uncounted once, each length
    is added (what page faults may read at most); a map of an unmanaged file adds nothing."""
    a = staged_env.write("v/a.bin", 3 * 4096)
    staged_env.python(textwrap.dedent("""
        import mmap, os, sys
        fd = os.open(sys.argv[1], os.O_RDONLY)
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m, mmap.mmap(fd, 4096, access=mmap.ACCESS_READ) as n:
            m[:]; n[:]
        dup = os.dup(fd)
        with mmap.mmap(dup, 8192, access=mmap.ACCESS_READ, offset=4096) as m:
            m[:]
        with open(sys.executable, "rb") as f, mmap.mmap(f.fileno(), 4096, access=mmap.ACCESS_READ) as m:
            m[:]
    """), str(a))
    tier0 = TIER_SLOTS[0]
    assert protocol.read_counters(staged_env.counters)[tier0] == (1, 0, 1, 0, 3 * 4096 + 4096 + 8192)


def test_os_dup_is_counted_like_dup(staged_env):
    """os.dup is fcntl64(F_DUPFD_CLOEXEC) in CPython: the duplicate's reads are counted, exactly."""
    src = staged_env.write("dup/o.bin", SIZE)
    proc = py(staged_env, """
        import hashlib, os, sys
        fd = os.open(sys.argv[1], os.O_RDONLY)
        copy = os.dup(fd)
        os.close(fd)
        data = b""
        while chunk := os.read(copy, 65536):
            data += chunk
        print(hashlib.md5(data).hexdigest())
    """, str(src))
    assert proc.stdout.decode().strip() == md5(src.read_bytes())
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))
    assert staged_env.uncounted()[TIER_SLOTS[0]] == 0
