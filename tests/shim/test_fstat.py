"""fstat of a staged descriptor reports the source's stat (from the snapshot index):
size, mode, mtime, ino, dev ... are the PFS file's, not the tier copy's."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest

from .conftest import TIMEOUT

pytestmark = pytest.mark.shim

SIZE = 70_001


def source_fields(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mode, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_uid, st.st_gid, st.st_nlink]


def staged_with_other_stat(env, rel: str):
    """A source and a tier copy whose stat differs in every field we rewrite but size."""
    src = env.write(rel, SIZE)
    os.chmod(src, 0o640)
    os.utime(src, ns=(1_500_000_000_123_456_789, 1_600_000_000_987_654_321))
    copy = env.stage(rel, tier=0)
    os.chmod(copy, 0o600)
    cst, sst = copy.stat(), src.stat()
    assert (cst.st_ino, cst.st_mode, cst.st_mtime_ns) != (sst.st_ino, sst.st_mode, sst.st_mtime_ns)
    return src, copy


def test_python_os_fstat_of_a_staged_file(shim_env):
    src, _ = staged_with_other_stat(shim_env, "st/a.bin")
    proc = shim_env.python(textwrap.dedent("""
        import os, sys
        with open(sys.argv[1], "rb") as f:
            st = os.fstat(f.fileno())
            print(st.st_size, st.st_mode, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_uid, st.st_gid, st.st_nlink)
            d = os.dup2(f.fileno(), 50)            # dup2 keeps it
            st = os.fstat(d)
            print(st.st_size, st.st_mode, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_uid, st.st_gid, st.st_nlink)
            os.close(d)
            print(len(f.read()))
    """), str(src))
    want = " ".join(map(str, source_fields(src.stat())))
    assert proc.stdout.decode().splitlines() == [want, want, str(SIZE)]
    assert shim_env.counts() == shim_env.expected(tier0=(1, SIZE))


# argv: a staged file. Once it is open a seccomp filter (x86-64 numbers) refuses fstat and
# newfstatat, and kills the process at an ioctl: only answers that never ask the kernel pass.
NO_SYSCALL = textwrap.dedent("""
    import ctypes, os, resource, signal, sys
    f = open(sys.argv[1], "rb")
    libc = ctypes.CDLL(None, use_errno=True)
    LD, JEQ, RET, ALLOW, EPERM, KILL = 0x20, 0x15, 0x06, 0x7FFF0000, 0x00050000 | 1, 0x80000000
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, 0xC000003E), (RET, 0, 0, ALLOW), (LD, 0, 0, 0),
            (JEQ, 4, 0, 5), (JEQ, 3, 0, 262), (JEQ, 1, 0, 16), (RET, 0, 0, ALLOW), (RET, 0, 0, KILL), (RET, 0, 0, EPERM)]
    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
    code = (Insn * len(prog))(*[Insn(*i) for i in prog])
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    if libc.prctl(22, 2, ctypes.byref(Prog(len(prog), code)), 0, 0) != 0:  # a filter
        print("no seccomp filter here: errno", ctypes.get_errno())
        sys.exit(0)
    try:
        os.fstat(sys.stdin.fileno())
        print("the filter lets fstat through")
    except PermissionError:
        pass
    pid = os.fork()
    if pid == 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.isatty(sys.stdin.fileno())  # an ioctl: killed
        os._exit(0)
    status = os.waitpid(pid, 0)[1]
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS):
        print("the filter lets ioctl through")
    for st in (os.fstat(f.fileno()), os.stat(f.fileno())):
        print(st.st_size, st.st_mode, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_uid, st.st_gid, st.st_nlink)
    print(os.isatty(f.fileno()), f.isatty())
    print(len(f.read()))  # FileIO.readall sizes its buffer by fstat too
""")


def test_fstat_and_isatty_of_a_staged_file_ask_the_kernel_nothing(shim_env):
    """The index has fstat's whole answer (every field the kernel gives is overwritten from it)
    and a tier copy is never a terminal, so neither call is made: Python's open makes two
    fstat and one isatty per file."""
    if os.uname().machine != "x86_64":
        pytest.skip("the seccomp filter names x86-64 system calls")
    src, _ = staged_with_other_stat(shim_env, "st/n.bin")
    proc = shim_env.python(NO_SYSCALL, str(src))
    if proc.stdout.startswith(b"no seccomp filter here"):
        pytest.skip(proc.stdout.decode().strip())  # a sandbox that refuses seccomp: nothing to measure with
    want = " ".join(map(str, source_fields(src.stat())))
    assert proc.stdout.decode().splitlines() == [want, want, "False False", str(SIZE)]
    assert shim_env.counts() == shim_env.expected(tier0=(1, SIZE))


def test_c_fstat_fstatat_statx_of_a_staged_fd(shim_env, statfd_bin):
    src, copy = staged_with_other_stat(shim_env, "st/c.bin")
    proc = shim_env.run([statfd_bin, "stat", str(src)])
    head, _, data = proc.stdout.partition(b"--\n")
    want = source_fields(src.stat())
    got = {}
    for line in head.decode().splitlines():
        call, *fields = line.split()
        got[call] = [int(fields[0]), int(fields[1], 8), *map(int, fields[2:])]
    assert got == {"fstat": want, "fstatat": want, "statx": want}
    assert data == src.read_bytes()
    # without a usable index (or outside it) the copy's own stat shows: the rewrite is what made it
    # equal (an index that is missing, with no daemon to say it is coming, means no tier copy at all)
    unusable = shim_env.base / "unusable-index"
    unusable.write_bytes(b"")
    plain = shim_env.run([statfd_bin, "stat", str(src)], MONARCH_INDEX=str(unusable))
    fields = plain.stdout.split(b"--\n")[0].decode().splitlines()[0].split()
    assert int(fields[4]) == copy.stat().st_ino


def test_pfs_and_unmanaged_fds_are_untouched(staged_env, statfd_bin):
    out = staged_env.write("u.bin", SIZE, under=staged_env.other)
    proc = staged_env.run([statfd_bin, "stat", str(out)])
    line = proc.stdout.split(b"--\n")[0].decode().splitlines()[0].split()
    assert int(line[4]) == out.stat().st_ino and int(line[3]) == out.stat().st_mtime_ns


def test_corrupt_index_means_no_rewrite_and_no_crash(shim_env, statfd_bin, tmp_path):
    src, copy = staged_with_other_stat(shim_env, "st/k.bin")
    good = open(shim_env.environ()["MONARCH_INDEX"], "rb").read()
    bad = bytearray(good)
    bad[24:32] = (1 << 62).to_bytes(8, "little")  # buckets offset far beyond the file
    for n, data in enumerate([bytes(bad), good[:40], b"", os.urandom(4096)]):
        path = tmp_path / f"bad{n}"
        path.write_bytes(data)
        proc = shim_env.run([statfd_bin, "stat", str(src)], env={**shim_env.environ(), "MONARCH_INDEX": str(path)})
        head, _, body = proc.stdout.partition(b"--\n")
        assert body == copy.read_bytes()
        assert int(head.decode().splitlines()[0].split()[4]) == copy.stat().st_ino


def test_tar_of_the_root_equals_tar_without_the_shim(shim_env):
    """tar -h (dereference: plain opens, not O_NOFOLLOW) takes size, mode, mtime, owner
    from the fstat of the open file and checks it against the earlier stat: served from
    the tier copies, the archive is byte for byte the one made from the PFS."""
    tar = shutil.which("tar")
    if not tar:
        pytest.skip("tar not installed")
    rels = [f"t/{i:02d}.bin" for i in range(6)] + ["t/sub/deep.bin"]
    for i, rel in enumerate(rels):
        src = shim_env.write(rel, 10_000 + 1000 * i)
        os.chmod(src, 0o640 if i % 2 else 0o604)
        os.utime(src, ns=(1_400_000_000_000_000_000 + i, 1_500_000_000_000_000_000 + i * 1_000_000_000))
        copy = shim_env.stage(rel, tier=0)
        os.chmod(copy, 0o600)
    argv = [tar, "-h", "--sort=name", "-cf", "-", "-C", str(shim_env.root), "t"]
    plain = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, check=True).stdout
    shimmed = shim_env.run(argv)
    assert shimmed.stderr == b""  # no "file changed as we read it"
    assert shimmed.stdout == plain
    total = sum((shim_env.root / r).stat().st_size for r in rels)
    # every file from its copy; tar also opens t and t/sub (without O_DIRECTORY): not file opens
    assert shim_env.counts() == shim_env.expected(tier0=(len(rels), total))
