"""What serves this node now: the dataset snapshot and the stager over it, swapped together.

Until the walk ends both are empty stand-ins; the daemon swaps in the real ones (or, when the
walk fails, empty ones again) under the snapshot gate's lock. Every part that answers from
them (the resolver, the cluster role, the front door's link) holds this one object and reads
its two fields at each call, never a copy taken earlier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from monarch.node.snapshot.gate import SnapshotGate, SnapshotState
from monarch.node.snapshot.snapshot import Snapshot

if TYPE_CHECKING:
    from monarch.node.stage.stager import Stager


class Current:
    def __init__(self, gate: SnapshotGate, snapshot: Snapshot):
        self.gate = gate
        self.snapshot = snapshot
        self.stager: "Stager | None" = None  # the first one is installed by the daemon (install_locked)

    @property
    def ready(self) -> bool:
        return self.gate.state is SnapshotState.READY

    def install_locked(self, snapshot: Snapshot, stager: "Stager") -> "Stager | None":
        """Serve from ``snapshot`` and ``stager`` from now on (under ``gate.lock``); returns
        the stager they replace, for the caller to shut down."""
        old, self.snapshot, self.stager = self.stager, snapshot, stager
        return old
