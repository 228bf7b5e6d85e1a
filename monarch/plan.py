"""``monarch plan``: what a cluster of nodes will hold of a dataset, before the job runs.

The capacity model (docs/cluster.md, "Capacity model and placement"):

* A node's storage is its tiers, fastest first, then its peer area: one chain.
* **replicate** when every node can hold the whole dataset (and sharding is not asked for):
  each node stages the files it owns from the PFS and copies the rest from their owners, so
  the PFS is read once and every later read is local.
* **shard** otherwise: every file has one owner (``Placement``: capacity-weighted arcs of a
  hash ring, each node within one file of its share). An owner stages its share into its
  chain from the job's start, pinned; what does not fit stays on the PFS. With
  ``peer.replicas: 2`` the second copy of each file goes to the node that would take it over
  if its owner were lost, in the room the node's own share leaves.
* The sharded read pattern: each epoch one global shuffle split into N disjoint shards,
  node k reads shard k (1/N of the dataset). A file read is local when the reader holds
  it, from a peer when another node does, from the PFS when nobody does.
* Staging time: the slower of two bounds, as for any pipeline of concurrent
  copies: the PFS's bytes at ``--pfs-rate``, and the busiest node's files at a node
  stager's files per second (``FILES_PER_SECOND``, measured; per-file work: open, create,
  write, rename, the books), whatever their size.
* Allocation: a RAM tier (tmpfs) allocates whole 4 KiB pages, so a file takes its size
  rounded up to ``PAGE`` there; the plan fills a memory-backed tier by pages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from monarch.cluster.placement import Placement
from monarch.cluster.ranges import RANGE, owned_bytes
from monarch.routes import staged_by_blocks
from monarch.errors import MonarchError
from monarch.sizes import human


# A node's stager copies at most this many files per second, whatever their size: per-file
# work, not bytes, bounds small files (docs/performance.md, "What the constants rest on").
FILES_PER_SECOND = 3000.0
FILES_PER_SECOND_FROM = ("the default, measured: 1M x 1 KiB files staged at 3,000-4,100 files/s on one "
                         "node; a node's report says its own: staging.files over the staging time")
PAGE = 4096  # a memory-backed tier (tmpfs) allocates whole pages


@dataclass(frozen=True)
class Store:
    """One place of a node's storage chain: a tier or the peer area, with its capacity in bytes;
    ``in_memory``: memory-backed (tmpfs), where a file takes whole ``PAGE``s."""
    name: str
    capacity: int
    in_memory: bool = False


def node_storage(config) -> list[Store]:
    """The chain of one node: the configuration's tiers (a share like ``50%`` read on this
    machine) and its peer area."""
    stores = [Store(t.name, _capacity(config, f"tiers[{i}].capacity", t.path, t.capacity, t.capacity_share),
                    _in_memory(t.path))
              for i, t in enumerate(config.tiers)]
    peer = config.peer
    stores.append(Store("peer", _capacity(config, "peer.capacity", peer.path, peer.capacity, peer.capacity_share)))
    return stores


def _capacity(config, key: str, path: str, capacity: int, share: float | None) -> int:
    """Bytes of a tier or the peer area: its size, or its share of the node read on this machine."""
    from monarch.node.tiers.resources import share_of_node
    if share is None:
        return capacity
    try:
        return share_of_node(path, share)[0]
    except OSError as e:
        raise MonarchError(f"config {config.source}: {key} is {share:.0%} of the node, "
                           f"which cannot be read here ({path}: {e.strerror}); run monarch plan on a compute "
                           "node, or give the capacity as a size") from None


def _in_memory(path: str) -> bool:
    """Is a tier's base memory-backed (read on this machine; a base missing here: by its path)?"""
    from monarch.node.tiers.resources import is_memory_backed
    try:
        return is_memory_backed(path)
    except OSError:
        return path.startswith("/dev/shm")


def synthetic(files: int, size: int) -> Iterable[tuple[str, int]]:
    """``files`` keys of ``size`` bytes, named as the snapshot would name them (root 0)."""
    return ((f"0/train/{i:07d}.jpg", size) for i in range(files))


def _fill(stores: Sequence[Store], amounts: Sequence[int], overhead: float = 1.0) -> list[list[int]]:
    """Put each amount in turn into the chain, fastest place first: bytes per (amount, place).
    A memory-backed place takes ``overhead`` times the bytes (whole pages)."""
    room = [_room(s, overhead) for s in stores]
    out = []
    for amount in amounts:
        row = []
        for k, free in enumerate(room):
            put = min(amount, free)
            room[k] -= put
            amount -= put
            row.append(put)
        out.append(row)
    return out


def _room(store: Store, overhead: float) -> int:
    """The dataset's bytes a place holds: its capacity, or in memory its pages' worth."""
    return int(store.capacity / overhead) if store.in_memory and overhead > 1 else store.capacity


class _LargeApart:
    """The items a file placement takes: the large files (staged by blocks) go to ``large``."""

    def __init__(self, items: Iterable[tuple[str, int]], large: list[tuple[str, int]]):
        self.items, self.large = items, large

    def __iter__(self):
        for key, size in self.items:
            if staged_by_blocks(size):
                self.large.append((key, size))
            else:
                yield key, size


class _Allocated:
    """The items as they go by, counting the bytes they take in whole pages."""

    def __init__(self, items: Iterable[tuple[str, int]]):
        self.items, self.pages = items, 0

    def __iter__(self):
        for key, size in self.items:
            self.pages += -(-size // PAGE)
            yield key, size


def make_plan(items: Iterable[tuple[str, int]], nodes: int, stores: Sequence[Store], *, replicas: int = 1,
              pfs_rate: float | None = None, shard: bool = False, file_rate: float | None = None) -> dict:
    """The plan as a JSON-able dict (every amount in bytes; fractions of the dataset's bytes).
    ``file_rate``: files per second a node's stager copies (default ``FILES_PER_SECOND``)."""
    if nodes < 1:
        raise MonarchError(f"monarch plan: --nodes must be at least 1, got {nodes}")
    capacity = sum(s.capacity for s in stores)
    if capacity <= 0:
        raise MonarchError("monarch plan: the configuration gives a node no storage (every tier and the peer "
                           "area have capacity 0); give a tier a capacity")
    started = time.monotonic()
    counted = _Allocated(items)
    large: list[tuple[str, int]] = []  # staged by blocks: owned by ranges, not whole (cluster/ranges.py)
    placement = Placement.build(_LargeApart(counted, large), [capacity] * nodes)
    shares = placement.shares()
    by_ranges = [sum(owned_bytes(key, n, node, nodes) for key, n in large) for node in range(nodes)]
    shares = [a + b for a, b in zip(shares, by_ranges)]
    size, files = placement.total_bytes + sum(n for _, n in large), len(placement) + len(large)
    allocated = counted.pages * PAGE
    overhead = allocated / size if size and any(s.in_memory for s in stores) else 1.0
    capacity = sum(_room(s, overhead) for s in stores)  # the dataset's bytes a node holds
    replicate = not shard and nodes > 1 and capacity >= size
    second = placement.second_shares() if replicas >= 2 and nodes > 1 and not replicate else [0] * nodes
    build_seconds = time.monotonic() - started

    per_node = []
    for node in range(nodes):
        if replicate:
            primary, kept = size, 0  # everything: its share from the PFS, the rest from its owners
        else:
            primary = min(shares[node], capacity)
            kept = min(second[node], capacity - primary)
        rows = _fill(stores, [primary, kept], overhead)
        # "owns" (bytes, as "owns_bytes") is kept for readers of the earlier JSON
        per_node.append({"node": node, "owns": shares[node], "owns_bytes": shares[node],
                         "owns_files": round(shares[node] * files / size) if size else 0, "holds": primary + kept,
                         "tiers": {s.name: rows[0][k] + rows[1][k] for k, s in enumerate(stores)},
                         "replicas": {"wanted": second[node], "kept": kept},
                         "owned_on_pfs": shares[node] - min(shares[node], capacity)})
    held = size if replicate else sum(p["holds"] - p["replicas"]["kept"] for p in per_node)  # distinct bytes
    return {
        "dataset": {"files": files, "bytes": size},
        "nodes": nodes,
        "node_storage": {"chain": [{"name": s.name, "capacity": s.capacity} for s in stores], "total": capacity},
        "aggregate_storage": capacity * nodes,
        "mode": "replicate" if replicate else "shard",
        "why": _why(replicate, shard, nodes, capacity, size),
        "replicas": replicas,
        "per_node": per_node,
        "tiers": _tier_summary(per_node, stores),
        "pfs_remainder": size - held,
        "epoch": _epoch(per_node, nodes, size, held, replicate),
        "staging": _staging(per_node, nodes, size, files, held, replicate, pfs_rate, file_rate),
        "allocation": {"page": PAGE, "allocated_bytes": allocated, "overhead": overhead,
                       "in_memory": [s.name for s in stores if s.in_memory]},
        "replicas_cost": _replicas_cost(per_node, nodes, capacity, size, replicas, replicate),
        "placement": _placement(placement, shares, size, capacity, per_node, replicas, replicate, build_seconds),
        "large_files": {"files": len(large), "bytes": sum(n for _, n in large), "range_bytes": RANGE,
                        "owned_per_node": by_ranges},
    }


def _why(replicate: bool, shard: bool, nodes: int, capacity: int, size: int) -> str:
    if replicate:
        return (f"every node can hold the whole dataset ({human(capacity)} >= {human(size)}): each node keeps "
                "a full copy, the PFS is read once and every read is local")
    if nodes == 1:
        return "one node: it owns the whole dataset and holds what fits"
    if shard and capacity >= size:
        return "sharded as asked (--shard), although every node could hold the whole dataset"
    return (f"no node can hold the whole dataset ({human(capacity)} < {human(size)}): each node owns a "
            "capacity-weighted share and holds what of it fits")


def _tier_summary(per_node: list[dict], stores: Sequence[Store]) -> list[dict]:
    out = []
    for s in stores:
        amounts = [p["tiers"][s.name] for p in per_node]
        out.append({"name": s.name, "capacity": s.capacity, "mean": sum(amounts) / len(amounts), "max": max(amounts)})
    return out


def _epoch(per_node: list[dict], nodes: int, size: int, held: int, replicate: bool) -> dict:
    """Bytes per epoch of the sharded pattern: node k reads 1/N of the dataset, uniformly at random."""
    read = size / nodes
    rows = []
    for p in per_node:
        own = size if replicate else p["holds"] - p["replicas"]["kept"]
        frac = own / size if size else 0.0
        local = read * frac
        pfs = 0.0 if replicate else read * ((size - held) / size if size else 0.0)
        rows.append({"local": local, "peer": read - local - pfs, "pfs": pfs,
                     "served": 0.0 if replicate else own * (nodes - 1) / nodes})
    mean = {k: sum(r[k] for r in rows) / nodes for k in ("local", "peer", "pfs", "served")}
    return {"read_per_node": read, "mean_per_node": mean,
            "peer_total": sum(r["peer"] for r in rows), "pfs_total": sum(r["pfs"] for r in rows)}


def _staging(per_node: list[dict], nodes: int, size: int, files: int, held: int, replicate: bool,
             pfs_rate: float | None, file_rate: float | None) -> dict:
    """The staging time: the slower of the PFS's bytes at ``pfs_rate`` and the busiest node's
    files at ``file_rate`` (a node's files: the bytes it holds, at the dataset's mean file size)."""
    pfs = size if replicate else held
    peer = size * (nodes - 1) if replicate else sum(p["replicas"]["kept"] for p in per_node)
    rate = file_rate or FILES_PER_SECOND
    node_files = max((round(p["holds"] * files / size) if size else 0 for p in per_node), default=0)
    bytes_seconds = pfs / pfs_rate if pfs_rate else None
    files_seconds = node_files / rate
    return {"pfs_bytes": pfs, "peer_bytes": peer, "pfs_rate": pfs_rate,
            "seconds": max(bytes_seconds, files_seconds) if bytes_seconds is not None else None,
            "bytes_seconds": bytes_seconds, "files_per_node": node_files, "file_rate": rate,
            "file_rate_from": "given" if file_rate else FILES_PER_SECOND_FROM,
            "files_seconds": files_seconds,
            "bound": None if bytes_seconds is None else "files" if files_seconds > bytes_seconds else "bytes"}


def _replicas_cost(per_node: list[dict], nodes: int, capacity: int, size: int, replicas: int,
                   replicate: bool) -> dict:
    """What second copies take: exactly one dataset's bytes over the cluster, ~1/N of it per node."""
    room = sum(capacity - (p["holds"] - p["replicas"]["kept"]) for p in per_node)  # after the owned shares
    wanted = sum(p["replicas"]["wanted"] for p in per_node)
    kept = sum(p["replicas"]["kept"] for p in per_node)
    return {"replicas": replicas,
            "second_copy_bytes": size if nodes > 1 else 0,  # what peer.replicas: 2 needs in all
            "second_copy_per_node": size / nodes if nodes > 1 else 0,
            "room_after_owned": room,
            "second_copy_fits": nodes > 1 and room >= size,
            "wanted": wanted, "kept": kept,
            "kept_fraction": kept / wanted if wanted else (1.0 if replicate else 0.0)}


def _placement(placement: Placement, shares: list[int], size: int, capacity: int, per_node: list[dict],
               replicas: int, replicate: bool, seconds: float) -> dict:
    nodes = len(shares)
    mean = size / nodes
    worst = max(range(nodes), key=shares.__getitem__)
    moved = shares[worst] / size if size else 0.0
    kept = sum(p["replicas"]["kept"] for p in per_node)
    wanted = sum(p["replicas"]["wanted"] for p in per_node)
    held = per_node[worst]["holds"] - per_node[worst]["replicas"]["kept"]
    if replicate:
        only_copy = 0.0  # every survivor holds everything
    elif replicas >= 2 and wanted:
        only_copy = held * (1 - kept / wanted) / size  # a replicated file's new owner already holds it
    else:
        only_copy = held / size if size else 0.0
    return {"scheme": "capacity-weighted arcs of an xxhash64 ring, cut at cumulative bytes",
            "max_share_over_mean": shares[worst] / mean if mean else 1.0,
            "min_share_over_mean": min(shares) / mean if mean else 1.0,
            "moved_on_loss": moved, "moved_on_loss_node": worst,
            "restaged_on_loss": only_copy, "seconds": seconds}


def parse_rate(text: str) -> float:
    """``"10GiB/s"`` or ``"10GiB"`` -> bytes per second."""
    from monarch.config import parse_size
    body = text.strip()
    if body.endswith("/s"):
        body = body[:-2]
    try:
        rate = parse_size(body)
    except ValueError:
        raise MonarchError(f'monarch plan: --pfs-rate: expected a rate like "10GiB/s" (units B, KiB, MiB, GiB, TiB, '
                           f"KB, MB, GB, TB per second), got {text!r}") from None
    if rate <= 0:
        raise MonarchError(f"monarch plan: --pfs-rate must be more than 0, got {text!r}")
    return float(rate)


def format_plan(plan: dict) -> str:
    """The plan for a person: the layout, what a node holds where, an epoch's traffic, staging, placement."""
    d, n = plan["dataset"], plan["nodes"]
    lines = [f"dataset : {d['files']:,} files, {human(d['bytes'])}; {n} nodes, each "
             f"{human(plan['node_storage']['total'])} ("
             + ", ".join(f"{s['name']} {human(s['capacity'])}" for s in plan["node_storage"]["chain"])
             + f"); {human(plan['aggregate_storage'])} in all",
             f"layout  : {plan['mode']}: {plan['why']}"]
    nodes = plan["per_node"]
    if n <= 8:
        for p in nodes:
            lines.append(f"node {p['node']:<3}: owns {human(p['owns_bytes'])} ({p['owns_files']:,} files), "
                         f"holds {human(p['holds'])} ("
                         + ", ".join(f"{k} {human(v)}" for k, v in p["tiers"].items())
                         + (f"; {human(p['replicas']['kept'])} of it second copies" if p["replicas"]["kept"] else "")
                         + (f"); {human(p['owned_on_pfs'])} of its share stays on the PFS" if p["owned_on_pfs"] else ")"))
    else:
        lines.append("per node: " + ", ".join(f"{t['name']} {human(t['mean'])} (fullest {human(t['max'])})"
                                             for t in plan["tiers"]))
    lf = plan.get("large_files") or {}
    if lf.get("files") and n > 1:
        lines.append(f"ranges  : {lf['files']:,} large file{'s' if lf['files'] != 1 else ''} ({human(lf['bytes'])}) "
                     f"owned by {human(lf['range_bytes'])} ranges, each read from the PFS by its owner: "
                     + ", ".join(f"node {k} {human(b)}" for k, b in enumerate(lf["owned_per_node"][:8]))
                     + (", ..." if n > 8 else ""))
    lines.append(f"on PFS  : {human(plan['pfs_remainder'])} ({_pct(plan['pfs_remainder'], d['bytes'])} of the dataset) "
                 "held by no node")
    e = plan["epoch"]
    m = e["mean_per_node"]
    lines.append(f"epoch   : a node reads {human(e['read_per_node'])} (its shard): {_pct(m['local'], e['read_per_node'])} "
                 f"local, {_pct(m['peer'], e['read_per_node'])} from peers, {_pct(m['pfs'], e['read_per_node'])} "
                 f"from the PFS; {human(e['peer_total'])} between nodes, {human(e['pfs_total'])} from the PFS in all")
    s = plan["staging"]
    files_part = (f"{s['files_per_node']:,} files on the busiest node at {s['file_rate']:,.0f} files/s: "
                  f"{_duration(s['files_seconds'])}")
    if s["seconds"] is not None:
        when = (f" = {_duration(s['seconds'])}, the slower of {_duration(s['bytes_seconds'])} for the bytes at "
                f"{human(s['pfs_rate'])}/s and {files_part}")
    else:
        when = f" = at least {_duration(s['files_seconds'])} ({files_part}; give --pfs-rate for the bytes)"
    lines.append(f"staging : {human(s['pfs_bytes'])} from the PFS{when}; {human(s['peer_bytes'])} between nodes")
    lines.append(f"assumed : a node stages {s['file_rate']:,.0f} files/s ({s['file_rate_from']})"
                 + (f"; {human(s['pfs_rate'])}/s from the PFS in all (--pfs-rate)" if s["pfs_rate"] else ""))
    a = plan.get("allocation") or {}
    if a.get("in_memory") and d["bytes"]:
        lines.append(f"alloc   : {', '.join(a['in_memory'])} in memory: a file takes whole {a['page'] // 1024} KiB "
                     f"pages there, the dataset {human(a['allocated_bytes'])} for {human(d['bytes'])} of data "
                     f"(x{a['overhead']:.2f}); the plan fills {'it' if len(a['in_memory']) == 1 else 'them'} by pages")
    r = plan["replicas_cost"]
    if plan["mode"] == "replicate":
        lines.append(f"replicas: every node holds a full copy ({n} copies)")
    elif r["replicas"] >= 2:
        lines.append(f"replicas: 2: second copies want {human(r['wanted'])} ({human(r['wanted'] / n)} per node), "
                     f"{_pct(r['kept'], r['wanted'])} of them fit")
    elif n > 1:
        fits = "fits" if r["second_copy_fits"] else "does not fit"
        lines.append(f"replicas: 1; peer.replicas: 2 would take {human(r['second_copy_per_node'])} more per node "
                     f"({human(r['second_copy_bytes'])} in all): it {fits} in the room the owned shares leave "
                     f"({human(r['room_after_owned'])})")
    pl = plan["placement"]
    took = f"(computing this placement took {pl['seconds']:.1f} s here)"
    if plan["mode"] == "replicate":  # every node holds everything: a loss moves and restages nothing
        lines.append("place   : every node holds the whole dataset: losing a node moves nothing and nothing is "
                     f"restaged from the PFS {took}")
    else:
        lines.append(f"place   : fullest node {pl['max_share_over_mean']:.4f}x the mean share; if node "
                     f"{pl['moved_on_loss_node']} (the largest share) is lost, its {_pct(pl['moved_on_loss'], 1)} of "
                     "the dataset is spread over the others (each re-owns a part; nothing else moves), "
                     f"{_pct(pl['restaged_on_loss'], 1)} of the dataset restaged from the PFS {took}")
    return "\n".join(lines)


def _pct(part: float, whole: float) -> str:
    if not whole:
        return "0%"
    f = 100 * part / whole
    return f"{f:.3g}%"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
