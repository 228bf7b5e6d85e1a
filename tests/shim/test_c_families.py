"""Every wrapped glibc family, from a small C program, under the shim."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from monarch import protocol

from .conftest import md5

pytestmark = pytest.mark.shim

SIZE = 123_457

# (open family, read family, bytes counted?)
FAMILIES = [
    ("open", "read", True),
    ("open64", "__read_chk", True),
    ("__open_2", "pread", True),
    ("__open64_2", "pread64", True),
    ("openat", "readv", True),
    ("openat64", "preadv", True),
    ("__openat_2", "preadv64", True),
    ("__openat64_2", "preadv2", True),
    ("open", "preadv64v2", True),
    ("open64", "__pread_chk", True),
    ("open", "__pread64_chk", True),
    ("open", "sendfile", True),
    ("fopen64", "read", True),
    ("fopen", "fread", True),  # fread's bytes are counted (the open is uncounted: stdio may read otherwise)
]


@pytest.mark.parametrize("open_fam,read_fam,counted", FAMILIES, ids=[f"{o}+{r}" for o, r, _ in FAMILIES])
def test_family_staged_by_daemon(staged_env, families_bin, open_fam, read_fam, counted):
    src = staged_env.write("fam/data.bin", SIZE)
    proc = staged_env.run([families_bin, open_fam, read_fam, str(src)])
    assert md5(proc.stdout) == md5(src.read_bytes())
    assert staged_env.daemon.requests == ["0/fam/data.bin"]
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE if counted else 0))


@pytest.mark.parametrize("open_fam", ["open", "openat64", "__open_2", "fopen"])
def test_family_probe_hit_prefers_fastest_tier(shim_env, families_bin, open_fam):
    src = shim_env.write("a/b.bin", SIZE)
    shim_env.stage("a/b.bin", tier=1)
    shim_env.stage("a/b.bin", tier=0)
    proc = shim_env.run([families_bin, open_fam, "read", str(src)])  # no daemon: probing must suffice
    assert md5(proc.stdout) == md5(src.read_bytes())
    assert shim_env.counts() == shim_env.expected(tier0=(1, SIZE))


def test_reads_from_the_staged_copy(shim_env, families_bin):
    """Proof the bytes come from the tier: give the staged copy different content."""
    src = shim_env.write("x.bin", 1000)
    shim_env.stage("x.bin", tier=1, data=b"S" * 1000)
    proc = shim_env.run([families_bin, "openat", "pread", str(src)])
    assert proc.stdout == b"S" * 1000
    assert shim_env.counts() == shim_env.expected(tier1=(1, 1000))


@pytest.mark.parametrize("how", ["dup", "dup2", "fcntl"])
def test_dup_keeps_counting(staged_env, families_bin, how):
    src = staged_env.write("d.bin", SIZE)
    proc = staged_env.run([families_bin, "open", "read", str(src), how])
    assert md5(proc.stdout) == md5(src.read_bytes())
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))


@pytest.mark.parametrize("open_fam", ["open", "fopen64"])
def test_closed_fd_number_reused_is_not_counted(staged_env, families_bin, open_fam):
    src = staged_env.write("r.bin", SIZE)
    other = staged_env.write("unmanaged.bin", 50_000, under=staged_env.other)
    proc = staged_env.run([families_bin, open_fam, "read", str(src), f"reuse={other}"])
    assert md5(proc.stdout) == md5(src.read_bytes())
    assert staged_env.counts() == staged_env.expected(tier0=(1, SIZE))


@pytest.mark.parametrize("open_fam", ["open", "__openat64_2", "fopen"])
def test_missing_file_gives_enoent(staged_env, families_bin, open_fam):
    proc = staged_env.run([families_bin, open_fam, "read", str(staged_env.root / "nope.bin")], check=False)
    assert proc.returncode == 3
    assert proc.stderr.decode().strip() == f"errno={errno.ENOENT}"
    assert staged_env.counts() == staged_env.expected()


def test_file_as_directory_gives_enotdir(staged_env, families_bin):
    staged_env.write("f.bin", 10)
    proc = staged_env.run([families_bin, "open", "read", str(staged_env.root / "f.bin" / "x")], check=False)
    assert (proc.returncode, proc.stderr.decode().strip()) == (3, f"errno={errno.ENOTDIR}")
    assert staged_env.counts() == staged_env.expected()


def test_daemon_answer_in_the_peer_area_counts_slot_1(shim_env, families_bin):
    """The daemon may name a copy in the peer area (a probe dir of slot 1): count its slot."""
    peer = shim_env.base / "peer"
    shim_env.start_daemon("stage", slot=1, into=peer)
    src = shim_env.write("p/q.bin", SIZE)
    probe = f"{protocol.SLOT_PEER}={peer}"
    for _ in range(2):  # the first open asks the daemon, the second finds the copy by probing
        proc = shim_env.run([families_bin, "open", "pread", str(src)], MONARCH_PROBE=probe)
        assert md5(proc.stdout) == md5(src.read_bytes())
    assert (peer / "0/p/q.bin").read_bytes() == src.read_bytes()
    assert shim_env.daemon.requests == ["0/p/q.bin"]
    assert shim_env.counts() == shim_env.expected(peer=(2, 2 * SIZE))


def test_answer_outside_the_probe_dirs_is_refused(shim_env, families_bin):
    """A copy the daemon names outside every MONARCH_PROBE dir is not opened: PFS."""
    peer = shim_env.base / "peer"
    shim_env.start_daemon("stage", slot=1, into=peer)
    src = shim_env.write("p/r.bin", SIZE)
    proc = shim_env.run([families_bin, "open", "pread", str(src)])
    assert md5(proc.stdout) == md5(src.read_bytes())
    assert shim_env.daemon.requests == ["0/p/r.bin"]
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))


def test_only_the_wrappers_are_exported(shim_lib):
    """Hidden visibility: the library exports the wrapped glibc names and nothing else."""
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm not installed")
    out = subprocess.run([nm, "-D", "--defined-only", shim_lib], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1] in "TW"}
    assert exported == {
        "open", "open64", "__open_2", "__open64_2", "openat", "openat64", "__openat_2", "__openat64_2",
        "fopen", "fopen64", "freopen", "freopen64", "close", "isatty", "fclose", "dup", "dup2", "dup3", "close_range",
        "fsync", "fdatasync", "sync_file_range", "msync",
        "mmap", "mmap64", "munmap", "mremap", "fcntl", "fcntl64", "fdopen", "setvbuf", "setbuf", "setbuffer", "fread",
        "fread_unlocked", "__fread_chk",
        "__fread_unlocked_chk", "execve", "execv", "execvp", "execvpe", "fexecve", "execl", "execlp", "execle",
        "monarch_shim_loaded",  # the marker: is the shim loaded, and active?
        # a cluster's guarded mappings (shim_guard.c): SIGSEGV's disposition, the protection the
        # application sets, and the calls whose kernel reads its memory
        "mprotect", "sigaction", "signal", "bsd_signal", "sysv_signal", "write", "pwrite", "pwrite64", "writev",
        "pwritev", "pwritev64", "send", "sendto", "sendmsg", "fwrite", "fwrite_unlocked",
        # the application's own read-ahead advice on a mapping of a large file stands (shim_blocks.c)
        "madvise", "posix_madvise",
        # raw system calls answered as libc's (shim_rawsys.c): libc's syscall(), new threads watched,
        # SIGSYS never blocked
        "syscall", "pthread_create", "sigprocmask", "pthread_sigmask",
        "read", "pread", "pread64", "readv", "preadv", "preadv64", "preadv2", "preadv64v2",
        "__read_chk", "__pread_chk", "__pread64_chk", "sendfile", "sendfile64", "copy_file_range",
        "creat", "creat64", "rename", "renameat", "renameat2", "unlink", "unlinkat", "remove", "rmdir",
        "truncate", "truncate64",
        "fstat", "fstat64", "__fxstat", "__fxstat64", "fstatat", "fstatat64", "newfstatat", "__fxstatat",
        "__fxstatat64", "statx",
        # metadata answered from the index, and the calls that turn it off (test_metadata.py)
        "stat", "stat64", "lstat", "lstat64", "__xstat", "__xstat64", "__lxstat", "__lxstat64",
        "access", "euidaccess", "eaccess", "faccessat",
        "opendir", "fdopendir", "readdir", "readdir64", "readdir_r", "readdir64_r", "closedir", "dirfd",
        "rewinddir", "telldir", "seekdir",
        "mkdir", "mkdirat", "mknod", "mknodat", "symlink", "symlinkat", "link", "linkat", "chmod", "fchmodat",
        "chown", "lchown", "fchownat", "utime", "utimes", "lutimes", "futimesat", "utimensat",
        "fchmod", "fchown", "futimens",
        # extended attributes under a key-value store's root (none; tests/store/test_store_run.py)
        "getxattr", "lgetxattr", "listxattr", "llistxattr",
    } - ({"pthread_create"} if os.uname().machine != "x86_64" else set())  # new threads watched: x86_64's dispatch
