"""monarch/launch/slurm.py without Slurm: the daemons' step for what is installed, and the
one-line cause and fix of each wrong srun line (issue 33; tests/slurm runs them for real)."""

import os
import sys

import pytest

from monarch.errors import MonarchError
from monarch.launch import slurm

BATCH = {"SLURM_JOB_ID": "12", "SLURM_JOB_NUM_NODES": "4", "SLURM_NNODES": "4", "SLURM_NTASKS": "8",
         "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_PROCID": "0"}


def step_env(**kw):
    env = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2",
           "SLURM_MPI_TYPE": "pmi2", "PMI_FD": "11", "PMI_RANK": "0"}
    env.update(kw)
    return {k: v for k, v in env.items() if v is not None}


def test_in_an_allocation_outside_a_step():
    assert slurm.in_allocation(BATCH)
    assert not slurm.in_allocation({**BATCH, "SLURM_STEP_ID": "3"})
    assert not slurm.in_allocation({})
    # a plain monarch serve builds the step itself in an allocation of several nodes only
    assert slurm.wants_step(BATCH)
    assert not slurm.wants_step({**BATCH, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1"})
    assert not slurm.wants_step({**BATCH, "SLURM_STEP_ID": "0"})


def test_the_step_is_one_daemon_per_node_overlapping_with_the_pmi_of_the_mpi(tmp_path):
    env = {**BATCH, "MONARCH_MPI_ENGINE": "mpich"}
    step = slurm.daemon_step(["-c", "job.yaml"], env, plugins={"pmi2", "pmix", "none"})
    assert step.mpi == "pmi2" and step.engine == "mpich"
    argv = step.argv
    assert argv[0] == "srun" and argv[argv.index(sys.executable):] == [sys.executable, "-m", "monarch", "serve",
                                                                        "-c", "job.yaml"]
    # four nodes, four tasks, whatever --ntasks-per-node (2) the allocation has
    for option in ("--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=0",
                   "--mpi=pmi2"):
        assert option in argv


def test_open_mpi_runs_under_pmix_and_mpich_is_chosen_without_it(tmp_path):
    prefix = tmp_path / "openmpi"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "bin" / "mpiexec").write_text("#!/bin/sh\n")
    os.chmod(prefix / "bin" / "mpiexec", 0o755)
    (prefix / "lib" / "libmpi.so.40").write_text("")
    env = {**BATCH, "MONARCH_OPENMPI": str(prefix)}
    step = slurm.daemon_step([], env, plugins={"pmi2", "pmix"})
    assert (step.mpi, step.engine) == ("pmix", "openmpi")
    assert step.env["MPI4PY_LIBMPI"] == str(prefix / "lib" / "libmpi.so.40")
    assert slurm.daemon_step([], env, plugins={"pmi2"}).mpi == "pmi2"  # no PMIx plugin: MPICH
    assert slurm.daemon_step([], {**env, "MONARCH_MPI_ENGINE": "mpich"}, plugins={"pmi2", "pmix"}).mpi == "pmi2"
    with pytest.raises(MonarchError, match="neither PMI2 nor PMIx"):
        slurm.daemon_step([], env, plugins={"none"})


def test_serve_slurm_outside_an_allocation_or_inside_a_step_says_where_to_run_it():
    with pytest.raises(MonarchError, match="not in a Slurm allocation"):
        slurm.daemon_step([], {}, plugins={"pmi2"})
    with pytest.raises(MonarchError, match="already in a job step"):
        slurm.daemon_step([], {**BATCH, "SLURM_STEP_ID": "1"}, plugins={"pmi2"})


def test_a_right_step_passes():
    assert slurm.wrong_launch(step_env()) is None
    assert slurm.wrong_launch(step_env(SLURM_MPI_TYPE="pmix", PMIX_RANK="0", PMI_FD=None), engine="openmpi") is None
    assert slurm.wrong_launch(step_env(SLURM_STEP_NUM_TASKS="1", SLURM_STEP_NUM_NODES="1", SLURM_MPI_TYPE="none",
                                       PMI_FD=None)) is None  # one daemon needs no PMI


@pytest.mark.parametrize("env,engine,cause,fix", [
    (step_env(SLURM_STEP_NUM_TASKS="4", SLURM_STEP_TASKS_PER_NODE="2(x2)"), "mpich",
     "srun started 4 daemons on 2 nodes", "srun -n 2 --ntasks-per-node=1"),
    (step_env(SLURM_MPI_TYPE="none", PMI_FD=None), "mpich", "without PMI (--mpi=none)", "--mpi=pmi2"),
    (step_env(SLURM_MPI_TYPE="pmix", PMIX_RANK="0", PMI_FD=None), "mpich", "the daemons' MPI is MPICH", "--mpi=pmi2"),
    (step_env(), "openmpi", "the daemons' MPI is Open MPI", "--mpi=pmix"),
])
def test_each_wrong_step_has_one_line_with_its_fix(env, engine, cause, fix):
    why = slurm.wrong_launch(env, engine=engine)
    assert why is not None and "\n" not in why
    assert cause in why and fix in why and "monarch serve --slurm" in why


def test_a_world_of_one_among_several_daemons_names_the_pmi():
    why = slurm.world_of_one(1, step_env(SLURM_MPI_TYPE="none"))
    assert "world of 1" in why and "--mpi=pmi2" in why
    assert slurm.world_of_one(2, step_env()) is None
    assert slurm.world_of_one(1, step_env(SLURM_STEP_NUM_TASKS="1")) is None


def test_the_daemons_mpi_is_told_by_mpi4pys_library():
    assert slurm.daemon_mpi({"MPI4PY_LIBMPI": "/x/openmpi/lib/libmpi.so.40"}) == "openmpi"
    assert slurm.daemon_mpi({}) == "mpich"
