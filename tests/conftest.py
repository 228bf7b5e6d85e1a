import os
import sys

import pytest

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
