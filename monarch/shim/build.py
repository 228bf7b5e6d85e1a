"""Compile ``monarch_shim.c`` (which includes the ``shim_*.c`` parts) into ``libmonarch_shim.so``.

One function serves both the install-time build hook (``setup.py``) and a source
checkout, where the library is built on first use into a cache keyed by the
source's hash, so a stale library is never preloaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path


SOURCE = Path(__file__).with_name("monarch_shim.c")
WIRE_HEADER = Path(__file__).parent.parent / "wire" / "monarch_wire.h"  # included by the shim and the front door
LIBRARY_NAME = "libmonarch_shim.so"
CFLAGS = ["-O2", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-std=gnu11",
          "-Wall", "-Wextra", "-Werror"]
LIBS = ["-ldl", "-lpthread"]


class ShimBuildError(RuntimeError):
    """The shim could not be compiled (kept free of package imports: setup.py loads this file by path)."""


def build_shim(out: Path, source: Path = SOURCE, what: str = "the Monarch shim", extra: list[str] = ()) -> Path:
    """Compile the shim (or another of Monarch's C libraries: ``what``, with ``extra``
    arguments) to ``out`` (atomically: a half-written .so is never preloaded)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise ShimBuildError(f"cannot build {what}: no C compiler found; "
                           "install gcc (apt-get install gcc) or set CC")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    cmd = [cc, *CFLAGS, "-o", str(tmp), str(source), *extra, *LIBS]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ShimBuildError(f"building {what} failed: {' '.join(cmd)}\n{proc.stderr}")
    os.replace(tmp, out)
    return out


def source_digest(source: Path = SOURCE) -> str:
    """A hash of a library's source: the main file, every other C file beside it (the parts it
    includes: the shim's ``shim_*.c``, the front door's ``inflight.c``) and the wire header."""
    h = hashlib.sha256()
    parts = sorted(p for p in source.parent.glob("*.c") if p != source)
    for path in [source, *parts, WIRE_HEADER]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def shim_library() -> Path:
    """The shim to preload: the installed one, else one built from this checkout."""
    return built_library(SOURCE, Path(__file__).with_name(LIBRARY_NAME), "the Monarch shim")


def built_library(source: Path, installed: Path, what: str) -> Path:
    """The library of ``source``: ``installed`` (built by ``pip install``) when it was built
    from this very source or no source is left, else one built from the source into the
    user's cache, so a stale library is never loaded."""
    if installed.exists() and not source.exists():
        return installed
    digest = source_digest(source)
    if installed.exists() and _stamp(installed) == digest:
        return installed
    return cached_build(source, installed.name, digest, what)


def cached_build(source: Path, library_name: str, digest: str, what: str) -> Path:
    """``source`` built once per content (``digest``) into the user's cache, and reused."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "monarch"
    built = cache / f"{digest}-{library_name}"
    if not built.exists():
        build_shim(built, source, what)
    return built


def _stamp(library: Path) -> str | None:
    stamp = library.with_suffix(".sha256")
    return stamp.read_text().strip() if stamp.exists() else None


def write_stamp(library: Path, source: Path = SOURCE) -> None:
    library.with_suffix(".sha256").write_text(source_digest(source))


class OptionalLibrary:
    """A library of Monarch's C (the front door, the walker, the remover) loaded on first use,
    its functions' prototypes set; None, said once, when it cannot be built: the caller's
    Python does the work instead (``without`` says how), slower and never wrong."""

    def __init__(self, source: Path, installed: Path, what: str, without: str,
                 prototypes: dict[str, tuple[object, list]]):
        self.source, self.installed, self.what, self.without = source, installed, what, without
        self.prototypes = prototypes
        self._lib: ctypes.CDLL | None = None
        self._error: str | None = None

    def get(self) -> ctypes.CDLL | None:
        if self._lib is not None or self._error is not None:
            return self._lib
        try:
            lib = ctypes.CDLL(str(built_library(self.source, self.installed, self.what)), use_errno=True)
        except Exception as e:  # no compiler, no source
            self._error = str(e)
            logging.getLogger(__name__).warning("%s is not available (%s); %s", self.what,
                                                self._error.splitlines()[0] if self._error else type(e).__name__,
                                                self.without)
            return None
        for name, (restype, argtypes) in self.prototypes.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self._lib = lib
        return lib
