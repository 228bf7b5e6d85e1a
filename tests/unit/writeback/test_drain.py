"""The drain: a journal's operations applied to a directory standing for the PFS, in order, each
file complete under its name; a refused write stops it with nothing lost (a drain killed at every
step: tests/integration/test_writeback_crash.py)."""

import os

import pytest

from monarch.writeback.area import Area
from monarch.writeback.drain import Following, drain, temporary_name
from monarch.writeback.journal import Journal, Tail
from support.writeback import RUN, checkpoint_journal, pending, tier_and_pfs


@pytest.fixture
def setup(tmp_path):
    return tier_and_pfs(tmp_path)


def test_a_checkpoint_is_published_complete_in_order_with_its_modes(setup):
    base, pfs = setup
    blobs = checkpoint_journal(base, pfs)
    (area,) = Area.orphans(base)
    seen = []
    out = drain(area, RUN, step=lambda phase, rec: seen.append((phase, rec.op)))
    assert out.complete and out.applied == 6
    assert seen == [(phase, op) for op in ("mkdir", "close", "rename", "close", "rename", "close")
                    for phase in ("apply", "applied")]  # strictly in journal order
    assert out.published == [str(pfs / "ck" / "model0.tmp"), str(pfs / "ck" / "model1.tmp"), str(pfs / "ck" / "latest")]
    assert out.published_bytes == sum(len(b) for b in blobs.values())
    assert sorted(os.listdir(pfs / "ck")) == ["latest", "model0", "model1"]  # no temporary name left
    for name, data in blobs.items():
        assert (pfs / "ck" / name).read_bytes() == data
    assert os.stat(pfs / "ck" / "model0").st_mode & 0o777 == 0o640
    assert os.stat(pfs / "ck" / "latest").st_mode & 0o777 == 0o644
    assert os.stat(pfs / "ck").st_mode & 0o777 == 0o750
    assert area.pending_data() == []  # the local bytes go once published
    assert drain(area, RUN).applied == 0  # everything applied: a second drain writes nothing


def test_a_file_the_job_removed_before_it_drained_is_never_written(setup):
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=False)
    (pfs / "old").write_bytes(b"an earlier job's")
    pending(area, j, 1, pfs / "old", b"x" * 1000)  # the job truncated it, wrote, closed...
    j.append("unlink", path=str(pfs / "old"))       # ... and removed it
    pending(area, j, 2, pfs / "kept", b"y" * 10)
    out = drain(area, RUN, journal=j)
    assert out.complete and out.published == [str(pfs / "kept")] and out.published_bytes == 10
    assert sorted(os.listdir(pfs)) == ["kept"]


def test_a_refused_write_stops_the_drain_there_and_keeps_every_unpublished_byte(setup):
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=False)
    pending(area, j, 1, pfs / "a", b"a" * 100)
    pending(area, j, 2, pfs / "gone" / "b", b"b" * 100)  # its directory is not there: ENOENT
    pending(area, j, 3, pfs / "c", b"c" * 100)
    out = drain(area, RUN, journal=j)
    assert not out.complete and out.published == [str(pfs / "a")]
    assert out.failed.startswith("close") and "No such file or directory" in out.failed
    assert out.unpublished == {str(pfs / "gone" / "b"): area.data_path(2), str(pfs / "c"): area.data_path(3)}
    assert not (pfs / "c").exists()  # nothing after the refused operation (it may depend on it)
    assert area.pending_data() == [2, 3]
    (pfs / "gone").mkdir()  # the cause fixed: the next drain goes on from there
    assert drain(area, RUN, journal=j).published == [str(pfs / "gone" / "b"), str(pfs / "c")]
    assert (pfs / "c").read_bytes() == b"c" * 100


def test_a_live_owners_area_is_never_drained_by_another(setup):
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    assert Area.orphans(base) == []
    area.release()
    (found,) = Area.orphans(base)
    assert found.path == area.path
    assert Area.orphans(base) == []  # held by the drain that found it: not a second time
    found.release()


def test_the_temporary_name_is_hidden_beside_the_file():
    assert temporary_name("/pfs/ck/model.pt", "1234.0", 7) == "/pfs/ck/.model.pt.monarch-1234.0-7"


def _synced_then_closed(area, j, path, first: bytes, more: bytes):
    """A file fsynced with ``first`` written (its sync record), then written on and closed."""
    with open(area.data_path(1), "wb") as f:
        f.write(first)
    j.append("sync", seq=1, path=str(path), mode=0o640, size=len(first), waited=True)
    with open(area.data_path(1), "ab") as f:
        f.write(more)
    return j.append("close", seq=1, path=str(path), mode=0o640, size=len(first) + len(more))


def test_an_fsync_the_job_waits_on_is_written_under_its_name_as_a_direct_fsync_leaves_it(setup):
    """Under `fsync: pfs` the run's drain writes an fsync's bytes at the file's own name (no temporary
    renamed over it: the same inode from the fsync to the close), and the bytes written after the
    fsync there at the close, as a direct job's writes land; the file ends whole, with its mode. An
    fsync the job does not wait on (`partner`) keeps W2: a temporary renamed over the name."""
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=False)
    following = Following(Tail(area.journal_path))
    (pfs / "old").symlink_to("elsewhere")  # a name that cannot be written in place: a temporary renamed over it
    with open(area.data_path(2), "wb") as f:
        f.write(b"s")
    j.append("sync", seq=2, path=str(pfs / "old"), mode=0o600, size=1, waited=True)
    first = os.urandom(5000)
    with open(area.data_path(1), "wb") as f:
        f.write(first)
    j.append("sync", seq=1, path=str(pfs / "model"), mode=0o640, size=len(first), waited=True)
    with open(area.data_path(3), "wb") as f:
        f.write(b"p" * 10)
    j.append("sync", seq=3, path=str(pfs / "held"), mode=0o600, size=10)  # (fsync: partner)
    (pfs / "held").write_bytes(b"before")
    held = os.stat(pfs / "held").st_ino
    assert drain(area, RUN, journal=j, following=following).complete
    assert (pfs / "held").read_bytes() == b"p" * 10 and os.stat(pfs / "held").st_ino != held
    assert (pfs / "model").read_bytes() == first and sorted(os.listdir(pfs)) == ["held", "model", "old"]
    assert not (pfs / "old").is_symlink() and (pfs / "old").read_bytes() == b"s"
    inode = os.stat(pfs / "model").st_ino
    more = os.urandom(3000)
    with open(area.data_path(1), "ab") as f:
        f.write(more)
    j.append("close", seq=1, path=str(pfs / "model"), mode=0o640, size=len(first) + len(more))
    out = drain(area, RUN, journal=j, following=following)
    assert out.complete and out.published == [str(pfs / "model")]
    assert (pfs / "model").read_bytes() == first + more and os.stat(pfs / "model").st_ino == inode
    assert os.stat(pfs / "model").st_mode & 0o777 == 0o640 and sorted(os.listdir(pfs)) == ["held", "model", "old"]


def test_a_drain_resumed_after_a_crash_publishes_an_fsynced_file_whole(setup):
    """A crash after the fsync's copy (the close's not applied): the drain that resumes copies the
    closed file whole through its temporary, whatever the name held."""
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=True)
    first, more = os.urandom(4000), os.urandom(100)
    _synced_then_closed(area, j, pfs / "model", first, more)
    def crash(phase, rec):
        if (phase, rec.op) == ("apply", "close"):
            raise SystemExit("killed")
    with pytest.raises(SystemExit):
        drain(area, RUN, journal=j, step=crash, following=Following(Tail(area.journal_path)))
    assert (pfs / "model").read_bytes() == first  # the fsync's bytes, as a direct job's after its fsync
    out = drain(area, RUN, journal=j)  # (a new daemon: nothing of the first drain's known)
    assert out.complete and (pfs / "model").read_bytes() == first + more
