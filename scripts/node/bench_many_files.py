#!/usr/bin/env python3
"""Many small files on the emulated PFS's generated tree: what Monarch's first job costs against
``find`` and a direct reader, side by side in one run.

The dataset is the emulated PFS in its generated mode (``monarch.tools.slowpfs_generated``):
``--files`` files of 1-4 KiB (``--file-size``), ``--per-dir`` a directory, made by formula and
stored nowhere, behind a FUSE mount with a latency on every metadata call
(``--lookup-latency-ms``: getattr, readdir, access) and on every open (``--open-latency-ms``);
the kernel caches nothing (every lookup and read reaches the emulator). The emulator's own
counters (its JSON file) count each row's calls to it: metadata (lookups + readdirs + opendirs +
statfs + accesses) and opens apart.

    python scripts/node/bench_many_files.py                        # 200,000 files: 2 minutes on 2 cores
    python scripts/node/bench_many_files.py --files 2000000        # about 8 minutes on 2 cores
    python scripts/node/bench_many_files.py --files 10000000       # about 13 minutes on 2 cores
    python scripts/node/bench_many_files.py --files 10000000 --rows index,manifest,list-index,list,direct
    python scripts/node/bench_many_files.py --quick                # 2,000 files, 200 read: 10 s, a smoke run

On 2 cores the emulator's own CPU (Python, ~160 us a call) bounds every walk: the listing walks
make 4 calls a directory, the jobs' passes 20,000 misses whatever the files. At 10,000,000 files
the daemon's peak is ~0.42 GB and each index (the kept snapshot, the manifests) ~0.36 GB in the
scratch directory.

The rows, in this order (``--rows`` runs some of them, in this order still), each a separate
process launched from here (wall: its launch to its exit):

  find            ``find MNT -type f``; the files it prints are counted and must be ``--files``.
  monarch index   ``monarch index MNT -o FILE``: walks the root once and writes the namespace
                  (its line printed); FILE is the manifest of the manifest job below.
  first job       ``monarch run -c CFG -- python3 READER``, CFG written in the scratch directory:
                  the root, a run base and two tiers of its own (RAM in /dev/shm, SSD beside it,
                  both ``keep: true``), ``staging: {policy: on-access, share: false}``: a private job
                  whose tiers and snapshot outlive it. No snapshot kept before: the daemon walks.
  later job       the same CFG again: the kept snapshot (checked by one stat per directory) and
                  the kept copies (the first job's sample, staged on access) are reused.
  read-ahead job  a first job with the shipped policy, ``staging: {policy: read-ahead, share:
                  false}``, and tiers of its own (``keep: false``): the daemon walks, then reads
                  ahead what its tiers hold while READER reads its sample. Under the table: its
                  metadata calls but one a file opened (the name its open looks up) against find's.
  every file described  the read-ahead job with its RAM tier compressed (``compression: zstd``):
                  the read-ahead samples the dataset to choose its level, so the daemon describes
                  every file the walk listed first (a stat each, 8 at once); READER, after its
                  passes, waits until the index the shim maps has no file left undescribed (at most
                  ``--timeout``), then AHEAD_S (20 s) more, the read-ahead under way over every file,
                  before it reads the daemon's peak. Under the table: the peak and
                  the index per file with every file described, where the index's bytes go.
  manifest job    ``dataset: {roots: [MNT], manifest: FILE}``, a run base and tiers of its own,
                  ``keep: false``: the snapshot read from ``monarch index``'s file.
  index from a list  ``monarch index MNT -o FILE2 --from-list LIST``: LIST (each file's path
                  and size, as ``find -printf '%P\t%s\n'`` writes them) is written here from the
                  generator beforehand, untimed; the manifest made from it, no file stat'ed.
  list manifest job  the manifest job's configuration with FILE2.
  direct          READER without Monarch (plain python3), over the same files in the same order.

READER stats one file under the root right after it starts and reads the emulator's counters
then; it then reads ``--sample`` files (capped at --files; drawn with ``--seed``) in that order,
twice, each open + read + close timed as a pass, and checks every byte of each pass against the
generator's (``generated_bytes``; the check is not timed). Under Monarch the jobs get
``MONARCH_SHIM_INDEX_WAIT_MS`` (``--index-wait-ms``, default as long as ``--timeout``) so that the
first stat waits for the namespace: the counters read then are the namespace's cost. The figures:

  namespace ready       the job's report: nodes[0].snapshot_ready_seconds (seconds after the
                        daemon's start; the JSON also has it after the launch) and nodes[0].snapshot
                        (walked / reused / manifest).
  metadata before the first read
                        the emulator's metadata calls from the row's launch to READER's first stat
                        returned (the walk, the kept snapshot's or manifest's check, the stat).
  first / second pass   READER's wall seconds for each pass over the sample. The first job's
                        first pass (every file a miss: staged on access) against direct's first
                        pass: the target is <= 1.00x.
  daemon peak RSS / file  VmHWM of the daemon (/proc/PID/status; its pid from daemon.pid beside
                        the socket named by MONARCH_SOCKET) read by READER after its passes, / files.
                        It counts the index's pages the daemon maps: the same pages as the index
                        file's (the node holds them once). Printed under the table: RssAnon (the
                        daemon's own), RssFile and RssShmem (mapped files) at the end.
  index / file          the bytes the index the shim maps (MONARCH_INDEX) holds after the passes (its
                        allocated blocks: its room for the stats of files described later is sparse),
                        / files; for the monarch index rows, the manifest's. Printed under the table
                        by part, from the index's header.
  CPU-s                 every process of the row (scripts/benchkit/cpuwatch.py, sampled every 0.1 s):
                        the emulated PFS's, the daemon's, and the rest (find, the launcher, READER).

The ratios under the table are the first job's against find's. One repeat: on a small machine the
figures move with what else runs (the load average is printed at the start and the end). The
JSON (``--json``) holds the table, the ratios and each row's raw figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import checkout_env  # noqa: E402  (this checkout's monarch first on the path)

from benchkit.cpuwatch import CpuWatch  # noqa: E402
from benchkit.options import fresh_bytecode, parse_with_quick, result_path, write_json  # noqa: E402
from benchkit.pfs import pfs_unavailable  # noqa: E402
from monarch import protocol  # noqa: E402
from monarch.errors import ConfigError  # noqa: E402
from monarch.sizes import parse_size  # noqa: E402
from monarch.tools.slowpfs import FLUSH_INTERVAL_S, SlowPFS  # noqa: E402
from monarch.tools.slowpfs_generated import Generated, parse_size_range  # noqa: E402

NAME = "bench_many_files"
ROWS = ("find", "index", "first", "later", "ahead", "described", "manifest", "list-index", "list", "direct")  # in order
JOBS = ("first", "later", "ahead", "described", "manifest", "list")
NEEDS = {"later": "first", "manifest": "index", "list": "list-index"}  # a row -> the row it reads what it made
METADATA = ("lookups", "readdirs", "opendirs", "statfs", "accesses")  # the emulator's metadata calls
SETTLE_S = 3 * FLUSH_INTERVAL_S  # the emulator flushes its counters every FLUSH_INTERVAL_S
AHEAD_S = 20  # the described row: READER reads the daemon's peak this long after the last file is described

# READER: under `monarch run` (a job) and alone (direct). Its argv: MNT COUNTERS FILES PER_DIR
# LOW HIGH TREE_SEED SAMPLE PICK_SEED WAIT_DESCRIBED_S. Prints one RESULT line; exits 1 if a byte
# was wrong.
READER = r'''
import json, os, random, sys, time
from array import array
mnt, counters = sys.argv[1], sys.argv[2]
files, per_dir, low, high, seed, sample, pick, wait_described = map(int, sys.argv[3:11])
from monarch import layout, protocol
from monarch.tools.slowpfs_generated import Generated
tree = Generated(files, per_dir, low, high, seed)
os.stat(os.path.join(mnt, tree.path(files // 2)))
out = {"stat_at": time.time()}
time.sleep(%(settle)r)  # the emulator's last flush: nothing read yet
with open(counters) as f:
    out["counters_at_stat"] = json.load(f)
picked = random.Random(pick).sample(range(files), sample)
paths = [os.path.join(mnt, tree.path(i)) for i in picked]

def one_pass():
    got = []
    t0 = time.perf_counter()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            data = os.read(fd, high + 1)  # a file is at most high bytes: one call, extra bytes seen
            while data and len(data) < low:  # short read: to the end
                more = os.read(fd, high + 1 - len(data))
                if not more:
                    break
                data += more
        finally:
            os.close(fd)
        got.append(data)
    return time.perf_counter() - t0, got

out["passes"], wrong = [], []
for _ in range(2):
    seconds, got = one_pass()
    out["passes"].append(seconds)
    wrong += [paths[k] for k, i in enumerate(picked) if got[k] != tree.data(i)]
out["checked"] = 2 * len(paths) - len(wrong)
out["wrong"] = wrong[:10]
sock, index = os.environ.get(protocol.ENV_SOCKET), os.environ.get(protocol.ENV_INDEX)
if wait_described and index:  # the daemon's pass that describes every file: until none is left
    t0 = time.perf_counter()
    with open(index, "rb") as f:
        head = protocol.INDEX_HEADER.unpack(f.read(protocol.INDEX_HEADER.size))
        nfiles, files_off = head[11], head[13]
        while True:
            f.seek(files_off)
            stats = array("I", f.read(8 * nfiles))[1::2]
            left = stats.count(0) + stats.count(protocol.INDEX_DESCRIBING)
            if not left or time.perf_counter() - t0 > wait_described:
                break
            time.sleep(2)
    out["undescribed"], out["described_after"] = left, time.perf_counter() - t0
    time.sleep(%(ahead)d)  # the read-ahead, which starts once every file is described, under way
if sock:
    try:
        with open(os.path.join(os.path.dirname(sock), layout.PID_FILE)) as f:
            pid = int(f.read())
        with open("/proc/%%d/status" %% pid) as f:
            status = dict(l.split(":", 1) for l in f if ":" in l)
        out["daemon_hwm_kib"] = int(status["VmHWM"].split()[0])
        out["daemon_now_kib"] = {k: int(status[k].split()[0]) for k in ("RssAnon", "RssFile", "RssShmem")}
    except (OSError, ValueError, KeyError) as e:
        out["hwm_error"] = repr(e)
out["index_bytes"] = os.stat(index).st_blocks * 512 if index and os.path.exists(index) else None  # its pages, not its room
if out["index_bytes"]:
    with open(index, "rb") as f:
        out["index_header"] = f.read(protocol.INDEX_HEADER.size).hex()
print("RESULT " + json.dumps(out), flush=True)
sys.exit(1 if wrong else 0)
''' % {"settle": SETTLE_S, "ahead": AHEAD_S}


# --------------------------------------------------------------------------- the emulator's counters


def counters(pfs: SlowPFS) -> dict:
    return pfs.raw_counters(settle=SETTLE_S)


def calls(before: dict, after: dict) -> tuple[int, int]:
    """(metadata calls, opens) between two readings of the emulator's counters."""
    return (sum(after.get(k, 0) - before.get(k, 0) for k in METADATA),
            after.get("opens", 0) - before.get("opens", 0))


# --------------------------------------------------------------------------- the rows


class Watch(CpuWatch):
    """CpuWatch that tells the embedded daemon from its launcher: forked by ``monarch run``
    (monarch/launch/forked.py), it has the launcher's command line, in a session of its own."""

    def sample(self) -> None:
        try:
            for p in self.me.children(recursive=True):
                if p.pid not in self.last and p.pid != self.pfs_pid and os.getsid(p.pid) == p.pid \
                        and "monarch" in " ".join(p.cmdline()):
                    with self._lock:
                        self.last.setdefault(p.pid, ("daemons", 0.0))
        except (psutil.Error, OSError):
            pass  # ended meanwhile
        super().sample()


class Row:
    """One row's process, from just before its launch: timed, its calls and CPU counted."""

    def __init__(self, name: str, pfs: SlowPFS, watch: CpuWatch):
        self.name, self.pfs, self.watch = name, pfs, watch
        self.before = counters(pfs)
        watch.mark(f"{name}:start")
        self.launch = time.time()

    def done(self) -> dict:
        wall = time.time() - self.launch
        self.watch.mark(f"{self.name}:end")
        meta, opens = calls(self.before, counters(self.pfs))
        cpu = self.watch.between(f"{self.name}:start", f"{self.name}:end")
        return {"row": self.name, "wall": wall, "metadata": meta, "opens": opens, "launch": self.launch,
                "cpu": {"pfs": cpu.get("pfs", 0.0), "daemon": cpu.get("daemons", 0.0),
                        "rest": round(sum(v for k, v in cpu.items() if k not in ("pfs", "daemons")), 3)}}


def run_find(mnt: Path, args, pfs: SlowPFS, watch: CpuWatch) -> dict:
    row = Row("find MNT -type f", pfs, watch)
    proc = subprocess.Popen(["find", str(mnt), "-type", "f"], stdout=subprocess.PIPE)
    printed = 0
    while chunk := proc.stdout.read(1 << 20):  # counted as it comes: 10M paths are 300 MB
        printed += chunk.count(b"\n")
    code = proc.wait(timeout=args.timeout)
    r = row.done()
    if code != 0 or printed != args.files:
        raise SystemExit(f"{NAME}: find {mnt} -type f exited {code} after printing {printed} files, not {args.files}")
    return r | {"printed": printed}


def run_index(mnt: Path, manifest: Path, args, pfs: SlowPFS, watch: CpuWatch, env: dict,
              listing: Path | None = None) -> dict:
    """``monarch index``'s row: a walk, or (``listing``) the manifest from a list of the tree's
    files, written here untimed before the row (what a user already has)."""
    cmd = [sys.executable, "-m", "monarch", "index", str(mnt), "-o", str(manifest)]
    if listing is not None:
        with listing.open("w") as f:
            t = args.tree
            f.writelines(f"{t.path(i)}\t{t.size(i)}\n" for i in range(t.files))
        cmd += ["--from-list", str(listing)]
    name = "monarch index MNT -o FILE" + (" --from-list LIST" if listing is not None else "")
    row = Row(name, pfs, watch)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    r = row.done()
    if proc.returncode != 0:
        raise SystemExit(f"{NAME}: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    print(f"{name}: {line}", flush=True)
    size = manifest.stat().st_blocks * 512  # what it holds: the room for stats written later is sparse
    with manifest.open("rb") as f:
        parts = index_parts(f.read(protocol.INDEX_HEADER.size), args.files)
    return r | {"stdout": line, "index_bytes": size, "index_per_file": size / args.files, "index_parts": parts}


def index_parts(header: bytes, files: int) -> dict[str, float]:
    """What an index holds, in bytes per file, from its header (protocol.py, "Snapshot index"): the
    files' records, the stats of the files described, the directories' and links' entries, the hash
    buckets, the key bytes (the files' names, then the directories' keys and the names of listed
    children that are no entry), the listed sizes and inodes, the child records."""
    (_, _, total, nbuckets, reserved, _, _, _, keys_size, _, nchildren, nfiles, used, _, _, _, dirs, shorts, names_size,
     _, sizes_off, inos_off) = protocol.INDEX_HEADER.unpack(header)
    inodes = 8 * (1 if reserved & protocol.INDEX_INOS_ONE else nfiles) if inos_off else 0
    size = protocol.INDEX_ENTRY.size
    return {"file records": protocol.INDEX_FILE.size * nfiles / files, "stats": size * used / files,
            "short stats": 8 * shorts / files, "shapes": size * dirs / files,
            "other entries": size * (total - nfiles) / files, "buckets": 4 * nbuckets / files,
            "names": names_size / files, "other keys": (keys_size - names_size) / files,
            "sizes": 8 * nfiles / files if sizes_off else 0.0, "inodes": inodes / files,
            "ranges": 4 * (dirs + 1) / files, "child records": protocol.INDEX_CHILD.size * nchildren / files}


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    """The generated tree's options and the emulator's latencies (tree_of reads them)."""
    p.add_argument("--files", type=int, default=200_000, help="files in the generated tree (default 200,000)")
    p.add_argument("--per-dir", type=int, default=1000, help="files a directory (default 1,000)")
    p.add_argument("--file-size", default="1KiB-4KiB", metavar="MIN-MAX", help="file sizes (default 1KiB-4KiB)")
    p.add_argument("--lookup-latency-ms", type=float, default=0.2,
                   help="the emulator's latency per metadata call: getattr, readdir, access (default 0.2)")
    p.add_argument("--open-latency-ms", type=float, default=2.0, help="the emulator's latency per open (default 2)")


def tree_of(p: argparse.ArgumentParser, args) -> tuple[int, int]:
    """The generated tree of the options (``args.tree``, ``args.sample_n``), or ``p.error``: the
    files' sizes, least and most."""
    if args.files < 1 or args.per_dir < 1 or args.sample < 1:
        p.error("--files, --per-dir and --sample must be at least 1")
    try:
        low, high = parse_size_range(args.file_size)
    except ConfigError as e:
        p.error(str(e))
    args.tree = Generated(args.files, args.per_dir, low, high)
    args.sample_n = min(args.sample, args.files)
    return low, high


def tree_line(args, low: int, high: int) -> str:
    """The emulated PFS the rows read, in words (the line under the machine's)."""
    return (f"emulated PFS: generated tree of {args.files:,} files, {args.per_dir:,} a directory "
            f"({args.tree.directories:,} directories), {low}-{high} bytes; latency {args.lookup_latency_ms:g} ms a "
            f"metadata call, {args.open_latency_ms:g} ms an open")


def reader_args(mnt: Path, args, pfs: SlowPFS, wait_described: bool = False, seed: int | None = None) -> list[str]:
    """READER's argv after its path; ``seed`` draws its sample (default ``args.seed``: a cluster's
    node k draws with ``args.seed + k``, scripts/cluster/bench_cluster_namespace.py)."""
    t = args.tree
    pick = args.seed if seed is None else seed
    return [str(mnt), pfs.counters_path, *map(str, (t.files, t.per_dir, t.min_size, t.max_size, t.seed,
                                                    args.sample_n, pick, args.timeout if wait_described else 0))]


def result_of(name: str, proc: subprocess.CompletedProcess) -> dict:
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None or proc.returncode != 0:
        raise SystemExit(f"{NAME}: {name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def reads(r: dict, res: dict, before: dict, args) -> dict:
    """A READER row's figures: calls before its first read, its passes, memory and index per file."""
    meta, opens = calls(before, res["counters_at_stat"])
    hwm = res.get("daemon_hwm_kib")
    idx = res.get("index_bytes")
    return r | {"metadata_before_read": meta, "opens_before_read": opens,
                "stat_after_launch": res["stat_at"] - r["launch"],
                "pass1": res["passes"][0], "pass2": res["passes"][1], "checked": res["checked"],
                "hwm_per_file": hwm * 1024 / args.files if hwm else None,
                "now_per_file": {k: v * 1024 / args.files for k, v in (res.get("daemon_now_kib") or {}).items()},
                "index_per_file": idx / args.files if idx else None, "result": res,
                "index_parts": index_parts(bytes.fromhex(res["index_header"]), args.files) if idx else None}


def run_job(name: str, cfg: Path, mnt: Path, reader: Path, work: Path, args, pfs: SlowPFS, watch: CpuWatch,
            env: dict, wait_described: bool = False) -> dict:
    report = work / f"report-{len(list(work.glob('report-*')))}.json"
    cmd = [sys.executable, "-m", "monarch", "run", "-c", str(cfg), "--no-progress", "--report", str(report), "--",
           sys.executable, str(reader), *reader_args(mnt, args, pfs, wait_described)]
    row = Row(name, pfs, watch)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=work)
    r = row.done()
    res = result_of(name, proc)
    if not report.exists():  # Monarch fails open: the figures would be the PFS's
        raise SystemExit(f"{NAME}: {name} wrote no report: Monarch was not active; its stderr:\n{proc.stderr[-3000:]}")
    rep = json.loads(report.read_text())
    node = rep["nodes"][0]
    r = reads(r, res, row.before, args)
    ready_at = node.get("snapshot_ready_at")
    r |= {"ready": node.get("snapshot_ready_seconds"), "snapshot": node.get("snapshot"),
          "undescribed": res.get("undescribed"), "described_after": res.get("described_after"),
          "ready_after_launch": ready_at - r["launch"] if ready_at else None,
          "dataset_files": rep["dataset"]["files"], "opened_from": rep.get("opened_from"),
          "pfs_before_index": rep.get("pfs_before_index"), "warnings": []}
    if r["dataset_files"] != args.files:
        r["warnings"].append(f"the report's dataset has {r['dataset_files']} files, not {args.files}")
    early = rep.get("pfs_before_index") or {}
    if early.get("metadata") or early.get("opens"):
        r["warnings"].append(f"calls went to the PFS before the index was written: {early}")
    for w in r["warnings"]:
        print(f"  warning ({name}): {w}", flush=True)
    return r


def run_direct(mnt: Path, reader: Path, args, pfs: SlowPFS, watch: CpuWatch, env: dict) -> dict:
    row = Row("direct (READER, no Monarch)", pfs, watch)
    proc = subprocess.run([sys.executable, str(reader), *reader_args(mnt, args, pfs)], capture_output=True,
                          text=True, env=env, timeout=args.timeout)
    r = row.done()
    return reads(r, result_of("the direct reader", proc), row.before, args)


def write_config(path: Path, mnt: Path, base: Path, ram_base: Path, capacity: int, keep: bool,
                 manifest: Path | None = None, policy: str = "on-access", compression: str = "off") -> Path:
    """A job's configuration (tests/support/harness.py's shape): the root, a run base and tiers of its own."""
    dataset = f"roots: [{json.dumps(str(mnt))}]" + (f", manifest: {json.dumps(str(manifest))}" if manifest else "")
    for d in (base / "run", base / "ssd", ram_base):
        d.mkdir(parents=True)  # Monarch makes only its own monarch-<uid> inside an existing base
    k = str(keep).lower()
    path.write_text(f"""dataset: {{{dataset}}}
run_base: {json.dumps(str(base / "run"))}
tiers:
  - {{name: ram, path: {json.dumps(str(ram_base))}, capacity: {capacity}, keep: {k}, compression: {compression}}}
  - {{name: ssd, path: {json.dumps(str(base / "ssd"))}, capacity: {capacity}, keep: {k}}}
staging: {{policy: {policy}, share: false}}
""")
    return path


# --------------------------------------------------------------------------- the table


def machine() -> str:
    try:
        with open("/proc/meminfo") as f:
            mem = next(int(x.split()[1]) for x in f if x.startswith("MemTotal:")) / 2**20
    except (OSError, StopIteration, ValueError):
        mem = float("nan")
    return (f"machine: {os.cpu_count()} cores ({platform.machine()}), {mem:.0f} GiB, Linux {platform.release()}, "
            f"Python {platform.python_version()}; load average {os.getloadavg()[0]:.2f}")


def cell(v, digits: int = 2, thousands: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if thousands else f"{v:.{digits}f}"


COLUMNS = (("row", "", None), ("wall s", "wall", 2), ("PFS meta", "metadata", "n"), ("PFS opens", "opens", "n"),
           ("ns ready s", "ready", 2), ("meta<1st read", "metadata_before_read", "n"), ("1st pass s", "pass1", 3),
           ("2nd pass s", "pass2", 3), ("daemon RSS B/file", "hwm_per_file", 0), ("index B/file", "index_per_file", 0),
           ("CPU-s pfs/daemon/rest", "cpu", None), ("snapshot", "snapshot", None))


def table_lines(rows: list[dict]) -> list[list[str]]:
    out = [[c[0] for c in COLUMNS]]
    for r in rows:
        line = []
        for title, key, kind in COLUMNS:
            if title == "row":
                line.append(r["row"])
            elif key == "cpu":
                c = r["cpu"]
                line.append(f"{c['pfs']:.1f}/{c['daemon']:.1f}/{c['rest']:.1f}")
            elif key == "snapshot":
                s = r.get("snapshot")
                line.append("-" if s is None else str(s).split(":")[0])
            else:
                line.append(cell(r.get(key), 0 if kind == "n" else kind, thousands=kind == "n"))
        out.append(line)
    return out


def print_table(rows: list[dict]) -> None:
    lines = table_lines(rows)
    widths = [max(len(x[i]) for x in lines) for i in range(len(COLUMNS))]
    for line in lines:
        print("  ".join(x.ljust(w) if i == 0 or i == len(COLUMNS) - 1 else x.rjust(w)
                        for i, (x, w) in enumerate(zip(line, widths))).rstrip())


def ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def ratios(find: dict | None, first: dict | None, direct: dict | None) -> dict:
    """The first job's against find's and direct's (None where a row was not run)."""
    find, first, direct = find or {}, first or {}, direct or {}
    return {"wall": ratio(first.get("wall"), find.get("wall")),
            "namespace_ready": ratio(first.get("ready"), find.get("wall")),
            "metadata": ratio(first.get("metadata"), find.get("metadata")),
            "metadata_before_read": ratio(first.get("metadata_before_read"), find.get("metadata")),
            "cpu": ratio(sum(first["cpu"].values()) if first else None, sum(find["cpu"].values()) if find else None),
            "first_pass_vs_direct": ratio(first.get("pass1"), direct.get("pass1"))}


def fx(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_tree_arguments(p)
    p.add_argument("--sample", type=int, default=20000, help="files READER reads, each pass (default 20,000)")
    p.add_argument("--capacity", type=parse_size, default=None, metavar="BYTES",
                   help="each tier's capacity, as `2GiB` (default: the sample's bytes twice over, 64 MiB at least)")
    p.add_argument("--seed", type=int, default=0, help="draws the sample (default 0)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed to each row (default 3600)")
    p.add_argument("--index-wait-ms", type=int,
                   help="MONARCH_SHIM_INDEX_WAIT_MS of the jobs (default: --timeout): READER's first stat waits "
                        "for the namespace; 300, the shipped default, lets it go to the PFS after 300 ms")
    p.add_argument("--workdir", help="scratch directory (default: a new one under /tmp)")
    p.add_argument("--json", default=result_path(f"{NAME}.json"),
                   help=f"the JSON written (default: results/{NAME}.json of this checkout)")
    p.add_argument("--rows", default=",".join(ROWS),
                   help=f"the rows to run, comma-separated, always in the table's order (default: all: {','.join(ROWS)}); "
                        "later needs first, manifest needs index, list needs list-index")
    args = parse_with_quick(p, argv, {"files": 2000, "per_dir": 100, "sample": 200})
    wanted = [x.strip() for x in args.rows.split(",") if x.strip()]
    unknown = [x for x in wanted if x not in ROWS]
    missing = [f"{x} needs {NEEDS[x]}" for x in wanted if x in NEEDS and NEEDS[x] not in wanted]
    if unknown or missing or not wanted:
        p.error(f"--rows: {', '.join(unknown) + ' unknown' if unknown else '; '.join(missing) or 'no row'} "
                f"(the rows: {','.join(ROWS)})")
    args.rows = [x for x in ROWS if x in wanted]
    low, high = tree_of(p, args)
    wait_ms = args.index_wait_ms or int(min(args.timeout, 24 * 3600) * 1000)
    fresh_bytecode()
    if pfs_unavailable(NAME):
        return 2
    print(machine(), flush=True)
    print(f"{tree_line(args, low, high)}; READER: {args.sample_n:,} files at random, 2 passes", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bmf-", dir=args.workdir or "/tmp"))  # short: socket paths are bounded
    shm = Path(tempfile.mkdtemp(prefix="bmf-", dir="/dev/shm"))
    try:
        (work / "tmp").mkdir()
        reader = work / "reader.py"
        reader.write_text(READER)
        manifest = work / "dataset.index"
        capacity = args.capacity or max(64 << 20, 2 * args.sample_n * high)  # the sample, staged, twice over
        mnt = work / "mnt"
        env = checkout_env(TMPDIR=work / "tmp")
        env.pop("LD_PRELOAD", None)
        job_env = env | {"MONARCH_SHIM_INDEX_WAIT_MS": str(wait_ms)}
        with SlowPFS(args.tree, mnt, work / "counters.json", lookup_latency_ms=args.lookup_latency_ms,
                     open_latency_ms=args.open_latency_ms, timeout=60) as pfs, \
                Watch(period=0.1, pfs_pid=pfs.proc.pid) as watch:
            kept = write_config(work / "kept.yaml", mnt, work / "kept", shm / "kept-ram", capacity, keep=True)
            listed = write_config(work / "manifest.yaml", mnt, work / "listed", shm / "listed-ram", capacity,
                                  keep=False, manifest=manifest)
            from_list = write_config(work / "list.yaml", mnt, work / "from-list", shm / "list-ram", capacity,
                                     keep=False, manifest=work / "list.index")
            ahead = write_config(work / "ahead.yaml", mnt, work / "ahead", shm / "ahead-ram", capacity, keep=False,
                                 policy="read-ahead")
            described = write_config(work / "described.yaml", mnt, work / "described", shm / "described-ram", capacity,
                                     keep=False, policy="read-ahead", compression="zstd")
            by: dict[str, dict] = {}  # a row's name in ROWS -> its figures
            for name in args.rows:
                if name == "find":
                    by[name] = run_find(mnt, args, pfs, watch)
                    print(f"  find: {by[name]['wall']:.2f} s", flush=True)
                elif name in ("index", "list-index"):
                    listing = work / "files.list" if name == "list-index" else None
                    by[name] = run_index(mnt, work / "list.index" if listing else manifest, args, pfs, watch, env,
                                         listing=listing)
                else:
                    title, cfg = {"first": ("first job (walk)", kept), "later": ("later job (kept)", kept),
                                  "ahead": ("read-ahead job (walk)", ahead),
                                  "described": ("every file described", described),
                                  "manifest": ("manifest job", listed), "list": ("list manifest job", from_list),
                                  "direct": (None, None)}[name]
                    by[name] = r = (run_job(title, cfg, mnt, reader, work, args, pfs, watch, job_env,
                                            wait_described=name == "described") if title
                                    else run_direct(mnt, reader, args, pfs, watch, env))
                    print(f"  {r['row']}: {r['wall']:.2f} s, snapshot {r.get('snapshot')}, ready "
                          f"{cell(r.get('ready'))} s, passes {r['pass1']:.3f} s, {r['pass2']:.3f} s", flush=True)
        rows = list(by.values())
        rat = ratios(by.get("find"), by.get("first"), by.get("direct"))
        print(f"\n{args.files:,} files, {args.per_dir:,} a directory, {low}-{high} bytes; emulated PFS latency "
              f"{args.lookup_latency_ms:g} ms a metadata call, {args.open_latency_ms:g} ms an open; READER "
              f"{args.sample_n:,} files x 2 passes; PFS meta: lookups + readdirs + opendirs + statfs + accesses")
        print_table(rows)
        if "find" in by and "first" in by:
            print(f"\nfirst job / find: wall {fx(rat['wall'])}, "
                  f"namespace ready {fx(rat['namespace_ready'])} of find's wall, "
                  f"PFS metadata calls {fx(rat['metadata'])} (before the first read {fx(rat['metadata_before_read'])}), "
                  f"CPU-s {fx(rat['cpu'])}")
        if "find" in by and "ahead" in by:
            a = by["ahead"]
            print(f"read-ahead job / find: namespace ready {fx(ratio(a.get('ready'), by['find']['wall']))} of find's "
                  f"wall; PFS metadata calls {fx(ratio(a['metadata'], by['find']['metadata']))}, but the name each "
                  f"open looked up ({a['opens']:,} opens) {fx(ratio(a['metadata'] - a['opens'], by['find']['metadata']))}"
                  f" (target <= 2.00x)")
        jobs = [by[k] for k in JOBS if k in by]
        if "direct" in by:
            met = rat["first_pass_vs_direct"]
            print("first pass / direct: " + ", ".join(f"{r['row']} {fx(ratio(r['pass1'], by['direct']['pass1']))}"
                                                       for r in jobs if r is not by.get("later")) +
                  f" (target, the first job's <= 1.00x: {'n/a' if met is None else 'met' if met <= 1.0 else 'NOT met'})")
        checked = sum(r["checked"] for r in rows if "checked" in r)
        ram = [((r.get("opened_from") or {}).get("ram") or {}).get("opens", 0) for r in jobs]
        print(f"monarch: snapshots {', '.join(r['snapshot'].split(':')[0] for r in jobs)}; "
              f"opens from the ram tier {', '.join(map(str, ram))} of {2 * args.sample_n} each; "
              + (f"find printed {by['find']['printed']} of {args.files}; " if "find" in by else "")
              + f"every byte checked, {checked} files read")
        for r in jobs:  # what the peak is made of: the index's pages are the file's
            now = r["now_per_file"]
            print(f"{r['row']}: daemon at the end, B/file: {', '.join(f'{k} {v:.0f}' for k, v in now.items())} "
                  f"(RssFile + RssShmem: the index's pages it maps, the same pages as the index file's)")
        for r in jobs:
            if r.get("undescribed") is not None:  # the row's peak counts only if every file was described
                print(f"{r['row']}: {r['undescribed']:,} files left undescribed, {r['described_after']:.1f} s after "
                      f"READER's passes")
        for r in rows:  # where an index's bytes go: what a more compact layout would have to shrink
            if r.get("index_parts"):
                print(f"{r['row']}: index, B/file: " + ", ".join(f"{k} {v:.1f}" for k, v in r["index_parts"].items()))
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
        write_json(args.json, {"args": {k: v for k, v in vars(args).items() if k != "tree"}, "machine": machine(),
                               "index_wait_ms": wait_ms, "rows": rows, "ratios": rat,
                               "table": [dict(zip([c[0] for c in COLUMNS], x)) for x in table_lines(rows)[1:]]})
        print(f"\nJSON: {args.json}")
    finally:
        shutil.rmtree(shm, ignore_errors=True)  # the kept RAM tier
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
