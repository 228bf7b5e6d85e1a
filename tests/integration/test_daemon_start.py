"""``monarch run``'s embedded daemon as it is started: forked from its launcher (no second
interpreter), or spawned where a fork could carry what the daemon must not have (the shim loaded
in the launcher). Either way it is a session of its own, holds none of the launcher's
descriptors (its start lock, the pipes its caller reads) and never runs under the shim."""

import json
import os
import sys

import pytest

from monarch import layout, protocol
from monarch.shim import shim_library
from support.harness import monarch, monarch_env, write_config

pytestmark = pytest.mark.integration

LOOK = r"""
import json, os, sys
run_dir = os.path.dirname(os.environ[sys.argv[1]])
pid = int(open(os.path.join(run_dir, sys.argv[2])).read())
fds = {}
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        fds[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        pass
maps = open(f"/proc/{pid}/maps").read()
print(json.dumps({"daemon": pid, "launcher": os.getppid(), "sid": os.getsid(pid), "fds": fds,
                  "shim": "libmonarch_shim" in maps, "my_out": os.readlink("/proc/self/fd/1"),
                  "my_err": os.readlink("/proc/self/fd/2"), "run_dir": run_dir}))
"""


@pytest.mark.parametrize("launcher_under_shim", [False, True], ids=["forked", "spawned"])
def test_the_embedded_daemon_is_a_session_of_its_own_with_none_of_the_launchers_descriptors(
        dataset, short_tmp, launcher_under_shim):
    ds = dataset(files=10, size="4KiB")
    cfg = write_config(short_tmp, ds.root)
    env = monarch_env()
    if launcher_under_shim:  # `monarch run` in another run's command: the shim is loaded in the launcher
        env["LD_PRELOAD"] = str(shim_library())
    r = monarch("run", "-c", cfg, "--no-progress", "--", sys.executable, "-c", LOOK, protocol.ENV_SOCKET,
                layout.PID_FILE, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["daemon"] != out["launcher"] and out["sid"] == out["daemon"]
    assert not out["shim"]  # the daemon reads the PFS itself
    fds = {int(k): v for k, v in out["fds"].items()}
    assert fds[0] == "/dev/null" or launcher_under_shim  # (spawned: the pipe its configuration came through)
    assert fds[1] == fds[2] == os.path.join(out["run_dir"], layout.DAEMON_LOG)
    held = set(fds.values())
    assert out["my_out"] not in held and out["my_err"] not in held  # the pipes the caller reads
    assert os.path.join(out["run_dir"], layout.START_LOCK) not in held
