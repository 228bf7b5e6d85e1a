"""Every answer the daemon gives the shim's OPEN, by outcome: declared once, counted by name.

The report's ``resolves`` counts them (docs/report.md). ``Outcome`` is a string
enumeration, so a count keyed by it crosses JSON and MPI as the plain names below.
"""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """How one OPEN was answered: a copy here (``staged``, ``fetched`` from the owner, found
    ``already_``), decoded or inflated for a compressed copy, or read the PFS (``pfs:``, why)."""

    def __str__(self) -> str:
        return self.value

    # a copy made for this open, from the PFS (staged) or from the owning node (fetched)
    STAGED = "staged"
    STAGED_DECODED = "staged:decoded"    # a compressed copy's kept decoded file
    STAGED_INFLATED = "staged:inflated"  # a compressed copy decoded into a memfd
    FETCHED = "fetched"
    FETCHED_DECODED = "fetched:decoded"
    FETCHED_INFLATED = "fetched:inflated"
    FETCHED_TRANSIENT = "fetched:transient"  # the peer area had no room: a memfd of the owner's bytes
    # a large file staged by blocks: opened on the PFS, its staged blocks read from the copy
    BY_BLOCKS = "by_blocks"
    # a copy that was there already
    ALREADY_STAGED = "already_staged"
    ALREADY_STAGED_DECODED = "already_staged:decoded"
    ALREADY_STAGED_INFLATED = "already_staged:inflated"
    ALREADY_FETCHED = "already_fetched"
    ALREADY_FETCHED_DECODED = "already_fetched:decoded"
    ALREADY_FETCHED_INFLATED = "already_fetched:inflated"
    # read the PFS, and why
    PFS_NO_SNAPSHOT = "pfs:no_snapshot"              # the walk failed: no copy this job
    PFS_SNAPSHOT_NOT_READY = "pfs:snapshot_not_ready"
    PFS_NOT_IN_SNAPSHOT = "pfs:not_in_snapshot"
    PFS_CHANGED_SINCE_SNAPSHOT = "pfs:changed_since_snapshot"
    PFS_POLICY_OFF = "pfs:policy_off"
    PFS_NOT_STAGED = "pfs:not_staged"                # no room, failed before, or a source refused
    PFS_DROPPED = "pfs:dropped"                      # the copy went (a write) before it was decoded
    PFS_INFLATE_ERROR = "pfs:inflate_error"
    PFS_ERROR = "pfs:error"                          # a bug in Monarch: logged
    PFS_SHUTTING_DOWN = "pfs:shutting_down"
    PFS_TIMEOUT = "pfs:timeout"                      # not answered within staging.resolve_timeout
    PFS_PEER_ERROR = "pfs:peer_error"
    # the owning node could not help (sharded): ``peer_failed(reason)``
    PFS_PEER_REFUSED = "pfs:peer_refused"
    PFS_PEER_TIMEOUT = "pfs:peer_timeout"
    PFS_PEER_PEER_DOWN = "pfs:peer_peer_down"
    PFS_PEER_PEER_LOST = "pfs:peer_peer_lost"
    PFS_PEER_NO_HEARTBEAT = "pfs:peer_no_heartbeat"
    PFS_PEER_ABORTED = "pfs:peer_aborted"
    PFS_PEER_LOCAL_IO = "pfs:peer_local_io"
    PFS_PEER_NOT_RUNNING = "pfs:peer_not_running"
    PFS_PEER_NOT_ANSWERING = "pfs:peer_not_answering"
    PFS_PEER_DID_NOT_SEND = "pfs:peer_did_not_send"
    PFS_PEER_CORRUPT = "pfs:peer_corrupt"
    PFS_PEER_FAILED = "pfs:peer_failed"
    # replicating: the owner could not help and this node staged the file from the PFS itself
    # (the stager's fallback, counted beside the answers)
    FALLBACK_PEER_DOWN = "peer_down"
    FALLBACK_PEER_FAILED = "peer_failed"
    FALLBACK_PEER_AREA_UNUSABLE = "peer_area_unusable"
    FALLBACK_PEER_AREA_ERROR = "peer_area_error"
    FALLBACK_PEER_AREA_FULL = "peer_area_full"
    # not answers: requests counted beside them
    INVALIDATED = "invalidated"
    HINTS = "hints"

    @property
    def reads_pfs(self) -> bool:
        return self.value.startswith("pfs:")

    def served(self, how: str) -> "Outcome":
        """This copy's outcome ``decoded`` or ``inflated`` (a compressed copy answered)."""
        return Outcome(f"{self.value}:{how}")

    @classmethod
    def peer_failed(cls, reason: str) -> "Outcome":
        """The owning node could not help for ``reason`` (a failure reason's value)."""
        try:
            return cls(f"pfs:peer_{reason}")
        except ValueError:  # a reason this table does not know yet: still the PFS, counted
            return cls.PFS_PEER_FAILED


def copied(from_peer: bool) -> Outcome:
    """A copy made for this open."""
    return Outcome.FETCHED if from_peer else Outcome.STAGED


def already(from_peer: bool) -> Outcome:
    """A copy that was there before this open."""
    return Outcome.ALREADY_FETCHED if from_peer else Outcome.ALREADY_STAGED
