"""``monarch demo``: Monarch's main job on the embedded single-node default.

Makes a demo dataset, reads it for several shuffled epochs with forked workers under
``monarch run`` (the shipped default configuration, MONARCH_DATASET pointing at it),
checks every byte against the manifest, and prints the report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile


def demo(directory: str | None, files: int, epochs: int, workers: int) -> int:
    own = directory is None
    base = tempfile.mkdtemp(prefix="monarch-demo-") if own else os.path.abspath(directory)
    data, manifest = os.path.join(base, "dataset"), os.path.join(base, "manifest.json")
    py = sys.executable
    try:
        if not os.path.exists(manifest):
            print(f"demo: making {files} files under {data}", flush=True)
            subprocess.run([py, "-m", "monarch.workload", "make", data, "--files", str(files),
                            "--manifest", manifest], check=True)
        env = dict(os.environ, MONARCH_DATASET=data, MONARCH_JOB_ID=f"demo-{os.getpid()}")
        # the report goes to the run directory (the default), so it outlives the demo dataset
        cmd = [py, "-m", "monarch", "run", "--",
               py, "-m", "monarch.workload", "read", data, "--epochs", str(epochs),
               "--workers", str(workers), "--manifest", manifest]
        print("demo: monarch " + " ".join(cmd[3:]), flush=True)
        return subprocess.run(cmd, env=env).returncode
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)
