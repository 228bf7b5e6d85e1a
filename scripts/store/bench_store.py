#!/usr/bin/env python3
"""A dataset in a key-value store with 50 ms round trips, read three ways side by side:

  naive-get      a loader that GETs each file from the store when a worker needs it
  monarch-store  the same reader, unchanged, under ``monarch run`` over the store mounted at a
                 path with no directory on disk (dataset.stores)
  monarch-dir    the same reader under ``monarch run`` over the same dataset in a directory

by two readers (``--variant``, both by default):

  demo           the demo's reader (monarch.tools.workload: 4 forked workers, shuffled epochs, every
                 file's digest checked) over 2,000 x 64 KiB random files; its naive-get is a
                 plug-in that GETs each file (tests/support/redisstore.py: naive_get)
  imagefolder    PyTorch's way, without torch: .npy arrays in class directories
                 (root/train/<class>/<n>.npy), listed as torchvision's ImageFolder lists them
                 and read with np.load by 4 forked workers, every array's digest and class
                 checked (tests/support/imagefolder_reader.py); its naive-get lists the source
                 directory the same way and np.loads each value it GETs

The round trips come from a latency-injecting TCP proxy this script starts (``--proxy``
mode of this file, a process of its own on loopback): redis-server listens on a loopback
port, the proxy on another; every request is held one round trip before it is passed on, in
order (pipelined requests stay pipelined), a new connection waits one round trip, and the
answers are spliced through at once (the link's bandwidth is not limited). tc netem in a
network namespace would be the other way; this machine's kernel has no netem qdisc.
Each dataset is loaded directly (``monarch store put``, not timed), then read only through the proxy.

It prints each mode's epochs, epoch 1 against naive-get, later epochs against monarch-dir,
and what the store served (its own counts: GETs against the files, bytes sent against the
dataset; Monarch's report's bytes read) with the issue's targets.

    python scripts/store/bench_store.py                   # both variants: 2,000 x 64 KiB, 3 epochs, 50 ms (~4 min)
    python scripts/store/bench_store.py --variant imagefolder
    python scripts/store/bench_store.py --quick           # 200 files, 2 epochs, 20 ms round trips
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)
from benchkit.options import fresh_bytecode, write_json  # noqa: E402
from support.latency_proxy import forward_delayed, splice_answers  # noqa: E402


# -- the latency-injecting proxy (run as its own process: support.latency_proxy's link) ----------
# A new connection waits one round trip too (its handshake).
def run_proxy(listen: int, upstream: int, rtt_ms: float, ready: str) -> None:
    import threading
    delay = rtt_ms / 1000.0
    server = socket.create_server(("127.0.0.1", listen), backlog=1024)
    Path(ready).write_text("ready")

    def serve(client: socket.socket) -> None:
        time.sleep(delay)  # the connection's handshake: one round trip
        try:
            up = socket.create_connection(("127.0.0.1", upstream))
        except OSError:
            client.close()
            return
        for sock in (client, up):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        answers = threading.Thread(target=splice_answers, args=(up, client), daemon=True)
        answers.start()
        forward_delayed(client, up, delay)
        answers.join()
        client.close()
        up.close()

    while True:
        client, _ = server.accept()
        threading.Thread(target=serve, args=(client,), daemon=True).start()


# -- the benchmark ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_store: {what} did not start")
        time.sleep(0.02)


def env_here(**extra) -> dict:
    env = checkout_env(tests=True)
    env.pop("MONARCH_DISABLE", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def reader_cmd(root: str, manifest: str, out: str, epochs: int, workers: int, reader: str = "python") -> list[str]:
    return [sys.executable, "-m", "monarch.tools.workload", "read", root, "--epochs", str(epochs), "--workers",
            str(workers), "--manifest", manifest, "--reader", reader, "--json", out]


def epochs_of(path: str) -> list[float]:
    with open(path) as f:
        doc = json.load(f)
    rows = doc["epochs"] if isinstance(doc, dict) else doc
    return [round(r["seconds"], 3) for r in rows]


def write_config(base: str, root: str, store_url: str | None) -> str:
    path = os.path.join(base, "store.yaml" if store_url else "dir.yaml")
    stores = f'\n  stores: {{"{root}": "{store_url}"}}' if store_url else ""
    name = "s" if store_url else "d"
    for d in (f"{base}/run", f"/dev/shm{base}/ram{name}"):
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        f.write(f"""dataset:
  roots: ["{root}"]{stores}
run_base: "{base}/run"
tiers:
  - {{name: ram, path: "/dev/shm{base}/ram{name}", capacity: 2GiB}}
staging: {{policy: read-ahead}}
""")
    return path


def run(cmd: list[str], env: dict, what: str) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"bench_store: {what} failed (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r


@dataclass
class Variant:
    """How one reader runs over a dataset's top directory (``src`` or the store's mount)."""
    reader: Callable[[str, str], list[str]]  # (top, JSON out) -> the reader's command
    naive: Callable[[str, int, str], tuple[list[str], dict]]  # (JSON out, proxy port, prefix) -> command, env


def demo_variant(src: str, base: str, args) -> Variant:
    from monarch.tools.workload import make_dataset
    manifest = os.path.join(base, "demo.manifest.json")
    make_dataset(src, files=args.files, size=args.size, spread=0.0, manifest=manifest)

    def reader(top: str, out: str) -> list[str]:
        return reader_cmd(top, manifest, out, args.epochs, args.workers)

    def naive(out: str, port: int, prefix: str) -> tuple[list[str], dict]:
        return (reader_cmd(src, manifest, out, args.epochs, args.workers, "support.redisstore:naive_get"),
                {"BENCH_STORE_HOST": "127.0.0.1", "BENCH_STORE_PORT": port, "BENCH_STORE_ROOT": src,
                 "BENCH_STORE_PREFIX": prefix})
    return Variant(reader, naive)


def imagefolder_variant(src: str, base: str, args) -> Variant:
    from monarch.sizes import parse_size
    from support.imagefolder_reader import make_npy_dataset
    expected = os.path.join(base, "imagefolder.expected.json")
    make_npy_dataset(src, args.files, parse_size(args.size), min(args.files, 10), expected)

    def reader(top: str, out: str) -> list[str]:
        return [sys.executable, "-m", "support.imagefolder_reader", os.path.join(top, "train"), expected,
                "--epochs", str(args.epochs), "--workers", str(args.workers), "--json", out]

    def naive(out: str, port: int, prefix: str) -> tuple[list[str], dict]:
        return reader(src, out) + ["--get", f"127.0.0.1:{port}:{prefix}", "--top", src], {}
    return Variant(reader, naive)


VARIANTS = {"demo": demo_variant, "imagefolder": imagefolder_variant}


def served_by_store(direct) -> tuple[int, int]:
    """The store's own count since its last CONFIG RESETSTAT: (GETs, bytes it sent)."""
    return (direct.info("commandstats").get("cmdstat_get", {}).get("calls", 0),
            direct.info("stats")["total_net_output_bytes"])


def run_variant(name: str, base: str, args, direct, port: int, proxy_port: int, keep_one: bool) -> dict:
    """One variant's dataset made, loaded into the store (``monarch store put``), read in each mode."""
    here = os.path.join(base, name)
    src = os.path.join(here, "src")
    os.makedirs(here)
    variant = VARIANTS[name](src, here, args)
    files = [os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs]
    dataset_bytes = sum(map(os.path.getsize, files))
    prefix = f"{name}/"
    run([sys.executable, "-m", "monarch", "store", "put", "--no-progress", src,
         f"redis://127.0.0.1:{port}/0?prefix={prefix}"], env_here(), "monarch store put")
    print(f"{name}: {len(files)} files, {dataset_bytes / 2**20:.0f} MiB loaded with monarch store put", flush=True)
    results: dict[str, dict] = {}

    def timed(mode: str, cmd: list[str], out: str, env: dict, what: str) -> dict:
        """``cmd`` run (it writes its epochs to ``out``), with the store's own count of what it served."""
        direct.config_resetstat()
        t0 = time.perf_counter()
        run(cmd, env, what)
        gets, sent = served_by_store(direct)
        print(f"  {mode:13s} done in {time.perf_counter() - t0:.1f} s", flush=True)
        doc = json.load(open(out))
        results[mode] = {"epochs": epochs_of(out), "gets": gets, "sent": sent,
                         "listing_s": doc.get("listing_seconds") if isinstance(doc, dict) else None}
        return results[mode]

    modes = args.modes.split(",")
    # 1. the naive loader: GET each file when the worker reads it
    if "naive-get" in modes:
        out = os.path.join(here, "naive-get.json")
        cmd, extra = variant.naive(out, proxy_port, prefix)
        timed("naive-get", cmd, out, env_here(**extra), "the naive GET loader")

    def under_monarch(mode: str, top: str, cfg: str, what: str) -> dict:
        """The reader over ``top`` under ``monarch run -c cfg``: its figures, and the report's."""
        out, report = os.path.join(here, f"{mode}.json"), os.path.join(here, f"{mode}-report.json")
        got = timed(mode, [sys.executable, "-m", "monarch", "run", "--no-progress", "--report", report, "-c", cfg,
                           "--", *variant.reader(top, out)], out, env_here(), what)
        got["report"] = report
        return got

    # 2. monarch over the store (the mount has no directory on disk)
    if "monarch-store" in modes:
        mount = os.path.join(here, "mnt", "imagenet")
        url = f"redis://127.0.0.1:{proxy_port}/0?prefix={prefix}&timeout=30"
        got = under_monarch("monarch-store", mount, write_config(here, mount, url), "monarch over the store")
        report = got.pop("report")
        if args.keep_report:
            shutil.copy(report, args.keep_report if keep_one else f"{args.keep_report}.{name}")
        doc = json.load(open(report))
        got["store_bytes"] = doc["store"]["bytes_read"]
        got["pipelines"] = pipelines_in_flight(doc)

    # 3. monarch over the same dataset in a directory
    if "monarch-dir" in modes:
        got = under_monarch("monarch-dir", src, write_config(here, src, None), "monarch over a directory")
        got["pfs_bytes"] = json.load(open(got.pop("report")))["pfs"]["total_bytes"]
    return {"files": len(files), "dataset_bytes": dataset_bytes, "modes": results}


def pipelines_in_flight(report: dict) -> tuple[int, int] | None:
    """The read-ahead's pipelines in flight toward the store (the measure's settled limit, its
    peak), from the first node's staging figures, or None."""
    for node in report.get("nodes") or []:
        for flow in ((node.get("staging") or {}).get("store") or {}).get("read_ahead_pipelines", {}).values():
            return flow["limit"], flow["peak"]
    return None


def print_variant(name: str, figures: dict, epochs: int) -> None:
    results, files, dataset_bytes = figures["modes"], figures["files"], figures["dataset_bytes"]
    print(f"\n{name}:\n{'mode':<15}" + "".join(f"{f'epoch {i + 1} (s)':>14}" for i in range(epochs))
          + f"{'store GETs / files':>20}{'store sent / dataset':>22}")
    for mode, r in results.items():
        gets, sent = (f"{r['gets'] / files:.2f}x", f"{r['sent'] / dataset_bytes:.2f}x") if r["gets"] else ("-", "-")
        print(f"{mode:<15}" + "".join(f"{s:>14.2f}" for s in r["epochs"]) + f"{gets:>20}{sent:>22}")
    naive, store, dirs = (results.get(m, {}).get("epochs") for m in ("naive-get", "monarch-store", "monarch-dir"))
    if naive and store:
        print(f"epoch 1: monarch-store {naive[0] / store[0]:.1f}x faster than naive-get (target >= 10x)")
    if store and dirs and len(store) > 1:
        later_store, later_dir = sum(store[1:]) / (len(store) - 1), sum(dirs[1:]) / (len(dirs) - 1)
        print("later epochs: monarch-store / monarch-dir = " + ", ".join(f"{s / d:.2f}" for s, d in zip(store[1:], dirs[1:]))
              + f"; their means {later_store:.3f} s / {later_dir:.3f} s = {later_store / later_dir:.2f} (target within "
              "10%; both are tier hits, and sub-second epochs vary by tens of ms with the machine's load)")
    if "monarch-store" in results:
        r = results["monarch-store"]
        print(f"store read: {r['store_bytes'] / dataset_bytes:.2f}x the dataset (target 1.00x; Monarch's report), "
              f"the store's own count: {r['gets']} GETs for {files} files (the manifest twice), "
              f"{r['sent'] / dataset_bytes:.3f}x the dataset's bytes sent")
        if r.get("pipelines"):
            print(f"read-ahead pipelines in flight: settled on {r['pipelines'][0]}, at most {r['pipelines'][1]} "
                  f"(each up to 32 GETs)")
    listed = {m: r["listing_s"] for m, r in results.items() if r.get("listing_s") is not None}
    if listed:
        print("listing (find_classes + make_dataset): " + ", ".join(f"{m} {s * 1e3:.1f} ms" for m, s in listed.items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="demo,imagefolder", help="demo, imagefolder or both (default both)")
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--size", default="64KiB")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rtt-ms", type=float, default=50.0, help="round trip the proxy adds (default 50)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--quick", action="store_true", help="a smoke run: 200 files, 2 epochs, 20 ms round trips")
    p.add_argument("--modes", default="naive-get,monarch-store,monarch-dir", help="which modes to run (default all)")
    p.add_argument("--keep-report", default=None, metavar="PATH",
                   help="copy monarch-store's JSON report here (PATH.VARIANT with both variants)")
    p.add_argument("--proxy", nargs=4, metavar=("LISTEN", "UPSTREAM", "RTT_MS", "READY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    fresh_bytecode()
    if args.quick:
        args.files, args.epochs, args.rtt_ms = min(args.files, 200), min(args.epochs, 2), min(args.rtt_ms, 20.0)
    if args.proxy:
        run_proxy(int(args.proxy[0]), int(args.proxy[1]), float(args.proxy[2]), args.proxy[3])
        return 0
    variants = list(dict.fromkeys(args.variant.replace("both", "demo,imagefolder").split(",")))
    if unknown := set(variants) - set(VARIANTS):
        p.error(f"--variant: {', '.join(sorted(unknown))}? choose demo, imagefolder or both")
    if shutil.which("redis-server") is None:
        raise SystemExit("bench_store: redis-server is not installed (scripts/install.sh installs it)")

    base = tempfile.mkdtemp(prefix="mbs-", dir="/tmp")
    procs: list[subprocess.Popen] = []
    figures: dict[str, dict] = {}
    try:
        port, proxy_port = free_port(), free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", base, "--maxclients", "4096"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        import redis
        direct = redis.Redis(host="127.0.0.1", port=port)  # not through the proxy: loading, counting

        def answers() -> bool:
            try:
                return bool(direct.ping())
            except redis.ConnectionError:
                return False
        wait_for(answers, "redis-server")
        ready = os.path.join(base, "proxy.ready")
        procs.append(subprocess.Popen([sys.executable, __file__, "--proxy", str(proxy_port), str(port),
                                       str(args.rtt_ms), ready]))
        wait_for(lambda: os.path.exists(ready), "the latency proxy")
        slow = redis.Redis(host="127.0.0.1", port=proxy_port)
        slow.ping()
        t0 = time.perf_counter()
        slow.ping()
        rtt = (time.perf_counter() - t0) * 1e3
        print(f"bench_store: {args.files} files x {args.size}, {args.epochs} epochs, {args.workers} forked workers, "
              f"every file checked; redis-server {direct.info('server')['redis_version']} behind a latency-injecting "
              f"TCP proxy (measured PING {rtt:.1f} ms)", flush=True)
        for name in variants:
            figures[name] = run_variant(name, base, args, direct, port, proxy_port, len(variants) == 1)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{base}", ignore_errors=True)

    for name, got in figures.items():
        print_variant(name, got, args.epochs)
    write_json(args.json, {"files": args.files, "size": args.size, "rtt_ms": args.rtt_ms, "measured_rtt_ms": rtt,
                       "variants": figures}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
