"""A process started before the daemon's snapshot exists (the walk overlaps the
application's start-up): its first call under a root waits for the index (INDEX, with
heartbeats) at most MONARCH_SHIM_INDEX_WAIT_MS, then answers from it; a snapshot that
fails, a daemon that is lost, silent or too slow leave it on the PFS -- with no tier copy
read, since nobody vouched for them. Past the wait the calls go to the PFS, counted, and
the index is used from the first call after it is written (the default wait is a few
hundred ms: the tests of a longer wait set it, as a user may)."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time

import pytest

from monarch import protocol

from .conftest import TIMEOUT, md5
from .test_metadata import PY_PROGRAM, make_tree, meta_counts, plain_env

pytestmark = pytest.mark.shim

SIZE = 50_000
LONG_WAIT = {protocol.ENV_INDEX_WAIT: "60000"}  # the old default's behaviour: wait for the whole walk


def index_later(env, beats: float, status: int | None = protocol.INDEX_READY, write: bool = True):
    """A stub INDEX answer: heartbeats for ``beats`` seconds, then (``write``) the index, then
    ``status`` (None: close without answering). Waiters on several connections share one end."""
    end = None
    lock = threading.Lock()

    def answer(conn):
        nonlocal end
        with lock:
            end = end or time.monotonic() + beats
        while time.monotonic() < end:
            env.daemon._send(conn, protocol.encode_answer(protocol.STATUS_PENDING))
            time.sleep(protocol.HEARTBEAT_MS / 1000)
        with lock:
            if write and not os.path.exists(env.index):
                env.write_index()
        return status
    return answer


def without_index(env, **extra) -> dict:
    """The process environment, with the index not (yet) written."""
    e = env.environ(**extra)
    os.unlink(env.index)
    return e


def test_metadata_waits_for_a_late_index_then_answers_from_it(shim_env):
    make_tree(shim_env)
    argv = [sys.executable, "-c", PY_PROGRAM, str(shim_env.root)]
    want = shim_env.run(argv, env=plain_env(shim_env), cwd=shim_env.root).stdout
    shim_env.start_daemon("pfs", index=index_later(shim_env, beats=0.8))
    assert shim_env.run(argv, cwd=shim_env.root).stdout == want  # the index there from the start
    at_start = meta_counts(shim_env)
    assert shim_env.daemon.index_asked == 0
    t0 = time.monotonic()
    got = shim_env.run(argv, env=without_index(shim_env, **LONG_WAIT), cwd=shim_env.root).stdout
    assert time.monotonic() - t0 >= 0.8  # it waited for the index
    assert got == want
    late = [b - a for a, b in zip(at_start, meta_counts(shim_env))]
    assert late == list(at_start) and late[0] > 150  # every answer the index gives, as if it had been there
    assert shim_env.daemon.index_asked == 1  # once per process, not per call


def test_an_open_under_a_root_waits_before_it_probes_a_tier(shim_env):
    """A kept copy is checked against the snapshot before the index appears: a process that
    started earlier must not open the copy before that (here: the copy is stale until the
    'daemon' replaces it with the right bytes, just before it says the index is ready)."""
    src = shim_env.write("k/a.bin", SIZE)
    stale = shim_env.stage("k/a.bin", tier=0, data=b"S" * SIZE)

    def answer(conn):
        time.sleep(0.5)
        stale.write_bytes(src.read_bytes())  # adoption: the stale copy gone, a good one in its place
        shim_env.write_index()
        return protocol.INDEX_READY

    shim_env.start_daemon("pfs", index=answer)
    code = "import hashlib, sys; print(hashlib.md5(open(sys.argv[1], 'rb').read()).hexdigest())"
    out = shim_env.run([sys.executable, "-c", code, str(src)], env=without_index(shim_env, **LONG_WAIT)).stdout
    assert out.decode().split() == [md5(src.read_bytes())]
    assert shim_env.counts() == shim_env.expected(tier0=(1, SIZE))  # the copy, after the wait


@pytest.mark.parametrize("how", ["failed", "lost", "silent"])
def test_no_snapshot_means_the_pfs_and_no_tier_copy(shim_env, how):
    src = shim_env.write("k/b.bin", SIZE)
    shim_env.stage("k/b.bin", tier=0, data=b"S" * SIZE)  # never vouched for: must not be read
    make_tree(shim_env)
    index = {"failed": index_later(shim_env, 0.3, protocol.INDEX_NONE, write=False),
             "lost": index_later(shim_env, 0.3, None, write=False),
             "silent": lambda conn: time.sleep(8) or None}[how]
    shim_env.start_daemon("stage", index=index)
    code = textwrap.dedent("""
        import hashlib, os, sys
        print(sorted(os.listdir(sys.argv[2])), os.stat(sys.argv[1]).st_size)
        print(hashlib.md5(open(sys.argv[1], 'rb').read()).hexdigest())
    """)
    argv = [sys.executable, "-c", code, str(src), str(shim_env.root / "train")]
    want = shim_env.run(argv, env=plain_env(shim_env)).stdout
    t0 = time.monotonic()
    got = shim_env.run(argv, env=without_index(shim_env)).stdout
    elapsed = time.monotonic() - t0
    assert got == want and md5(src.read_bytes()).encode() in got
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))
    assert shim_env.daemon.requests == []  # not even asked: the daemon has nothing to serve
    local, pfs, _ = meta_counts(shim_env)
    assert local == 0 and pfs >= 2
    assert elapsed < 6 if how == "silent" else True  # silence is given up after HEARTBEAT_TIMEOUT_MS


def test_the_wait_is_bounded(shim_env):
    src = shim_env.write("k/c.bin", SIZE)
    shim_env.start_daemon("stage", index=index_later(shim_env, beats=TIMEOUT, write=False))
    code = "import os, sys; print(os.stat(sys.argv[1]).st_size, len(open(sys.argv[1], 'rb').read()))"
    t0 = time.monotonic()
    out = shim_env.run([sys.executable, "-c", code, str(src)],
                       env=without_index(shim_env, **{protocol.ENV_INDEX_WAIT: "700"})).stdout
    elapsed = time.monotonic() - t0
    assert out.split() == [str(SIZE).encode()] * 2
    assert 0.7 <= elapsed < 5
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))


def test_threads_and_forked_children_all_get_the_index(shim_env):
    make_tree(shim_env)
    shim_env.start_daemon("pfs", index=index_later(shim_env, beats=0.6))
    code = textwrap.dedent("""
        import os, sys, threading
        root = sys.argv[1]
        pid = os.fork()                      # before any call under the root: both wait
        results = []
        def one(i):
            results.append((i, os.stat(f"{root}/train/class{i % 3}/img{i % 4}.jpg").st_size,
                            sorted(os.listdir(f"{root}/train/class{i % 3}"))))
        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        if pid:
            os.waitpid(pid, 0)  # the child's line first: two writers to one pipe would interleave
        print(pid == 0, sorted(results), flush=True)
        if not pid:
            os._exit(0)
    """)
    argv = [sys.executable, "-c", code, str(shim_env.root)]
    want = sorted(shim_env.run(argv, env=plain_env(shim_env)).stdout.splitlines())
    got = sorted(shim_env.run(argv, env=without_index(shim_env, **LONG_WAIT)).stdout.splitlines())
    assert got == want and len(got) == 2
    local, pfs, _ = meta_counts(shim_env)
    assert local == 2 * 8 * 2 and pfs == 0
    assert 2 <= shim_env.daemon.index_asked <= 2 * 8  # per process at most once per waiting thread


def test_calls_outside_the_roots_never_wait(shim_env):
    out = shim_env.other / "x.bin"
    out.write_bytes(b"x" * 10)
    shim_env.start_daemon("pfs", index=index_later(shim_env, beats=TIMEOUT, write=False))
    t0 = time.monotonic()
    shim_env.python("import os, sys; os.stat(sys.argv[1]); open(sys.argv[1], 'rb').read(); os.listdir('/')",
                    str(out), env=without_index(shim_env))
    assert time.monotonic() - t0 < 3
    assert shim_env.daemon.index_asked == 0


def test_the_python_client_waits_too(shim_env):
    """support.pyshim (benchmarks): no tier probe before the snapshot is ready."""
    from support.pyshim import PFS, PyShim
    src = shim_env.write("k/d.bin", SIZE)
    stale = shim_env.stage("k/d.bin", tier=0, data=b"S" * SIZE)
    ready = threading.Event()

    def answer(conn):
        time.sleep(0.3)
        stale.write_bytes(src.read_bytes())
        ready.set()
        return protocol.INDEX_READY

    shim_env.start_daemon("pfs", index=answer)
    env = without_index(shim_env, **LONG_WAIT)
    fd, how = PyShim(env).open(str(src))
    try:
        assert ready.is_set() and os.read(fd, SIZE + 1) == src.read_bytes() and how != PFS
    finally:
        os.close(fd)
    shim_env.daemon.index = index_later(shim_env, 0.2, protocol.INDEX_NONE, write=False)
    fd, how = PyShim(env).open(str(src))
    os.close(fd)
    assert how == PFS


def early_lost(env) -> tuple[int, int, int, int]:
    c = protocol.read_extra_counters(env.counters)
    return (c[protocol.EXTRA_EARLY_OPENS], c[protocol.EXTRA_EARLY_META], c[protocol.EXTRA_LOST_OPENS],
            c[protocol.EXTRA_LOST_META])


STAT_LOOP = textwrap.dedent("""
    import os, sys, time
    path, until = sys.argv[1], float(sys.argv[2])
    t0 = time.monotonic()
    os.stat(path)
    first = time.monotonic() - t0
    longest = 0.0
    while not os.path.exists(sys.argv[3]) and time.monotonic() - t0 < until:
        t = time.monotonic(); os.stat(path); longest = max(longest, time.monotonic() - t)
        time.sleep(0.01)
    time.sleep(0.05)
    t = time.monotonic(); os.stat(path); longest = max(longest, time.monotonic() - t)
    print(first, longest, len(open(path, 'rb').read()))
""")


def test_a_walk_longer_than_the_wait_is_not_waited_for_and_its_index_is_used_once_written(shim_env):
    """The first stat is answered within the wait (from the PFS, counted as before the
    index); once the 'daemon' writes the index, the next calls are answered from it: the
    process did not give up on Monarch."""
    src = shim_env.write("k/e.bin", SIZE)
    shim_env.start_daemon("stage", index=index_later(shim_env, beats=TIMEOUT, write=False))
    env = without_index(shim_env)

    def write_later():
        time.sleep(1.5)
        shim_env.write_index()
    writer = threading.Thread(target=write_later)
    writer.start()
    try:
        out = shim_env.run([sys.executable, "-c", STAT_LOOP, str(src), "20", shim_env.index], env=env).stdout
    finally:
        writer.join()
    first, longest, size = out.split()
    assert float(first) < 1.0 and float(longest) < 1.0 and int(size) == SIZE
    local, pfs, _ = meta_counts(shim_env)
    early_opens, early_meta, lost_opens, lost_meta = early_lost(shim_env)
    assert pfs >= 1 and early_meta == pfs and (lost_opens, lost_meta) == (0, 0)  # each PFS stat said why
    assert local >= 1  # the index, once written: used
    assert early_opens == 0 and shim_env.counts() == shim_env.expected(tier0=(1, SIZE))  # the open: a tier copy


def test_the_pfs_because_the_daemon_is_lost_is_counted_apart(shim_env):
    src = shim_env.write("k/f.bin", SIZE)
    shim_env.start_daemon("stage", index=lambda conn: None)  # closes every INDEX unanswered
    code = "import os, sys; print(os.stat(sys.argv[1]).st_size, len(open(sys.argv[1], 'rb').read()))"
    t0 = time.monotonic()
    out = shim_env.run([sys.executable, "-c", code, str(src)], env=without_index(shim_env)).stdout
    assert time.monotonic() - t0 < 5
    assert out.split() == [str(SIZE).encode()] * 2
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))
    assert early_lost(shim_env) == (0, 0, 1, 1)
    assert shim_env.daemon.requests == []


def test_a_busy_daemon_is_not_lost(shim_env):
    """INDEX held past the wait, with heartbeats: the daemon is walking, not lost."""
    src = shim_env.write("k/g.bin", SIZE)
    shim_env.start_daemon("stage", index=index_later(shim_env, beats=TIMEOUT, write=False))
    code = "import os, sys; print(os.stat(sys.argv[1]).st_size, len(open(sys.argv[1], 'rb').read()))"
    out = shim_env.run([sys.executable, "-c", code, str(src)], env=without_index(shim_env)).stdout
    assert out.split() == [str(SIZE).encode()] * 2
    assert early_lost(shim_env) == (1, 1, 0, 0)
