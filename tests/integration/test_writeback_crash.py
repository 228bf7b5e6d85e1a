"""A drain killed (SIGKILL, as a node's daemon can be) before or after each step of a checkpoint's
way to the PFS is resumed by the next with nothing lost, nothing written twice under its name, and
no final name ever holding a short file."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from monarch.writeback.area import Area
from monarch.writeback.drain import drain
from monarch.writeback.journal import read
from support.writeback import RUN, checkpoint_journal, tier_and_pfs

pytestmark = pytest.mark.integration


@pytest.fixture
def setup(tmp_path):
    return tier_and_pfs(tmp_path)


CRASHING_DRAIN = textwrap.dedent("""
    import os, sys
    from monarch.writeback.area import Area
    from monarch.writeback.drain import drain
    base, stop_at = sys.argv[1], int(sys.argv[2])
    steps = [0]
    def step(phase, rec):
        steps[0] += 1
        if steps[0] == stop_at:
            os.kill(os.getpid(), 9)  # the drain killed here, as a node's daemon can be
    (area,) = Area.orphans(base)
    drain(area, "job1", step=step)
""")


@pytest.mark.parametrize("stop_at", range(1, 13))
def test_a_drain_killed_at_any_step_is_resumed_with_nothing_lost_and_no_file_ever_short(setup, stop_at):
    """Killed before or after each of the six operations: the next drain completes the checkpoint,
    and at the moment of the kill no final name held anything but its whole file."""
    base, pfs = setup
    blobs = checkpoint_journal(base, pfs)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", CRASHING_DRAIN, base, str(stop_at)], env=env, timeout=60,
                       capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    for name in os.listdir(pfs / "ck") if (pfs / "ck").exists() else ():
        if not name.startswith("."):  # a final name: whole, never short
            assert (pfs / "ck" / name).read_bytes() == blobs[name.removesuffix(".tmp")]
    (area,) = Area.orphans(base)
    out = drain(area, RUN)
    assert out.complete
    assert sorted(os.listdir(pfs / "ck")) == ["latest", "model0", "model1"]
    for name, data in blobs.items():
        assert (pfs / "ck" / name).read_bytes() == data
    assert area.pending_data() == []
    records, _ = read(area.journal_path)
    assert max(r["upto"] for r in records if r.op == "applied") == 6
