"""What runs whose daemons are gone left of their write-back on this node (docs/consistency.md,
"Write-back", W8): the user's areas in a tier's base with no live owner, each drained as its
daemon would have drained it (in the job's order, each file whole under its name), then removed;
or kept, saying why and where each unpublished file's bytes are. Nothing that is not on the PFS
is deleted.

One path for ``monarch drain`` (monarch/cli.py) and for the next ``monarch run`` on the node
(monarch/launch/run.py), which each say the results their own way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from monarch.writeback.area import PREFIX, Area, run_and_node
from monarch.writeback.drain import Outcome, drain
from monarch.writeback.journal import JournalError


@dataclass
class Drained:
    """One area's drain: what it published, and what became of the area."""
    path: str
    outcome: Outcome | None = None  # None: nothing recorded (its daemon died before the job wrote anything)
    error: str | None = None        # it could not be drained at all: kept
    never_closed: int = 0           # files its job never closed: kept (not a file the job finished), not published
    removed: bool = False

    @property
    def complete(self) -> bool:
        """Everything its job closed is on the PFS (files it never closed may be kept)."""
        return self.error is None and (self.outcome is None or self.outcome.complete)


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


def drain_area(area: Area) -> Drained:
    """Drain one area whose run is gone (held by this process), and remove it once nothing of it
    is left; else release it, kept for the next drain."""
    run, _ = run_and_node(os.path.basename(area.path))
    try:
        if not os.path.exists(area.journal_path) and not area.pending_data():
            out = None  # made, then its daemon died before the job wrote anything
        elif not run:
            raise JournalError(f"not the name of an area Monarch makes ({PREFIX}<run>-node<N>)")
        else:
            out = drain(area, run)
    except (OSError, JournalError) as e:
        area.release()
        return Drained(area.path, error=str(e))
    if out is not None and not out.complete:
        area.release()
        return Drained(area.path, out)
    left = area.pending_data()
    if left:  # files the job never closed: not published (it did not finish them), nor deleted
        area.release()
        return Drained(area.path, out, never_closed=len(left))
    area.remove()
    return Drained(area.path, out, removed=True)
