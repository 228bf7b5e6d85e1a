"""The daemon's write-back room: the shim's calls answered from the view, files published once no
process holds them, fsync waiting for the PFS, listings as the job sees them."""

import errno
import os

import pytest

from monarch import protocol
from monarch.node.writeback import WritebackRoom, sole_opener
from monarch.writeback import wire


@pytest.fixture
def room(tmp_path):
    base, pfs = tmp_path / "tier", tmp_path / "pfs"
    base.mkdir()
    pfs.mkdir()
    r = WritebackRoom((str(pfs),), str(base), "job1", 0, durable=False, room=1 << 30)
    r.pfs = pfs
    yield r
    r.close()


def call(room, op, path="", path2="", n1=0, n2=0):
    frame = room.call(wire.encode_call(op, str(path), str(path2), n1, n2))
    status, length = protocol.ANSWER_HEADER.unpack(frame[:protocol.ANSWER_HEADER.size])
    return status, frame[protocol.ANSWER_HEADER.size:].decode()


def test_a_file_written_closed_and_renamed_reaches_the_pfs(room):
    seq, local = call(room, wire.WB_OPEN, room.pfs / "a.tmp", n1=os.O_WRONLY | os.O_CREAT | os.O_TRUNC, n2=0o644)
    assert seq > 0 and local.startswith(room.area.path)
    with open(local, "wb") as f:
        f.write(b"bytes")
    assert call(room, wire.WB_CLOSE, n1=seq) == (0, "")
    assert call(room, wire.WB_RENAME, room.pfs / "a.tmp", room.pfs / "a") == (0, "")
    status, where = call(room, wire.WB_RESOLVE, room.pfs / "a")
    # pending: its copy, with the mode it is published with; or drained already: the PFS's
    assert status in (wire.WB_ANSWER_LOCAL + 0o644, wire.WB_ANSWER_PFS) and open(where, "rb").read() == b"bytes"
    room.finish()
    assert os.listdir(room.pfs) == ["a"] and (room.pfs / "a").read_bytes() == b"bytes"
    assert room.stats()["files_published"] == 1


def test_a_file_still_held_elsewhere_is_published_only_once_released(room):
    seq, local = call(room, wire.WB_OPEN, room.pfs / "b", n1=os.O_WRONLY | os.O_CREAT, n2=0o600)
    holder = os.open(local, os.O_WRONLY)  # another process's descriptor (a dup, a fork)
    os.write(holder, b"x" * 10)
    call(room, wire.WB_CLOSE, n1=seq)
    assert not sole_opener(local)
    assert room.view.open_seqs() == [seq]  # not closed: someone still writes it
    os.close(holder)
    room.finish()  # the job ended: a file a process closed, now held by none, is published
    assert (room.pfs / "b").read_bytes() == b"x" * 10


def test_errors_and_listings_are_the_views(room):
    assert call(room, wire.WB_RESOLVE, room.pfs / "nothing") == (0, str(room.pfs / "nothing"))  # the kernel's
    (room.pfs / "old").write_bytes(b"old")
    assert call(room, wire.WB_UNLINK, room.pfs / "old") == (0, "")
    assert call(room, wire.WB_RESOLVE, room.pfs / "old")[0] == wire.WB_ERRNO + errno.ENOENT  # the job removed it
    assert call(room, wire.WB_MKDIR, room.pfs / "d", n1=0o755) == (0, "")
    seq, local = call(room, wire.WB_OPEN, room.pfs / "d" / "f", n1=os.O_WRONLY | os.O_CREAT, n2=0o644)
    status, listed = call(room, wire.WB_LIST, room.pfs / "d")
    assert status == 0 and os.listdir(listed) == ["f"]
    assert call(room, wire.WB_RMDIR, room.pfs / "d")[0] == wire.WB_ERRNO + errno.ENOTEMPTY
    assert call(room, wire.WB_RENAME, room.pfs / "d" / "f", "/elsewhere/f")[0] == wire.WB_ERRNO + errno.EXDEV
    assert call(room, wire.WB_OPEN, room.pfs / "d" / "f", n1=os.O_WRONLY | os.O_CREAT | os.O_EXCL)[0] == \
        wire.WB_ERRNO + errno.EEXIST
    assert room.call(b"\x63nonsense")[:4] == protocol.ANSWER_HEADER.pack(wire.WB_ERRNO + errno.EINVAL, 0)[:4]


def test_fsync_returns_once_the_pfs_holds_the_bytes_so_far(room):
    seq, local = call(room, wire.WB_OPEN, room.pfs / "s", n1=os.O_WRONLY | os.O_CREAT, n2=0o640)
    with open(local, "ab") as f:
        f.write(b"first")
    assert call(room, wire.WB_SYNC, n1=seq) == (0, "")
    assert (room.pfs / "s").read_bytes() == b"first"  # on the PFS under its name when fsync returns
    with open(local, "ab") as f:
        f.write(b" then more")
    call(room, wire.WB_CLOSE, n1=seq)
    room.finish()
    assert (room.pfs / "s").read_bytes() == b"first then more"
    assert os.stat(room.pfs / "s").st_mode & 0o777 == 0o640


def test_an_open_for_update_of_a_pending_file_waits_for_it_and_writes_through(room):
    seq, local = call(room, wire.WB_OPEN, room.pfs / "u", n1=os.O_WRONLY | os.O_CREAT, n2=0o644)
    with open(local, "wb") as f:
        f.write(b"abc")
    call(room, wire.WB_CLOSE, n1=seq)
    status, where = call(room, wire.WB_OPEN, room.pfs / "u", n1=os.O_RDWR)
    assert status == wire.WB_ANSWER_PFS and where == str(room.pfs / "u")
    assert (room.pfs / "u").read_bytes() == b"abc"  # published before the update goes to the PFS
