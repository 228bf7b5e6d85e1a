"""scripts/writeback/bench_dcp_nodes.py runs with small shards and prints its rows: torch.distributed.
checkpoint's pattern on 4 simulated nodes, direct and under `monarch serve`'s write-back
(docs/consistency.md, "Write-back", W2 and W4). Run as a user runs it (no PYTHONPATH, no Monarch
variables), from a scratch directory; asserts the exit code, the watcher's counts, the PFS bytes
and the byte check it prints, never a timing."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from monarch.tools.slowpfs import fuse_unavailable_reason

pytestmark = [pytest.mark.mpi, pytest.mark.fuse, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "writeback" / "bench_dcp_nodes.py"
NODES = 4


def user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith("MONARCH_") and k not in ("PYTHONPATH", "LD_PRELOAD")}


def test_bench_dcp_nodes_prints_no_early_metadata_and_no_short_file_under_monarch(tmp_path):
    reason = fuse_unavailable_reason(probe=True)
    if reason:
        pytest.skip(f"the emulated PFS needs FUSE: {reason}")
    if not (Path(sys.executable).parent / "mpiexec").exists() and not shutil.which("mpiexec"):
        pytest.skip("needs mpiexec (pip install mpich mpi4py)")
    figures = tmp_path / "dcp.json"
    cmd = [sys.executable, str(SCRIPT), "--shard-mib", "4", "--nodes", str(NODES), "--json", str(figures)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the script, its daemons and the mount's helper
        out, err = proc.communicate()
        pytest.fail(f"hung for 240 s\n{out[-3000:]}\n{err[-3000:]}")
    said = f"{' '.join(cmd)}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-4000:]}"
    assert proc.returncode == 0, said
    lines = out.splitlines()

    def row(pattern: str) -> None:
        assert any(re.fullmatch(pattern, ln) for ln in lines), f"no line matches {pattern!r}\n{said}"

    row(r"\$ \S*python\S* .*bench_dcp_nodes\.py --shard-mib 4 .*")
    row(r"machine: \d+ cores .*")
    row(r"  watcher polls\s+\d+\s+[1-9]\d*\s+-")
    row(r"  \(a\) \.metadata, a shard short\s+0\s+0\s+-")    # direct's barrier holds too: its writes are synchronous
    row(r"  \(b\) a final name, short\s+\d+\s+0\s+-")        # direct writes its shards under their names: seen short
    row(r"  PFS bytes written / shards\s+1\.00x\s+1\.00x\s+-")  # each byte written to the PFS once
    row(rf"  bytes checked right, MiB\s+{4 * NODES}\.0\s+{4 * NODES}\.0\s+-")
    row(rf"  published files, every byte\s+{NODES + 1}/{NODES + 1} OK\s+{NODES + 1}/{NODES + 1} OK")
    row(rf"monarch report: {NODES} nodes, {NODES + 1} of {NODES + 1} files published, \d+ ordered after other nodes .*")
    row(rf"dcp nodes: direct polls \d+ early 0 short \d+ bytes {NODES + 1}/{NODES + 1} OK, "
        rf"monarch polls [1-9]\d* early 0 short 0 bytes {NODES + 1}/{NODES + 1} OK")
    results = json.loads(figures.read_text())["results"]
    ranks = results["monarch"]["ranks"]
    assert sorted(r["rank"] for r in ranks) == list(range(NODES)) and all(r["shim"] for r in ranks), ranks
    assert not any(r["shim"] for r in results["direct"]["ranks"])
    assert results["monarch"]["pfs"]["bytes_written"] == results["direct"]["pfs"]["bytes_written"]
