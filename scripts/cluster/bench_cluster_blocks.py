#!/usr/bin/env python3
"""A large file across the cluster: every node reads one token file, directly and under Monarch.

N simulated nodes (4), each a mount namespace with its own FUSE mount of the emulated PFS at the
same path (its own page cache, as a real node has: ``benchkit/namespaces.py``), 2 ms per open, a
bandwidth cap per node (400 MB/s). Each node's reader runs in a memory cgroup of its own (512 MiB),
so that no page cache holds the file for it. One uint16 token file (1 GiB). Two readers, on every node
at once:

* ``windows``: Megatron's shape: 1,500 steps of 32 random 2 KiB windows through one
  ``np.memmap``, its own seed per node, every window's sum checked;
* ``weights``: a model's weights at start: the whole file once, in order, through a mapping,
  in 64 MiB steps, its digest checked.

Cases, side by side in one run: ``direct`` (the PFS), and ``mpiexec -n N monarch serve`` with
each node's reader under ``monarch run``, its RAM tier holding the file (``file``) or a 1/N
share of it and 64 MiB (``share``: the file fits only across the nodes); ``--rooms kill`` adds
a node lost mid-job (its daemon and its reader SIGKILLed; the others must finish right). Printed per case: the
slowest node's first step and job, the PFS's bytes over the file's (the sum of the mounts'
counts), and the whole job's CPU-seconds (readers, daemons and launchers; the FUSE servers apart:
their CPU-seconds and the requests they served, a page fault of a mapping of the PFS one each).

    python3 scripts/cluster/bench_cluster_blocks.py                       # 1 GiB, 4 nodes, 400 MB/s
    python3 scripts/cluster/bench_cluster_blocks.py --readers weights --rooms file
    python3 scripts/cluster/bench_cluster_blocks.py --quick               # a smoke run (64 MiB, 2 nodes)

Needs root (mount namespaces, cgroups), FUSE 3 and MPI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit
from benchkit import checkout_env  # noqa: E402
from benchkit.memory_cgroup import MemoryCgroup  # noqa: E402
from benchkit.namespaces import NodeNamespaces  # noqa: E402
from benchkit.options import fresh_bytecode, parse_with_quick  # noqa: E402
from monarch.cluster.world import daemon_launch  # noqa: E402

WINDOW = 1025   # tokens per window: a context of 1,024 and its next token
PER_STEP = 32   # windows per step
WEIGHTS_STEP = 64 << 20
NAME = "tok.bin"

READER = r"""
import json, mmap, os, sys, time
import numpy as np
import xxhash
path, kind, arg = sys.argv[1], sys.argv[2], sys.argv[3]
t = [time.monotonic()]
bad = 0
if kind == "windows":
    plan = np.load(arg)
    offsets, sums = plan["offsets"], plan["sums"]
    arr = np.memmap(path, dtype=np.uint16, mode="r")
    for s in range(len(offsets) // %(per_step)d):
        for i in range(s * %(per_step)d, (s + 1) * %(per_step)d):
            o = int(offsets[i])
            bad += int(arr[o:o + %(window)d].sum(dtype=np.int64)) != int(sums[i])
        t.append(time.monotonic())
else:
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    h = xxhash.xxh3_128()
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
        for off in range(0, size, %(weights_step)d):
            h.update(m[off:off + %(weights_step)d])
            t.append(time.monotonic())
    bad = int(h.hexdigest() != arg)
print(json.dumps({"first": t[1] - t[0], "total": t[-1] - t[0], "bad": bad,
                  "steps": [round(b - a, 3) for a, b in zip(t, t[1:])][:64]}))
""" % {"per_step": PER_STEP, "window": WINDOW, "weights_step": WEIGHTS_STEP}


def make_file(path: Path, size: int) -> str:
    """The token file (pseudo-random uint16s); its digest (xxh3-128: the readers' check costs
    them little of the CPU the nodes share here)."""
    import xxhash
    path.parent.mkdir(parents=True, exist_ok=True)
    h = xxhash.xxh3_128()
    with open(path, "wb") as f:
        for i, off in enumerate(range(0, size, 64 << 20)):
            chunk = hashlib.shake_256(i.to_bytes(8, "little")).digest(min(64 << 20, size - off))
            f.write(chunk)
            h.update(chunk)
    return h.hexdigest()


def make_plans(src: Path, base: Path, nodes: int, steps: int) -> list[Path]:
    """Each node's windows (its own seed) and their sums, from the source."""
    import numpy as np
    tokens = np.memmap(src, dtype=np.uint16, mode="r")
    plans = []
    for k in range(nodes):
        offsets = np.random.default_rng(k).integers(0, len(tokens) - WINDOW, steps * PER_STEP)
        sums = np.array([int(tokens[o:o + WINDOW].sum(dtype=np.int64)) for o in offsets])
        plans.append(base / f"plan{k}.npz")
        np.savez(plans[-1], offsets=offsets, sums=sums)
    return plans


def write_config(base: Path, mountpoint: Path, ram: int) -> Path:
    cfg = base / f"monarch-{ram}.yaml"
    cfg.write_text(f"""dataset: {{roots: ["{mountpoint}"]}}
run_base: "{base}/run${{MONARCH_NODE}}"
tiers:
  - {{name: ram, path: "/dev/shm{base}/ram${{MONARCH_NODE}}", capacity: {ram}}}
peer: {{path: "/dev/shm{base}/peer${{MONARCH_NODE}}", capacity: 64MiB, timeout: 10}}
""")
    return cfg


def env(**extra) -> dict:
    """A reader's or daemon's environment: this checkout's monarch, Monarch on unless ``extra`` says."""
    base = dict(os.environ)
    base.pop("MONARCH_DISABLE", None)
    return checkout_env(base, **extra)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def pfs_side(nodes: NodeNamespaces) -> tuple[int, float]:
    """The mounts' requests for the token file so far (each a FUSE request: what a mount costs
    is mostly per request), and their servers' CPU-seconds (from /proc: they run on)."""
    reads, cpu = 0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for k in range(nodes.nodes):
        time.sleep(0.02)  # (each server writes its counts every 10 ms)
        c = json.loads(nodes.counters(k).read_text())
        reads += c["files"].get(NAME, {}).get("reads", 0)
        try:
            fields = Path(f"/proc/{c['pid']}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, KeyError, IndexError, ValueError):
            pass
    return reads, cpu


def run_readers(nodes: NodeNamespaces, cmds: list[list[str]], envs: list[dict], cgroups: list[MemoryCgroup],
                timeout: float, kill: tuple[float, int] | None = None) -> list[dict]:
    """Each node's reader, at once, each in its node's memory cgroup; their figures. ``kill``
    (seconds, pid): that long after the start the last node is lost: its daemon ``pid`` and its
    reader SIGKILLed (its figures left out)."""
    procs = [subprocess.Popen(nodes.enter(k, cgroups[k].wrap(cmd)), env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for k, (cmd, e) in enumerate(zip(cmds, envs))]
    if kill is not None:
        time.sleep(kill[0])
        os.kill(kill[1], 9)
        os.killpg(procs[-1].pid, 9)
        procs[-1].wait()
        procs = procs[:-1]
    out = []
    for k, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            raise RuntimeError(f"node {k}'s reader did not finish within {timeout:g} s")
        if p.returncode != 0:
            raise RuntimeError(f"node {k}'s reader failed ({p.returncode}):\n{stderr[-3000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def case(args, nodes: NodeNamespaces, base: Path, reader: str, readers_args: list[str], room: str | None,
         size: int, cgroups: list[MemoryCgroup]) -> dict:
    """One row: the readers on every node (under Monarch with ``room``, else directly)."""
    path = str(nodes.mountpoint / NAME)
    cmds = [[sys.executable, "-c", READER, path, reader, readers_args[k]] for k in range(args.nodes)]
    before_pfs, before_cpu, (before_reads, before_fuse) = nodes.pfs_bytes(NAME), children_cpu(), pfs_side(nodes)
    if room is None:
        t0 = time.monotonic()
        results = run_readers(nodes, cmds, [env(MONARCH_DISABLE=1)] * args.nodes, cgroups, args.timeout)
    else:
        ram = size // args.nodes + (64 << 20) if room == "share" else 2 * size  # "kill": room for the file
        run_base = base / f"{reader}-{room}"
        for k in range(args.nodes):  # the bases, as their user makes them
            for d in (run_base / f"run{k}", Path(f"/dev/shm{run_base}/ram{k}"), Path(f"/dev/shm{run_base}/peer{k}")):
                d.mkdir(parents=True, exist_ok=True)
        cfg = write_config(run_base, nodes.mountpoint, ram)
        launch = daemon_launch(args.nodes, one_host=True)
        serve = subprocess.Popen(launch.argv + nodes.enter_by_rank([sys.executable, "-m", "monarch", "serve", "-c",
                                                                      str(cfg)]),
                                 env=env(**launch.env), start_new_session=True,
                                 stdout=open(run_base / "serve.log", "w"), stderr=subprocess.STDOUT)
        try:
            sockets = [run_base / f"run{k}" / f"monarch-{os.getuid()}" / f"local-node{k}" / "daemon.sock"
                       for k in range(args.nodes)]
            deadline = time.monotonic() + 60
            pid_files = [s.parent / "daemon.pid" for s in sockets]  # (written after the socket)
            while not all(s.exists() for s in sockets + pid_files):
                if serve.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the daemons did not come up; see {run_base}/serve.log")
                time.sleep(0.05)
            t0 = time.monotonic()
            monarch = [sys.executable, "-m", "monarch", "run", "-c", str(cfg), "--"]
            kill = None
            if room == "kill":  # the last node lost mid-job: its daemon and its reader
                pid = int(pid_files[-1].read_text())
                kill = (args.kill_after, pid)
            results = run_readers(nodes, [monarch + c for c in cmds],
                                  [env(MONARCH_NODE=k) for k in range(args.nodes)], cgroups, args.timeout, kill)
        finally:
            if serve.poll() is None:
                serve.send_signal(15)
            try:
                serve.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, 9)
                serve.wait()
            launch.close()
            shutil.rmtree(f"/dev/shm{run_base}", ignore_errors=True)  # (the tiers' bases, even on a failure)
    wall = time.monotonic() - t0
    bad = sum(r["bad"] for r in results)
    if bad:
        raise RuntimeError(f"{bad} wrong windows or digests ({reader}, {room or 'direct'})")
    reads, fuse = pfs_side(nodes)
    return {"reader": reader, "room": room or "direct", "first": max(r["first"] for r in results),
            "job": max(r["total"] for r in results), "wall": wall,
            "pfs": (nodes.pfs_bytes(NAME) - before_pfs) / size, "cpu": children_cpu() - before_cpu,
            "pfs_reads": reads - before_reads, "fuse_cpu": fuse - before_fuse,
            "steps": [r["steps"] for r in results]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--bandwidth", type=float, default=400, help="MB/s per node's mount")
    p.add_argument("--open-latency-ms", type=float, default=2)
    p.add_argument("--steps", type=int, default=1500, help="the windows reader's steps")
    p.add_argument("--readers", default="windows,weights")
    p.add_argument("--rooms", default="file,share",
                   help="file: each node's RAM tier holds the file; share: 1/N of it and 64 MiB; kill: as file, "
                        "the last node (daemon and reader) SIGKILLed --kill-after seconds in")
    p.add_argument("--kill-after", type=float, default=2.0)
    p.add_argument("--cgroup-mib", type=int, default=512)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", help="write the rows here too")
    p.add_argument("--steps-of", type=int, default=0, metavar="N", help="print each node's first N step times")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (logs, reports) and say where")
    args = parse_with_quick(p, argv, {"nodes": 2, "size_mib": 64, "steps": 50, "timeout": 120})
    if os.geteuid() != 0:
        print("bench_cluster_blocks: needs root (mount namespaces, memory cgroups)", file=sys.stderr)
        return 2
    fresh_bytecode()
    size = args.size_mib << 20
    base = Path(tempfile.mkdtemp(prefix="mcb-", dir="/tmp"))
    # a node's memory each: its reader's page cache and its own memory
    cgroups = [MemoryCgroup(args.cgroup_mib << 20, f"monarch-bench-cluster-blocks-node{k}") for k in range(args.nodes)]
    rows = []
    try:
        src = base / "src"
        digest = make_file(src / NAME, size)
        plans = [str(p) for p in make_plans(src / NAME, base, args.nodes, args.steps)]
        slowpfs = ["--open-latency-ms", str(args.open_latency_ms), "--bandwidth", str(args.bandwidth),
                   "--page-cache"]
        with NodeNamespaces(base / "nodes", args.nodes, src, base / "pfs", slowpfs) as nodes:
            for reader in args.readers.split(","):
                reader_args = plans if reader == "windows" else [digest] * args.nodes
                for room in [None, *args.rooms.split(",")]:
                    row = case(args, nodes, base, reader, reader_args, room, size, cgroups)
                    rows.append(row)
                    print(f"{row['reader']:8} {row['room']:7} first step {row['first']:6.2f} s  job {row['job']:6.2f} s"
                          f"  PFS {row['pfs']:5.2f}x  CPU {row['cpu']:6.1f} s  PFS requests {row['pfs_reads']:6d}"
                          f"  FUSE CPU {row['fuse_cpu']:5.1f} s", flush=True)
    finally:
        for cgroup in cgroups:
            cgroup.remove()
        if args.keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{base}", ignore_errors=True)  # (the cases' tier bases' parent, kept or not: RAM)
    print(f"\n{args.nodes} nodes, {args.size_mib} MiB, {args.bandwidth:g} MB/s per node, "
          f"{args.open_latency_ms:g} ms per open; the slowest node's figures")
    print("| reader | room | first step | job | job / direct | PFS / file | CPU-s | PFS requests | FUSE CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|")
    direct = {r["reader"]: r for r in rows if r["room"] == "direct"}
    for r in rows:
        ratio = r["job"] / direct[r["reader"]]["job"]
        print(f"| {r['reader']} | {r['room']} | {r['first']:.2f} s | {r['job']:.2f} s | {ratio:.2f}x | "
              f"{r['pfs']:.2f}x | {r['cpu']:.1f} | {r['pfs_reads']} | {r['fuse_cpu']:.1f} |")
    if args.steps_of:
        for r in rows:
            print(r["reader"], r["room"], "node steps:", *(steps[:args.steps_of] for steps in r["steps"]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
