"""``monarch demo``: Monarch's main job on the embedded single-node default, over a slow PFS.

Makes a demo dataset and puts it behind an emulated slow parallel filesystem (FUSE,
``monarch.tools.slowpfs``: a few ms per open, as a PFS's metadata server costs, and no page
cache), reads it for several shuffled epochs with forked workers, first directly and then
under ``monarch run`` (the shipped default configuration, MONARCH_DATASET pointing at the
mount), checks every byte of every read against the manifest's digests, and prints the
report, the two reads' epoch times side by side and the bytes the emulated PFS itself
counted for each. Where FUSE cannot work (no /dev/fuse, no fusermount3, no mfusepy) it
says so in one line and reads the dataset from the local disk instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack

from monarch.launch.service import python_command
from monarch.sizes import human

OPEN_LATENCY_MS = 4.0  # what an open costs on the emulated PFS: a busy metadata server's round trip


def demo(directory: str | None, files: int, epochs: int, workers: int,
         open_latency_ms: float = OPEN_LATENCY_MS) -> int:
    own = directory is None
    base = tempfile.mkdtemp(prefix="monarch-demo-") if own else os.path.abspath(directory)
    source, manifest = os.path.join(base, "dataset"), os.path.join(base, "manifest.json")
    try:
        if not os.path.exists(manifest):
            print(f"demo: making {files} files under {source}", flush=True)
            subprocess.run([*python_command("monarch.tools.workload"), "make", source, "--files", str(files),
                            "--manifest", manifest], check=True)
        with ExitStack() as stack:
            pfs = _mount(stack, source, base, open_latency_ms) if open_latency_ms > 0 else None
            data = pfs.mountpoint if pfs is not None else source
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="monarch-demo-epochs-"))
            args = ["read", data, "--epochs", str(epochs), "--workers", str(workers), "--manifest", manifest]
            read = [*python_command("monarch.tools.workload"), *args]
            direct_json, monarch_json = os.path.join(scratch, "direct.json"), os.path.join(scratch, "monarch.json")
            print("demo: reading directly (no Monarch): " + "-m monarch.tools.workload " + " ".join(args), flush=True)
            started = time.monotonic()
            direct = subprocess.run([*read, "--json", direct_json]).returncode
            direct_wall = time.monotonic() - started
            direct_pfs = _pfs_bytes(pfs)
            if pfs is not None:
                pfs.reset_counters()
            env = dict(os.environ, MONARCH_DATASET=data, MONARCH_JOB_ID=f"demo-{os.getpid()}")
            # the report goes to the run directory (the default), so it outlives the demo dataset
            cmd = [*python_command("monarch"), "run", "--", *read, "--json", monarch_json]
            print("demo: the same under Monarch: monarch run -- -m monarch.tools.workload " + " ".join(args),
                  flush=True)
            started = time.monotonic()
            code = subprocess.run(cmd, env=env).returncode
            monarch_wall = time.monotonic() - started
            monarch_pfs = _pfs_bytes(pfs)
            from monarch.launch.cache import drop_dataset
            drop_dataset([data])  # the demo's copies go with its dataset, not after staging.linger
            sys.stderr.flush()
            pfs_read = None if pfs is None else (direct_pfs, monarch_pfs, _dataset_bytes(manifest))
            print(summary(_epochs(direct_json), _epochs(monarch_json), files_in(manifest), pfs_read,
                          open_latency_ms if pfs is not None else None, (direct_wall, monarch_wall)), flush=True)
        return code or direct
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)


def _mount(stack: ExitStack, source: str, base: str, open_latency_ms: float):
    """The dataset behind the emulated slow PFS (unmounted when ``stack`` closes), or None with
    one line saying why FUSE does not work here (the demo then reads the local disk)."""
    from monarch.tools.slowpfs import SlowPFS, SlowPFSError
    pfs = SlowPFS(source, os.path.join(base, "pfs"), os.path.join(base, "pfs-counters.json"),
                  open_latency_ms=open_latency_ms)
    try:
        stack.enter_context(pfs)
    except (SlowPFSError, OSError) as exc:
        reason = " ".join(str(exc).split())
        print(f"demo: no emulated slow PFS here, so the dataset is read from this machine's disk and its page "
              f"cache, where direct reads are already fast ({reason})", flush=True)
        return None
    print(f"demo: the dataset is behind an emulated slow PFS at {pfs.mountpoint} (FUSE, {open_latency_ms:g} ms "
          "per open, no page cache; it counts the bytes it serves)", flush=True)
    return pfs


def _pfs_bytes(pfs) -> int | None:
    """The bytes the emulated PFS served since its counters' start or last reset (None: no PFS)."""
    if pfs is None:
        return None
    try:
        return int(pfs.counters()["bytes"])
    except (OSError, ValueError, KeyError):
        return None


def files_in(manifest: str) -> int:
    with open(manifest) as f:
        return len(json.load(f)["files"])


def _dataset_bytes(manifest: str) -> int:
    with open(manifest) as f:
        return int(json.load(f)["total_bytes"])


def _epochs(path: str) -> list[dict]:
    """The workload's per-epoch results (``read --json``), or [] if it wrote none (it failed)."""
    try:
        with open(path) as f:
            return json.load(f)["epochs"]
    except (OSError, ValueError, KeyError):
        return []


def summary(direct: list[dict], monarch: list[dict], files: int,
            pfs_read: tuple[int | None, int | None, int] | None = None,
            open_latency_ms: float | None = None, walls: tuple[float, float] | None = None) -> str:
    """The demo's last words: whether every byte read matched the manifest, each epoch's time
    read directly beside the time under Monarch, each command's wall time (``walls``: launch to
    exit, directly and under ``monarch run``, so that a wait before the first epoch shows), and
    (``pfs_read``: bytes the emulated PFS served directly, under Monarch, and the dataset's
    bytes) the PFS traffic of each."""
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
    lines.append(f"{'epoch':<8}{'direct':>10}{'monarch':>10}{'speed-up':>10}")
    for i in range(max(len(direct), len(monarch))):
        seconds = [runs[i]["seconds"] if i < len(runs) else None for runs in (direct, monarch)]
        cells = [f"{s:.2f} s" if s is not None else "-" for s in seconds]
        gain = f"{seconds[0] / seconds[1]:.1f}x" if None not in seconds and seconds[1] > 0 else "-"
        number = next(runs[i]["epoch"] for runs in (direct, monarch) if i < len(runs))  # as the workload printed it
        lines.append(f"{number:<8}{cells[0]:>10}{cells[1]:>10}{gain:>10}")
    if walls is not None:
        cells = [f"{w:.2f} s" for w in walls]
        gain = f"{walls[0] / walls[1]:.1f}x" if walls[1] > 0 else "-"
        lines.append(f"{'command':<8}{cells[0]:>10}{cells[1]:>10}{gain:>10}")
    lines.append("(epoch 0 is the cold first one, as the workload numbers them above: Monarch reads the PFS "
                 "while the command does; the later ones are read from its tiers)")
    if walls is not None:
        lines.append("(command: the whole command's wall time, launch to exit: the interpreter, and under Monarch "
                     "the launcher, its daemon's start, the snapshot and the report too, beside the epochs)")
    if pfs_read is None:
        lines.append("(the demo dataset is on this machine's disk, in its page cache: direct reads are already "
                     "fast here; on a PFS each direct open pays its latency, and Monarch's later epochs do not)")
        return "\n".join(lines)
    direct_bytes, monarch_bytes, dataset = pfs_read
    cells = [f"{human(b)} = {b / dataset:.2f}x the dataset" if b is not None and dataset else "unknown"
             for b in (direct_bytes, monarch_bytes)]
    lines.append(f"PFS read, as the emulated PFS counted it ({open_latency_ms:g} ms per open): directly "
                 f"{cells[0]}; under Monarch {cells[1]}")
    return "\n".join(lines)
