#!/usr/bin/env python3
"""A dataset in a key-value store with 50 ms round trips (issue 34), read three ways side by side:

  naive-get      the demo's reader (monarch.workload: 4 forked workers, shuffled epochs, every
                 file's digest checked) with a plug-in that GETs each file from the store when
                 the worker needs it (tests/support/redisstore.py: naive_get)
  monarch-store  the same reader, unchanged, under ``monarch run`` over the store mounted at a
                 path with no directory on disk (dataset.stores)
  monarch-dir    the same reader under ``monarch run`` over the same dataset in a directory

The round trips come from a latency-injecting TCP proxy this script starts (``--proxy``
mode of this file, a process of its own on loopback): redis-server listens on a loopback
port, the proxy on another, and every chunk in each direction is held RTT/2 before it is
passed on, in order (pipelined requests stay pipelined; the link's bandwidth is not limited).
The store is loaded directly (``monarch store put``, not timed), then read only through the proxy.

It prints each mode's epochs, epoch 1 against naive-get, later epochs against monarch-dir,
and the bytes read from the store against the dataset's, with the issue's targets.

    python scripts/bench_store.py                   # 2,000 x 64 KiB, 3 epochs, 50 ms round trips
    python scripts/bench_store.py --files 400 --rtt-ms 20   # a quick run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


# -- the latency-injecting proxy (run as its own process) -------------------------------------------
async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = loop.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
    except (ConnectionError, OSError):
        queue.put_nowait((loop.time(), b""))
    await sender


async def _proxy(listen: int, upstream: int, delay: float, ready: str) -> None:
    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            cw.close()
            return
        cw.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        uw.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(cr, uw, delay), _pipe(ur, cw, delay), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", listen, backlog=1024)
    Path(ready).write_text("ready")
    async with server:
        await server.serve_forever()


def run_proxy(listen: int, upstream: int, rtt_ms: float, ready: str) -> None:
    asyncio.run(_proxy(listen, upstream, rtt_ms / 2000.0, ready))


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
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env.pop("MONARCH_DISABLE", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def reader_cmd(root: str, manifest: str, out: str, epochs: int, workers: int, reader: str = "python") -> list[str]:
    return [sys.executable, "-m", "monarch.workload", "read", root, "--epochs", str(epochs), "--workers",
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--size", default="64KiB")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rtt-ms", type=float, default=50.0, help="round trip the proxy adds (default 50)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--proxy", nargs=4, metavar=("LISTEN", "UPSTREAM", "RTT_MS", "READY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.proxy:
        run_proxy(int(args.proxy[0]), int(args.proxy[1]), float(args.proxy[2]), args.proxy[3])
        return 0
    if shutil.which("redis-server") is None:
        raise SystemExit("bench_store: redis-server is not installed (scripts/install.sh installs it)")
    from monarch.store.load import put
    from monarch.store.url import StoreURL
    from monarch.workload import make_dataset

    base = tempfile.mkdtemp(prefix="mbs-", dir="/tmp")
    procs: list[subprocess.Popen] = []
    try:
        src = os.path.join(base, "src")
        manifest = os.path.join(base, "src.manifest.json")
        make_dataset(src, files=args.files, size=args.size, spread=0.0, manifest=manifest)
        dataset_bytes = sum(e["size"] for e in json.load(open(manifest))["files"].values())
        port, proxy_port = free_port(), free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", base, "--maxclients", "4096"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        import redis
        direct = redis.Redis(host="127.0.0.1", port=port)

        def answers() -> bool:
            try:
                return bool(direct.ping())
            except redis.ConnectionError:
                return False
        wait_for(answers, "redis-server")
        put(src, StoreURL.parse(f"redis://127.0.0.1:{port}/0?prefix=ds/"), jobs=16, out=None)
        ready = os.path.join(base, "proxy.ready")
        procs.append(subprocess.Popen([sys.executable, __file__, "--proxy", str(proxy_port), str(port),
                                       str(args.rtt_ms), ready]))
        wait_for(lambda: os.path.exists(ready), "the latency proxy")
        slow = redis.Redis(host="127.0.0.1", port=proxy_port)
        slow.ping()
        t0 = time.perf_counter()
        slow.ping()
        rtt = (time.perf_counter() - t0) * 1e3
        print(f"bench_store: {args.files} files x {args.size} ({dataset_bytes / 2**20:.0f} MiB), {args.epochs} epochs, "
              f"{args.workers} forked workers, digests checked; redis-server {subprocess.run(['redis-server', '--version'], capture_output=True, text=True).stdout.split()[2]} "
              f"behind a latency-injecting TCP proxy (measured PING {rtt:.1f} ms)", flush=True)
        url = f"redis://127.0.0.1:{proxy_port}/0?prefix=ds/&timeout=30"
        results: dict[str, dict] = {}

        # 1. the naive loader: GET each file when the worker reads it
        out = os.path.join(base, "naive.json")
        t0 = time.perf_counter()
        run(reader_cmd(src, manifest, out, args.epochs, args.workers, "support.redisstore:naive_get"),
            env_here(BENCH_STORE_HOST="127.0.0.1", BENCH_STORE_PORT=proxy_port, BENCH_STORE_ROOT=src,
                     BENCH_STORE_PREFIX="ds/"), "the naive GET loader")
        results["naive-get"] = {"epochs": epochs_of(out), "store_bytes": None}
        print(f"  naive-get     done in {time.perf_counter() - t0:.1f} s", flush=True)

        # 2. monarch over the store (the mount has no directory on disk)
        mount = os.path.join(base, "mnt", "imagenet")
        cfg = write_config(base, mount, url)
        out, report = os.path.join(base, "store.json"), os.path.join(base, "store-report.json")
        t0 = time.perf_counter()
        run([sys.executable, "-m", "monarch", "run", "--no-progress", "--report", report, "-c", cfg, "--",
             *reader_cmd(mount, manifest, out, args.epochs, args.workers)], env_here(), "monarch over the store")
        rep = json.load(open(report))
        results["monarch-store"] = {"epochs": epochs_of(out), "store_bytes": rep["store"]["bytes_read"],
                                    "pfs_bytes": rep["pfs"]["total_bytes"]}
        print(f"  monarch-store done in {time.perf_counter() - t0:.1f} s", flush=True)

        # 3. monarch over the same dataset in a directory
        cfg = write_config(base, src, None)
        out, report = os.path.join(base, "dir.json"), os.path.join(base, "dir-report.json")
        t0 = time.perf_counter()
        run([sys.executable, "-m", "monarch", "run", "--no-progress", "--report", report, "-c", cfg, "--",
             *reader_cmd(src, manifest, out, args.epochs, args.workers)], env_here(), "monarch over a directory")
        rep = json.load(open(report))
        results["monarch-dir"] = {"epochs": epochs_of(out), "store_bytes": None, "pfs_bytes": rep["pfs"]["total_bytes"]}
        print(f"  monarch-dir   done in {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{base}", ignore_errors=True)

    print(f"\n{'mode':<15}" + "".join(f"{f'epoch {i + 1} (s)':>14}" for i in range(args.epochs))
          + f"{'store read / dataset':>24}")
    for mode, r in results.items():
        ratio = f"{r['store_bytes'] / dataset_bytes:.2f}x" if r["store_bytes"] is not None else (
            f"{args.epochs:.2f}x (every epoch)" if mode == "naive-get" else "-")
        print(f"{mode:<15}" + "".join(f"{s:>14.2f}" for s in r["epochs"]) + f"{ratio:>24}")
    naive, store, dirs = (results[m]["epochs"] for m in ("naive-get", "monarch-store", "monarch-dir"))
    first = naive[0] / store[0]
    later = [s / d for s, d in zip(store[1:], dirs[1:])]
    store_ratio = results["monarch-store"]["store_bytes"] / dataset_bytes
    print(f"\nepoch 1: monarch-store {first:.1f}x faster than naive-get (target >= 10x)")
    if later:
        print("later epochs: monarch-store / monarch-dir = " + ", ".join(f"{x:.2f}" for x in later)
              + " (target within 10%: <= 1.10; sub-second epochs vary with the shared machine's load)")
    print(f"store read: {store_ratio:.2f}x the dataset (target 1.00x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"files": args.files, "size": args.size, "rtt_ms": args.rtt_ms, "measured_rtt_ms": rtt,
                       "dataset_bytes": dataset_bytes, "modes": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
