"""A test's own environment (tests/support/envs.py) sees what the running environment installed,
whichever kind it is. Here the running environment is a bare venv holding a probe module, as
scripts/install.sh run in an activated venv holds Monarch's dependencies: the environment made
from inside it imports the probe, its own modules first; ``venv --system-site-packages`` does not
(it names the base interpreter's site-packages)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SUPPORT = os.path.join(REPO, "tests", "support")
# support/__init__ imports Monarch, which the bare venv lacks: envs.py is imported on its own
MAKE_ENV = f"""
import sys
sys.path.insert(0, {SUPPORT!r})
from envs import make_env_seeing_this_python
make_env_seeing_this_python(sys.argv[1], with_pip=False)
"""
IMPORT_PROBES = "import monarch_probe_dependency, monarch_probe_shadowed; print(monarch_probe_shadowed.WHOSE)"


def clean_env():
    """The environment of the outer venv's processes: nothing on PYTHONPATH to see the probe by."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE")}


def run(python, *args):
    return subprocess.run([str(python), *args], env=clean_env(), capture_output=True, text=True, timeout=60)


def site_packages(python):
    r = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())


def test_an_environment_made_inside_a_venv_sees_that_venvs_packages_after_its_own(tmp_path):
    outer = tmp_path / "outer"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(outer)], check=True, timeout=60)
    outer_site = site_packages(outer / "bin" / "python")
    (outer_site / "monarch_probe_dependency.py").write_text("")
    (outer_site / "monarch_probe_shadowed.py").write_text("WHOSE = 'outer'\n")
    (outer / "lib" / "libmonarch_probe.so").write_text("")  # as the mpich wheel's libmpi

    inner = tmp_path / "inner"
    r = run(outer / "bin" / "python", "-c", MAKE_ENV, str(inner))
    assert r.returncode == 0, r.stdout + r.stderr
    (site_packages(inner / "bin" / "python") / "monarch_probe_shadowed.py").write_text("WHOSE = 'inner'\n")
    r = run(inner / "bin" / "python", "-c", IMPORT_PROBES)
    assert r.returncode == 0 and r.stdout.strip() == "inner", r.stdout + r.stderr
    assert (inner / "lib" / "libmonarch_probe.so").resolve() == (outer / "lib" / "libmonarch_probe.so").resolve()

    # the old way names the base interpreter's site-packages, not the outer venv's
    old = tmp_path / "old"
    r = run(outer / "bin" / "python", "-m", "venv", "--without-pip", "--system-site-packages", str(old))
    assert r.returncode == 0, r.stderr
    r = run(old / "bin" / "python", "-c", "import monarch_probe_dependency")
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, r.stdout + r.stderr
