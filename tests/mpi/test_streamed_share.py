"""Node 0's walk reaches every node while it goes on (monarch/cluster/streamed.py)."""

import json

import pytest

pytestmark = pytest.mark.mpi


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_every_node_sees_the_walk_before_it_ends(mpi, tmp_path, n):
    proc = mpi(n, "prog_streamed.py", tmp_path)
    assert proc.returncode == 0, proc.out + proc.err
    results = [json.loads(line[len("RESULT "):]) for line in proc.out.splitlines() if line.startswith("RESULT ")]
    assert sorted(r["node"] for r in results) == list(range(n))
    for r in results:
        assert r["value"] == "walked"
        assert r["files"] == {"0/a": 1, "0/b": 2, "0/c": 3, "0/d": 4, "0/e": 5}
