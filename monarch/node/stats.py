"""What one node tells the report, gathered: the shim's counters read into their slice, and
where the node's files are, by size class. The record they fill is ``NodeStats``
(``monarch/records/node_stats.py``)."""

from __future__ import annotations

import itertools
from typing import Mapping, Sequence

from monarch import protocol
from monarch.writeback.rawsys import raw_calls
from monarch.node.snapshot.indextable import file_sizes
from monarch.node.stage.staged_table import StagedTable
from monarch.records.node_stats import ShimCounters


def shim_counters(counters_path: str, slot_names: dict[int, str], roots: Sequence[str]) -> ShimCounters:
    """The shim's slice of a node's statistics, read from the counters the application's
    processes share: ``opened_from`` (per slot an open was served from), ``metadata`` (stat
    and listings answered here or by the PFS, the roots whose metadata the job turned off,
    the opens and metadata calls sent to the PFS before the index was written or because
    the daemon was lost),
    ``decompression`` (compressed copies the shim decoded itself: shim_zstd.c), ``block_reads``
    (what descriptors of files staged by blocks read from their copies and from the PFS),
    ``processes_with_shim`` and ``view`` (what the application's view lacked of the daemon's:
    the shim's fallbacks, the roots that named other files for it, the processes that made a
    call under a root: monarch/shim/shim_view.c)."""
    opened_from = protocol.read_opened_from(counters_path, slot_names)
    try:
        counters = protocol.read_extra_counters(counters_path)
    except (OSError, ValueError):
        counters = (0,) * protocol.EXTRA_WORDS
    off = counters[protocol.EXTRA_META_OFF]
    return {
        "opened_from": opened_from,
        "metadata": {"local": counters[protocol.EXTRA_META_LOCAL], "pfs": counters[protocol.EXTRA_META_PFS],
                     "off_roots": [k for k in range(len(roots)) if off & (1 << min(k, 63))],
                     "before_index": {"opens": counters[protocol.EXTRA_EARLY_OPENS],
                                      "metadata": counters[protocol.EXTRA_EARLY_META]},
                     "daemon_lost": {"opens": counters[protocol.EXTRA_LOST_OPENS],
                                     "metadata": counters[protocol.EXTRA_LOST_META]}},
        "decompression": {"opens": counters[protocol.EXTRA_ZSTD_OPENS], "ns": counters[protocol.EXTRA_ZSTD_NS],
                          "bytes": counters[protocol.EXTRA_ZSTD_BYTES],
                          "left_to_daemon": counters[protocol.EXTRA_ZSTD_FALLBACKS],
                          "reused": counters[protocol.EXTRA_ZSTD_REUSED]},
        "block_reads": {"opens": counters[protocol.EXTRA_BLOCK_OPENS],
                        "local_bytes": counters[protocol.EXTRA_BLOCK_LOCAL_BYTES],
                        "pfs_bytes": counters[protocol.EXTRA_BLOCK_PFS_BYTES],
                        "remapped_bytes": counters[protocol.EXTRA_BLOCK_REMAPPED_BYTES],
                        "faults_held": counters[protocol.EXTRA_BLOCK_FAULTS_HELD],
                        "fault_wait_ns": counters[protocol.EXTRA_BLOCK_FAULT_WAIT_NS],
                        "faults_late": counters[protocol.EXTRA_BLOCK_FAULTS_LATE],
                        "faults_pages": counters[protocol.EXTRA_BLOCK_FAULTS_PAGES]},
        "processes_with_shim": counters[protocol.EXTRA_PROCESSES],
        # system calls made without libc that the shim answered, and the threads it paused in a
        # compute runtime (monarch/shim/shim_rawthreads.c)
        "raw_calls": {"answered": counters[protocol.EXTRA_RAW_CALLS], "ns": counters[protocol.EXTRA_RAW_NS],
                      "paused": counters[protocol.EXTRA_RAW_PAUSES],
                      "by_call": raw_calls(counters, protocol.EXTRA_RAW_BY_CALL, protocol.RAW_NRS)},
        "view": {"fallbacks": counters[protocol.EXTRA_FALLBACKS],
                 "roots_elsewhere": [root for k, root in enumerate(roots)
                                     if counters[protocol.EXTRA_ROOTS_ELSEWHERE] & (1 << min(k, 63))],
                 "processes_at_roots": counters[protocol.EXTRA_ROOT_PROCESSES]},
    }


# file-size classes of the report: (name, upper bound in bytes, exclusive; None: no bound)
SIZE_CLASSES: tuple[tuple[str, int | None], ...] = (
    ("<64KiB", 64 << 10), ("<1MiB", 1 << 20), ("<16MiB", 16 << 20), (">=16MiB", None))


def _size_class(size: int) -> int:
    for i, (_, bound) in enumerate(SIZE_CLASSES):
        if bound is None or size < bound:
            return i
    return len(SIZE_CLASSES) - 1


def size_classes(files: Mapping, staged: Mapping, fetched: set, by_blocks: Mapping[str, int] | None = None) -> list[dict]:
    """Per file-size class, where the dataset's files are on this node: ``files``/``bytes`` of
    the dataset, ``staged`` per tier, ``peer`` (fetched from the owning node), ``by_blocks``
    (large files served from blocks staged in a tier, not yet a whole copy: ``bytes`` staged
    of their ``of_bytes``) and ``not_staged`` (nothing of them staged: the application reads
    them from the PFS). Each file is in one place.

    ``files``: key -> FileInfo (the snapshot); ``staged``: key -> Tier (a StagedTable over an
    index is read by rows: no key looked up or decoded); ``fetched``: keys in the peer area;
    ``by_blocks``: key -> bytes of its staged blocks (``BlockStager.held``).
    """
    by_blocks = by_blocks or {}
    out = [{"class": name, "max_bytes": bound, "files": 0, "bytes": 0, "staged": {},
            "peer": {"files": 0, "bytes": 0}, "by_blocks": {"files": 0, "bytes": 0, "of_bytes": 0},
            "not_staged": {"files": 0, "bytes": 0}}
           for name, bound in SIZE_CLASSES]
    tiers = staged.tiers_of(files) if isinstance(staged, StagedTable) else (staged.get(key) for key in files)
    keys = iter(files) if fetched or by_blocks else itertools.repeat(None)
    for size, tier, key in zip(file_sizes(files), tiers, keys):
        row = out[_size_class(size)]
        row["files"] += 1
        row["bytes"] += size
        if tier is not None:
            where = row["staged"].setdefault(tier.name, {"files": 0, "bytes": 0})
        elif key in fetched:
            where = row["peer"]
        elif by_blocks.get(key):
            where = row["by_blocks"]
            where["of_bytes"] += size
            size = by_blocks[key]
        else:
            where = row["not_staged"]
        where["files"] += 1
        where["bytes"] += size
    return out

