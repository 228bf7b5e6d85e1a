"""A bucket's namespace from its S3 Inventory report (``?inventory=``), against a real S3 server
(SeaweedFS) behind a counting proxy: the job lists nothing (the report's files are read once
each), reads every reported object's bytes, and sees the bucket as the report dates it: an
object written after the report is not there, one deleted since is refused, never served."""

import hashlib
import json
import os
import sys

from support.harness import load, monarch
from support.redisstore import store_config
from support.s3server import INVENTORY_BUCKET, boto3_client, gets_by_key, write_inventory
from test_s3 import BUCKET, loaded, s3, s3_env  # noqa: F401 (s3: the module's server)


READ = r"""
import hashlib, json, os, sys
mnt = sys.argv[1]
seen = {}
for d, _, files in os.walk(mnt):
    for name in files:
        p = os.path.join(d, name)
        try:
            with open(p, "rb") as f:
                seen[os.path.relpath(p, mnt)] = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            seen[os.path.relpath(p, mnt)] = e.strerror
print(json.dumps(seen))
"""


def test_a_bucket_read_from_its_inventory_lists_nothing_and_serves_what_the_report_holds(s3, short_tmp):  # noqa: F811
    src, data, url = loaded(s3, short_tmp, "inv/", files=30)
    odd = "class_0/a b+c%d.bin"  # a key S3's report writes URL-encoded
    data[odd] = b"odd key" * 100
    late = "class_1/late.bin"
    data[late] = b"written after the report" * 10
    c = boto3_client(s3.endpoint)
    for rel in (odd, late):
        c.put_object(Bucket=BUCKET, Key="inv/" + rel, Body=data[rel])
    inventory = write_inventory(s3.endpoint, BUCKET, "inv/", leave_out=late)
    gone = "class_2/sample_005.bin"
    c.delete_object(Bucket=BUCKET, Key="inv/" + gone)  # after the report: refused at its GET
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, f"{url}?inventory={inventory}", policy="on-access")
    report = os.path.join(short_tmp, "report.json")
    before = s3.proxy.counts()
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", sys.executable, "-c", READ, mnt,
                env=s3_env(s3), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = json.loads(r.stdout.splitlines()[-1])
    expected = {rel: hashlib.sha256(b).hexdigest() for rel, b in data.items() if rel != late}
    expected[gone] = "Input/output error"
    assert seen == expected
    after = s3.proxy.counts()
    lists = after["requests"].get(f"LIST /{BUCKET}", 0) - before["requests"].get(f"LIST /{BUCKET}", 0)
    assert lists == 2, after["requests"]  # the launcher's check and the daemon's: no listing for the snapshot
    report_gets = {k: n - gets_by_key(before, INVENTORY_BUCKET).get(k, 0)
                   for k, n in gets_by_key(after, INVENTORY_BUCKET).items()}
    # its data files once; its manifest.json also at each check (the launcher's, the daemon's)
    assert {k.rsplit("/", 1)[-1]: n for k, n in report_gets.items() if n} == \
        {"manifest.json": 3, "part-0.csv.gz": 1, "part-1.csv.gz": 1}, report_gets
    rep = load(report)
    assert rep["dataset"]["files"] == len(data) - 1
    assert rep["store"]["refused_count"] == 1


def test_a_report_of_another_format_or_bucket_says_how_to_fix_it(s3, short_tmp):  # noqa: F811
    _, _, url = loaded(s3, short_tmp, "bad/", files=3)
    c = boto3_client(s3.endpoint)
    for name, body, said in (
            ("orc.json", {"sourceBucket": BUCKET, "fileFormat": "ORC", "fileSchema": "", "files": []},
             "only CSV reports are read"),
            ("other.json", {"sourceBucket": "someone-else", "fileFormat": "CSV", "fileSchema": "Bucket, Key, Size",
                            "files": []}, "is of bucket someone-else")):
        c.put_object(Bucket=INVENTORY_BUCKET, Key=name, Body=json.dumps(body).encode())
        mnt = os.path.join(short_tmp, "mnt", "data")
        cfg = store_config(short_tmp, mnt, f"{url}?inventory=s3://{INVENTORY_BUCKET}/{name}")
        r = monarch("run", "--no-progress", "-c", cfg, "--", "true", env=s3_env(s3), timeout=120)
        assert r.returncode != 0 and said in r.stderr, r.stdout + r.stderr
