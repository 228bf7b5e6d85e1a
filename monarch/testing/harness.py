"""Test harness shared by the integration and MPI tests: configurations, and ``monarch``
run as a real process from this checkout."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])


def write_config(base, roots, ram="1GiB", ssd="1GiB", policy="on-access", keep=False, extra=""):
    path = os.path.join(base, "monarch.yaml")
    roots_yaml = ", ".join(json.dumps(r) for r in ([roots] if isinstance(roots, str) else roots))
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: [{roots_yaml}]}}
run_dir: "{base}/run${{MONARCH_NODE}}"
tiers:
  - {{name: ram, path: "/dev/shm{base}/ram${{MONARCH_NODE}}", capacity: {ram}, keep: {str(keep).lower()}}}
  - {{name: ssd, path: "{base}/ssd${{MONARCH_NODE}}", capacity: {ssd}, keep: {str(keep).lower()}}}
staging: {{policy: {policy}, threads: 2}}
peer: {{path: "{base}/peer${{MONARCH_NODE}}", capacity: 1GiB, timeout: 5}}
{extra}""")
    return path


def monarch_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MONARCH_DISABLE", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def monarch(*args, env=None, timeout=180, **kw):
    """Run ``python -m monarch ARGS`` from this checkout."""
    return subprocess.run([sys.executable, "-m", "monarch", *args], env=env or monarch_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def reader(ds, epochs=3, workers=4, reader_kind="python", compute_ms=0):
    return [sys.executable, "-m", "monarch.workload", "read", ds.root, "--epochs", str(epochs),
            "--workers", str(workers), "--manifest", ds.manifest, "--reader", reader_kind,
            "--compute-ms", str(compute_ms)]


def load(path):
    with open(path) as f:
        return json.load(f)


def run_dirs(base, node=0):
    """The run directories of a config written by write_config(base): <run base>/monarch-<uid>/<run>-node<N>."""
    import glob
    return sorted(glob.glob(os.path.join(base, f"run{node}", f"monarch-{os.getuid()}", f"*-node{node}")))
