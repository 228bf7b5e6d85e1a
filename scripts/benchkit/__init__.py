"""What the benchmarks under scripts/ share (not a benchmark): importing it puts this checkout's
``monarch`` and its test support (``tests/``: the emulated PFS's helpers, the readers) first on the
path, so a script runs from a checkout as it is (``python3 scripts/<group>/bench_X.py``), never
against an installed copy. A script finds it with its first two lines after the imports::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: benchkit
    from benchkit import REPO  # noqa: E402

- ``options``: what every benchmark's command line has (``--quick``, where its figures go: results/),
  this checkout's bytecode made fresh before anything is measured, the figures written as JSON
- ``pfs``: the emulated PFS (``monarch.tools.slowpfs``) checked once, with the one message
- ``cluster``: simulated nodes on this machine: mpiexec, the readers' environment and command line,
  the daemons stopped, the readers waited for
- ``namespaces``: simulated nodes with a page cache each: a mount namespace per node, its own FUSE
  mount of the emulated PFS at the same path
- ``cpuwatch``: every process of a job and its CPU-seconds by phase
- ``memory_cgroup``: a node whose memory is far smaller than the data

``checkout_env`` is the environment of a process a benchmark starts that must import the same
``monarch`` (a reader, a daemon, ``monarch run``).

The benchmarks, by what they measure: ``shim/`` (what the preloaded shim costs a process),
``node/`` (one node's daemon: misses, start-up, metadata, epochs, a million files, jobs sharing a
node), ``large/`` (large files: staged by blocks, read at random, shards), ``cluster/`` (nodes
and their peers: the sharded pattern, a lost node, remote opens, the C data path and its floors),
``store/`` (a dataset in a key-value store or an S3 bucket).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout
SCRIPTS = REPO / "scripts"

sys.path[:0] = [str(REPO), str(REPO / "tests")]  # monarch from this checkout; test support (the emulated PFS)


def checkout_env(base: dict[str, str] | None = None, tests: bool = False, **extra: object) -> dict[str, str]:
    """``base`` (this process's environment) for a child that imports this checkout's ``monarch``: the
    checkout first on ``PYTHONPATH`` (``tests``: its test support next), before what was there;
    ``extra``: variables set."""
    e = dict(os.environ if base is None else base)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), *([str(REPO / "tests")] if tests else []),
                                       *filter(None, [e.get("PYTHONPATH")])])
    e.update({k: str(v) for k, v in extra.items()})
    return e
