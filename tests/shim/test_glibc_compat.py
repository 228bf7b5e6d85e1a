"""The shim, and the daemon's front door, build against glibc 2.17 and import nothing newer
(DESIGN: runs where jobs run).

Cross-compiles monarch_shim.c and front_door.c with zig for x86_64-linux-gnu.2.17, with the
flags of monarch/native/build.py, and reads the dynamic symbol imports with objdump -T.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from monarch import frontdoor
from monarch.native.build import CFLAGS, LIBS
from monarch.shim import SOURCE

pytestmark = pytest.mark.shim

TARGET_GLIBC = (2, 17)
# weak undefined symbols the toolchain may leave (profiling, transactional memory, C++ EH)
WEAK_OK = re.compile(r"^(__gmon_start__|_ITM_\w+|__cxa_finalize|_Jv_RegisterClasses)$")
# objdump -T: address, 7 flag characters (the second is "w" for weak), section, size, version, name
IMPORT = re.compile(r"^[0-9a-f]+ (?P<flags>.{7})\s*\*UND\*\s+[0-9a-f]+\s+(?:\(?(?P<ver>[\w.@]+)\)?\s+)?(?P<name>\S+)$")


@pytest.fixture(scope="module", params=[SOURCE, frontdoor.SOURCE], ids=["shim", "front-door"])
def imports(tmp_path_factory, request) -> list[tuple[str, str | None, bool]]:
    pytest.importorskip("ziglang")
    objdump = shutil.which("objdump")
    if not objdump:
        pytest.skip("objdump not installed")
    out = tmp_path_factory.mktemp("zig") / "lib.so"
    cmd = [sys.executable, "-m", "ziglang", "cc", "-target", "x86_64-linux-gnu.%d.%d" % TARGET_GLIBC,
           *CFLAGS, "-o", str(out), str(request.param), *LIBS]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    table = subprocess.run([objdump, "-T", str(out)], capture_output=True, text=True, check=True, timeout=60).stdout
    found = []
    for line in table.splitlines():
        if "*UND*" not in line:
            continue
        m = IMPORT.match(line)
        assert m, f"cannot parse objdump line: {line!r}"
        found.append((m["name"], m["ver"], m["flags"][1] == "w"))
    assert found, table
    return found


def test_no_import_newer_than_glibc_2_17(imports):
    too_new = []
    for name, ver, _ in imports:
        m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", ver or "")
        if m and (int(m[1]), int(m[2])) > TARGET_GLIBC:
            too_new.append(f"{name}@{ver}")
    assert not too_new, too_new


def test_every_strong_import_is_versioned(imports):
    unversioned = [name for name, ver, weak in imports
                   if not (ver and ver.startswith("GLIBC_")) and not (weak and WEAK_OK.match(name))]
    assert not unversioned, unversioned


def test_the_stat_and_path_wrappers_resolve_through_dlsym(imports, request):
    """statx, fstat, renameat2, close_range, fcntl64 ... are defined by the shim, never imported."""
    if request.node.callspec.params["imports"] != SOURCE:
        pytest.skip("applies to the shim only: the front door is not an interposer, it imports the libc "
                    "functions it calls (fstat, statx ...) instead of defining them and resolving them with dlsym")
    names = {name for name, _, _ in imports}
    assert "dlsym" in names
    assert not names & {"statx", "fstat", "fstat64", "fstatat", "renameat2", "close_range", "gettid",
                        "copy_file_range", "preadv2", "__fxstat", "fcntl64"}
