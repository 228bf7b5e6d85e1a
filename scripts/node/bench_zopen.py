#!/usr/bin/env python3
"""Per-open cost of a compressed copy, by part: what one OPEN of a compressed key costs the
daemon, measured on the pieces it is made of, and what a re-open costs once its decoded
file is kept (2 cores shared: take the median of a few runs).

    python scripts/node/bench_zopen.py [--size 256KiB] [--n 400] [--level 6]

  read frame     os.read of the frame from the tier (tmpfs)
  decompress     zstd into bytes (the thread's reused context)
  memfd fill     memfd_create + write + seals
  keep           the decoded bytes written as <tier>/<key> (temp + rename; DecodedFiles.put),
                 on tmpfs and on a disk directory (--disk-dir, default /tmp)
  native hit     open + read + close of a kept decoded file: what the shim's probe does on a
                 re-open (tmpfs; disk: from the page cache)
  memfd hit      a memfd's fresh description (/proc/self/fd/N) + read: the earlier memfd cache
  round trip     a whole OPEN through a running daemon's socket: decoded each time
                 (decoded_cache off), a miss (decoded, memfd received, file kept after) and
                 an open answered with the kept file's path (a shim that asks first)
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

import zstandard  # noqa: E402

from benchkit.options import parse_with_quick  # noqa: E402
from benchkit.content import text as content  # noqa: E402  (text-like bytes, ratio ~2 under zstd)
from monarch import protocol  # noqa: E402
from monarch.node.tiers import codecs  # noqa: E402
from monarch.node.snapshot.snapshot import FileInfo  # noqa: E402
from monarch.node.tiers.tiers import DecodedFiles  # noqa: E402
from monarch.tools.workload import parse_size  # noqa: E402


def timed(fn, n):
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def ask(sock_path: str, key: str) -> int:
    """One OPEN: the descriptor passed, or one opened on the path answered (-1: neither)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    s.sendall(protocol.encode_request(protocol.VERB_OPEN, key.encode()))
    got = b""
    while True:
        msg, fds, _, _ = socket.recv_fds(s, 4096, 4)
        if fds:
            s.close()
            for fd in fds[1:]:
                os.close(fd)
            return fds[0]
        got += msg
        head = protocol.ANSWER_HEADER.size
        if not msg or (len(got) >= head and len(got) >= head + protocol.ANSWER_HEADER.unpack(got[:head])[1]):
            s.close()
            status, length = protocol.ANSWER_HEADER.unpack(got[:head]) if len(got) >= head else (-1, 0)
            path = got[head:head + length]
            return os.open(path, os.O_RDONLY) if status > protocol.SLOT_PFS and path.startswith(b"/") else -1


def read_close(fd: int, size: int) -> None:
    if fd >= 0:
        os.read(fd, size + 1)
        os.close(fd)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="256KiB")
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--level", type=int, default=6)
    p.add_argument("--disk-dir", default="/tmp", help="a directory on disk for the keep and native-hit rows")
    args = parse_with_quick(p, None, {"size": "16KiB", "n": 20})
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
        for where, base in (("tmpfs", shm), ("disk", args.disk_dir)):
            with tempfile.TemporaryDirectory(dir=base) as d:
                kept, info = DecodedFiles(d, lambda: 1 << 40), FileInfo(size, 0)
                rows[f"keep: write <tier>/<key> ({where})"] = timed(
                    lambda i: kept.put(f"k/{i}", datas[i % len(datas)], info, kept.token()), n)
                rows[f"native hit: open+read+close ({where})"] = timed(
                    lambda i: read_close(os.open(f"{d}/k/{i}", os.O_RDONLY), size), n)
                kept.close()
        mfd = codecs.sealed_memfd(datas[0])
        rows["memfd hit: reopen+read+close"] = timed(
            lambda i: read_close(os.open(f"/proc/self/fd/{mfd}", os.O_RDONLY), size), n)
        os.close(mfd)
    rows |= round_trips(size, n)
    for k, v in rows.items():
        print(f"  {k:52s} {v:8.1f} us")
    return 0


def round_trips(size: int, n: int) -> dict:
    """A real daemon (monarch.node.daemon + server, read-ahead, compressed RAM tier), decoded
    files not kept and kept."""
    out = {}
    base = tempfile.mkdtemp(prefix="zopen-", dir="/tmp")
    try:
        root = Path(base, "pfs")
        root.mkdir()
        files = min(n, 200)
        for i in range(files):
            (root / f"{i}.bin").write_bytes(content(size, i))
        for cache in ("off", "room"):
            out |= round_trip(base, root, cache, files, size)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{base}", ignore_errors=True)
    return out


def round_trip(base: str, root: Path, cache: str, files: int, size: int) -> dict:
    """The OPEN round trips of one daemon whose RAM tier keeps decoded files as ``cache`` says."""
    import threading
    from monarch.config import load_config
    from monarch.node.daemon import NodeDaemon
    from monarch.node.server import NodeServer
    out = {}
    cfg = Path(base, f"{cache}.yaml")
    cfg.write_text(f"""dataset: {{roots: ["{root}"]}}
run_base: "{base}/run-{cache}"
tiers: [{{name: ram, path: "/dev/shm{base}/ram-{cache}", capacity: 1GiB, compression: zstd, decoded_cache: {cache}}}]
staging: {{policy: read-ahead, threads: 2}}
""")
    for path in (f"{base}/run-{cache}", f"/dev/shm{base}/ram-{cache}"):  # Monarch uses bases that exist, never makes them
        os.makedirs(path)
    d = NodeDaemon(load_config(str(cfg), env={"USER": os.environ.get("USER", "u")}), f"zopen{cache}")
    server = NodeServer(d, embedded=False)
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    try:
        keys = [f"0/{i}.bin" for i in range(files)]
        while d.stager.stats()["files"] < files:
            time.sleep(0.05)
        first = timed(lambda i: read_close(ask(d.socket_path, keys[i % files]), size), files)
        if cache == "room":
            while d.tiers[0].decoded.describe()["kept"] < files:
                time.sleep(0.05)
        again = timed(lambda i: read_close(ask(d.socket_path, keys[i % files]), size), files)
        if cache == "off":
            out["OPEN round trip + read, decoded each time"] = statistics.mean([first, again])
        else:
            out["OPEN round trip + read, miss (memfd; file kept after)"] = first
            out["OPEN round trip + read, answered the kept file's path"] = again
    finally:
        server.request_stop()
        t.join()
        d.close()
    return out


if __name__ == "__main__":
    sys.exit(main())
