"""Monarch as the field installs it: ``pip wheel .`` makes a manylinux2014 wheel holding every C
library, built once for glibc 2.17; installed in a fresh virtual environment on a node with no C
compiler, ``monarch run`` and a 2-node ``mpiexec ... monarch serve`` work and compile nothing (the
user's cache stays empty), the peers using the packaged C data path.

The wheel is built as a user builds it (build isolation: its build dependencies, ziglang and
mpich, installed apart by pip); the virtual environment sees the packages of the environment
running the tests (no env, a venv or a conda prefix) for Monarch's dependencies (no download),
after its own Monarch, installed from the wheel alone."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.envs import make_env_seeing_this_python
from support.harness import REPO, load, sharded_config, write_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

LIBRARIES = ("shim/libmonarch_shim.so", "frontdoor/libmonarch_front_door.so", "node/snapshot/libmonarch_walker.so",
             "node/tiers/libmonarch_remover.so", "cluster/libmonarch_datapath_mpich.so")
SOURCES = ("shim/monarch_shim.c", "frontdoor/front_door.c", "node/snapshot/walker.c", "node/tiers/remover.c",
           "cluster/datapath.c")
# every library packaged and current: what shim_library, OptionalLibrary and the data path load
CHECK_PACKAGED = f"""
import pathlib, monarch
from monarch.native.build import installed_current
from monarch.shim import shim_library
root = pathlib.Path(monarch.__file__).parent
for lib, src in zip({LIBRARIES!r}, {SOURCES!r}):
    assert installed_current(root / lib, root / src), lib
assert shim_library() == root / {LIBRARIES[0]!r}, shim_library()
print(root)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if platform.machine() != "x86_64":
        pytest.skip("the wheel is checked on x86_64")
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        if os.path.exists(os.path.join(REPO, name)):
            shutil.copy(os.path.join(REPO, name), src / name)
    shutil.copytree(os.path.join(REPO, "monarch"), src / "monarch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.sha256", ".*"))
    out = work / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w",
                        str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh virtual environment with Monarch installed from the wheel (nothing else of it); its
    dependencies are the running environment's."""
    env_dir = make_env_seeing_this_python(tmp_path_factory.mktemp("venv") / "v")
    r = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return env_dir


def no_compiler_env(venv, home, tmp, tools=()):
    """An environment with no C compiler: PATH is the venv's bin and a directory of ``tools``
    (linked from this Python's bin), ``CC`` names nothing, HOME is ``home`` (its cache empty)."""
    bin_dir = Path(tmp) / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        found = Path(sys.executable).parent / tool
        os.symlink(found if found.exists() else shutil.which(tool), bin_dir / tool)
    path = os.pathsep.join([str(venv / "bin"), str(bin_dir)])
    for cc in ("cc", "gcc", "clang", "c99"):
        assert shutil.which(cc, path=path) is None, cc
    return {"HOME": str(home), "PATH": path, "TMPDIR": str(tmp), "CC": "/nonexistent/cc", "LANG": "C.UTF-8"}


def cache_files(home):
    cache = Path(home) / ".cache" / "monarch"
    return sorted(str(p) for p in cache.rglob("*")) if cache.exists() else []


def test_the_wheel_is_manylinux2014_and_holds_every_library(wheel):
    assert wheel.name.endswith("-py3-none-manylinux2014_x86_64.whl"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert all(f"monarch/{lib}" in names for lib in LIBRARIES), sorted(n for n in names if n.endswith(".so"))
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    m = re.search(r'is consistent with the following platform tag: "manylinux_2_(\d+)_x86_64"', text)
    assert m and int(m[1]) <= 17, text  # manylinux2014 = manylinux_2_17, or older
    assert "libmpi" not in text and "libzstd" not in text, text  # neither bundled nor linked: loaded at run time


def test_installed_on_a_node_with_no_compiler_a_job_compiles_nothing(venv, dataset, short_tmp, tmp_path):
    ds = dataset(files=150, size="8KiB")
    home, tmp, work = tmp_path / "home", tmp_path / "tmp", tmp_path / "work"
    for d in (home, tmp, work):
        d.mkdir()
    env = no_compiler_env(venv, home, tmp)
    python = str(venv / "bin" / "python")
    r = subprocess.run([python, "-c", CHECK_PACKAGED], env=env, cwd=work, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(str(venv)), r.stdout + r.stderr
    cfg = write_config(short_tmp, ds.root)
    report = os.path.join(short_tmp, "report.json")
    assert cache_files(home) == []
    r = subprocess.run([str(venv / "bin" / "monarch"), "run", "-c", cfg, "--report", report, "--", python, "-m",
                        "monarch.tools.workload", "read", ds.root, "--epochs", "2", "--workers", "2", "--manifest",
                        ds.manifest], env=env, cwd=work, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not active" not in r.stderr and "is not available" not in r.stderr, r.stderr
    rep = load(report)
    assert rep["staging"]["files"] == 150 and rep["pfs"]["total_bytes"] == ds.total
    assert rep["opened_from"]["pfs"]["opens"] == 0 and rep["processes_with_shim"] > 0
    door = rep["nodes"][0]["front_door"]
    assert door["accepted"] > 0, door  # the C front door answered the shim
    assert cache_files(home) == []


def test_installed_two_node_cluster_uses_the_packaged_c_data_path(venv, dataset, short_tmp, tmp_path):
    if not (Path(sys.executable).parent / "mpiexec").exists() and shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec")
    nodes, files = 2, 120
    ds = dataset(files=files, size="16KiB")
    home, tmp, work = tmp_path / "home", tmp_path / "tmp", tmp_path / "work"
    for d in (home, tmp, work):
        d.mkdir()
    # MPICH's hydra: the mpich wheel's mpiexec beside this Python, as a user's environment has it
    env = no_compiler_env(venv, home, tmp, tools=("mpiexec", "mpiexec.hydra", "hydra_pmi_proxy"))
    cfg = sharded_config(short_tmp, ds.root, ds.allocated * 2 // 3, nodes)  # each node holds about half
    python, monarch = str(venv / "bin" / "python"), str(venv / "bin" / "monarch")
    serve = subprocess.Popen(["mpiexec", "-disable-auto-cleanup", "-n", str(nodes), monarch, "serve", "-c", cfg],
                             env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        readers = [subprocess.Popen([monarch, "run", "-c", cfg, "--", python, "-m", "monarch.tools.workload", "read",
                                     ds.root, "--epochs", "2", "--workers", "2", "--manifest", ds.manifest],
                                    env={**env, "MONARCH_NODE": str(k)}, cwd=work, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for k in range(nodes)]
        for p in readers:
            out, _ = p.communicate(timeout=240)
            assert p.returncode == 0 and "not active" not in out, out
        for k in range(nodes):
            r = subprocess.run([monarch, "stop", "-c", cfg], env={**env, "MONARCH_NODE": str(k)}, cwd=work,
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
        out, _ = serve.communicate(timeout=120)
        assert serve.returncode == 0, out
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, 9)
            serve.wait()
    rep = load(os.path.join(short_tmp, "run0", f"monarch-{os.getuid()}", "local-node0", "report.json"))
    assert rep["nodes_reporting"] == nodes
    lanes = {n["node"]: (n["front_door"]["peer_fetches"], n["peer"].get("datapath")) for n in rep["nodes"]}
    # other nodes' files crossed through the C data path, answered from C by their owners
    assert all(dp for _, dp in lanes.values()), json.dumps(lanes)
    assert sum(dp["served_files"] for _, dp in lanes.values()) > 0, json.dumps(lanes)
    assert cache_files(home) == []
