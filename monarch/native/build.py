"""The builder of Monarch's C libraries: the shim, the front door, the walker, the remover and
the peer data path.

Each library is one translation unit: its main file includes its parts (the other C files
beside it) and the shared headers (``monarch/native/*.h``, ``monarch/wire/monarch_wire.h``).
One function serves both the wheel's build (``setup.py``, which loads this file by path) and a
source checkout, where a library is built on first use into a cache keyed by its source's
digest (every file it includes counted), so a stale library is never loaded.

The wheel's libraries are built once, by ``pip wheel``/``pip install`` from source, for glibc
2.17 (``portable_compiler``: zig's clang through the ``ziglang`` package, a build dependency, so
no system compiler or sysroot is needed): an installed package compiles nothing, on a node with
no compiler. Each is stamped with its source's digest (``write_stamp``); ``installed_current``
tells a packaged library from a checkout whose source has changed since.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
from pathlib import Path

try:  # CPython's own SHA-256, hashlib's digest without OpenSSL's libcrypto (3.4 MB resident in each daemon)
    from _sha2 import sha256  # 3.12 and later
except ImportError:
    try:
        from _sha256 import sha256
    except ImportError:
        from hashlib import sha256


NATIVE = Path(__file__).parent                       # the headers every library includes (monarch_native.h)
WIRE_HEADER = NATIVE.parent / "wire" / "monarch_wire.h"  # the wire, included by the shim, the door, the walker
DATAPATH_HEADER = NATIVE / "datapath.h"  # the peer data path's contract, included by the door
CFLAGS = ["-O2", "-g", "-fPIC", "-shared", "-fvisibility=hidden", "-std=gnu11",
          "-Wall", "-Wextra", "-Werror"]
LIBS = ["-ldl", "-lpthread"]


class BuildError(RuntimeError):
    """A library could not be compiled (kept free of package imports: setup.py loads this file by path)."""


GLIBC_FLOOR = (2, 17)  # what the wheel's libraries need at most (manylinux2014): RHEL/CentOS 7
# the machines zig can build a glibc 2.17 library for, and the wheel's platform tag then
PORTABLE_TARGETS = {"x86_64": "manylinux2014_x86_64", "aarch64": "manylinux2014_aarch64"}


def portable_compiler(machine: str | None = None) -> list[str] | None:
    """The command of a C compiler whose libraries need glibc 2.17 at most on this machine's
    architecture (``python -m ziglang cc -target <arch>-linux-gnu.2.17``: zig carries the old
    glibc's symbol tables, no sysroot needed), or None without the ``ziglang`` package or for
    an architecture it is not set up for here."""
    import importlib.util
    import platform
    import sys
    machine = machine or platform.machine()
    if machine not in PORTABLE_TARGETS or importlib.util.find_spec("ziglang") is None:
        return None
    return [sys.executable, "-m", "ziglang", "cc", "-target", "%s-linux-gnu.%d.%d" % (machine, *GLIBC_FLOOR)]


def build_library(out: Path, source: Path, what: str, extra: list[str] = (),
                  compiler: list[str] | None = None, libs: list[str] | None = None) -> Path:
    """Compile the library whose main file is ``source`` (``what``, said in errors; ``extra``
    arguments) to ``out`` (atomically: a half-written .so is never loaded), with ``compiler``
    (a command: ``portable_compiler()``'s for the wheel) or else ``CC``, ``cc`` or ``gcc``."""
    if compiler is None:
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc:
            raise BuildError(f"cannot build {what}: no C compiler found; "
                               "install gcc (apt-get install gcc) or set CC")
        compiler = [cc]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    cmd = [*compiler, *CFLAGS, "-o", str(tmp), str(source), *extra, *(LIBS if libs is None else libs)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"building {what} failed: {' '.join(cmd)}\n{proc.stderr}")
    os.replace(tmp, out)
    return out


def source_digest(source: Path) -> str:
    """A hash of a library's source: the main file, every other C or header file beside it (the
    parts it includes: the shim's ``shim_*.c``, the front door's ``door_*.c`` and header), the
    shared headers (``monarch/native/``), the wire header and the data path's."""
    h = sha256()
    beside = sorted(p for p in source.parent.iterdir() if p.suffix in (".c", ".h") and p != source)
    shared = sorted(p for p in NATIVE.iterdir() if p.suffix in (".c", ".h"))
    for path in [source, *beside, *shared, WIRE_HEADER, DATAPATH_HEADER]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def built_library(source: Path, installed: Path, what: str) -> Path:
    """The library of ``source``: ``installed`` (built by ``pip install``) when it was built
    from this very source or no source is left, else one built from the source into the
    user's cache, so a stale library is never loaded."""
    if installed_current(installed, source):
        return installed
    return cached_build(source, installed.name, source_digest(source), what)


def installed_current(installed: Path, source: Path) -> bool:
    """``installed`` (a packaged library) exists and was built from this very ``source`` (its
    stamp is the source's digest), or no source is left to build another from."""
    if not installed.exists():
        return False
    return not source.exists() or _stamp(installed) == source_digest(source)


def cached_build(source: Path, library_name: str, digest: str, what: str) -> Path:
    """``source`` built once per content (``digest``) into the user's cache, and reused."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "monarch"
    built = cache / f"{digest}-{library_name}"
    if not built.exists():
        build_library(built, source, what)
    return built


def _stamp(library: Path) -> str | None:
    stamp = library.with_suffix(".sha256")
    return stamp.read_text().strip() if stamp.exists() else None


def write_stamp(library: Path, source: Path) -> None:
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
