#!/usr/bin/env python3
"""Per-open cost of a compressed copy, by part: what one OPEN of a compressed key costs the
daemon, measured on the pieces it is made of (2 cores shared: take the median of a few runs).

    python scripts/bench_zopen.py [--size 256KiB] [--n 400] [--level 6]

  read frame    os.read of the frame from the tier (tmpfs)
  decompress    zstd into bytes (the thread's reused context)
  memfd fill    memfd_create + write + seals
  reopen        a cached memfd's fresh description (/proc/self/fd/N, O_RDONLY): a cache hit
  round trip    a whole OPEN through a running daemon's socket, descriptor received
                (SCM_RIGHTS), miss (decoded now) and hit (from the decoded cache)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import zstandard  # noqa: E402

from monarch import codecs, protocol  # noqa: E402
from monarch.workload import parse_size  # noqa: E402


def content(n: int, seed: int) -> bytes:
    import random
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(3, 9))) for _ in range(200)]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" " + os.urandom(2)
    return bytes(out[:n])


def timed(fn, n):
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def ask(sock_path: str, key: str) -> int:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    s.sendall(protocol.encode_request(protocol.VERB_OPEN, key.encode()))
    while True:
        msg, fds, _, _ = socket.recv_fds(s, 4096, 4)
        if fds:
            s.close()
            for fd in fds[1:]:
                os.close(fd)
            return fds[0]
        if not msg:
            s.close()
            return -1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="256KiB")
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--level", type=int, default=6)
    args = p.parse_args()
    size, n = parse_size(args.size), args.n
    datas = [content(size, i) for i in range(min(n, 64))]
    cctx = zstandard.ZstdCompressor(level=args.level, write_content_size=True)
    frames = [cctx.compress(d) for d in datas]
    print(f"{n} opens of {size} bytes, level {args.level}, ratio {sum(map(len, datas)) / sum(map(len, frames)):.2f}")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        for i, f in enumerate(frames):
            Path(shm, f"{i}.zst").write_bytes(f)
        codec = codecs.Codec("zstd")
        rows = {}
        rows["read frame"] = timed(lambda i: os.close(fd) if (fd := os.open(f"{shm}/{i % len(frames)}.zst", os.O_RDONLY))
                                   and os.read(fd, size) is not None else None, n)
        dctx = zstandard.ZstdDecompressor()
        rows["decompress"] = timed(lambda i: dctx.decompress(frames[i % len(frames)]), n)
        rows["memfd fill + seal"] = timed(lambda i: os.close(codecs.sealed_memfd(datas[i % len(datas)])), n)
        rows["inflate (the three)"] = timed(lambda i: os.close(codec.inflate(f"{shm}/{i % len(frames)}.zst", size)), n)
        mfd = codecs.sealed_memfd(datas[0])
        rows["reopen (cache hit)"] = timed(lambda i: os.close(codecs.reopen(mfd)), n)
        os.close(mfd)
    rows |= round_trips(size, n)
    for k, v in rows.items():
        print(f"  {k:28s} {v:8.1f} us")
    return 0


def round_trips(size: int, n: int) -> dict:
    """A real daemon (monarch.daemon + server, on-access, compressed RAM tier)."""
    import threading
    from monarch.config import load_config
    from monarch.daemon import NodeDaemon
    from monarch.server import NodeServer
    out = {}
    base = tempfile.mkdtemp(prefix="zopen-", dir="/tmp")
    root = Path(base, "pfs")
    root.mkdir()
    files = min(n, 200)
    for i in range(files):
        (root / f"{i}.bin").write_bytes(content(size, i))
    for cache in ("off", "room"):
        cfg = Path(base, f"{cache}.yaml")
        cfg.write_text(f"""dataset: {{roots: ["{root}"]}}
run_dir: "{base}/run-{cache}"
tiers: [{{name: ram, path: "/dev/shm{base}/ram-{cache}", capacity: 1GiB, compression: zstd, decoded_cache: {cache}}}]
staging: {{policy: read-ahead, threads: 2}}
""")
        d = NodeDaemon(load_config(str(cfg), env={"USER": os.environ.get("USER", "u")}), f"zopen{cache}")
        server = NodeServer(d, embedded=False)
        t = threading.Thread(target=server.serve, daemon=True)
        t.start()
        keys = [f"0/{i}.bin" for i in range(files)]
        while d.stager.stats()["files"] < files:
            time.sleep(0.05)
        first = timed(lambda i: os.close(ask(d.socket_path, keys[i % files])), files)
        again = timed(lambda i: os.close(ask(d.socket_path, keys[i % files])), files)
        if cache == "off":
            out["OPEN round trip, decoded each time"] = statistics.mean([first, again])
        else:
            out["OPEN round trip, miss (decoded, kept)"] = first
            out["OPEN round trip, hit (cached memfd)"] = again
        server.request_stop()
        t.join()
        d.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
