"""`monarch run` of a cluster job waits for its node's standing daemon; a single-node run
honours the node index and starts its own daemon at once."""

import io
import os
import sys

from support.harness import load, monarch_env, run_group, write_tier_config


def test_single_node_run_with_a_node_index_starts_its_daemon_and_uses_it(dataset, short_tmp):
    ds = dataset(files=40, size="8KiB")
    cfg = write_tier_config(short_tmp, ds.root, f"{short_tmp}/run", f"/dev/shm{short_tmp}/ram", f"{short_tmp}/ssd")
    report = os.path.join(short_tmp, "r.json")
    res = run_group([sys.executable, "-m", "monarch", "run", "-c", cfg, "--report", report, "--", sys.executable, "-m",
                     "monarch.tools.workload", "read", ds.root, "--epochs", "2", "--workers", "2",
                     "--manifest", ds.manifest],
                    env=monarch_env(MONARCH_NODE=1, MONARCH_JOB_ID="single"), timeout=60)
    assert res.returncode == 0, res.stderr
    assert "Monarch is not active" not in res.stderr
    rep = load(report)
    assert rep["nodes"][0]["node"] == 1
    assert rep["opened_from"]["pfs"]["opens"] == 0  # the second epoch at least came from the node's tier
    assert sum(c["opens"] for c in rep["opened_from"].values()) == 80


def test_a_cluster_run_is_told_by_the_peer_section_and_the_node_index(tmp_path):
    from monarch.config import load_config
    from monarch.launch.run import is_cluster_run
    single = tmp_path / "single.yaml"
    single.write_text("dataset: {roots: [/x]}\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("dataset: {roots: [/x]}\npeer: {path: /tmp, capacity: 1GiB}\n")
    single, cluster = (load_config(str(p), check_roots=False) for p in (single, cluster))
    defaults = load_config(None, env={"MONARCH_DATASET": "/x"}, check_roots=False)
    assert is_cluster_run(cluster, {"MONARCH_NODE": "2"})
    assert is_cluster_run(cluster, {"SLURM_NODEID": "0"})
    assert not is_cluster_run(cluster, {})  # no node index: a single-node run
    assert not is_cluster_run(single, {"MONARCH_NODE": "2"})
    assert not is_cluster_run(defaults, {"MONARCH_NODE": "2"})  # the shipped defaults' peer section does not count
    assert is_cluster_run(single, {"MONARCH_CLUSTER": "1"})
    assert not is_cluster_run(cluster, {"MONARCH_NODE": "2", "MONARCH_CLUSTER": "0"})


def test_waiting_for_a_cluster_daemon_is_bounded_and_says_so(tmp_path, monkeypatch):
    from monarch.config import load_config
    from monarch.errors import DaemonError
    from monarch.launch.run import wait_for_cluster_daemon
    monkeypatch.setattr("monarch.launch.run.CLUSTER_WAIT_NOTE", 0.1)
    monkeypatch.setenv("MONARCH_JOB_ID", "nojob")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"dataset: {{roots: [{tmp_path}]}}\nrun_base: {tmp_path}/run\n")
    (tmp_path / "run").mkdir()  # a base must exist
    out = io.StringIO()
    try:
        wait_for_cluster_daemon(load_config(str(cfg)), 3, timeout=0.5, out=out)
    except DaemonError as e:
        assert "node 3" in str(e) and "MONARCH_CLUSTER=0" in str(e)
    else:
        raise AssertionError("no daemon, yet it attached")
    assert "waiting for node 3's daemon of job nojob" in out.getvalue()


def test_a_launcher_whose_daemon_died_runs_on_the_pfs_soon(tmp_path, monkeypatch):
    """Its node's daemon was SIGKILLed: the socket is left, nothing holds the lock.
    The launcher waits CLUSTER_DEAD_WAIT for a new one, not MONARCH_CLUSTER_WAIT; a lock
    that is held (a daemon starting) keeps it waiting."""
    import fcntl
    from monarch import layout
    from monarch.config import load_config
    from monarch.errors import DaemonError
    from monarch.launch import run
    monkeypatch.setattr("monarch.launch.run.CLUSTER_DEAD_WAIT", 0.2)
    monkeypatch.setenv("MONARCH_JOB_ID", "deadjob")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"dataset: {{roots: [{tmp_path}]}}\nrun_base: {tmp_path}/run\n")
    (tmp_path / "run").mkdir()
    config = load_config(str(cfg))
    run_dir = os.path.join(layout.user_dir(config.run_base), "deadjob-node1")
    os.makedirs(run_dir)
    open(os.path.join(run_dir, "daemon.sock"), "w").close()  # what a killed daemon leaves (no listener)
    lock = os.open(os.path.join(run_dir, "daemon.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    assert run._daemon_died(run_dir)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a live daemon holds it
    assert not run._daemon_died(run_dir)
    fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        run.wait_for_cluster_daemon(config, 1, timeout=60, out=io.StringIO())
    except DaemonError as e:
        assert "died" in str(e)
    else:
        raise AssertionError("no daemon, yet it attached")
    finally:
        os.close(lock)


def test_waiting_is_said_once_by_the_first_rank_of_a_node_only(tmp_path, monkeypatch):
    """A wait for the node's daemon is said by the first local rank only, at once and then every
    CLUSTER_WAIT_NOTE (30 s); the others say nothing (every rank saying it floods the log)."""
    from monarch.config import load_config
    from monarch.errors import DaemonError
    from monarch.launch.run import CLUSTER_WAIT_NOTE, wait_for_cluster_daemon
    assert CLUSTER_WAIT_NOTE >= 30
    monkeypatch.setenv("MONARCH_JOB_ID", "quiet")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"dataset: {{roots: [{tmp_path}]}}\nrun_base: {tmp_path}/run\n")
    (tmp_path / "run").mkdir()
    said = {}
    for local in ("0", "1"):
        monkeypatch.setenv("SLURM_LOCALID", local)
        out = io.StringIO()
        try:
            wait_for_cluster_daemon(load_config(str(cfg)), 0, timeout=1.0, out=out)
        except DaemonError:
            pass
        said[local] = out.getvalue().count("waiting for node 0's daemon")
    assert said == {"0": 1, "1": 0}


def test_a_daemons_step_stuck_pending_is_said_soon_and_once_for_the_node(tmp_path, monkeypatch):
    """A hand-written daemons' step without --overlap waits for the training's CPUs
    ("Requested nodes are busy") and never comes; the launchers do not wait MONARCH_CLUSTER_WAIT
    (300 s) for it: the node's first rank sees the step pending in Slurm and gives up with the
    cause and the fix, and leaves it for the node's other ranks, which give up at once."""
    import time
    from monarch.config import load_config
    from monarch.errors import DaemonError
    from monarch.launch import slurm
    from monarch.launch.run import wait_for_cluster_daemon
    monkeypatch.delenv("MONARCH_JOB_ID", raising=False)
    for var, value in {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n1", "SLURM_NODEID": "0"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(slurm, "PENDING_FIRST", 0.2)
    monkeypatch.setattr(slurm, "PENDING_EVERY", 0.2)
    monkeypatch.setattr(slurm, "PENDING_FOR", 0.4)
    monkeypatch.setattr(slurm, "job_steps", lambda job: [slurm.JobStep("77.0", "RUNNING", "n[1-2]", "h:1"),
                                                         slurm.JobStep("77.TDB", "PENDING", "n[1-2]", "h:2")])
    monkeypatch.setattr(slurm, "srun_command", lambda srun: ["srun", "-n", "2", "monarch", "serve", "-c", "job.yaml"])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"dataset: {{roots: [{tmp_path}]}}\nrun_base: {tmp_path}/run\n")
    (tmp_path / "run").mkdir()
    said = {}
    for local in ("0", "1"):  # the node's first rank, then another
        monkeypatch.setenv("SLURM_LOCALID", local)
        t0 = time.monotonic()
        try:
            wait_for_cluster_daemon(load_config(str(cfg)), 0, timeout=60, out=io.StringIO())
        except DaemonError as e:
            said[local] = (str(e), time.monotonic() - t0)
        else:
            raise AssertionError("no daemon, yet it attached")
    for local, (why, seconds) in said.items():
        assert "node 0's daemon of job 77 will not come: the daemons' step cannot start:" in why, why
        assert "`srun -n 2 monarch serve -c job.yaml` has been pending" in why and "--overlap" in why, why
        assert seconds < 10, (local, seconds)  # not MONARCH_CLUSTER_WAIT (60 here, 300 by default)
    assert said["1"][1] < 1.0  # the first rank's note: no asking Slurm again
