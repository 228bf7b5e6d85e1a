"""The C peer data path (monarch/cluster/datapath.c) between two real MPI ranks, under each
MPI the daemons run with: MPICH (mpi4py's wheel) and Open MPI with ULFM (scripts/install.sh)."""

import json
import os

import pytest

from monarch.cluster import datapath as dp
from monarch.cluster.world import ULFM, daemon_launch, openmpi_prefix

pytestmark = pytest.mark.mpi


def results(proc) -> dict:
    decode = json.JSONDecoder().raw_decode
    return {r["node"]: r for r in (decode(part)[0] for part in proc.out.split("RESULT ")[1:])}


def check(proc) -> None:
    assert proc.returncode == 0, proc.out + proc.err
    r = results(proc)
    assert r[0]["started"] and r[1]["started"], r
    got = r[0]["fetched"]
    for key in ("0/a/small.bin", "0/a/mid.bin", "0/empty.bin"):  # every byte as the owner holds it
        assert got[key][1] is True and got[key][0] >= 0, (key, got[key])
    # what the owner cannot answer from C goes back to Python's protocol, never half done
    for case in ("big", "not_offered", "withdrawn", "other_size", "self"):
        assert got[case] == dp.HANDED_BACK, (case, got)
    # a batch: one request, one reply; each file answered on its own, written at offset 0
    batch = r[0]["batch"]
    assert batch["results"] == [100, 200_000, 0, dp.HANDED_BACK, dp.HANDED_BACK], batch
    assert batch["same"][:3] == [True, True, True] and batch["offsets"] == [0] * 5 and batch["requests"] == 1
    assert r[0]["too_many"] == dp.HANDED_BACK
    # hostile requests dropped unanswered; every answered one counted
    assert r[1]["counts"]["served_requests"] == r[0]["counts"]["requests"] == 6 + 1
    assert r[1]["counts"]["served_files"] == 3 + 3 and r[1]["counts"]["served_bytes"] == 2 * (100 + 200_000)
    # not offered, withdrawn, other size ("big" and "self" never sent), then two in the batch
    assert r[1]["counts"]["handed_back"] == 3 + 2
    assert r[0]["counts"]["fetched_files"] == 3 + 3
    # the owner keeps the descriptors of files it read (small and mid: the three read, less the empty
    # one's, which it keeps too) and reads a copy offered anew or withdrawn and offered again afresh
    assert r[1]["kept_before"][0] >= 2, r[1]
    # and, in RAM, maps those read again (small and mid: an empty file is not mapped), read by a memcpy
    assert r[1]["maps_before"][0] >= 2, r[1]
    assert r[0]["offered_anew"] == [100, True] and r[0]["withdrawn_and_offered"] == [100, True], r[0]
    assert r[1]["kept_after_withdrawal"] == 0 and r[1]["maps_after_withdrawal"] == 0, r[1]
    code, seconds = r[0]["silent_owner"]
    assert code == dp.TIMEOUT and 0.25 < seconds < 5
    code, seconds = r[0]["lost_owner"]
    assert code == dp.LOST and seconds < 1
    assert r[0]["stopped"] == dp.STOPPED
    # spans of a large file's blocks: staged ones cross (every byte, at its offset, nothing else
    # written); a block not staged, another version, a bad span, a key not offered or withdrawn:
    # handed back (Python's protocol then has the owner read them from the PFS)
    spans = r[0]["spans"]
    for case, length in (("staged", 2 * (1 << 20) + 995), ("first_two", 2 << 20), ("whole_copy", 5000),
                         ("after_hostile", 1 << 20)):
        assert spans[case] == [length, True], (case, spans)
    for case in ("absent", "other_mtime", "other_size", "past_end", "too_long", "not_offered", "withdrawn"):
        assert spans[case][0] == dp.HANDED_BACK, (case, spans)
    # asked: staged, first_two, absent, other_mtime, other_size, not_offered, whole_copy,
    # after_hostile, withdrawn (past_end and too_long never leave); the hostile three dropped
    assert r[1]["range_counts"]["served_ranges"] == r[0]["range_counts"]["fetched_ranges"] == 4
    assert r[1]["range_counts"]["served_range_bytes"] == (2 << 20) + 995 + (2 << 20) + 5000 + (1 << 20)


@pytest.mark.timeout(120)
def test_staged_files_cross_in_c_under_mpich(mpi, tmp_path):
    check(mpi(2, "prog_datapath.py", tmp_path))


@pytest.mark.timeout(120)
def test_the_offers_of_an_index_s_files_cost_a_byte_each_and_cross_the_same(mpi, tmp_path):
    """An owner that lent its index offers its files by their entries: every answer above holds,
    and holds again after a copy of the index is lent between the rounds (the offers and their
    kept files numbered anew); 200,000 files offered cost it a byte each, not a record with the key,
    and the first thousand of them records (the index's byte a file would weigh more)."""
    proc = mpi(2, "prog_datapath.py", tmp_path, "index")
    check(proc)
    r = results(proc)
    offered = r[1]["counts"]["offered"], r[1]["offered_without_index"], r[1]["offered_after_renumbering"]
    assert offered == (4, 4, 4), r[1]  # small, mid, empty, big
    many = r[1]["many"]
    assert many["offered"] == 200_000 and many["after_withdrawal"] == 0, many
    assert many["allocated"] < 1 << 20, many  # by key: ~85 bytes each, 17 MB
    assert many["first_thousand"] < 150_000, many  # records, not a byte for each of the 200,000 files
    assert r[0]["many_fetched"] == [100, True], r[0]


@pytest.mark.timeout(120)
def test_staged_files_cross_in_c_under_open_mpi_ulfm(mpi_with, tmp_path):
    if openmpi_prefix() is None:
        pytest.skip("no Open MPI installed (scripts/install.sh installs it)")
    launch = daemon_launch(2, one_host=True, environ={**os.environ, "MONARCH_MPI_ENGINE": ULFM})
    try:
        mpiexec, *flags, _, _ = launch.argv  # without its "-n 2"
        check(mpi_with(mpiexec, 2, "prog_datapath.py", tmp_path, flags=flags, env=launch.env))
    finally:
        launch.close()
