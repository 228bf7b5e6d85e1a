"""A Redis-protocol store's manifest written by hand or by another tool, with paths no file can
have ('..', '//', a newline, one path twice, a file that is also a directory), read under
``monarch run``: the run starts, the plain files are read right, the others are skipped and
named at start and in the report, and nothing is created outside Monarch's directories."""

import json
import os
import zlib

from support.harness import load
from test_store_run import check_all, loaded

from monarch.store.manifest import MANIFEST

HOSTILE = ["../../x", "a//b", "new\nline.bin", "dup.bin", "dup.bin", "class_0"]


def test_a_hand_written_manifest_with_odd_paths_serves_the_rest_and_names_them(redis_server, short_tmp):
    src, data, url = loaded(redis_server, short_tmp, "hand/", files=8)
    client = redis_server.client()
    doc = json.loads(zlib.decompress(client.get(b"hand/" + MANIFEST.encode())))
    for path in HOSTILE:
        doc["files"].append([path, 3, 1, "00" * 16])
        client.set(b"hand/" + path.encode(), b"bad")
    client.set(b"hand/" + MANIFEST.encode(), zlib.compress(json.dumps(doc).encode()))
    outside = {p: set(os.listdir(p)) for p in (os.path.dirname(short_tmp), short_tmp)}
    mnt, cfg, report, result, stderr = check_all(short_tmp, src, url)
    assert result == {rel: "ok" for rel in data}
    assert f"monarch: store: {mnt}: 5 objects not served as files: " in stderr, stderr
    assert "'../../x': holds a '..' segment" in stderr and "'dup.bin': listed 2 times" in stderr
    store = load(report)["store"]
    assert store["skipped_count"] == {mnt: 5}
    assert sorted(k for k, _ in store["skipped"][mnt]) == sorted(set(HOSTILE))
    # /tmp is every process's: what is new there is checked for the names the keys could make
    new_in_tmp = set(os.listdir(os.path.dirname(short_tmp))) - outside[os.path.dirname(short_tmp)]
    names = {part for p in HOSTILE for part in p.split("/")} - {"", ".."}
    assert not new_in_tmp & names, new_in_tmp & names
    # the run's own directories (the configuration's bases), its configuration and report; no 'x'
    assert set(os.listdir(short_tmp)) - outside[short_tmp] <= {"report.json", "store.yaml", "run", "ssd"}
    assert not os.path.exists(mnt)
