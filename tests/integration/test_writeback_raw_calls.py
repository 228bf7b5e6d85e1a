"""System calls made without libc's wrappers under a write-back path (docs/consistency.md, "Calls
Monarch cannot see"): a C program that reaches the kernel by a raw `syscall` instruction (as Rust's
rustix and Go do) and one that calls libc's syscall(), each writing a temporary, fsyncing it,
renaming it over its final name while open, reading it back, removing and making names. Under
`monarch run` each call gives what it gives directly, and the PFS ends with the same tree."""

import os
import subprocess
import sys

import pytest

from support.harness import load, monarch, monarch_env
from support.writeback import published_tree
from test_writeback_jobs import config

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(180)]

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def raw_calls(tmp_path_factory):
    cc = os.environ.get("CC") or "cc"
    exe = str(tmp_path_factory.mktemp("raw") / "raw_calls")
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-o", exe, os.path.join(HERE, "raw_calls.c")], check=True)
    return exe


def job(short_tmp, root, ck, exe, env=None):
    report = os.path.join(short_tmp, "report.json")
    script = f"set -e; {exe} {ck} asm a; {exe} {ck} libc b"
    r = monarch("run", "-c", config(short_tmp, root, ck), "--report", report, "--no-progress", "--",
                "bash", "-c", script, env=env, timeout=120)
    return r, load(report) if os.path.exists(report) else None


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
                    reason="syscall user dispatch: Linux on x86_64")
def test_raw_system_calls_on_write_back_files_give_what_the_kernel_gives(dataset, short_tmp, slow_pfs, raw_calls):
    """Each raw call is answered from the job's view: the rename of a temporary the PFS has not got
    yet succeeds, the renamed name is found and read back, the old one is gone. The PFS takes writes
    at 8 MB/s, so the files are still pending when the calls come (without the dispatch, the raw
    renameat reached the PFS and failed with ENOENT, safetensors' "I/O error")."""
    ds = dataset(files=10)
    direct = os.path.join(short_tmp, "direct")
    os.makedirs(direct)
    for mode, tag in (("asm", "a"), ("libc", "b")):
        subprocess.run([raw_calls, direct, mode, tag], check=True)
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(src)
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=8, open_latency_ms=0)
    r, report = job(short_tmp, ds.root, str(pfs.mountpoint), raw_calls)
    assert r.returncode == 0, r.stderr
    assert "raw_calls asm: ok" in r.stdout and "raw_calls libc: ok" in r.stdout, r.stdout
    wb = report["nodes"][0]["writeback"]
    assert wb["failed"] is None and wb["unpublished"] == {}, wb
    assert published_tree(src) == published_tree(direct)


NO_DISPATCH = os.path.join(os.path.dirname(HERE), "support", "no_dispatch.py")


@pytest.mark.parametrize("why", ["knob", "seccomp"])
def test_without_the_dispatch_the_job_writes_through_and_its_raw_calls_find_their_files(
        dataset, short_tmp, slow_pfs, raw_calls, why):
    """Where raw calls cannot be watched (MONARCH_SHIM_RAW_SYSCALLS=0, or a seccomp filter that refuses
    the dispatch's prctl, as a kernel before 5.11 does), the whole job writes through: the raw renameat
    of the temporary finds it on the PFS, the job exits 0 with the direct run's tree, and it is told
    once, on stderr and in the report. Before, the rename reached the PFS while the temporary was
    still in the node's tier: ENOENT, the file missing (safetensors' and a Trainer's failed save)."""
    ds = dataset(files=10)
    direct = os.path.join(short_tmp, "direct")
    os.makedirs(direct)
    for mode, tag in (("asm", "a"), ("libc", "b")):
        subprocess.run([raw_calls, direct, mode, tag], check=True)
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(src)
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=8, open_latency_ms=0)
    report = os.path.join(short_tmp, "report.json")
    script = f"set -e; {raw_calls} {pfs.mountpoint} asm a; {raw_calls} {pfs.mountpoint} libc b"
    run = ["run", "-c", config(short_tmp, ds.root, str(pfs.mountpoint)), "--report", report, "--no-progress",
           "--", "bash", "-c", script]
    if why == "knob":
        r = monarch(*run, env=monarch_env(MONARCH_SHIM_RAW_SYSCALLS="0"), timeout=120)
    else:
        r = subprocess.run([sys.executable, NO_DISPATCH, sys.executable, "-m", "monarch", *run], env=monarch_env(),
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "raw_calls asm: ok" in r.stdout and "raw_calls libc: ok" in r.stdout, r.stdout
    assert r.stderr.count("fallback (writeback-through)") == 1, r.stderr
    assert ("MONARCH_SHIM_RAW_SYSCALLS=0" if why == "knob" else "refused syscall user dispatch") in r.stderr
    assert "cannot be watched (syscall user dispatch" not in r.stderr  # no process said it again
    assert published_tree(src) == published_tree(direct)
    fallbacks = load(report)["fallbacks"]
    assert [f["reason"] for f in fallbacks].count("writeback-through") == 1, fallbacks  # (and shim-idle: no reads)


def fnv(path):
    h = 1469598103934665603
    with open(path, "rb") as f:
        for b in f.read():
            h = ((h ^ b) * 1099511628211) & (2**64 - 1)
    return h


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall user dispatch: Linux on x86_64")
def test_raw_opens_of_dataset_files_are_served_from_the_tiers_when_asked(dataset, short_tmp, raw_calls):
    """The read side (MONARCH_SHIM_RAW_SYSCALLS=1): a reader that opens and reads its files by raw
    calls (a Rust or Go loader) is served from the tiers as a libc reader is, its opens and bytes
    counted, every byte the source's (without it, its opens went to the PFS unseen)."""
    from support.harness import write_config
    ds = dataset(files=20)
    files = sorted(os.path.join(dp, n) for dp, _, fns in os.walk(ds.root) for n in fns)
    report = os.path.join(short_tmp, "report.json")
    cfg = write_config(short_tmp, ds.root, policy="read-ahead")
    script = f"{raw_calls} read {' '.join(files)} >/dev/null; {raw_calls} read {' '.join(files)}"
    r = monarch("run", "-c", cfg, "--report", report, "--no-progress", "--", "bash", "-c", script,
                env={**os.environ, "MONARCH_SHIM_RAW_SYSCALLS": "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    got = {line.split()[2]: (int(line.split()[0], 16), int(line.split()[1])) for line in r.stdout.splitlines()}
    assert got == {f: (fnv(f), os.path.getsize(f)) for f in files}
    opened = load(report)["opened_from"]
    served = sum(v["opens"] for k, v in opened.items() if k != "pfs")
    assert served >= len(files) and opened["ram"]["bytes"] + opened["ssd"]["bytes"] >= sum(map(os.path.getsize, files)), \
        opened  # (the second pass at least: every file staged by then)


HOOK = r"""
#define _GNU_SOURCE
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
/* as UCX's memory hooks (libucm, loaded with MPICH's and Open MPI's UCX): mmap interposed, the
 * original made by syscall() */
void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
    return (void *)syscall(SYS_mmap, a, n, prot, flags, fd, off);
}
"""


def test_an_interposer_that_makes_its_original_by_syscall_runs_under_the_shim(dataset, short_tmp, tmp_path):
    """Another preloaded library whose mmap wrapper calls syscall(SYS_mmap) as its original (UCX's
    libucm, which Lightning's and MPI's imports load): its call reaches the kernel once. Before, the
    shim's syscall() sent it back to mmap, which led to the hook again, until the stack overflowed."""
    hook = str(tmp_path / "libhook.so")
    src = tmp_path / "hook.c"
    src.write_text(HOOK)
    subprocess.run([os.environ.get("CC") or "cc", "-O2", "-shared", "-fPIC", "-o", hook, str(src)], check=True)
    ds = dataset(files=5)
    ck = os.path.join(short_tmp, "ck")
    os.makedirs(ck)
    script = ("import mmap, os, sys; m = mmap.mmap(-1, 1 << 20); m[:5] = b'hello'; "
              "open(os.path.join(sys.argv[1], 'x'), 'wb').write(m[:5]); print('mapped')")
    r = monarch("run", "-c", config(short_tmp, ds.root, ck), "--no-progress", "--", sys.executable, "-c", script, ck,
                env={**os.environ, "LD_PRELOAD": hook}, timeout=120)
    assert r.returncode == 0 and "mapped" in r.stdout, r.stderr[-2000:]
    with open(os.path.join(ck, "x"), "rb") as f:
        assert f.read() == b"hello"


@pytest.fixture(scope="module")
def omp_saves(tmp_path_factory):
    cc = os.environ.get("CC") or "cc"
    exe = str(tmp_path_factory.mktemp("omp") / "omp_saves")
    r = subprocess.run([cc, "-O2", "-Wall", "-Werror", "-fopenmp", "-pthread", "-o", exe,
                        os.path.join(HERE, "omp_saves.c")], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"no OpenMP compiler here: {r.stderr[-300:]}")
    return exe


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall user dispatch: Linux on x86_64")
def test_an_openmp_team_costs_no_signal_a_region_and_its_master_still_renames_raw(
        dataset, short_tmp, slow_pfs, omp_saves):
    """An OpenMP team's 6 x 300 parallel regions, a save after each 300 (a temporary written through libc by
    another thread, renamed by the master with a raw renameat, then stat'ed raw): libgomp's own futex
    calls pause their thread, so the whole job answers a few raw calls a save, not a few a region
    (before: every futex of the team a SIGSYS, thousands), and each raw rename after the write-back
    calls still finds its temporary in the node's tier (the PFS takes 8 MB/s: it is still pending)."""
    ds = dataset(files=10)
    rounds, regions = 6, 300
    direct = os.path.join(short_tmp, "direct")
    os.makedirs(direct)
    subprocess.run([omp_saves, direct, str(rounds), str(regions), str(1 << 20)], check=True, timeout=120)
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(src)
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=8, open_latency_ms=0)
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", config(short_tmp, ds.root, str(pfs.mountpoint)), "--report", report, "--no-progress",
                "--", omp_saves, str(pfs.mountpoint), str(rounds), str(regions), str(1 << 20), timeout=180)
    assert r.returncode == 0, r.stderr
    assert f"omp_saves: ok {rounds} rounds" in r.stdout
    assert published_tree(src) == published_tree(direct)
    raw = load(report)["raw_calls"]
    assert raw["by_call"].get("renameat") == rounds and raw["by_call"].get("newfstatat", 0) >= rounds, raw
    assert raw["paused"] >= 1, raw
    assert raw["by_call"].get("futex", 0) <= 4 * rounds, raw  # the team's regions alone make thousands
