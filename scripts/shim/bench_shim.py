#!/usr/bin/env python3
"""Shim micro-benchmark: what LD_PRELOAD of the Monarch shim costs per call.

Measured, each as the median of several interleaved runs (one fresh process per run):

  hit        open+read+close of small *staged* files through the shim: the app opens the
             dataset path, the shim opens the copy in the RAM tier (every open a tier hit,
             no daemon involved), against the app opening that same copy directly without
             the shim. The difference is the shim's added cost per open.
  pass-open  open+read+close of small files *outside* the dataset roots, with and without
             the shim: the pass-through overhead of a non-managed open.
  pass-read  many small pread calls on one fd outside the roots, with and without the
             shim: the pass-through overhead of the read wrappers (which count bytes).
  pass-write many small pwrite calls overwriting 8 MiB of one file outside the roots, with and
             without the shim: the pass-through overhead of the write wrappers (their write-back
             hook, with no write-back path configured); the file's digest the same either way.

  zhit       (--compressed) open+read+close of the same files stored only as zstd frames at
             <tier>/.z/<key> (no raw copy): the shim decodes each into a sealed memfd in the
             application's process (shim_zstd.c), against "hit" (the raw copy) and against the
             codec's own time, measured in the C driver: each frame read into memory once, then
             ZSTD_decompressDCtx into a reused buffer (libzstd.so.1 dlopen'ed as the shim does).
             "beyond codec" = zhit - hit - codec: what a compressed hit costs beyond the
             decompression itself (memfd, mappings, seals, the probe's miss).

Each is measured by a tiny C driver (the cost of the calls themselves) and by a Python
driver (what a Python data loader sees: open(), read(), close()).

    python scripts/shim/bench_shim.py [--files 2000] [--size 4KiB] [--runs 7] [--writes 200000 --write-size 4096]
    python scripts/shim/bench_shim.py --compressed --files 500 --size 64KiB --content compressible [--level 3]
    python scripts/shim/bench_shim.py --compare OLD.so   # another build's staged hit in the same runs
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit, what the benchmarks share
import benchkit  # noqa: E402,F401  (this checkout's monarch and tests/ first on the path)

from benchkit.content import text  # noqa: E402
from benchkit.options import parse_with_quick, ready_to_write, result_path  # noqa: E402
from monarch import protocol  # noqa: E402
from monarch.node.snapshot.snapshot import take_snapshot  # noqa: E402
from monarch.node.tiers.codecs import DEFAULT_LEVEL  # noqa: E402
from monarch.tools.workload import _compressible, parse_size  # noqa: E402

TIER_SLOT = protocol.tier_slot(0)

C_DRIVER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 16) /* read size of "files"; "zcodec" sums its output in the same chunks */
#define WSPAN (8 << 20)  /* "writes" cycles over this much of its file */

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

/* "full": FNV-1a 64 over every byte (a verification run, untimed); else the last byte of each chunk */
static int full;
static uint64_t fnv = 14695981039346656037ULL;
static void account(const unsigned char *b, size_t r, unsigned long long *sum)
{
    if (full)
        for (size_t i = 0; i < r; i++) fnv = (fnv ^ b[i]) * 1099511628211ULL;
    else
        *sum += b[r - 1];
}

static char **read_list(const char *list, size_t *n)
{
    FILE *f = fopen(list, "r");
    if (!f) { perror(list); exit(2); }
    char **paths = NULL; size_t cap = 0; char line[4096];
    *n = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (*n == cap) { cap = cap ? 2 * cap : 1024; paths = realloc(paths, cap * sizeof *paths); }
        paths[(*n)++] = strdup(line);
    }
    fclose(f);
    return paths;
}

/* the codec alone: each frame read into memory once, then ZSTD_decompressDCtx into one reused
 * buffer, libzstd.so.1 dlopen'ed as the shim does (zstd.h's stable API, declared here) */
static int zcodec(char **paths, size_t n, int passes)
{
    void *lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "libzstd.so.1: %s\n", dlerror()); return 3; }
    void *(*create)(void); size_t (*decompress)(void *, void *, size_t, const void *, size_t);
    unsigned long long (*content_size)(const void *, size_t); unsigned (*is_error)(size_t);
    *(void **)&create = dlsym(lib, "ZSTD_createDCtx");
    *(void **)&decompress = dlsym(lib, "ZSTD_decompressDCtx");
    *(void **)&content_size = dlsym(lib, "ZSTD_getFrameContentSize");
    *(void **)&is_error = dlsym(lib, "ZSTD_isError");
    if (!create || !decompress || !content_size || !is_error) { fprintf(stderr, "libzstd.so.1: too old\n"); return 3; }
    void *dctx = create();
    unsigned char **src = malloc(n * sizeof *src); size_t *len = malloc(n * sizeof *len), *out = malloc(n * sizeof *out);
    size_t cap = 0;
    for (size_t i = 0; i < n; i++) {
        int fd = open(paths[i], O_RDONLY); struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) { perror(paths[i]); return 2; }
        len[i] = (size_t)st.st_size; src[i] = malloc(len[i] ? len[i] : 1);
        if (read(fd, src[i], len[i]) != (ssize_t)len[i]) { perror(paths[i]); return 2; }
        close(fd);
        unsigned long long cs = content_size(src[i], len[i]);
        if (cs >= (0ULL - 2)) { fprintf(stderr, "%s: no content size in the frame\n", paths[i]); return 2; }
        out[i] = (size_t)cs; if (out[i] > cap) cap = out[i];
    }
    unsigned char *dst = malloc(cap ? cap : 1);
    memset(dst, 0, cap); /* its pages faulted in before the clock starts: the codec's time only */
    unsigned long long total = 0, sum = 0, ops = 0;
    double t0 = now();
    for (int p = 0; p < passes; p++)
        for (size_t i = 0; i < n; i++) {
            size_t r = decompress(dctx, dst, cap, src[i], len[i]);
            if (is_error(r) || r != out[i]) { fprintf(stderr, "%s: does not decode\n", paths[i]); return 2; }
            for (size_t o = 0; o < r; o += CHUNK) account(dst + o, r - o < CHUNK ? r - o : CHUNK, &sum);
            total += r; ops++;
        }
    double dt = now() - t0;
    printf("%.1f %llu %llu\n", dt * 1e9 / ops, total, full ? (unsigned long long)fnv : sum);
    return 0;
}

int main(int argc, char **argv)
{
    /* files LIST PASSES [full] | zcodec LIST PASSES [full] | reads|writes FILE CALLS BYTES:
     * prints "<ns per op> <bytes> <checksum>" */
    static unsigned char buf[CHUNK];
    unsigned long long total = 0, sum = 0, ops = 0;
    full = argc == 5 && strcmp(argv[4], "full") == 0;
    if ((argc == 4 || full) && strcmp(argv[1], "zcodec") == 0) {
        size_t n; char **paths = read_list(argv[2], &n);
        return zcodec(paths, n, atoi(argv[3]));
    }
    if ((argc == 4 || full) && strcmp(argv[1], "files") == 0) {
        size_t n; char **paths = read_list(argv[2], &n);
        int passes = atoi(argv[3]);
        double t0 = now();
        for (int p = 0; p < passes; p++)
            for (size_t i = 0; i < n; i++) {
                int fd = open(paths[i], O_RDONLY);
                if (fd < 0) { perror(paths[i]); return 2; }
                ssize_t r;
                while ((r = read(fd, buf, sizeof buf)) > 0) { total += r; account(buf, (size_t)r, &sum); }
                close(fd);
                ops++;
            }
        double dt = now() - t0;
        printf("%.1f %llu %llu\n", dt * 1e9 / ops, total, full ? (unsigned long long)fnv : sum);
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "reads") == 0) {
        int fd = open(argv[2], O_RDONLY);
        if (fd < 0) { perror(argv[2]); return 2; }
        long calls = atol(argv[3]), size = atol(argv[4]);
        off_t end = lseek(fd, 0, SEEK_END) - size, off = 0;
        double t0 = now();
        for (long i = 0; i < calls; i++) {
            ssize_t r = pread(fd, buf, size, off);
            if (r <= 0) { perror("pread"); return 2; }
            total += r; sum += (unsigned char)buf[0];
            off += size; if (off > end) off = 0;
            ops++;
        }
        double dt = now() - t0;
        close(fd);
        printf("%.1f %llu %llu\n", dt * 1e9 / ops, total, sum);
        return 0;
    }
    if (argc == 5 && strcmp(argv[1], "writes") == 0) {
        int fd = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) { perror(argv[2]); return 2; }
        long calls = atol(argv[3]), size = atol(argv[4]);
        if (size <= 0 || size > CHUNK) { fprintf(stderr, "writes: BYTES from 1 to %d\n", CHUNK); return 2; }
        off_t span = (off_t)(WSPAN / size) * size, off;
        for (long i = 0; i < size; i++) buf[i] = (unsigned char)(i * 131 + 7);
        for (off = 0; off < span; off += size) /* the range's pages in place: the loop overwrites only */
            if (pwrite(fd, buf, size, off) != size) { perror("pwrite"); return 2; }
        off = 0;
        double t0 = now();
        for (long i = 0; i < calls; i++) {
            buf[0] = (unsigned char)i; /* each block's last writer shows in the digest */
            ssize_t r = pwrite(fd, buf, size, off);
            if (r != size) { perror("pwrite"); return 2; }
            total += r;
            off += size; if (off >= span) off = 0;
            ops++;
        }
        double dt = now() - t0;
        ssize_t r; /* untimed: the file's bytes, the same with and without the shim */
        for (off = 0; (r = pread(fd, buf, sizeof buf, off)) > 0; off += r)
            for (ssize_t k = 0; k < r; k++) fnv = (fnv ^ buf[k]) * 1099511628211ULL;
        close(fd);
        printf("%.1f %llu %llu\n", dt * 1e9 / ops, total, (unsigned long long)fnv);
        return 0;
    }
    fprintf(stderr, "usage: driver files|zcodec LIST PASSES [full] | driver reads|writes FILE CALLS BYTES\n");
    return 2;
}
"""

PY_DRIVER = r"""
import os, sys, time
mode = sys.argv[1]
if mode == "files":
    paths = open(sys.argv[2]).read().split()
    passes = int(sys.argv[3])
    full = sys.argv[4:] == ["full"]  # a verification run (untimed): a digest of every byte
    if full:
        import hashlib
        h = hashlib.sha256()
    total = s = 0
    t0 = time.perf_counter()
    for _ in range(passes):
        for p in paths:
            with open(p, "rb") as f:
                d = f.read()
            total += len(d); s += d[-1] if d else 0
            if full:
                h.update(d)
    dt = time.perf_counter() - t0
    print(f"{dt * 1e9 / (passes * len(paths)):.1f} {total} {h.hexdigest() if full else s}")
elif mode == "writes":
    import hashlib
    fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    calls, size = int(sys.argv[3]), int(sys.argv[4])
    span = (8 << 20) // size * size  # the C driver's WSPAN
    buf = bytearray((i * 131 + 7) & 255 for i in range(size))
    for off in range(0, span, size):  # the range's pages in place: the loop overwrites only
        os.pwrite(fd, buf, off)
    total = off = 0
    pwrite = os.pwrite
    t0 = time.perf_counter()
    for i in range(calls):
        buf[0] = i & 255  # each block's last writer shows in the digest
        total += pwrite(fd, buf, off)
        off += size
        if off >= span:
            off = 0
    dt = time.perf_counter() - t0
    h = hashlib.sha256()  # untimed: the file's bytes, the same with and without the shim
    off = 0
    while d := os.pread(fd, 1 << 16, off):
        h.update(d); off += len(d)
    os.close(fd)
    print(f"{dt * 1e9 / calls:.1f} {total} {h.hexdigest()}")
else:
    fd = os.open(sys.argv[2], os.O_RDONLY)
    calls, size = int(sys.argv[3]), int(sys.argv[4])
    end = os.fstat(fd).st_size - size
    total = s = off = 0
    pread = os.pread
    t0 = time.perf_counter()
    for _ in range(calls):
        d = pread(fd, size, off)
        total += len(d); s += d[0]
        off += size
        if off > end:
            off = 0
    dt = time.perf_counter() - t0
    print(f"{dt * 1e9 / calls:.1f} {total} {s}")
"""


CONTENTS = ("random", "compressible", "text")
C_ONLY = {"codec"}  # cases only the C driver runs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=2000, help="small files per set (default 2000)")
    p.add_argument("--size", default="4KiB", help="size of each small file (default 4KiB)")
    p.add_argument("--passes", type=int, default=5, help="passes over the files per run (default 5)")
    p.add_argument("--reads", type=int, default=200_000, help="pread calls per run (default 200000)")
    p.add_argument("--read-size", type=int, default=64, help="bytes per pread (default 64)")
    p.add_argument("--writes", type=int, default=200_000, help="pwrite calls per run (default 200000)")
    p.add_argument("--write-size", type=int, default=4096, help="bytes per pwrite, up to 65536 (default 4096)")
    p.add_argument("--runs", type=int, default=9, help="interleaved runs per measurement; the median is shown")
    p.add_argument("--compressed", action="store_true",
                   help="also measure compressed hits: the same files as zstd frames at <tier>/.z/<key> only, "
                        "decoded by the shim in the application's process, against raw hits and the codec alone")
    p.add_argument("--level", type=int, default=DEFAULT_LEVEL,
                   help=f"zstd level of the frames (default {DEFAULT_LEVEL}: the daemon's until it has chosen one)")
    p.add_argument("--content", choices=CONTENTS,
                   help="the files' bytes: random (incompressible), compressible (monarch.tools.workload's images and "
                        "feature maps), text (words); default random, compressible with --compressed")
    p.add_argument("--compare", metavar="LIB",
                   help="another shim library (an earlier build) whose staged hit is measured in the same "
                        "interleaved runs: before and after side by side")
    p.add_argument("--json", default=result_path("bench_shim.json"),
                   help="where to write the figures (default: results/bench_shim.json of this checkout)")
    p.add_argument("--workdir", help="scratch directory (default: a new one in /dev/shm)")
    args = parse_with_quick(p, argv, {"files": 50, "passes": 1, "reads": 1000, "writes": 1000, "runs": 1})
    if not 0 < args.write_size <= 1 << 16:
        p.error(f"--write-size: expected 1 to 65536 bytes, got {args.write_size}")
    if args.content is None:
        args.content = "compressible" if args.compressed else "random"
    return args


def content(kind: str, size: int, i: int) -> bytes:
    if kind == "compressible":
        return _compressible(random.Random(i), size, i)
    if kind == "text":
        return text(size, i)
    return os.urandom(size - 1) + bytes([i % 251])


def make_files(root: Path, rels: list[str], size: int, kind: str = "random") -> None:
    for i, rel in enumerate(rels):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content(kind, size, i))


def write_frames(src: Path, dest: Path, rels: list[str], level: int) -> tuple[int, int]:
    """dest/<rel>: the zstd frame of src/<rel>, as the daemon's codec writes it (content size
    in the header: the shim checks it against the index). Returns (raw bytes, stored bytes)."""
    import zstandard
    cctx = zstandard.ZstdCompressor(level=level, write_content_size=True)
    raw = stored = 0
    for rel in rels:
        data = (src / rel).read_bytes()
        frame = cctx.compress(data)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(frame)
        raw, stored = raw + len(data), stored + len(frame)
    return raw, stored


def libzstd_missing() -> str | None:
    """Why libzstd.so.1 (the library the shim dlopens) does not load here, or None."""
    try:
        ctypes.CDLL("libzstd.so.1")
    except OSError as exc:
        return str(exc)
    return None


def build_driver(work: Path) -> Path | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src, exe = work / "driver.c", work / "driver"
    src.write_text(C_DRIVER)
    subprocess.run([cc, "-O2", "-o", str(exe), str(src), "-ldl"], check=True, timeout=120)  # -ldl: glibc < 2.34
    return exe


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    ns, rest = proc.stdout.split(maxsplit=1)
    return float(ns), rest.strip()


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        from monarch.shim import shim_library
        shim = str(shim_library())
    except Exception as exc:  # the C shim may not exist or not build here
        print(f"bench_shim: no shim to preload: {exc}", file=sys.stderr)
        return 2
    if args.compressed and (why := libzstd_missing()):
        print(f"bench_shim: libzstd.so.1 does not load ({why}): the shim cannot decode in-process; "
              f"the compressed rows are skipped")
        args.compressed = False
    size = parse_size(args.size)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mshim-", dir="/dev/shm")).resolve()
    try:
        return _bench(args, shim, size, work)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _bench(args, shim: str, size: int, work: Path) -> int:
    rels = [f"d{i % 16:02d}/f{i:06d}.bin" for i in range(args.files)]
    zrels = [f"z/{r}" for r in rels]  # the same files again, stored only as frames
    pfs, tier, other = work / "pfs", work / "tier", work / "other"
    make_files(pfs, rels, size, args.content)
    staged = tier / "0"  # the key of root 0's files is "0/<rel>": staged at <tier>/0/<rel>
    shutil.copytree(pfs, staged)
    make_files(other, rels, size)
    big = other / "big.bin"
    big.write_bytes(os.urandom(8 << 20))
    counters = work / "counters"
    roots = {"pfs": (pfs, rels), "tier": (staged, rels), "other": (other, rels)}
    ratio = 0.0
    if args.compressed:
        for rel, zrel in zip(rels, zrels):
            (pfs / zrel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pfs / rel, pfs / zrel)
        frames = tier / ".z" / "0"  # <tier>/.z/<key>, as a compressing tier keeps them
        raw, stored = write_frames(pfs, frames, zrels, args.level)
        ratio = raw / max(1, stored)
        roots.update({"zpfs": (pfs, zrels), "frames": (frames, zrels)})
    lists = {}
    for name, (root, names) in roots.items():
        lists[name] = work / f"{name}.list"
        lists[name].write_text("\n".join(str(root / r) for r in names) + "\n")

    base_env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_") and k != "LD_PRELOAD"}
    index = work / "index"  # the snapshot index, as a daemon writes it (fstat and stat answers)
    take_snapshot((str(pfs),)).write_index(str(index))
    shim_env = dict(base_env, LD_PRELOAD=shim, MONARCH_ROOTS=protocol.format_roots([(0, str(pfs))]),
                    MONARCH_PROBE=protocol.format_probe([(TIER_SLOT, str(tier))]), MONARCH_COUNTERS=str(counters),
                    MONARCH_INDEX=str(index))
    shim_env.pop("MONARCH_SOCKET", None)  # every open is a tier hit: no daemon needed

    drivers = {"py": [sys.executable, "-c", PY_DRIVER]}
    exe = build_driver(work)
    if exe:
        drivers = {"c": [str(exe)], **drivers}
    else:
        print("no C compiler: measuring with the Python driver only (no codec row)")

    passes, reads = str(args.passes), [str(args.reads), str(args.read_size)]
    writes = [str(args.writes), str(args.write_size)]
    # name -> (argv tail, env); pairs below compare a "shim" case with its baseline
    cases = {
        "hit.shim": (["files", str(lists["pfs"]), passes], shim_env),
        "hit.direct": (["files", str(lists["tier"]), passes], base_env),
        "pass-open.shim": (["files", str(lists["other"]), passes], shim_env),
        "pass-open.direct": (["files", str(lists["other"]), passes], base_env),
        "pass-read.shim": (["reads", str(big), *reads], shim_env),
        "pass-read.direct": (["reads", str(big), *reads], base_env),
        "pass-write.shim": (["writes", str(other / "written-shim.bin"), *writes], shim_env),
        "pass-write.direct": (["writes", str(other / "written-direct.bin"), *writes], base_env),
    }
    if args.compare:
        cases["hit.compare"] = (["files", str(lists["pfs"]), passes], dict(shim_env, LD_PRELOAD=args.compare))
    if args.compressed:
        cases["zhit.shim"] = (["files", str(lists["zpfs"]), passes], shim_env)
        cases["codec"] = (["zcodec", str(lists["frames"]), passes], base_env)
    runnable = [(d, c) for d in drivers for c in cases if d == "c" or c not in C_ONLY]
    samples: dict[str, list[float]] = {f"{d}:{c}": [] for d, c in runnable}
    outputs: dict[str, set[str]] = {k: set() for k in samples}
    protocol.create_counters(str(counters))
    for run in range(args.runs):
        for dname, cname in runnable:
            tail, env = cases[cname]
            ns, out = run_once(drivers[dname] + tail, env)
            samples[f"{dname}:{cname}"].append(ns)
            outputs[f"{dname}:{cname}"].add(out)
        print(f"run {run + 1}/{args.runs} done", flush=True)

    # Sanity: the same bytes either way, and every managed open was a tier hit.
    problems = []
    for d in drivers:
        for pair in ("hit", "pass-open", "pass-read", "pass-write"):
            if outputs[f"{d}:{pair}.shim"] != outputs[f"{d}:{pair}.direct"]:
                problems.append(f"{d} {pair}: different bytes with and without the shim")
    zhit_opens = 0
    if args.compressed:
        problems += verify_compressed(drivers, lists, outputs, base_env, shim_env)
        zhit_opens = len(drivers) * (args.runs * args.passes + 1) * args.files  # + 1: the verification pass
    slots = protocol.read_counters(str(counters))
    hit_opens = len(drivers) * args.runs * args.passes * args.files * (2 if args.compare else 1)
    tier_opens = hit_opens + zhit_opens  # the decoded opens are counted under the tier's slot too
    if slots[TIER_SLOT][0] != tier_opens or slots[protocol.SLOT_PFS][0] != 0:
        problems.append(f"expected {tier_opens} tier hits and no PFS opens, the shim counted "
                        f"{slots[TIER_SLOT][0]} tier and {slots[protocol.SLOT_PFS][0]} PFS opens")
    expected_bytes = tier_opens * size
    if slots[TIER_SLOT][1] != expected_bytes:
        problems.append(f"expected {expected_bytes} bytes counted on the tier, the shim counted {slots[TIER_SLOT][1]}")

    med = {k: statistics.median(v) for k, v in samples.items()}
    figures = {}
    print()
    print(f"{args.files} files of {size} B ({args.content}), {args.passes} passes per run; {args.reads} preads of "
          f"{args.read_size} B; {args.writes} pwrites of {args.write_size} B; median of {args.runs} interleaved runs; "
          f"shim {shim}")
    print("us per call: medians of the runs; added: median of the paired differences (shim - direct)")
    print(f"{'driver':>6} {'measurement':<34} {'direct us':>10} {'shim us':>10} {'added us':>9} {'overhead':>9}")
    labels = {"hit": "open+read+close, staged (tier hit)", "pass-open": "open+read+close, outside roots",
              "pass-read": f"pread {args.read_size} B, outside roots",
              "pass-write": f"pwrite {args.write_size} B, outside roots"}
    for d in drivers:
        for pair, label in labels.items():
            direct, shimmed = med[f"{d}:{pair}.direct"] / 1e3, med[f"{d}:{pair}.shim"] / 1e3
            # paired: each run measured both back to back, so the median of the differences
            # cancels the drift of a busy 2-core machine better than a difference of medians
            added = statistics.median(b - a for a, b in zip(samples[f"{d}:{pair}.direct"],
                                                            samples[f"{d}:{pair}.shim"])) / 1e3
            figures[f"{d}:{pair}"] = {"direct_us": direct, "shim_us": shimmed, "added_us": added,
                                      "overhead_pct": 100 * added / direct,
                                      "samples_ns": {"direct": samples[f"{d}:{pair}.direct"],
                                                     "shim": samples[f"{d}:{pair}.shim"]}}
            print(f"{d:>6} {label:<34} {direct:>10.3f} {shimmed:>10.3f} {added:>9.3f} {100 * added / direct:>8.1f}%")
    if args.compare:
        problems += report_compare(args.compare, drivers, samples, outputs, figures)
    print(f"\nshim counters: tier slot {TIER_SLOT}: {slots[TIER_SLOT][0]} opens, {slots[TIER_SLOT][1]} bytes; "
          f"PFS slot: {slots[0][0]} opens")
    zstd = {}
    if args.compressed:
        zstd = report_compressed(args, size, ratio, drivers, samples, figures)
        problems += check_zstd_counters(str(counters), zhit_opens, size)
    for p in problems:
        print(f"PROBLEM: {p}")
    ready_to_write(args.json).write_text(json.dumps({"config": vars(args), "shim": shim, "figures": figures,
                                           "counters": {"tier": slots[TIER_SLOT], "pfs": slots[0], "zstd": zstd},
                                           "problems": problems}, indent=1))
    print(f"wrote {args.json}")
    return 1 if problems else 0


def report_compare(lib: str, drivers, samples, outputs, figures) -> list[str]:
    """The staged hit of another build beside this one's: each against direct, and this one less
    the other, per run paired (the three were measured back to back in every run)."""
    print(f"\nstaged hit, this shim against --compare {lib}")
    print(f"{'driver':>6} {'other us':>10} {'added us':>9} {'this us':>10} {'added us':>9} {'this - other us':>16}")
    problems = []
    for d in drivers:
        direct, this, other = (samples[f"{d}:hit.{c}"] for c in ("direct", "shim", "compare"))
        paired = lambda a, b: statistics.median(y - x for x, y in zip(a, b)) / 1e3  # noqa: E731
        row = {"other_us": statistics.median(other) / 1e3, "other_added_us": paired(direct, other),
               "this_us": statistics.median(this) / 1e3, "this_added_us": paired(direct, this),
               "this_minus_other_us": paired(other, this), "samples_ns": other}
        figures[f"{d}:hit.compare"] = row
        print(f"{d:>6} {row['other_us']:>10.3f} {row['other_added_us']:>9.3f} {row['this_us']:>10.3f} "
              f"{row['this_added_us']:>9.3f} {row['this_minus_other_us']:>16.3f}")
        if outputs[f"{d}:hit.compare"] != outputs[f"{d}:hit.direct"]:
            problems.append(f"{d} hit: the --compare library read other bytes than the copies")
    return problems


def verify_compressed(drivers, lists, outputs, base_env, shim_env) -> list[str]:
    """The bytes of a compressed hit are the raw copy's: the timed runs' cheap sums agree, and one
    untimed pass per driver digests every byte of the raw copies read directly, of the decoded
    opens through the shim and (C) of the codec's output."""
    problems = []
    for d, cmd in drivers.items():
        if outputs[f"{d}:zhit.shim"] != outputs[f"{d}:hit.shim"]:
            problems.append(f"{d} zhit: the compressed hits read other bytes than the raw hits "
                            f"({sorted(outputs[f'{d}:zhit.shim'])} against {sorted(outputs[f'{d}:hit.shim'])})")
        raw = run_once(cmd + ["files", str(lists["tier"]), "1", "full"], base_env)[1]
        decoded = run_once(cmd + ["files", str(lists["zpfs"]), "1", "full"], shim_env)[1]
        if decoded != raw:
            problems.append(f"{d} zhit: digest of the decoded opens {decoded} != the raw copies' {raw}")
        if d == "c":
            codec = run_once(cmd + ["zcodec", str(lists["frames"]), "1", "full"], base_env)[1]
            if codec != raw:
                problems.append(f"c codec: digest of the decoded frames {codec} != the raw copies' {raw}")
    return problems


def check_zstd_counters(counters: str, zhit_opens: int, size: int) -> list[str]:
    """Every compressed hit was decoded by the shim itself (EXTRA_ZSTD_*), none left to a daemon."""
    e = protocol.read_extra_counters(counters)
    opens, nbytes = e[protocol.EXTRA_ZSTD_OPENS], e[protocol.EXTRA_ZSTD_BYTES]
    left, ns, reused = e[protocol.EXTRA_ZSTD_FALLBACKS], e[protocol.EXTRA_ZSTD_NS], e[protocol.EXTRA_ZSTD_REUSED]
    print(f"zstd counters: {opens} opens decoded in the application's process, {nbytes} bytes, {left} left to "
          f"the daemon, {reused} into a reused memfd; {ns / max(1, opens) / 1e3:.1f} us per open from frame open "
          f"to the application's descriptor")
    if opens != zhit_opens or nbytes != zhit_opens * size or left != 0:
        return [f"expected {zhit_opens} opens ({zhit_opens * size} bytes) decoded by the shim and none left to "
                f"the daemon, the shim counted {opens} ({nbytes} bytes) and {left} left"]
    return []


def report_compressed(args, size: int, ratio: float, drivers, samples, figures) -> dict:
    """The zhit rows: raw hit, compressed hit, the codec alone (C driver) and what is left
    beyond it; per run paired, as the rows above."""
    codec = samples.get("c:codec")
    print(f"\ncompressed hits: the same {args.files} files as zstd level {args.level} frames, ratio {ratio:.2f}; "
          f"beyond codec = median over runs of (zhit - hit - codec), codec from the C driver")
    print(f"{'driver':>6} {'raw hit us':>10} {'zhit us':>10} {'codec us':>9} {'beyond us':>10} {'codec GB/s':>11}")
    for d in drivers:
        hit, zhit = samples[f"{d}:hit.shim"], samples[f"{d}:zhit.shim"]
        row = {"hit_us": statistics.median(hit) / 1e3, "zhit_us": statistics.median(zhit) / 1e3,
               "ratio": ratio, "level": args.level, "content": args.content, "size": size}
        if codec:
            row["codec_us"] = statistics.median(codec) / 1e3
            row["beyond_codec_us"] = statistics.median(z - h - c for h, z, c in zip(hit, zhit, codec)) / 1e3
            row["codec_gbps"] = size / statistics.median(codec)
        figures[f"{d}:zhit"] = dict(row, samples_ns={"hit": hit, "zhit": zhit, "codec": codec or []})
        cells = [f"{row[k]:>{w}.{p}f}" if k in row else f"{'-':>{w}}"
                 for k, w, p in (("codec_us", 9, 1), ("beyond_codec_us", 10, 1), ("codec_gbps", 11, 2))]
        print(f"{d:>6} {row['hit_us']:>10.1f} {row['zhit_us']:>10.1f} {' '.join(cells)}")
    return {"ratio": ratio}


if __name__ == "__main__":
    sys.exit(main())
