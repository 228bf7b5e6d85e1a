"""monarch/secure.py: the one place that makes Monarch's directories and files on a shared node."""

import os

import pytest

from monarch import secure
from monarch.report.store import write_report


def test_private_dir_is_made_0700_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        d = secure.private_dir(str(tmp_path / "p"))
    finally:
        os.umask(old)
    assert os.stat(d).st_mode & 0o777 == 0o700


@pytest.mark.parametrize("make,problem", [
    (lambda p: os.symlink("/etc", p), "is a symlink"),
    (lambda p: os.mkdir(p, 0o777) or os.chmod(p, 0o777), "must be private"),
    (lambda p: open(p, "w").close(), "not a directory"),
])
def test_an_existing_directory_that_is_not_private_is_refused(tmp_path, make, problem):
    path = str(tmp_path / "p")
    make(path)
    with pytest.raises(secure.UnsafePathError, match=problem):
        secure.private_dir(path)


def test_a_directory_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by another user")
    path = tmp_path / "p"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(secure.UnsafePathError, match="owned by uid 65534"):
        secure.private_dir(str(path))


def test_a_base_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    base = tmp_path / "open"
    base.mkdir()
    os.chmod(base, 0o777)
    with pytest.raises(secure.UnsafePathError, match="sticky"):
        secure.user_dir(str(base))
    os.chmod(base, 0o1777)  # like /tmp
    assert secure.user_dir(str(base)) == str(base / f"monarch-{os.getuid()}")


def test_files_are_never_written_through_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    planted = tmp_path / "report.json"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        secure.create_exclusive(str(planted))
    with pytest.raises(OSError):
        secure.open_private_file(str(planted))
    # an atomic write replaces the link itself, never what it points at
    write_report({"schema": "x"}, str(planted))
    assert victim.read_text() == "precious" and not planted.is_symlink()


def test_copies_are_masked_to_the_owner():
    assert secure.owner_only(0o100644) == 0o600
    assert secure.owner_only(0o100755) == 0o700
    assert secure.owner_only(0o100600) == 0o600
    assert secure.owner_only(0o100400) == 0o600  # the daemon must be able to write the copy


NOBODY = 65534


def test_a_base_that_is_another_users_symlink_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "sticky"
    target.mkdir()
    os.chmod(target, 0o1777)
    link = tmp_path / "base"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(secure.UnsafeBaseError, match=f"{link} is a symlink owned by uid {NOBODY}"):
        secure.user_dir(str(link))
    assert os.listdir(target) == []


@pytest.mark.parametrize("mode", [0o755, 0o1777])
def test_a_base_under_a_directory_of_another_user_is_refused(tmp_path, mode):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "base").mkdir()  # root's own, inside theirs: they can rename it and put theirs in its place
    os.chown(theirs, NOBODY, NOBODY)
    os.chmod(theirs, mode)
    with pytest.raises(secure.UnsafeBaseError, match=f"{theirs} is owned by uid {NOBODY}"):
        secure.user_dir(str(theirs / "base"))
    assert os.listdir(theirs / "base") == []


def test_a_base_under_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "group"
    (shared / "base").mkdir(parents=True)
    os.chmod(shared, 0o775)
    with pytest.raises(secure.UnsafeBaseError, match="writable by others without the sticky bit"):
        secure.user_dir(str(shared / "base"))


def test_a_symlink_of_root_in_a_directory_only_root_writes_is_followed_and_checked(tmp_path):
    real = tmp_path / "run"
    real.mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("../run")  # like a distribution's /var/run -> /run
    assert secure.user_dir(str(tmp_path / "var" / "run")) == str(real / f"monarch-{os.getuid()}")
    os.chmod(real, 0o777)  # the target is checked the same way
    with pytest.raises(secure.UnsafeBaseError, match="writable by others"):
        secure.user_dir(str(tmp_path / "var" / "run"))


def test_a_missing_base_is_named_and_not_made(tmp_path):
    base = tmp_path / "nonexistent" / "shm"
    with pytest.raises(secure.UnsafeBaseError, match=f"^{base} does not exist; create it or fix the path$"):
        secure.user_dir(str(base))
    assert not os.path.exists(tmp_path / "nonexistent")
