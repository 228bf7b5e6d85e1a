"""Compressed copies decoded by the shim in the application's process (shim_zstd.c): a frame
at <tier>/.z/<key> is opened and decoded into a memfd (pooled: test_zpool.py) with no daemon round trip; a
frame it cannot decode (corrupt, wrong size, a dictionary that is not there, no libzstd)
is left to the daemon, as before: fail open, the source's bytes either way."""

from __future__ import annotations

import os
import textwrap

import pytest
import zstandard

from monarch import protocol

from .conftest import md5, payload

pytestmark = pytest.mark.shim

SIZE = 150_001

READERS = textwrap.dedent("""
    import fcntl, hashlib, mmap, os, sys, threading
    out = []
    for p in sys.argv[1:]:
        with open(p, "rb") as f:
            out.append(hashlib.md5(f.read()).hexdigest())
        fd = os.open(p, os.O_RDONLY)
        st = os.fstat(fd)
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # Python's os.open asks O_CLOEXEC
        out.append(hashlib.md5(b"".join(os.pread(fd, 4096, o) for o in range(0, st.st_size, 4096))).hexdigest())
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
            out.append(hashlib.md5(m[:]).hexdigest())
        out.append(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
        os.close(fd)
    print(" ".join(out))
""")


def compressed(env, rel: str, tier: int = 0, level: int = 3, dict_data=None, frame: bytes | None = None) -> bytes:
    """<tier>/.z/0/<rel>: the source's zstd frame (as the daemon's codec writes it), or ``frame``."""
    src = (env.root / rel).read_bytes()
    if frame is None:
        frame = zstandard.ZstdCompressor(level=level, dict_data=dict_data, write_content_size=True).compress(src)
    dest = env.tiers[tier] / ".z" / "0" / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(frame)
    return frame


def compressible(rel: str, size: int = SIZE) -> bytes:
    return (payload(rel, 64) + b"\0" * 192) * (size // 256) + payload(rel, size % 256)


def expected(src) -> list[str]:
    st = os.stat(src)
    d = md5(src.read_bytes())
    return [d, d, d, f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"]


def extra(env) -> dict[str, int]:
    e = protocol.read_extra_counters(env.counters)
    return {"opens": e[protocol.EXTRA_ZSTD_OPENS], "bytes": e[protocol.EXTRA_ZSTD_BYTES],
            "ns": e[protocol.EXTRA_ZSTD_NS], "left": e[protocol.EXTRA_ZSTD_FALLBACKS]}


def test_a_compressed_copy_is_decoded_here_with_no_daemon_at_all(shim_env):
    """No daemon is running: the hits are the tier's (not the PFS's), with the source's bytes
    through read, pread, mmap and the source's fstat."""
    srcs = [shim_env.write(f"z/{i}.bin", data=compressible(f"z/{i}.bin", SIZE + i)) for i in range(3)]
    for i in range(3):
        compressed(shim_env, f"z/{i}.bin", level=(-5, 1, 9)[i])
    got = shim_env.python(READERS, *map(str, srcs)).stdout.decode().split()
    assert got == [x for s in srcs for x in expected(s)]
    total = sum(os.path.getsize(s) for s in srcs)
    opens, _ = shim_env.counts()[protocol.tier_slot(0)]
    assert opens == 6 and shim_env.counts()[protocol.SLOT_PFS] == (0, 0)
    z = extra(shim_env)
    assert z["opens"] == 6 and z["bytes"] == 2 * total and z["ns"] > 0 and z["left"] == 0, z


def test_a_hit_asks_the_daemon_nothing(shim_env):
    shim_env.start_daemon("pfs")
    src = shim_env.write("z/a.bin", data=compressible("z/a.bin"))
    compressed(shim_env, "z/a.bin")
    got = shim_env.python(READERS, str(src), MONARCH_SHIM_DEBUG="1")
    assert got.stdout.decode().split() == expected(src)
    assert shim_env.daemon.requests == []
    assert b"decoded in this process" in got.stderr


def test_the_raw_or_decoded_copy_is_probed_first(shim_env):
    src = shim_env.write("z/a.bin", data=compressible("z/a.bin"))
    compressed(shim_env, "z/a.bin")
    shim_env.stage("z/a.bin", tier=0)  # a decoded file the daemon kept: <tier>/<key>
    assert shim_env.python(READERS, str(src)).stdout.decode().split() == expected(src)
    assert extra(shim_env)["opens"] == 0 and shim_env.counts()[protocol.tier_slot(0)][0] == 2


def test_dictionary_frames_are_decoded_with_the_tiers_dictionary_or_left_to_the_daemon(shim_env):
    shim_env.start_daemon("pfs")
    header = bytes(range(256)) * 8
    srcs = [shim_env.write(f"d/{i}.bin", data=header + b"id=%06d;" % i + payload(str(i), 64)) for i in range(40)]
    d = zstandard.train_dictionary(4096, [s.read_bytes() for s in srcs[:30]])
    for i in (30, 31):
        compressed(shim_env, f"d/{i}.bin", dict_data=d)
        assert zstandard.get_frame_parameters((shim_env.tiers[0] / ".z" / "0" / f"d/{i}.bin").read_bytes()).dict_id
    # the dictionary is not there: the daemon is asked (here it says PFS), the bytes are right
    assert shim_env.python(READERS, str(srcs[30])).stdout.decode().split() == expected(srcs[30])
    assert shim_env.daemon.requests == ["0/d/30.bin"] * 2 and extra(shim_env)["left"] == 2
    (shim_env.tiers[0] / ".z" / ".dict").mkdir()
    (shim_env.tiers[0] / ".z" / ".dict" / str(d.dict_id())).write_bytes(d.as_bytes())
    assert shim_env.python(READERS, str(srcs[31])).stdout.decode().split() == expected(srcs[31])
    assert shim_env.daemon.requests == ["0/d/30.bin"] * 2 and extra(shim_env)["opens"] == 2


@pytest.mark.parametrize("damage", ["flipped", "truncated", "wrong_size", "not_zstd", "empty"])
def test_a_bad_frame_is_left_to_the_daemon_and_the_bytes_are_right(shim_env, damage):
    shim_env.start_daemon("pfs")
    src = shim_env.write("z/bad.bin", data=compressible("z/bad.bin"))
    frame = bytearray(compressed(shim_env, "z/bad.bin"))
    other = shim_env.write("z/other.bin", data=compressible("z/other.bin", SIZE + 1))
    if damage == "flipped":
        for i in range(20, len(frame) - 8, 7):
            frame[i] ^= 0x5A
    elif damage == "truncated":
        frame = frame[: len(frame) // 2]
    elif damage == "wrong_size":  # a frame of another file: its content size is not the snapshot's
        frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(other.read_bytes()))
    elif damage == "not_zstd":
        frame = bytearray(b"not a frame" * 100)
    else:
        frame = bytearray()
    compressed(shim_env, "z/bad.bin", frame=bytes(frame))
    assert shim_env.python(READERS, str(src)).stdout.decode().split() == expected(src)
    assert shim_env.daemon.requests == ["0/z/bad.bin"] * 2
    assert shim_env.counts()[protocol.SLOT_PFS][0] == 2 and extra(shim_env)["opens"] == 0
    assert extra(shim_env)["left"] == 2


@pytest.mark.parametrize("setting", ["0", "libmonarch-no-such-zstd.so.9"])
def test_without_libzstd_the_daemon_is_asked(shim_env, setting):
    shim_env.start_daemon("pfs")
    src = shim_env.write("z/a.bin", data=compressible("z/a.bin"))
    compressed(shim_env, "z/a.bin")
    assert shim_env.python(READERS, str(src), MONARCH_SHIM_ZSTD=setting).stdout.decode().split() == expected(src)
    assert shim_env.daemon.requests == ["0/z/a.bin"] * 2 and extra(shim_env)["opens"] == 0


FORK_THREADS = textwrap.dedent("""
    import hashlib, os, sys, threading
    paths, want = sys.argv[1::2], sys.argv[2::2]
    def check(i):
        with open(paths[i], "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == want[i], paths[i]
    for i in range(len(paths)):
        check(i)                                  # this thread's context, made once
    kids = []
    for w in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                ts = [threading.Thread(target=check, args=(i,)) for i in range(len(paths)) for _ in range(2)]
                [t.start() for t in ts]; [t.join() for t in ts]
                for i in range(w, len(paths), 3):
                    check(i)
            except BaseException as e:
                print(e, file=sys.stderr); os._exit(1)
            os._exit(0)
        kids.append(pid)
    errors = []
    def run(i):
        try:
            check(i)
        except BaseException as e:
            errors.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(paths)) for _ in range(4)]
    [t.start() for t in ts]; [t.join() for t in ts]
    assert not errors, errors
    assert all(os.waitpid(p, 0)[1] == 0 for p in kids)
""")


def test_forked_workers_and_threads_decode_the_right_bytes(shim_env):
    srcs = [shim_env.write(f"f/{i}.bin", data=compressible(f"f/{i}.bin", 40_000 + 1000 * i)) for i in range(8)]
    for i in range(8):
        compressed(shim_env, f"f/{i}.bin", level=i - 2)
    args = [x for s in srcs for x in (str(s), md5(s.read_bytes()))]
    shim_env.python(FORK_THREADS, *args)
    n = 8 + 3 * 16 + sum(len(range(w, 8, 3)) for w in range(3)) + 32
    assert shim_env.counts()[protocol.tier_slot(0)][0] == n and extra(shim_env)["opens"] == n
    assert shim_env.counts()[protocol.SLOT_PFS] == (0, 0)


def test_a_write_removes_the_compressed_copy(shim_env):
    shim_env.start_daemon("pfs")
    src = shim_env.write("z/w.bin", data=compressible("z/w.bin"))
    compressed(shim_env, "z/w.bin")
    code = textwrap.dedent(f"""
        p = {str(src)!r}
        import hashlib
        assert hashlib.md5(open(p, "rb").read()).hexdigest() == {md5(src.read_bytes())!r}
        with open(p, "wb") as f:
            f.write(b"new bytes")
        assert open(p, "rb").read() == b"new bytes"
    """)
    shim_env.python(code)
    assert not (shim_env.tiers[0] / ".z" / "0" / "z" / "w.bin").exists()
