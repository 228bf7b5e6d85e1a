"""The cluster end to end: `monarch serve` under mpiexec (each rank its own node, own tiers and
socket), a reader attached to every node with `monarch run`, the PFS counted by the emulated
PFS itself."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from support.harness import NO_RESERVE, load, monarch, monarch_env, reader, write_config, make_bases
from monarch.tools.workload import make_dataset

pytestmark = pytest.mark.mpi


def mpiexec():
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if not found:
        pytest.skip("mpiexec not available")
    return found


class DaemonCluster:
    """`mpiexec ... -n N monarch serve` for one test, always torn down: Open MPI with ULFM when
    installed, else MPICH's `-disable-auto-cleanup` (monarch.cluster.world.daemon_launch). The
    job's daemon processes, seen from outside (``monarch.cluster.Cluster`` is one daemon's peer layer)."""

    def __init__(self, nodes, cfg, base, verbose=()):
        from monarch.cluster.world import daemon_launch
        mpiexec()  # skip without MPI
        self.nodes, self.cfg, self.base = nodes, cfg, base
        self.launch = daemon_launch(nodes, one_host=True)
        self.proc = subprocess.Popen([*self.launch.argv, sys.executable, "-m", "monarch", *verbose, "serve", "-c", cfg],
                                     env=monarch_env(**self.launch.env), start_new_session=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while not all(os.path.exists(self.socket(k)) for k in range(nodes)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the cluster did not come up:\n{self.proc.stdout.read()}")
            time.sleep(0.1)

    def run_dir(self, k):
        """A standing daemon is its job's: outside a scheduler, the job "local"."""
        return os.path.join(self.base, f"run{k}", f"monarch-{os.getuid()}", f"local-node{k}")

    def socket(self, k):
        return os.path.join(self.run_dir(k), "daemon.sock")

    def pid(self, k):
        return int(open(os.path.join(self.run_dir(k), "daemon.pid")).read())

    def readers(self, ds, nodes, **kw):
        return [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", self.cfg, "--report",
                                  os.path.join(self.base, f"reader{k}.json"), "--", *reader(ds, **kw)],
                                 env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for k in nodes]

    def stop(self, nodes):
        for k in nodes:
            monarch("stop", "-c", self.cfg, env=monarch_env(MONARCH_NODE=k))
        try:
            return self.proc.wait(timeout=90)
        finally:
            self.kill()

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.launch.close()


def finish(procs, timeout=240):
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out)
        assert p.returncode == 0, out  # the reader checked every file's digest
    return outs


def test_each_daemon_logs_as_its_own_node(dataset, short_tmp):
    """A standing daemon learns its node from MPI after the logging is set up: every rank
    once logged as node 0."""
    ds = dataset(files=20, size="4KiB")
    cfg = write_config(short_tmp, ds.root)
    cluster = DaemonCluster(3, cfg, short_tmp, verbose=["-v"])
    assert cluster.stop(range(3)) == 0
    out = cluster.proc.stdout.read()
    for k in range(3):
        assert len(re.findall(rf"^\[monarch node {k}\] INFO snapshot \(", out, re.M)) == 1, out


@pytest.mark.parametrize("nodes", [2, 4])
def test_every_node_reads_everything_and_the_cluster_reads_the_pfs_once(nodes, dataset, short_tmp, slow_pfs):
    ds = dataset(files=300, size="8KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=1)
    mounted = type(ds)(str(pfs.mountpoint), ds.manifest, ds.files, ds.total)
    cfg = write_config(short_tmp, mounted.root)
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        finish(cluster.readers(mounted, range(nodes), epochs=3, workers=2))
    finally:
        assert cluster.stop(range(nodes)) == 0
    counted = pfs.counters()
    # the emulated PFS saw each byte about once for the whole cluster (against nodes x 3 without Monarch)
    assert ds.total <= counted["bytes"] <= 1.05 * ds.total
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["nodes_reporting"] == nodes and rep["nodes_lost"] == []
    assert rep["pfs"]["total_bytes"] == counted["bytes"]  # Monarch's count agrees with the filesystem's
    opened_from = rep["opened_from"]
    assert sum(c["opens"] for c in opened_from.values()) == nodes * 3 * 300
    assert sum(c["bytes"] for c in opened_from.values()) == nodes * 3 * ds.total
    assert opened_from["pfs"]["opens"] == 0
    # every node staged only its share and got the rest from its peers
    assert opened_from["peer"]["bytes"] == pytest.approx(3 * (nodes - 1) * ds.total, rel=0.01)
    assert rep["peer"]["bytes_sent"] == rep["peer"]["bytes_received"] > 0
    for node in rep["nodes"]:
        assert node["staging"]["pfs_files_read"] < 300 * 0.8  # a share from the PFS, the rest from peers


def test_a_peer_killed_mid_job_readers_elsewhere_complete_with_correct_bytes(dataset, short_tmp):
    nodes = 3
    ds = dataset(files=300, size="8KiB")
    cfg = write_config(short_tmp, ds.root, extra="")
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        # slow epochs (compute time per sample) so the kill lands in the middle of the job
        procs = cluster.readers(ds, [0, 1], epochs=3, workers=2, compute_ms=2)
        time.sleep(1.0)
        os.kill(cluster.pid(2), signal.SIGKILL)
        outs = finish(procs)
        assert all("epoch 2" in out for out in outs)
    finally:
        cluster.stop([0, 1])
    # wherever the bytes came from (peer, local staging, or the PFS if MPICH took the
    # survivors down), the readers verified every digest and exited 0


def test_compressed_copies_cross_the_network_as_stored(short_tmp):
    """Owners hold compressible files zstd-compressed; a peer's copy crosses the wire
    compressed and arrives with the right bytes (the readers check every digest)."""
    nodes = 2
    root = os.path.join(short_tmp, "pfs")
    manifest = os.path.join(short_tmp, "pfs.manifest.json")
    make_dataset(root, files=40, size="128KiB", spread=0.2, manifest=manifest, content="compressible")
    ds = types.SimpleNamespace(root=root, manifest=manifest)
    cfg = os.path.join(short_tmp, "monarch.yaml")
    with open(cfg, "w") as f:  # one compressed RAM tier per node
        f.write(f"""dataset: {{roots: ["{root}"]}}
run_base: "{short_tmp}/run${{MONARCH_NODE}}"
tiers:
  - {{name: ram, path: "/dev/shm{short_tmp}/ram${{MONARCH_NODE}}", capacity: 1GiB, compression: zstd}}
peer: {{path: "{short_tmp}/peer${{MONARCH_NODE}}", capacity: 1GiB, timeout: 5}}
staging: {{policy: on-access, threads: 2}}
{NO_RESERVE}""")
    make_bases(cfg, nodes=4)
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        finish(cluster.readers(ds, range(nodes), epochs=2, workers=2))
    finally:
        assert cluster.stop(range(nodes)) == 0
    peer = load(os.path.join(cluster.run_dir(0), "report.json"))["peer"]
    assert peer["bytes_received"] == peer["bytes_sent"] > 0
    assert peer["wire_bytes_received"] == peer["wire_bytes_sent"]
    assert peer["wire_bytes_received"] < 0.7 * peer["bytes_received"]  # ~3x under zstd
    assert not any(peer.get("fetch_failures", {}).values())


def test_read_ahead_fetches_the_other_nodes_files_before_they_are_asked_for(dataset, short_tmp, slow_pfs):
    """With read-ahead each node stages its own files from the PFS, then fetches the others'
    from their owners into its peer area: a reader that comes later finds every file on its
    node, and the cluster still reads the PFS once."""
    nodes = 2
    ds = dataset(files=200, size="8KiB")
    pfs = slow_pfs(ds.root, open_latency_ms=1)
    mounted = type(ds)(str(pfs.mountpoint), ds.manifest, ds.files, ds.total)
    cfg = write_config(short_tmp, mounted.root, policy="read-ahead")
    cluster = DaemonCluster(nodes, cfg, short_tmp)
    try:
        deadline = time.monotonic() + 60
        peer_dirs = [os.path.join(short_tmp, f"peer{k}") for k in range(nodes)]
        while sum(len(fs) for k in range(nodes) for _, _, fs in os.walk(peer_dirs[k])) < 200 - 5:
            assert time.monotonic() < deadline, "the read-ahead did not fetch the other nodes' files"
            time.sleep(0.2)
        time.sleep(0.5)
        finish(cluster.readers(mounted, range(nodes), epochs=1, workers=2))
    finally:
        assert cluster.stop(range(nodes)) == 0
    assert ds.total <= pfs.counters()["bytes"] <= 1.05 * ds.total  # read once for the cluster
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    assert rep["opened_from"]["pfs"]["opens"] == 0
    for node in rep["nodes"]:
        resolves = node["resolves"]
        assert resolves.get("fetched", 0) == 0 and resolves.get("staged", 0) == 0, resolves  # nothing waited for
        assert not any(k.startswith("read_ahead_from_peer") for k in node["staging"].get("failures", {}))
