"""A bucket's namespace from its S3 Inventory report instead of a listing
(``s3://BUCKET/PREFIX?inventory=LOCATION``): a listing is a request per thousand keys (10,000
round trips for 10 million objects); the daily inventory holds the same keys, sizes and ETags in
a few compressed files.

``LOCATION`` is the report's ``manifest.json``: ``s3://DEST/KEY`` (read with the dataset's own
endpoint and credentials) or a local copy, whose data files are looked for beside it (by their
names). Only CSV reports are read (``fileFormat: CSV``; ORC and Parquet are refused with how to
fix it). A report is as old as its date: an object written since is not in the namespace, and
one rewritten or deleted since is refused at its GET as a listed one is (``If-Match`` its ETag),
never served stale.
"""

from __future__ import annotations

import csv
import datetime
import gzip
import io
import json
import logging
import os
import urllib.parse

from monarch.store.url import StoreError

log = logging.getLogger(__name__)

REQUIRED = ("Bucket", "Key", "Size")  # the columns a report must have; LastModifiedDate and ETag are used if there


def read(location: str, bucket: str, prefix: str, fetch) -> list[dict]:
    """The report's objects of ``bucket`` under ``prefix`` as a listing's metadata (``path``,
    ``size``, ``last_modified``, ``e_tag``: what ``S3Client`` screens); its date is logged.
    ``fetch(bucket, key)`` reads an object of the report's destination bucket (an s3:// LOCATION)."""
    manifest, schema = check(location, bucket, fetch)
    where = urllib.parse.urlsplit(location)
    dest = manifest.get("destinationBucket", "").rsplit(":", 1)[-1] or where.netloc
    metas: list[dict] = []
    for part in manifest["files"]:
        key = part["key"]
        if where.scheme == "s3":
            raw = _get(fetch, dest, key, location)
        else:
            beside = os.path.join(os.path.dirname(where.path), os.path.basename(key))
            try:
                with open(beside, "rb") as f:
                    raw = f.read()
            except OSError as e:
                raise StoreError(f"the inventory {location} names {key}, not found beside it ({beside}: "
                                 f"{e.strerror}); copy its data files next to the manifest.json") from None
        metas += _rows(raw, schema, bucket, prefix, key)
    log.info("s3://%s/%s from its inventory %s (%s): %d objects", bucket, prefix, location, _date(manifest), len(metas))
    return metas


def check(location: str, bucket: str, fetch) -> tuple[dict, list[str]]:
    """The report's manifest.json and its columns, if it is a CSV report of ``bucket`` with the
    columns needed (StoreError, one line saying how to fix it, otherwise): read at the start's
    check, before any job waits on it."""
    where = urllib.parse.urlsplit(location)
    if where.scheme == "s3":
        text = _get(fetch, where.netloc, where.path.lstrip("/"), location)
    elif where.scheme in ("", "file"):
        try:
            with open(where.path, "rb") as f:
                text = f.read()
        except OSError as e:
            raise StoreError(f"the inventory {location}: {e.strerror}; give its manifest.json") from None
    else:
        raise StoreError(f"the inventory {location}: give an s3://BUCKET/KEY of its manifest.json, or a local path")
    try:
        manifest = json.loads(text)
        schema = [c.strip() for c in manifest["fileSchema"].split(",")]
        keys = [part["key"] for part in manifest["files"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StoreError(f"the inventory {location} is not an S3 Inventory manifest.json (files, fileSchema)") from None
    if str(manifest.get("fileFormat", "CSV")).upper() != "CSV":
        raise StoreError(f"the inventory {location} is in {manifest.get('fileFormat')}: only CSV reports are read; "
                         f"set the inventory configuration's format to CSV")
    if manifest.get("sourceBucket", bucket) != bucket:
        raise StoreError(f"the inventory {location} is of bucket {manifest['sourceBucket']}, not {bucket}; "
                         f"give {bucket}'s report")
    if missing := [c for c in REQUIRED if c not in schema]:
        raise StoreError(f"the inventory {location} has no {missing[0]} column: add it to the report's fields")
    if not all(isinstance(k, str) for k in keys):
        raise StoreError(f"the inventory {location} is not an S3 Inventory manifest.json (a file without its key)")
    return manifest, schema


def _get(fetch, bucket: str, key: str, location: str) -> bytes:
    """An object of the report, or a StoreError that names it (not the dataset's bucket)."""
    try:
        return fetch(bucket, key)
    except StoreError:
        raise
    except Exception as e:  # the client's own errors: refused, unreachable
        raise StoreError(f"the inventory {location}: s3://{bucket}/{key} could not be read ({e}); check that "
                         f"these credentials may read the report's bucket") from None


def _rows(raw: bytes, schema: list[str], bucket: str, prefix: str, name: str) -> list[dict]:
    """One report file's current objects of ``bucket`` under ``prefix`` (keys URL-decoded)."""
    try:
        text = gzip.decompress(raw).decode("utf-8") if name.endswith(".gz") else raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise StoreError(f"the inventory's file {name} cannot be read ({type(e).__name__})") from None
    col = {c: i for i, c in enumerate(schema)}
    out = []
    for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if len(row) != len(schema):
            raise StoreError(f"the inventory's file {name}:{n}: {len(row)} fields, the schema has {len(schema)}")
        get = lambda c: row[col[c]] if c in col else ""  # noqa: E731
        if get("Bucket") != bucket or get("IsDeleteMarker").lower() == "true" or get("IsLatest").lower() == "false":
            continue
        key = urllib.parse.unquote_plus(get("Key"))
        if not key.startswith(prefix):
            continue
        etag = get("ETag")
        out.append({"path": key, "size": int(get("Size") or 0), "last_modified": _when(get("LastModifiedDate")),
                    "e_tag": f'"{etag}"' if etag and not etag.startswith('"') else etag})
    return out


def _when(text: str) -> datetime.datetime:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.datetime.fromtimestamp(0, datetime.timezone.utc)


def _date(manifest: dict) -> str:
    stamp = manifest.get("creationTimestamp")
    try:
        return datetime.datetime.fromtimestamp(int(stamp) / 1000, datetime.timezone.utc).isoformat(timespec="minutes")
    except (TypeError, ValueError):
        return "of unknown date"
