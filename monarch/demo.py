"""``monarch demo``: Monarch's main job on the embedded single-node default.

Makes a demo dataset, reads it for several shuffled epochs with forked workers, first
directly and then under ``monarch run`` (the shipped default configuration, MONARCH_DATASET
pointing at it), checks every byte of every read against the manifest's digests, and
prints the report and the two reads' epoch times side by side.
"""

from __future__ import annotations

import json
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
        with tempfile.TemporaryDirectory(prefix="monarch-demo-epochs-") as scratch:
            read = [py, "-m", "monarch.workload", "read", data, "--epochs", str(epochs),
                    "--workers", str(workers), "--manifest", manifest]
            direct_json, monarch_json = os.path.join(scratch, "direct.json"), os.path.join(scratch, "monarch.json")
            print("demo: reading directly (no Monarch): " + " ".join(read[1:]), flush=True)
            direct = subprocess.run([*read, "--json", direct_json]).returncode
            env = dict(os.environ, MONARCH_DATASET=data, MONARCH_JOB_ID=f"demo-{os.getpid()}")
            # the report goes to the run directory (the default), so it outlives the demo dataset
            cmd = [py, "-m", "monarch", "run", "--", *read, "--json", monarch_json]
            print("demo: the same under Monarch: monarch " + " ".join(cmd[3:]), flush=True)
            code = subprocess.run(cmd, env=env).returncode
            sys.stderr.flush()
            print(summary(_epochs(direct_json), _epochs(monarch_json), files_in(manifest)), flush=True)
        return code or direct
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)


def files_in(manifest: str) -> int:
    with open(manifest) as f:
        return len(json.load(f)["files"])


def _epochs(path: str) -> list[dict]:
    """The workload's per-epoch results (``read --json``), or [] if it wrote none (it failed)."""
    try:
        with open(path) as f:
            return json.load(f)["epochs"]
    except (OSError, ValueError, KeyError):
        return []


def summary(direct: list[dict], monarch: list[dict], files: int) -> str:
    """The demo's last words: whether every byte read matched the manifest, and each epoch's
    time read directly beside the time under Monarch."""
    lines = ["", "== demo =="]
    for name, runs in (("directly", direct), ("under Monarch", monarch)):
        reads = sum(e["samples"] for e in runs)
        bad = sum(len(e["mismatches"]) for e in runs)
        nbytes = sum(e["bytes"] for e in runs)
        if not runs:
            lines.append(f"read {name}: did not finish (see above)")
        elif bad:
            lines.append(f"read {name}: {bad} of {reads} reads returned WRONG BYTES (digest mismatch)")
        else:
            lines.append(f"read {name}: every byte checked: {reads} reads ({len(runs)} epochs x {files} files, "
                         f"{nbytes / 1e6:.1f} MB) matched the manifest's digests")
    lines.append(f"{'epoch':<8}{'direct':>10}{'monarch':>10}")
    for i in range(max(len(direct), len(monarch))):
        cells = [f"{runs[i]['seconds']:.2f} s" if i < len(runs) else "-" for runs in (direct, monarch)]
        number = next(runs[i]["epoch"] for runs in (direct, monarch) if i < len(runs))  # as the workload printed it
        lines.append(f"{number:<8}{cells[0]:>10}{cells[1]:>10}")
    lines.append("(epoch 0 is the cold first one, as the workload numbers them above)")
    lines.append("(the demo dataset is on this machine's disk, in its page cache: direct reads are already "
                 "fast here; on a PFS each direct open pays its latency, and Monarch's later epochs do not)")
    return "\n".join(lines)
