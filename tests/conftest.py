import os
import sys
from dataclasses import dataclass

import pytest

from monarch.tools.workload import make_dataset

pytest_plugins = ["support.fixtures"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    """A host without the room the suite's data needs says so once, first (support/space.py)."""
    from support.space import short_of_space
    why = short_of_space()
    if why is not None:
        raise pytest.UsageError(why)


@pytest.fixture
def short_tmp(tmp_path_factory):
    """A short temporary directory: Unix socket paths must stay under 108 bytes."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="mt-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(f"/dev/shm{d}", ignore_errors=True)  # RAM tier bases of write_config


@pytest.fixture
def python():
    return sys.executable


@pytest.fixture
def no_dataset_variable(monkeypatch):
    """MONARCH_DATASET unset: a command finds its roots only in what the test gives it."""
    monkeypatch.delenv("MONARCH_DATASET", raising=False)


@dataclass
class Dataset:
    root: str
    manifest: str
    files: dict
    total: int

    @property
    def allocated(self) -> int:
        """The dataset's bytes as the tiers count them: each file in whole blocks of the
        filesystems tests put tiers on (/dev/shm and /tmp)."""
        from monarch.node.tiers.resources import allocation_unit
        from monarch.sizes import allocated_size
        unit = max(allocation_unit("/dev/shm"), allocation_unit("/tmp"))
        return sum(allocated_size(entry["size"], unit) for entry in self.files.values())


@pytest.fixture
def dataset(short_tmp):
    def make(files=300, size="8KiB", name="pfs", seed=0):
        root = os.path.join(short_tmp, name)
        manifest = os.path.join(short_tmp, f"{name}.manifest.json")
        entries = make_dataset(root, files=files, size=size, manifest=manifest, seed=seed)
        return Dataset(root, manifest, entries, sum(e["size"] for e in entries.values()))
    return make


SECOND_USER = "nobody"
SYSTEM_PYTHON = "/usr/bin/python3"  # the test interpreter may live where a second user cannot reach it


@pytest.fixture
def as_other_user():
    """Run ``python3 ARGS`` as a second user of the node (root, runuser and the system Python needed)."""
    import shutil
    import subprocess
    if os.getuid() != 0 or not shutil.which("runuser") or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("acting as a second user needs root, runuser and /usr/bin/python3")

    def run(args, **kw):
        return subprocess.run(["runuser", "-u", SECOND_USER, "--", SYSTEM_PYTHON, *args], capture_output=True,
                              text=True, timeout=60, **kw)
    return run
