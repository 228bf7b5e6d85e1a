#!/usr/bin/env python3
"""A million small files: Monarch's start-up, memory, staging and tear-down
against what the machine itself does with the same tree, side by side in one run.

The tree is ImageFolder-like (``--dirs`` class directories of ``--files`` files of
``--size``) on local disk, standing for the PFS; Monarch runs in its shipped configuration
(``monarch run --dataset DIR``, no ``-c``; ``TMPDIR`` points into the scratch directory so
that its run base is this benchmark's own). Each repeat runs every Monarch job beside its
baseline, interleaved; the table gives the median [range] over the repeats.

    python scripts/node/bench_million.py                          # 1,000,000 x 1 KiB, 1,000 dirs
    python scripts/node/bench_million.py --files 100000 --repeats 3
    python scripts/node/bench_million.py --keep-tree /tmp/million # make the tree once, reuse it later
    python scripts/node/bench_million.py --quick                  # 2,000 files: a smoke run

What each figure is (all wall times are ``time.time()`` of one machine, so the launcher's,
the daemon's and the command's stamps compare):

  find                 ``find DIR -type f`` (output to /dev/null): the baseline of a walk.
  start-up to the first answered stat
                       from launching ``monarch -vv run --dataset DIR -- python3 CMD`` to the
                       moment CMD's ``os.stat`` of one file returned (CMD prints time.time()
                       right after it): interpreters, the daemon's start, and the wait for
                       the index that the shim's first call under the root makes. Three jobs:
                       read-ahead (shipped, first job: the kept snapshot removed before),
                       ``staging.policy: on-access`` with the tiers kept (first job), and that
                       configuration again with the snapshot the previous job kept (reused:
                       a snapshot is saved for the next job only beside kept copies).
  to the whole index   launch -> the daemon's ``phase index.written`` (its -vv log): the
                       index the shim maps is whole (a shim maps it from then; requests held
                       meanwhile are answered at ``phase snapshot.ready``, in the JSON).
  walk per file        the daemon's ``snapshot.start -> snapshot.done`` / files (on-access job:
                       no copies compete) against find's wall / files.
  daemon peak memory   VmHWM of the daemon process (/proc/PID/status), read by the command
                       once the read-ahead is done (the daemon's pid from the run directory's
                       daemon.pid) and by a sampler here every 0.1 s until it exits: the
                       larger of the two, divided by the files.
  index size per file  the size of the index the shim maps (MONARCH_INDEX), per file.
  staging rate         files staged / (read-ahead done - the daemon's ``snapshot.start``): the
                       copies start with the walk's first directories, so the window starts
                       there, walk included (as a ``cp -r`` includes its walk). "Done" is when
                       the daemon's brief REPORT, polled by the command every 0.1 s, shows
                       the snapshot ready, nothing in flight and every file staged (or no
                       change for 10 s). Baseline: 4 ``cp -r`` processes, each a quarter of
                       the class directories, into /dev/shm (files / wall of the slowest).
                       Both start from the same page-cache state (``--cache``, default warm).
  per-open             a sample of ``--sample`` files, open+read+close from Python, after an
                       untimed first pass; staged: in the read-ahead job's command after the
                       read-ahead is done (the report must show those opens from the RAM
                       tier); direct: the same reader in a child of it without the shim; the
                       two take turns by chunks of 500 files (~10 ms), ``--per-open-rounds``
                       passes each; medians over chunks, wall and the reading thread's CPU
                       (scripts/node/per_open.py). The JSON also has the direct figure of a
                       separate process after the job (``direct.per_open_s``), as measured before.
  tear-down            the daemon's ``phase daemon.stopping`` (last session closed) -> the
                       launcher's ``phase daemon.reaped`` (stager drained, tiers removed,
                       interpreter exit); if the launcher stopped waiting first (its wait is
                       bounded), -> the daemon process seen gone here. Against ``rm -rf`` of the 4-process copy in
                       /dev/shm (an equal tree on the same file system). The launcher's whole
                       tail (command end -> its exit: final REPORT, report printed, tear-down)
                       is in the JSON.
  CPU-seconds          resource.getrusage(RUSAGE_CHILDREN) around each job: the launcher, the
                       daemon and the command (each waited for by its parent); the daemon's
                       own from its -vv ``phase daemon.closed cpu=`` line (added to the job's
                       when the launcher left before reaping it).
  first stat           a stat made before the index is written waits for it at most
                       MONARCH_SHIM_INDEX_WAIT_MS, then is answered by the PFS and counted
                       (the report's pfs_before_index): the row says how many were; flagged
                       n/a only when it went to the PFS uncounted (the shim lost its daemon).

A figure that cannot be measured cleanly is printed as n/a with the reason. After each
Monarch job the benchmark checks that the job's tier directories are gone from /dev/shm
and says so if not.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
from benchkit import REPO  # noqa: E402  (this checkout's monarch and tests/ first on the path)

from bench_epochs import child_env  # noqa: E402
from bench_startup import phases  # noqa: E402
from benchkit.options import fresh_bytecode, parse_with_quick, ready_to_write, result_path  # noqa: E402
from monarch import layout  # noqa: E402
from monarch.launch.cache import drop_dataset  # noqa: E402
from monarch.tools.workload import parse_size  # noqa: E402

MARKER = ".bench_million.json"  # in a --keep-tree directory: what tree it holds
CPU = re.compile(r"phase daemon\.closed cpu=([\d.]+)")

# the command under `monarch run` (and, with mode "direct", alone): the stat first, then as asked
COMMAND = r'''
import json, os, sys, time
mode, first, sample_file = sys.argv[1], sys.argv[2], sys.argv[3]
os.stat(first)
out = {"stat_at": time.time()}
sys.path.insert(0, os.path.join(os.getcwd(), "scripts", "node"))  # per_open.py
from per_open import one_pass, read_list, side_by_side
if mode == "direct":
    paths = read_list(sample_file)
    one_pass(paths)  # untimed: page cache, dentries
    out["per_open_s"] = one_pass(paths)
elif mode == "stage":
    from monarch import protocol
    from monarch.launch.service import attach
    sock = os.environ.get(protocol.ENV_SOCKET)
    session = attach(sock) if sock else None
    if session is None:
        out["error"] = "no daemon to ask (MONARCH_SOCKET %r)" % sock
    else:
        last, since, polls = None, time.time(), 0
        while True:
            s = session.stats(brief=True) or {}
            now, polls = time.time(), polls + 1
            staged = (s.get("staging") or {}).get("files", 0)
            files = (s.get("dataset") or {}).get("files", 0)
            ready = s.get("snapshot_ready_at") is not None
            if staged != last:
                last, since = staged, now
            if ready and "staged_at_ready" not in out:
                out["staged_at_ready"] = staged
            idle = ready and not (s.get("staging") or {}).get("in_flight")
            if ready and files and staged >= files and idle:
                out["why_done"] = "every file staged"
                break
            if ready and now - since > 10.0:
                out["why_done"] = "no change for 10 s (%d of %d staged, %s in flight)" % (
                    staged, files, (s.get("staging") or {}).get("in_flight"))
                break
            time.sleep(0.1)
        out.update(staged_done_at=since, staged=last, dataset_files=files, polls=polls,
                   snapshot=s.get("snapshot"), failures=(s.get("staging") or {}).get("failures"))
        session.close()
        index = os.environ.get(protocol.ENV_INDEX)
        out["index_bytes"] = os.stat(index).st_size if index and os.path.exists(index) else None
        out.update(side_by_side(sample_file, int(sys.argv[4])))
        try:
            with open(os.path.join(os.path.dirname(sock), "daemon.pid")) as f:
                pid = int(f.read())
            with open("/proc/%d/status" % pid) as f:
                out["daemon_hwm_kib"] = int(next(l for l in f if l.startswith("VmHWM:")).split()[1])
        except (OSError, ValueError, StopIteration) as e:
            out["hwm_error"] = str(e)
print("RESULT " + json.dumps(out), flush=True)
'''


# --------------------------------------------------------------------------- the tree


def file_path(root: Path, i: int, dirs: int) -> str:
    return f"{root}/n{i % dirs:08d}/img_{i:08d}.JPEG"


def _make_dirs(job: tuple[str, list[int], int, int, int]) -> int:
    root, ds, dirs, files, size = job
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    n = 0
    for d in ds:
        os.makedirs(f"{root}/n{d:08d}", exist_ok=True)
        for i in range(d, files, dirs):
            fd = os.open(f"{root}/n{d:08d}/img_{i:08d}.JPEG", flags, 0o644)
            os.write(fd, os.urandom(size))
            os.close(fd)
            n += 1
    return n


def make_tree(base: Path, args) -> Path:
    """``base``/train, made unless ``base`` holds the same tree (its marker says so)."""
    root, marker = base / "train", base / MARKER
    want = {"files": args.files, "size": args.size_bytes, "dirs": args.dirs}
    if marker.exists():
        if json.loads(marker.read_text()) == want:
            print(f"reusing the tree in {root} ({args.files} files)", flush=True)
            return root
        raise SystemExit(f"bench_million: {base} holds another tree ({marker.read_text().strip()}); "
                         f"give another --keep-tree or remove it")
    if root.exists():
        raise SystemExit(f"bench_million: {root} exists without {MARKER} (a tree cut short?): remove it")
    t0 = time.time()
    procs = max(2, min(8, 2 * (os.cpu_count() or 1)))
    jobs = [(str(root), list(range(k, args.dirs, procs)), args.dirs, args.files, args.size_bytes)
            for k in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        made = sum(pool.map(_make_dirs, jobs))
    os.sync()
    marker.write_text(json.dumps(want) + "\n")
    print(f"made {made} files in {args.dirs} directories under {root} in {time.time() - t0:.1f} s "
          f"({procs} processes)", flush=True)
    return root


# --------------------------------------------------------------------------- running


def timed(cmd: list[str], timeout: float, **kw) -> tuple[subprocess.CompletedProcess, float, float, float]:
    """``cmd`` run to its end: the process, the launch time.time(), wall seconds, CPU-seconds of
    it and every descendant it waited for (RUSAGE_CHILDREN)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.run(cmd, timeout=timeout, **kw)
    wall = time.time() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, t0, wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def settle_cache(root: Path, args, before: str) -> dict:
    """Bring the tree to the same page-cache state before each timed copy or walk (``--cache``),
    so that Monarch and its baseline start alike. On this VM a page unused for about a minute
    is paged out (DAMON), so a job read from whatever the last one left: a cold start staged at
    12k files/s against a copy that then found every file cached (measured: 4 x cp -r 116 s
    cold, 31 s warm). ``warm``: every file read once just before (4 processes, untimed), as
    a node that has read its dataset before; ``cold``: the page cache, dentries and inodes
    dropped (root), as a PFS client that has not; ``as-is``: nothing done."""
    if args.cache == "as-is":
        return {"cache": "as-is"}
    t0 = time.time()
    if args.cache == "cold":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    else:
        find = subprocess.Popen(["find", str(root), "-type", "f", "-print0"], stdout=subprocess.PIPE)
        cat = subprocess.run(["xargs", "-0", "-P", "4", "-n", "2000", "cat"], stdin=find.stdout,
                             stdout=subprocess.DEVNULL, timeout=args.timeout)
        find.stdout.close()
        if find.wait() != 0 or cat.returncode != 0:
            raise SystemExit(f"reading {root} to warm the page cache failed")
    return {"cache": args.cache, "before": before, "seconds": round(time.time() - t0, 2)}


def run_find(root: Path, args) -> dict:
    proc, _, wall, cpu = timed(["find", str(root), "-type", "f"], args.timeout, stdout=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"find {root} failed ({proc.returncode})")
    return {"wall": wall, "cpu": cpu}


def run_copy(root: Path, shm: Path, args) -> dict:
    """4 ``cp -r`` processes, a quarter of the class directories each, into /dev/shm; then
    ``rm -rf`` of the copy (the tear-down's baseline)."""
    dest = shm / "copy"
    dest.mkdir()
    names = sorted(os.listdir(root))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    procs = [subprocess.Popen(["cp", "-r", "--target-directory", str(dest), *[str(root / n) for n in names[k::4]]])
             for k in range(4) if names[k::4]]
    codes = [p.wait(timeout=args.timeout) for p in procs]
    wall = time.time() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if any(codes):
        raise SystemExit(f"cp -r into {dest} failed ({codes})")
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    proc, _, rm_wall, rm_cpu = timed(["rm", "-rf", str(dest)], args.timeout)
    return {"wall": wall, "cpu": cpu, "files_per_s": args.files / wall, "rm_wall": rm_wall, "rm_cpu": rm_cpu}


class HighWater:
    """The daemon's VmHWM, sampled every 0.1 s from /proc while it lives (found among the
    launcher's descendants: ``monarch serve --embedded``)."""

    def __init__(self, launcher_pid: int):
        self.launcher, self.kib, self.pid = launcher_pid, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil
        while not self._stop.is_set():
            if self.pid is None:
                try:
                    for child in psutil.Process(self.launcher).children(recursive=True):
                        if "serve" in child.cmdline() and "--embedded" in child.cmdline():
                            self.pid = child.pid
                except psutil.Error:
                    pass
            if self.pid is not None:
                try:
                    with open(f"/proc/{self.pid}/status") as f:
                        kib = int(next(x for x in f if x.startswith("VmHWM:")).split()[1])
                    self.kib = max(self.kib or 0, kib)
                except (OSError, StopIteration, ValueError):
                    return  # gone (a zombie has no VmHWM line)
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_monarch(root: Path, work: Path, args, tag: str, mode: str, config: Path | None = None,
                cold: bool = True) -> dict:
    """One ``monarch -vv run`` of COMMAND (``mode`` stat: the stat alone; stage: then wait for the
    read-ahead, the per-open passes, the memory) and its figures."""
    tmp = work / "tmp"  # the shipped configuration's run base and SSD tier: ${TMPDIR}
    job = f"million{os.getpid()}{tag}"
    if cold:  # a first job on this dataset: no kept snapshot to reuse
        for kept in glob.glob(str(tmp / "monarch-*" / "snapshots")):
            shutil.rmtree(kept)
    report = work / f"report-{tag}.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "monarch", "-vv", "run", *(["-c", str(config)] if config else []),
           "--dataset", str(root), "--no-progress", "--report", str(report), "--",
           sys.executable, "-c", COMMAND, mode, file_path(root, args.files // 2, args.dirs), str(work / "sample.txt"),
           str(args.per_open_rounds)]
    env = child_env() | {"TMPDIR": str(tmp), "MONARCH_JOB_ID": job}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    hwm = HighWater(proc.pid)
    try:
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise SystemExit(f"monarch run ({tag}) did not end within {args.timeout:.0f} s:\n{err[-3000:]}")
    t1 = time.time()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the launcher waits for its daemon's tear-down only so long (service.wait_stopped): a
    # daemon still removing its copies is waited for here, before its log is read
    daemon_gone = wait_gone(hwm.pid, args.timeout)
    hwm.stop()
    if proc.returncode != 0:
        raise SystemExit(f"monarch run ({tag}) failed ({proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
    if not report.exists():  # Monarch fails open: the figures would be the disk's
        raise SystemExit(f"monarch run ({tag}) wrote no report: Monarch was not active; its stderr:\n{err[-3000:]}")
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"monarch run ({tag}): the command printed no RESULT:\n{out[-2000:]}\n{err[-3000:]}")
    res = json.loads(line[len("RESULT "):])
    logs = glob.glob(str(tmp / "monarch-*" / f"{job}*" / layout.DAEMON_LOG))
    daemon_log = Path(logs[0]).read_text(errors="replace") if logs else ""
    ph = phases(daemon_log) | phases(err)
    rep = json.loads(report.read_text())
    node = rep["nodes"][0]
    r = {"tag": tag, "mode": mode, "launch": t0, "wall": t1 - t0,
         "cpu": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
         "first_stat": res["stat_at"] - t0, "snapshot": node.get("snapshot"), "phases": ph,
         "dataset_files": rep["dataset"]["files"], "opened_from": rep["opened_from"],
         "hwm_sampled_kib": hwm.kib, "result": res, "warnings": []}
    m = CPU.search(daemon_log)
    r["daemon_cpu"] = float(m.group(1)) if m else None
    indexed = ph.get("index.written", ph.get("snapshot.ready"))  # the index the shim maps is whole from then
    if indexed is not None:
        r["whole_index"] = indexed - t0
    if "snapshot.start" in ph and "snapshot.done" in ph:
        r["walk"] = ph["snapshot.done"] - ph["snapshot.start"]
    r["daemon_outlived_launcher_s"] = None if daemon_gone is None else max(0.0, daemon_gone - t1)
    end = daemon_gone or ph.get("daemon.reaped") if daemon_gone is not None else None
    if "daemon.stopping" in ph and end:
        r["teardown"] = end - ph["daemon.stopping"]
    if (r["daemon_outlived_launcher_s"] or 0) > 0.2:
        r["warnings"].append(f"the launcher exited {r['daemon_outlived_launcher_s']:.1f} s before its daemon had "
                             f"finished its tear-down (the daemon's CPU is added to the job's from its log)")
        r["cpu"] += r["daemon_cpu"] or 0.0
    if indexed is not None and res["stat_at"] < indexed:
        early = rep.get("pfs_before_index") or {}
        if early.get("metadata") or early.get("opens"):  # the shim's bounded wait, then the PFS, counted
            r["stat_from_pfs_before_index"] = True
        else:  # not counted as such: the shim lost its daemon
            r["stat_before_index"] = True
            r["warnings"].append(f"the command's stat returned {indexed - res['stat_at']:.1f} s before "
                                 f"the index was written and was not counted as a call before the index: the shim "
                                 f"lost its daemon (report: {rep.get('pfs_daemon_lost')}, metadata "
                                 f"{rep.get('metadata')})")
    if "command.end" in ph:
        r["tail"] = t1 - ph["command.end"]
    if rep["dataset"]["files"] != args.files:
        r["warnings"].append(f"the report's dataset has {rep['dataset']['files']} files, not {args.files}")
    if str(node.get("snapshot", "")).startswith("failed"):
        r["warnings"].append(f"snapshot {node['snapshot']}")
    if mode == "stage":
        if "error" in res:
            r["warnings"].append(res["error"])
        elif "snapshot.start" in ph and res.get("staged"):
            r["staging_window"] = res["staged_done_at"] - ph["snapshot.start"]
            r["staging_rate"] = res["staged"] / r["staging_window"]
            if res["staged"] < args.files:
                r["warnings"].append(f"read-ahead: {res['why_done']}")
        kib = [k for k in (res.get("daemon_hwm_kib"), hwm.kib) if k]
        r["hwm_kib"] = max(kib) if kib else None
        ram = rep["opened_from"].get("ram", {}).get("opens", 0)
        if ram < (1 + args.per_open_rounds) * args.sample_n:
            r["warnings"].append(f"the per-open passes opened {ram} files from the RAM tier, not "
                                 f"{(1 + args.per_open_rounds) * args.sample_n} "
                                 f"(opened from: {rep['opened_from']})")
            r["per_open_suspect"] = True
    left = [d for d in glob.glob(f"/dev/shm/monarch-{os.getuid()}/{job}*")]
    if left:
        r["warnings"].append(f"left behind in /dev/shm: {left}")
    for w in r["warnings"]:
        print(f"  warning ({tag}): {w}", flush=True)
    return r


def wait_gone(pid: int | None, timeout: float) -> float | None:
    """time.time() when process ``pid`` (the daemon, after its launcher exited) was seen gone,
    polled every 0.05 s; 0.0 if it was gone already (its launcher reaped it); None if unknown."""
    if pid is None:
        return None
    deadline, first = time.time() + timeout, True
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                alive = f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            alive = False
        if not alive:
            return 0.0 if first else time.time()
        first = False
        time.sleep(0.05)
    return None


def run_direct(work: Path, root: Path, args) -> dict:
    proc, _, wall, cpu = timed([sys.executable, "-c", COMMAND, "direct", file_path(root, args.files // 2, args.dirs),
                                str(work / "sample.txt")], args.timeout, capture_output=True, text=True,
                               env=child_env(), cwd=REPO)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"the direct pass failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):]) | {"wall": wall, "cpu": cpu}


def on_access_config(work: Path, shm: Path) -> Path:
    """The shipped defaults with ``staging.policy: on-access`` and the tiers kept (``keep:
    true``): a job saves its snapshot for the next only beside kept copies, and the on-access
    job (a stat, nothing staged) leaves the index the reused job starts from. The RAM tier's
    base is the benchmark's own directory in /dev/shm, removed at its end: a kept tier in the
    shared /dev/shm would outlive the benchmark, and a kept tier of this dataset left there by
    anything else would be adopted (a stat per copy) by the "first" job."""
    text = (REPO / "monarch" / "config" / "defaults.yaml").read_text()
    for line in ("policy: read-ahead", "keep: false", "path: /dev/shm\n"):
        if line not in text:
            raise SystemExit(f"bench_million: monarch/config/defaults.yaml no longer says {line.strip()!r}")
    (shm / "tiers").mkdir(exist_ok=True)
    path = work / "on-access.yaml"
    path.write_text(text.replace("policy: read-ahead", "policy: on-access").replace("keep: false", "keep: true")
                    .replace("path: /dev/shm\n", f"path: {shm / 'tiers'}\n"))
    return path


# --------------------------------------------------------------------------- figures


def fig(values: list, unit: str, scale: float = 1.0, digits: int = 3) -> str:
    vals = [v * scale for v in values if v is not None]
    if not vals:
        return "n/a"
    med = statistics.median(vals)
    text = f"{med:,.{digits}f} {unit}".strip()
    if len(vals) > 1:
        text += f" [{min(vals):,.{digits}f}-{max(vals):,.{digits}f}]"
    return text


def ratio(a: list, b: list) -> float | None:
    a, b = [v for v in a if v is not None], [v for v in b if v is not None]
    return statistics.median(a) / statistics.median(b) if a and b and statistics.median(b) else None


def rows(runs: list[dict], args) -> list[dict]:
    """The table: each row a figure, its baseline, their ratio and the issue's target."""
    def col(kind: str, key: str) -> list:
        return [r[kind].get(key) for r in runs]

    def sub(kind: str, key: str) -> list:
        return [r[kind]["result"].get(key) for r in runs]

    n = args.files
    find = col("find", "wall")
    out = []

    def row(name, values, unit, base, base_values, base_unit, target, op, limit, scale=1.0, digits=3,
            why=None, base_scale=1.0):
        rat = ratio([v * scale if v is not None else None for v in values],
                    [v * base_scale if v is not None else None for v in base_values]) if base_values else None
        met = None if rat is None or op is None else (rat <= limit if op == "<=" else rat >= limit)
        out.append({"row": name, "figure": fig(values, unit, scale, digits) if not why else f"n/a ({why})",
                    "baseline": f"{base}: {fig(base_values, base_unit, base_scale, digits)}" if base else "-",
                    "ratio": None if why else rat, "target": target, "met": None if why else met})

    find_cpu = col("find", "cpu")
    out.append({"row": "find DIR -type f (wall, CPU-s)", "figure": f"{fig(find, 's')}, cpu {fig(find_cpu, 's')}",
                "baseline": "-", "ratio": None, "target": "", "met": None})
    def gave_up(kind: str) -> str | None:
        if any(r[kind].get("stat_before_index") for r in runs):
            return "the shim lost its daemon: the stat went to the PFS uncounted as early; see the warnings"
        return None

    def early(kind: str) -> str:
        n = sum(1 for r in runs if r[kind].get("stat_from_pfs_before_index"))
        return f" ({n} of {len(runs)} answered by the PFS before the index, counted)" if n else ""

    row("start-up to first stat: read-ahead, first job" + early("stage"), col("stage", "first_stat"), "s", "find",
        find, "s", "<= 2x find", "<=", 2, why=gave_up("stage"))
    row("start-up to first stat: policy on-access" + early("onaccess"), col("onaccess", "first_stat"), "s", "find",
        find, "s", "<= 2x find", "<=", 2, why=gave_up("onaccess"))
    reused = [r["reuse"] for r in runs]
    why = gave_up("reuse") or (None if all(str(r.get("snapshot", "")).startswith("reused") for r in reused) else
                               f"the snapshot was not reused: {reused[0].get('snapshot')}")
    row("start-up to first stat: saved index reused" + early("reuse"), col("reuse", "first_stat"), "s", "find", find,
        "s", "<= 2x find", "<=", 2, why=why)
    row("to the whole index (written), first job", col("stage", "whole_index"), "s", "find", find, "s",
        "<= 5x find", "<=", 5)
    row("  same, policy on-access", col("onaccess", "whole_index"), "s", "find", find, "s", "<= 5x find", "<=", 5)
    row("walk per file (daemon, on-access job)", col("onaccess", "walk"), "us", "find", find, "us",
        "", None, 0, scale=1e6 / n, digits=2, base_scale=1e6 / n)
    mem = [v * 1024 / n if v else None for v in col("stage", "hwm_kib")]
    out.append({"row": "daemon peak memory (VmHWM) per file", "figure": fig(mem, "B", digits=0), "baseline": "-",
                "ratio": None, "target": "<= 300 B",
                "met": statistics.median([v for v in mem if v]) <= 300 if any(mem) else None})
    idx = [v / n if v else None for v in sub("stage", "index_bytes")]
    out.append({"row": "index size per file", "figure": fig(idx, "B", digits=0), "baseline": "-",
                "ratio": None, "target": "", "met": None})
    row("staging rate (read-ahead, walk included)", col("stage", "staging_rate"), "files/s", "4 x cp -r to /dev/shm",
        col("copy", "files_per_s"), "files/s", ">= 0.5x", ">=", 0.5, digits=0)
    suspect = any(r["stage"].get("per_open_suspect") for r in runs)
    row(f"per open ({args.sample_n} files, {args.per_open_rounds} passes), staged", sub("stage", "per_open_s"), "us",
        "direct, interleaved", sub("stage", "direct_per_open_s"), "us", "<= 1.1x", "<=", 1.1, scale=1e6, digits=2,
        base_scale=1e6, why="the opens were not served from the RAM tier: see the warnings" if suspect else None)
    row("  its CPU (the reading thread's), staged", sub("stage", "per_open_cpu_s"), "us", "direct",
        sub("stage", "direct_per_open_cpu_s"), "us", "", None, 0, scale=1e6, digits=2, base_scale=1e6,
        why="the opens were not served from the RAM tier: see the warnings" if suspect else None)
    row("tear-down (daemon stopping -> gone)", col("stage", "teardown"), "s", "rm -rf of the copy",
        col("copy", "rm_wall"), "s", "<= 1.5x", "<=", 1.5)
    job = col("stage", "wall")
    base = [r["find"]["wall"] + r["copy"]["wall"] + r["copy"]["rm_wall"] for r in runs]
    row("whole read-ahead job, launch -> exit (wall)", job, "s", "find + 4 x cp + rm", base, "s", "", None, 0)
    cpu = col("stage", "cpu")
    bcpu = [r["find"]["cpu"] + r["copy"]["cpu"] + r["copy"]["rm_cpu"] for r in runs]
    row("  its CPU-s (launcher + daemon + command)", cpu, "s", "find + 4 x cp + rm", bcpu, "s", "", None, 0)
    out.append({"row": "  of which the daemon's CPU-s", "figure": fig(col("stage", "daemon_cpu"), "s"),
                "baseline": "-", "ratio": None, "target": "", "met": None})
    return out


def print_table(table: list[dict], args) -> None:
    print(f"\n{args.files:,} files of {args.size} in {args.dirs:,} directories; the shipped configuration; "
          f"{args.repeats} repeat(s), median [min-max]; the tree's page cache {args.cache} before find, "
          f"the read-ahead job and the copy (--cache)")
    w = max(len(r["row"]) for r in table)
    wf = max(len(r["figure"]) for r in table)
    wb = max(len(r["baseline"]) for r in table)
    print(f"{'figure':<{w}}  {'value':<{wf}}  {'baseline':<{wb}}  {'ratio':>7}  target")
    for r in table:
        rat = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        met = {True: "  (met)", False: "  (NOT met)", None: ""}[r["met"]]
        print(f"{r['row']:<{w}}  {r['figure']:<{wf}}  {r['baseline']:<{wb}}  {rat:>7}  {r['target']}{met}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1_000_000)
    p.add_argument("--size", default="1KiB", help="bytes per file (default 1KiB)")
    p.add_argument("--dirs", type=int, default=1000, help="class directories (default 1,000)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sample", type=int, default=20000, help="files opened by each per-open pass (default 20,000)")
    p.add_argument("--per-open-rounds", type=int, default=9, help="staged and direct per-open passes, each (default 9)")
    p.add_argument("--keep-tree", metavar="DIR", help="make the tree in DIR and keep it; reuse it if DIR holds it")
    p.add_argument("--workdir", help="scratch directory (default: a new one under /tmp)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed to each job")
    p.add_argument("--cache", choices=["warm", "cold", "as-is"], default="warm",
                   help="the tree's page-cache state before find + the read-ahead job and before the copy "
                        "(default warm: every file read just before; cold: caches dropped, root only)")
    p.add_argument("--out", default=result_path("bench_million.json"),
                   help="the JSON written (default: results/bench_million.json of this checkout)")
    args = parse_with_quick(p, argv, {"files": 2000, "dirs": 20, "repeats": 1, "sample": 500,
                                                "per_open_rounds": 2})
    fresh_bytecode()
    args.size_bytes = parse_size(args.size)
    args.sample_n = min(args.sample, args.files)
    if args.files < 1 or args.dirs < 1 or args.repeats < 1:
        p.error("--files, --dirs and --repeats must be at least 1")
    if args.cache == "cold" and os.geteuid() != 0:
        p.error("--cache cold drops the page cache (/proc/sys/vm/drop_caches): run as root, or use --cache warm")
    work = Path(tempfile.mkdtemp(prefix="bench-million-", dir=args.workdir or "/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="bench-million-", dir="/dev/shm"))
    root = None
    try:
        (work / "tmp").mkdir()
        base = Path(args.keep_tree) if args.keep_tree else work / "tree"
        base.mkdir(parents=True, exist_ok=True)
        root = make_tree(base, args)
        sample = random.Random(0).sample(range(args.files), args.sample_n)
        (work / "sample.txt").write_text("\n".join(file_path(root, i, args.dirs) for i in sample))
        onaccess = on_access_config(work, shm)
        runs = []
        for i in range(args.repeats):
            r = {"cache": [settle_cache(root, args, "find and the read-ahead job")]}
            r["find"] = run_find(root, args)
            r["stage"] = run_monarch(root, work, args, f"r{i}stage", "stage")
            r["direct"] = run_direct(work, root, args)
            r["cache"].append(settle_cache(root, args, "4 x cp"))
            r["copy"] = run_copy(root, shm, args)
            r["onaccess"] = run_monarch(root, work, args, f"r{i}onaccess", "stat", onaccess)
            r["reuse"] = run_monarch(root, work, args, f"r{i}reuse", "stat", onaccess, cold=False)
            runs.append(r)
            s = r["stage"]
            print(f"repeat {i + 1}/{args.repeats}: find {r['find']['wall']:.2f} s; read-ahead job: first stat "
                  f"{s['first_stat']:.2f} s, index {s.get('whole_index', float('nan')):.2f} s, "
                  f"{s['result'].get('staged')} staged ({s['result'].get('why_done')}), job {s['wall']:.2f} s; "
                  f"4 x cp {r['copy']['wall']:.2f} s; on-access first stat {r['onaccess']['first_stat']:.2f} s; "
                  f"reused first stat {r['reuse']['first_stat']:.2f} s", flush=True)
        table = rows(runs, args)
        print_table(table, args)
        out = ready_to_write(args.out)
        out.write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "table": table, "runs": runs},
                                  indent=1, default=str))
        print(f"\nJSON: {out}")
    finally:
        if root is not None:  # the shipped defaults' shared copies of the tree (in /dev/shm) go too
            drop_dataset([str(root)])
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
