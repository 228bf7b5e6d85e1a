"""A tier shared with the user's other jobs (MONARCH_SHARED_SLOTS): another job may have
staged its copies from another snapshot, so the shim opens a copy there only if its size
and mtime are those of this job's index entry, and otherwise asks the daemon (here: the
PFS). A private tier's copy is opened as it is (this job's own daemon made it)."""

from __future__ import annotations

import os
import textwrap

import pytest

from monarch import protocol

from .conftest import TIER_SLOTS, md5

pytestmark = pytest.mark.shim

SIZE = 30_000

READ = textwrap.dedent("""
    import hashlib, sys
    for p in sys.argv[1:]:
        with open(p, "rb") as f:
            print(hashlib.md5(f.read()).hexdigest())
""")


def copies(env, names, *, stale: set[str] = frozenset(), mtime_of_source: bool = True):
    """The root's files ``names`` and their copies in tier 0: those in ``stale`` hold other
    bytes of the same size (a copy from another job's older snapshot); every copy gets its
    source's mtime (as the stager writes it) unless ``mtime_of_source`` is False."""
    paths = []
    for name in names:
        src = env.write(name, SIZE)
        data = b"X" * SIZE if name in stale else None
        dest = env.stage(name, 0, data)
        st = os.stat(src)
        if mtime_of_source:
            os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns if name not in stale else st.st_mtime_ns - 10**9))
        paths.append(str(src))
    return paths


def test_a_shared_copy_is_opened_only_if_it_is_this_snapshots_file(shim_env):
    shim_env.start_daemon("pfs")  # a miss reads the PFS
    paths = copies(shim_env, ["a.bin", "b.bin", "c.bin"], stale={"b.bin"})
    proc = shim_env.python(READ, *paths, **{protocol.ENV_SHARED_SLOTS: str(TIER_SLOTS[0])})
    assert proc.stdout.decode().split() == [md5(open(p, "rb").read()) for p in paths]  # b's source, not its copy
    assert shim_env.counts() == shim_env.expected(tier0=(2, 2 * SIZE), pfs=(1, SIZE))


def test_a_copy_without_its_sources_mtime_is_refused_in_a_shared_slot_only(shim_env):
    shim_env.start_daemon("pfs")
    paths = copies(shim_env, ["a.bin"], mtime_of_source=False)
    shim_env.python(READ, *paths, **{protocol.ENV_SHARED_SLOTS: str(TIER_SLOTS[0])})
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE))
    shim_env.python(READ, *paths)  # a private tier: this job's daemon's copy, opened as it is
    assert shim_env.counts() == shim_env.expected(pfs=(1, SIZE), tier0=(1, SIZE))
