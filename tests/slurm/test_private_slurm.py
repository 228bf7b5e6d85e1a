"""The private Slurm itself: jobs run on its nodes, under PMI2 and PMIx (issue 33)."""

import pytest

pytestmark = pytest.mark.slurm


def test_a_step_runs_one_task_per_node(slurm):
    res = slurm.run(["srun", "-N4", "--ntasks-per-node=1", "-t", "1", "bash", "-c", "echo $SLURM_NODEID"],
                    timeout=60)
    assert sorted(res.stdout.split()) == ["0", "1", "2", "3"]
