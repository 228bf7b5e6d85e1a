"""Build hook: compile the C shim, the daemon's front door, its dataset walker and its tier remover into the
package as part of ``pip install .``."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent


def _load_shim_builder():
    # Load monarch/shim/build.py by path: the package itself is not importable at build time.
    spec = importlib.util.spec_from_file_location("_monarch_shim_build", HERE / "monarch/shim/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithShim(build_py):
    def run(self):
        super().run()
        builder = _load_shim_builder()
        out = Path(self.build_lib) / "monarch" / "shim" / builder.LIBRARY_NAME
        builder.build_shim(out, HERE / "monarch/shim/monarch_shim.c")
        builder.write_stamp(out, HERE / "monarch/shim/monarch_shim.c")
        door = Path(self.build_lib) / "monarch" / "frontdoor" / "libmonarch_front_door.so"
        builder.build_shim(door, HERE / "monarch/frontdoor/front_door.c", "the daemon's front door")
        builder.write_stamp(door, HERE / "monarch/frontdoor/front_door.c")
        walker = Path(self.build_lib) / "monarch" / "node" / "libmonarch_walker.so"
        builder.build_shim(walker, HERE / "monarch/node/walker.c", "the dataset walker")
        builder.write_stamp(walker, HERE / "monarch/node/walker.c")
        remover = Path(self.build_lib) / "monarch" / "node" / "libmonarch_remover.so"
        builder.build_shim(remover, HERE / "monarch/node/remover.c", "the tier remover")
        builder.write_stamp(remover, HERE / "monarch/node/remover.c")


setup(cmdclass={"build_py": BuildPyWithShim})
