"""Test and benchmark support, kept out of the installed package: the pytest fixture of the
emulated slow PFS (which lives in monarch.tools.slowpfs: the demo uses it), the harness of the
integration and MPI tests, what a browser draws of the HTML report, the shim's open path in Python."""

from monarch.tools.slowpfs import SlowPFS, SlowPFSError, fuse_unavailable_reason

__all__ = ["SlowPFS", "SlowPFSError", "fuse_unavailable_reason"]
