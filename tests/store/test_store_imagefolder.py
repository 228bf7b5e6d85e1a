"""PyTorch's way through a store's mount: an ImageFolder-style listing (os.scandir's directories,
then os.walk of each class) and np.load of every sample, by 4 forked workers for 2 shuffled
epochs, under ``monarch run`` (support.imagefolder_reader, the store benchmark's reader).
A real redis-server on a private socket; the mount has no directory on disk."""

import json
import os
import sys

import numpy as np
import pytest

from monarch.store.load import put
from monarch.store.url import StoreURL
from monarch.tools.workload import digest
from support.harness import load, monarch
from support.imagefolder_reader import make_npy_dataset
from support.redisstore import store_config

pytestmark = pytest.mark.integration


def source_listing(train: str) -> tuple[list[str], list[list]]:
    """The classes and (path, class index) samples of ``train`` on disk, said without the reader's code."""
    classes = sorted(name for name in os.listdir(train) if os.path.isdir(os.path.join(train, name)))
    samples = []
    for k, cls in enumerate(classes):
        names = sorted(n for n in os.listdir(os.path.join(train, cls)) if n.endswith(".npy"))
        samples += [[f"{cls}/{n}", k] for n in names]
    return classes, samples


def test_an_imagefolder_listing_and_np_load_read_the_stores_arrays(redis_server, short_tmp):
    src, expected = os.path.join(short_tmp, "src"), os.path.join(short_tmp, "expected.json")
    doc = make_npy_dataset(src, files=36, file_bytes=12 << 10, classes=4, expected=expected)
    train = os.path.join(src, "train")
    # what the listing must skip: a file beside the class directories (is_dir from the snapshot's
    # d_type), a file of another extension in a class
    for junk in ("LICENSE.txt", f"{doc['classes'][1]}/notes.txt"):
        with open(os.path.join(train, junk), "w") as f:
            f.write("not a sample\n")
    for rel, want in doc["samples"].items():  # the expected digests are the source's arrays'
        assert digest(np.load(os.path.join(train, rel)).tobytes()) == want["xxh64"], rel
    url = redis_server.url("imagefolder/")
    put(src, StoreURL.parse(url), out=None)
    mnt = os.path.join(short_tmp, "mnt", "imagenet")
    cfg = store_config(short_tmp, mnt, url)
    out, report = os.path.join(short_tmp, "read.json"), os.path.join(short_tmp, "report.json")
    hits = redis_server.client().info("stats")["keyspace_hits"]
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", sys.executable, "-m",
                "support.imagefolder_reader", os.path.join(mnt, "train"), expected, "--epochs", "2",
                "--workers", "4", "--json", out, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr  # 1: an array differed, 2: the listing did
    got = json.load(open(out))
    classes, samples = source_listing(train)
    assert len(classes) == 4 and len(samples) == 36
    assert (got["classes"], got["samples"]) == (classes, samples)  # the order too: ImageFolder's indices
    assert [(e["samples"], e["mismatches"]) for e in got["epochs"]] == [(36, [])] * 2
    assert all(e["bytes"] == sum(os.path.getsize(os.path.join(train, rel)) for rel, _ in samples)
               for e in got["epochs"])
    assert not os.path.exists(mnt)
    # the store's own count: each value read once (the skipped .txt files too: read-ahead stages
    # every file), the manifest twice (the launcher's check, the snapshot)
    files = [os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs]
    assert redis_server.client().info("stats")["keyspace_hits"] - hits == len(files) + 2
    store = load(report)["store"]
    assert store["bytes_read"] == sum(map(os.path.getsize, files)) and store["refused_count"] == 0
