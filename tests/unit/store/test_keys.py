"""A store's odd keys (a bucket written by other tools, a manifest written by hand): each is
skipped and named, the rest served; no path of the snapshot leaves the root, and nothing is
created outside Monarch's directories."""

import datetime
import json
import os
import zlib

from monarch.records.filetable import FileTable
from monarch.store import keys
from monarch.store.manifest import DIGEST, FORMAT, Entry, Manifest, add_to_snapshot
from monarch.store.s3 import S3Client, S3URL

HOSTILE = {
    "../../x": "'..'",
    "a/../../x": "'..'",
    "./y": "'.'",
    "a//b": "empty segment",
    "/abs": "starts with '/'",
    "nul\0.bin": "NUL",
    "new\nline.bin": "newline",
    "long/" + "n" * 256: "longer than 255",
    ("d" * 200 + "/") * 21 + "f": "longer than 4095",
}


def test_a_key_that_cannot_be_a_path_says_why():
    for key, why in HOSTILE.items():
        assert why in (keys.why_not_a_path(key) or ""), key
    for key in ("ok.bin", "dir/inside.bin", "n" * 255, "a b/ü.bin", "..hidden", "x.."):
        assert keys.why_not_a_path(key) is None, key


def test_collisions_and_an_object_hidden_by_a_prefix_are_served_under_neither_name():
    kept, skipped = keys.screen(["ok.bin", "dup.bin", "dup.bin", "dir", "dir/inside.bin", "//double.bin",
                                 "double.bin"])
    assert kept == {"ok.bin", "dir/inside.bin", "double.bin"}  # the exact key is unambiguous, never normalised
    why = dict(skipped)
    assert why["dup.bin"] == "listed 2 times"
    assert why["dir"].startswith("both an object and a prefix")
    assert "empty segment" in why["//double.bin"]
    line = keys.summary(skipped)
    assert line.startswith("3 objects not served as files: ") and "'//double.bin'" in line


def _snapshot(manifest, tmp_path):
    mount = str(tmp_path / "mnt" / "data")
    files, dirs = FileTable(), {}
    names = add_to_snapshot(0, manifest, mount, files, dirs)
    return names, files, dirs


def _inside(dirs, files):
    """Every path of the snapshot, as the shim joins it to the mount: none leaves the root."""
    for key in list(files) + list(dirs):
        rel = key.partition("/")[2]
        assert keys.why_not_a_path(rel) is None or rel == "", key
        assert not os.path.normpath(os.path.join("/mnt/data", rel)).startswith("/mnt/data/..")


def test_a_hand_written_manifest_with_hostile_paths_is_served_without_them(tmp_path):
    entries = [[k, 3, 1, "d"] for k in HOSTILE] + [["ok.bin", 3, 1, "d"], ["dup", 1, 1, "d"], ["dup", 2, 1, "d"],
                                                  ["dir", 1, 1, "d"], ["dir/inside.bin", 1, 1, "d"]]
    doc = {"format": FORMAT, "digest": DIGEST, "files": entries, "dirs": ["../up", "ok-dir"]}
    manifest = Manifest.decode(zlib.compress(json.dumps(doc).encode()))
    assert sorted(e.path for e in manifest.files) == ["dir/inside.bin", "ok.bin"]
    assert manifest.dirs == ("ok-dir",)
    assert {k for k, _ in manifest.skipped} == set(HOSTILE) | {"dup", "dir"}
    before = set(os.listdir(tmp_path))
    names, files, dirs = _snapshot(manifest, tmp_path)
    assert sorted(names) == ["0/dir/inside.bin", "0/ok.bin"]
    _inside(dirs, files)
    assert set(os.listdir(tmp_path)) == before  # the snapshot creates nothing


def test_the_snapshot_code_itself_never_takes_a_path_outside_the_root(tmp_path):
    """A manifest made in code (no decode's screening): add_to_snapshot still skips them."""
    manifest = Manifest(tuple(Entry(k, 3, 1, "d") for k in list(HOSTILE) + ["ok.bin"]), ("../../up",))
    names, files, dirs = _snapshot(manifest, tmp_path)
    assert names == ["0/ok.bin"]
    _inside(dirs, files)
    assert not os.path.exists(tmp_path.parent / "x") and not os.path.exists(tmp_path / "x")


class _Listing(S3Client):
    """An S3 client whose listing is given (as a server that accepts any key would answer)."""

    def __init__(self, listed):
        import threading
        self.url, self.listed, self._lock, self._given = S3URL.parse("s3://acc-hostile/train/"), {}, threading.Lock(), listed

    def _list(self):
        when = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
        return [{"path": "train/" + k.rstrip("/"), "size": 0, "last_modified": when, "e_tag": '""'}
                if k == "marker/" else  # as obstore's flat listing gives a console's folder: no '/'
                {"path": "train/" + k, "size": 0 if k.endswith("/") else 4, "last_modified": when, "e_tag": f'"{k!r}"'}
                for k in self._given], set()


def test_a_bucket_listing_with_hostile_keys_is_served_without_them(tmp_path):
    listed = list(HOSTILE) + ["ok.bin", "dir", "dir/inside.bin", "//double.bin", "double.bin", "folder/",
                              "marker/", "marker/in.bin"]
    manifest = _Listing(listed).manifest()
    assert sorted(e.path for e in manifest.files) == ["dir/inside.bin", "double.bin", "marker/in.bin", "ok.bin"]
    assert "folder" in manifest.dirs and "marker" in manifest.dirs  # a console's folders, not skipped
    assert {k for k, _ in manifest.skipped} == set(HOSTILE) | {"dir", "//double.bin"}
    names, files, dirs = _snapshot(manifest, tmp_path)
    _inside(dirs, files)


def test_a_listing_the_client_cannot_parse_is_not_unreachable():
    from monarch.store.s3 import S3Unreachable, _classify, explain
    parse = RuntimeError('Generic S3 error: Encountered object with invalid path: Error parsing Path "train/new\nline.bin"')
    e = _classify(parse, "listing")
    assert not isinstance(e, S3Unreachable) and e.code == "UnparsableKey" and "train/new\\nline.bin" in str(e)
    url = S3URL.parse("s3://acc-hostile/train/")
    assert "unreachable" not in explain(url, e)
    down = _classify(RuntimeError("Generic S3 error: error sending request: kind: ConnectionRefused"), "listing")
    assert isinstance(down, S3Unreachable) and "is unreachable" in explain(url, down)
