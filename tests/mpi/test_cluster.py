"""The peer layer between real MPI ranks: each rank is a node with its own tier directory."""

import json
import os

import pytest

from monarch.cluster import owner

pytestmark = pytest.mark.mpi

CHUNK = 65536


def _plain(pfs):
    keys = []
    for d, _, files in os.walk(pfs):
        for name in files:
            key = os.path.relpath(os.path.join(d, name), pfs)
            if not any(w in key for w in ("deny", "boom", "slow")):
                keys.append((key, os.path.getsize(os.path.join(d, name))))
    return keys


def _result(proc):
    lines = [line for line in proc.out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.out}\n{proc.err}"
    assert len(lines) == 1, proc.out + proc.err
    return json.loads(lines[0][len("RESULT "):])


def _expected(pfs, n, copies=1):
    """Files and bytes every node must fetch: each key it does not own, computed here independently."""
    keys = _plain(pfs)
    files = sum(copies for k, _ in keys for node in range(n) if owner(k, n) != node)
    size = sum(copies * s for k, s in keys for node in range(n) if owner(k, n) != node)
    return files, size, len(keys)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("scenario,copies", [("fetch", 1), ("concurrent", 2)])
def test_fetch_between_nodes(mpi, pfs, tmp_path, n, scenario, copies):
    """share() once, owner() agrees, every non-owned file arrives intact, each key read from the PFS once."""
    work = tmp_path / "work"
    work.mkdir()
    res = _result(mpi(n, "prog_cluster.py", scenario, pfs, work, CHUNK))
    files, size, nkeys = _expected(pfs, n, copies)
    assert res["nodes"] == n
    assert res["fetched"] == res["files_received"] == res["files_sent"] == files
    assert res["bytes"] == res["bytes_received"] == res["bytes_sent"] == size
    assert res["max_pfs_reads"] == 1 and res["keys_staged"] == nkeys
    assert all(not f for f in res["fetch_failures"]) and all(not f for f in res["serve_failures"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
def test_default_chunk_size(mpi, pfs, tmp_path, n):
    """4 MiB messages: the 9 MiB file crosses in three chunks."""
    work = tmp_path / "work"
    work.mkdir()
    res = _result(mpi(n, "prog_cluster.py", "fetch", pfs, work))
    files, size, _ = _expected(pfs, n)
    assert res["files_received"] == files and res["bytes_received"] == size


def _remote_requests(keys, n):
    """How many (node, key) requests go to another node when every node asks for every key."""
    return sum(1 for k in keys for node in range(n) if owner(k, n) != node)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
def test_refusal_is_peer_error(mpi, pfs, tmp_path, n):
    """provide() returning None or raising reaches the requester as PeerError('refused')."""
    work = tmp_path / "work"
    work.mkdir()
    res = _result(mpi(n, "prog_cluster.py", "refuse", pfs, work, CHUNK))
    expected = _remote_requests([f"0/val/{k}{i}.bin" for k in ("deny", "boom") for i in range(4)], n)
    assert sum(f["refused"] for f in res["found"]) == expected
    assert sum(f.get("refused", 0) for f in res["fetch_failures"]) == expected
    files, _, _ = _expected(pfs, n)
    assert res["files_received"] == files


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 4])
def test_slow_provide_times_out(mpi, pfs, tmp_path, n):
    """provide() slower than peer_timeout (1 s): PeerError after ~1 s, and the owner serves again after."""
    work = tmp_path / "work"
    work.mkdir()
    res = _result(mpi(n, "prog_cluster.py", "slow", pfs, work, CHUNK))
    expected = _remote_requests([f"0/val/slow{i}.bin" for i in range(4)], n)
    timeouts = [t for f in res["found"] for t in f["timeouts"]]
    assert len(timeouts) == expected
    assert all(0.9 <= t <= 1.75 for t in timeouts), timeouts
    files, _, _ = _expected(pfs, n, 2)
    assert res["files_received"] == files


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 4])
def test_unhandled_exception_aborts_the_job(mpi, n):
    proc = mpi(n, "prog_abort.py", timeout=45)
    assert proc.returncode != 0
    assert proc.elapsed < 30, f"abort took {proc.elapsed:.1f}s"
    assert "deliberate failure on node 1" in proc.err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", ["last", "first"])
@pytest.mark.parametrize("n", [2, 4])
def test_killed_peer(mpi, pfs, tmp_path, n, victim):
    """A SIGKILLed node: the job never hangs; whatever survivors get to do is correct.

    With MPICH 5.0.2's hydra the survivors get SIGUSR1 and run on, but hydra usually kills
    them within a second or two (docs/cluster.md). What a survivor did record must hold:
    PeerError within peer_timeout, then at once, correct fetches, the victim marked missing.
    """
    work = tmp_path / "work"
    work.mkdir()
    proc = mpi(n, "prog_kill.py", victim, pfs, work, flags=["-disable-auto-cleanup"], timeout=90)
    assert proc.returncode != 0            # the victim's SIGKILL is reported
    assert proc.elapsed < 60
    lines = [line for f in work.glob("report.*") for line in f.read_text().splitlines()]
    assert not [line for line in lines if line.startswith("FAILED")], lines
    for line in lines:
        step, value = line.split(" ", 2)[1], json.loads(line.split(" ", 2)[2])
        if step == "first_error":
            assert value <= 1.75
        elif step == "fail_fast":
            assert value < 0.5
        elif step == "result":
            dead = 0 if victim == "first" else n - 1
            assert value[dead]["missing"] is True


@pytest.mark.timeout(60)
def test_killed_peer_without_ft_flag_ends_the_job(mpi, pfs, tmp_path):
    """Without -disable-auto-cleanup hydra kills every rank at once: the job ends, nothing hangs."""
    work = tmp_path / "work"
    work.mkdir()
    proc = mpi(3, "prog_kill.py", "last", pfs, work, timeout=45)
    assert proc.returncode != 0 and proc.elapsed < 30
