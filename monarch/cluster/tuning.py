"""The peer layer's knobs, as the parts read them (from the ``Cluster``, at each use).

``Cluster`` holds them (``peer_timeout`` from its constructor, the rest as defaults a test
may lower); every part reads them through this interface when it needs one, so that each
is stated once, on the façade.
"""

from __future__ import annotations

from typing import Protocol

HEARTBEAT = 0.25          # seconds of silence from an owner we wait on before pinging it
HEARTBEAT_TIMEOUT = 1.0   # seconds of silence (no pong either) after which it is down, not slow
REOWNED_WAIT = 1.5        # seconds a re-owned key's new owner may take to stage it before the PFS is read here


class Tuning(Protocol):
    node: int                 # this node's rank
    nodes: int                # the node count
    peer_timeout: float       # the longest a fetch waits for a slow owner (one that answers pings)
    heartbeat_timeout: float  # a silent owner (no chunk, no pong) is down after this
    chunk_size: int           # bytes per MPI message of a file
    window: int               # chunk messages in flight per transfer, each direction
    finish_timeout: float     # cap on finish() waiting for live but slow nodes
    close_timeout: float      # close() after finish(): wait this long for the coordinator's goodbye
