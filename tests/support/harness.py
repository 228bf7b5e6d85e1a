"""Test harness shared by the integration and MPI tests: configurations, and ``monarch``
run as a real process from this checkout."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])


# The configurations tests write keep no filesystem reserve (``filesystem_reserve: 0``): their tiers
# live in /tmp and /dev/shm, and a reserve of a share of the host's filesystem would stop them on a
# host whose disk is more than 75% full. The tests of the reserve itself set one where the host's
# disk cannot change what they see: on a small tmpfs of their own, on a filesystem whose size and
# free space the test gives, or larger than any filesystem.
NO_RESERVE = "filesystem_reserve: 0\n"


def write_config(base, roots, ram="1GiB", ssd="1GiB", policy="on-access", keep=False, extra="", dirs=True, share=False,
                 reserve="0"):
    """A configuration in ``base`` (``share``: staging.share; off, the job stages privately, as the
    tests of everything but sharing expect). ``dirs=False`` leaves the run's directories and tiers to the
    shipped defaults, which separate runs by their identity (set TMPDIR and MONARCH_SSD). ``reserve``:
    its ``filesystem_reserve`` (by default none, as NO_RESERVE), or None: the shipped default's."""
    path = os.path.join(base, "monarch.yaml")
    roots_yaml = ", ".join(json.dumps(r) for r in ([roots] if isinstance(roots, str) else roots))
    places = f"""run_base: "{base}/run${{MONARCH_NODE}}"
tiers:
  - {{name: ram, path: "/dev/shm{base}/ram${{MONARCH_NODE}}", capacity: {ram}, keep: {str(keep).lower()}}}
  - {{name: ssd, path: "{base}/ssd${{MONARCH_NODE}}", capacity: {ssd}, keep: {str(keep).lower()}}}
peer: {{path: "{base}/peer${{MONARCH_NODE}}", capacity: 1GiB, timeout: 5}}
"""
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: [{roots_yaml}]}}
{places if dirs else ""}staging: {{policy: {policy}, threads: 2, share: {str(share).lower()}}}
{"" if reserve is None else f"filesystem_reserve: {reserve}"}
{extra}""")
    if dirs:
        make_bases(path, nodes=TEST_NODES)
    return path


TEST_NODES = 4  # the most nodes a test's configuration serves (its bases are made for each)


def with_manifest(cfg: str, root: str, manifest: str) -> str:
    """``cfg`` (write_config's, of the one root ``root``) given ``manifest`` as its dataset.manifest."""
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text.replace(f"dataset: {{roots: [{json.dumps(root)}]}}",
                             f"dataset: {{roots: [{json.dumps(root)}], manifest: {json.dumps(manifest)}}}", 1))
    return cfg


def make_bases(config_file, nodes: int = 1) -> None:
    """Make the base directories a configuration names, as its user would (Monarch makes
    only its own monarch-<uid> inside an existing base), for nodes 0..nodes-1."""
    from monarch.config import load_config
    for node in range(nodes):
        env = {"MONARCH_DATASET": "/", **os.environ, "MONARCH_NODE": str(node)}  # roots unchecked: any will do
        config = load_config(str(config_file), env=env, check_roots=False)
        for _, base in config.bases():
            if not os.path.lexists(base):  # a file or symlink there is the test's own doing
                os.makedirs(base)


SHARD_SPLIT = (16, 8, 4)  # ram : ssd : peer area of each node's storage, as measured by the users


def write_cluster_config(base: str, root: str, name: str, nodes: int, storage: str) -> str:
    """``base``/``name``: the dataset ``root``, each node's run base, its ``storage`` (tiers and
    peer lines), read-ahead staging, no filesystem reserve; the bases made here for nodes 0..nodes-1."""
    path = os.path.join(base, name)
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{base}/run${{MONARCH_NODE}}"
{storage}staging: {{policy: read-ahead}}
{NO_RESERVE}""")
    make_bases(path, nodes=nodes)
    return path


def sharded_config(base: str, root: str, node_bytes: int, nodes: int, name: str = "cluster.yaml",
                   floor: int = 0, replicas: int = 1, fetch_ahead: bool = True, peer_in_ram: bool = False) -> str:
    """One config for every simulated node of a cluster on this host: each node's storage,
    ``node_bytes`` split ram:ssd:peer as SHARD_SPLIT (each at least ``floor``), in bases of its
    own told apart by ${MONARCH_NODE} and made here for nodes 0..nodes-1; ``peer.replicas`` and
    ``peer.fetch_ahead``; the peer area beside the ssd tier, or (``peer_in_ram``) in /dev/shm."""
    ram, ssd, peer = (max(floor, node_bytes * s // sum(SHARD_SPLIT)) for s in SHARD_SPLIT)
    peer_base = f"/dev/shm{base}" if peer_in_ram else base
    return write_cluster_config(base, root, name, nodes, f"""tiers:
  - {{name: ram, path: "/dev/shm{base}/ram${{MONARCH_NODE}}", capacity: {ram}}}
  - {{name: ssd, path: "{base}/ssd${{MONARCH_NODE}}", capacity: {ssd}}}
peer: {{path: "{peer_base}/peer${{MONARCH_NODE}}", capacity: {peer}, timeout: 10, replicas: {replicas},
        fetch_ahead: {'true' if fetch_ahead else 'false'}}}
""")


def ram_peer_config(base: str, root: str, tier: int, area: int, nodes: int, name: str) -> str:
    """One config for every simulated node of a cluster on this host, all in /dev/shm: a RAM
    tier of ``tier`` bytes and a peer area of ``area`` (bench_peer's layout: less than the
    dataset in all, so the nodes shard it), made here for nodes 0..nodes-1."""
    return write_cluster_config(base, root, name, nodes, f"""tiers:
  - {{name: ram, path: "/dev/shm{base}/ram${{MONARCH_NODE}}", capacity: {tier}}}
peer: {{path: "/dev/shm{base}/peer${{MONARCH_NODE}}", capacity: {area}, timeout: 10}}
""")


def monarch_env(**extra):
    env = dict(os.environ)
    # monarch from this checkout, and the test support (support.shard_reader and kin) beside it
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "tests"), env.get("PYTHONPATH", "")])
    env.pop("MONARCH_DISABLE", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def monarch(*args, env=None, timeout=180, **kw):
    """Run ``python -m monarch ARGS`` from this checkout."""
    return subprocess.run([sys.executable, "-m", "monarch", *args], env=env or monarch_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


SEEN = r"""
import hashlib, json, os, sys
root, files, dirs = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
out = {}
for rel in files:
    p = os.path.join(root, rel)
    try:
        with open(p, "rb") as f:
            out[rel] = [os.stat(p).st_size, hashlib.sha256(f.read()).hexdigest()]
    except FileNotFoundError:
        out[rel] = "ENOENT"
for d in dirs:
    out[d] = sorted(os.listdir(os.path.join(root, d)))
print(json.dumps(out))
"""


def seen_as_directly(cfg: str, root: str, files: list[str], dirs: list[str]) -> dict:
    """What a reader under ``monarch run -c cfg`` sees of ``files`` (size and digest, or ENOENT)
    and of ``dirs``' listings (``root``-relative), asserted to be what a direct reader sees; the
    run's report."""
    report = os.path.join(os.path.dirname(cfg), "seen-report.json")
    args = (sys.executable, "-c", SEEN, root, ",".join(files), ",".join(dirs))
    ran = monarch("run", "-c", cfg, "--no-progress", "--report", report, "--", *args)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    direct = subprocess.run(args, capture_output=True, text=True, check=True)
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == json.loads(direct.stdout)
    with open(report) as f:
        return json.load(f)


def start_group(cmd, env=None, cwd=None):
    """Start ``cmd`` in its own session (text output piped); end it with :func:`finish_group`."""
    return subprocess.Popen(cmd, env=env or monarch_env(), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish_group(proc, timeout=180):
    """Wait for ``proc``; on timeout kill its whole group (mpiexec, its ranks, a daemon) and fail
    with what it printed. Returns a CompletedProcess."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(map(str, proc.args))} hung for {timeout} s\n{out}\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_group(cmd, env=None, timeout=180, cwd=None):
    """:func:`start_group` then :func:`finish_group`."""
    return finish_group(start_group(cmd, env, cwd), timeout)


def reader(ds, epochs=3, workers=4, reader_kind="python", compute_ms=0):
    return [sys.executable, "-m", "monarch.tools.workload", "read", ds.root, "--epochs", str(epochs),
            "--workers", str(workers), "--manifest", ds.manifest, "--reader", reader_kind,
            "--compute-ms", str(compute_ms)]


def load(path):
    with open(path) as f:
        return json.load(f)


def run_dirs(base, node=0):
    """The run directories of a config written by write_config(base): <run base>/monarch-<uid>/<run>-node<N>."""
    import glob
    return sorted(glob.glob(os.path.join(base, f"run{node}", f"monarch-{os.getuid()}", f"*-node{node}")))


def write_tier_config(base, root, run_base, ram_base, ssd_base, name="c.yaml", make=True):
    """A configuration with explicit run and tier base directories (write_config derives them), no
    filesystem reserve; ``make``: make the bases that are missing."""
    path = os.path.join(base, name)
    with open(path, "w") as f:
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{run_base}"
tiers:
  - {{name: ram, path: "{ram_base}", capacity: 1GiB}}
  - {{name: ssd, path: "{ssd_base}", capacity: 1GiB}}
staging: {{share: false}}
{NO_RESERVE}""")
    if make:
        make_bases(path)
    return path


class CountingTally:
    """A source's ``Tally`` (monarch/node/stage/sources.py) that counts files opened and bytes read
    (thread-safe: a large file's ranges are read by several threads)."""

    def __init__(self):
        self.files = self.bytes = 0
        self._lock = threading.Lock()

    def opened(self):
        with self._lock:
            self.files += 1

    def read(self, n):
        with self._lock:
            self.bytes += n


def unix_connect(path: str, timeout: float = 10.0):
    """A client socket connected to the Unix socket at ``path`` (a daemon's)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


@contextmanager
def door_on_socket(path: str, roots: list[str], tier_dirs: dict[int, str], copy_slot: int, workers: int = 1):
    """A front door alone on a Unix socket at ``path`` (no daemon: the test holds its tables,
    leases and lane itself); stopped, and its listener closed, on leaving."""
    from monarch import frontdoor
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    door = frontdoor.FrontDoor(listener.fileno(), roots, tier_dirs, copy_slot, workers)
    try:
        yield door
    finally:
        door.stop()
        listener.close()


def resolve(daemon, key: str) -> tuple[int, str]:
    """Where the shim would open ``key`` (the resolver's asynchronous answer, waited for as the
    server does, within ``staging.resolve_timeout``): ``(slot, path)``, ``(ANSWER_FD | slot, fd)``
    for an inflated copy (the caller owns the fd), or PFS; counted like the server's."""
    import concurrent.futures
    import threading
    from monarch import protocol
    from monarch.node.resolver import PFS
    done: concurrent.futures.Future = concurrent.futures.Future()
    gate = threading.Lock()

    def finish(answer, outcome):
        with gate:
            if done.cancelled():  # given up on: a descriptor nobody will take is closed
                if answer[0] & protocol.ANSWER_FD:
                    os.close(answer[1])
                return
            done.set_result((answer, outcome))

    daemon.resolver.resolve_async(key, finish)
    try:
        answer, outcome = done.result(timeout=daemon.config.staging.resolve_timeout)
    except concurrent.futures.TimeoutError:
        with gate:
            if done.cancel():
                answer, outcome = PFS, "pfs:timeout"
            else:
                answer, outcome = done.result()
    daemon.count(outcome)
    return answer
