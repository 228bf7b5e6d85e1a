"""The job's own writes under a root are read back exactly: every call family that
changes a file invalidates its key (the daemon is told, the tier copy goes) before
the change, so the next read through the shim returns the new bytes, not the copy."""

from __future__ import annotations

import textwrap

import pytest


pytestmark = pytest.mark.shim

SIZE = 50_000
NEW = b"new bytes written by the job\n"

READ = textwrap.dedent("""
    import sys
    sys.stdout.buffer.write(open(sys.argv[1], "rb").read())
""")


def staged_file(env, rel="w/f.bin"):
    """A root file read once through the shim, so that tier 0 holds its copy."""
    src = env.write(rel, SIZE)
    assert env.python(READ, str(src)).stdout == src.read_bytes()
    assert (env.tiers[0] / "0" / rel).read_bytes() == src.read_bytes()
    return src


# (name, how the job changes src; tmp is a scratch file with NEW under the root, helpers
#  are the compiled statfd), the bytes src holds afterwards
def py(code):
    return lambda env, src, tmp, statfd: env.python(textwrap.dedent(code), str(src), str(tmp))


WRITERS = {
    "open-w": (py("""
        import sys
        open(sys.argv[1], "wb").write(open(sys.argv[2], "rb").read())
    """), lambda old: NEW),
    "open-r+": (py("""
        import sys
        with open(sys.argv[1], "r+b") as f:
            f.write(open(sys.argv[2], "rb").read())
    """), lambda old: NEW + old[len(NEW):]),
    "os.rename": (py("""
        import os, sys
        os.rename(sys.argv[2], sys.argv[1])
    """), lambda old: NEW),
    "os.truncate": (py("""
        import os, sys
        os.truncate(sys.argv[1], 1000)
    """), lambda old: old[:1000]),
    "creat": (lambda env, src, tmp, statfd: env.run([statfd, "creat", str(src), NEW.decode()]), lambda old: NEW),
    "freopen-w": (lambda env, src, tmp, statfd: env.run([statfd, "freopen", str(src), NEW.decode()]),
                  lambda old: NEW),
    "sh-redirect": (lambda env, src, tmp, statfd: env.run(["sh", "-c", f'cat "$1" > "$2"', "sh", str(tmp), str(src)]),
                    lambda old: NEW),
    "mv": (lambda env, src, tmp, statfd: env.run(["mv", "-f", str(tmp), str(src)]), lambda old: NEW),
}


@pytest.mark.parametrize("how", WRITERS)
def test_write_family_invalidates(staged_env, statfd_bin, how):
    change, expect = WRITERS[how]
    src = staged_file(staged_env)
    old = src.read_bytes()
    tmp = staged_env.write("w/.scratch", data=NEW)
    change(staged_env, src, tmp, statfd_bin)
    assert src.read_bytes() == expect(old)                          # the PFS file changed
    assert "0/w/f.bin" in staged_env.daemon.invalidated              # the daemon was told
    assert not (staged_env.tiers[0] / "0/w/f.bin").exists()          # the copy went
    assert staged_env.python(READ, str(src)).stdout == expect(old)   # and the job reads what it wrote
    if how in ("os.rename", "mv"):
        assert "0/w/.scratch" in staged_env.daemon.invalidated       # both names of a rename


def test_unlink_then_recreate_reads_the_new_file(staged_env):
    src = staged_file(staged_env)
    staged_env.python("import os, sys; os.unlink(sys.argv[1])", str(src))
    assert staged_env.daemon.invalidated == ["0/w/f.bin"]
    src.write_bytes(NEW)  # recreated by someone without the shim
    assert staged_env.python(READ, str(src)).stdout == NEW


def test_unconfirmed_invalidate_stops_probing(shim_env):
    """A renamed directory's copies are the daemon's to drop; if it does not confirm,
    the process must not read them from a tier any more: the old name is gone."""
    shim_env.start_daemon("stage", confirm_invalidate=False)
    staged_file(shim_env, "d/x.bin")
    proc = shim_env.python(textwrap.dedent("""
        import os, sys
        root = sys.argv[1]
        os.rename(os.path.join(root, "d"), os.path.join(root, "d2"))
        try:
            open(os.path.join(root, "d", "x.bin"), "rb").read()
            print("stale copy served")
        except FileNotFoundError:
            print("ENOENT")
        print(len(open(os.path.join(root, "d2", "x.bin"), "rb").read()))
    """), str(shim_env.root))
    assert proc.stdout.decode().split() == ["ENOENT", str(SIZE)]
    assert shim_env.daemon.invalidated == ["0/d", "0/d2"]
    assert (shim_env.tiers[0] / "0/d/x.bin").exists()  # the stub refused to drop it: not read all the same


def test_writes_outside_the_roots_send_nothing(staged_env):
    out = staged_env.other / "o.bin"
    staged_env.python("import sys; open(sys.argv[1], 'wb').write(b'x')", str(out))
    staged_env.run(["mv", str(out), str(staged_env.other / "p.bin")])
    assert staged_env.daemon.invalidated == [] and staged_env.daemon.connections == 0


def test_a_write_through_a_symlink_drops_the_targets_copy(staged_env):
    src = staged_file(staged_env, "w/t.bin")
    link = staged_env.root / "w" / "l.bin"
    link.symlink_to("t.bin")
    staged_env.python(textwrap.dedent("""
        import sys
        open(sys.argv[1], "wb").write(sys.argv[2].encode())
    """), str(link), NEW.decode())
    assert src.read_bytes() == NEW                                   # the target changed on the PFS
    assert {"0/w/l.bin", "0/w/t.bin"} <= set(staged_env.daemon.invalidated)
    assert not (staged_env.tiers[0] / "0/w/t.bin").exists()          # the target's copy went
    assert staged_env.python(READ, str(src)).stdout == NEW           # and reads of the target see it


def test_a_symlink_planted_inside_a_tier_never_redirects_the_shims_unlink(shim_env):
    """A write's invalidation unlinks <tier>/<key> through directory descriptors opened
    O_NOFOLLOW: a directory of the key replaced by a symlink does not send it elsewhere."""
    shim_env.start_daemon("stage")
    src = shim_env.write("w/f.bin", SIZE)
    outside = shim_env.write("w/f.bin", data=b"precious", under=shim_env.other)
    (shim_env.tiers[1] / "0").mkdir()
    (shim_env.tiers[1] / "0" / "w").symlink_to(outside.parent)
    shim_env.python("import sys; open(sys.argv[1], 'wb').write(b'new')", str(src))
    assert "0/w/f.bin" in shim_env.daemon.invalidated
    assert outside.read_bytes() == b"precious"


def test_a_symlink_planted_as_a_tier_copy_is_never_read(shim_env):
    """The tier probe opens a copy O_NOFOLLOW: a symlink in its place is not followed (the
    open goes on, to the PFS here: no daemon answers)."""
    src = shim_env.write("w/g.bin", SIZE)
    outside = shim_env.write("w/g.bin", data=b"not the dataset's bytes", under=shim_env.other)
    (shim_env.tiers[0] / "0" / "w").mkdir(parents=True)
    (shim_env.tiers[0] / "0" / "w" / "g.bin").symlink_to(outside)
    assert shim_env.python(READ, str(src)).stdout == src.read_bytes()
