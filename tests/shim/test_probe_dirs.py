"""Probe directories opened once per process (shim_paths.c, "probe directories"): hits are
opened relative to the tier's descriptor, and that descriptor is never trusted once it may
not be the tier any more -- the application closed it (close, close_range, dup2 onto it) or
closed it behind the shim's back and put another directory at its number -- nor does it
let a copy that is not a regular file through."""

from __future__ import annotations

import os
import textwrap

import pytest

from .conftest import md5

pytestmark = pytest.mark.shim

SIZE = 20_000

# argv: tier dir, then path md5 pairs; prints the descriptors that name the tier dir after each open
HITS = textwrap.dedent("""
    import hashlib, os, sys
    tier = sys.argv[1]
    def tier_fds():
        out = []
        for n in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{n}") == tier:
                    out.append(int(n))
            except FileNotFoundError:  # listdir's own descriptor
                pass
        return out
    for p, want in zip(sys.argv[2::2], sys.argv[3::2]):
        with open(p, "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == want, p
        print(len(tier_fds()))
""")


def staged(env, n: int) -> list[str]:
    """n files of the root, each with its copy in tier 0: argv pairs (path, md5)."""
    args = []
    for i in range(n):
        src = env.write(f"d{i % 2}/f{i}.bin", SIZE)
        env.stage(f"d{i % 2}/f{i}.bin", 0)
        args += [str(src), md5(src.read_bytes())]
    return args


def test_hits_open_the_tier_once_and_read_its_copies(shim_env):
    shim_env.start_daemon("pfs")  # every open a probe hit: the daemon is never asked
    args = staged(shim_env, 4)
    proc = shim_env.python(HITS, str(shim_env.tiers[0]), *args)
    assert proc.stdout.decode().split() == ["1"] * 4  # one descriptor of the tier, opened at the first probe
    assert shim_env.counts() == shim_env.expected(tier0=(4, 4 * SIZE))
    assert shim_env.daemon.requests == []


def test_a_fork_child_hits_through_the_inherited_descriptor(shim_env):
    shim_env.start_daemon("pfs")
    a, ma, b, mb, c, mc = staged(shim_env, 3)
    proc = shim_env.python(textwrap.dedent("""
        import hashlib, os, sys
        def read(p):
            with open(p, "rb") as f:
                return hashlib.md5(f.read()).hexdigest()
        print(read(sys.argv[1]))
        pid = os.fork()
        if pid == 0:
            print(read(sys.argv[2]), flush=True)
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        print(read(sys.argv[3]))
    """), a, b, c)
    assert proc.stdout.decode().split() == [ma, mb, mc]
    assert shim_env.counts() == shim_env.expected(tier0=(3, 3 * SIZE))


# argv: how, tier dir, decoy dir, then path md5 pairs. The first file is read (the tier's
# descriptor opened), the descriptor is closed as `how` says and a decoy directory holding
# "0/<rel>" of each file with other bytes is put at its number; the rest are read.
SABOTAGE = textwrap.dedent("""
    import ctypes, hashlib, os, sys
    how, tier, decoy = sys.argv[1:4]
    pairs = list(zip(sys.argv[4::2], sys.argv[5::2]))
    libc = ctypes.CDLL(None, use_errno=True)
    def read(p, want):
        with open(p, "rb") as f:
            got = hashlib.md5(f.read()).hexdigest()
        print("ok" if got == want else "WRONG BYTES " + p)
    read(*pairs[0])
    n = next(int(x) for x in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{x}") == tier)
    d = os.open(decoy, os.O_RDONLY | os.O_DIRECTORY)
    if how == "dup2":
        os.dup2(d, n)  # libc's dup2 onto the tier's number
    else:
        if how == "close":
            os.close(n)
        elif how == "closerange":
            os.closerange(n, n + 1)
        else:
            assert libc.syscall(3, n) == 0  # SYS_close, past any wrapper
        assert libc.syscall(33, d, n) == n  # SYS_dup2: the decoy has the number now
    os.close(d)
    for p, want in pairs[1:]:
        read(p, want)
""")


@pytest.mark.parametrize("how", ["close", "closerange", "dup2", "syscall"])
def test_a_descriptor_the_application_took_over_is_never_probed(shim_env, how):
    """Closed through the shim (close, close_range, dup2): forgotten at once, so even a decoy
    copy of the very size and mtime of the source is never read. Closed behind its back (a raw
    syscall): the decoy's copy is not of the source's mtime, the descriptor is checked, found
    to be another directory, and forgotten; the copy is read by path."""
    shim_env.start_daemon("pfs")
    args = staged(shim_env, 3)
    decoy = shim_env.base / "decoy"
    for path in args[2::2]:
        rel = os.path.relpath(path, shim_env.root)
        fake = decoy / "0" / rel
        fake.parent.mkdir(parents=True, exist_ok=True)
        fake.write_bytes(b"not the dataset's bytes".ljust(SIZE, b"!"))
        st = os.stat(path)
        if how != "syscall":  # only the wrappers stand between this forgery and the application
            os.utime(fake, ns=(st.st_atime_ns, st.st_mtime_ns))
    proc = shim_env.python(SABOTAGE, how, str(shim_env.tiers[0]), str(decoy), *args)
    assert proc.stdout.decode().split() == ["ok"] * 3
    assert shim_env.counts() == shim_env.expected(tier0=(3, 3 * SIZE))


def test_a_copy_that_is_not_a_regular_file_is_never_handed_out(shim_env):
    """A directory where the dataset has a file (a kept tier from a run when it was one) and
    a FIFO (opened O_NONBLOCK, so that its open returns): the PFS original is read."""
    shim_env.start_daemon("pfs")
    a = shim_env.write("k/was_a_dir.bin", SIZE)
    b = shim_env.write("k/fifo.bin", SIZE)
    (shim_env.tiers[0] / "0" / "k" / "was_a_dir.bin" / "x").mkdir(parents=True)
    os.mkfifo(shim_env.tiers[0] / "0" / "k" / "fifo.bin")
    proc = shim_env.python(textwrap.dedent("""
        import hashlib, os, sys
        for p, flags in ((sys.argv[1], 0), (sys.argv[2], os.O_NONBLOCK)):
            fd = os.open(p, os.O_RDONLY | flags)
            data = b""
            while chunk := os.read(fd, 1 << 16):
                data += chunk
            os.close(fd)
            print(hashlib.md5(data).hexdigest())
    """), str(a), str(b))
    assert proc.stdout.decode().split() == [md5(a.read_bytes()), md5(b.read_bytes())]
    assert shim_env.counts() == shim_env.expected(pfs=(2, 2 * SIZE))
