#!/usr/bin/env python3
"""Daemon benchmark: how many misses per second the node daemon answers, and how fast.

A miss is what the shim sends when a file is not staged yet: one connection, one OPEN
frame, and the daemon answers only once it has staged the file. Here every miss stages a
different 4 KiB file from local disk (no PFS latency: this measures the daemon itself —
event loop, scheduling, the copy — not the source). The daemon runs in its own process
with the given configuration (default ``staging.policy: on-access``, so that no
read-ahead turns misses into hits); 1, 16 and 64 clients ask at once, each one connection
per request as the shim does: threads of scripts/node/daemon_client.c (C, like the shim) or,
with ``--client python``, Python threads (which spend more of the 2 cores than the daemon). For
reference the same keys are then asked again (hits, answered in the event loop).

    python scripts/node/bench_daemon.py                       # 1, 16, 64 clients, 20000 misses each, door and python
    python scripts/node/bench_daemon.py --clients 16 --misses 40000
    python scripts/node/bench_daemon.py --src /tmp/old-checkout   # the same against another checkout

Each client count is measured with the daemon's C front door (monarch/frontdoor) and with
the Python server alone, side by side. After each row the daemon's own books are asked: the
files it read from the PFS (each exactly once when every miss was answered right) and what
the door copied, answered and handed over.

Prints a table: clients, server, misses/s, miss latency p50/p99, hits/s, misses/s against
the Python server; and writes JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import REPO  # noqa: E402  (this checkout's monarch and tests/ first on the path)
from benchkit.options import fresh_bytecode, parse_with_quick, write_json  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="1,16,64", help="comma-separated numbers of concurrent clients")
    p.add_argument("--misses", type=int, default=20000, help="misses (distinct files) per client count")
    p.add_argument("--size", type=int, default=4096, help="bytes per file")
    p.add_argument("--procs", type=int, default=4, help="Python client processes at most (clients are threads in them)")
    p.add_argument("--client", choices=("c", "python"), default="c",
                   help="c: scripts/node/daemon_client.c, threads asking as the C shim does (default); "
                        "python: the frame protocol from Python threads, which spend more CPU than the daemon")
    p.add_argument("--modes", default="door,python",
                   help="door: the daemon with its C front door (monarch/frontdoor); python: the Python server "
                        "alone (MONARCH_FRONT_DOOR=0); both by default, side by side")
    p.add_argument("--threads", default="auto", help="staging.threads of the daemon")
    p.add_argument("--policy", default="on-access", help="staging.policy of the daemon")
    p.add_argument("--src", default=str(REPO), help="the checkout whose monarch package is measured")
    p.add_argument("--json", help="write the figures here")
    return parse_with_quick(p, argv, {"clients": "1,2", "misses": 100})


# --------------------------------------------------------------------------- the daemon


def serve(src: str, config: str, ready, stop, door: bool = True) -> None:
    """In the daemon's process: a NodeDaemon on its socket until told to stop (``door``:
    with the C front door, else the Python server alone)."""
    os.environ["MONARCH_FRONT_DOOR"] = "1" if door else "0"
    sys.path.insert(0, src)
    from monarch.config import load_config
    from monarch.node.daemon import NodeDaemon
    from monarch.node.server import NodeServer

    daemon = NodeDaemon(load_config(config, env={"USER": "bench"}), f"bench{os.getpid()}")
    server = NodeServer(daemon, embedded=False)
    threading.Thread(target=lambda: (stop.wait(), server.request_stop()), daemon=True).start()
    ready.put(daemon.socket_path)
    try:
        server.serve()
    finally:
        daemon.close()


# --------------------------------------------------------------------------- the clients


def _frame_open(key: bytes) -> bytes:
    import struct
    return struct.pack("<BBHI", 1, 0, 0, len(key)) + key  # protocol.encode_request(VERB_OPEN, key)


def _ask(path: str, frame: bytes) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(path)
        s.sendall(frame)
        while True:
            head = b""
            while len(head) < 8:
                chunk = s.recv(8 - len(head))
                if not chunk:
                    raise ConnectionError("closed before the answer")
                head += chunk
            status = int.from_bytes(head[:4], "little", signed=True)
            length = int.from_bytes(head[4:], "little")
            body = b""
            while len(body) < length:
                chunk = s.recv(length - len(body))
                if not chunk:
                    raise ConnectionError("closed in the answer")
                body += chunk
            if status != -2:  # STATUS_PENDING: a heartbeat
                return status


def client_proc(path: str, key_lists: list[list[bytes]], start, results) -> None:
    """One client process: a thread per client, each asking for its keys one after another."""
    lat: list[float] = []
    errors = [0]
    pfs = [0]
    lock = threading.Lock()

    def run(keys):
        mine, bad, to_pfs = [], 0, 0
        for key in keys:
            t0 = time.perf_counter()
            try:
                status = _ask(path, _frame_open(key))
            except OSError:
                bad += 1
                continue
            mine.append(time.perf_counter() - t0)
            to_pfs += status == 0
        with lock:
            lat.extend(mine)
            errors[0] += bad
            pfs[0] += to_pfs

    threads = [threading.Thread(target=run, args=(keys,)) for keys in key_lists]
    start.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put((lat, errors[0], pfs[0], time.perf_counter()))


def compile_client(work: Path) -> str:
    out = work / "daemon_client"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("--client c needs a C compiler (cc); use --client python")
    subprocess.run([cc, "-O2", "-pthread", "-o", str(out), str(Path(__file__).with_name("daemon_client.c"))], check=True)
    return str(out)


def measure_c(client: str, path: str, keyfile: Path, clients: int) -> dict:
    out = subprocess.run([client, path, str(keyfile), str(clients)], check=True, capture_output=True, text=True,
                         timeout=1200).stdout.split()
    answers, errors, pfs = int(out[0]), int(out[1]), int(out[2])
    seconds, p50, p99 = float(out[3]), float(out[4]), float(out[5])
    return {"answers": answers, "seconds": seconds, "per_s": answers / seconds, "p50_ms": p50, "p99_ms": p99,
            "errors": errors, "pfs_answers": pfs}


def measure(path: str, keys: list[bytes], clients: int, procs: int) -> dict:
    ctx = multiprocessing.get_context("fork")
    per_client = [keys[i::clients] for i in range(clients)]
    nproc = min(procs, clients)
    groups = [per_client[i::nproc] for i in range(nproc)]
    start = ctx.Event()
    results = ctx.Queue()
    ps = [ctx.Process(target=client_proc, args=(path, g, start, results)) for g in groups]
    for p in ps:
        p.start()
    time.sleep(0.3)  # every process forked and waiting
    t0 = time.perf_counter()
    start.set()
    lat, errors, pfs, end = [], 0, 0, t0
    for _ in ps:
        l, e, f, t = results.get(timeout=600)
        lat += l
        errors += e
        pfs += f
        end = max(end, t)
    for p in ps:
        p.join(10)
    wall = end - t0
    lat.sort()

    def pct(q):
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else float("nan")
    return {"answers": len(lat), "seconds": wall, "per_s": len(lat) / wall, "p50_ms": pct(0.5),
            "p99_ms": pct(0.99), "errors": errors, "pfs_answers": pfs}


def daemon_books(path: str) -> dict:
    """The daemon's own figures after a row: files it read from the PFS (each once, if the
    misses were answered right) and what its C front door did (None without one)."""
    import socket as _socket
    sys.path.insert(0, str(REPO))
    from monarch import protocol
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(path)
        s.sendall(protocol.encode_request(protocol.VERB_REPORT, protocol.REPORT_BRIEF))
        status, body = protocol.recv_answer(s)
    stats = json.loads(body)
    door = stats.get("front_door")
    return {"pfs_files_read": stats["staging"]["pfs_files_read"],
            "door": None if door is None else {"copies": door["copies"], "handed_over": door["handed_over"],
                                               "hits": sum(door["hits_by_slot"].values()),
                                               "because": door["handed_over_because"]}}


# --------------------------------------------------------------------------- main


def make_files(root: Path, n: int, size: int) -> list[bytes]:
    keys = []
    data = os.urandom(size)
    for i in range(n):
        d = root / f"d{i % 100:02d}"
        if i < 100:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:07d}.bin").write_bytes(data)
        keys.append(f"0/d{i % 100:02d}/f{i:07d}.bin".encode())
    return keys


def write_config(path: Path, root: Path, work: Path, shm: Path, args) -> None:
    threads = args.threads if args.threads == "auto" else int(args.threads)
    config = {"dataset": {"roots": [str(root)]}, "run_base": str(work / "run"),
              "tiers": [{"name": "ram", "path": str(shm), "capacity": "64GiB"}],
              "staging": {"policy": args.policy, "threads": threads, "resolve_timeout": 60,
                          "share": False}}  # each row stages afresh: no copies shared from the row before
    path.write_text(json.dumps(config))
    (work / "run").mkdir(exist_ok=True)  # Monarch uses bases that exist, never makes them


def wait_ready(daemon, ready, timeout: float = 120) -> str:
    """The daemon's socket path once it serves; fails at once (not after ``timeout``) when the
    daemon's process died first, e.g. on a config it refused (its traceback is above)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return ready.get(timeout=0.5)
        except queue.Empty:
            if not daemon.is_alive():
                raise SystemExit(f"the daemon (pid {daemon.pid}) exited with {daemon.exitcode} before it served; "
                                 "see its error above") from None
    raise SystemExit(f"the daemon (pid {daemon.pid}) did not serve within {timeout:.0f} s")


def main(argv=None) -> int:
    args = parse_args(argv)
    fresh_bytecode()
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"door", "python"}:
        raise SystemExit(f"--modes: a comma-separated list of door and python, got {args.modes!r}")
    work = Path(tempfile.mkdtemp(prefix="mbd-", dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="mbd-", dir="/dev/shm"))
    rows = []
    try:
        root = work / "ds"
        t0 = time.perf_counter()
        keys = make_files(root, args.misses, args.size)
        os.sync()
        print(f"made {len(keys)} files of {args.size} B in {root} ({time.perf_counter() - t0:.1f} s); "
              f"measuring {args.src}", flush=True)
        client = compile_client(work) if args.client == "c" else None
        keyfile = work / "keys.txt"
        keyfile.write_bytes(b"".join(k + b"\n" for k in keys))
        ctx = multiprocessing.get_context("fork")
        for clients, mode in [(c, m) for c in counts for m in modes]:
            config = work / f"c{clients}.json"
            write_config(config, root, work, shm, args)
            ready, stop = ctx.Queue(), ctx.Event()
            daemon = ctx.Process(target=serve, args=(args.src, str(config), ready, stop, mode == "door"))
            daemon.start()
            try:
                path = wait_ready(daemon, ready)
                if args.client == "c":
                    miss = measure_c(client, path, keyfile, clients)
                    hit = measure_c(client, path, keyfile, clients)
                else:
                    miss = measure(path, keys, clients, args.procs)
                    hit = measure(path, keys, clients, args.procs)
                books = daemon_books(path)
            finally:
                stop.set()
                daemon.join(30)
                if daemon.is_alive():
                    daemon.kill()
            rows.append({"clients": clients, "mode": mode, "miss": miss, "hit": hit, "daemon": books})
            print(f"  {clients:3d} clients, {mode:6}: {miss['per_s']:9.0f} misses/s, p50 {miss['p50_ms']:.2f} ms, "
                  f"p99 {miss['p99_ms']:.2f} ms; {hit['per_s']:9.0f} hits/s; "
                  f"errors {miss['errors'] + hit['errors']}, PFS answers {miss['pfs_answers']}; "
                  f"files read from the PFS {books['pfs_files_read']} of {len(keys)}; "
                  f"front door: {books['door']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)

    print()
    print(f"daemon: policy {args.policy}, threads {args.threads}; {args.misses} misses of {args.size} B "
          f"per row, from local disk; {args.client} clients; {os.cpu_count()} cores")
    print(f"{'clients':>7} {'server':>7} {'misses/s':>10} {'miss p50 ms':>12} {'miss p99 ms':>12} {'hits/s':>10}"
          f" {'x python':>9}")
    for r in rows:
        m, h = r["miss"], r["hit"]
        base = next((b["miss"]["per_s"] for b in rows if b["clients"] == r["clients"] and b["mode"] == "python"), None)
        ratio = f"{m['per_s'] / base:.2f}x" if base else "-"
        print(f"{r['clients']:>7} {r['mode']:>7} {m['per_s']:>10.0f} {m['p50_ms']:>12.2f} {m['p99_ms']:>12.2f}"
              f" {h['per_s']:>10.0f} {ratio:>9}")
    write_json(args.json, {"args": vars(args), "rows": rows}, indent=1)
    bad = any(r["miss"]["errors"] or r["miss"]["pfs_answers"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
