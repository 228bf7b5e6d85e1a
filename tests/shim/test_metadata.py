"""Metadata under a root answered from the snapshot index, in the shim: the same answers as
the PFS (compared with the same program run without the shim), counted as local, and never
stale after the job's own writes."""

from __future__ import annotations

import os
import shutil
import struct
import sys

import pytest

from monarch import protocol

pytestmark = pytest.mark.shim


def make_tree(env) -> None:
    """Directories, files of several sizes, a symlink to a file, to a directory, a broken one,
    a fifo, odd names: what a dataset may hold."""
    for i in range(3):
        for j in range(4):
            env.write(f"train/class{i}/img{j}.jpg", size=1000 * (i + 1) + 7 * j)
    env.write("val/a b.jpg", size=10)
    env.write("val/new\nline.bin", size=3)
    env.write("empty/.keep", size=0)
    (env.root / "val" / "deep" / "er").mkdir(parents=True)
    (env.root / "links").mkdir()
    os.symlink("../train/class0/img0.jpg", env.root / "links" / "to_file")
    os.symlink("../train", env.root / "links" / "to_dir")
    os.symlink("nowhere", env.root / "links" / "broken")
    os.mkfifo(env.root / "links" / "fifo")
    os.chmod(env.root / "val" / "a b.jpg", 0o640)


def plain_env(env) -> dict:
    e = env.environ()
    del e["LD_PRELOAD"]
    return e


def meta_counts(env) -> tuple[int, int, int]:
    extra = protocol.read_extra_counters(env.counters)
    return extra[protocol.EXTRA_META_LOCAL], extra[protocol.EXTRA_META_PFS], extra[protocol.EXTRA_META_OFF]


def same_with_and_without(env, argv, sort: bool = False, **kw) -> bytes:
    """Run argv plain and preloaded; the outputs must be equal (as sorted lines with ``sort``:
    readdir order is the filesystem's). Returns the output."""
    plain = env.run(argv, env=plain_env(env), **kw).stdout
    shim = env.run(argv, **kw).stdout
    if sort:
        plain, shim = (b"\n".join(sorted(x.split(b"\n"))) for x in (plain, shim))
    assert shim == plain, f"\n--- without Monarch\n{plain.decode(errors='replace')}\n--- with\n" \
                          f"{shim.decode(errors='replace')}"
    return shim


PY_PROGRAM = r"""
import glob, os, pathlib, sys
root = sys.argv[1]
paths = [root, root + "/train", root + "/train/class1/img2.jpg", root + "/val/a b.jpg", root + "/val/new\nline.bin",
         root + "/links/to_file", root + "/links/to_dir", root + "/links/broken", root + "/links/fifo",
         root + "/missing", root + "/train/missing.jpg", root + "/nodir/x", root + "/train/class0/img0.jpg/x",
         root + "/train/", root + "/train/class1/img2.jpg/", root + "/./train/../val", "train/class2/img3.jpg"]
def st(f, p):
    try:
        s = f(p)
        return (s.st_mode, s.st_size, s.st_ino, s.st_dev, s.st_nlink, s.st_uid, s.st_gid, s.st_mtime_ns,
                s.st_ctime_ns, s.st_blocks, s.st_blksize)
    except OSError as e:
        return "errno %d" % e.errno
for p in paths:
    print(repr(p), st(os.stat, p), st(os.lstat, p), os.path.exists(p), os.path.lexists(p), os.path.isdir(p),
          os.path.isfile(p), os.path.islink(p), os.access(p, os.F_OK), os.access(p, os.R_OK))
    try:
        print("  getsize", os.path.getsize(p))
    except OSError as e:
        print("  getsize errno", e.errno)
for d in [root, root + "/train/class0", root + "/links", root + "/empty", root + "/val/deep"]:
    print(d, sorted(os.listdir(d)))
    print(sorted((e.name, e.is_dir(), e.is_file(), e.is_symlink(), e.inode(), st(e.stat, None) if False else
                  e.stat(follow_symlinks=False).st_size) for e in os.scandir(d)))
for top, dirs, files in sorted(os.walk(root)):
    print("walk", top, sorted(dirs), sorted(files))
print(sorted(glob.glob(root + "/**/*.jpg", recursive=True)))
print(sorted(glob.glob(root + "/train/class?/img[12].jpg")))
p = pathlib.Path(root)
print(sorted(str(x) for x in p.rglob("*")))
print(sorted((x.name, x.is_file(), x.stat().st_size if x.is_file() else -1) for x in (p / "train" / "class2").iterdir()))
print([os.path.getsize(x) for x in sorted(glob.glob(root + "/train/*/*.jpg"))])
"""


def test_python_metadata_same_as_pfs_and_local(shim_env):
    make_tree(shim_env)
    out = same_with_and_without(shim_env, [sys.executable, "-c", PY_PROGRAM, str(shim_env.root)], cwd=shim_env.root)
    assert b"img2.jpg" in out and b"errno 2" in out
    local, pfs, off = meta_counts(shim_env)
    assert off == 0
    # every stat, access and listing of a described or absent name is local; the PFS gets the
    # names the index does not describe (the directory symlink and what lies below it, the
    # broken link, the fifo) and the root's own lstat
    assert local > 150 and pfs < local / 2, (local, pfs)


def test_c_metadata_same_as_pfs(shim_env, meta_bin):
    make_tree(shim_env)
    paths = [str(shim_env.root / p) for p in ("", "train", "train/class1", "train/class1/img1.jpg", "links",
                                              "links/to_file", "links/to_dir", "links/broken", "missing",
                                              "val/deep", "empty", "val/a b.jpg", "val/new\nline.bin")]
    out = same_with_and_without(shim_env, [meta_bin, *paths])
    assert b"opendir: 5 names, 5 after rewinddir" in out  # train: ".", "..", class0..2
    assert b"fdopendir: 5 names" in out
    local, pfs, _ = meta_counts(shim_env)
    assert local > 60, (local, pfs)


def test_tools_same_as_pfs(shim_env):
    make_tree(shim_env)
    cwd = shim_env.root.parent
    for argv in (["ls", "-lR", "--time-style=full-iso", "ds"], ["ls", "-laiR", "ds"],
                 ["find", "ds", "-printf", r"%p %s %m %T@ %i %y %n\n"], ["du", "-sb", "ds"], ["du", "-a", "ds"]):
        if not shutil.which(argv[0]):
            pytest.skip(f"{argv[0]} not installed")
        out = same_with_and_without(shim_env, argv, sort=argv[0] in ("find", "du"), cwd=cwd)
        assert out
    local, pfs, _ = meta_counts(shim_env)
    assert local > 100, (local, pfs)


FORKS_AND_THREADS = r"""
import os, sys, threading, hashlib
root = sys.argv[1]
def survey():
    out = []
    for top, dirs, files in os.walk(root):
        for n in sorted(files):
            p = os.path.join(top, n)
            try:
                s = os.stat(p)
                out.append((p, s.st_size, s.st_mtime_ns, s.st_ino))
            except OSError as e:
                out.append((p, e.errno))
    return hashlib.md5(repr(sorted(out)).encode()).hexdigest()
results = []
threads = [threading.Thread(target=lambda: results.append(survey())) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
pids = []
for i in range(3):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, survey().encode()); os._exit(0)
    os.close(w)
    pids.append((pid, r))
for pid, r in pids:
    results.append(os.read(r, 100).decode()); os.waitpid(pid, 0)
assert len(set(results)) == 1, results
print(results[0])
"""


def test_forked_workers_and_threads(shim_env):
    make_tree(shim_env)
    same_with_and_without(shim_env, [sys.executable, "-c", FORKS_AND_THREADS, str(shim_env.root)])
    local, pfs, _ = meta_counts(shim_env)
    assert local >= 7 * 16, (local, pfs)  # 7 surveys of 16 files (plus their listings)


WRITES = r"""
import os, subprocess, sys
root, code = sys.argv[1], sys.argv[2]
def look():
    out = []
    for p in ("train/new.jpg", "train/class0/img1.jpg", "train/moved.jpg", "val/a b.jpg", "made", "made/f"):
        full = os.path.join(root, p)
        try:
            s = os.stat(full)
            out.append((p, s.st_size, oct(s.st_mode)))
        except OSError as e:
            out.append((p, "errno", e.errno))
    out.append(sorted(os.listdir(os.path.join(root, "train"))))
    out.append(os.path.exists(os.path.join(root, "train/new.jpg")))
    return out
print(look())
exec(code)
print(look())
# a process started after the change, with the job's same index and counters
print(subprocess.run([sys.executable, "-c", "import os,sys;print(os.path.exists(sys.argv[1]), "
                      "sorted(os.listdir(os.path.dirname(sys.argv[1]))))", os.path.join(root, "train/new.jpg")],
                     capture_output=True, text=True).stdout)
"""


@pytest.mark.parametrize("code", [
    "open(os.path.join(root, 'train/new.jpg'), 'wb').write(b'x' * 5)",
    "os.rename(os.path.join(root, 'train/class0/img1.jpg'), os.path.join(root, 'train/moved.jpg'))",
    "os.unlink(os.path.join(root, 'train/class0/img1.jpg'))",
    "os.mkdir(os.path.join(root, 'made')); os.symlink('x', os.path.join(root, 'made/f'))",
    "os.chmod(os.path.join(root, 'val/a b.jpg'), 0o600)",
    "os.utime(os.path.join(root, 'val/a b.jpg'), (1, 2)); os.truncate(os.path.join(root, 'val/a b.jpg'), 1)",
], ids=["create", "rename", "unlink", "mkdir+symlink", "chmod", "utime+truncate"])
def test_after_the_jobs_own_writes_answers_follow_the_pfs(shim_env, code):
    """Before the write: answers from the index; after it, in this process, in a sibling
    started later: what the PFS says (the same program without Monarch says the same)."""
    make_tree(shim_env)
    shim_env.start_daemon("pfs")
    env = shim_env.environ()
    plain = shim_env.run([sys.executable, "-c", WRITES, str(shim_env.root), code], env=plain_env(shim_env)).stdout
    # the same tree again (the plain run changed it), then the run through the shim
    shutil.rmtree(shim_env.root)
    shim_env.root.mkdir()
    make_tree(shim_env)
    env = shim_env.environ()  # the index of the restored tree
    local0, _, _ = meta_counts(shim_env)
    out = shim_env.run([sys.executable, "-c", WRITES, str(shim_env.root), code], env=env).stdout
    assert out == plain, f"\n--- without Monarch\n{plain.decode()}\n--- with\n{out.decode()}"
    local, pfs, off = meta_counts(shim_env)
    assert off & 1, "root 0's metadata must be off after the write"
    assert local > local0 and pfs > 0


def test_write_in_one_process_turns_metadata_off_in_another(shim_env):
    """A process that started before the write, in the same job, stops answering too."""
    make_tree(shim_env)
    shim_env.start_daemon("pfs")
    code = r"""
import os, sys, time
root = sys.argv[1]
r, w = os.pipe(); r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)                       # wait for the parent's write
    print("child", os.path.exists(os.path.join(root, "late.jpg")), flush=True)
    os._exit(0)
print("before", os.path.exists(os.path.join(root, "late.jpg")), flush=True)
open(os.path.join(root, "late.jpg"), "wb").close()
os.write(w, b"x"); os.waitpid(pid, 0)
"""
    out = shim_env.python(code, str(shim_env.root)).stdout.decode()
    assert out.split() == ["before", "False", "child", "True"], out


def test_stale_index_is_not_used_after_metadata_off_bit(shim_env):
    """The META_OFF bit, set by anyone (another process of the job), makes the shim ask the
    PFS: a file the index does not know is found."""
    make_tree(shim_env)
    env = shim_env.environ()  # the index is written now
    (shim_env.root / "train" / "after.jpg").write_bytes(b"1")
    code = "import os,sys; print(os.path.exists(sys.argv[1]))"
    target = str(shim_env.root / "train" / "after.jpg")
    assert shim_env.run([sys.executable, "-c", code, target], env=env).stdout == b"False\n"  # the assumption
    words = bytearray(open(shim_env.counters, "rb").read())
    offset = 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * protocol.MAX_SLOTS + protocol.EXTRA_META_OFF)
    struct.pack_into("<Q", words, offset, 1)
    open(shim_env.counters, "r+b").write(words)
    assert shim_env.run([sys.executable, "-c", code, target], env=env).stdout == b"True\n"


def test_without_index_everything_goes_to_the_pfs_and_is_counted(shim_env):
    make_tree(shim_env)
    env = shim_env.environ()
    env[protocol.ENV_INDEX] = str(shim_env.base / "no-index")
    out = shim_env.run([sys.executable, "-c", PY_PROGRAM, str(shim_env.root)], env=env, cwd=shim_env.root).stdout
    assert out == shim_env.run([sys.executable, "-c", PY_PROGRAM, str(shim_env.root)], env=plain_env(shim_env),
                               cwd=shim_env.root).stdout
    local, pfs, _ = meta_counts(shim_env)
    assert local == 0 and pfs > 150


def test_outside_the_roots_nothing_is_counted(shim_env):
    make_tree(shim_env)
    (shim_env.other / "f").write_bytes(b"x")
    shim_env.python("import os,sys; os.stat(sys.argv[1]); os.listdir(os.path.dirname(sys.argv[1]))",
                    str(shim_env.other / "f"))
    assert meta_counts(shim_env)[:2] == (0, 0)


def test_a_farm_of_links_to_files_is_answered_from_the_index(shim_env):
    """A dataset made of symlinks to files kept elsewhere (a link farm) has a link record for each
    beside its key: 168 links and 2 directories give 338 entries to 16 buckets, sized on what is
    keyed (the directories). Such an index is mapped and answers (a check on every entry against the buckets once
    refused it, and every call went to the PFS)."""
    store = shim_env.other / "store"
    store.mkdir()
    for i in range(168):
        shim_env.write(f"f{i:03d}", size=i + 1, under=store)
        (shim_env.root / "farm").mkdir(exist_ok=True)
        os.symlink(store / f"f{i:03d}", shim_env.root / "farm" / f"l{i:03d}")
    code = "import os,sys; print(sum(os.stat(os.path.join(sys.argv[1], n)).st_size for n in os.listdir(sys.argv[1])))"
    out = same_with_and_without(shim_env, [sys.executable, "-c", code, str(shim_env.root / "farm")])
    assert out.strip() == str(sum(range(1, 169))).encode()
    with open(shim_env.index, "rb") as f:
        header = protocol.INDEX_HEADER.unpack(f.read(protocol.INDEX_HEADER.size))
    assert (header[2], header[3]) == (338, 16)  # entries, buckets
    local, pfs, _ = meta_counts(shim_env)
    assert local >= 169 and pfs < 10, (local, pfs)
