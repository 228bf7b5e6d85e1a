"""Was the shim there? The processes counter (EXTRA_PROCESSES) and the marker symbol
``monarch_shim_loaded``: how ``monarch run`` tells "the shim was never loaded" (LD_PRELOAD
dropped by a wrapper, a static binary) from "it was loaded and served nothing"."""

from __future__ import annotations

import shutil
import sys
import textwrap

import pytest

from monarch import protocol

pytestmark = pytest.mark.shim

MARKER = textwrap.dedent("""
    import ctypes
    try:
        print(ctypes.CDLL(None).monarch_shim_loaded())
    except AttributeError:
        print("absent")
""")


def processes(env) -> int:
    return protocol.read_extra_counters(env.counters)[protocol.EXTRA_PROCESSES]


def test_a_process_with_the_shim_counts_once(staged_env):
    proc = staged_env.python(MARKER)
    assert proc.stdout.decode().strip() == "1"
    assert processes(staged_env) == 1


def test_a_process_without_the_shim_counts_nothing(staged_env):
    """`env -u LD_PRELOAD` loads the shim itself, then execs the program without it: 0."""
    env_bin = shutil.which("env")
    proc = staged_env.run([env_bin, "-u", "LD_PRELOAD", sys.executable, "-c", MARKER])
    assert proc.stdout.decode().strip() == "absent"
    assert processes(staged_env) == 0


def test_a_disabled_shim_is_loaded_but_not_active(staged_env):
    proc = staged_env.python(MARKER, MONARCH_DISABLE="1")
    assert proc.stdout.decode().strip() == "0"
    assert processes(staged_env) == 0


def test_forked_workers_and_exec_chains_count_each_process_with_the_shim(staged_env):
    """A fork child is a process with the shim; a process that execs another program stops
    being one (the program counts itself, if it loads the shim)."""
    staged_env.python(textwrap.dedent("""
        import os, subprocess
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        subprocess.run(["sh", "-c", "exec true"], check=True, timeout=30)
        os.execv("/bin/true", ["true"])                # this process becomes true: still one
    """))
    assert processes(staged_env) == 1 + 2 + 1  # python (then true), its 2 workers, sh (then true)


def test_a_failed_exec_leaves_the_process_counted(staged_env):
    staged_env.python(textwrap.dedent("""
        import os
        try:
            os.execv("/nonexistent/program", ["x"])
        except OSError:
            pass
    """))
    assert processes(staged_env) == 1
