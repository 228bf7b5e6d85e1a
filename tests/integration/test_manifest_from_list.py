"""A manifest made from a list of files the user already has (`monarch index --from-list`): no
file is stat'ed to make it, a job given it asks the PFS nothing per file before it reads, and what
the job sees is the PFS's own: bytes, stats, names the list leaves out, names gone since, and
directories' listings (the list need not be a directory's whole listing)."""

from __future__ import annotations

import os
import random

import pytest

from monarch.tools.slowpfs_generated import Generated
from support.harness import monarch, seen_as_directly, with_manifest, write_config
from test_first_job_namespace import _meta, job_with_manifest, small_tree

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(180)]

SAMPLE = 30


def test_a_list_of_a_split_makes_a_manifest_with_no_call_per_file_and_its_job_reads_the_pfss_bytes(slow_pfs, short_tmp):
    """The list names half the files (a split) with their sizes: `monarch index --from-list` makes
    a few calls a directory and a few per the sample, none per file; the job given it is served from
    it before its check (100 directories at 20 ms a call take seconds to check), and reads the
    listed files and the others (the PFS's) byte for byte."""
    tree = Generated(files=2000, per_dir=20)
    pfs = slow_pfs(tree, open_latency_ms=0, lookup_latency_ms=20)
    root = pfs.mountpoint
    split = [i for i in range(tree.files) if i % 2 == 0]
    listing = os.path.join(short_tmp, "train.list")
    with open(listing, "w") as f:
        f.writelines(f"{tree.path(i)}\t{len(tree.data(i))}\n" for i in split)
    manifest = os.path.join(short_tmp, "train.index")
    pfs.reset_counters()
    made = monarch("index", root, "-o", manifest, "--from-list", listing)
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"{len(split)} files, {tree.directories + 1} directories" in made.stdout, made.stdout
    # a directory's stat is 2 calls (lookup, getattr), a sampled file's lstat by its path 3: 252 here;
    # one call a directory more allowed for the kernel's revalidations, none a file (1,000 listed)
    assert _meta(pfs.counters()) <= 3 * (tree.directories + 1) + 3 * 16, pfs.counters()

    rng = random.Random(7)
    chosen = rng.sample(split, SAMPLE) + rng.sample([i for i in range(tree.files) if i % 2], 5)  # 5 not listed
    node = job_with_manifest(pfs, tree, manifest, chosen, short_tmp)
    assert node["snapshot"] == "manifest", node["snapshot"]  # its directories checked after the start: unchanged
    assert node["dataset"]["files"] == len(split)
    assert node["dataset"]["bytes"] == sum(len(tree.data(i)) for i in split)  # the list's sizes, before any stat
    assert node["staging"]["files"] == SAMPLE, node["staging"]  # the listed files read were staged, the others not


def test_a_job_sees_the_dataset_as_it_is_now_whatever_its_list_says(short_tmp):
    """A list made before the dataset changed, with a wrong size, a name that never existed, and a
    directory removed since: the job reads, stats and lists what a direct reader does."""
    root = small_tree(os.path.join(short_tmp, "data"), 10)
    listing = os.path.join(short_tmp, "data.list")
    with open(listing, "w") as f:
        f.write("".join(f"./d{d}/f{i}.bin\t{2 * (100 + i)}\n" for d in range(3) for i in range(8)))  # f8, f9 left out
        f.write("d0/never.bin\t10\nd9/gone.bin\n")  # a name and a directory that are not there
    manifest = os.path.join(short_tmp, "data.index")
    made = monarch("index", root, "-o", manifest, "--from-list", listing)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "no directory now" in made.stderr and "d9" in made.stderr, made.stderr
    os.unlink(os.path.join(root, "d0", "f3.bin"))
    with open(os.path.join(root, "d1", "f2.bin"), "r+b") as f:  # in place: no directory's mtime moves
        f.write(b"rewritten, longer than it was" * 20)
    with open(os.path.join(root, "d1", "new.bin"), "wb") as f:
        f.write(b"new" * 50)
    cfg = with_manifest(write_config(short_tmp, root), root, manifest)
    report = seen_as_directly(cfg, root, ["d0/f3.bin", "d0/never.bin", "d9/gone.bin", "d1/f2.bin", "d1/f9.bin",
                                          "d1/new.bin", "d2/f4.bin"], ["d0", "d1", "d2"])
    how = report["nodes"][0]["snapshot"]
    assert how.startswith("manifest: a directory changed since it was made"), how


def test_a_list_of_another_root_is_refused_with_what_to_do(short_tmp):
    root = os.path.join(short_tmp, "data")
    os.makedirs(os.path.join(root, "a"))
    with open(os.path.join(root, "a", "x.jpg"), "wb") as f:
        f.write(b"x")
    listing = os.path.join(short_tmp, "labels.txt")
    with open(listing, "w") as f:  # an image list with labels, not paths: "a/x.jpg 3"
        f.write("a/x.jpg 3\na/y.jpg 1\n")
    made = monarch("index", root, "-o", os.path.join(short_tmp, "m.index"), "--from-list", listing)
    assert made.returncode == 2, made.stdout + made.stderr
    assert "none of 2 files sampled" in made.stderr and "one path a line" in made.stderr, made.stderr
    assert not os.path.exists(os.path.join(short_tmp, "m.index"))
