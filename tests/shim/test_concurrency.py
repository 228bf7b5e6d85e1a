"""Forked DataLoader-like workers and threads: counts are exact, bytes are right."""

from __future__ import annotations

import textwrap

import pytest

from .conftest import md5

pytestmark = pytest.mark.shim

N_FILES = 32


def dataset(env, n=N_FILES):
    return [env.write(f"shard/{i:03d}.bin", 20_000 + 997 * i) for i in range(n)]


def expected_digests(srcs):
    return {str(s): md5(s.read_bytes()) for s in srcs}


def parse(stdout: bytes) -> dict[str, str]:
    return dict(line.split(" ", 1)[::-1] for line in stdout.decode().splitlines())


def test_four_forked_workers(staged_env):
    srcs = dataset(staged_env)
    proc = staged_env.python(textwrap.dedent("""
        import hashlib, multiprocessing as mp, sys
        paths = sys.argv[1:]
        inherited = open(paths[0], "rb", buffering=0)   # opened before the fork, read in a child

        def worker(rank, q):
            out = []
            if rank == 0:
                out.append((paths[0], hashlib.md5(inherited.read()).hexdigest()))
            for p in paths[1 + rank::4]:
                with open(p, "rb") as f:
                    out.append((p, hashlib.md5(f.read()).hexdigest()))
            q.put(out)   # the child leaves through os._exit

        ctx = mp.get_context("fork")
        q = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(r, q)) for r in range(4)]
        for p in procs: p.start()
        results = [q.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0, p.exitcode
        for out in results:
            for path, digest in out:
                print(digest, path)
    """), *map(str, srcs))
    assert parse(proc.stdout) == expected_digests(srcs)
    assert sorted(staged_env.daemon.requests) == [f"0/shard/{i:03d}.bin" for i in range(N_FILES)]
    total = sum(s.stat().st_size for s in srcs)
    assert staged_env.counts() == staged_env.expected(tier0=(N_FILES, total))


def test_eight_threads(staged_env):
    srcs = dataset(staged_env)
    proc = staged_env.python(textwrap.dedent("""
        import hashlib, os, sys
        from concurrent.futures import ThreadPoolExecutor

        def read(p):
            fd = os.open(p, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                return p, hashlib.md5(os.pread(fd, size, 0)).hexdigest()
            finally:
                os.close(fd)

        paths = sys.argv[1:] * 2          # every file twice: a staging miss, then a hit
        with ThreadPoolExecutor(8) as ex:
            results = list(ex.map(read, paths))
        for p, d in results:
            print(d, p)
        assert len(results) == len(paths)
    """), *map(str, srcs))
    assert parse(proc.stdout) == expected_digests(srcs)
    assert len(proc.stdout.decode().splitlines()) == 2 * N_FILES
    total = sum(s.stat().st_size for s in srcs)
    # threads may race for the same file: the daemon is asked at least once per file
    assert set(staged_env.daemon.requests) == {f"0/shard/{i:03d}.bin" for i in range(N_FILES)}
    assert staged_env.counts() == staged_env.expected(tier0=(2 * N_FILES, 2 * total))


def test_forked_workers_without_daemon_count_pfs(shim_env):
    srcs = dataset(shim_env, 8)
    proc = shim_env.python(textwrap.dedent("""
        import hashlib, os, sys
        pids = []
        for rank in range(4):
            pid = os.fork()
            if pid == 0:
                for p in sys.argv[1 + rank::4]:
                    with open(p, "rb") as f:
                        os.write(1, f"{hashlib.md5(f.read()).hexdigest()} {p}\\n".encode())  # one write: no interleaving
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            assert os.waitpid(pid, 0)[1] == 0
    """), *map(str, srcs))
    assert parse(proc.stdout) == expected_digests(srcs)
    total = sum(s.stat().st_size for s in srcs)
    assert shim_env.counts() == shim_env.expected(pfs=(8, total))
