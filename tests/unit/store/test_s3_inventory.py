"""An S3 Inventory report read as a bucket's listing (s3_inventory.py), from a local copy: the
current objects of the bucket under the prefix, keys URL-decoded; a report of no use refused
with what to do."""

import gzip
import json

import pytest

from monarch.store import s3_inventory
from monarch.store.url import StoreError

SCHEMA = "Bucket, Key, VersionId, IsLatest, IsDeleteMarker, Size, LastModifiedDate, ETag"


def report(tmp_path, rows, **manifest) -> str:
    body = "".join(",".join(f'"{v}"' for v in row) + "\n" for row in rows)
    (tmp_path / "part-0.csv.gz").write_bytes(gzip.compress(body.encode()))
    doc = {"sourceBucket": "ds", "destinationBucket": "arn:aws:s3:::inv", "fileFormat": "CSV", "fileSchema": SCHEMA,
           "creationTimestamp": "1795737600000", "files": [{"key": "ds/cfg/data/part-0.csv.gz"}]} | manifest
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    return str(tmp_path / "manifest.json")


def no_fetch(bucket, key):
    raise AssertionError("a local report reads nothing from S3")


def test_the_current_objects_under_the_prefix_keys_decoded(tmp_path):
    at = report(tmp_path, [
        ("ds", "train/a+b%2Bc.jpg", "v2", "true", "false", "10", "2026-11-25T10:00:00.000Z", "e1"),
        ("ds", "train/old.jpg", "v1", "false", "false", "5", "2026-11-20T10:00:00.000Z", "e0"),  # not the latest
        ("ds", "train/removed.jpg", "v3", "true", "true", "", "2026-11-25T10:00:00.000Z", ""),   # a delete marker
        ("ds", "val/x.jpg", "", "true", "false", "7", "2026-11-25T10:00:00.000Z", "e2"),         # another prefix
        ("other", "train/y.jpg", "", "true", "false", "7", "2026-11-25T10:00:00.000Z", "e3")])   # another bucket
    metas = s3_inventory.read(at, "ds", "train/", no_fetch)
    assert [(m["path"], m["size"], m["e_tag"]) for m in metas] == [("train/a b+c.jpg", 10, '"e1"')]
    assert metas[0]["last_modified"].isoformat() == "2026-11-25T10:00:00+00:00"


@pytest.mark.parametrize("manifest, said", [
    ({"fileFormat": "Parquet"}, "only CSV reports are read"),
    ({"sourceBucket": "theirs"}, "is of bucket theirs, not ds"),
    ({"fileSchema": "Bucket, Size"}, "has no Key column"),
    ({"files": "nope"}, "not an S3 Inventory manifest.json"),
    ({"files": [{"key": "ds/cfg/data/missing.csv.gz"}]}, "not found beside it"),
])
def test_a_report_of_no_use_says_how_to_fix_it(tmp_path, manifest, said):
    at = report(tmp_path, [], **manifest)
    with pytest.raises(StoreError) as e:
        s3_inventory.read(at, "ds", "", no_fetch)
    assert said in str(e.value), str(e.value)


def test_a_row_that_does_not_fit_the_schema_is_named(tmp_path):
    at = report(tmp_path, [("ds", "a.jpg", "10")])
    with pytest.raises(StoreError, match=r"part-0.csv.gz:1: 3 fields, the schema has 8"):
        s3_inventory.read(at, "ds", "", no_fetch)


def test_a_report_that_cannot_be_read_is_named_not_the_datasets_bucket():
    def refused(bucket, key):
        raise PermissionError("403 AccessDenied")
    with pytest.raises(StoreError) as e:
        s3_inventory.read("s3://inv/ds/daily/manifest.json", "ds", "", refused)
    assert "the inventory s3://inv/ds/daily/manifest.json: s3://inv/ds/daily/manifest.json could not be read " \
           "(403 AccessDenied)" in str(e.value), str(e.value)
