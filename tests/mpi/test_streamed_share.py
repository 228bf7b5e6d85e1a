"""Node 0's walk reaches every node while it goes on (monarch/cluster/streamed.py)."""

import json

import pytest

pytestmark = pytest.mark.mpi


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_every_node_sees_the_walk_before_it_ends(mpi, tmp_path, n):
    proc = mpi(n, "prog_streamed.py", tmp_path)
    assert proc.returncode == 0, proc.out + proc.err
    # each rank prints one line; mpiexec's forwarding may put two ranks' lines on one (seen once)
    decode = json.JSONDecoder().raw_decode
    results = [decode(part)[0] for part in proc.out.split("RESULT ")[1:]]
    assert sorted(r["node"] for r in results) == list(range(n))
    for r in results:
        assert r["value"] == "walked"
        assert r["files"] == {"0/a": 1, "0/b": 2, "0/c": 3, "0/d": 4, "0/e": 5}
