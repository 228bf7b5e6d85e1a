"""The private Slurm itself (tests/support/slurm.py): a step runs one task on each of its nodes."""

import pytest

pytestmark = pytest.mark.slurm


def test_a_step_runs_one_task_per_node(slurm):
    res = slurm.run(["srun", "-N4", "--ntasks-per-node=1", "-t", "1", "bash", "-c", "echo $SLURM_NODEID"],
                    timeout=60)
    assert sorted(res.stdout.split()) == ["0", "1", "2", "3"]
