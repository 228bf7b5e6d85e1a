"""A real framework under `monarch run` with write-back on (docs/consistency.md, "Write-back"):
torch.save then os.replace, and torch.distributed.checkpoint with four gloo ranks, each read back
by the job at once and found on the PFS byte for byte. The PFS is the emulated one, writable, a
FUSE mount over a backing directory the test reads without the shim."""

import hashlib
import json
import os
import socket
import sys
import textwrap
import threading
import time

import pytest

from support.harness import load, monarch, monarch_env, write_config

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/install.sh installs its CPU build)")

pytestmark = [pytest.mark.integration, pytest.mark.fuse, pytest.mark.timeout(150)]


def run(base, root, wb, script, *args, env=None, report="report.json"):
    """``script`` (a file in ``base``) as a job of `monarch run` with write-back under ``wb``."""
    path = os.path.join(base, "job.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(script))
    cfg = write_config(base, root, extra=f"writeback: {{paths: [{json.dumps(str(wb))}]}}\n")
    report = os.path.join(base, report)
    r = monarch("run", "-c", cfg, "--report", report, "--no-progress", "--", sys.executable, path, *map(str, args),
                env=env, timeout=120)
    return r, load(report) if os.path.exists(report) else None


def digests(d):
    """sha256 of every file under ``d``, by its path relative to ``d``."""
    out = {}
    for dp, _, fns in os.walk(d):
        for fn in fns:
            with open(os.path.join(dp, fn), "rb") as f:
                out[os.path.relpath(os.path.join(dp, fn), d)] = hashlib.sha256(f.read()).hexdigest()
    return out


def areas(base):
    """The write-back areas left under the RAM tier's base (write_config's first tier)."""
    return [os.path.join(dp, d) for dp, dns, _ in os.walk(f"/dev/shm{base}") for d in dns if d.startswith("writeback-")]


def assert_published_cleanly(report, base, backing):
    wb = report["nodes"][0]["writeback"]
    assert wb["failed"] is None and wb["unpublished"] == {} and wb["not_closed"] == 0, wb
    assert [n for _, _, fns in os.walk(backing) for n in fns if ".monarch-" in n] == []  # no temporary left
    assert areas(base) == []  # nothing left on the node once published


STATE = """
import torch

def state(step):
    \"\"\"A model's state dict at ``step``: 3.7 MB in six tensors of four dtypes.\"\"\"
    g = torch.Generator().manual_seed(step)
    return {"embed.weight": torch.randn(1024, 512, generator=g),
            "layers.0.weight": torch.randn(512, 512, generator=g),
            "layers.0.bias": torch.randn(512, generator=g),
            "head.weight": torch.randn(128, 512, generator=g, dtype=torch.float64),
            "tokens_seen": torch.randint(0, 1 << 40, (4096,), generator=g),
            "step": torch.tensor(step)}
"""

SAVE = STATE + """
import hashlib, os, sys
ck = sys.argv[1]
os.makedirs(ck, exist_ok=True)  # a directory the PFS has not got yet
os.makedirs(ck, exist_ok=True)
final, tmp = os.path.join(ck, "ckpt.pt"), os.path.join(ck, "ckpt.pt.tmp")
for step in (1, 2):  # the second save replaces the first, as a training loop's every N steps
    sd = state(step)
    torch.save(sd, tmp)
    os.replace(tmp, final)
    assert sorted(os.listdir(ck)) == ["ckpt.pt"], os.listdir(ck)
    for back in (torch.load(final, weights_only=True),              # read(), from the job's view at once
                 torch.load(final, weights_only=True, mmap=True)):  # and mapped
        assert list(back) == list(sd), list(back)
        for k in sd:
            assert back[k].dtype == sd[k].dtype and torch.equal(back[k], sd[k]), k
    with open(final, "rb") as f:
        print(step, hashlib.sha256(f.read()).hexdigest(), flush=True)
"""


def test_torch_save_then_replace_is_loaded_back_at_once_and_published_byte_identical(dataset, short_tmp, slow_pfs,
                                                                                      tmp_path):
    ds = dataset(files=20)
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(src)
    # 4 MB/s: the drain lags the job, which loads each save and replaces the first while it is pending
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=4, open_latency_ms=0)
    ck = os.path.join(str(pfs.mountpoint), "run1", "checkpoints")
    r, report = run(short_tmp, ds.root, pfs.mountpoint, SAVE, ck)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = dict(line.split() for line in r.stdout.split("\n") if line)
    backing = os.path.join(src, "run1", "checkpoints")
    assert sorted(os.listdir(backing)) == ["ckpt.pt"]
    ns = {}
    exec(STATE, ns)
    direct = tmp_path / "ckpt.pt.tmp"  # the same name: torch.save names its archive after the file
    torch.save(ns["state"](2), direct)
    with open(os.path.join(backing, "ckpt.pt"), "rb") as f:
        published = f.read()
    assert published == direct.read_bytes()  # torch.save's bytes, as a direct save leaves them
    assert hashlib.sha256(published).hexdigest() == seen["2"]  # and what the job read back
    assert seen["1"] != seen["2"]
    assert_published_cleanly(report, short_tmp, src)
    wb = report["nodes"][0]["writeback"]
    assert wb["files_closed"] == 2 and wb["bytes_written"] == 2 * len(published)  # both saves were written back


DCP = """
import hashlib, json, os, sys
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

WORLD = 4


def state(rank, mesh, fill=None):
    \"\"\"A rank's state dict: a tensor sharded over the ranks (a DTensor, as FSDP2 holds one), the
    rank's own tensors and a replicated one; ``fill``: the same shapes, filled with it.\"\"\"
    g = torch.Generator().manual_seed(rank)
    own = {f"rank{rank}.weight": torch.randn(512, 256, generator=g),
           f"rank{rank}.bias": torch.randn(256, generator=g, dtype=torch.float64)}
    full = torch.randn(2048, 256, generator=torch.Generator().manual_seed(99))
    sd = {"model.embed": distribute_tensor(full, mesh, [Shard(0)]), **own,
          "shared.table": torch.arange(1 << 16, dtype=torch.int32), "step": torch.tensor(500)}
    if fill is not None:
        sd = {k: (distribute_tensor(torch.full_like(full, fill), mesh, [Shard(0)]) if k == "model.embed"
                  else torch.full_like(v, fill)) for k, v in sd.items()}
    return sd


def check(loaded, rank, mesh):
    want = state(rank, mesh)
    for k, v in want.items():
        got = loaded[k]
        if k == "model.embed":
            got, v = got.full_tensor(), v.full_tensor()
        assert got.dtype == v.dtype and torch.equal(got, v), (rank, k)


def worker(rank, mode, ck):
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)  # MASTER_ADDR, MASTER_PORT: the env's
    mesh = init_device_mesh("cpu", (WORLD,))
    if mode == "save":  # DCP's default: every file fsynced
        dcp.save(state(rank, mesh), checkpoint_id=ck)
    elif mode == "save-nosync":  # the order is then write-back's alone (W3)
        dcp.save(state(rank, mesh), storage_writer=dcp.FileSystemWriter(ck, sync_files=False))
    if mode != "load":
        dist.barrier()
    loaded = state(rank, mesh, fill=-1)
    dcp.load(loaded, checkpoint_id=ck)  # saving: the job's own write-back, read back at once
    check(loaded, rank, mesh)
    dist.barrier()
    if rank == 0:
        files = {}
        for name in sorted(os.listdir(ck)):
            with open(os.path.join(ck, name), "rb") as f:
                files[name] = hashlib.sha256(f.read()).hexdigest()
        print(json.dumps(files), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=WORLD)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Watcher:
    """Polls a directory of the PFS's backing store every 5 ms while a job runs: each time
    ``.metadata`` is there, the shards and their sizes beside it; every size a shard showed."""

    def __init__(self, d):
        self.d, self.with_metadata, self.shard_sizes = d, [], {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.is_set():
            sizes = {}
            try:
                names = os.listdir(self.d)
            except FileNotFoundError:
                names = []
            for n in names:
                try:
                    sizes[n] = os.path.getsize(os.path.join(self.d, n))
                except FileNotFoundError:
                    pass
            shards = {n: s for n, s in sizes.items() if n.endswith(".distcp") and not n.startswith(".")}
            for n, s in shards.items():
                self.shard_sizes.setdefault(n, set()).add(s)
            if ".metadata" in sizes:
                self.with_metadata.append(shards)
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("save", ["save", "save-nosync"])
def test_distributed_checkpoint_of_four_gloo_ranks_is_loaded_back_and_published_in_order(dataset, short_tmp,
                                                                                          slow_pfs, save):
    """dcp.save by four ranks (a shard each, fsynced or not, then rank 0's .metadata.tmp renamed to
    .metadata), dcp.load in the same job after a barrier, then in a second job from the PFS; .metadata
    on the PFS only once every shard is there whole."""
    ds = dataset(files=20)
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(src)
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=20, open_latency_ms=0)
    ck = os.path.join(str(pfs.mountpoint), "ckpts", "step_500")
    backing = os.path.join(src, "ckpts", "step_500")
    env = monarch_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), OMP_NUM_THREADS=1)
    with Watcher(backing) as watcher:
        r, report = run(short_tmp, ds.root, pfs.mountpoint, DCP, save, ck, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    in_view = json.loads(r.stdout.strip().splitlines()[-1])
    shards = [f"__{k}_0.distcp" for k in range(4)]
    assert sorted(in_view) == [".metadata"] + shards
    on_pfs = digests(backing)
    assert on_pfs == in_view  # the PFS holds what the job read, byte for byte, and nothing else
    final = {n: os.path.getsize(os.path.join(backing, n)) for n in shards}
    assert all(final.values())
    assert watcher.with_metadata, "the watcher never saw .metadata: it polled too slowly to check the order"
    for snapshot in watcher.with_metadata:  # never .metadata before every shard was there complete
        assert snapshot == final, snapshot
    if save == "save":  # an fsync's bytes under the shard's name as it copies them, as a direct fsync leaves them
        assert all(max(watcher.shard_sizes[n]) == s for n, s in final.items()), watcher.shard_sizes
    else:  # closed, never fsynced: never a shard short under its name (W2)
        assert watcher.shard_sizes == {n: {s} for n, s in final.items()}
    assert_published_cleanly(report, short_tmp, src)
    wb = report["nodes"][0]["writeback"]
    assert wb["files_closed"] == wb["files_published"] == 5  # the shards and .metadata.tmp, renamed .metadata
    assert wb["bytes_written"] == sum(os.path.getsize(os.path.join(backing, n)) for n in on_pfs)
    assert wb["syncs"] == (5 if save == "save" else 0)  # DCP fsyncs each of them unless told not to

    env = monarch_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), OMP_NUM_THREADS=1)
    r, _ = run(short_tmp, ds.root, pfs.mountpoint, DCP, "load", ck, env=env, report="load.json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == on_pfs
