"""``monarch drain`` as a real process: it publishes what a killed daemon left in the write-back tier,
byte for byte, and removes the area; a refused publish exits 3 naming each file and where its bytes
are, the area kept for the next drain; an area whose run lives, or another user's, is left alone."""

import os

import pytest

from monarch.launch.drained import NOTHING_LEFT
from monarch.writeback.area import Area
from monarch.writeback.journal import Journal
from support.harness import NO_RESERVE, monarch
from support.writeback import checkpoint_journal, pending

pytestmark = pytest.mark.integration


@pytest.fixture
def setup(tmp_path):
    """A configuration whose write-back tier (the second) has its base at ``tier``; the PFS at ``pfs``."""
    other, base, pfs = tmp_path / "other", tmp_path / "tier", tmp_path / "pfs"
    for d in (other, base, pfs):
        d.mkdir()
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"run_base: {tmp_path}\n"
                   f"tiers:\n  - {{name: ram, path: {other}, capacity: 1GiB}}\n"
                   f"  - {{name: ssd, path: {base}, capacity: 1GiB}}\n"
                   "writeback: {tier: ssd}\n" + NO_RESERVE)
    return str(cfg), str(base), pfs


def areas(base):
    mine = os.path.join(base, f"monarch-{os.getuid()}")
    return sorted(n for n in os.listdir(mine) if n.startswith("writeback-")) if os.path.isdir(mine) else []


def test_a_killed_daemons_checkpoint_is_published_whole_and_its_area_removed(setup):
    cfg, base, pfs = setup
    blobs = checkpoint_journal(base, pfs)
    assert areas(base) == ["writeback-job1-node0"]
    r = monarch("drain", "-c", cfg, timeout=60)
    assert r.returncode == 0, r.stderr
    for name, data in blobs.items():
        assert (pfs / "ck" / name).read_bytes() == data
    assert sorted(os.listdir(pfs / "ck")) == ["latest", "model0", "model1"]  # no temporary name left
    total = sum(len(b) for b in blobs.values())
    assert r.stdout == f"{os.path.realpath(base)}/monarch-{os.getuid()}/writeback-job1-node0: published 3 files, " \
                       f"{total} bytes to the PFS; removed\n"
    assert areas(base) == []
    again = monarch("drain", "-c", cfg, timeout=60)
    assert again.returncode == 0 and again.stdout == f"nothing to drain in tier ssd ({base}): {NOTHING_LEFT}\n"


def test_a_refused_publish_exits_3_names_each_file_and_its_bytes_and_keeps_the_area(setup):
    cfg, base, pfs = setup
    area = Area.create(base, "job-2", 3)  # a run id with a dash, on node 3
    j = Journal(area.journal_path, durable=True)
    pending(area, j, 1, pfs / "gone" / "model.pt", b"m" * 1000)  # its directory is not on the PFS
    pending(area, j, 2, pfs / "latest", b"1\n")  # after it: not published before it
    j.close()
    area.release()
    r = monarch("drain", "-c", cfg, timeout=60)
    assert r.returncode == 3, r.stderr
    data = os.path.join(area.path, "data")
    assert f"not published: {pfs}/gone/model.pt (its bytes are kept in {data}/1)" in r.stderr
    assert f"not published: {pfs}/latest (its bytes are kept in {data}/2)" in r.stderr
    assert "No such file or directory" in r.stderr and "run monarch drain again" in r.stderr
    assert areas(base) == ["writeback-job-2-node3"] and sorted(os.listdir(data)) == ["1", "2"]
    assert not (pfs / "latest").exists()
    (pfs / "gone").mkdir()  # the PFS takes it now: the next drain finishes, in order
    r = monarch("drain", "-c", cfg, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (pfs / "gone" / "model.pt").read_bytes() == b"m" * 1000 and (pfs / "latest").read_bytes() == b"1\n"
    assert not [n for n in os.listdir(pfs / "gone") if n.startswith(".")]  # the temporary name of the failed try
    assert areas(base) == []


def test_an_area_whose_run_lives_and_another_users_are_left_alone(setup):
    cfg, base, pfs = setup
    live = Area.create(base, "live", 0)  # held by this process, as by its daemon
    j = Journal(live.journal_path, durable=True)
    pending(live, j, 1, pfs / "ckpt", b"live")
    theirs = os.path.join(base, f"monarch-{os.getuid() + 1}", "writeback-job1-node0")
    os.makedirs(os.path.join(theirs, "data"))
    try:
        r = monarch("drain", "-c", cfg, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout == (f"{live.path}: held by its run, still alive: left to it\n"
                            f"nothing to drain in tier ssd ({base}): {NOTHING_LEFT}\n")
        assert not (pfs / "ckpt").exists() and live.pending_data() == [1]
    finally:
        j.close()
        live.release()
    assert os.path.isdir(os.path.join(theirs, "data"))  # another uid's directory: never looked in
    r = monarch("drain", "-c", cfg, timeout=60)  # its owner gone: now it is drained
    assert r.returncode == 0, r.stderr
    assert (pfs / "ckpt").read_bytes() == b"live" and areas(base) == []


def test_a_file_the_job_never_closed_is_kept_not_published_and_an_empty_area_goes(setup):
    cfg, base, pfs = setup
    area = Area.create(base, "job3", 0)
    j = Journal(area.journal_path, durable=True)
    pending(area, j, 1, pfs / "done", b"closed")
    with open(area.data_path(2), "wb") as f:  # open when its process was killed: no record, not a file it finished
        f.write(b"half")
    j.close()
    area.release()
    Area.create(base, "job4", 0).release()  # its daemon died before the job wrote anything
    r = monarch("drain", "-c", cfg, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (pfs / "done").read_bytes() == b"closed" and sorted(os.listdir(pfs)) == ["done"]
    assert r.stdout.splitlines() == [f"{area.path}: published 1 files, 6 bytes to the PFS; kept: 1 file(s) its job never "
                                     f"closed, in {area.path}/data (rm -r {area.path} once you no longer need them)",
                                     f"{os.path.dirname(area.path)}/writeback-job4-node0: nothing recorded; removed"]
    assert areas(base) == ["writeback-job3-node0"] and open(area.data_path(2), "rb").read() == b"half"


def test_drain_help_has_examples_and_its_exit_status(capsys):
    from monarch.cli import main
    with pytest.raises(SystemExit):
        main(["drain", "--help"])
    out = capsys.readouterr().out
    assert "monarch drain -c configs/cluster.yaml" in out
    assert "3 if a file could not be\n  published" in out and "0 if every area was drained completely" in out


def test_drain_help_gives_the_slurm_line_docs_cluster_md_gives(capsys):
    """The line tests/slurm/test_drain_line.py runs from docs/cluster.md is the one the help shows."""
    from monarch.cli import main
    from support.harness import REPO
    with open(os.path.join(REPO, "docs", "cluster.md")) as f:
        text = f.read()
    start = text.index("```sh\n", text.index("<!-- slurm drain line:")) + len("```sh\n")
    line = text[start:text.index("\n```", start)]
    with pytest.raises(SystemExit):
        main(["drain", "--help"])
    assert f"\n    {line}\n" in capsys.readouterr().out
