"""Test and benchmark support, kept out of the installed package: an emulated slow PFS (FUSE),
its pytest fixture, the harness of the integration and MPI tests, the shim's open path in Python."""

from monarch.slowpfs import SlowPFS, SlowPFSError, fuse_unavailable_reason

__all__ = ["SlowPFS", "SlowPFSError", "fuse_unavailable_reason"]
