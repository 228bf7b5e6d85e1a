"""What ``monarch run`` says is true (issue 22): the bytes numpy really read, and a warning when
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
