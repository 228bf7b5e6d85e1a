"""The daemons of `monarch serve --slurm` stop cleanly however the job ends:
`scancel --signal=TERM JOB` and the end of the batch script (Slurm then SIGTERMs every step)
each give node 0's cluster report and leave nothing in the bases."""

import os
import time

import pytest

from jobs import check_finished, check_nothing_left, job_env, make_job, sbatch, wait_for, wait_job

pytestmark = pytest.mark.slurm

NO_STOP = """#!/bin/bash
monarch serve --slurm -c job.yaml &
srun monarch run -c job.yaml -- python train.py
echo "trained $?"
{end}
"""



def test_scancel_signal_term_gives_the_report_and_leaves_nothing(slurm, short_tmp, dataset, slow_pfs):
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2)
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        f.write(NO_STOP.format(end="wait  # for the daemons: scancel --signal=TERM stops them"))
    job_id = sbatch(slurm, job, 2, job_env(slurm))
    wait_for(job, "trained 0")
    slurm.run(["scancel", "--signal=TERM", job_id])
    assert wait_job(slurm, job, job_id, timeout=120) in ("COMPLETED", "GONE"), job.out()
    check_finished(job, job_id, 4)


def test_the_end_of_the_batch_script_gives_the_report_and_leaves_nothing(slurm, short_tmp, dataset, slow_pfs):
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2)
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        f.write(NO_STOP.format(end="# no stop: the job's end SIGTERMs the daemons' step"))
    job_id = sbatch(slurm, job, 1, job_env(slurm, MONARCH_MPI_ENGINE="mpich"))
    state = wait_job(slurm, job, job_id, timeout=120)
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
    assert wait_job(slurm, job, job_id, timeout=180) in ("COMPLETED", "GONE"), job.out()
    assert "stopped 0" in job.out(), job.out()
    check_finished(job, job_id, 4)


def test_a_stop_as_the_daemons_start_is_a_clean_stop(slurm, short_tmp, dataset, slow_pfs):
    """`kill %1` at once: the daemons' interpreters, MPI_Init, their tiers are under way; the
    stop waits until they can take it (monarch serve --slurm, service.catch_stop_signals) and
    is a clean one: node 0's report, nothing left."""
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2)
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        # as soon as monarch serve --slurm has said its srun line (its signals are taken by then)
        f.write("#!/bin/bash\nmonarch serve --slurm -c job.yaml 2> serve.err &\n"
                "until grep -q \"the daemons' step\" serve.err; do sleep 0.05; done\n"
                "kill %1\nwait\ncat serve.err\necho \"served $?\"\n")
    job_id = sbatch(slurm, job, 1, job_env(slurm))
    assert wait_job(slurm, job, job_id, timeout=180) in ("COMPLETED", "GONE"), job.out()
    assert "served 0" in job.out(), job.out()
    assert os.path.exists(job.report_path(job_id)), job.out()
    rep = job.report(job_id)
    assert (rep["nodes_reporting"], rep["nodes_lost"]) == (2, []), job.out()
    check_nothing_left(job)
