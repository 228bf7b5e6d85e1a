#!/usr/bin/env python3
"""Large-file benchmark: one big file (an LMDB, an HDF5 or TFRecord shard) from a PFS whose
every read call costs a round trip, copied whole by the stager's PFS source as one stream and
in ranges read at once (how a cluster's daemons, a compressed tier or a store copy a large
file), and read by ``md5sum`` directly and under ``monarch run`` (the first job: a file of
``BLOCKS_MIN`` or more is staged by blocks while md5sum reads it, docs/large-files.md; a
smaller one is copied whole before the open is answered), side by side in one run.

    python scripts/large/bench_large_files.py                        # 256 MiB, 2 ms per read call
    python scripts/large/bench_large_files.py --size-mib 512 --read-latency-ms 5

Bytes are checked against the source (md5) and the PFS's own byte count is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402  (this checkout's monarch and tests/ first on the path)

from benchkit.options import parse_with_quick  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch import routes  # noqa: E402
from monarch.node.stage import sources  # noqa: E402
from monarch.node.snapshot.snapshot import take_snapshot  # noqa: E402
from support.harness import CountingTally  # noqa: E402
from monarch.tools.slowpfs import SlowPFS  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=256, help="size of the file (default 256)")
    p.add_argument("--read-latency-ms", type=float, default=2.0, help="per read call of the PFS (default 2)")
    p.add_argument("--json", help="write the figures here")
    return parse_with_quick(p, argv, {"size_mib": 4, "read_latency_ms": 0.5})


def stage_once(snap, key: str, dest: Path, ranges: int) -> float:
    """Seconds for PFSSource to copy ``key`` into ``dest`` with ``ranges`` ranges at once."""
    saved = sources.RANGES_AT_ONCE, routes.RANGES_MIN  # (read_in_ranges reads the table's threshold)
    sources.RANGES_AT_ONCE = ranges
    routes.RANGES_MIN = routes.RANGES_MIN if ranges > 1 else 1 << 62
    source = sources.PFSSource(snap)
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        source.copy(key, snap.files[key], out, CountingTally())
        return time.perf_counter() - t0
    finally:
        os.close(out)
        source.close()
        sources.RANGES_AT_ONCE, routes.RANGES_MIN = saved


def md5_run(cmd: list[str], env: dict, report: Path | None = None) -> tuple[float, str]:
    """Seconds and stdout of ``cmd``; with ``report`` (under ``monarch run``), fails unless
    Monarch was active: it fails open, so a refused config would time the PFS direct."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - t0
    if report is not None and not report.exists():
        raise SystemExit(f"monarch run wrote no report at {report}: Monarch was not active, the figure would be "
                         f"the PFS's; its stderr:\n{proc.stderr.strip()}")
    return seconds, proc.stdout


def main(argv=None) -> int:
    args = parse_args(argv)
    if pfs_unavailable("bench_large_files"):
        return 2
    size = args.size_mib << 20
    env = checkout_env()
    with tempfile.TemporaryDirectory(prefix="bench-large-") as tmp, \
            tempfile.TemporaryDirectory(prefix="bench-large-", dir="/dev/shm") as shm:
        work = Path(tmp)
        src = work / "src" / "data"
        src.mkdir(parents=True)
        data = os.urandom(1 << 20) * args.size_mib
        (src / "big.bin").write_bytes(data)
        want = hashlib.md5(data).hexdigest()
        del data
        results = {}
        with SlowPFS(src.parent, work / "pfs", work / "pfs.json", open_latency_ms=2,
                     read_latency_ms=args.read_latency_ms) as pfs:
            root = os.path.join(pfs.mountpoint, "data")
            snap = take_snapshot((root,))
            for ranges in (1, sources.RANGES_AT_ONCE):
                dest = Path(shm) / f"copy{ranges}"
                seconds = stage_once(snap, "0/big.bin", dest, ranges)
                assert hashlib.md5(dest.read_bytes()).hexdigest() == want, "the copy's bytes differ"
                dest.unlink()
                results[f"stager, {ranges} range(s) at once"] = seconds
            config = work / "monarch.yaml"
            config.write_text(json.dumps({"dataset": {"roots": [root]}, "run_base": str(work / "run"),
                                          "tiers": [{"name": "ram", "path": f"{shm}/ram", "capacity": "4GiB"}]}))
            for base in (work / "run", Path(shm, "ram")):  # Monarch uses bases that exist, never makes them
                base.mkdir()
            path = os.path.join(root, "big.bin")
            pfs.reset_counters()
            seconds, out = md5_run(["md5sum", path], env)
            assert out.split()[0] == want
            results["md5sum direct"] = seconds
            direct_bytes = pfs.counters()["bytes"]
            pfs.reset_counters()
            report = work / "report.json"
            seconds, out = md5_run([sys.executable, "-m", "monarch", "run", "-c", str(config), "--no-progress",
                                    "--report", str(report), "--", "md5sum", path], env, report)
            assert out.split()[0] == want
            results["md5sum under monarch run (first job)"] = seconds
            monarch_bytes = pfs.counters()["bytes"]
            opened_from = json.loads(report.read_text())["opened_from"]
    print(f"\none file of {args.size_mib} MiB, {args.read_latency_ms:g} ms per PFS read call; seconds, MB/s")
    for name, seconds in results.items():
        print(f"  {name:<42}{seconds:>8.2f} s {size / seconds / 1e6:>8.0f} MB/s")
    one, many = results["stager, 1 range(s) at once"], results[f"stager, {sources.RANGES_AT_ONCE} range(s) at once"]
    print(f"ranges: {one / many:.1f}x faster than one stream; PFS bytes read: direct {direct_bytes / size:.2f}x, "
          f"under monarch {monarch_bytes / size:.2f}x the file")
    print("md5sum under monarch run, opened from (the report): "
          + ", ".join(f"{name} {c['opens']} ({c['bytes'] / size:.2f}x the file)" for name, c in opened_from.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "opened_from": opened_from, "args": vars(args)},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
