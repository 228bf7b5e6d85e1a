"""Readers of one large file besides the token windows of bench_large_reads.py (not a benchmark:
its folder, scripts/large/, is on its path). Each prints the same figures as the windows' reader (first step,
whole job, q1 and q4 in steps/s, wrong reads, the reader's CPU):

- ``lmdb``: an LMDB ``data.mdb`` read by random gets of 64 KiB values through LMDB's own mmap
  (the LMDBIO case), a step a get; every value checked against the bytes it was written with;
- ``sequential``: the whole file in 16 MiB read() calls, in order (a shard read whole, a
  copy); a step a call, the file's md5 checked;
- ``weights``: a one-pass weights load: tensors of 4 KiB to 64 MiB at unaligned offsets, each
  read by one readinto() (torch.load's and safetensors' shape), the file's md5 checked;
- ``md5sum``: ``md5sum`` of the file (stdio: fopen, then fread of 32 KiB), its md5 checked;
  one step;
- ``cat``: ``cat file | md5sum`` (128 KiB read() calls), its md5 checked; one step.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

VALUE = 64 << 10  # an LMDB record's value
KINDS = ("lmdb", "sequential", "weights", "md5sum", "cat")


def value_of(name: str) -> bytes:
    return random.Random(name).randbytes(VALUE)


def make_lmdb(directory: Path, size: int) -> tuple[Path, int]:
    """An LMDB of about ``size`` bytes in ``directory``: its data.mdb and its records."""
    import lmdb
    directory.mkdir(parents=True, exist_ok=True)
    records = size // (VALUE + 4096)
    env = lmdb.open(str(directory), map_size=size + (256 << 20))
    for first in range(0, records, 1000):
        with env.begin(write=True) as txn:
            for i in range(first, min(records, first + 1000)):
                txn.put(f"{i:08d}".encode(), value_of(f"{i:08d}"))
    env.close()
    (directory / "lock.mdb").unlink(missing_ok=True)
    return directory / "data.mdb", records


def md5_of(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


READER = r"""
import hashlib, json, os, random, resource, sys, time
path, kind, steps, check = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
t = [time.monotonic()]
bad = 0
if kind == "lmdb":
    import lmdb
    sys.path.insert(0, sys.argv[5])
    from large_readers import value_of
    env = lmdb.open(os.path.dirname(path), readonly=True, lock=False, max_readers=4)
    records = env.stat()["entries"]
    rng = random.Random(1)
    with env.begin(buffers=True) as txn:
        for _ in range(steps):
            k = f"{rng.randrange(records):08d}"
            bad += bytes(txn.get(k.encode())) != value_of(k)
            t.append(time.monotonic())
    env.close()
elif kind in ("md5sum", "cat"):
    import subprocess
    cmd = ["md5sum", path] if kind == "md5sum" else ["sh", "-c", 'cat "$1" | md5sum', "sh", path]
    bad += subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()[0] != check
    t.append(time.monotonic())
else:
    h = hashlib.md5()
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    if kind == "sequential":
        while True:
            b = os.read(fd, 16 << 20)
            if not b:
                break
            h.update(b)
            t.append(time.monotonic())
    else:
        rng = random.Random(2)
        buf = bytearray(64 << 20)
        with os.fdopen(fd, "rb", buffering=0) as f:
            f.readinto(memoryview(buf)[:4096])  # a header
            h.update(buf[:4096])
            off = 4096
            while off < size:
                n = min(size - off, rng.choice([4 << 10, 96 << 10, 3 << 20, (12 << 20) + 4100, (64 << 20) - 8192]))
                view = memoryview(buf)[:n]
                got = 0
                while got < n:
                    got += f.readinto(view[got:])
                h.update(view)
                off += n
                t.append(time.monotonic())
        fd = -1
    if fd >= 0:
        os.close(fd)
    bad += h.hexdigest() != check
steps = len(t) - 1
q = max(1, steps // 4)
ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps({"first": t[1] - t[0], "total": t[-1] - t[0], "q1": q / (t[q] - t[0]),
                  "q4": q / (t[-1] - t[-1 - q]), "bad": bad, "windows": steps,
                  "cpu": sum(r.ru_utime + r.ru_stime for r in ru)}))
"""
