"""Ctrl-C during ``monarch run``'s tear-down: the first Ctrl-C went to the command (which
ended), the next one comes while the launcher waits for the report -- held by the daemon
until its slow walk ends -- and must end ``monarch run`` at once with 130 (or 137 when it
killed the command), no traceback, and nothing left behind: the embedded daemon still stops
and removes its tiers."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from support.harness import monarch_env, run_dirs, write_config

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(300)]

# the command: "ready", then it either ends at the first SIGINT (130) or ignores SIGINT
COMMAND = """
import signal, sys, time
if sys.argv[1] == "exits":
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
else:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""


def _wait_for_line(stream, text: str, proc: subprocess.Popen) -> list[str]:
    lines = []
    for line in stream:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"monarch run ended (code {proc.wait(10)}) before printing {text!r}:\n{''.join(lines)}")


@pytest.mark.parametrize("command, code", [("exits", 130), ("ignores", 128 + signal.SIGKILL)])
def test_ctrl_c_during_the_tear_down_ends_cleanly(dataset, short_tmp, slow_pfs, command, code):
    ds = dataset(files=160, size="4KiB")
    pfs = slow_pfs(ds.root, lookup_latency_ms=60)  # a walk of seconds: the final report waits for it
    cfg = write_config(short_tmp, str(pfs.mountpoint))
    launcher = subprocess.Popen([sys.executable, "-m", "monarch", "-vv", "run", "-c", cfg, "--no-progress", "--",
                                 sys.executable, "-c", COMMAND, command],
                                env=monarch_env(MONARCH_JOB_ID="ctrlc"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert launcher.stdout.readline().strip() == "ready"
        launcher.send_signal(signal.SIGINT)  # the first Ctrl-C: to the command
        if command == "ignores":
            time.sleep(0.5)  # it ignored it; the second Ctrl-C kills it
            launcher.send_signal(signal.SIGINT)
        err = _wait_for_line(launcher.stderr, "phase command.end", launcher)
        (run_dir,) = run_dirs(short_tmp)
        assert not glob.glob(os.path.join(run_dir, "index-*")), "the walk ended too soon to test this"
        launcher.send_signal(signal.SIGINT)  # during the tear-down
        launcher.wait(timeout=120)  # what it writes after this fits the pipe (a report)
        err = "".join(err) + launcher.stderr.read()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # nothing left behind: the daemon stopped (its socket gone) and removed its tiers
    tiers = glob.glob(f"/dev/shm{short_tmp}/ram0/monarch-*/ctrlc-*") + glob.glob(f"{short_tmp}/ssd0/monarch-*/ctrlc-*")
    assert tiers == []
    assert not os.path.exists(os.path.join(run_dir, "daemon.sock"))
