"""Environments of a test's own, built from whatever environment runs the tests.

``venv --system-site-packages`` is not that: it names the BASE interpreter's site-packages, so
from inside a virtual environment the new one misses every package installed there (Monarch's
dependencies, where scripts/install.sh put them). Here a plain venv is made, then told to read
the running interpreter's package directories after its own, with ``site.addsitedir`` so their
``.pth`` files (editable installs and the like) are honoured too. What the new environment
installs itself comes first on its ``sys.path`` and wins.

Wheels also put native libraries in their environment's ``lib/`` (the ``mpich`` wheel's libmpi,
which mpi4py looks for in its own environment's prefix and in the base interpreter's). When the
running environment is a venv, the new one's base is not it: its ``lib/`` entries are linked in.

Imports nothing of Monarch: a bare interpreter can run it.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

PTH_NAME = "zz-running-environment.pth"  # .pth files run in name order: after the new env's own


def running_package_dirs() -> list[str]:
    """The running interpreter's package directories, in the order it reads them: the user
    site first when enabled and present, then its site-packages (a venv's, a conda prefix's,
    or the system's)."""
    dirs = []
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and os.path.isdir(user):
        dirs.append(user)
    dirs += [d for d in site.getsitepackages() if os.path.isdir(d) and d not in dirs]
    return dirs


def make_env_seeing_this_python(path, with_pip: bool = True) -> Path:
    """A fresh virtual environment at ``path`` that imports what the running interpreter
    imports, its own installs first. Returns ``path``; its interpreter is ``path/bin/python``."""
    path = Path(path)
    subprocess.run([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)],
                   check=True, timeout=300)
    python = str(path / "bin" / "python")
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                         capture_output=True, text=True, timeout=60).stdout.strip()
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in running_package_dirs())
    Path(own, PTH_NAME).write_text(lines)
    if sys.prefix != sys.base_prefix:
        for entry in Path(sys.prefix, "lib").iterdir():
            if not (path / "lib" / entry.name).exists():  # its own pythonX.Y stays its own
                (path / "lib" / entry.name).symlink_to(entry)
    return path
