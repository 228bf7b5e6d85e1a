import os
import sys
from dataclasses import dataclass

import pytest

from monarch.workload import make_dataset

pytest_plugins = ["monarch.testing.fixtures"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def short_tmp(tmp_path_factory):
    """A short temporary directory: Unix socket paths must stay under 108 bytes."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="mt-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def python():
    return sys.executable


@dataclass
class Dataset:
    root: str
    manifest: str
    files: dict
    total: int


@pytest.fixture
def dataset(short_tmp):
    def make(files=300, size="8KiB", name="pfs", seed=0):
        root = os.path.join(short_tmp, name)
        manifest = os.path.join(short_tmp, f"{name}.manifest.json")
        entries = make_dataset(root, files=files, size=size, manifest=manifest, seed=seed)
        return Dataset(root, manifest, entries, sum(e["size"] for e in entries.values()))
    return make
