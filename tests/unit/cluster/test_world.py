"""MPI's process-wide facts without starting MPI (monarch/cluster/world.py): this process's rank
from the launcher's variables, where the daemons' Open MPI is, and the daemons' launch line."""

from __future__ import annotations

import os
import sys

import pytest

from monarch.cluster import world
from monarch.cluster.world import MPICH, OPENMPI_LIB, ULFM, daemon_launch, mpi_world_rank, openmpi_prefix


@pytest.fixture(autouse=True)
def mpi_not_initialised(monkeypatch):
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)  # the launcher's variables decide


@pytest.mark.parametrize("environ, rank", [
    ({}, None),
    ({"PMI_RANK": "3"}, 3),                                       # MPICH's hydra, Slurm's PMI2
    ({"PMIX_RANK": "2", "OMPI_COMM_WORLD_RANK": "5"}, 2),         # the most specific first
    ({"PMI_RANK": "", "OMPI_COMM_WORLD_RANK": "5"}, 5),           # an empty variable is no rank
    ({"MV2_COMM_WORLD_RANK": "x", "SLURM_PROCID": "1"}, None),    # SLURM_PROCID outside a step: no rank
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}, 1),             # inside a job step
    ({"SLURM_STEP_ID": "batch", "SLURM_PROCID": "0"}, None),      # the batch script is not a rank
    ({"SLURM_STEP_ID": "extern", "SLURM_PROCID": "0"}, None),
])
def test_the_rank_comes_from_the_launchers_variables(environ, rank):
    assert mpi_world_rank(environ) == rank


def fake_openmpi(base) -> str:
    prefix = os.path.join(base, "openmpi")
    os.makedirs(os.path.join(prefix, "bin"))
    os.makedirs(os.path.join(prefix, "lib"))
    mpiexec = os.path.join(prefix, "bin", "mpiexec")
    with open(mpiexec, "w") as f:
        f.write("#!/bin/sh\n")
    open(os.path.join(prefix, "lib", OPENMPI_LIB), "w").close()
    return prefix


def test_open_mpi_is_found_only_with_its_mpiexec_runnable_and_its_library(tmp_path, monkeypatch):
    monkeypatch.setattr(world.sys, "prefix", str(tmp_path / "no-python-prefix"))
    prefix = fake_openmpi(tmp_path)
    assert openmpi_prefix({"MONARCH_OPENMPI": prefix}) is None  # mpiexec not executable yet
    os.chmod(os.path.join(prefix, "bin", "mpiexec"), 0o755)
    assert openmpi_prefix({"MONARCH_OPENMPI": prefix}) == prefix
    os.remove(os.path.join(prefix, "lib", OPENMPI_LIB))
    assert openmpi_prefix({"MONARCH_OPENMPI": prefix}) is None
    assert openmpi_prefix({}) is None


def test_the_daemons_run_under_open_mpi_with_ulfm_when_it_is_installed(tmp_path, monkeypatch):
    prefix = fake_openmpi(tmp_path)
    os.chmod(os.path.join(prefix, "bin", "mpiexec"), 0o755)
    environ = {"MONARCH_OPENMPI": prefix, "PATH": "/usr/bin"}
    launch = daemon_launch(4, environ=environ)
    try:
        assert launch.engine == ULFM
        assert launch.argv[:3] == [os.path.join(prefix, "bin", "mpiexec"), "--with-ft", "ulfm"]
        assert launch.argv[-2:] == ["-n", "4"] and "ppr:1:node" in launch.argv  # one daemon per host
        assert launch.env["MPI4PY_LIBMPI"] == os.path.join(prefix, "lib", OPENMPI_LIB)
        assert launch.env["PATH"] == os.path.join(prefix, "bin") + os.pathsep + "/usr/bin"
        assert launch.env["PRTE_MCA_prte_tmpdir_base"] == launch.scratch and os.path.isdir(launch.scratch)
        one_host = daemon_launch(3, one_host=True, environ=environ)
        assert "--oversubscribe" in one_host.argv and "ppr:1:node" not in one_host.argv
        one_host.close()
    finally:
        scratch = launch.scratch
        launch.close()
    assert not os.path.exists(scratch) and launch.scratch is None
    launch.close()  # twice: nothing left to remove


def test_mpich_is_the_fallback_and_can_be_chosen(tmp_path, monkeypatch):
    monkeypatch.setattr(world, "mpich_mpiexec", lambda: "/opt/mpich/bin/mpiexec")
    monkeypatch.setattr(world, "openmpi_prefix", lambda environ: None)
    assert daemon_launch(2, environ={}).argv == ["/opt/mpich/bin/mpiexec", "-disable-auto-cleanup", "-n", "2",
                                                 "-ppn", "1"]
    assert daemon_launch(2, one_host=True, environ={}).engine == MPICH
    with pytest.raises(RuntimeError, match="MONARCH_MPI_ENGINE=ulfm but no Open MPI found"):
        daemon_launch(2, environ={"MONARCH_MPI_ENGINE": ULFM})
    monkeypatch.setattr(world, "mpich_mpiexec", lambda: None)
    with pytest.raises(RuntimeError, match="no mpiexec found"):
        daemon_launch(2, environ={})


def test_a_forced_mpich_ignores_an_installed_open_mpi(tmp_path, monkeypatch):
    prefix = fake_openmpi(tmp_path)
    os.chmod(os.path.join(prefix, "bin", "mpiexec"), 0o755)
    monkeypatch.setattr(world, "mpich_mpiexec", lambda: "/opt/mpich/bin/mpiexec")
    launch = daemon_launch(2, environ={"MONARCH_OPENMPI": prefix, "MONARCH_MPI_ENGINE": MPICH})
    assert launch.engine == MPICH and launch.scratch is None


def test_a_peer_failure_is_noted_once_for_the_process(monkeypatch, caplog):
    monkeypatch.setattr(world._state, "failure_seen", False)
    assert not world.failure_seen()
    world.note_failure("node 1 lost")
    world.note_failure("node 2 lost")
    assert world.failure_seen()
    assert caplog.text.count("MPI_Finalize will be skipped at exit") == 1
