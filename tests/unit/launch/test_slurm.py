"""monarch/launch/slurm.py without Slurm: the daemons' step for what is installed, and the
one-line cause and fix of each wrong srun line (tests/slurm runs them for real)."""

import os
import sys

import pytest

from monarch.errors import MonarchError
from monarch.launch import slurm
from monarch.launch.service import python_command

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
    # the daemons run this very package (python_command), never a monarch/ of the working directory
    assert argv[0] == "srun" and argv[argv.index(sys.executable):] == [*python_command("monarch"), "serve",
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


# -- a daemons' step that cannot start (pending), seen by a waiting launcher --------------------

RUNNING_TRAINING = slurm.JobStep("7.0", "RUNNING", "n[1-2]", "vm:100")
PENDING = slurm.JobStep("7.TDB", "PENDING", "n[1-2]", "elsewhere:200")
STEP_ENV = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n2"}


def _watch(monkeypatch, steps, argv=None, env=STEP_ENV):
    monkeypatch.setattr(slurm, "job_steps", lambda job: list(steps) if steps is not None else None)
    monkeypatch.setattr(slurm, "srun_command", lambda srun: argv)
    return slurm.PendingDaemons(env)


def test_a_pending_step_while_the_daemon_is_absent_is_said_with_its_fix(monkeypatch):
    watch = _watch(monkeypatch, [RUNNING_TRAINING, PENDING])
    said = [(t, watch.check(t)) for t in (1.0, 5.0, 10.0, 15.0)]
    assert [why is None for _, why in said] == [True, True, True, False]  # seen at 5 s, pending 10 s at 15 s
    why = said[-1][1]
    assert "step 7.TDB (srun elsewhere:200) has been pending for 10 s" in why
    assert "--overlap" in why and "monarch serve --slurm" in why and "\n" not in why


def test_a_pending_srun_of_monarch_serve_on_this_host_is_named(monkeypatch):
    argv = ["srun", "-n", "2", "--ntasks-per-node=1", "monarch", "serve", "-c", "job.yaml"]
    other = slurm.JobStep("7.3", "RUNNING", "n1", "vm:300")  # a running step does not hide it: its srun is seen
    watch = _watch(monkeypatch, [RUNNING_TRAINING, other, PENDING], argv)
    assert watch.check(5.0) is None
    assert "`srun -n 2 --ntasks-per-node=1 monarch serve -c job.yaml` has been pending for 10 s" in watch.check(15.0)


@pytest.mark.parametrize("case", ["not monarch serve", "another step runs", "not this node", "no longer pending",
                                  "no answer", "MONARCH_JOB_ID by hand", "not under Slurm"])
def test_what_is_not_a_stuck_daemons_step_is_not_said(monkeypatch, case):
    steps, argv, env = [RUNNING_TRAINING, PENDING], None, dict(STEP_ENV)
    if case == "not monarch serve":
        argv = ["srun", "-n", "2", "python", "eval.py"]
    elif case == "another step runs":  # maybe the daemons', still starting
        steps.append(slurm.JobStep("7.1", "RUNNING", "n[1-2]", "elsewhere:201"))
    elif case == "not this node":
        steps[1] = slurm.JobStep("7.TDB", "PENDING", "n1", "elsewhere:200")
    elif case == "no answer":
        steps = None
    elif case == "MONARCH_JOB_ID by hand":  # the daemons may be another allocation's
        env["MONARCH_JOB_ID"] = "shared"
    elif case == "not under Slurm":
        env = {}
    watch = _watch(monkeypatch, steps, argv, env)
    for t in (5.0, 10.0):
        assert watch.check(t) is None
    if case == "no longer pending":
        steps[1] = slurm.JobStep("7.1", "RUNNING", "n[1-2]", "elsewhere:200")
    assert [watch.check(t) for t in (15.0, 20.0, 60.0)] == [None] * 3


def test_the_steps_of_a_job_as_scontrol_prints_them(monkeypatch):
    import subprocess
    text = ("StepId=7.0 UserId=0 StartTime=2026-11-23T12:19:25 TimeLimit=UNLIMITED State=RUNNING Partition=debug "
            "NodeList=n[1-2] Nodes=2 CPUs=4 Tasks=4 Name=sleep Network=(null) SrunHost:Pid=vm:7714\n"
            "StepId=7.TDB UserId=0 StartTime=Unknown TimeLimit=UNLIMITED State=PENDING Partition=debug "
            "NodeList=n[1-2] Nodes=2 CPUs=2 Tasks=2 Name=(null) Network=(null) TRES=(null) SrunHost:Pid=vm:7845\n")
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0, text, ""))
    assert slurm.job_steps("7") == [slurm.JobStep("7.0", "RUNNING", "n[1-2]", "vm:7714"),
                                    slurm.JobStep("7.TDB", "PENDING", "n[1-2]", "vm:7845")]
    assert [slurm.expand_hostlist(t) for t in ("n[1-3,5],m2", "gpu[01-02]-ib", "n1", "n[1-2]x[3]")] == [
        ["n1", "n2", "n3", "n5", "m2"], ["gpu01-ib", "gpu02-ib"], ["n1"], None]


def test_the_srun_of_a_pending_step_is_read_only_on_this_host(tmp_path):
    import socket
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cmdline").write_bytes(b"/usr/bin/srun\0-n\0002\0monarch\0serve\0")
    here = socket.gethostname().split(".")[0]
    assert slurm.srun_command(f"{here}:42", str(tmp_path)) == ["/usr/bin/srun", "-n", "2", "monarch", "serve"]
    assert slurm.srun_command(f"not-{here}:42", str(tmp_path)) is None
    assert slurm.srun_command(f"{here}:43", str(tmp_path)) is None
