"""The batch script of docs/cluster.md, copied as is, under a private Slurm: by
sbatch and by salloc, with PMI2 (MPICH) and PMIx (Open MPI), 2 and 4 nodes, 1 and 2 tasks per node. Each
run: every reader's digests right, the emulated PFS read once, node 0's cluster report with
every node, nothing left in the bases."""

import pytest

from jobs import check_finished, job_env, make_job, salloc, submit

pytestmark = pytest.mark.slurm

ENGINES = {"pmi2": {"MONARCH_MPI_ENGINE": "mpich"}, "pmix": {}}


@pytest.mark.parametrize("nodes,per_node,pmi", [(2, 1, "pmi2"), (2, 2, "pmix"), (4, 1, "pmix"), (4, 2, "pmi2")])
def test_the_documented_batch_script_by_sbatch(slurm, short_tmp, dataset, slow_pfs, nodes, per_node, pmi):
    job = make_job(short_tmp, dataset, slow_pfs, nodes)
    job_id, state = submit(slurm, job, per_node, job_env(slurm, **ENGINES[pmi]))
    assert state in ("COMPLETED", "GONE"), (state, job.out())
    assert f"--mpi={pmi}" in job.out(), job.out()
    check_finished(job, job_id, nodes * per_node)


@pytest.mark.parametrize("nodes,per_node,pmi", [(2, 2, "pmi2"), (2, 1, "pmix"), (4, 1, "pmix")])
def test_the_documented_batch_script_in_salloc(slurm, short_tmp, dataset, slow_pfs, nodes, per_node, pmi):
    job = make_job(short_tmp, dataset, slow_pfs, nodes)
    job_id, res = salloc(slurm, job, per_node, job_env(slurm, **ENGINES[pmi]))
    assert res.returncode == 0, res.stdout
    assert f"--mpi={pmi}" in res.stdout, res.stdout
    check_finished(job, job_id, nodes * per_node)


def test_a_plain_monarch_serve_in_an_allocation_of_several_nodes_builds_the_step(slurm, short_tmp, dataset,
                                                                                  slow_pfs):
    """The batch script without --slurm: the step is built all the same (one daemon per node),
    never one daemon on the batch host for the whole job."""
    from jobs import batch_script
    job = make_job(short_tmp, dataset, slow_pfs, 2)
    script = batch_script()
    assert "monarch serve --slurm" in script
    with open(f"{job.dir}/job.sh", "w") as f:
        f.write(script.replace("monarch serve --slurm", "monarch serve"))
    job_id, state = submit(slurm, job, 2, job_env(slurm, **ENGINES["pmix"]))
    assert state in ("COMPLETED", "GONE"), job.out()
    assert "monarch: the daemons' step" in job.out(), job.out()
    check_finished(job, job_id, 4)
