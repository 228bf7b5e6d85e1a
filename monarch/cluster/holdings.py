"""What each node keeps of earlier runs' writes, told to the others as it is kept (the copies a job
published, or its partner's: monarch/node/kept_reads.py). The nodes learn each other's holdings at
their start by a collective (``Cluster.allgather_bytes``); a copy kept later (a job of the same
allocation that saved) is told here, so that the next job on another node reads it from there:

  ``("kept", entries)``   these copies are kept on the sending node now: [path, size, mtime_ns,
                          ctime_ns, ino, rate] each (rate: the PFS's bytes a second as the drain met them)

A message lost with its node costs nothing: an asker finds the holder lost and reads elsewhere.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

from .control import Handler, Verb, message
from .engine import Engine

log = logging.getLogger(__name__)


class Holdings:
    """This node's word of the copies it keeps, to every live node, and theirs, to ``listen``'s callback."""

    def __init__(self, engine: Engine, node: int, nodes: int, is_lost: Callable[[int], bool]):
        self.engine, self.node, self.nodes, self._is_lost = engine, node, nodes, is_lost
        self._listener: Callable[[int, list], None] | None = None

    def handlers(self) -> Mapping[Verb, Handler]:
        return {Verb.KEPT: self._on_kept}

    def listen(self, listener: Callable[[int, list], None]) -> None:
        """``listener(node, entries)`` on the engine thread for each node's word (quick: no I/O)."""
        self._listener = listener

    def tell(self, entries: list) -> None:
        """``entries`` kept here now, to every other live node (any thread)."""
        if not entries or self.nodes < 2:
            return
        peers = [k for k in range(self.nodes) if k != self.node and not self._is_lost(k)]
        self.engine.call(lambda: [self.engine.send_obj(message(Verb.KEPT, entries), k) for k in peers])

    def _on_kept(self, src: int, entries) -> None:
        if self._listener is None or not isinstance(entries, list):
            return
        try:
            self._listener(src, entries)
        except Exception:  # a bad word from a peer is dropped, said: never the engine thread's end
            log.exception("kept copies: node %d's word not taken", src)
