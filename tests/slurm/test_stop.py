"""The daemons of `monarch serve --slurm` stop cleanly however the job ends (issue 33):
`scancel --signal=TERM JOB` and the end of the batch script (Slurm then SIGTERMs every step)
each give node 0's cluster report and leave nothing in the bases."""

import os
import time

import pytest

from jobs import check_finished, job_env, make_job, sbatch

pytestmark = pytest.mark.slurm

NO_STOP = """#!/bin/bash
monarch serve --slurm -c job.yaml &
srun monarch run -c job.yaml -- python train.py
echo "trained $?"
{end}
"""


def _wait_for(job, text, timeout=120.0):
    deadline = time.monotonic() + timeout
    while text not in job.out():
        assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f} s:\n{job.out()}"
        time.sleep(0.3)


def test_scancel_signal_term_gives_the_report_and_leaves_nothing(slurm, short_tmp, dataset, slow_pfs):
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2)
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        f.write(NO_STOP.format(end="wait  # for the daemons: scancel --signal=TERM stops them"))
    job_id = sbatch(slurm, job, 2, job_env(slurm))
    _wait_for(job, "trained 0")
    slurm.run(["scancel", "--signal=TERM", job_id])
    assert slurm.wait_job(job_id, timeout=120) in ("COMPLETED", "GONE"), job.out()
    check_finished(job, job_id, 4)


def test_the_end_of_the_batch_script_gives_the_report_and_leaves_nothing(slurm, short_tmp, dataset, slow_pfs):
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2)
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        f.write(NO_STOP.format(end="# no stop: the job's end SIGTERMs the daemons' step"))
    job_id = sbatch(slurm, job, 1, job_env(slurm, MONARCH_MPI_ENGINE="mpich"))
    state = slurm.wait_job(job_id, timeout=120)
    assert state in ("COMPLETED", "GONE"), (state, job.out())
    deadline = time.monotonic() + 60  # the steps end after the job is complete, within KillWait
    while not os.path.exists(job.report_path(job_id)) and time.monotonic() < deadline:
        time.sleep(0.3)
    check_finished(job, job_id, 2)


def test_monarch_stop_on_every_node_gives_the_report_and_leaves_nothing(slurm, short_tmp, dataset, slow_pfs):
    """The other documented stop: `monarch stop` once per node, in a step that overlaps."""
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2)
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        f.write(NO_STOP.format(end="srun -n $SLURM_NNODES --ntasks-per-node=1 --overlap monarch stop -c job.yaml\n"
                                   "echo \"stopped $?\"\nwait"))
    job_id = sbatch(slurm, job, 2, job_env(slurm))
    assert slurm.wait_job(job_id, timeout=180) in ("COMPLETED", "GONE"), job.out()
    assert "stopped 0" in job.out(), job.out()
    check_finished(job, job_id, 4)
