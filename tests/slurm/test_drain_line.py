"""docs/cluster.md's drain line, copied as is, under a private Slurm: a two-node job whose write-back
daemons are SIGKILLed while each node's checkpoint drains to a slow emulated PFS; the line at the
batch script's end publishes each file byte for byte, removes each node's area and exits 0."""

import glob
import json
import os

import pytest

from jobs import job_env, make_job, sbatch, wait_job
from support.harness import REPO

pytestmark = pytest.mark.slurm

MARKER = "<!-- slurm drain line:"
NODES = 2


def drain_line() -> str:
    """docs/cluster.md's drain line, the fenced block after its marker, as is."""
    with open(os.path.join(REPO, "docs", "cluster.md")) as f:
        text = f.read()
    start = text.index("```sh\n", text.index(MARKER)) + len("```sh\n")
    return text[start:text.index("\n```", start)] + "\n"


# each node's task: a 4 MiB checkpoint under the write-back path; once every node's is closed
# (W4 asks the other daemons at each open: none is killed before), its node's daemon SIGKILLed
SAVE = """import hashlib, os, random, signal, sys, time
node, ck, flags = int(os.environ["SLURM_NODEID"]), sys.argv[1], sys.argv[2]
data = random.Random(node).randbytes(4 << 20)
with open(os.path.join(ck, f"model{node}"), "wb") as f:
    f.write(data)
print(f"saved model{node} {hashlib.md5(data).hexdigest()}", flush=True)
open(os.path.join(flags, f"closed{node}"), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(flags)) < int(os.environ["SLURM_NNODES"]) and time.monotonic() < deadline:
    time.sleep(0.05)
with open(os.path.join(os.path.dirname(os.environ["MONARCH_SOCKET"]), "daemon.pid")) as f:
    os.kill(int(f.read().split()[0]), signal.SIGKILL)
"""

SCRIPT = """#!/bin/bash
monarch serve --slurm -c job.yaml &
srun monarch run -c job.yaml -- python save.py {ck} {flags}
echo "saved $?"
kill %1
wait
echo "on the PFS before the drain:" $(ls {src})
{drain}echo "drained $?"
"""


def areas(base: str) -> list[str]:
    return glob.glob(f"/dev/shm{base}/wb*/monarch-{os.getuid()}/writeback-*[0-9]")  # (not what a removed area left beside it)


def test_the_documented_drain_line_publishes_what_killed_daemons_left(slurm, short_tmp, dataset, slow_pfs):
    line = drain_line()
    assert line.startswith("monarch drain --slurm -c job.yaml")
    job = make_job(short_tmp, dataset, slow_pfs, nodes=NODES)
    src, flags = os.path.join(short_tmp, "ck-src"), os.path.join(short_tmp, "flags")
    os.makedirs(src)
    os.makedirs(flags)
    ck = str(slow_pfs(src, writable=True, write_bandwidth_mbps=2, open_latency_ms=0).mountpoint)
    # a tier of its own for the write-back, room for a checkpoint (the job's tiers are a share of a
    # small dataset: a file larger than the room would be written through, W6, nothing left to drain)
    with open(os.path.join(job.dir, "job.yaml")) as f:
        text = f.read()
    wb = f'  - {{name: wb, path: "/dev/shm{job.base}/wb${{MONARCH_NODE}}", capacity: 64MiB}}\n'
    with open(os.path.join(job.dir, "job.yaml"), "w") as f:
        f.write(text.replace("peer: {", wb + "peer: {", 1) + f"writeback: {{paths: [{json.dumps(ck)}], tier: wb}}\n")
    for k in range(NODES):
        os.makedirs(f"/dev/shm{job.base}/wb{k}")
    with open(os.path.join(job.dir, "save.py"), "w") as f:
        f.write(SAVE)
    with open(os.path.join(job.dir, "job.sh"), "w") as f:
        f.write(SCRIPT.format(ck=ck, flags=flags, src=src, drain=line))
    job_id = sbatch(slurm, job, 1, job_env(slurm, MONARCH_MPI_ENGINE="mpich"))
    assert wait_job(slurm, job, job_id, timeout=240) in ("COMPLETED", "GONE"), job.out()
    out = job.out()
    saved = dict(line.split()[1:] for line in out.splitlines() if line.startswith("saved model"))
    assert sorted(saved) == [f"model{k}" for k in range(NODES)], out
    assert "saved 3" in out, out  # monarch run: the daemon was lost before the job's writes were on the PFS
    before = out.split("on the PFS before the drain:")[1].splitlines()[0].split()
    assert sorted(before) != sorted(saved), out  # the daemons were killed mid-drain: something was left
    assert "drained 0" in out, out
    for name, md5 in saved.items():  # each node's checkpoint, byte for byte, under its name
        import hashlib
        with open(os.path.join(src, name), "rb") as f:
            assert hashlib.md5(f.read()).hexdigest() == md5, out
    assert sorted(os.listdir(src)) == sorted(saved), out  # no temporary name left
    assert sum(": published 1 files, 4194304 bytes to the PFS; removed" in x for x in out.splitlines()) \
        == NODES - len([n for n in before if n in saved]), out
    assert areas(job.base) == [], out
