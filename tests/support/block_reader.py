"""A large file's reader for the cluster tests: reads it whole ``--passes`` times (``pread`` in
1 MiB calls; through one read-only mapping, in order, or in 64 KiB windows in a random order
put back in place; ``--one-mapping``: one mapping for every pass), checks every pass's digest against the expected one, and prints one JSON
line: the seconds to its first byte and to each pass's end. ``mmap-windows``: ``--windows`` random
4 KiB windows at any offset through one mapping (a token reader's), each checked against the test
data's bytes (``make_large``'s), as a pass."""

import argparse
import hashlib
import json
import mmap
import os
import random
import sys
import time

CALL = 1 << 20
WINDOW = 64 << 10
TOKENS = 4 << 10  # a window of mmap-windows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--sha256", required=True)
    p.add_argument("--mode", choices=["pread", "mmap", "mmap-random", "mmap-windows"], default="pread")
    p.add_argument("--windows", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--one-mapping", action="store_true")
    args = p.parse_args()
    t0 = time.monotonic()
    fd = os.open(args.path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    first = None
    ends = []
    kept = mmap.mmap(fd, size, prot=mmap.PROT_READ) if args.one_mapping else None
    for _ in range(args.passes):
        h = hashlib.sha256()
        if args.mode == "mmap-windows":
            data = hashlib.shake_256(b"monarch").digest(size)  # the test's bytes (make_large)
            rng = random.Random(args.seed + int(os.environ.get("MONARCH_NODE", "0")))  # each node its own
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
                for _ in range(args.windows):
                    off = rng.randrange(size - TOKENS)
                    if m[off:off + TOKENS] != data[off:off + TOKENS]:
                        print(f"wrong bytes in the window at {off}", file=sys.stderr)
                        return 1
                    first = first if first is not None else time.monotonic() - t0
            ends.append(time.monotonic() - t0)
            continue
        if args.mode == "pread":
            for off in range(0, size, CALL):
                data = os.pread(fd, CALL, off)
                first = first if first is not None else time.monotonic() - t0
                h.update(data)
        elif args.mode == "mmap-random":
            whole = bytearray(size)
            order = list(range(0, size, WINDOW))
            random.Random(len(ends)).shuffle(order)
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
                for off in order:
                    whole[off:off + WINDOW] = m[off:off + WINDOW]
                    first = first if first is not None else time.monotonic() - t0
            h.update(whole)
        else:
            m = kept or mmap.mmap(fd, size, prot=mmap.PROT_READ)
            for off in range(0, size, CALL):
                h.update(m[off:off + CALL])
                first = first if first is not None else time.monotonic() - t0
            if m is not kept:
                m.close()
        ends.append(time.monotonic() - t0)
        if h.hexdigest() != args.sha256:
            print(f"wrong bytes in pass {len(ends)}: {h.hexdigest()} != {args.sha256}", file=sys.stderr)
            return 1
    os.close(fd)
    print(json.dumps({"first_byte": first, "passes": ends}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
