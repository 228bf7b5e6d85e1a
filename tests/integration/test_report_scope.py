"""A run on a job's standing daemon reports its own part, and says so: what the
daemon had staged before it attached, and where the node's whole report goes; its report
goes beside the daemon's, never over it."""

import glob
import os
import subprocess
import sys
import time

from support.harness import load, monarch, monarch_env, reader, write_config


def test_a_run_on_a_standing_daemon_says_its_report_is_its_part(dataset, short_tmp):
    ds = dataset(files=60, size="4KiB")
    cfg = write_config(short_tmp, ds.root)
    env = monarch_env()
    serve = subprocess.Popen([sys.executable, "-m", "monarch", "serve", "-c", cfg], env=env,
                             stderr=subprocess.PIPE, text=True)
    run_dir = os.path.join(short_tmp, "run0", f"monarch-{os.getuid()}", "local-node0")
    try:
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(run_dir, "daemon.sock")) and time.time() < deadline:
            time.sleep(0.05)
        first = monarch("run", "-c", cfg, "--", *reader(ds, epochs=1, workers=2), env=env)
        assert first.returncode == 0, first.stderr
        second = monarch("run", "-c", cfg, "--", *reader(ds, epochs=1, workers=2), env=env)
        assert second.returncode == 0, second.stderr
        assert monarch("stop", "-c", cfg, env=env).returncode == 0
        assert serve.wait(timeout=60) == 0
    finally:
        serve.kill()
        serve.communicate()
    # the second run staged nothing itself: its figures are its part, and it says what came before
    assert "scope     : this run's part only" in second.stderr, second.stderr
    assert f"staged 60 files, {ds.total / 1024:.1f} KiB before" in second.stderr, second.stderr
    assert "0.00x the dataset during this run" in second.stderr, second.stderr
    assert "staged before this run" in second.stderr, second.stderr
    assert os.path.join(run_dir, "report.json") in second.stderr  # where the node's whole report is
    parts = sorted(glob.glob(os.path.join(run_dir, "report-*.json")), key=os.path.getmtime)
    assert len(parts) == 2
    assert load(parts[1])["job"]["scope"]["staged_before"]["files"] == 60
    whole = load(os.path.join(run_dir, "report.json"))  # the daemon's own, at its stop: both runs
    assert whole["pfs"]["staging_bytes"] == ds.total and whole["opened_from"]["ram"]["opens"] == 120
