"""Loading a dataset into a store and listing it (``monarch store put``, ``monarch store ls``),
the store's URL and credentials: against a real redis-server on a private socket."""

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from monarch.store.load import fetch_manifest, put
from monarch.store.manifest import MANIFEST, PROGRESS, Manifest
from monarch.store.url import StoreError, StoreURL
from support.harness import monarch, monarch_env


def tree(root, files=40, size=3000, seed=0):
    """A small dataset: files in nested directories, an empty directory, odd names."""
    import random
    rng = random.Random(seed)
    out = {}
    for i in range(files):
        rel = f"class_{i % 4}/sub_{i % 2}/sample {i:03d}.bin" if i % 5 else f"top_{i}.bin"
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = rng.randbytes(size + i)
        with open(path, "wb") as f:
            f.write(data)
        out[rel] = data
    os.makedirs(os.path.join(root, "empty", "deeper"))
    return out


def test_put_then_ls_lists_every_file_with_its_size_and_digest(redis_server, tmp_path):
    data = tree(tmp_path / "ds")
    url = redis_server.url("putls/")
    r = monarch("store", "put", str(tmp_path / "ds"), url)
    assert r.returncode == 0, r.stderr
    assert f"store put: {len(data)} files, {sum(map(len, data.values()))} bytes" in r.stdout
    assert f"put: [{'#' * 30}] {len(data)}/{len(data)} files" in r.stderr  # the progress bar's last state
    assert f"({len(data)} loaded now, 0 by an earlier put)" in r.stdout
    r = monarch("store", "ls", "-l", url)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    listed = {line.split(None, 2)[2]: line for line in lines[:-1]}
    assert set(listed) == set(data)
    for rel, b in data.items():
        size, digest, _ = listed[rel].split(None, 2)
        assert int(size) == len(b) and digest == hashlib.blake2b(b, digest_size=16).hexdigest()
    assert lines[-1].startswith(f"{len(data)} files, ") and "manifest " in lines[-1]
    # the values are the files' bytes, one key per file under the prefix
    client = redis_server.client()
    for rel, b in data.items():
        assert client.get(f"putls/{rel}".encode()) == b
    manifest = Manifest.decode(client.get(b"putls/" + MANIFEST.encode()))
    assert "empty/deeper" in manifest.dirs and client.hlen(b"putls/" + PROGRESS.encode()) == 0


def test_an_interrupted_put_serves_nothing_then_resumes_where_it_stopped(redis_server, tmp_path):
    src = tmp_path / "many"
    for i in range(3000):
        d = src / f"d{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_bytes(os.urandom(512) + i.to_bytes(4, "little"))
    url = redis_server.url("resume/")
    client = redis_server.client()
    proc = subprocess.Popen([sys.executable, "-m", "monarch", "store", "put", "-j", "1", "--no-progress", str(src),
                             url], env=monarch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while client.hlen(b"resume/" + PROGRESS.encode()) < 50:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    loaded = client.hlen(b"resume/" + PROGRESS.encode())
    assert 50 <= loaded < 3000 and client.get(b"resume/" + MANIFEST.encode()) is None
    r = monarch("store", "ls", url)  # a half-loaded dataset is never served
    assert r.returncode == 2 and "has no manifest yet: a put loaded" in r.stderr and "again to finish" in r.stderr
    r = monarch("store", "put", "--no-progress", str(src), url)
    assert r.returncode == 0, r.stderr
    again = int(r.stdout.split("(")[1].split(" loaded now")[0])
    assert again == 3000 - loaded and f"{loaded} by an earlier put" in r.stdout
    manifest = fetch_manifest(client, StoreURL.parse(url))
    assert len(manifest.files) == 3000
    for e in manifest.files[::97]:
        value = client.get(f"resume/{e.path}".encode())
        assert value == (src / e.path).read_bytes() and hashlib.blake2b(value, digest_size=16).hexdigest() == e.digest


def test_a_put_of_changed_files_loads_only_them(redis_server, tmp_path):
    data = tree(tmp_path / "ds", files=10)
    url = StoreURL.parse(redis_server.url("changed/"))
    put(str(tmp_path / "ds"), url, out=None)
    # a put interrupted before its manifest (progress kept), then one file changed
    client = redis_server.client()
    m = fetch_manifest(client, url)
    client.delete(b"changed/" + MANIFEST.encode())
    client.hset(b"changed/" + PROGRESS.encode(), mapping={e.path.encode(): f"{e.size} {e.mtime_ns} {e.digest}"
                                                          for e in m.files})
    changed = next(iter(data))
    (tmp_path / "ds" / changed).write_bytes(b"new bytes")
    manifest, loaded = put(str(tmp_path / "ds"), url, out=None)
    assert loaded == 1
    assert client.get(f"changed/{changed}".encode()) == b"new bytes"
    assert {e.path: e.size for e in manifest.files}[changed] == len(b"new bytes")


def test_ls_of_an_empty_prefix_says_how_to_load_one(redis_server):
    r = monarch("store", "ls", redis_server.url("nothing-here/"))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "holds no Monarch dataset" in r.stderr and "monarch store put" in r.stderr


def test_an_unreachable_store_is_one_line_naming_the_url(tmp_path):
    url = f"unix://{tmp_path}/none.sock?prefix=x/&timeout=1"
    r = monarch("store", "ls", url)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"the store at {url} is unreachable" in r.stderr and "Traceback" not in r.stderr


def test_a_password_never_comes_from_the_url_nor_is_printed(fresh_redis, tmp_path):
    server = fresh_redis(password="s3cret-pw")
    with pytest.raises(StoreError) as e:
        StoreURL.parse("redis://user:s3cret-pw@localhost:6379/0?prefix=a/")
    assert "s3cret-pw" not in str(e.value) and "MONARCH_STORE_PASSWORD" in str(e.value)
    data = tree(tmp_path / "ds", files=5)
    url = server.url("pw/")
    r = monarch("store", "put", str(tmp_path / "ds"), url)
    assert r.returncode == 2 and "needs a password" in r.stderr
    r = monarch("store", "put", str(tmp_path / "ds"), url, env=monarch_env(MONARCH_STORE_PASSWORD="wrong"))
    assert r.returncode == 2 and "refused the password" in r.stderr and "wrong" not in r.stderr.replace(
        "WRONGPASS", "")
    r = monarch("store", "put", str(tmp_path / "ds"), url, env=monarch_env(MONARCH_STORE_PASSWORD="s3cret-pw"))
    assert r.returncode == 0 and f"{len(data)} files" in r.stdout and "s3cret-pw" not in r.stdout + r.stderr
    # from a file: only one readable by this user alone
    pw = tmp_path / "pw"
    pw.write_text("s3cret-pw\n")
    pw.chmod(0o644)
    r = monarch("store", "ls", url + f"&password_file={pw}")
    assert r.returncode == 2 and "no one else can read" in r.stderr and "s3cret-pw" not in r.stderr
    pw.chmod(0o600)
    r = monarch("store", "ls", url + f"&password_file={pw}")
    assert r.returncode == 0 and f"{len(data)} files" in r.stdout


def test_tls_with_a_private_certificate_authority(tmp_path):
    """rediss://: the server's certificate is checked (a URL without the CA that signed it is
    refused in one line), and with ?ca_file= the dataset loads and lists over TLS."""
    import shutil
    from support.redisstore import RedisServer
    if not shutil.which("openssl") or not shutil.which("redis-server"):
        pytest.skip("needs openssl and redis-server")
    d = str(tmp_path)

    def ssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)
    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=monarch-test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    (tmp_path / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
        "-extfile", "ext", "-out", "server.pem")
    import socket as _socket
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = RedisServer(d, tls=(port, f"{d}/server.pem", f"{d}/server.key", f"{d}/ca.pem"))
    try:
        data = tree(tmp_path / "ds", files=6)
        url = f"rediss://127.0.0.1:{port}/0?prefix=tls/&timeout=5"
        r = monarch("store", "ls", url)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "certificate" in r.stderr.lower()
        r = monarch("store", "put", "--no-progress", str(tmp_path / "ds"), url + f"&ca_file={d}/ca.pem")
        assert r.returncode == 0, r.stderr
        r = monarch("store", "ls", url + f"&ca_file={d}/ca.pem")
        assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith(f"{len(data)} files")
    finally:
        server.stop()


def test_check_config_checks_the_store_here(redis_server, tmp_path):
    """monarch check-config of a configuration with a store: the store answers and holds a
    manifest (its files and version shown), else exit 2 naming the URL."""
    data = tree(tmp_path / "ds", files=7)
    url = redis_server.url("cc/")
    put(str(tmp_path / "ds"), StoreURL.parse(url), out=None)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f'dataset: {{roots: ["/no/such/mount"], stores: {{"/no/such/mount": "{url}"}}}}\n')
    r = monarch("check-config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert f"  store   : /no/such/mount <- {url}: {len(data)} files, " in r.stdout
    cfg.write_text(f'dataset: {{roots: ["/no/such/mount"], stores: {{"/no/such/mount": "{url}x"}}}}\n')
    r = monarch("check-config", str(cfg))
    assert r.returncode == 2 and f"dataset.stores: /no/such/mount: the store at {url}x holds no Monarch dataset" \
        in r.stderr
