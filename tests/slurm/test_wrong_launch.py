"""Each wrong way to start the daemons under Slurm is caught at start with one line naming
the fix, and the node's launchers stop waiting at once and say why: they run their
command on the PFS, right digests, no 300 s wait (MONARCH_CLUSTER_WAIT stays at its default;
the job is bounded well below it)."""

import pytest

from jobs import job_env, make_job, salloc

pytestmark = pytest.mark.slurm

SCRIPT = """#!/bin/bash
{serve}
echo "serve exited $?"
srun monarch run -c job.yaml -- python train.py
echo "run exited $?"
"""

CASES = {
    # srun takes the job's 4 tasks: "can't honor --ntasks-per-node ... Ignoring", two daemons a node
    "two daemons a node": ("srun --ntasks-per-node=1 --kill-on-bad-exit=0 monarch serve -c job.yaml", {},
                           "srun started 4 daemons on 2 nodes", "srun -n 2 --ntasks-per-node=1"),
    # a site whose MpiDefault is none: each daemon a world of 1
    "no PMI": ("srun -n 2 --ntasks-per-node=1 --overlap --mpi=none monarch serve -c job.yaml", {},
               "srun started 2 daemons without PMI (--mpi=none)", "--mpi=pmi2"),
    # MPICH aborts under PMIx ("unsupported PMI version")
    "PMIx for MPICH": ("srun -n 2 --ntasks-per-node=1 --overlap --mpi=pmix monarch serve -c job.yaml",
                       {"MPI4PY_LIBMPI": ""}, "srun --mpi=pmix, but the daemons' MPI is MPICH", "--mpi=pmi2"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_srun_line_is_said_once_with_its_fix_and_launchers_do_not_wait(slurm, short_tmp, dataset, slow_pfs,
                                                                               case):
    serve, env, cause, fix = CASES[case]
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2, files=40)
    with open(f"{job.dir}/job.sh", "w") as f:
        f.write(SCRIPT.format(serve=serve))
    _, res = salloc(slurm, job, 2, job_env(slurm, **env))
    out = res.stdout
    said = [line for line in out.splitlines() if line.startswith("monarch: error: monarch serve")]
    assert len(said) == 1, out  # one line for the whole step, not one per daemon
    assert cause in said[0] and fix in said[0], said
    assert "serve exited 2" in out, out
    # each node's launchers: its daemon will not come, and why; then the PFS (fail open)
    told = [line for line in out.splitlines() if "will not come" in line]
    assert told and all(cause in line for line in told), out
    assert "waiting for node" not in out, out
    readers = job.readers()
    assert len(readers) == 4 and all(r["ok"] for r in readers), out
    assert "run exited 0" in out, out


# The training's step first (every CPU of the allocation), then the daemons' step written by
# hand without --overlap: srun says "step creation temporarily disabled ... Requested nodes are
# busy" and waits for the training to end. The script cancels that srun, still pending, once
# all 4 launchers have given up (never before: the tasks wait for the mark, and a launcher may
# read the pending srun's command line), so no daemon ever runs.
WITHOUT_OVERLAP = """#!/bin/bash
srun monarch run -c job.yaml -- bash -c 'python train.py; s=$?; for i in $(seq 600); do [ -e serve.cancelled ] && break; sleep 0.2; done; exit $s' &
sleep 3
srun -n 2 --ntasks-per-node=1 --kill-on-bad-exit=0 monarch serve -c job.yaml &
for i in $(seq 1200); do [ "$(grep -c "will not come" job.out)" -ge 4 ] && break; sleep 0.2; done
echo "launchers gave up after $SECONDS s"
kill %2
wait %2
touch serve.cancelled
wait %1
echo "run exited $?"
"""


def test_a_daemons_step_without_overlap_is_said_with_its_fix_and_launchers_do_not_wait(slurm, short_tmp, dataset,
                                                                                       slow_pfs):
    """No launcher waits MONARCH_CLUSTER_WAIT (300 s, left at its default) for daemons
    whose step cannot start: each node's first rank sees the step pending in Slurm and every
    launcher of the node says why, with the fix, then reads the PFS (right digests)."""
    job = make_job(short_tmp, dataset, slow_pfs, nodes=2, files=40)
    with open(f"{job.dir}/job.sh", "w") as f:
        f.write(WITHOUT_OVERLAP)
    _, res = salloc(slurm, job, 2, job_env(slurm))
    out = res.stdout
    assert "Requested nodes are busy" in out, out  # the step did wait for the training's CPUs
    told = [line for line in out.splitlines() if "will not come" in line]
    assert len(told) == 4, out  # every launcher (2 nodes x 2 tasks), once each
    for line in told:
        assert "the daemons' step cannot start: `srun -n 2 --ntasks-per-node=1" in line, line
        assert "has been pending" in line and "--overlap" in line and "monarch serve --slurm" in line, line
    gave_up = int(out.split("launchers gave up after ", 1)[1].split()[0])
    assert gave_up < 60, out  # ~20 s: 3 s before the daemons' srun, 5 s before the first look, 10 s pending
    readers = job.readers()
    assert len(readers) == 4 and all(r["ok"] for r in readers), out
    assert "run exited 0" in out, out
