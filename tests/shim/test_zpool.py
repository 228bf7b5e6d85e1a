"""The memfds compressed hits are decoded into, reused once nothing holds them (shim_zpool.c):
a memfd's pages are paid for once, not per open, and bytes the application still holds (a
descriptor, a duplicate, a mapping, a fork child's inherited copy) are never rewritten."""

from __future__ import annotations

import textwrap

import pytest

from monarch import protocol

from .conftest import md5
from .test_zstd import compressed, compressible, extra

pytestmark = pytest.mark.shim

POOL = 8  # MONARCH_ZPOOL_ENTRIES


def reused(env) -> int:
    return protocol.read_extra_counters(env.counters)[protocol.EXTRA_ZSTD_REUSED]

# argv: path md5 path md5 ...; prints the memfd inode each open was served from
SEQUENTIAL = textwrap.dedent("""
    import hashlib, os, sys
    inodes = []
    for p, want in zip(sys.argv[1::2], sys.argv[2::2]):
        fd = os.open(p, os.O_RDONLY)
        inodes.append(os.stat(f"/proc/self/fd/{fd}").st_ino)
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
        os.close(fd)
        assert hashlib.md5(data).hexdigest() == want, p
    print(" ".join(map(str, inodes)))
""")


def dataset(env, n: int, base: int = 30_000, step: int = 1_111, prefix: str = "p") -> list[str]:
    """n compressed files of varied sizes, as argv pairs: path, md5."""
    args = []
    for i in range(n):
        rel = f"{prefix}/{i}.bin"
        src = env.write(rel, data=compressible(rel, base + step * i))
        compressed(env, rel)
        args += [str(src), md5(src.read_bytes())]
    return args


def test_decoded_opens_reuse_a_memfd_once_it_is_closed(shim_env):
    """Twenty files opened, read and closed one after the other: every one from the same
    memfd (a fresh memfd per open, before the pool, gave twenty inodes). Sizes go up and
    down, so the memfd is resized both ways; every byte is checked."""
    args = dataset(shim_env, 20) + dataset(shim_env, 10, base=90_000, step=-7_000, prefix="q")
    inodes = shim_env.python(SEQUENTIAL, *args).stdout.split()
    assert len(inodes) == 30 and len(set(inodes)) == 1, inodes
    assert extra(shim_env)["opens"] == 30 and shim_env.counts()[protocol.SLOT_PFS] == (0, 0)
    assert reused(shim_env) == 29  # all but the first, which made the memfd


HOLDERS = textwrap.dedent("""
    import hashlib, mmap, os, sys
    pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
    held, rest = pairs[:4], pairs[4:]

    def whole(fd):
        return b"".join(os.pread(fd, 1 << 20, o) for o in range(0, os.fstat(fd).st_size, 1 << 20))

    kept = os.open(held[0][0], os.O_RDONLY)                      # a descriptor kept open
    d = os.open(held[1][0], os.O_RDONLY); dup = os.dup(d); os.close(d)   # only a duplicate left
    m = os.open(held[2][0], os.O_RDONLY)
    mapping = mmap.mmap(m, 0, access=mmap.ACCESS_READ); os.close(m)     # only a mapping left
    inherited = os.open(held[3][0], os.O_RDONLY)                 # only a fork child's copy left
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(go_w)
        os.read(go_r, 1)  # the parent has decoded everything else meanwhile
        ok = hashlib.md5(whole(inherited)).hexdigest() == held[3][1]
        os._exit(0 if ok else 3)
    os.close(go_r)
    os.close(inherited)
    for p, want in rest:  # more files than the pool has memfds, each closed after its read
        with open(p, "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == want, p
    os.write(go_w, b"x")
    assert os.waitpid(child, 0)[1] == 0, "the child's inherited copy was rewritten"
    assert hashlib.md5(whole(kept)).hexdigest() == held[0][1], "a kept descriptor was rewritten"
    assert hashlib.md5(whole(dup)).hexdigest() == held[1][1], "a duplicate was rewritten"
    assert hashlib.md5(mapping[:]).hexdigest() == held[2][1], "a mapping was rewritten"
    print("ok")
""")


def test_a_held_copy_is_never_rewritten(shim_env):
    """Four files held four ways (a descriptor, a duplicate of a closed one, a mapping of a
    closed one, a fork child's copy of one the parent closed) while the process decodes 24
    more: each still reads its own bytes."""
    args = dataset(shim_env, 28)
    assert shim_env.python(HOLDERS, *args).stdout.split() == [b"ok"]
    assert extra(shim_env)["opens"] == 28


MANY_OPEN = textwrap.dedent("""
    import hashlib, os, sys
    pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
    fds = [os.open(p, os.O_RDONLY) for p, _ in pairs]  # all held at once
    inodes = {os.stat(f"/proc/self/fd/{fd}").st_ino for fd in fds}
    for fd, (p, want) in zip(fds, pairs):
        assert hashlib.md5(os.pread(fd, 1 << 20, 0)).hexdigest() == want, p
    print(len(inodes))
""")


def test_more_files_held_than_the_pool_has_memfds_get_fresh_ones(shim_env):
    args = dataset(shim_env, POOL + 3)
    assert shim_env.python(MANY_OPEN, *args).stdout.split() == [str(POOL + 3).encode()]
    assert extra(shim_env)["opens"] == POOL + 3 and extra(shim_env)["left"] == 0 and reused(shim_env) == 0


CLOSED_BEHIND = textwrap.dedent("""
    import ctypes, hashlib, os, sys
    how, precious = sys.argv[1], sys.argv[2]
    pairs = list(zip(sys.argv[3::2], sys.argv[4::2]))

    def check(p, want):
        with open(p, "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == want, p

    check(*pairs[0])  # the pool now holds one memfd, with a descriptor of its own

    def names():
        for n in os.listdir("/proc/self/fd"):
            try:
                yield int(n), os.readlink(f"/proc/self/fd/{n}")
            except FileNotFoundError:  # listdir's own descriptor
                pass

    pool_fd = next(n for n, link in names() if link.startswith("/memfd:monarch-decoded"))
    libc = ctypes.CDLL(None, use_errno=True)
    if how == "close":
        os.close(pool_fd)  # a program closing what it does not own (libc's close)
    elif how == "closerange":
        os.closerange(pool_fd, pool_fd + 1)
    else:
        assert libc.syscall(3, pool_fd) == 0  # SYS_close, past any wrapper
    mine = os.open(precious, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    assert libc.syscall(33, mine, pool_fd) == pool_fd  # SYS_dup2: the application's file has the number now
    os.close(mine)
    fd = pool_fd
    os.write(fd, b"precious" * 1000)
    for p, want in pairs[1:]:
        check(p, want)
    os.close(fd)
    print("ok")
""")


@pytest.mark.parametrize("how", ["close", "closerange", "raw-syscall"])
def test_the_pools_descriptor_closed_by_the_application_costs_nothing(shim_env, tmp_path, how):
    """The application closes the pool's descriptor and opens its own file, which gets the
    number: the pool never touches that file (no resize, no mapping), and the next decoded
    opens still read the right bytes."""
    args = dataset(shim_env, 6)
    precious = tmp_path / "precious.out"
    assert shim_env.python(CLOSED_BEHIND, how, str(precious), *args).stdout.split() == [b"ok"]
    assert precious.read_bytes() == b"precious" * 1000
    assert extra(shim_env)["opens"] == 6


THREADS_AND_FORKS = textwrap.dedent("""
    import hashlib, os, sys, threading
    pairs = list(zip(sys.argv[1::2], sys.argv[2::2]))
    bad = []

    def reader(k):
        for i in range(60):
            p, want = pairs[(k * 7 + i) % len(pairs)]
            with open(p, "rb") as f:
                if hashlib.md5(f.read()).hexdigest() != want:
                    bad.append(p)

    def run():
        ts = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]

    reader(0)  # the parent's pool holds memfds when the children inherit it
    kids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            run()
            os._exit(1 if bad else 0)
        kids.append(pid)
    run()
    assert not bad, bad
    assert all(os.waitpid(k, 0)[1] == 0 for k in kids)
    print("ok")
""")


def test_threads_and_forked_workers_share_no_memfd_they_should_not(shim_env):
    """Four threads in each of three processes (a parent and two fork children, each
    with the pool it inherited at the fork), 780 decoded opens: every byte right."""
    args = dataset(shim_env, 16, step=3_333)
    assert shim_env.python(THREADS_AND_FORKS, *args).stdout.split() == [b"ok"]
    assert extra(shim_env)["opens"] == 3 * 4 * 60 + 60
