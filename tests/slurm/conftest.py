"""The private Slurm of the tests/slurm suite: started once per session, ended at its end
(tests/support/slurm.py). Skipped with one line where Slurm cannot run at all."""

import shutil
import tempfile

import pytest

from support.slurm import PrivateSlurm, unavailable

NODES = 4


@pytest.fixture(scope="session")
def slurm():
    why = unavailable()
    if why:
        pytest.skip(why)
    for attempt in (1, 2):  # a port chosen free may be taken before slurmd binds it: once more, new ports
        base = tempfile.mkdtemp(prefix="mslurm-", dir="/tmp")
        cluster = PrivateSlurm(base, nodes=NODES)
        try:
            cluster.start()
            break
        except RuntimeError:
            cluster.stop()
            shutil.rmtree(base, ignore_errors=True)
            if attempt == 2:
                raise
    try:
        yield cluster
    finally:
        left = cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
        assert not left, f"processes of the private Slurm outlived it (killed): {left}"
