"""Monarch's exceptions: one base, a few meaningful kinds."""


class MonarchError(Exception):
    """Anything Monarch reports to a user as an error."""


class ConfigError(MonarchError):
    """A configuration file or value is wrong; the message says where, what and how to fix."""


class DaemonError(MonarchError):
    """The node daemon could not be started or reached."""


class PeerError(MonarchError):
    """A peer node could not serve a file (dead, slow, or it failed to stage it)."""
