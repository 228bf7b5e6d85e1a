"""pytest plugin: ``slow_pfs``, a factory that mounts directories through the emulated PFS.

Use it by declaring ``pytest_plugins = ["support.fixtures"]`` in a conftest, or
by importing the fixture into a test module::

    from support.fixtures import slow_pfs  # noqa: F401

    def test_x(slow_pfs, tmp_path):
        pfs = slow_pfs(src_dir, open_latency_ms=2)
        open(pfs.mountpoint + "/a.bin", "rb").read()
        assert pfs.counters()["opens"] == 1

Every mount is removed at teardown, whatever the test did. When FUSE cannot work on this
machine the test is skipped with the reason.
"""

from __future__ import annotations

import os

import pytest

from monarch.tools.slowpfs import SlowPFS, fuse_unavailable_reason


@pytest.fixture
def slow_pfs(tmp_path):
    """Factory: ``slow_pfs(src_dir, **options) -> SlowPFS`` (mounted, under ``tmp_path``)."""
    reason = fuse_unavailable_reason(probe=True)
    if reason:
        pytest.skip(f"emulated PFS needs FUSE: {reason}")
    mounted: list[SlowPFS] = []

    def factory(src: str | os.PathLike, **options) -> SlowPFS:
        n = len(mounted)
        base = tmp_path / f"slowpfs{n}"
        base.mkdir()
        pfs = SlowPFS(src, base / "mnt", base / "counters.json", **options)
        pfs.start()
        mounted.append(pfs)
        return pfs

    try:
        yield factory
    finally:
        for pfs in reversed(mounted):
            pfs.stop()
