"""A real redis-server on a private Unix socket (no mock) for the store's tests and benchmark,
and a configuration that mounts a store."""

import os
import signal
import subprocess
import time

from support.harness import NO_RESERVE


class RedisServer:
    """``redis-server`` on ``<dir>/redis.sock`` (0700 directory), no TCP, no persistence."""

    def __init__(self, directory: str, password: str | None = None, tls: tuple | None = None):
        """``tls``: (port, certificate, key, CA) for a TLS listener on loopback instead of the socket."""
        self.dir, self.password, self.tls = directory, password, tls
        self.sock = os.path.join(directory, "redis.sock")
        self.proc = None
        self.start()

    def start(self) -> None:
        args = ["redis-server", "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "log")]
        if self.password:
            args += ["--requirepass", self.password]
        if self.tls:
            port, cert, key, ca = self.tls
            args += ["--tls-port", str(port), "--bind", "127.0.0.1", "--tls-cert-file", cert, "--tls-key-file", key,
                     "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except _redis().AuthenticationError:
                return
            except _redis().ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start: {open(os.path.join(self.dir, 'log')).read()}")
                time.sleep(0.02)

    def client(self):
        if self.tls:
            return _redis().Redis(host="127.0.0.1", port=self.tls[0], ssl=True, ssl_ca_certs=self.tls[3],
                                  password=self.password)
        return _redis().Redis(unix_socket_path=self.sock, password=self.password)

    def url(self, prefix: str = "ds/", **params) -> str:
        query = "&".join([f"prefix={prefix}"] + [f"{k}={v}" for k, v in params.items()])
        return f"unix://{self.sock}?{query}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def _redis():
    import redis
    return redis


def store_config(base: str, mount: str, url: str, policy: str = "read-ahead", extra: str = "") -> str:
    """A configuration mounting the store at ``url`` on ``mount`` (which does not exist on disk), no
    filesystem reserve."""
    path = os.path.join(base, "store.yaml")
    with open(path, "w") as f:
        f.write(f"""dataset:
  roots: ["{mount}"]
  stores: {{"{mount}": "{url}"}}
run_base: "{base}/run"
tiers:
  - {{name: ram, path: "/dev/shm{base}/ram", capacity: 1GiB}}
  - {{name: ssd, path: "{base}/ssd", capacity: 1GiB}}
staging: {{policy: {policy}}}
{NO_RESERVE}{extra}""")
    for d in (f"{base}/run", f"/dev/shm{base}/ram", f"{base}/ssd"):
        os.makedirs(d, exist_ok=True)
    return path


# -- the benchmark's naive loader: one GET per file, when the reader needs it --------------------
_client = None


def naive_get(path: str):
    """A ``monarch.tools.workload`` plug-in reader (``support.redisstore:naive_get``) that GETs each file
    from the store when it is read: the key is the path under ``BENCH_STORE_ROOT`` behind
    ``BENCH_STORE_PREFIX``, the store at ``BENCH_STORE_HOST``:``BENCH_STORE_PORT``. One client per
    (forked) worker process."""
    global _client
    if _client is None or _client[0] != os.getpid():
        r = _redis().Redis(host=os.environ["BENCH_STORE_HOST"], port=int(os.environ["BENCH_STORE_PORT"]))
        _client = (os.getpid(), r)
    rel = os.path.relpath(path, os.environ["BENCH_STORE_ROOT"])
    return _client[1].get(os.environ.get("BENCH_STORE_PREFIX", "") + rel), "store"
