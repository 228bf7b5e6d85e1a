"""What ``monarch run`` says is true: the bytes numpy really read, and a warning when
the command's readers bypassed the shim."""

import hashlib
import json
import os
import shutil
import sys

import pytest

from support.harness import load, monarch, reader, write_config

pytestmark = pytest.mark.integration

WARNING = "monarch: warning: the dataset was not read through Monarch"

# np.load of every file, three times, with the bytes the process read by read/pread (rchar)
# around the loads: what the PFS would have served without Monarch
NUMPY_READER = """
import hashlib, json, sys, numpy
paths, warm, out = sys.argv[1:-2], sys.argv[-2], sys.argv[-1]
def rchar():
    with open("/proc/self/io") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("rchar:"))
numpy.load(warm)                          # numpy's lazy imports, outside the dataset and the count
a = rchar(); probe = rchar() - a          # what reading /proc/self/io itself adds
digests, before = [], rchar()
for _ in range(3):
    digests.append([hashlib.md5(numpy.load(p).tobytes()).hexdigest() for p in paths])
read = rchar() - before - probe
with open(out, "w") as f:
    json.dump({"digests": digests, "rchar": read}, f)
"""


def test_numpy_load_is_counted_and_the_saving_is_never_a_false_loss(short_tmp):
    """20 .npy files read 3 times with np.load (os.dup = fcntl64 F_DUPFD_CLOEXEC, fdopen, fread):
    the report's bytes are what the process read, and the saving is positive."""
    np = pytest.importorskip("numpy")
    root = os.path.join(short_tmp, "npy")
    os.makedirs(root)
    paths, expected = [], []
    for i in range(20):
        arr = np.arange(50_000, dtype=np.float64) * (i + 1)
        paths.append(os.path.join(root, f"{i:02d}.npy"))
        np.save(paths[-1], arr)
        expected.append(hashlib.md5(arr.tobytes()).hexdigest())
    files_bytes = sum(os.path.getsize(p) for p in paths)
    warm = os.path.join(short_tmp, "warm.npy")  # not under the root
    np.save(warm, np.zeros(10))
    out = os.path.join(short_tmp, "read.json")
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", write_config(short_tmp, root), "--report", report, "--",
                sys.executable, "-c", NUMPY_READER, *paths, warm, out)
    assert r.returncode == 0, r.stderr
    with open(out) as f:
        got = json.load(f)
    assert got["digests"] == [expected] * 3
    rep = load(report)
    pfs = rep["pfs"]
    assert sum(c["opens"] for c in rep["opened_from"].values()) == 60
    assert pfs["staging_bytes"] == files_bytes  # the PFS read once
    # Python's header reads and numpy's fread are counted; what stdio reads inside glibc to
    # serve fseek is not (at most one stdio buffer per FILE): the figures are tight lower
    # bounds, marked so, never above what was read
    true_saved = got["rchar"] - files_bytes
    assert 3 * files_bytes <= pfs["without_monarch_bytes"] <= got["rchar"]
    assert got["rchar"] - pfs["without_monarch_bytes"] <= 60 * 4096
    assert {"without_monarch_bytes", "saved_bytes", "saved_fraction"} <= set(pfs["lower_bounds"])
    assert 0 < pfs["saved_bytes"] <= true_saved
    assert 0.6 < pfs["saved_fraction"] <= round(true_saved / got["rchar"], 4)
    assert "saved (est.)            : ≥" in r.stderr and "saved (est.)            : -" not in r.stderr
    assert rep["processes_with_shim"] == 1 and WARNING not in r.stderr


def test_a_command_that_drops_ld_preload_gets_a_warning(dataset, short_tmp):
    ds = dataset(files=50, size="4KiB")
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--",
                shutil.which("env"), "-u", "LD_PRELOAD", *reader(ds, epochs=1, workers=1))
    assert r.returncode == 0, r.stderr  # the reader checked every digest on the PFS
    rep = load(report)
    assert rep["processes_with_shim"] == 0
    assert sum(c["opens"] for c in rep["opened_from"].values()) == 0
    assert r.stderr.count(WARNING) == 1
    line = next(l for l in r.stderr.splitlines() if l.startswith(WARNING))
    assert "no process of the command ran with the Monarch shim" in line and "env -u LD_PRELOAD" in line
    assert "shim      : active in 0 processes" in r.stderr


def test_a_command_through_the_shim_gets_no_warning(dataset, short_tmp):
    ds = dataset(files=50, size="4KiB")
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--",
                *reader(ds, epochs=1, workers=2))
    assert r.returncode == 0, r.stderr
    rep = load(report)
    assert rep["processes_with_shim"] >= 1
    assert sum(c["opens"] for c in rep["opened_from"].values()) == 50
    assert WARNING not in r.stderr


# -- readers whose bytes the shim does not all see: stdio (fopen + fread) and mmap -----------------

def _row(stderr: str, place: str) -> str:
    """The report's row of one place in the "opened from" table."""
    table = stderr.split("\nopened from ", 1)[1].split("\nPFS traffic\n", 1)[0]
    (row,) = [line for line in table.splitlines() if line.split()[:1] == [place]]
    return row


def test_an_fread_reader_gets_the_bytes_it_read_never_unknown(dataset, short_tmp):
    """md5sum reads each file with fopen + fread (as DALI with dont_use_mmap): every byte fread
    delivered is counted and printed, marked as a lower bound (stdio may also read on its own)."""
    ds = dataset(files=30, size="16KiB")
    paths = [os.path.join(ds.root, rel) for rel in sorted(ds.files)]
    config = write_config(short_tmp, ds.root)
    report = os.path.join(short_tmp, "report.json")
    # run twice over the files: the second pass is served from the RAM tier
    r = monarch("run", "-c", config, "--report", report, "--", "sh", "-c", 'md5sum "$@" && md5sum "$@"', "sh", *paths)
    assert r.returncode == 0, r.stderr
    want = {hashlib.md5(open(p, "rb").read()).hexdigest() + "  " + p for p in paths}
    assert set(r.stdout.splitlines()) == want and len(r.stdout.splitlines()) == 60
    rep = load(report)
    counted = {name: c for name, c in rep["opened_from"].items() if c["opens"]}
    assert sum(c["bytes"] for c in counted.values()) == 2 * ds.total  # what fread delivered: every byte
    assert all(c["opens_stdio"] == c["opens_uncounted"] == c["opens"] for c in counted.values())
    from monarch.sizes import human
    for name, c in counted.items():
        row = _row(r.stderr, name)
        assert "unknown" not in row and f"≥ {human(c['bytes'])}" in row, row


def test_an_mmap_reader_gets_a_range_that_holds_what_it_read(dataset, short_tmp):
    """The workload's mmap reader maps every file whole and copies it out: no byte is read with
    read(), so each place's bytes are a range from 0 to the lengths mapped, never "unknown"."""
    ds = dataset(files=40, size="8KiB")
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "-c", write_config(short_tmp, ds.root), "--report", report, "--",
                *reader(ds, epochs=2, workers=2, reader_kind="mmap"))
    assert r.returncode == 0, r.stderr
    rep = load(report)
    served = {name: c for name, c in rep["opened_from"].items() if c["opens"]}
    assert sum(c["opens"] for c in served.values()) == 80 and "unknown" not in r.stderr
    # the bytes the reader copied out of its maps (2 epochs of the dataset) are inside the range
    assert sum(c["bytes"] for c in served.values()) <= 2 * ds.total <= sum(c["bytes"] + c["mapped_bytes"]
                                                                         for c in served.values())
    from monarch.sizes import human_range
    for name, c in served.items():
        assert human_range(c["bytes"], c["bytes"] + c["mapped_bytes"]) in _row(r.stderr, name)
    assert "were read through mmap or stdio" in r.stderr


@pytest.mark.fuse
def test_a_too_small_tier_under_an_mmap_reader_gives_a_pfs_range_holding_the_pfs_own_count(dataset, short_tmp,
                                                                                            slow_pfs):
    """Tiers that hold a few files: the rest is mapped from the PFS at every epoch. The PFS total
    the report prints is a range, and the bytes the emulated PFS itself served are inside it."""
    ds = dataset(files=40, size="8KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=0)
    report = os.path.join(short_tmp, "report.json")
    config = write_config(short_tmp, pfs.mountpoint, ram="48KiB", ssd="48KiB")
    pfs.reset_counters()
    r = monarch("run", "-c", config, "--report", report, "--",
                *reader(ds.__class__(pfs.mountpoint, ds.manifest, ds.files, ds.total), epochs=3, workers=2,
                        reader_kind="mmap"))
    assert r.returncode == 0, r.stderr
    truth = pfs.counters()["bytes"]
    p = load(report)["pfs"]
    assert truth > 1.5 * ds.total  # most files were mapped from the PFS at each epoch
    assert p["total_bytes"] <= truth <= p["at_most"]["total_bytes"]
    assert p["reads_of_dataset"] <= truth / ds.total <= p["at_most"]["reads_of_dataset"]
    from monarch.sizes import human
    assert (f"total                   : {human(p['total_bytes'])} to {human(p['at_most']['total_bytes'])} = "
            f"{p['reads_of_dataset']:.2f}x to {p['at_most']['reads_of_dataset']:.2f}x the dataset") in r.stderr
