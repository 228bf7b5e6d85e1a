"""A lost daemon costs its share, not the cluster.

4 simulated nodes, one sharded reader per node under `monarch run` (digests checked by the
reader, 20 ms per open on the emulated PFS, which counts its bytes), one `monarch serve`
rank SIGKILLed during the job. The survivors' readers finish with correct bytes, the other
daemons keep serving until `monarch stop`, which completes; the report names the lost node
and why. Daemons are launched by ``monarch.cluster.world.daemon_launch``: Open MPI with ULFM
when installed (the targets below), else MPICH (best effort: only bytes and no hang).
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

from monarch import protocol
from support.harness import load, monarch_env, write_config
from test_cluster_e2e import DaemonCluster
from test_cluster_shard import shard_config

pytestmark = pytest.mark.mpi

NODES = 4
EPOCHS = 3


def readers(cluster, ds, base, epochs=EPOCHS):
    """One sharded reader per node; each appends its finished epochs to ``progress<k>``."""
    return [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cluster.cfg, "--", sys.executable, "-m",
                              "support.shard_reader", ds.root, ds.manifest, "--node", str(k), "--nodes", str(NODES),
                              "--epochs", str(epochs), "--workers", "4",
                              "--progress", os.path.join(base, f"progress{k}")],
                             env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True) for k in range(NODES)]


def wait_epochs(base, node, epochs, procs, timeout=240):
    """Until reader ``node`` has finished ``epochs`` epochs (or every reader has ended)."""
    path = os.path.join(base, f"progress{node}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and len(open(path).read().split()) >= epochs:
            return
        if all(p.poll() is not None for p in procs):
            return
        time.sleep(0.05)
    pytest.fail(f"reader {node} did not finish {epochs} epochs in {timeout}s")


def second_copies(cluster):
    """The second copies every daemon's books hold (a brief REPORT to each)."""
    held = 0
    for k in range(NODES):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(cluster.socket(k))
            s.sendall(protocol.encode_request(protocol.VERB_REPORT, protocol.REPORT_BRIEF))
            status, body = protocol.recv_answer(s)
        assert status == 0, (k, status, body[:200])
        held += ((json.loads(body).get("cluster") or {}).get("replicas") or {}).get("kept_files", 0)
    return held


def wait_second_copies(cluster, want, timeout=120):
    """Until the daemons' books hold ``want`` second copies between them. The readers may end
    first: second copies are made once the nodes stop copying for their readers, so on a loaded
    machine they can still be on their way when the last epoch ends, and a kill then would test
    a share without its second copies."""
    deadline = time.monotonic() + timeout
    while (held := second_copies(cluster)) < want:
        if time.monotonic() > deadline:
            pytest.fail(f"the nodes hold {held} second copies, not {want}, after {timeout}s")
        time.sleep(0.05)


def collect(procs, timeout=300):
    """Each reader's exit code and result; a reader that hangs is killed and fails the test."""
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            text, _ = p.communicate()
            pytest.fail(f"a reader hung for {timeout}s:\n{text[-3000:]}")
        line = next((ln for ln in text.splitlines() if ln.startswith("shard_reader ")), None)
        out.append((p.returncode, json.loads(line[13:]) if line else None, text))
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too (mpiexec reaps it late)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def pid_of(cluster, k, timeout=30):
    """Daemon ``k``'s pid (its pid file is written just after its socket appears)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return cluster.pid(k)
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def mounted_dataset(dataset, slow_pfs, files, size, latency_ms=20):
    ds = dataset(files=files, size=size)
    pfs = slow_pfs(ds.root, open_latency_ms=latency_ms)
    return type(ds)(str(pfs.mountpoint), ds.manifest, ds.files, ds.total), pfs


def report_of(cluster, victim):
    """The cluster report: node 0's, or the lowest surviving node's when node 0 was lost."""
    writer = min(k for k in range(NODES) if k != victim)
    return load(os.path.join(cluster.run_dir(writer), "report.json"))


def run_with_a_kill(cluster, ds, base, victim, when, copies=0):
    """Start the readers, SIGKILL daemon ``victim`` at ``when`` ("epoch1": once its reader has
    finished epoch 0, "epoch2": epoch 1; a float: that many seconds after the readers start) and
    once the daemons hold ``copies`` second copies between them, let every reader end, check the
    survivors were still up, stop them. Returns the readers' results."""
    pids = [pid_of(cluster, k) for k in range(NODES)]
    procs = readers(cluster, ds, base)
    try:
        if isinstance(when, str):  # "epochN": once its reader has finished N epochs
            wait_epochs(base, victim, int(when[len("epoch"):]), procs)
        else:
            time.sleep(when)
        if copies:
            wait_second_copies(cluster, copies)
        os.kill(pids[victim], signal.SIGKILL)
        results = collect(procs)
        survivors = [k for k in range(NODES) if k != victim]
        up = [k for k in survivors if alive(pids[k])]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    t0 = time.monotonic()
    code = cluster.stop(survivors)  # hangs are caught by its own timeout (proc.wait)
    stop_seconds = time.monotonic() - t0
    return results, up, code, stop_seconds


def slowest_open(results, skip, first_epoch=0):
    """The slowest open of the readers but ``skip``'s, over their epochs from ``first_epoch``."""
    return max(e["slowest_open"] for k, (_, r, _) in enumerate(results) if k != skip and r
               for e in r["epochs"][first_epoch:])


def check_readers(results):
    for code, r, text in results:
        assert code == 0 and r is not None and r["ok"], text[-3000:]  # every digest right
        assert sum(e["files"] for e in r["epochs"]) > 0


def check_lost(rep, victim):
    assert rep["nodes_lost"] == [victim]
    lost = rep["lost"]
    assert [n["node"] for n in lost["nodes"]] == [victim]
    assert lost["nodes"][0]["why"] and lost["nodes"][0]["at"] > 0
    assert rep["pfs"]["lower_bound"] is True  # the lost node's own PFS reads are unknown


def kill_one_after_epoch0(cfg, ds, pfs, short_tmp, victim, when="epoch1", copies=0):
    """The cluster on ``cfg``, one sharded reader per node, ``victim``'s daemon SIGKILLed once its
    reader finished epoch 0 (``when``, ``copies``: run_with_a_kill's); every reader's bytes checked. Returns the cluster, which daemons
    were up until stop."""
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        results, up, code, stop_seconds = run_with_a_kill(cluster, ds, short_tmp, victim, when, copies)
    finally:
        cluster.kill()
    check_readers(results)
    print(f"engine {cluster.launch.engine}: slowest open on a survivor {slowest_open(results, victim):.3f}s "
          f"({slowest_open(results, victim, 1):.3f}s after epoch 0), stop {stop_seconds:.1f}s, "
          f"PFS {pfs.counters()['bytes'] / ds.total:.2f}x")
    return cluster, up, results


@pytest.mark.parametrize("victim", [2, 0])
def test_a_daemon_killed_mid_job_costs_its_share(victim, dataset, short_tmp, slow_pfs):
    """Dataset spread over the nodes (~1/3 each), readers fetching most of their shard from
    owners; the victim is killed once its reader finished epoch 0."""
    ds, pfs = mounted_dataset(dataset, slow_pfs, files=240, size="16KiB")
    cfg = shard_config(short_tmp, ds.root, ds.allocated // 3)
    cluster, up, _ = kill_one_after_epoch0(cfg, ds, pfs, short_tmp, victim)
    if cluster.launch.engine != "ulfm":
        return  # MPICH: hydra takes the survivors down; the readers still read right bytes (fail open)
    assert up == [k for k in range(NODES) if k != victim]  # the other daemons stayed up until stop
    rep = report_of(cluster, victim)
    check_lost(rep, victim)
    assert rep["nodes_reporting"] == NODES - 1
    # 3.0x direct; the target is 1.8x (scripts/cluster/bench_cluster_faults.py): staged once (1.0x), the
    # lost node's reader on the PFS for its last epochs (~0.5x) and its share re-read once (~0.25x)
    # leave little room, so a loaded machine's extra fallbacks are allowed here, not a second pass
    assert pfs.counters()["bytes"] <= 2.0 * ds.total


def test_a_daemon_killed_with_peers_in_use_costs_its_share(dataset, short_tmp, slow_pfs):
    """Every node can hold the dataset (replicated from the owners through the peers): a
    lost owner's files are re-read once by the survivors, the rest stays local."""
    victim = 1
    ds, pfs = mounted_dataset(dataset, slow_pfs, files=240, size="16KiB")
    cfg = write_config(short_tmp, ds.root, policy="read-ahead")
    cluster, up, results = kill_one_after_epoch0(cfg, ds, pfs, short_tmp, victim)
    if cluster.launch.engine != "ulfm":
        return
    assert up == [k for k in range(NODES) if k != victim]
    check_lost(report_of(cluster, victim), victim)
    # Owners copy what a peer asks for at once (never behind their read-ahead, nor behind copies
    # waiting on other nodes: that wait cycle cost 5 s opens and 2.2-2.3x before, loss or not), and
    # the survivors stage what they took over first: 1.18-1.50x seen over 12 runs (3.0x direct)
    assert pfs.counters()["bytes"] <= 1.8 * ds.total
    # no survivor waits out a peer (5.1 s before), nor a staging thread's 1 s nap (1.0-2.05 s): 0.1-0.2 s seen
    assert slowest_open(results, victim) < 2.0


def test_with_two_replicas_a_lost_daemon_s_share_is_served_from_second_copies(dataset, short_tmp, slow_pfs):
    """peer.replicas: 2, each node's tiers with room for its share and its second copies (0.7 of
    the dataset per node: still sharded). The survivors took the lost share over from second
    copies fetched from the owners: the PFS is not read for it again."""
    victim = 2
    ds, pfs = mounted_dataset(dataset, slow_pfs, files=240, size="16KiB")
    cfg = shard_config(short_tmp, ds.root, ds.allocated * 7 // 10, replicas=2)
    # killed once every file's second copy is in its node's books (not at a fixed epoch, nor once
    # the files are on disk: the books follow the renames a moment later): they are copied behind
    # the owners' own shares and the copies made for the readers, so the readers' epochs can end
    # before they are all there
    cluster, up, results = kill_one_after_epoch0(cfg, ds, pfs, short_tmp, victim, "epoch1", copies=len(ds.files))
    if cluster.launch.engine != "ulfm":
        return
    assert up == [k for k in range(NODES) if k != victim]
    rep = report_of(cluster, victim)
    check_lost(rep, victim)
    survivors = [n["cluster"] for n in rep["nodes"] if n]
    assert len(survivors) == NODES - 1
    kept = [c["replicas"]["kept_files"] for c in survivors]
    held = sum(c["replicas"]["reowned_held"] for c in survivors)
    taken = sum(c["reowned_files"] for c in survivors)
    served = sum(c["replicas"]["served_after_loss"]["files"] for c in survivors)
    print(f"second copies kept {kept}; of the {taken} files taken over {held} were held; "
          f"{served} sent to peers from them after the loss")
    # every file taken over was held already (how many the others then ask for varies: 0-75 seen)
    assert all(k > 0 for k in kept) and held == taken > 0
    # staged once (1.0x), the lost node's reader on the PFS for its last 2 epochs but for what its
    # dead tiers still hold (~0.25x), the lost share: nothing
    assert pfs.counters()["bytes"] <= 1.3 * ds.total
    assert slowest_open(results, victim) < 2.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_daemon_killed_at_a_random_point_never_hangs(seed, dataset, short_tmp, slow_pfs):
    """Killed while staging, with transfers in flight, or as the job ends: every reader
    finishes with right bytes, `monarch stop` of the others completes, nothing hangs."""
    rng = random.Random(seed)
    victim = rng.randrange(NODES)
    ds, pfs = mounted_dataset(dataset, slow_pfs, files=160, size="16KiB")
    cfg = shard_config(short_tmp, ds.root, ds.allocated // 3)
    cluster = DaemonCluster(NODES, cfg, short_tmp)
    try:
        results, up, code, stop_seconds = run_with_a_kill(cluster, ds, short_tmp, victim, rng.uniform(0.0, 4.0))
    finally:
        cluster.kill()
    check_readers(results)
    print(f"engine {cluster.launch.engine}: victim {victim}, slowest open on a survivor "
          f"{slowest_open(results, victim):.3f}s, stop {stop_seconds:.1f}s")
    if cluster.launch.engine == "ulfm":
        assert up == [k for k in range(NODES) if k != victim]
        check_lost(report_of(cluster, victim), victim)
