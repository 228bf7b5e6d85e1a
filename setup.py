"""Build hook: compile Monarch's C libraries into the package once, when the wheel is built
(``pip wheel .``, or ``pip install .`` from source), so an installed Monarch compiles nothing.

- The shim, the daemon's front door, its dataset walker and its tier remover, and the peer data
  path, each built for glibc 2.17 by zig's clang (``ziglang``, a build dependency in
  pyproject.toml: no system compiler needed) and stamped with its source's digest
  (``monarch/native/build.py``).
- The peer data path is built against the MPICH ABI (``libmpi.so.12``: MPICH, Intel MPI, Cray
  MPICH, MVAPICH; the ``mpich`` wheel's ``mpi.h``, a build dependency) and linked to no MPI: it
  takes the symbols of the MPI library mpi4py loaded at run time (``monarch/cluster/datapath.py``).
  Under another MPI ABI (Open MPI's ``libmpi.so.40``) the data path is still built on first use
  against that MPI's own ``mpi.h`` where a compiler is, else peers use Python's protocol.
- Nothing is bundled: the shim loads the system's ``libzstd.so.1`` with dlopen when there is one
  (else the daemon decodes compressed copies), the daemon's zstd is the ``zstandard`` wheel's.

``MONARCH_WHEEL_ARCH=aarch64 pip wheel .`` builds the same wheel for another architecture zig targets
(``manylinux2014_aarch64``: Grace hosts) on this machine: every library cross-compiled, nothing run.

The wheel is tagged ``py3-none-manylinux2014_<arch>``: the libraries are loaded with ctypes,
not as CPython extension modules, so one wheel serves every Python 3.9 and later; it is tied
to the platform only by the libraries, which need glibc 2.17 at most. Without ``ziglang`` (a
build without isolation that lacks it) the host's ``cc`` builds them and the wheel is tagged
``linux_<arch>``: it promises nothing about older systems.
"""

import importlib.util
import os
import platform
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).parent
# each C library: its source, the library built beside it in the package, what it is
LIBRARIES = (
    ("monarch/shim/monarch_shim.c", "libmonarch_shim.so", "the Monarch shim"),
    ("monarch/frontdoor/front_door.c", "libmonarch_front_door.so", "the daemon's front door"),
    ("monarch/node/snapshot/walker.c", "libmonarch_walker.so", "the dataset walker"),
    ("monarch/node/tiers/remover.c", "libmonarch_remover.so", "the tier remover"),
)
# the peer data path for the MPICH ABI (its name: monarch/cluster/datapath.py's PACKAGED)
DATAPATH = ("monarch/cluster/datapath.c", "libmonarch_datapath_mpich.so", "the C peer data path (MPICH ABI)")


def target_machine() -> str:
    """The architecture the libraries are built for: this machine's, or ``MONARCH_WHEEL_ARCH``'s."""
    return os.environ.get("MONARCH_WHEEL_ARCH") or platform.machine()


def _load_builder():
    # Load monarch/native/build.py by path: the package itself is not importable at build time.
    spec = importlib.util.spec_from_file_location("_monarch_native_build", HERE / "monarch/native/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mpich_include():
    """The directory of the ``mpich`` wheel's ``mpi.h`` in the build environment, or None."""
    from importlib import metadata
    try:
        files = metadata.distribution("mpich").files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith("include/mpi.h"):
            path = Path(f.locate()).resolve()
            if path.exists():
                return path.parent
    return None


class BuildPyWithLibraries(build_py):
    def run(self):
        super().run()
        builder = _load_builder()
        machine = target_machine()
        compiler = builder.portable_compiler(machine)
        if compiler is None and machine != platform.machine():
            raise SystemExit(f"MONARCH_WHEEL_ARCH={machine}: no cross compiler for it here (the ziglang package "
                             f"builds for {', '.join(builder.PORTABLE_TARGETS)})")
        for source, library, what in LIBRARIES:
            self._build(builder, compiler, source, library, what)
        include = mpich_include()
        if include is None:
            self.announce("no mpich wheel's mpi.h here: the peer data path is left to its first use", level=3)
        else:
            self._build(builder, compiler, *DATAPATH, extra=[f"-I{include}"])

    def _build(self, builder, compiler, source, library, what, extra=()):
        out = Path(self.build_lib) / Path(source).parent / library
        builder.build_library(out, HERE / source, what, extra=list(extra), compiler=compiler)
        builder.write_stamp(out, HERE / source)


class PlatformDistribution(Distribution):
    """A distribution with native parts: installed into platlib (where auditwheel looks), not purelib."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """The wheel of a platform, for any Python 3: see the module's docstring."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        builder = _load_builder()
        machine = target_machine()
        portable = builder.portable_compiler(machine) is not None
        return "py3", "none", builder.PORTABLE_TARGETS[machine] if portable else f"linux_{machine}"


setup(distclass=PlatformDistribution, cmdclass={"build_py": BuildPyWithLibraries, "bdist_wheel": PlatformWheel})
