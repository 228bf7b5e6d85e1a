"""Build hook: compile the C shim, the daemon's front door, its dataset walker and its tier remover into the
package as part of ``pip install .``."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
# each C library: its source, the library built beside it in the package, what it is
LIBRARIES = (
    ("monarch/shim/monarch_shim.c", "libmonarch_shim.so", "the Monarch shim"),
    ("monarch/frontdoor/front_door.c", "libmonarch_front_door.so", "the daemon's front door"),
    ("monarch/node/snapshot/walker.c", "libmonarch_walker.so", "the dataset walker"),
    ("monarch/node/tiers/remover.c", "libmonarch_remover.so", "the tier remover"),
)


def _load_builder():
    # Load monarch/native/build.py by path: the package itself is not importable at build time.
    spec = importlib.util.spec_from_file_location("_monarch_native_build", HERE / "monarch/native/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithShim(build_py):
    def run(self):
        super().run()
        builder = _load_builder()
        for source, library, what in LIBRARIES:
            out = Path(self.build_lib) / Path(source).parent / library
            builder.build_library(out, HERE / source, what)
            builder.write_stamp(out, HERE / source)


setup(cmdclass={"build_py": BuildPyWithShim})
