"""The peers' control messages: their verbs, declared once, and the verb -> handler table.

A control message is a pickled tuple sent on ``engine.TAG_CTRL``, its verb first (a plain
string on the wire: peers of one version only). Each part of the peer layer serves its own
verbs and hands ``ControlTable`` a ``{verb: handler}`` mapping of them once, at start:

  the provider (provide.py)   ``("req", tag, key)``, ``("range", tag, key, offset, length)``,
                              ``("cancel", tag)``
  liveness (liveness.py)      ``("ping",)``, ``("pong",)``
  shutdown (shutdown.py)      ``("done",)``, ``("stats", stats)``, ``("release",)``, ``("bye",)``
  write order (order.py)      ``("wb-ask", tag)``, ``("wb-told", tag, made, applied, failed)``,
                              ``("wb-applied", applied, failed)``
  partner copies (partner.py) ``("wb-data", tag, seq, offset, data, last)``, ``("wb-record", tag, line)``,
                              ``("wb-held", tag, ok)``, ``("wb-replayed", node, applied, failed, done)``
  kept copies (holdings.py)   ``("kept", entries)``

The engine thread calls ``ControlTable.dispatch(src, msg)`` for every message: it notes
that ``src`` is alive, then calls the verb's handler with ``(src, *arguments)``.
"""

from __future__ import annotations

import enum
import logging
from typing import Any, Callable, Mapping

log = logging.getLogger(__name__)


class Verb(str, enum.Enum):
    """The verbs of control messages (sent as ``verb.value``: the wire holds plain strings)."""

    REQ = "req"            # (tag, key): send me ``key`` on reply tag ``tag`` (transfer.py)
    RANGE = "range"        # (tag, key, offset, length): send me those bytes of ``key`` (a large file's blocks)
    CANCEL = "cancel"      # (tag,): I gave up on the request with reply tag ``tag``
    PING = "ping"          # (): are you alive? (answered PONG)
    PONG = "pong"          # (): yes (any message says so; this one says nothing else)
    DONE = "done"          # (): finish(): this node is done, to the coordinator
    STATS = "stats"        # (stats,): finish(): this node's statistics, to the coordinator
    RELEASE = "release"    # (): finish(): the coordinator releases the node
    BYE = "bye"            # (): close(): the coordinator wrote the report; the node may exit
    WB_ASK = "wb-ask"      # (tag,): what has your write-back journal made and applied? (order.py)
    WB_TOLD = "wb-told"    # (tag, made, applied, failed): the answer
    WB_APPLIED = "wb-applied"  # (applied, failed): my write-back drain moved
    WB_DATA = "wb-data"    # (tag, seq, offset, data, last): bytes of my write-back file, to hold (partner.py)
    WB_RECORD = "wb-record"  # (tag, line): a record of my write-back journal, to hold
    WB_HELD = "wb-held"    # (tag, ok): held (False: not, this node has no write-back)
    WB_REPLAYED = "wb-replayed"  # (node, applied, failed, done): lost node's held copies published so far
    KEPT = "kept"          # (entries,): copies of earlier runs' writes kept on this node now (holdings.py)

    def __str__(self) -> str:
        return self.value


def message(verb: Verb, *args: Any) -> tuple:
    """A control message as it goes on the wire."""
    return (verb.value, *args)


Handler = Callable[..., None]  # (src, *the message's arguments), on the engine thread


class ControlTable:
    """Routes each control message to the part that serves its verb (built once, at start)."""

    def __init__(self, on_heard: Callable[[int], None], *parts: Mapping[Verb, Handler]):
        self._on_heard = on_heard
        self._handlers: dict[str, Handler] = {}
        for part in parts:
            for verb, handler in part.items():
                if verb.value in self._handlers:
                    raise ValueError(f"control verb {verb.value!r} has two handlers")
                self._handlers[verb.value] = handler

    def dispatch(self, src: int, msg: tuple) -> None:
        """Engine thread: one control message from node ``src``."""
        self._on_heard(src)
        handler = self._handlers.get(msg[0])
        if handler is None:
            log.warning("unknown control message %r from node %d", msg[0], src)
            return
        handler(src, *msg[1:])
