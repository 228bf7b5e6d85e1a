"""What one node tells the report: its statistics (one dataclass) and where its files are, by size class."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# left out of the wire form when None: a brief REPORT (progress polls) and a lost daemon's stats have none
_OMITTED_WHEN_NONE = ("timeline", "size_classes")


@dataclass
class NodeStats:
    """One node's statistics: the daemon fills them (``NodeDaemon.stats``), the launcher, its
    progress line and the report read them. They cross the socket (REPORT, JSON) and MPI as
    ``to_dict()``, the report's ``nodes[]`` entry (README, "Report reference"); the figures
    inside each field stay the mappings the stager, the tiers and the shim's counters give."""

    node: int = 0
    host: str = ""
    opened_from: dict[str, dict[str, int]] = field(default_factory=dict)  # per slot: opens, bytes, opens_uncounted
    staging: dict[str, Any] = field(default_factory=dict)  # the stager's files, bytes, pfs_*_read, failures...
    dataset: dict[str, int] = field(default_factory=lambda: {"files": 0, "bytes": 0})
    peer: dict[str, Any] = field(default_factory=dict)
    resolves: dict[str, int] = field(default_factory=dict)  # the daemon's answers by outcome
    tiers: list[dict[str, Any]] = field(default_factory=list)
    tier_errors: dict[str, str] = field(default_factory=dict)
    uptime_seconds: float = 0.0
    snapshot_seconds: float = 0.0
    snapshot: str | None = None  # reused, walked: <why>, failed: <why>, walking
    snapshot_ready_seconds: float | None = None
    snapshot_ready_at: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    decompression: dict[str, int] = field(default_factory=dict)
    # processes in which the shim was active (the counters' EXTRA_PROCESSES); None: not told
    processes_with_shim: int | None = None
    inflated_bytes: int = 0
    front_door: dict[str, Any] | None = None
    cluster: dict[str, Any] = field(default_factory=dict)
    timeline: dict[str, Any] | None = None
    size_classes: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys added on the way (the server's request counts)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NodeStats":
        names = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in d.items() if k in names},
                   extra={k: v for k, v in d.items() if k not in names})

    @classmethod
    def from_wire(cls, d: Any) -> "NodeStats | None":
        """A node's stats as received; None for a lost node (None, or ``{"missing": True}``)."""
        return cls.from_dict(d) if isinstance(d, dict) and d and not d.get("missing") else None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        for name in _OMITTED_WHEN_NONE:
            if out[name] is None:
                del out[name]
        return out | self.extra

# file-size classes of the report: (name, upper bound in bytes, exclusive; None: no bound)
SIZE_CLASSES: tuple[tuple[str, int | None], ...] = (
    ("<64KiB", 64 << 10), ("<1MiB", 1 << 20), ("<16MiB", 16 << 20), (">=16MiB", None))


def _size_class(size: int) -> int:
    for i, (_, bound) in enumerate(SIZE_CLASSES):
        if bound is None or size < bound:
            return i
    return len(SIZE_CLASSES) - 1


def size_classes(files: dict, staged: dict, fetched: set) -> list[dict]:
    """Per file-size class, where the dataset's files are on this node: ``files``/``bytes`` of
    the dataset, ``staged`` per tier, ``peer`` (fetched from the owning node) and
    ``not_staged`` (the application reads them from the PFS).

    ``files``: key -> FileInfo (the snapshot); ``staged``: key -> Tier; ``fetched``: keys in
    the peer area.
    """
    out = [{"class": name, "max_bytes": bound, "files": 0, "bytes": 0, "staged": {},
            "peer": {"files": 0, "bytes": 0}, "not_staged": {"files": 0, "bytes": 0}}
           for name, bound in SIZE_CLASSES]
    for key, info in files.items():
        row = out[_size_class(info.size)]
        row["files"] += 1
        row["bytes"] += info.size
        tier = staged.get(key)
        if tier is not None:
            where = row["staged"].setdefault(tier.name, {"files": 0, "bytes": 0})
        elif key in fetched:
            where = row["peer"]
        else:
            where = row["not_staged"]
        where["files"] += 1
        where["bytes"] += info.size
    return out
