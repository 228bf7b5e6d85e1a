"""Where this process runs: node index, run identity, user — from the environment, with safe
defaults.

Read on call, never at import: the launcher and tests set these per process.
"""

from __future__ import annotations

import getpass
import os
import socket
import string
from typing import Mapping

# where the node index comes from, first found wins (monarch/environment.py declares MONARCH_NODE)
NODE_VARS = ("MONARCH_NODE", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK", "PMIX_NODEID")

ENV_JOB_ID = "MONARCH_JOB_ID"  # explicit: the user's name for the run, wins over everything
ENV_RUN_ID = "MONARCH_RUN_ID"  # exported by `monarch run` to its command (nested runs share it)

# Schedulers' job ids (Slurm's is refined by the step, below).
_SCHEDULER_VARS = ("PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "COBALT_JOBID")
# MPI launchers' job ids: Open MPI (<= 4, then PMIx in 5 / PRRTE) and torchrun.
_LAUNCHER_VARS = ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "TORCHELASTIC_RUN_ID")
# MPICH's Hydra names no job in the environment of its processes: with its default PMI_FD
# wire-up a rank sees only PMI_RANK, PMI_SIZE, PMI_FD, PMI_HOSTNAME, MPI_LOCALNRANKS and
# MPI_LOCALRANKID (the KVS name is answered over the PMI socket, which belongs to the app);
# with -pmi-port it sees PMI_PORT (host:port of its node's proxy, one per job and node) and
# PMI_ID. Without PMI_PORT, the job on this node is the process that serves our PMI_FD: the
# hydra_pmi_proxy above us (one per job and node), or MPICH's single-node mpiexec.gforker.
_PMI_SERVERS = frozenset({"hydra_pmi_proxy", "mpiexec.gforker"})


def node_index(env: Mapping[str, str] | None = None) -> int:
    """This node's index: the first of ``NODE_VARS`` set to a number, else 0."""
    env = os.environ if env is None else env
    for var in NODE_VARS:
        value = env.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def node_index_given(env: Mapping[str, str] | None = None) -> bool:
    """Does the environment name this node's index (rather than ``node_index`` defaulting to 0)?"""
    env = os.environ if env is None else env
    return any(env.get(var, "").isdigit() for var in NODE_VARS)


def run_id(env: Mapping[str, str] | None = None) -> str | None:
    """The identity of this run on this node, most specific first, sanitised to [A-Za-z0-9._-]:

    1. ``MONARCH_JOB_ID`` (explicit);
    2. the scheduler's job and step: ``SLURM_JOB_ID.SLURM_STEP_ID`` (the job alone outside a
       step), ``PBS_JOBID``, ``LSB_JOBID``, ``FLUX_JOB_ID``, ``COBALT_JOBID``;
    3. the MPI launcher's job: MPICH (Hydra's ``PMI_PORT``, else the process serving our
       ``PMI_FD``: Hydra's proxy on this node or ``mpiexec.gforker``),
       Open MPI (``OMPI_MCA_ess_base_jobid``, ``PMIX_NAMESPACE``), torchrun
       (``TORCHELASTIC_RUN_ID``);
    4. ``MONARCH_RUN_ID``, inherited from an outer ``monarch run``;

    else ``None``: the caller is the outermost ``monarch run`` of an unscheduled run and makes
    a new one (:func:`new_run_id`).
    """
    env = os.environ if env is None else env
    for value in _run_id_candidates(env):
        if value:
            return _sanitise(value)
    return None


def _run_id_candidates(env: Mapping[str, str]):
    yield env.get(ENV_JOB_ID)
    slurm_job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if slurm_job:
        step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
        yield f"{slurm_job}.{step}" if step else slurm_job
    for var in _SCHEDULER_VARS:
        yield env.get(var)
    yield _mpich_job(env)
    for var in _LAUNCHER_VARS:
        yield env.get(var)
    yield env.get(ENV_RUN_ID)


def _mpich_job(env: Mapping[str, str]) -> str | None:
    if env.get("PMI_PORT") and env.get("PMI_ID") is not None:
        return f"hydra-{env['PMI_PORT']}"
    if env.get("PMI_FD") is None or env.get("PMI_RANK") is None:
        return None
    server = _ancestor(_PMI_SERVERS)
    return None if server is None else f"mpich-{server[0]}-{server[1]}"


def _ancestor(names: frozenset[str], proc: str = "/proc") -> tuple[int, str] | None:
    """(pid, start time) of the nearest ancestor process whose name is in ``names``, or None."""
    pid = os.getppid()
    for _ in range(64):
        if pid <= 1:
            return None
        try:
            with open(f"{proc}/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return None
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, ..., starttime is the 20th
        if name in names:
            return pid, fields[19]  # the start time tells a reused pid apart
        pid = int(fields[1])
    return None


def new_run_id() -> str:
    """A fresh identity for a run no launcher names: unique on this node and over time."""
    return _sanitise(f"run-{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}")


_SAFE = frozenset(string.ascii_letters + string.digits + "._-")


def _sanitise(value: str) -> str:
    return "".join(c if c in _SAFE else "_" for c in value)


def job_id(env: Mapping[str, str] | None = None) -> str:
    """The job's identity, the name a standing ``monarch serve`` takes and its job's launchers
    look for: ``MONARCH_JOB_ID``, else the scheduler's job (without the step: the daemons'
    step and the training's step differ), else "local"."""
    env = os.environ if env is None else env
    for value in (env.get(ENV_JOB_ID), env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"),
                  *(env.get(var) for var in _SCHEDULER_VARS)):
        if value:
            return _sanitise(value)
    return "local"


def user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())

