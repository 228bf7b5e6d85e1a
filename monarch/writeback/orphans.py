"""What runs whose daemons are gone left of their write-back on this node (docs/consistency.md,
"Write-back", W8): the user's areas in a tier's base with no live owner, each held by the caller,
which drains them in the job's order (across.py), then removes them; or keeps them, saying why and
where each unpublished file's bytes are. Nothing that is not on the PFS is deleted.

One path for ``monarch drain`` (monarch/cli.py) and for the next ``monarch run`` on the node
(monarch/launch/run.py), which each say the results their own way.
"""

from __future__ import annotations

import json
import os
import time

from monarch.errors import MonarchError
from monarch.secure import user_dir
from monarch.writeback.area import DONE, PREFIX, Area, run_and_node

DONE_KEPT_S = 30 * 86400  # what a finished run left beside its area is dropped after this long (a few dozen bytes)


def find_left(base: str, but_run: str | None = None) -> tuple[list[str], list[Area]]:
    """This user's write-back areas in ``base`` (a tier's base): those whose run still lives (left
    to it), and those whose run is gone, each held now by this process (no other drain takes it
    meanwhile). ``but_run``: that run's areas are neither (it is starting its daemon). Another
    user's directory is never looked in."""
    mine = os.path.join(os.path.realpath(base), f"monarch-{os.getuid()}")
    if not os.path.isdir(mine):
        return [], []
    areas = Area.orphans(base, but_run=but_run)
    taken = {os.path.basename(a.path) for a in areas}
    live = [os.path.join(mine, n) for n in sorted(os.listdir(mine))
            if n.startswith(PREFIX) and n not in taken and (but_run is None or run_and_node(n)[0] != but_run)]
    return live, areas


def finished(base: str) -> dict[tuple[str, int], dict]:
    """What cluster runs' daemons that finished cleanly left beside their removed areas in ``base``:
    (run, node) -> {"applied": n, "heard": {node: n}} (monarch/writeback/area.py ``DONE``). Those
    older than DONE_KEPT_S are removed."""
    try:
        parent = user_dir(base)
        names = [n for n in os.listdir(parent) if n.startswith(PREFIX) and n.endswith(DONE)]
    except (OSError, MonarchError):
        return {}
    found = {}
    for name in names:
        path = os.path.join(parent, name)
        run, node = run_and_node(name[:-len(DONE)])
        try:
            if time.time() - os.lstat(path).st_mtime > DONE_KEPT_S:
                os.unlink(path)
                continue
            with open(path, "rb") as f:
                done = json.loads(f.readline())
            found[(run, int(node))] = {"applied": int(done["applied"]),
                                       "heard": {int(k): int(v) for k, v in done.get("heard", {}).items()}}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue  # unreadable: a drain knows less, and keeps more
    return found
