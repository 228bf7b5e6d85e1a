"""Every process Monarch starts runs the package its launcher runs, never a ``monarch/`` folder
of the working directory (``python -m`` and ``python -c`` search it first)."""

import os
import subprocess
import sys

import pytest

from support.harness import REPO, load, monarch_env, run_group, write_config

pytestmark = pytest.mark.integration

# the CLI as the installed ``monarch`` script starts it: its package from its own place (here the
# checkout), whatever the working directory holds
CLI = [sys.executable, "-c", f"import sys; sys.path.insert(0, {REPO!r}); from monarch.cli import main; "
                             "raise SystemExit(main())"]
# the job's command: reads every file of the root, importing nothing of Monarch's
READ_ALL = ("import os, sys\n"
            "n = 0\n"
            "for d, _, names in os.walk(sys.argv[1]):\n"
            "    for name in names:\n"
            "        with open(os.path.join(d, name), 'rb') as f:\n"
            "            n += len(f.read())\n"
            "print('read', n)\n")


@pytest.fixture
def decoy(short_tmp):
    """A working directory holding a ``monarch/`` package that fails on import."""
    cwd = os.path.join(short_tmp, "work")
    os.makedirs(os.path.join(cwd, "monarch"))
    with open(os.path.join(cwd, "monarch", "__init__.py"), "w") as f:
        f.write("raise ImportError('a decoy monarch package of the working directory')\n")
    with open(os.path.join(cwd, "monarch", "__main__.py"), "w") as f:
        f.write("raise SystemExit(99)\n")
    return cwd


def test_a_decoy_monarch_package_in_the_working_directory_is_not_run(dataset, short_tmp, decoy):
    ds = dataset(files=200, size="8KiB")
    cfg = write_config(short_tmp, ds.root)
    report = os.path.join(short_tmp, "report.json")
    r = run_group([*CLI, "run", "-c", cfg, "--report", report, "--", sys.executable, "-c", READ_ALL, ds.root],
                  env=monarch_env(), cwd=decoy, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "not active" not in r.stderr, r.stderr
    assert f"read {ds.total}" in r.stdout
    rep = load(report)
    # the job was staged as usual: every file once from the PFS by the stager, none by the application
    assert rep["staging"]["files"] == 200
    assert rep["pfs"]["staging_bytes"] == ds.total and rep["pfs"]["app_bytes"] == 0


def test_python_command_runs_this_package_from_any_directory(decoy):
    from monarch.launch.service import python_command
    env = monarch_env()
    env["PYTHONPATH"] = os.pathsep.join([decoy, env["PYTHONPATH"]])  # even a decoy named first on the path
    for module, args, expect in (("monarch", ["--version"], "monarch "),
                                 ("monarch.tools.workload", ["--help"], "usage: python -m monarch.tools.workload")):
        r = subprocess.run([*python_command(module), *args], cwd=decoy, env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and expect in r.stdout, (module, r.stdout, r.stderr)
