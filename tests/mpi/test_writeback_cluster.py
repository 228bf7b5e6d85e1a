"""Write-back across the nodes of a cluster (docs/consistency.md, "Write-back", W4): `monarch serve`
under mpiexec, each rank its own node; one `monarch run` per node, each running one rank of
torch.distributed.checkpoint's pattern (a shard, a barrier, then rank 0's `.metadata`). A watcher
polls the PFS's backing directory as another node's reader would."""

import glob
import hashlib
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from support.harness import load, monarch_env, write_config
from test_cluster_e2e import DaemonCluster

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(300)]

NODES = 4
SMALL, LARGE = 1 << 20, 16 << 20  # the last rank's shard drains for about 0.8 s at 20 MB/s

RANK = """
import os, sys, time
ck, barrier, rank, ranks, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
pause, timeout = (float(a) for a in (sys.argv[6:8] or (0, 1e9)))  # a slow writer; a barrier that gives up
block = bytes([rank]) * (1 << 20)
with open(os.path.join(ck, f"__{rank}_0.distcp"), "wb") as f:  # DCP's shard, under its final name
    for _ in range(size >> 20):
        f.write(block)
        time.sleep(pause)
open(os.path.join(barrier, str(rank)), "w").close()  # the job's barrier: every shard closed first
deadline = time.monotonic() + timeout
while len(os.listdir(barrier)) < ranks:
    if time.monotonic() > deadline:
        sys.exit("a rank never reached the barrier")  # (as torch.distributed's timeout ends the job)
    time.sleep(0.01)
if rank == 0:
    with open(os.path.join(ck, ".metadata.tmp"), "wb") as f:
        f.write(b"metadata of %d shards" % ranks)
    os.replace(os.path.join(ck, ".metadata.tmp"), os.path.join(ck, ".metadata"))
"""


LARGE_RANKS = {NODES - 1}  # the ranks whose shard is large (a test losing two nodes makes both large)


def shard_size(rank):
    return LARGE if rank in LARGE_RANKS else SMALL


class Watcher(threading.Thread):
    """Every 5 ms: is `.metadata` there while a shard is short, or any final name short?"""

    def __init__(self, directory):
        super().__init__(daemon=True)
        self.directory, self.stop, self.polls, self.early, self.short = directory, threading.Event(), 0, 0, 0

    def run(self):
        while not self.stop.wait(0.005):
            sizes = {}
            for name in os.listdir(self.directory):
                try:
                    sizes[name] = os.stat(os.path.join(self.directory, name)).st_size
                except FileNotFoundError:
                    pass
            self.polls += 1
            shards = [sizes.get(f"__{r}_0.distcp", -1) >= shard_size(r) for r in range(NODES)]
            self.early += ".metadata" in sizes and not all(shards)
            self.short += any(sizes[f"__{r}_0.distcp"] < shard_size(r) for r in range(NODES)
                              if f"__{r}_0.distcp" in sizes)


def dcp_cluster(short_tmp, slow_pfs, ds, mbps, fsync="auto"):
    """A writable emulated PFS at ``mbps`` MB/s with its ``ck`` directory, a barrier directory, 4
    daemons under `monarch serve` with write-back of ``ck`` (``fsync``), and a watcher of the PFS's
    backing directory: (src, ck on the mount, barrier, configuration, cluster, watcher)."""
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(os.path.join(src, "ck"))
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=mbps, open_latency_ms=0)
    ck = os.path.join(str(pfs.mountpoint), "ck")
    barrier = os.path.join(short_tmp, "barrier")
    os.makedirs(barrier)
    cfg = write_config(short_tmp, ds.root, extra=f'writeback: {{paths: ["{ck}"], fsync: {fsync}}}\n')
    return src, ck, barrier, cfg, DaemonCluster(NODES, cfg, short_tmp), Watcher(os.path.join(src, "ck"))


def lose_node(short_tmp, k, job=None):
    """Node ``k`` lost with its tiers: its job's processes SIGKILLed (its daemon is the caller's), its tiers wiped."""
    import shutil
    import signal
    if job is not None:
        os.killpg(job.pid, signal.SIGKILL)
    for tier in (f"/dev/shm{short_tmp}/ram{k}", f"{short_tmp}/ssd{k}"):
        shutil.rmtree(tier, ignore_errors=True)


def start_ranks(cfg, ck, barrier, more=lambda k: []):
    """One `monarch run` a node, each running its rank of RANK (``more(k)``: its pause and barrier
    timeout), each in a session of its own (a lost node's job is SIGKILLed whole)."""
    return [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--", sys.executable,
                              "-c", textwrap.dedent(RANK), ck, barrier, str(k), str(NODES), str(shard_size(k)),
                              *more(k)],
                             env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True) for k in range(NODES)]


def test_dcp_metadata_is_published_after_every_nodes_shard(dataset, short_tmp, slow_pfs):
    """Rank 0 writes `.metadata` after the barrier; its node drains fast, the last node's shard
    slowly. The PFS never shows `.metadata` before every shard is whole, nor a shard short under
    its name; every byte is right once the jobs return."""
    src, ck, barrier, cfg, cluster, watcher = dcp_cluster(short_tmp, slow_pfs, dataset(files=20), 20)
    try:
        watcher.start()
        jobs = [subprocess.Popen([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--report",
                                  os.path.join(short_tmp, f"job{k}.json"), "--", sys.executable, "-c",
                                  textwrap.dedent(RANK), ck, barrier, str(k), str(NODES), str(shard_size(k))],
                                 env=monarch_env(MONARCH_NODE=k), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for k in range(NODES)]
        outs = [p.communicate(timeout=240)[0] for p in jobs]
        assert [p.returncode for p in jobs] == [0] * NODES, outs
    finally:
        watcher.stop.set()
        watcher.join()
        assert cluster.stop(range(NODES)) == 0
    assert watcher.polls > 20
    assert watcher.early == 0, f"`.metadata` was on the PFS before every shard in {watcher.early} polls"
    assert watcher.short == 0, f"a shard was seen short under its name in {watcher.short} polls"
    names = sorted(os.listdir(os.path.join(src, "ck")))
    assert names == [".metadata", *sorted(f"__{r}_0.distcp" for r in range(NODES))]
    for r in range(NODES):
        with open(os.path.join(src, "ck", f"__{r}_0.distcp"), "rb") as f:
            assert hashlib.md5(f.read()).digest() == hashlib.md5(bytes([r]) * shard_size(r)).digest()
    rep = load(os.path.join(cluster.run_dir(0), "report.json"))
    wb = {n["node"]: n["writeback"] for n in rep["nodes"]}
    assert wb[0]["ordered_files"] >= 1  # `.metadata.tmp`'s publish waited for the other nodes
    assert sum(w["files_published"] for w in wb.values()) == NODES + 1


def lose_a_node_after_the_barrier(short_tmp, slow_pfs, ds, fsync, lost=(NODES - 1,), publishing=False, wipe=True):
    """The DCP pattern on 4 nodes under `monarch serve` with ``fsync``; once every rank passed the
    barrier (every shard closed), the nodes ``lost`` are lost at once: their daemons and jobs
    SIGKILLed, their tiers wiped (``wipe=False``: the daemons alone killed, the tiers kept).
    ``publishing``: not before the first lost node's shard is being copied to the PFS (its temporary
    name there). The PFS's backing directory, the watcher, each job's exit code and output, and the
    cluster (stopped)."""
    import signal
    import time
    src, ck, barrier, cfg, cluster, watcher = dcp_cluster(short_tmp, slow_pfs, ds, 8, fsync)
    try:
        watcher.start()
        jobs = start_ranks(cfg, ck, barrier)
        deadline = time.monotonic() + 120
        while len(os.listdir(barrier)) < NODES:  # every shard closed, the lost nodes' too
            assert time.monotonic() < deadline, "the ranks never reached the barrier"
            time.sleep(0.002)
        shard = f".__{lost[0]}_0.distcp.monarch-"
        while publishing and not any(n.startswith(shard) for n in os.listdir(os.path.join(src, "ck"))):
            assert time.monotonic() < deadline, "the lost node's shard was never copied to the PFS"
            time.sleep(0.002)
        for k in lost:
            os.kill(cluster.pid(k), signal.SIGKILL)
            if wipe:
                lose_node(short_tmp, k, jobs[k])
        outs = [p.communicate(timeout=240)[0] for p in jobs]
    finally:
        watcher.stop.set()
        watcher.join()
        cluster.stop([k for k in range(NODES) if k not in lost])
    return os.path.join(src, "ck"), watcher, [p.returncode for p in jobs], outs, cluster


def test_a_node_lost_after_its_shard_closed_never_leaves_metadata_without_it(dataset, short_tmp, slow_pfs):
    """With `fsync: local` (no copy on another node) node 3's shard is lost with it: rank 0's
    `.metadata`, ordered after it, is never published; its run exits 3 naming it and the lost node,
    and so does any other node's whose file was opened after that shard closed (W4's order holds
    them too). Before, `.metadata` was published without the lost shard (a checkpoint torn on the
    PFS) and every rank exited 0."""
    ck, watcher, codes, outs, _ = lose_a_node_after_the_barrier(short_tmp, slow_pfs, dataset(files=20), "local")
    lost = NODES - 1
    assert watcher.early == 0, f"`.metadata` was on the PFS before every shard in {watcher.early} polls"
    names = os.listdir(ck)
    if f"__{lost}_0.distcp" in names:
        pytest.skip("the lost node's shard reached the PFS before its daemon was killed: nothing to keep")
    assert ".metadata" not in names, names
    assert codes[0] == 3 and ".metadata" in outs[0] and f"node {lost} was lost" in outs[0], outs[0][-3000:]
    for k in range(1, lost):
        assert codes[k] == 0 or (codes[k] == 3 and f"node {lost} was lost" in outs[k]), outs[k][-3000:]


@pytest.mark.parametrize("publishing", [False, True], ids=["after-its-close", "while-its-shard-goes-to-the-pfs"])
def test_a_node_lost_after_its_shard_closed_is_published_by_its_partner(dataset, short_tmp, slow_pfs, publishing):
    """The default on a cluster (`fsync: auto`, a copy on the partner node): node 3's shard, held by
    node 0 since its close, is published by node 0 after node 3 is lost (right after the barrier,
    or once its own copy to the PFS had begun), then `.metadata`: every step whole on the PFS, never
    `.metadata` before a shard, every byte right, every surviving job exits 0."""
    ck, watcher, codes, outs, cluster = lose_a_node_after_the_barrier(short_tmp, slow_pfs, dataset(files=20), "auto",
                                                                      publishing=publishing)
    run0 = cluster.run_dir(0)
    assert watcher.early == 0, f"`.metadata` was on the PFS before every shard in {watcher.early} polls"
    assert watcher.short == 0, f"a shard was seen short under its name in {watcher.short} polls"
    assert codes[:NODES - 1] == [0] * (NODES - 1), [o[-3000:] for o in outs]
    assert sorted(os.listdir(ck)) == [".metadata", *sorted(f"__{r}_0.distcp" for r in range(NODES))]
    for r in range(NODES):
        with open(os.path.join(ck, f"__{r}_0.distcp"), "rb") as f:
            assert hashlib.md5(f.read()).digest() == hashlib.md5(bytes([r]) * shard_size(r)).digest()
    wb = {n["node"]: n["writeback"] for n in load(os.path.join(run0, "report.json"))["nodes"] if n and n.get("writeback")}
    assert wb[0]["fsync"] == "partner" and wb[0]["held_for_lost_published"] == 1, wb[0]  # node 3's shard, by node 0
    assert all(w["partner_bytes_sent"] >= shard_size(k) for k, w in wb.items()), wb


def test_a_daemon_killed_with_its_tier_kept_is_drained_in_the_jobs_order_across_the_nodes(dataset, short_tmp,
                                                                                            slow_pfs):
    """`fsync: local`; once every shard closed, node 3's daemon is SIGKILLed, its tier kept, while its
    shard (the large one) drains. Rank 0's `.metadata`, ordered after it, is kept by node 0 (exit 3).
    Then `monarch drain` on every node at once (mpiexec, one rank a node): node 3's shard is published,
    and only then `.metadata`: every byte right, no area left, never `.metadata` before a shard. Before,
    each node's drain kept its own order only: `.metadata` was published while shard 3 was still
    being copied."""
    import signal
    import time
    from monarch.cluster.world import daemon_launch
    src, ck, barrier, cfg, cluster, watcher = dcp_cluster(short_tmp, slow_pfs, dataset(files=20), 8, "local")
    killed = NODES - 1
    try:
        watcher.start()
        jobs = start_ranks(cfg, ck, barrier)
        deadline = time.monotonic() + 120
        while len(os.listdir(barrier)) < NODES:
            assert time.monotonic() < deadline, "the ranks never reached the barrier"
            time.sleep(0.002)
        os.kill(cluster.pid(killed), signal.SIGKILL)
        outs = [p.communicate(timeout=240)[0] for p in jobs]
        cluster.stop(range(NODES - 1))
        on_pfs = os.listdir(os.path.join(src, "ck"))
        if f"__{killed}_0.distcp" in on_pfs:
            pytest.skip("the killed node's shard reached the PFS before its daemon was killed: nothing to order")
        assert ".metadata" not in on_pfs and jobs[0].returncode == 3, outs[0][-3000:]
        launch = daemon_launch(NODES, one_host=True)
        try:
            drained = subprocess.run([*launch.argv, sys.executable, "-m", "monarch", "drain", "-c", cfg],
                                     env=monarch_env(**launch.env), capture_output=True, text=True, timeout=180)
        finally:
            launch.close()
    finally:
        watcher.stop.set()
        watcher.join()
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert watcher.early == 0, f"`.metadata` was on the PFS before every shard in {watcher.early} polls"
    assert watcher.short == 0, f"a shard was seen short under its name in {watcher.short} polls"
    assert sorted(os.listdir(os.path.join(src, "ck"))) == [".metadata", *sorted(f"__{r}_0.distcp" for r in range(NODES))]
    for r in range(NODES):
        with open(os.path.join(src, "ck", f"__{r}_0.distcp"), "rb") as f:
            assert hashlib.md5(f.read()).digest() == hashlib.md5(bytes([r]) * shard_size(r)).digest()
    left = [p for k in range(NODES) for p in glob.glob(f"/dev/shm{short_tmp}/ram{k}/monarch-*/writeback-*[0-9]")]
    assert left == [], drained.stdout


def test_two_nodes_lost_at_once_never_leave_metadata_without_their_shards(dataset, short_tmp, slow_pfs, monkeypatch):
    """The default (`fsync: auto`); nodes 2 and 3 lost at once while their shards (both large) go to
    the PFS. Node 2's copy was held by node 3, lost with it: `.metadata` is never published, and rank
    0's run exits 3 naming it and node 2. A step missing, never torn. (Node 3's copy, held by node 0,
    is published whole, unless node 3 opened its shard after node 2 closed its own: then it is ordered
    after it, and kept too.)"""
    monkeypatch.setattr(sys.modules[__name__], "LARGE_RANKS", {2, 3})
    ck, watcher, codes, outs, _ = lose_a_node_after_the_barrier(short_tmp, slow_pfs, dataset(files=20), "auto",
                                                                lost=(2, 3), publishing=True)
    assert watcher.early == 0, f"`.metadata` was on the PFS before every shard in {watcher.early} polls"
    assert watcher.short == 0, f"a shard was seen short under its name in {watcher.short} polls"
    names = os.listdir(ck)
    if "__2_0.distcp" in names:
        pytest.skip("node 2's shard reached the PFS before it was lost: nothing of it to keep")
    assert ".metadata" not in names, names
    assert codes[0] == 3 and ".metadata" in outs[0] and "node 2 was lost" in outs[0], outs[0][-3000:]
    if "__3_0.distcp" in names:
        with open(os.path.join(ck, "__3_0.distcp"), "rb") as f:
            assert hashlib.md5(f.read()).digest() == hashlib.md5(bytes([3]) * LARGE).digest()


def test_a_daemon_killed_with_its_tier_kept_under_partner_copies_is_published_once(dataset, short_tmp, slow_pfs):
    """The default; node 3's daemon alone SIGKILLed while its shard goes to the PFS, its tier kept:
    node 0 publishes node 3's shard from its copy, then `.metadata` (every job but node 3's exits 0).
    The drain of every node afterwards knows node 3's journal is on the PFS (node 0 kept what it
    published for it): nothing published twice, the area removed."""
    from monarch.cluster.world import daemon_launch
    ck, watcher, codes, outs, cluster = lose_a_node_after_the_barrier(short_tmp, slow_pfs, dataset(files=20), "auto",
                                                                      publishing=True, wipe=False)
    assert watcher.early == 0 and watcher.short == 0, (watcher.early, watcher.short)
    assert codes[:NODES - 1] == [0] * (NODES - 1), [o[-3000:] for o in outs]
    assert sorted(os.listdir(ck)) == [".metadata", *sorted(f"__{r}_0.distcp" for r in range(NODES))]
    before = {n: os.stat(os.path.join(ck, n)).st_mtime_ns for n in os.listdir(ck)}
    launch = daemon_launch(NODES, one_host=True)
    try:
        drained = subprocess.run([*launch.argv, sys.executable, "-m", "monarch", "drain", "-c", cluster.cfg],
                                 env=monarch_env(**launch.env), capture_output=True, text=True, timeout=180)
    finally:
        launch.close()
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert "writeback-local-node3: published 0 files, 0 bytes to the PFS; removed" in drained.stdout, drained.stdout
    assert {n: os.stat(os.path.join(ck, n)).st_mtime_ns for n in os.listdir(ck)} == before
    for r in range(NODES):
        with open(os.path.join(ck, f"__{r}_0.distcp"), "rb") as f:
            assert hashlib.md5(f.read()).digest() == hashlib.md5(bytes([r]) * shard_size(r)).digest()
    assert glob.glob(f"/dev/shm{short_tmp}/ram*/monarch-*/writeback-*[0-9]") == []


def test_a_node_lost_before_its_shard_closed_leaves_a_step_missing_never_torn(dataset, short_tmp, slow_pfs):
    """The default; node 3 lost (daemon and job SIGKILLed, tier wiped) while its job still writes its
    shard: nothing of shard 3 exists anywhere, the other ranks' barrier gives up (exit 1, the app's
    own code, not Monarch's), their shards are published whole and `.metadata` never is."""
    import signal
    import time
    src, ck, barrier, cfg, cluster, watcher = dcp_cluster(short_tmp, slow_pfs, dataset(files=20), 8)
    lost = NODES - 1
    try:
        watcher.start()
        jobs = start_ranks(cfg, ck, barrier, lambda k: [str(0.1 if k == lost else 0), "8"])
        deadline = time.monotonic() + 60
        while not glob.glob(f"/dev/shm{short_tmp}/ram{lost}/monarch-*/writeback-*[0-9]/data/*"):
            assert time.monotonic() < deadline, "node 3's job never began its shard"
            time.sleep(0.002)
        time.sleep(0.3)  # a few blocks written, not all (16 of them, 0.1 s apart)
        os.kill(cluster.pid(lost), signal.SIGKILL)
        lose_node(short_tmp, lost, jobs[lost])
        outs = [p.communicate(timeout=240)[0] for p in jobs]
    finally:
        watcher.stop.set()
        watcher.join()
        cluster.stop(range(NODES - 1))
    assert str(lost) not in os.listdir(barrier)
    assert [p.returncode for p in jobs[:lost]] == [1] * lost, [o[-3000:] for o in outs]
    assert watcher.early == 0 and watcher.short == 0, (watcher.early, watcher.short)
    assert sorted(os.listdir(os.path.join(src, "ck"))) == sorted(f"__{r}_0.distcp" for r in range(lost))
    for r in range(lost):
        with open(os.path.join(src, "ck", f"__{r}_0.distcp"), "rb") as f:
            assert hashlib.md5(f.read()).digest() == hashlib.md5(bytes([r]) * shard_size(r)).digest()


def drain_ranks(cfg):
    """(pid, rank) of the `monarch drain -c cfg` processes mpiexec started."""
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"\0drain\0-c\0" + cfg.encode() not in open(f"/proc/{p}/cmdline", "rb").read():
                continue
            env = dict(v.split(b"=", 1) for v in open(f"/proc/{p}/environ", "rb").read().split(b"\0") if b"=" in v)
        except OSError:  # gone meanwhile
            continue
        if env.get(b"PMI_RANK", b"").isdigit():
            found.append((int(p), int(env[b"PMI_RANK"])))
    return found


def test_a_node_lost_during_the_drains_is_published_from_its_partners_copy(dataset, short_tmp, slow_pfs):
    """The default (partner copies). Every daemon SIGKILLed once the job wrote everything, tiers kept;
    then the drains of every node together (MPICH's mpiexec, which ends the others when one dies),
    and node 3 lost during them: its drain SIGKILLed while its shard goes to the PFS, its tier wiped.
    `.metadata` waits for it: nothing published out of order. The drains of the three nodes left,
    run again, publish node 3's shard from node 0's copy, then `.metadata`: the step whole."""
    import signal
    import time
    from monarch.cluster.world import mpich_mpiexec
    src, ck, barrier, cfg, cluster, watcher = dcp_cluster(short_tmp, slow_pfs, dataset(files=20), 8)
    lost = NODES - 1

    def drains(n):
        return subprocess.Popen([mpich_mpiexec(), "-n", str(n), sys.executable, "-m", "monarch", "drain", "-c", cfg],
                                env=monarch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        watcher.start()
        jobs = start_ranks(cfg, ck, barrier)
        deadline = time.monotonic() + 120
        journal0 = f"/dev/shm{short_tmp}/ram0/monarch-*/writeback-*[0-9]/journal"
        while not any(b'"op":"rename"' in open(j, "rb").read() for j in glob.glob(journal0)):
            assert time.monotonic() < deadline, "rank 0 never renamed its `.metadata`"
            time.sleep(0.002)
        for k in range(NODES):  # the job wrote everything: every daemon killed, every tier kept
            os.kill(cluster.pid(k), signal.SIGKILL)
        outs = [p.communicate(timeout=240)[0] for p in jobs]
        cluster.kill()
        if f"__{lost}_0.distcp" in os.listdir(os.path.join(src, "ck")):
            pytest.skip("node 3's shard reached the PFS before its daemon was killed: nothing left to lose")
        for name in os.listdir(os.path.join(src, "ck")):  # what the killed daemons' copies left (the drain's own come back)
            if ".monarch-" in name:
                os.unlink(os.path.join(src, "ck", name))
        first = drains(NODES)
        while not any(n.startswith(f".__{lost}_0.distcp.monarch-") for n in os.listdir(os.path.join(src, "ck"))):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            time.sleep(0.002)
        mine = [pid for pid in drain_ranks(cfg) if pid[1] == lost]
        for pid, _ in mine:
            os.kill(pid, signal.SIGKILL)
        lose_node(short_tmp, lost)
        first_out = first.communicate(timeout=120)[0]
        assert mine and first.returncode != 0, first_out
        assert ".metadata" not in os.listdir(os.path.join(src, "ck")), first_out
        again = drains(NODES - 1)
        again_out = again.communicate(timeout=180)[0]
    finally:
        watcher.stop.set()
        watcher.join()
        cluster.kill()
    assert again.returncode == 0, again_out
    assert f"published 1 files, {LARGE} bytes for node {lost}" in again_out, again_out
    assert watcher.early == 0 and watcher.short == 0, (watcher.early, watcher.short)
    names = sorted(n for n in os.listdir(os.path.join(src, "ck")) if not n.startswith(f".__{lost}_0.distcp.monarch-"))
    assert names == [".metadata", *sorted(f"__{r}_0.distcp" for r in range(NODES))], (names, outs)
    for r in range(NODES):
        with open(os.path.join(src, "ck", f"__{r}_0.distcp"), "rb") as f:
            assert hashlib.md5(f.read()).digest() == hashlib.md5(bytes([r]) * shard_size(r)).digest()


FSYNCED = """
import os, sys
with open(os.path.join(sys.argv[1], "weights.bin"), "wb") as f:  # fsynced, then closed at once
    f.write(bytes(range(256)) * (64 << 12))
    os.fsync(f.fileno())
"""


def test_a_file_fsynced_then_closed_while_its_bytes_are_copied_is_published(dataset, short_tmp, slow_pfs):
    """Under `fsync: partner` an fsync returns once the partner holds the bytes, and the drain copies
    them to the PFS meanwhile (16 MiB at 20 MB/s): the job's close comes while the drain holds the file
    open. The close is seen once that copy ends: the file is published, never reported as not closed
    (before, a standing daemon's job said "killed while writing" and kept it)."""
    src, ck, _, cfg, cluster, _ = dcp_cluster(short_tmp, slow_pfs, dataset(files=5), 20)
    try:
        job = subprocess.run([sys.executable, "-m", "monarch", "run", "-c", cfg, "--no-progress", "--report",
                              os.path.join(short_tmp, "job.json"), "--", sys.executable, "-c", textwrap.dedent(FSYNCED),
                              ck], env=monarch_env(MONARCH_NODE=0), capture_output=True, text=True, timeout=240)
        assert job.returncode == 0, job.stdout + job.stderr
    finally:
        assert cluster.stop(range(NODES)) == 0
    wb = load(os.path.join(short_tmp, "job.json"))["writeback"]
    assert (wb["files_closed"], wb["files_published"], wb["not_closed"]) == (1, 1, 0), wb
    with open(os.path.join(src, "ck", "weights.bin"), "rb") as f:
        assert f.read() == bytes(range(256)) * (64 << 12)
