"""The log lines of every ``monarch`` process, one format: the launcher's, a daemon's (its
node in each line), and, in debug, each line's wall-clock time and a phase's CPU seconds."""

from __future__ import annotations

import logging
import sys
import time


def setup(verbose: int, node: str) -> None:
    """Log to standard error at ``verbose`` (0: warnings, 1: info, 2: debug) as node ``node``."""
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    # debug: each line carries its wall-clock time, so that the launcher's and the daemon's
    # phases can be put side by side (scripts/node/bench_startup.py reads them)
    stamp = "%(created).6f " if level == logging.DEBUG else ""
    # force: a standing daemon learns its node (its MPI rank) after main() set up the logging
    logging.basicConfig(level=level, format=f"[monarch node {node}] {stamp}%(levelname)s %(message)s",
                        stream=sys.stderr, force=True)
    if level == logging.DEBUG:  # and the process's CPU seconds so far at each phase
        logging.getLogger().handlers[0].addFilter(_with_cpu_seconds)


def _with_cpu_seconds(record: logging.LogRecord) -> bool:
    if isinstance(record.msg, str) and record.msg.startswith("phase ") and not record.args:
        record.msg = f"{record.msg} cpu={time.process_time():.3f}"
    return True
