"""Whose file each index entry is, as a sharded node's front door is told (``door_owners.h``).

The door copies this node's own files from the PFS and fetches the others' from their owners.
Where the placement is a ring (``Placement``, no node lost yet) the door is given the ring and
finds an entry's owner itself: one pass of C over the index's keys keeps a bit an entry (this
node's or not), and another node's file is looked up on the ring when it is fetched. Only where
there is no such ring (no placement, a node lost before the lane starts, a snapshot whose files
are not an index's) does Python compute the owner of every entry: a table of 2 bytes an entry,
one call of ``owner`` each (at 2 million files 4 MB and seconds of a core; at 100 million, 200 MB
and minutes).
"""

from __future__ import annotations

import logging
from array import array
from typing import Callable

from monarch.cluster.placement import RING_SEED
from monarch.frontdoor import FrontDoor
from monarch.node.snapshot.index_writer import positions
from monarch.node.snapshot.indextable import IndexTable

log = logging.getLogger(__name__)

OWNER_NONE = -1  # in a table: this node's own


def owners_by_entry(files, owner: Callable[[str], int], node: int) -> array:
    """The owner of each of ``files`` (a snapshot's) at its entry in the index (index_writer's
    positions); OWNER_NONE for this node's own."""
    position = positions(files)
    out = array("h", [OWNER_NONE]) * len(files)
    for key in files:
        who = owner(key)
        if who != node:
            out[position(key)] = who
    return out


class EntryOwners:
    """Who owns the files of one index (``index``: its bytes, None: not an index's) on node
    ``node``: the placement's ``ring`` (starts, nodes: ``Placement.ring``) the door is given, or
    else the table ``make_table()`` returns (owners_by_entry's), made only where the door cannot
    take the ring."""

    def __init__(self, node: int, index, entries: int, ring: tuple[list[int], list[int]] | None,
                 make_table: Callable[[], array]):
        self.node, self.entries, self._index = node, entries, index
        self._ring, self._make_table = ring, make_table
        self.table: array | None = None
        self._mine: memoryview | None = None  # the door's bits, once it took the ring
        self._own = 0

    @classmethod
    def of(cls, files, cluster, node: int) -> "EntryOwners":
        """The owners of ``files`` (a snapshot's) under ``cluster``'s placement (peer.Cluster)."""
        index = files.data if isinstance(files, IndexTable) else None  # (a Python walk's files: no index yet)
        return cls(node, index, len(files), cluster.ring() if index is not None else None,
                   lambda: owners_by_entry(files, cluster.owner, node))

    def give_to(self, door: FrontDoor) -> array | None:
        """Tell ``door`` whose file is whose by the ring, whose bits it computes; where there is no
        ring or the door cannot take it, make the table. Returns the table for ``FrontDoor.peers``
        (None: the door has the ring)."""
        if self._ring is not None and self._mine is None:
            starts, nodes = self._ring
            got = door.ring(self._index, starts, nodes, RING_SEED, self.node, self.entries)
            if got is not None:
                self._mine, self._own = got
                return None
            log.warning("the front door did not take the placement's ring: each file's owner computed here")
        if self._mine is not None:
            return None
        if self.table is None:
            self.table = self._make_table()
            self._own = self.table.count(OWNER_NONE)
        return self.table

    def stats(self) -> dict:
        """The report's ``front_door.peer_owners``: how the door was told (``ring``, ``table``, or
        ``none`` before ``give_to``) and how many of the files are this node's."""
        by = "ring" if self._mine is not None else "table" if self.table is not None else "none"
        return {"by": by, "own": self._own}

    def remote(self, at: int) -> bool:
        """Is the file at position ``at`` (its entry - 1) another node's?"""
        if self._mine is not None:
            return not (self._mine[at >> 6] >> (at & 63) & 1)
        if self.table is None:
            raise RuntimeError("EntryOwners.remote() before give_to(): the door was not told who owns what")
        return self.table[at] >= 0
