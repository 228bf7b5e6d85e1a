"""The LD_PRELOAD shim: its C source (``monarch_shim.c``, which includes the ``shim_*.c`` parts,
each with a ``shim_*.h`` of what it gives the others; ``monarch_shim.h``: the core's) and where the library to preload is (built by ``monarch/native/build.py``)."""

from pathlib import Path

from monarch.native.build import built_library

SOURCE = Path(__file__).with_name("monarch_shim.c")
LIBRARY_NAME = "libmonarch_shim.so"


def shim_library() -> Path:
    """The shim to preload: the installed one, else one built from this checkout."""
    return built_library(SOURCE, Path(__file__).with_name(LIBRARY_NAME), "the Monarch shim")


__all__ = ["SOURCE", "shim_library"]
