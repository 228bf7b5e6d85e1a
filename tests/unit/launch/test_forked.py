"""The handle of a forked daemon (monarch/launch/forked.py): what the launcher asks of it, as of a Popen."""

import os
import signal
import subprocess
import time

import pytest

from monarch.launch.forked import ForkedDaemon


def child(code: int = 0, sleep: float = 0.0) -> ForkedDaemon:
    pid = os.fork()
    if pid == 0:
        time.sleep(sleep)
        os._exit(code)
    return ForkedDaemon(pid)


def test_its_exit_code_is_waited_for_and_polled():
    d = child(3, 0.2)
    assert d.poll() is None and d.returncode is None
    assert d.wait(timeout=10) == 3 and d.returncode == 3 and d.poll() == 3


def test_a_wait_past_its_bound_raises_as_popens_and_a_kill_ends_it():
    d = child(0, 30)
    with pytest.raises(subprocess.TimeoutExpired):
        d.wait(timeout=0.1)
    d.kill()
    assert d.wait(timeout=10) == -signal.SIGKILL
    d.kill()  # (gone: nothing to do)
