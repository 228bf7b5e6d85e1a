"""What the benchmarks' files hold, where two benchmarks must hold the same."""

from __future__ import annotations

import random


def text(n: int, seed: int) -> bytes:
    """Words of a small alphabet with two random bytes after each, from a seeded generator:
    ratio ~2 under zstd (bench_shim's --content text, bench_zopen's files)."""
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(3, 9))) for _ in range(200)]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" " + rng.randbytes(2)
    return bytes(out[:n])
