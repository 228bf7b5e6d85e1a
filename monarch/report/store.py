"""A report on disk: written privately through a fresh name, read back with its schema checked."""

from __future__ import annotations

import json
import os

from monarch.errors import MonarchError
from monarch.report.build import SCHEMA

# `monarch report` prints older reports too, their keys renamed as today's (``_as_current``)
READABLE_SCHEMAS = ("monarch.report/1", "monarch.report/2", "monarch.report/3", SCHEMA)
RENAMED_KEYS = {"sources": "opened_from"}  # in the report and in each node's statistics, before /4


def write_report(report: dict, path: str) -> None:
    """Write the report through a fresh temporary name (never through a planted symlink),
    readable by its owner only, like everything else of the run (its paths, its command)."""
    from monarch.secure import write_file_atomically
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_file_atomically(path, (json.dumps(report, indent=2) + "\n").encode(), mode=0o600)


def load_report(path: str) -> dict:
    try:
        with open(path) as f:
            report = json.load(f)
    except OSError as e:
        raise MonarchError(f"report {path}: cannot read it: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise MonarchError(f"report {path}: not JSON (line {e.lineno}): {e.msg}") from None
    if not isinstance(report, dict) or report.get("schema") not in READABLE_SCHEMAS:
        raise MonarchError(f"report {path}: not a Monarch report (schema {' or '.join(READABLE_SCHEMAS)})")
    return _as_current(report)


def _as_current(report: dict) -> dict:
    """An older report with today's key names, so one printer reads every readable schema."""
    if report["schema"] == SCHEMA:
        return report
    def renamed(d: dict) -> dict:
        return {RENAMED_KEYS.get(k, k): v for k, v in d.items()}
    out = renamed(report)
    out["nodes"] = [renamed(n) if isinstance(n, dict) else n for n in report.get("nodes", [])]
    return out
