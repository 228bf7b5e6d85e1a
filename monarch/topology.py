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
