"""The run identity: which launcher names the run, most specific first."""

import os
import subprocess
import sys

import pytest

from monarch import topology
from monarch.config import load_config
from monarch.topology import job_id, new_run_id, run_id

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}
HYDRA_PORT = {"PMI_PORT": "node7:41234", "PMI_ID": "1", "PMI_RANK": "1", "PMI_SIZE": "4"}


@pytest.fixture(autouse=True)
def no_pmi_server(monkeypatch):
    """The tests run under whatever launched pytest: no real ancestor is looked at unless asked."""
    monkeypatch.setattr(topology, "_ancestor", lambda names: None)


@pytest.mark.parametrize("env, expected", [
    # explicit wins over everything
    ({"MONARCH_JOB_ID": "mine", **SLURM, **HYDRA_PORT, "MONARCH_RUN_ID": "outer"}, "mine"),
    # the scheduler's job and step; the job alone outside a step (the batch script)
    ({**SLURM, **HYDRA_PORT, "TORCHELASTIC_RUN_ID": "t", "MONARCH_RUN_ID": "outer"}, "4242.3"),
    ({"SLURM_JOB_ID": "4242"}, "4242"),
    ({"SLURM_JOBID": "17", "SLURM_STEPID": "0"}, "17.0"),
    ({"PBS_JOBID": "88.pbs-server", **HYDRA_PORT}, "88.pbs-server"),
    ({"LSB_JOBID": "5"}, "5"),
    ({"FLUX_JOB_ID": "f2Tg9sGqz", "TORCHELASTIC_RUN_ID": "t"}, "f2Tg9sGqz"),
    ({"COBALT_JOBID": "9"}, "9"),
    # the MPI launcher's job, before a run id inherited from an outer `monarch run`
    ({**HYDRA_PORT, "MONARCH_RUN_ID": "outer"}, "hydra-node7_41234"),
    ({"OMPI_MCA_ess_base_jobid": "123456789", "MONARCH_RUN_ID": "outer"}, "123456789"),
    ({"PMIX_NAMESPACE": "prterun-n1-1234@1", "PMIX_RANK": "0"}, "prterun-n1-1234_1"),
    ({"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "MONARCH_RUN_ID": "outer"}, "none"),
    ({"MONARCH_RUN_ID": "outer"}, "outer"),
    # empty values name nothing
    ({"MONARCH_JOB_ID": "", "SLURM_JOB_ID": "", "MONARCH_RUN_ID": "outer"}, "outer"),
    ({}, None),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "PMI_FD": "9"}, None),  # no PMI server found above us
])
def test_precedence(env, expected):
    assert run_id(env) == expected


@pytest.mark.parametrize("env, expected", [
    ({"MONARCH_JOB_ID": "mine", **SLURM}, "mine"),
    ({**SLURM, **HYDRA_PORT, "MONARCH_RUN_ID": "outer"}, "4242"),  # the job, whatever its step
    ({"PBS_JOBID": "88.pbs-server"}, "88.pbs-server"),
    ({**HYDRA_PORT, "MONARCH_RUN_ID": "outer"}, "local"),  # an MPI launch or a run is not a job
    ({}, "local"),
])
def test_the_job_is_what_a_standing_daemon_and_its_launchers_share(env, expected):
    assert job_id(env) == expected


def test_sanitised_to_a_safe_file_name():
    assert run_id({"MONARCH_JOB_ID": "a/b c;..é"}) == "a_b_c_.._"
    assert run_id({"SLURM_JOB_ID": "1/2", "SLURM_STEP_ID": "batch"}) == "1_2.batch"


def test_hydra_pmi_fd_names_the_run_after_the_proxy_above(monkeypatch):
    found = []
    monkeypatch.setattr(topology, "_ancestor", lambda names: found.append(names) or (4321, "987654"))
    env = {"PMI_RANK": "0", "PMI_SIZE": "2", "PMI_FD": "9", "MONARCH_RUN_ID": "outer"}
    assert run_id(env) == "mpich-4321-987654"
    assert "hydra_pmi_proxy" in found[0] and "mpiexec.gforker" in found[0]
    assert run_id({**env, **SLURM}) == "4242.3"  # a scheduler step is more specific than its launcher


def test_ancestor_walks_the_real_process_tree(monkeypatch):
    monkeypatch.undo()
    assert topology._ancestor(frozenset({"no-such-process"})) is None
    # a child finds this very process among its ancestors by its name, with its start time
    with open(f"/proc/{os.getpid()}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    with open(f"/proc/{os.getpid()}/comm") as f:
        name = f.read().strip()
    code = "import sys; from monarch import topology; print(topology._ancestor(frozenset({sys.argv[1]})))"
    out = subprocess.run(["sh", "-c", 'exec "$0" "$@"', sys.executable, "-c", code, name],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.stdout.strip() == str((os.getpid(), start)), out.stderr


def test_new_run_ids_are_unique_and_safe():
    ids = {new_run_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("run-") and run_id({"MONARCH_JOB_ID": i}) == i for i in ids)


def test_the_configuration_sees_the_run_id_as_monarch_job_id(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text('dataset: {roots: [/d]}\nrun_base: "/r/${MONARCH_JOB_ID}"\n')
    env = {"USER": "u", "MONARCH_NODE": "0"}
    load = lambda extra: load_config(cfg, env={**env, **extra}, check_roots=False)  # noqa: E731
    assert load(SLURM).run_base == "/r/4242.3"
    assert load({"MONARCH_RUN_ID": "run-x"}).run_base == "/r/run-x"
    assert load(HYDRA_PORT).run_base == "/r/hydra-node7_41234"
    assert load({}).run_base == "/r/local"  # `monarch run` names such a run itself


@pytest.mark.parametrize("env, index, given", [
    ({}, 0, False),
    ({"MONARCH_NODE": "3", "SLURM_NODEID": "1"}, 3, True),  # Monarch's own first
    ({"SLURM_NODEID": "2"}, 2, True),
    ({"OMPI_COMM_WORLD_NODE_RANK": "0"}, 0, True),  # node 0, given: not the default
    ({"MONARCH_NODE": "x", "PMIX_NODEID": "5"}, 5, True),  # not a number: the next source
    ({"MONARCH_NODE": ""}, 0, False),
])
def test_node_index_and_whether_it_is_given(env, index, given):
    assert topology.node_index(env) == index
    assert topology.node_index_given(env) is given
    assert topology.NODE_VARS[0] == "MONARCH_NODE"
