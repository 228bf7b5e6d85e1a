"""The LD_PRELOAD shim: its C source, how it is built, and where the built library is."""

from monarch.shim.build import build_shim, shim_library

__all__ = ["build_shim", "shim_library"]
