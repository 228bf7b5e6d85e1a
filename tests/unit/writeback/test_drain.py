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


def _temporaries(d):
    return sorted(n for n in os.listdir(d) if ".monarch-" in n)


def test_under_fsync_pfs_a_files_temporary_is_made_at_its_open_and_its_fsync_renames_it(setup):
    """An ``open`` record (``fsync: pfs``): the run's drain makes the file's hidden temporary on the
    PFS then, while the job writes; the fsync the job waits on fills it and renames it over the
    name (the job released once the bytes are flushed there, before the times are set), and the
    close writes what came after into the same file, kept open: no create by name while the job
    waits, no temporary left."""
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=False)
    following = Following(Tail(area.journal_path))
    j.append("mkdir", path=str(pfs / "ck"), mode=0o755)
    open(area.data_path(1), "wb").close()
    j.append("open", seq=1, path=str(pfs / "ck" / "model"), mode=0o640)
    assert drain(area, RUN, journal=j, following=following).complete
    assert _temporaries(pfs / "ck") == [os.path.basename(temporary_name(str(pfs / "ck" / "model"), RUN, 1))]
    made = os.stat(pfs / "ck" / _temporaries(pfs / "ck")[0]).st_ino
    first = os.urandom(5000)
    with open(area.data_path(1), "wb") as f:
        f.write(first)
    n = j.append("sync", seq=1, path=str(pfs / "ck" / "model"), mode=0o640, size=len(first), waited=True)
    released = []
    out = drain(area, RUN, journal=j, following=following,
                released=lambda rec: released.append((rec.n, (pfs / "ck" / "model").read_bytes())))
    assert out.complete and released == [(n, first)]
    assert os.listdir(pfs / "ck") == ["model"] and os.stat(pfs / "ck" / "model").st_ino == made
    assert os.stat(pfs / "ck" / "model").st_mtime_ns == os.stat(area.data_path(1)).st_mtime_ns  # (set after)
    more = os.urandom(300)
    with open(area.data_path(1), "ab") as f:
        f.write(more)
    j.append("close", seq=1, path=str(pfs / "ck" / "model"), mode=0o640, size=len(first) + len(more))
    assert drain(area, RUN, journal=j, following=following).complete
    assert (pfs / "ck" / "model").read_bytes() == first + more and os.stat(pfs / "ck" / "model").st_ino == made
    assert os.stat(pfs / "ck" / "model").st_mode & 0o777 == 0o640 and os.listdir(pfs / "ck") == ["model"]
    assert not following.ahead.files


def test_a_temporary_made_at_an_open_goes_with_a_file_removed_moved_away_or_never_closed(setup):
    """A file removed before its close, one closed then removed before it drained, one moved to
    another directory whose first directory the job then removes (its rmdir must find it empty),
    one renamed in its directory (published under its new name from its temporary), one never
    closed (the run's end): no temporary is left."""
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=False)
    following = Following(Tail(area.journal_path))
    for d in ("a", "b"):
        j.append("mkdir", path=str(pfs / d), mode=0o755)
    for seq, path in enumerate(("a/gone", "a/moved", "b/renamed", "b/open", "b/scratch"), start=1):
        open(area.data_path(seq), "wb").close()
        j.append("open", seq=seq, path=str(pfs / path), mode=0o644)
    assert drain(area, RUN, journal=j, following=following).complete
    assert len(_temporaries(pfs / "a")) == 2 and len(_temporaries(pfs / "b")) == 3
    pending(area, j, 5, pfs / "b" / "scratch", b"s")  # closed, then removed before the drain came to it
    j.append("unlink", path=str(pfs / "b" / "scratch"))
    j.append("drop", seq=1)  # (the view's records: removed while open; moved while open, its close names where)
    j.append("rmdir", path=str(pfs / "a"))
    pending(area, j, 3, pfs / "b" / "new", b"n" * 10)
    pending(area, j, 2, pfs / "b" / "moved", b"m" * 20)
    assert drain(area, RUN, journal=j, following=following).complete
    assert not (pfs / "a").exists() and sorted(os.listdir(pfs / "b")) == \
        sorted(["moved", "new", os.path.basename(temporary_name(str(pfs / "b" / "open"), RUN, 4))])
    assert (pfs / "b" / "new").read_bytes() == b"n" * 10 and (pfs / "b" / "moved").read_bytes() == b"m" * 20
    following.ahead.close()  # (the run's end: file 4 never closed)
    assert sorted(os.listdir(pfs / "b")) == ["moved", "new"]


def test_a_drain_resumed_after_a_crash_removes_the_temporaries_a_killed_run_made(setup):
    """A run killed with files open: the temporaries its drain made at their opens are removed by
    the drain that resumes (the file closed is published whole through its own)."""
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=True)
    following = Following(Tail(area.journal_path))
    for seq, name in ((1, "closed"), (2, "open")):
        open(area.data_path(seq), "wb").close()
        j.append("open", seq=seq, path=str(pfs / name), mode=0o644)
    assert drain(area, RUN, journal=j, following=following).complete and len(_temporaries(pfs)) == 2
    pending(area, j, 1, pfs / "closed", b"c" * 100)  # closed; then the daemon is killed
    out = drain(area, RUN)  # (the next run's: the journal read whole)
    assert out.complete and sorted(os.listdir(pfs)) == ["closed"] and (pfs / "closed").read_bytes() == b"c" * 100


def test_past_the_temporaries_held_at_once_files_are_published_as_before(setup, monkeypatch):
    """More files open at once than the drain holds descriptors for (AHEAD_MOST, 2 here): the rest
    have their temporary made at their publish, and a file fsynced then is reopened by name at its
    close; every file whole, nothing left."""
    import monarch.writeback.ahead as ahead_module
    monkeypatch.setattr(ahead_module, "AHEAD_MOST", 2)
    base, pfs = setup
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=False)
    following = Following(Tail(area.journal_path))
    data = {seq: os.urandom(1000 + seq) for seq in range(1, 6)}
    for seq in data:
        open(area.data_path(seq), "wb").close()
        j.append("open", seq=seq, path=str(pfs / f"f{seq}"), mode=0o644)
    assert drain(area, RUN, journal=j, following=following).complete and len(_temporaries(pfs)) == 2
    for seq, blob in data.items():
        with open(area.data_path(seq), "wb") as f:
            f.write(blob[:500])
        j.append("sync", seq=seq, path=str(pfs / f"f{seq}"), mode=0o644, size=500, waited=True)
    assert drain(area, RUN, journal=j, following=following).complete and len(following.ahead.files) <= 2
    for seq, blob in data.items():
        with open(area.data_path(seq), "wb") as f:
            f.write(blob)
        j.append("close", seq=seq, path=str(pfs / f"f{seq}"), mode=0o644, size=len(blob))
    assert drain(area, RUN, journal=j, following=following).complete and not following.ahead.files
    assert sorted(os.listdir(pfs)) == [f"f{seq}" for seq in data]
    assert all((pfs / f"f{seq}").read_bytes() == blob for seq, blob in data.items())
