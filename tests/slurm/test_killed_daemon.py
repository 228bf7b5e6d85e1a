"""A daemon SIGKILLed under Slurm: the survivors serve on and stop with the report
(the lost node named); the next daemons started on those nodes remove what it left: its
copies and the MPI library's shared-memory files it had mapped."""

import os
import signal

import pytest

from jobs import batch_script, check_nothing_left, job_env, make_job, sbatch, wait_for, wait_job

pytestmark = pytest.mark.slurm

KILLED = """#!/bin/bash
monarch serve --slurm -c job.yaml &
srun monarch run -c job.yaml -- python train.py
echo "trained $?"
for i in $(seq 600); do [ -e killed ] && break; sleep 0.2; done
kill %1
wait
"""



def test_what_a_killed_daemon_left_is_removed_by_the_next_start_on_its_node(slurm, short_tmp, dataset, slow_pfs):
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2)
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        f.write(KILLED)
    env = job_env(slurm, MONARCH_MPI_ENGINE="mpich")
    first = sbatch(slurm, job, 1, env)
    wait_for(job, "trained 0")
    run_dir = os.path.join(job.base, "run1", f"monarch-{os.getuid()}", f"{first}-node1")
    with open(os.path.join(run_dir, "daemon.pid")) as f:
        pid = int(f.read())
    with open(os.path.join(run_dir, "mpi-shm")) as f:  # what MPICH had not unlinked yet (may be nothing)
        noted = [line.strip() for line in f if line.strip()]
    assert all(p.startswith("/dev/shm/mpich_shm_") for p in noted), noted
    os.kill(pid, signal.SIGKILL)
    open(os.path.join(job.dir, "killed"), "w").close()
    assert wait_job(slurm, job, first, timeout=180) in ("COMPLETED", "GONE"), job.out()
    rep = job.report(first)  # the survivor's: node 1 lost
    assert [n["node"] for n in rep["lost"]["nodes"]] == [1], rep["lost"]
    assert os.path.exists(os.path.join(run_dir, "daemon.sock"))  # its socket, left
    copies = os.path.join(job.base, "ssd1", f"monarch-{os.getuid()}")
    assert any(n.startswith(f"{first}-node1-") for n in os.listdir(copies))  # its copies, left

    # the next job on those nodes: the documented script, as is
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        f.write(batch_script())
    os.unlink(os.path.join(job.dir, "job.out"))
    second = sbatch(slurm, job, 1, env)
    assert wait_job(slurm, job, second, timeout=180) in ("COMPLETED", "GONE"), job.out()
    assert all(r["ok"] for r in job.readers()) and len(job.readers()) == 2, job.out()
    assert job.report(second)["nodes_reporting"] == 2
    assert [p for p in noted if os.path.exists(p)] == [], job.out()
    check_nothing_left(job)  # the killed daemon's copies too
