"""What a killed daemon left, removed by the next standing daemon of the node
(tests/slurm/test_killed_daemon.py does it for real): the MPI shared-memory files it noted
that nobody uses, and its socket when it was another job's."""

import fcntl
import os
import socket

from monarch.launch import mpi_shm
from monarch.node.instance import LOCK


def _run_dir(user, name, noted, lock_held=False):
    d = user / name
    d.mkdir()
    (d / "mpi-shm").write_text("".join(f"{p}\n" for p in noted))
    lock = os.open(d / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    if lock_held:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return d, lock
    os.close(lock)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "daemon.sock"))  # what a killed daemon leaves: a socket nobody listens on
    s.close()
    return d, None


def test_a_dead_daemons_noted_files_nobody_uses_are_removed(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(mpi_shm, "SHM_DIR", str(shm))
    files = {n: shm / n for n in ("mpich_shm_aa_0", "mpich_shm_bb_0", "sm_segment.n1.0.1.0", "mine.bin",
                                  "mpich_shm_cc_0")}
    for f in files.values():
        f.write_bytes(b"x")
    user = tmp_path / "u"
    user.mkdir()
    old, _ = _run_dir(user, "11-node1", [str(files[n]) for n in ("mpich_shm_aa_0", "mpich_shm_bb_0",
                                                                  "sm_segment.n1.0.1.0", "mine.bin")])
    same_job, _ = _run_dir(user, "12-node0", [])
    live, lock = _run_dir(user, "12-node3", [str(files["mpich_shm_cc_0"])], lock_held=True)
    held = open(files["mpich_shm_bb_0"], "rb")  # a name another job uses now
    try:
        removed = mpi_shm.remove_dead(str(user), job="12")
    finally:
        held.close()
        os.close(lock)
    assert sorted(removed) == sorted([str(files["mpich_shm_aa_0"]), str(files["sm_segment.n1.0.1.0"]),
                                      str(old / "daemon.sock")])
    assert files["mpich_shm_bb_0"].exists() and files["mine.bin"].exists()  # in use; not MPI's name
    assert files["mpich_shm_cc_0"].exists()  # its daemon is alive (holds its lock)
    assert (same_job / "daemon.sock").exists()  # this job's: its new daemon replaces it
    assert not (old / "mpi-shm").exists() and (live / "mpi-shm").exists()


def test_a_daemon_notes_only_the_mpi_files_it_maps(tmp_path, monkeypatch):
    import mmap
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(mpi_shm, "SHM_DIR", str(shm))
    (shm / "mpich_shm_dd_0").write_bytes(b"\0" * 4096)
    (shm / "tier-copy").write_bytes(b"\0" * 4096)
    with open(shm / "mpich_shm_dd_0", "r+b") as a, open(shm / "tier-copy", "r+b") as b:
        ma, mb = mmap.mmap(a.fileno(), 4096), mmap.mmap(b.fileno(), 4096)
        try:
            assert mpi_shm.record(str(tmp_path)) == [str(shm / "mpich_shm_dd_0")]
        finally:
            ma.close()
            mb.close()
    assert (tmp_path / "mpi-shm").read_text() == f"{shm / 'mpich_shm_dd_0'}\n"
