"""Monarch's exceptions (one base, a few meaningful kinds) and the exit statuses of its commands."""

from __future__ import annotations

import enum

# the exit statuses of `monarch` commands besides a command's own (`monarch run --help` lists them)
EXIT_USAGE = 2        # a usage or configuration error (a MonarchError), as argparse's own
EXIT_UNPUBLISHED = 3  # write-back files not published to the PFS: each is named with where its bytes are kept


class MonarchError(Exception):
    """Anything Monarch reports to a user as an error."""


class ConfigError(MonarchError):
    """A configuration file or value is wrong; the message says where, what and how to fix."""


class DaemonError(MonarchError):
    """The node daemon could not be started or reached."""


class FailureReason(str, enum.Enum):
    """Why a peer could not serve a file: ``PeerError.reason``, and the keys of the peer
    layer's ``fetch_failures`` counters (by value)."""

    REFUSED = "refused"            # the owner answered no (it could not stage the file, is not serving, ...)
    TIMEOUT = "timeout"            # the owner answers pings but sent nothing within peer_timeout (slow)
    PEER_DOWN = "peer_down"        # the owner stopped answering earlier: not asked until it answers a ping
    PEER_LOST = "peer_lost"        # the owner (or a node a collective waited on) is lost for the rest of the job
    NO_HEARTBEAT = "no_heartbeat"  # the owner answered nothing, not even a ping, for heartbeat_timeout
    ABORTED = "aborted"            # the owner gave up mid-file (an empty chunk)
    LOCAL_IO = "local_io"          # writing the received file here failed
    NOT_RUNNING = "not_running"    # the peer layer (its MPI engine) is not running
    CORRUPT = "corrupt"            # the bytes are not what the owner announced (or the snapshot saw)
    FAILED = "failed"              # anything else (a misuse, node 0's snapshot failed)

    def __str__(self) -> str:  # the value, in messages and f-strings, on every Python version
        return self.value


class PeerError(MonarchError):
    """A peer node could not serve a file (dead, slow, or it failed to stage it); ``reason``
    says which, as a ``FailureReason``."""

    def __init__(self, message: str, reason: FailureReason = FailureReason.FAILED):
        super().__init__(message)
        self.reason = FailureReason(reason)

    def __reduce__(self) -> tuple:  # pickles (a process pool, a test's subprocess) with its reason
        return type(self), (str(self), self.reason)
