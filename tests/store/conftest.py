"""Fixtures of the store's tests: a real redis-server per module (``redis_server``) or per test
(``fresh_redis``), on a private Unix socket."""

import os
import shutil
import tempfile

import pytest

from support.redisstore import RedisServer

pytest.importorskip("redis", reason="the store's tests need redis-py (scripts/install.sh installs it)")


def _need_redis_server():
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/install.sh installs it from Debian)")


@pytest.fixture(scope="module")
def redis_server():
    """One redis-server for the module's tests (each test uses its own key prefix)."""
    _need_redis_server()
    d = tempfile.mkdtemp(prefix="mr-", dir="/tmp")
    os.chmod(d, 0o700)
    server = RedisServer(d)
    yield server
    server.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fresh_redis():
    """A redis-server of the test's own (to kill, or with a password): ``fresh_redis(password=None)``."""
    _need_redis_server()
    made = []

    def make(password=None):
        d = tempfile.mkdtemp(prefix="mr-", dir="/tmp")
        os.chmod(d, 0o700)
        made.append((RedisServer(d, password), d))
        return made[-1][0]
    yield make
    for server, d in made:
        server.stop()
        shutil.rmtree(d, ignore_errors=True)


