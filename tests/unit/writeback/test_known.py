"""What the job's applied changes tell of the PFS (writeback/known.py): known where the job made it,
looked at on the PFS (None) where not, and forgotten where the kernel changes a path itself."""

from monarch.writeback.known import ABSENT, DIR, FILE, KnownPfs


def test_a_directory_the_job_made_holds_only_what_it_put_there():
    k = KnownPfs()
    assert k.kind("/p/ck") is None and k.names("/p/ck") is None  # the PFS's own: looked at
    k.making("/p/ck")
    k.applied("mkdir", {"path": "/p/ck"})
    k.applied("close", {"path": "/p/ck/a"})
    assert (k.kind("/p/ck"), k.kind("/p/ck/a"), k.kind("/p/ck/b")) == (DIR, FILE, ABSENT)
    assert k.names("/p/ck") == ["a"]
    k.applied("unlink", {"path": "/p/ck/a"})
    assert k.names("/p/ck") == [] and k.kind("/p/ck/a") == ABSENT


def test_a_directory_made_over_something_is_not_known_whole():
    k = KnownPfs()
    k.applied("mkdir", {"path": "/p/ck"})  # (the view did not see it absent: no making())
    assert k.kind("/p/ck") == DIR and k.kind("/p/ck/x") is None and k.names("/p/ck") is None


def test_a_rename_moves_what_is_known_and_an_unknown_source_unknows_the_destination():
    k = KnownPfs()
    k.making("/p/t")
    k.applied("mkdir", {"path": "/p/t"})
    k.applied("close", {"path": "/p/t/f"})
    k.applied("rename", {"src": "/p/t", "dst": "/p/0"})
    assert (k.kind("/p/0"), k.kind("/p/0/f"), k.kind("/p/t"), k.kind("/p/t/f")) == (DIR, FILE, ABSENT, None)
    assert k.names("/p/0") == ["f"]
    k.applied("rename", {"src": "/p/elsewhere", "dst": "/p/0/g"})  # what it was: the PFS's to say
    assert k.kind("/p/0/g") is None and k.names("/p/0") is None


def test_a_path_the_kernel_changes_itself_is_looked_at_again():
    k = KnownPfs()
    k.making("/p/d")
    k.applied("mkdir", {"path": "/p/d"})
    k.applied("unlink", {"path": "/p/d/s"})
    k.forget("/p/d/s")  # a symlink made there by the kernel (settled)
    assert k.kind("/p/d/s") is None and k.names("/p/d") is None


def test_a_directory_the_pfs_showed_is_remembered_and_follows_the_jobs_rename():
    k = KnownPfs()
    k.seen_dir("/p/old")
    assert k.kind("/p/old") == DIR and k.names("/p/old") is None and k.kind("/p/old/x") is None
    k.applied("rename", {"src": "/p/old", "dst": "/p/new"})
    assert (k.kind("/p/new"), k.kind("/p/old")) == (DIR, ABSENT)
    k.applied("rmdir", {"path": "/p/new"})
    assert k.kind("/p/new") == ABSENT
