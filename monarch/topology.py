"""Where this process runs: node index, job id, user — from the environment, with safe defaults.

Read on call, never at import: the launcher and tests set these per process.
"""

from __future__ import annotations

import getpass
import os
from typing import Mapping

_NODE_VARS = ("MONARCH_NODE", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK", "PMIX_NODEID")
_JOB_VARS = ("MONARCH_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "COBALT_JOBID")


def node_index(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    for var in _NODE_VARS:
        value = env.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def job_id(env: Mapping[str, str] | None = None) -> str:
    """The scheduler's job id; outside a scheduler, "local" (set MONARCH_JOB_ID to separate jobs)."""
    env = os.environ if env is None else env
    for var in _JOB_VARS:
        value = env.get(var)
        if value:
            return "".join(c if c.isalnum() or c in "-_." else "_" for c in value)
    return "local"


def user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _clean(value: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in value)


def run_id(env: Mapping[str, str] | None = None) -> str | None:
    """This run's identity from its launchers, most specific first; None outside any.

    MONARCH_RUN_ID (exported by the outermost ``monarch run``), MONARCH_JOB_ID, the
    scheduler's job and step, the MPI launcher's job.
    """
    env = os.environ if env is None else env
    if env.get("MONARCH_RUN_ID"):
        return _clean(env["MONARCH_RUN_ID"])
    if env.get("MONARCH_JOB_ID"):
        return _clean(env["MONARCH_JOB_ID"])
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID")
        return _clean(env["SLURM_JOB_ID"] + (f".{step}" if step else ""))
    for var in _JOB_VARS[2:] + ("PMI_KVSNAME", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "TORCHELASTIC_RUN_ID"):
        if env.get(var):
            return _clean(env[var])
    return None


def new_run_id() -> str:
    import secrets
    import socket
    return _clean(f"run-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}")
