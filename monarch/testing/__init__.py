"""Test and benchmark helpers: an emulated slow PFS (FUSE) and pytest fixtures for it."""

from monarch.testing.slowpfs import SlowPFS, SlowPFSError, fuse_unavailable_reason

__all__ = ["SlowPFS", "SlowPFSError", "fuse_unavailable_reason"]
