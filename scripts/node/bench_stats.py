"""What a REPORT costs the daemon: ``NodeDaemon.stats()`` brief (progress polls) and full
(the report at the end), on a dataset of N files with a share of them staged. Prints figures."""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

from benchkit.options import parse_with_quick  # noqa: E402
from monarch.config import load_config  # noqa: E402
from monarch.node.daemon import NodeDaemon  # noqa: E402
from monarch.tools.workload import make_dataset  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--staged", type=int, default=5000)
    args = parse_with_quick(ap, None, {"files": 200, "staged": 50})
    base = tempfile.mkdtemp(prefix="mb-", dir="/tmp")
    try:
        make_dataset(f"{base}/ds", files=args.files, size="1KiB", manifest=f"{base}/m.json", seed=0)
        with open(f"{base}/c.yaml", "w") as f:
            f.write(f'dataset: {{roots: ["{base}/ds"]}}\nrun_base: "{base}/run"\n'
                    f'tiers:\n  - {{name: ram, path: "/dev/shm{base}", capacity: 1GiB}}\n')
        for path in (f"{base}/run", f"/dev/shm{base}"):  # Monarch uses bases that exist, never makes them
            os.makedirs(path)
        daemon = NodeDaemon(load_config(f"{base}/c.yaml"), "bench-stats")
        try:
            for key in sorted(daemon.snapshot.files)[:args.staged]:
                daemon.stager.ensure(key).result()
            for brief, n in ((True, 500), (False, 10)):
                t0 = time.perf_counter()
                for _ in range(n):
                    daemon.stats(brief=brief)
                print(f"stats({'brief' if brief else 'full'}): {1e3 * (time.perf_counter() - t0) / n:.3f} ms "
                      f"({args.files} files, {args.staged} staged)")
        finally:
            daemon.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(f"/dev/shm{base}", ignore_errors=True)


if __name__ == "__main__":
    main()
