"""The daemon raises its soft descriptor limit at start (monarch.launch.service): a slow PFS
keeps hundreds of copies in flight, a few descriptors each, and a node's soft limit is often
1,024."""

import os
import resource
import subprocess
import sys


def test_the_daemon_raises_its_soft_descriptor_limit_toward_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = ("import resource; h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, h)); "
            "from monarch.launch.service import raise_open_files_limit; raise_open_files_limit(); "
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    want = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
    assert int(out) == max(256, want)


ARENAS = r'''
import ctypes, os, sys, tempfile, threading
if sys.argv[1] == "limit":
    from monarch.launch.service import limit_malloc_arenas
    limit_malloc_arenas()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
together = threading.Barrier(32)

def work():  # 32 threads allocating at once, each its own blocks
    together.wait()
    blocks = [libc.malloc(64 << 10) for _ in range(64)]
    together.wait()
    for b in blocks:
        libc.free(b)

threads = [threading.Thread(target=work) for _ in range(32)]
for t in threads:
    t.start()
for t in threads:
    t.join()
fd, path = tempfile.mkstemp()
os.close(fd)
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(open(path).read().count("<heap nr="))
os.unlink(path)
'''


def test_the_daemons_threads_share_two_malloc_arenas():
    """Up to 8 arenas a core, each keeping its freed memory, held ~10 MB of a daemon whose
    stager ran 256 threads: limited, 32 threads allocating at once share 2 (the user's
    MALLOC_ARENA_MAX, if set, rules)."""
    if not hasattr(__import__("ctypes").CDLL(None), "malloc_info"):
        import pytest
        pytest.skip("not glibc")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    run = lambda *a, **kw: int(subprocess.run([sys.executable, "-c", ARENAS, *a], capture_output=True, text=True,
                                              check=True, env=kw.get("env", env)).stdout)
    assert run("limit") <= 2
    assert run("free") > 2  # without the limit, more arenas: the limit is what holds them
    assert run("limit", env=env | {"MALLOC_ARENA_MAX": "4"}) > 2
