"""What the write-back tests share: a journal as the daemon leaves it for a checkpointing job, and
a job's writable emulated PFS with its configuration."""

import hashlib
import json
import os
import re

from monarch.writeback.area import Area
from monarch.writeback.journal import Journal

RUN = "job1"


def tier_and_pfs(tmp_path):
    """A tier base for the area and a directory standing for the PFS."""
    base, pfs = tmp_path / "tier", tmp_path / "pfs"
    base.mkdir()
    pfs.mkdir()
    return str(base), pfs


def pending(area, journal, seq, path, data, mode=0o640):
    """As the daemon records a closed write-back file: its bytes in the area, then its record."""
    with open(area.data_path(seq), "wb") as f:
        f.write(data)
    return journal.append("close", seq=seq, path=str(path), mode=mode, size=len(data))


def checkpoint_journal(base, pfs):
    """torch.save then a rename, twice, then a marker file: the journal a checkpointing job leaves."""
    area = Area.create(base, RUN, 0)
    j = Journal(area.journal_path, durable=True)
    j.append("mkdir", path=str(pfs / "ck"), mode=0o750)
    blobs = {}
    for k in range(2):
        blobs[f"model{k}"] = os.urandom(300_000 + k)
        pending(area, j, k + 1, pfs / "ck" / f"model{k}.tmp", blobs[f"model{k}"])
        j.append("rename", src=str(pfs / "ck" / f"model{k}.tmp"), dst=str(pfs / "ck" / f"model{k}"))
    blobs["latest"] = b"2\n"
    pending(area, j, 3, pfs / "ck" / "latest", blobs["latest"], mode=0o644)
    j.close()
    area.release()
    return blobs


def writable_pfs_job(short_tmp, root, slow_pfs, mbps, room=None):
    """A writable emulated PFS taking writes at ``mbps`` MB/s with a ``ck`` directory, and a
    configuration (dataset ``root``) whose write-back path is that directory on the mount:
    (the PFS's own directory, ``ck`` on the mount, the configuration's path)."""
    from support.harness import write_config
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(os.path.join(src, "ck"))
    pfs = slow_pfs(src, writable=True, write_bandwidth_mbps=mbps, open_latency_ms=0)
    ck = os.path.join(str(pfs.mountpoint), "ck")
    extra = f", room: {room}" if room else ""
    return src, ck, write_config(short_tmp, root, extra=f"writeback: {{paths: [{json.dumps(ck)}]{extra}}}\n")


def published_tree(d, ignored=(), random_names=None):
    """Every name under ``d`` (a symlink by its target), with its bytes' digest, except the files a
    library stamps with the time or a random id of its save (their names only), and files whose whole
    name it draws at random (that a directory holds some: orbax's OCDBT writes a data file a flush,
    and how many flushes a save takes depends on the writes' timing, directly as under Monarch)."""
    out = {}
    for dp, dns, fns in os.walk(d):
        for name in dns + fns:
            p = os.path.join(dp, name)
            rel = os.path.relpath(p, d)
            if random_names and re.fullmatch(random_names, name):  # (a drain's hidden temporary is not one)
                out[os.path.join(os.path.relpath(dp, d), "<random>")] = "(some)"
            elif os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isdir(p):
                out[rel + "/"] = None
            elif any(name.endswith(i) for i in ignored):
                out[rel] = "(stamped)"
            else:
                with open(p, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def writable_pfs(short_tmp, slow_pfs, mbps=150):
    """A writable emulated PFS (writes at ``mbps`` MB/s, no open latency) over ``short_tmp``/pfs-src:
    that backing directory, and the mount."""
    src = os.path.join(short_tmp, "pfs-src")
    os.makedirs(src)
    return src, slow_pfs(src, writable=True, write_bandwidth_mbps=mbps, open_latency_ms=0)

