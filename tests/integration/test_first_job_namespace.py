"""The first job's namespace at the pace of the PFS's listings: on the emulated PFS's generated tree
(types in the listing, no attributes: ``find`` makes no call per file), a job's daemon walks with
no metadata call per file, and every file the job then stats or reads is still the PFS's own.
The same tree's full walk (the C walk describing each name, as before) makes one per file."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys

import pytest

from monarch import protocol
from monarch.node.snapshot import walker
from monarch.tools.slowpfs_generated import Generated
from support.harness import monarch, monarch_env, seen_as_directly, with_manifest, write_config

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]

TREE = Generated(files=6000, per_dir=500)
SAMPLE = 40

# The job: its first stat waits for the index (MONARCH_SHIM_INDEX_WAIT_MS) and the emulator's
# counters are read right after it (the namespace's cost); then a sample is stat'ed, read and
# fstat'ed through the shim, and what it saw is printed as JSON.
READER = r"""
import hashlib, json, os, sys, time
counters, settle, paths = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
os.stat(paths[0])
time.sleep(settle)  # the emulator writes its counters file every 10 ms
with open(counters) as f:
    at_first_stat = json.load(f)
seen = {}
for p in paths:
    st = os.stat(p)
    with open(p, "rb") as f:
        data = f.read()
        fst = os.fstat(f.fileno())
    seen[p] = {"stat": [st.st_size, st.st_mode, st.st_mtime_ns, st.st_nlink, st.st_uid, st.st_gid],
               "fstat": [fst.st_size, fst.st_mode, fst.st_mtime_ns, fst.st_nlink, fst.st_uid, fst.st_gid],
               "sha": hashlib.sha256(data).hexdigest()}
print(json.dumps({"at_first_stat": at_first_stat, "seen": seen}))
"""


def _meta(c: dict) -> int:
    return c["lookups"] + c["readdirs"] + c["opendirs"] + c["accesses"] + c["statfs"]


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_the_first_jobs_namespace_costs_the_pfs_what_find_costs_and_serves_the_pfss_bytes(slow_pfs, short_tmp):
    pfs = slow_pfs(TREE, open_latency_ms=0)
    root = pfs.mountpoint
    pfs.reset_counters()
    found = subprocess.run(["find", root, "-type", "f"], capture_output=True, text=True, check=True, timeout=120)
    find = _meta(pfs.counters())
    assert len(found.stdout.splitlines()) == TREE.files

    pfs.reset_counters()
    walker.walk_index((root,), describe=True)
    full = _meta(pfs.counters())
    assert full >= TREE.files, full  # a full walk: one call (at least) per file

    sample = random.Random(3).sample(range(TREE.files), SAMPLE)
    paths = [os.path.join(root, TREE.path(i)) for i in sample]
    cfg = write_config(short_tmp, root)
    report = os.path.join(short_tmp, "report.json")
    before = pfs.raw_counters()
    env = monarch_env(MONARCH_SHIM_INDEX_WAIT_MS=120000)
    ran = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--",
                  sys.executable, "-c", READER, pfs.counters_path, "0.5", *paths, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    with open(report) as f:
        node = json.load(f)["nodes"][0]
    assert node["snapshot"].startswith("walked"), node["snapshot"]
    namespace = _meta({k: out["at_first_stat"][k] - before[k] for k in ("lookups", "readdirs", "opendirs", "accesses",
                                                                         "statfs")})
    print(f"metadata calls: find {find}, the first job's namespace {namespace}, a full walk {full} "
          f"({TREE.files} files, {TREE.directories} directories)")
    assert namespace <= 2 * find + 10, (namespace, find)

    for i, p in zip(sample, paths):  # as a direct reader sees them: the same stat, the generator's bytes
        st = os.stat(p)
        want = [st.st_size, st.st_mode, st.st_mtime_ns, st.st_nlink, st.st_uid, st.st_gid]
        got = out["seen"][p]
        assert got["stat"] == want and got["fstat"] == want, (p, got, want)
        assert got["sha"] == hashlib.sha256(TREE.data(i)).hexdigest(), p
    assert node["staging"]["files"] == SAMPLE, node["staging"]  # each staged on its miss: served from the node


# Waits until the tiers hold every file of the tree (the read-ahead is through), then reads the
# sample as READER does; the tiers' bases and the count come first.
AFTER_READ_AHEAD = r"""
import os, sys, time
ram, ssd, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
def staged():
    return sum(name.endswith(".bin") for base in (ram, ssd) for _, _, names in os.walk(base) for name in names)
end = time.monotonic() + 120
while staged() < want and time.monotonic() < end:
    time.sleep(0.1)
print("staged", staged(), flush=True)
sys.argv = sys.argv[3:]
""" + READER


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_the_shipped_read_ahead_opens_each_file_once_and_stats_none(slow_pfs, short_tmp):
    """The shipped policy (``read-ahead``) after a listing walk: each file is described from the
    descriptor its copy is read from (the front door's lane; a file past the lane's size is
    described there and copied by the stager), not by a stat of every file before the read-ahead
    starts. The PFS sees the walk's calls and one name looked up per open; every file is staged,
    each read once, and what the job sees is the PFS's own."""
    tree = Generated(files=1200, per_dir=300, min_size=1024, max_size=320_000)  # ~1 in 5 past the lane's 256 KiB
    large = sum(tree.size(i) > 256 * 1024 for i in range(tree.files))
    pfs = slow_pfs(tree, open_latency_ms=0)
    root = pfs.mountpoint
    pfs.reset_counters()
    subprocess.run(["find", root, "-type", "f"], capture_output=True, check=True, timeout=120)
    find = _meta(pfs.counters())

    sample = random.Random(6).sample(range(tree.files), SAMPLE)
    paths = [os.path.join(root, tree.path(i)) for i in sample]
    cfg = write_config(short_tmp, root, policy="read-ahead")
    report = os.path.join(short_tmp, "report.json")
    pfs.reset_counters()
    ran = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, "-c", AFTER_READ_AHEAD,
                  f"/dev/shm{short_tmp}/ram0", f"{short_tmp}/ssd0", str(tree.files), pfs.counters_path, "0.03", *paths,
                  env=monarch_env(MONARCH_SHIM_INDEX_WAIT_MS=120000))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"staged {tree.files}" in ran.stdout, ran.stdout
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    c = pfs.counters()
    with open(report) as f:
        node = json.load(f)["nodes"][0]
    print(f"metadata calls: find {find}, the job {_meta(c)}; opens {c['opens']} ({tree.files} files, {large} past "
          f"the lane's size); staged {node['staging']['files']}")
    assert node["snapshot"].startswith("walked"), node["snapshot"]
    assert node["staging"]["files"] == tree.files and node["staging"]["pfs_files_read"] == tree.files, node["staging"]
    assert node["staging"]["pfs_bytes_read"] == sum(tree.size(i) for i in range(tree.files)), node["staging"]
    assert c["opens"] <= tree.files + large, c["opens"]  # a large file: the lane's open, then the stager's
    assert _meta(c) <= 2 * find + 10 + c["opens"], (_meta(c), find, c["opens"])  # (a stat of every file first: one call more a file)
    for i, p in zip(sample, paths):
        st = os.stat(p)
        want = [st.st_size, st.st_mode, st.st_mtime_ns, st.st_nlink, st.st_uid, st.st_gid]
        assert out["seen"][p]["stat"] == out["seen"][p]["fstat"] == want, p
        assert out["seen"][p]["sha"] == hashlib.sha256(tree.data(i)).hexdigest(), p


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_the_shipped_read_ahead_of_files_past_the_lanes_size_opens_each_once(slow_pfs, short_tmp):
    """Files all past the front door's 256 KiB: once the lane has found them so, it looks each
    name up without opening it (the stager, which copies it, opens it): each file opened once."""
    tree = Generated(files=300, per_dir=100, min_size=300_000, max_size=500_000)
    pfs = slow_pfs(tree, open_latency_ms=0)
    root = pfs.mountpoint
    cfg = write_config(short_tmp, root, policy="read-ahead")
    report = os.path.join(short_tmp, "report.json")
    pfs.reset_counters()
    ran = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, "-c", AFTER_READ_AHEAD,
                  f"/dev/shm{short_tmp}/ram0", f"{short_tmp}/ssd0", str(tree.files), pfs.counters_path, "0.03",
                  os.path.join(root, tree.path(7)), env=monarch_env(MONARCH_SHIM_INDEX_WAIT_MS=120000))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"staged {tree.files}" in ran.stdout, ran.stdout
    c = pfs.counters()
    with open(report) as f:
        node = json.load(f)["nodes"][0]
    print(f"opens {c['opens']}, metadata calls {_meta(c)} for {tree.files} files")
    assert node["staging"]["pfs_bytes_read"] == sum(tree.size(i) for i in range(tree.files)), node["staging"]
    assert c["opens"] <= tree.files + 8, c["opens"]  # (the lane's first few, opened before it learnt)
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["seen"][os.path.join(root, tree.path(7))]["sha"] == hashlib.sha256(tree.data(7)).hexdigest()


# Waits until the tiers' files hold still for 2 s and then 8 s more (the lane waits 5 s for room before
# it ends, the stager then goes on): prints how many the tiers hold.
UNTIL_FULL = r"""
import os, sys, time
ram, ssd = sys.argv[1], sys.argv[2]
def staged():
    return sum(name.endswith(".bin") for base in (ram, ssd) for _, _, names in os.walk(base) for name in names)
last, since, end = -1, time.monotonic(), time.monotonic() + 120
while time.monotonic() - since < 2 and time.monotonic() < end:
    if (now := staged()) != last:
        last, since = now, time.monotonic()
    time.sleep(0.1)
time.sleep(8)
print("staged", staged(), flush=True)
"""


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_the_shipped_read_ahead_into_full_tiers_stats_no_file_it_cannot_keep(slow_pfs, short_tmp):
    """Tiers that hold a tenth of the tree: the read-ahead fills them, each file it copies opened
    once, and stops; the files it cannot keep are not stat'ed to learn that they do not fit."""
    tree = Generated(files=6000, per_dir=500)  # 1-4 KiB
    pfs = slow_pfs(tree, open_latency_ms=0)
    root = pfs.mountpoint
    pfs.reset_counters()
    subprocess.run(["find", root, "-type", "f"], capture_output=True, check=True, timeout=120)
    find = _meta(pfs.counters())
    cfg = write_config(short_tmp, root, ram="1MiB", ssd="1MiB", policy="read-ahead")
    report = os.path.join(short_tmp, "report.json")
    pfs.reset_counters()
    ran = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, "-c", UNTIL_FULL,
                  f"/dev/shm{short_tmp}/ram0", f"{short_tmp}/ssd0")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    c = pfs.counters()
    with open(report) as f:
        node = json.load(f)["nodes"][0]
    staged = node["staging"]["files"]
    print(f"metadata calls: find {find}, the job {_meta(c)}; opens {c['opens']}; staged {staged} of {tree.files}; "
          f"{ran.stdout.strip()}")
    assert 0 < staged < tree.files // 2, staged
    assert c["opens"] <= staged + 64, (c["opens"], staged)  # (the copies in flight when the room ran out)
    assert _meta(c) <= 2 * find + 10 + c["opens"], (_meta(c), find, c["opens"])


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_a_job_given_a_listed_manifest_reads_before_any_check_and_checks_after(slow_pfs, short_tmp):
    """`monarch index` lists as find does; a job given its manifest asks the PFS nothing before it
    starts (its directories are checked after, its metadata the PFS's until then) and still serves
    the PFS's bytes and stats. 120 directories at 20 ms a metadata call: their check takes seconds,
    the job's first stat does not wait for it."""
    tree = Generated(files=3000, per_dir=25)
    pfs = slow_pfs(tree, open_latency_ms=0, lookup_latency_ms=20)
    root = pfs.mountpoint
    manifest = os.path.join(short_tmp, "tree.index")
    pfs.reset_counters()
    made = monarch("index", root, "-o", manifest)
    assert made.returncode == 0 and f"{tree.files} files" in made.stdout, made.stdout + made.stderr
    assert _meta(pfs.counters()) <= 5 * (tree.directories + 1)  # listed, not stat'ed: a few calls a directory
    sample = random.Random(4).sample(range(tree.files), SAMPLE)
    node = job_with_manifest(pfs, tree, manifest, sample, short_tmp)
    assert node["snapshot"] == "manifest", node["snapshot"]  # checked after the start: unchanged


def job_with_manifest(pfs, tree: Generated, manifest: str, sample: list[int], base: str) -> dict:
    """READER under a job given ``manifest`` (of the mount's whole ``tree``), its sample files
    ``sample``: it is served after fewer calls than the tree has directories, and every stat and
    byte it saw is the PFS's own; the node's report."""
    root = str(pfs.mountpoint)
    paths = [os.path.join(root, tree.path(i)) for i in sample]
    cfg = with_manifest(write_config(base, root), root, manifest)
    report = os.path.join(base, "report.json")
    before = pfs.raw_counters()
    ran = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, "-c", READER,
                  pfs.counters_path, "0.03", *paths, env=monarch_env(MONARCH_SHIM_INDEX_WAIT_MS=120000))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    first = _meta({k: out["at_first_stat"][k] - before[k] for k in ("lookups", "readdirs", "opendirs", "accesses",
                                                                     "statfs")})
    # the manifest's own reading, the stat itself, some of the check's calls meanwhile (2 at once, at 20 ms
    # each): a check before the job would have been 2 calls a directory
    assert first < tree.directories, first
    for i, p in zip(sample, paths):
        st = os.stat(p)
        assert out["seen"][p]["stat"] == out["seen"][p]["fstat"] == [st.st_size, st.st_mode, st.st_mtime_ns, st.st_nlink,
                                                                    st.st_uid, st.st_gid]
        assert out["seen"][p]["sha"] == hashlib.sha256(tree.data(i)).hexdigest(), p
    with open(report) as f:
        return json.load(f)["nodes"][0]


def small_tree(root: str, files: int) -> str:
    """``root`` with d0..d2, each of ``files`` files d{d}/f{i}.bin of 2 x (100 + i) bytes."""
    for d in range(3):
        os.makedirs(os.path.join(root, f"d{d}"))
        for i in range(files):
            with open(os.path.join(root, f"d{d}", f"f{i}.bin"), "wb") as f:
                f.write(bytes([d, i]) * (100 + i))
    return root


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_a_manifest_made_before_the_dataset_changed_serves_the_datasets_files_as_they_are_now(short_tmp):
    """Names added, removed and rewritten in place after `monarch index`: the job, served before
    its manifest is checked, sees each as a direct reader does (the manifest's files are described
    at their open; its metadata stays the PFS's once the check finds a directory changed)."""
    root = small_tree(os.path.join(short_tmp, "data"), 20)
    manifest = os.path.join(short_tmp, "data.index")
    assert monarch("index", root, "-o", manifest).returncode == 0
    os.unlink(os.path.join(root, "d0", "f3.bin"))
    with open(os.path.join(root, "d1", "new.bin"), "wb") as f:
        f.write(b"new" * 50)
    with open(os.path.join(root, "d2", "f5.bin"), "r+b") as f:  # in place: no directory's mtime moves
        f.write(b"rewritten, longer than it was" * 20)
    cfg = with_manifest(write_config(short_tmp, root), root, manifest)
    report = seen_as_directly(cfg, root, ["d0/f3.bin", "d1/new.bin", "d2/f5.bin", "d2/f6.bin"], ["d1", "d0"])
    how = report["nodes"][0]["snapshot"]
    assert how.startswith("manifest: a directory changed since it was made"), how


def test_a_manifest_the_shim_would_refuse_is_walked_instead_and_the_job_served_from_its_tiers(short_tmp):
    """A manifest with no bucket (a damaged or foreign file): the shim and the
    front door refuse to map it, so a daemon that took it as its snapshot served nothing from its
    tiers and left every metadata call to the PFS. The job's daemon walks instead and says why."""
    root = small_tree(os.path.join(short_tmp, "data"), 10)
    manifest = os.path.join(short_tmp, "data.index")
    assert monarch("index", root, "-o", manifest).returncode == 0
    with open(manifest, "r+b") as f:  # the header's bucket count (protocol.INDEX_HEADER: its fourth field)
        f.seek(16)
        f.write((0).to_bytes(4, "little"))
    cfg = with_manifest(write_config(short_tmp, root), root, manifest)
    report = seen_as_directly(cfg, root, ["d0/f3.bin", "d2/f9.bin"], ["d1"])
    how = report["nodes"][0]["snapshot"]
    assert how == (f"walked: the manifest {manifest} is not one `monarch index` wrote (ValueError: its buckets (0) "
                   f"hold no key): run `monarch index` again"), how
    ram = (report.get("opened_from") or {}).get("ram") or {}
    assert ram.get("opens") == 2, report.get("opened_from")  # both files read from the copies made of them


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_the_next_job_adopts_the_copies_of_files_described_by_the_first_without_a_stat_each(slow_pfs, short_tmp):
    """With `keep: true` the first job's snapshot is kept with the files it described (those it
    read): the next job checks its directories, adopts those copies as they are, and reads them
    from the tier, asking the PFS nothing per file."""
    pfs = slow_pfs(TREE, open_latency_ms=0)
    root = pfs.mountpoint
    sample = random.Random(5).sample(range(TREE.files), SAMPLE)
    paths = [os.path.join(root, TREE.path(i)) for i in sample]
    cfg = write_config(short_tmp, root, keep=True)
    env = monarch_env(MONARCH_SHIM_INDEX_WAIT_MS=120000)
    nodes, calls = [], []
    for _ in range(2):
        report = os.path.join(short_tmp, "report.json")
        pfs.reset_counters()
        ran = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", sys.executable, "-c", READER,
                      pfs.counters_path, "0.03", *paths, env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        calls.append(_meta(pfs.counters()))
        out = json.loads(ran.stdout.strip().splitlines()[-1])
        for i, p in zip(sample, paths):
            assert out["seen"][p]["sha"] == hashlib.sha256(TREE.data(i)).hexdigest(), p
        with open(report) as f:
            nodes.append(json.load(f)["nodes"][0])
    first, later = nodes
    assert first["snapshot"].startswith("walked") and later["snapshot"] == "reused", (first["snapshot"], later["snapshot"])
    assert later["staging"]["files"] == 0, later["staging"]  # every copy adopted: nothing staged again
    assert pfs.counters()["opens"] == 0
    # its directories' check, the READER's stats of the sample (answered here): nothing a file
    assert calls[1] <= 4 * (TREE.directories + 1), calls


STATS = r"""
import json, os, struct, sys
from monarch import protocol
root = sys.argv[1]
seen = {}
for d in sorted(os.listdir(root)):
    for name in sorted(os.listdir(os.path.join(root, d))):
        p = os.path.join(root, d, name)
        st = os.lstat(p)
        with open(p, "rb") as f:  # (nothing read: the atimes stay the direct run's)
            fst = os.fstat(f.fileno())
        seen[f"{d}/{name}"] = [[s.st_size, s.st_mode, s.st_ino, s.st_dev, s.st_nlink, s.st_uid, s.st_gid, s.st_atime_ns,
                                s.st_mtime_ns, s.st_ctime_ns, s.st_blocks, s.st_blksize] for s in (st, fst, os.stat(p))]
shorts = None
if os.environ.get("MONARCH_INDEX"):
    with open(os.environ["MONARCH_INDEX"], "rb") as f:
        data = f.read()
    files, files_off = protocol.INDEX_HEADER.unpack_from(data)[11], protocol.INDEX_HEADER.unpack_from(data)[13]
    records = [protocol.INDEX_FILE.unpack_from(data, files_off + 8 * n)[1] for n in range(files)]
    shorts = sum(1 for s in records if files < s != protocol.INDEX_DESCRIBING)
print(json.dumps({"seen": seen, "shorts": shorts}))
"""


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_files_described_in_short_stats_are_answered_by_the_shim_as_the_pfs_answers(short_tmp):
    """A listing walk's files stat'ed by the job: each described by the daemon, most in a short stat
    beside its directory's shape (its size, inode, blocks and times its own), one a directory and
    the one past the short stats' largest size in a slot; lstat, stat and the staged copy's fstat
    answered by the shim from the index, every field as a direct reader's."""
    root = small_tree(os.path.join(short_tmp, "data"), 12)
    with open(os.path.join(root, "d2", "large.bin"), "wb") as f:
        f.write(b"L" * (protocol.INDEX_SHORT_MAX_SIZE + 1))
    args = (sys.executable, "-c", STATS, root)
    direct = json.loads(subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout)
    cfg = write_config(short_tmp, root)
    ran = monarch("run", "-c", cfg, "--no-progress", "--", *args)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    served = json.loads(ran.stdout.strip().splitlines()[-1])
    assert served["seen"] == direct["seen"] and len(served["seen"]) == 3 * 12 + 1
    assert served["shorts"] == 3 * 11  # every file but each directory's shape and the large one


LISTINGS = r"""
import json, os, sys
from monarch import protocol
root, dirs = sys.argv[1], sys.argv[2:]
seen = {d: sorted((e.name, e.inode(), e.is_file(follow_symlinks=False)) for e in os.scandir(os.path.join(root, d)))
        for d in dirs}
one = None
if os.environ.get("MONARCH_INDEX"):
    with open(os.environ["MONARCH_INDEX"], "rb") as f:
        one = bool(protocol.INDEX_HEADER.unpack(f.read(protocol.INDEX_HEADER.size))[4] & protocol.INDEX_INOS_ONE)
print(json.dumps({"seen": seen, "inos_one": one}))
"""


@pytest.mark.skipif(walker.library() is None, reason="the C walker cannot be built here")
def test_a_listing_whose_names_share_one_inode_keeps_it_once_and_lists_as_the_pfs_lists(slow_pfs, short_tmp):
    """A FUSE filesystem lists every name with the same unknown d_ino: the walk's index keeps it once
    (INDEX_INOS_ONE, no u64 a file), and the job's listings, served from the index, give it as the
    PFS does."""
    pfs = slow_pfs(TREE, open_latency_ms=0)
    root = pfs.mountpoint
    args = (sys.executable, "-c", LISTINGS, root, "d000000", "d000003", "")
    direct = json.loads(subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout)
    assert len({ino for _, ino, _ in direct["seen"]["d000000"]}) == 1  # FUSE's unknown inode
    cfg = write_config(short_tmp, root)
    ran = monarch("run", "-c", cfg, "--no-progress", "--", *args, env=monarch_env(MONARCH_SHIM_INDEX_WAIT_MS=120000))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    served = json.loads(ran.stdout.strip().splitlines()[-1])
    assert served == {"seen": direct["seen"], "inos_one": True}
