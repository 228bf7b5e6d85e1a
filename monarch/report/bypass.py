"""Was the dataset read through Monarch at all? The one warning ``monarch run`` prints when not.

Interposition fails silently: a wrapper that drops ``LD_PRELOAD`` (``env -u LD_PRELOAD``, a
container runtime, a setuid helper) or a statically linked reader leaves a report that looks
fine but shows no opens. The shim counts the processes it was active in (the counters'
``EXTRA_PROCESSES``, the report's ``processes_with_shim``), so the launcher can tell "the
shim was never loaded" from "it was loaded and served nothing"; and of those, the processes
that made a call under a root (``processes_at_roots``): a container runtime's own processes
load the shim from the launcher's environment and never read the dataset, so they do not
count as readers.
"""

from __future__ import annotations

from monarch.report.fallbacks import entry

# "far fewer than the dataset while the command ran long": a job that ran this long and opened
# under this share of the dataset's files through the shim most likely read it some other way
LONG_RUN_SECONDS = 300.0
FEW_OPENS_SHARE = 0.01
MIN_DATASET_FILES = 1000

NOT_LOADED = ("no process of the command ran with the Monarch shim: LD_PRELOAD was dropped on the way "
              "(a wrapper such as `env -u LD_PRELOAD`, a container runtime, a setuid helper), the "
              "reader is statically linked, or the shim could not reach the daemon's run folder or "
              "ran as another user (in a container: its own `monarch:` line said which)")
LOADED_IDLE = ("{procs} process(es) ran with the shim but none opened a file under the dataset roots "
               "through it: the readers ran without it (started outside this command, or by a wrapper "
               "that drops LD_PRELOAD), read other paths than the roots, or read nothing")
# the shim loaded, but only in processes that never looked under the roots: a runtime's wrappers
ONLY_WRAPPERS = ("the shim ran only in processes that made no call under the dataset roots (a container "
                 "runtime's or another wrapper's own): the readers ran without it (a container not passed "
                 "LD_PRELOAD and the MONARCH_* variables), read other paths than the roots, or read nothing")
ONLY_METADATA = ("no file of the dataset was opened through Monarch, though {local} stat or listing call(s) "
                 "under the roots were answered from its index: a command that only looks at the dataset "
                 "needs nothing more; if it read files, its readers ran without the shim (started outside "
                 "this command, or by a wrapper that drops LD_PRELOAD) or read other paths than the roots")
FEW = ("only {opens} open(s) of the dataset's {files} files went through the shim in {wall:.0f} s: "
       "most readers likely ran without it (a wrapper that drops LD_PRELOAD, a container, a static "
       "binary) or read other paths than the roots")


def wrote_back(report: dict) -> bool:
    """Did the shim take the job's writes under its write-back paths? (A job that only saved
    checkpoints used Monarch without reading the dataset: not a bypass.)"""
    nodes = report.get("nodes") or [report]
    return any((n.get("writeback") or {}).get("records") for n in nodes if isinstance(n, dict))


def bypass_warning(report: dict) -> str | None:
    """One line saying the dataset was not read through Monarch, and the likely causes (or,
    when only its metadata went through the shim, that and what it means); None when it was
    read through Monarch (or when there is nothing to read: an empty dataset)."""
    files = (report.get("dataset") or {}).get("files", 0)
    if not files:
        return None
    procs = report.get("processes_with_shim")  # None: an older shim, which did not count them
    opens = sum(c.get("opens", 0) for c in (report.get("opened_from") or {}).values())
    wall = (report.get("job") or {}).get("wall_seconds") or 0.0
    local = (report.get("metadata") or {}).get("local", 0)  # stats and listings answered from the index
    readers = report.get("processes_at_roots")  # None: an older shim, which did not count them
    said = [f for f in report.get("fallbacks") or () if f["reason"] not in ("no-shim", "shim-idle")]
    if said and opens == 0:  # the shim said why (a container's view of the node): each reason and its fix
        why = "; ".join(f"{f['detail']} (fix: {f['fix']})" for f in said)
    elif procs == 0:
        why = NOT_LOADED
    elif opens == 0 and local:  # the shim served the command, from the index: not "not read through Monarch"
        return ONLY_METADATA.format(local=local)
    elif opens == 0 and wrote_back(report):
        return None
    elif opens == 0 and readers == 0:
        why = ONLY_WRAPPERS
    elif opens == 0:
        why = LOADED_IDLE.format(procs=readers if readers is not None else procs if procs is not None else "some")
    elif files >= MIN_DATASET_FILES and wall >= LONG_RUN_SECONDS and opens < FEW_OPENS_SHARE * files:
        why = FEW.format(opens=opens, files=files, wall=wall)
    else:
        return None
    return f"the dataset was not read through Monarch: {why}"


def bypass_fallback(report: dict) -> dict | None:
    """The report's ``fallbacks`` entry for a command whose readers ran without the shim at all:
    ``no-shim`` (never loaded) or ``shim-idle`` (loaded only where nothing touched the roots)."""
    files = (report.get("dataset") or {}).get("files", 0)
    procs, readers = report.get("processes_with_shim"), report.get("processes_at_roots")
    if not files:
        return None
    if procs == 0:
        return entry("no-shim")
    if procs and readers == 0 and not wrote_back(report):
        return entry("shim-idle", f"{procs} process(es) with the shim, none of them a reader")
    return None
