"""A PyTorch-style reader of .npy samples in class directories, without torch (not installed here).

The listing mirrors torchvision's ``ImageFolder`` (``find_classes``: the sorted names of
``os.scandir``'s directories; ``make_dataset``: per class, ``sorted(os.walk(...))`` and the
sorted file names with an allowed extension, a class without one an error), the loader is
``np.load``. Each epoch a new seeded shuffle read by ``workers`` forked processes (a new
pool per epoch, chunks of 16 samples, as the demo's reader: ``monarch.tools.workload``), every
array checked against its expected shape, dtype, digest and class.

    python -m support.imagefolder_reader ROOT EXPECTED [--epochs 3] [--workers 4] [--json OUT]
    python -m support.imagefolder_reader ROOT EXPECTED --get HOST:PORT:PREFIX --top TOP   # GET each sample

``EXPECTED`` is the JSON ``make_npy_dataset`` writes. ``--get``: the naive loader of the
store benchmark, listing ROOT as above and GETting each sample's key (``PREFIX`` + its path
under ``TOP``, the directory that was loaded) when a worker needs it. Writes (``--json``)
the classes, the samples and each epoch's seconds, samples, bytes and mismatches. Exit 1 on
any mismatch, 2 when the listing is not the expected one.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import sys
import time

import numpy as np

from monarch.tools.workload import CHUNK_FILES, digest, epoch_order

EXTENSIONS = (".npy",)


# -- the listing: torchvision.datasets.folder's find_classes and make_dataset, minus torch ------------
def find_classes(directory: str) -> tuple[list[str], dict[str, int]]:
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {name: i for i, name in enumerate(classes)}


def make_dataset(directory: str, class_to_idx: dict[str, int]) -> list[tuple[str, int]]:
    samples = []
    for target_class in sorted(class_to_idx):
        target_dir = os.path.join(directory, target_class)
        found = []
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(EXTENSIONS):
                    found.append((os.path.join(root, fname), class_to_idx[target_class]))
        if not found:  # torchvision's allow_empty=False
            raise FileNotFoundError(f"Found no valid file for the class {target_class}. "
                                    f"Supported extensions are: {', '.join(EXTENSIONS)}")
        samples.extend(found)
    return samples


# -- the dataset and its expected arrays ----------------------------------------------------------
def npy_shape(file_bytes: int, dtype=np.float32) -> tuple[int]:
    """The 1-D shape whose .npy file is ``file_bytes`` long (or as near as the header allows)."""
    itemsize = np.dtype(dtype).itemsize
    items = max(1, (file_bytes - 128) // itemsize)  # format 1.0: a header padded to 64 bytes, 128 for short shapes
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(items, dtype))
    return (items + (file_bytes - buf.tell()) // itemsize,)


def make_npy_dataset(top: str, files: int, file_bytes: int, classes: int, expected: str, seed: int = 0) -> dict:
    """``top/train/<class>/<n>.npy``: ``files`` float32 arrays of random values, dealt round the
    classes, each file ``file_bytes`` long (or as near as the header allows). Writes ``expected``
    (beside, not inside, ``top``): class names and, per sample path under ``top/train``, its
    class, shape, dtype and the xxh64 of its array's bytes. Returns that document."""
    rng = np.random.default_rng(seed)
    shape = npy_shape(file_bytes)
    names = [f"n{1000 + 37 * k:08d}" for k in range(classes)]  # wnid-like, so that sorting matters little
    samples = {}
    for i in range(files):
        cls = names[i % classes]
        rel = f"{cls}/{i // classes}.npy"  # unpadded, as many datasets: sorted() puts 10 before 2
        os.makedirs(os.path.join(top, "train", cls), exist_ok=True)
        arr = rng.standard_normal(shape, dtype=np.float32)
        np.save(os.path.join(top, "train", rel), arr)
        samples[rel] = {"class": cls, "shape": list(shape), "dtype": str(arr.dtype), "xxh64": digest(arr.tobytes())}
    doc = {"classes": names, "samples": samples}
    with open(expected, "w") as f:
        json.dump(doc, f)
    return doc


# -- the reader -----------------------------------------------------------------------------------
_worker: dict = {}  # set in each forked worker by _init, never in the parent


def _init(root: str, expected: dict, get: str | None, top: str | None) -> None:
    _worker.update(root=root, expected=expected, classes=sorted(expected["classes"]), get=get, top=top, client=None)


def _load(path: str) -> tuple[np.ndarray, int]:
    """(the array, the bytes read for it): np.load of the file, or of the value GET returns."""
    if _worker["get"] is None:
        return np.load(path), os.path.getsize(path)
    if _worker["get"].startswith("s3:"):  # s3:BUCKET:PREFIX, the endpoint and credentials from AWS_*
        from support.s3server import naive_s3_get
        _, bucket, prefix = _worker["get"].split(":", 2)
        value = naive_s3_get(bucket, prefix + os.path.relpath(path, _worker["top"]))
        return np.load(io.BytesIO(value)), len(value)
    host, port, prefix = _worker["get"].split(":", 2)
    if _worker["client"] is None:  # one connection per forked worker
        import redis
        _worker["client"] = redis.Redis(host=host, port=int(port))
    value = _worker["client"].get(prefix + os.path.relpath(path, _worker["top"]))
    if value is None:
        raise FileNotFoundError(f"no key for {path} in the store")
    return np.load(io.BytesIO(value)), len(value)


def _read_chunk(chunk: list[tuple[str, int]]) -> tuple[int, int, list[str]]:
    nbytes, bad = 0, []
    for path, target in chunk:
        rel = os.path.relpath(path, _worker["root"])
        want = _worker["expected"]["samples"][rel]
        arr, n = _load(path)
        nbytes += n
        got = (list(arr.shape), str(arr.dtype), digest(arr.tobytes()), _worker["classes"][target])
        if got != (want["shape"], want["dtype"], want["xxh64"], want["class"]):
            bad.append(f"{rel}: expected {want}, read shape {got[0]} dtype {got[1]} xxh64 {got[2]} class {got[3]}")
    return len(chunk), nbytes, bad


def read(root: str, expected_path: str, epochs: int = 3, workers: int = 4, seed: int = 0,
         get: str | None = None, top: str | None = None) -> dict:
    with open(expected_path) as f:
        expected = json.load(f)
    t0 = time.perf_counter()
    classes, class_to_idx = find_classes(root)
    samples = make_dataset(root, class_to_idx)
    listed = {"classes": classes, "samples": [[os.path.relpath(p, root), t] for p, t in samples]}
    out = {"listing_seconds": time.perf_counter() - t0, **listed, "epochs": []}
    if classes != sorted(expected["classes"]) or sorted(r for r, _ in listed["samples"]) != sorted(expected["samples"]):
        out["listing_differs"] = True
        return out
    ctx = multiprocessing.get_context("fork")
    for epoch in range(epochs):
        order = epoch_order(samples, seed, epoch)
        chunks = [order[i:i + CHUNK_FILES] for i in range(0, len(order), CHUNK_FILES)]
        n = nbytes = 0
        bad: list[str] = []
        t0 = time.perf_counter()
        with ctx.Pool(workers, initializer=_init, initargs=(root, expected, get, top)) as pool:
            for k, b, mism in pool.imap_unordered(_read_chunk, chunks):
                n, nbytes = n + k, nbytes + b
                bad.extend(mism)
        out["epochs"].append({"epoch": epoch, "seconds": time.perf_counter() - t0, "samples": n, "bytes": nbytes,
                              "mismatches": bad})
        print(f"epoch {epoch}: {out['epochs'][-1]['seconds']:.3f} s, {n} arrays, {nbytes} bytes"
              + (f", {len(bad)} MISMATCHES" if bad else ""), flush=True)
        if bad:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m support.imagefolder_reader", description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("expected")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--get", default=None, metavar="HOST:PORT:PREFIX",
                   help="GET each sample from this store (s3:BUCKET:PREFIX: from S3, as AWS_* say, with boto3)")
    p.add_argument("--top", default=None, help="with --get: the directory whose paths are the store's keys")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.get and not args.top:
        p.error("--get needs --top")
    out = read(args.root, args.expected, args.epochs, args.workers, args.seed, args.get, args.top)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    if out.get("listing_differs"):
        print(f"imagefolder_reader: the listing of {args.root} is not the expected one "
              f"({len(out['classes'])} classes, {len(out['samples'])} samples)", file=sys.stderr)
        return 2
    return 1 if any(e["mismatches"] for e in out["epochs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
