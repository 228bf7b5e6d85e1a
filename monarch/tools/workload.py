"""A training-like workload: make a dataset of many files, read it for epochs like a DataLoader.

``python -m monarch.tools.workload make DIR [--files 2000] [--size 100KiB] [--spread 0.5]``
writes files of random content whose sizes spread around the mean (like ImageNet JPEGs),
in a few class subdirectories, and a manifest ``DIR.manifest.json`` beside DIR (relative
path -> size and xxhash64 digest).

``python -m monarch.tools.workload read DIR [--epochs 3] [--workers 4] [--manifest FILE]``
reads every file once per epoch, in a new seeded shuffled order each epoch, with N forked
worker processes (a new pool each epoch, as PyTorch's DataLoader without persistent
workers), each opening, reading and closing whole files. With a manifest every file's
digest is checked; a mismatch makes the exit code non-zero. It prints the time and the
samples/s of each epoch and can write them as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import multiprocessing
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import xxhash

from monarch import sizes

MANIFEST_SUFFIX = ".manifest.json"
READERS = ("python", "os", "mmap")  # or MODULE:FUNCTION, a plug-in reader (_plugin_reader)
CHUNK_FILES = 16           # files per task handed to a worker (a "batch")
OS_READ_CHUNK = 1 << 20    # bytes per os.pread of the "os" reader


class WorkloadError(Exception):
    """A dataset or manifest problem the user has to fix (bad argument, missing file)."""


def parse_size(text: str | int) -> int:
    """``"100KiB"`` -> 102400 (monarch.sizes' forms); WorkloadError for anything else."""
    try:
        return sizes.parse_size(text)
    except ValueError as e:
        raise WorkloadError(str(e)) from None


def default_manifest(directory: str | os.PathLike) -> Path:
    """The manifest beside (not inside) a dataset directory: ``<dir>.manifest.json``."""
    d = Path(directory).resolve()
    return d.with_name(d.name + MANIFEST_SUFFIX)


def digest(data) -> str:
    return xxhash.xxh64_hexdigest(data)


# --------------------------------------------------------------------------- make


def file_sizes(files: int, mean: int, spread: float, seed: int) -> list[int]:
    """Log-normal sizes with the given mean and shape ``spread`` (0 = all equal)."""
    rng = random.Random(seed)
    if spread <= 0:
        return [mean] * files
    mu = math.log(mean) - spread * spread / 2
    return [max(1, int(rng.lognormvariate(mu, spread))) for _ in range(files)]


CONTENTS = ("random", "compressible", "mixed")


def _compressible(rng, nbytes: int, i: int) -> bytes:
    """Bytes with the redundancy of real training data (about 2-3x under zstd): even files
    uint8 images (a smooth field, a little noise), odd files float32 feature maps quantized
    to 1/256. Needs numpy."""
    try:
        import numpy as np
    except ImportError as e:
        raise WorkloadError("compressible datasets need numpy (pip install numpy)") from e
    g = np.random.default_rng(rng.getrandbits(64))
    if i % 2 == 0:
        side = int(nbytes ** 0.5) + 1
        x = np.linspace(0, g.uniform(2, 8), side, dtype=np.float32)
        img = np.sin(x)[:, None] * np.cos(x * g.uniform(0.5, 2))[None, :] * 100 + 128
        img += g.integers(0, 3, img.shape)
        return np.clip(img, 0, 255).astype(np.uint8).tobytes()[:nbytes]
    t = np.arange((nbytes + 3) // 4, dtype=np.float32)
    v = np.sin(t / g.uniform(50, 200)) + g.normal(0, 0.05, t.size)
    return (np.round(v * 256) / 256).astype(np.float32).tobytes()[:nbytes]


def make_dataset(directory: str | os.PathLike, files: int = 2000, size: int | str = "100KiB",
                 spread: float = 0.5, seed: int = 0, classes: int | None = None,
                 manifest: str | os.PathLike | None = None, content: str = "random") -> dict[str, dict]:
    """Write the dataset and its manifest; return the manifest's ``files`` mapping.
    ``content``: random bytes (incompressible), compressible (``_compressible``), or mixed
    (even files compressible, odd ones random)."""
    if content not in CONTENTS:
        raise WorkloadError(f"content must be one of {', '.join(CONTENTS)}, got {content!r}")
    if files < 1:
        raise WorkloadError(f"--files must be at least 1, got {files}")
    mean = parse_size(size)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    classes = classes or min(files, max(4, min(10, files // 100)))
    rng = random.Random(seed + 1)
    entries: dict[str, dict] = {}
    for i, nbytes in enumerate(file_sizes(files, mean, spread, seed)):
        rel = f"class_{i % classes:03d}/sample_{i:06d}.bin"
        if content == "compressible" or (content == "mixed" and i % 2 == 0):
            data = _compressible(rng, nbytes, i // 2 if content == "mixed" else i)
        else:
            data = rng.randbytes(nbytes)
        path = root / rel
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        entries[rel] = {"size": nbytes, "xxh64": digest(data)}
    out = Path(manifest) if manifest else default_manifest(root)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"files": entries, "total_bytes": sum(e["size"] for e in entries.values()),
                               "seed": seed}, indent=0))
    os.replace(tmp, out)
    return entries


def load_manifest(path: str | os.PathLike) -> dict[str, dict]:
    try:
        with open(path) as f:
            return json.load(f)["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise WorkloadError(f"cannot read manifest {path}: {exc}") from exc


def list_files(directory: str | os.PathLike) -> list[str]:
    """Relative paths of all files under ``directory``, sorted (as torchvision's ImageFolder)."""
    root = os.fspath(directory)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            out.append(name if rel_dir == "." else os.path.join(rel_dir, name))
    return sorted(out)


# --------------------------------------------------------------------------- read


@dataclass
class EpochResult:
    epoch: int
    seconds: float
    samples: int
    bytes: int
    samples_per_s: float
    mb_per_s: float
    mismatches: list[str] = field(default_factory=list)
    served: dict[str, int] = field(default_factory=dict)  # opens by how served (pyshim; C shim: its counters)


def _read_python(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _read_os(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        parts, offset = [], 0
        while True:
            chunk = os.pread(fd, OS_READ_CHUNK, offset)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)
            offset += len(chunk)
    finally:
        os.close(fd)


def _read_mmap(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return b""
        # MAP_PRIVATE: FUSE refuses shared maps of direct_io files; a private map works anywhere.
        with mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
            return m[:]
    finally:
        os.close(fd)


_served: dict[str, int] = {}  # how the opens of a plug-in reader were served, per chunk


def _plugin_reader(spec: str):
    """A reader given as ``MODULE:FUNCTION``: ``FUNCTION(path) -> (bytes, how)``, where ``how``
    says how the open was served (benchmarks plug in the shim's open path in Python this way,
    from the checkout's test support, which the installed package does not carry)."""
    import importlib
    module, _, name = spec.partition(":")
    try:
        func = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise WorkloadError(f"--reader {spec}: cannot load it ({e}); give MODULE:FUNCTION importable here") from None

    def read(path: str) -> bytes:
        data, how = func(path)
        _served[how] = _served.get(how, 0) + 1
        return data
    return read


_READ_FUNCS = {"python": _read_python, "os": _read_os, "mmap": _read_mmap}


def _reader(name: str):
    return _READ_FUNCS[name] if name in _READ_FUNCS else _plugin_reader(name)


@dataclass(frozen=True)
class _WorkerSpec:
    root: str
    reader: str
    compute_s: float
    manifest: dict | None


_spec: _WorkerSpec | None = None  # set in each forked worker by _init_worker, never in the parent


def _init_worker(spec: _WorkerSpec) -> None:
    global _spec
    _spec = spec


def _read_chunk(rels: list[str]) -> tuple[int, int, list[str], dict[str, int]]:
    """Worker task: read whole files; return (samples, bytes, mismatch messages, served)."""
    spec = _spec
    _served.clear()
    read = _reader(spec.reader)
    nbytes, bad = 0, []
    for rel in rels:
        data = read(os.path.join(spec.root, rel))
        nbytes += len(data)
        if spec.manifest is not None:
            want = spec.manifest[rel]
            got = digest(data)
            if len(data) != want["size"] or got != want["xxh64"]:
                bad.append(f"{rel}: expected {want['size']} bytes xxh64 {want['xxh64']}, "
                           f"read {len(data)} bytes xxh64 {got}")
        if spec.compute_s:
            time.sleep(spec.compute_s)
    return len(rels), nbytes, bad, dict(_served)


def epoch_order(files: list[str], seed: int, epoch: int) -> list[str]:
    order = list(files)
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def read_dataset(directory: str | os.PathLike, epochs: int = 3, workers: int = 4, seed: int = 0,
                 compute_ms: float = 0.0, manifest: str | os.PathLike | None = None,
                 reader: str = "python", log=None, hints: bool = False) -> list[EpochResult]:
    """Read every file once per epoch with ``workers`` forked processes; stop after an epoch
    that saw a digest mismatch. ``log(line)`` is called with a summary of each epoch.
    ``hints``: tell Monarch's daemon each epoch's order and progress (monarch.hints)."""
    if reader not in READERS and ":" not in reader:
        raise WorkloadError(f"--reader must be one of {', '.join(READERS)} or MODULE:FUNCTION, got {reader!r}")
    if reader not in READERS:
        _plugin_reader(reader)  # fails here, once, rather than in every worker
    if workers < 1:
        raise WorkloadError(f"--workers must be at least 1, got {workers}")
    root = os.fspath(directory)
    if not os.path.isdir(root):
        raise WorkloadError(f"dataset directory {root} does not exist")
    files = list_files(root)
    expected = load_manifest(manifest) if manifest else None
    if expected is not None:
        missing = sorted(set(expected) - set(files))
        extra = sorted(set(files) - set(expected))
        if missing or extra:
            raise WorkloadError(f"{root} does not match manifest {manifest}: "
                                f"{len(missing)} missing (e.g. {missing[:3]}), "
                                f"{len(extra)} not in the manifest (e.g. {extra[:3]})")
    if not files:
        raise WorkloadError(f"dataset directory {root} has no files")
    spec = _WorkerSpec(root, reader, compute_ms / 1e3, expected)
    ctx = multiprocessing.get_context("fork")
    results = []
    hinter = None
    if hints:
        from monarch.hints import Hints
        hinter = Hints()
    counted = os.environ.get("MONARCH_COUNTERS") if reader in READERS else None  # a plug-in counts its own
    for epoch in range(epochs):
        before = _opens_by_source(counted)
        order = epoch_order(files, seed, epoch)
        chunks = [order[i:i + CHUNK_FILES] for i in range(0, len(order), CHUNK_FILES)]
        samples = nbytes = 0
        bad: list[str] = []
        served: dict[str, int] = {}
        t0 = time.perf_counter()
        if hinter is not None:
            hinter.order(os.path.join(root, rel) for rel in order)
        with ctx.Pool(workers, initializer=_init_worker, initargs=(spec,)) as pool:
            for done, (n, b, mism, how) in enumerate(pool.imap_unordered(_read_chunk, chunks), 1):
                samples, nbytes = samples + n, nbytes + b
                bad.extend(mism)
                for k, v in how.items():
                    served[k] = served.get(k, 0) + v
                if hinter is not None:  # chunks start in order: all but the last `workers` are read
                    hinter.progress((done - workers) * CHUNK_FILES)
        seconds = time.perf_counter() - t0
        after = _opens_by_source(counted)
        if before and after:  # under the C shim: its counters, tier opens against PFS opens
            served = {k: after[k] - before[k] for k in after}
        r = EpochResult(epoch, seconds, samples, nbytes, samples / seconds, nbytes / seconds / 1e6, bad, served)
        results.append(r)
        if log:
            log(f"epoch {epoch}: {seconds:.3f} s, {r.samples_per_s:.1f} samples/s, "
                f"{r.mb_per_s:.1f} MB/s, {samples} files, {nbytes} bytes"
                + (f", {len(bad)} DIGEST MISMATCHES" if bad else ""))
        if bad:
            break
    return results


def _opens_by_source(counters: str | None) -> dict[str, int] | None:
    """Opens counted so far by the shim of this job (MONARCH_COUNTERS): from a tier or the
    peer area ("tier"), from the PFS ("pfs"); None outside Monarch."""
    if not counters:
        return None
    from monarch import protocol
    try:
        slots = protocol.read_counters(counters)
    except (OSError, ValueError):
        return None
    return {"tier": sum(c[0] for i, c in enumerate(slots) if i != protocol.SLOT_PFS),
            "pfs": slots[protocol.SLOT_PFS][0]}


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m monarch.tools.workload", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="generate a dataset and its manifest")
    m.add_argument("dir")
    m.add_argument("--files", type=int, default=2000)
    m.add_argument("--size", default="100KiB", help="mean file size (default 100KiB)")
    m.add_argument("--spread", type=float, default=0.5, help="log-normal shape of sizes; 0 = equal (default 0.5)")
    m.add_argument("--classes", type=int, default=None, help="subdirectories (default files/100, within 4..10)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--manifest", default=None, help="manifest path (default DIR.manifest.json beside DIR)")
    r = sub.add_parser("read", help="read the dataset for epochs like a DataLoader")
    r.add_argument("dir")
    r.add_argument("--epochs", type=int, default=3)
    r.add_argument("--workers", type=int, default=4)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--compute-ms", type=float, default=0.0, help="sleep per sample (default 0)")
    r.add_argument("--reader", default="python",
                   help="python: open().read(); os: os.open+os.pread; mmap: a private map; "
                        "MODULE:FUNCTION: FUNCTION(path) -> (bytes, how it was served), e.g. the benchmarks' "
                        "support.pyshim:read_file")
    r.add_argument("--manifest", default=None, help="check every file's digest against this manifest")
    r.add_argument("--json", default=None, help="write per-epoch results here")
    r.add_argument("--hints", action="store_true", help="tell Monarch each epoch's order (monarch.hints)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "make":
            t0 = time.perf_counter()
            entries = make_dataset(args.dir, args.files, args.size, args.spread, args.seed,
                                   args.classes, args.manifest)
            total = sum(e["size"] for e in entries.values())
            print(f"made {len(entries)} files, {total / 1e6:.1f} MB in {args.dir} "
                  f"({time.perf_counter() - t0:.1f} s); manifest {args.manifest or default_manifest(args.dir)}")
            return 0
        results = read_dataset(args.dir, args.epochs, args.workers, args.seed, args.compute_ms,
                               args.manifest, args.reader, log=lambda line: print(line, flush=True),
                               hints=args.hints)
    except WorkloadError as exc:
        print(f"monarch.tools.workload: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dir": args.dir, "workers": args.workers, "reader": args.reader, "seed": args.seed,
                       "compute_ms": args.compute_ms, "epochs": [asdict(r) for r in results]}, f, indent=1)
    bad = [m for r in results for m in r.mismatches]
    if bad:
        print(f"monarch.tools.workload: {len(bad)} file(s) read wrong bytes (digest mismatch), e.g.", file=sys.stderr)
        for line in bad[:5]:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
