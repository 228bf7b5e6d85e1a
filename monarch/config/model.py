"""The validated configuration as frozen dataclasses: what the daemon, the launcher and the plan read.

Field names are the keys' names (``keys.py``; ``tests/unit/config/test_config_keys.py`` holds the two together).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TierConfig:
    name: str
    path: str  # a base directory: Monarch keeps its copies in its own monarch-<uid>/... inside
    capacity: int  # bytes (0 when capacity_share is set)
    keep: bool = False  # keep staged files after the job (reused by the next job)
    capacity_share: float | None = None  # "50%": a share of the node's available memory (tmpfs) or free space
    compression: str = "off"  # off | zstd | auto: store copies compressed (monarch/node/tiers/codecs.py)
    decoded_cache: int = -1  # bytes of decoded files kept for native re-opens; -1 ("room"): the tier's free room


@dataclass(frozen=True)
class DatasetConfig:
    roots: tuple[str, ...]  # canonical: symlinks resolved
    given: tuple[str, ...] = ()  # as configured (absolute), e.g. /scratch/ds when /scratch -> /lustre/scratch
    stores: tuple[tuple[str, str], ...] = ()  # (root as configured, store URL): roots served from a store
    manifest: str = ""  # `monarch index`'s file: the snapshot read from it, not walked ("" : walked)

    def store_urls(self) -> dict[int, str]:
        """root index -> its store's URL, for the roots served from a store."""
        urls = dict(self.stores)
        out = {}
        for k, root in enumerate(self.roots):
            given = self.given[k] if k < len(self.given) else root
            url = urls.get(given) or urls.get(root)
            if url is not None:
                out[k] = url
        return out

    def store_roots(self) -> dict[str, str]:
        """root -> its store's URL, for the roots served from a store."""
        return {self.roots[k]: url for k, url in self.store_urls().items()}

    def spellings(self) -> list[tuple[int, str]]:
        """(root index, path) for every spelling of every root that the shim should match."""
        out = [(k, root) for k, root in enumerate(self.roots)]
        out += [(k, given) for k, given in enumerate(self.given) if given != self.roots[k]]
        return out


@dataclass(frozen=True)
class StagingConfig:
    policy: str = "read-ahead"
    threads: int = 0  # copies in flight toward the sources; 0 ("auto"): adapted to what they give
    resolve_timeout: float = 30.0  # seconds a shim request waits for staging before "read the PFS"
    validate: str = "none"  # "open": compare size and mtime with the PFS at a file's first open in a job
    share: bool = True  # one set of copies per tier for this user's jobs of the same dataset on the node
    linger: float = 600.0  # seconds shared copies outlive the last job using them (0: none)


@dataclass(frozen=True)
class PeerConfig:
    path: str  # a base directory, like TierConfig.path
    capacity: int  # bytes (0 when capacity_share is set)
    timeout: float = 10.0
    replicas: int = 1  # 2: a second copy of each owned file on the node that takes it over on a loss
    capacity_share: float | None = None  # "50%": a share of the node, as for a tier
    fetch_ahead: bool = True  # hinted orders' other nodes' files fetched ahead by the front door


@dataclass(frozen=True)
class WritebackConfig:
    paths: tuple[str, ...] = ()  # absolute, as configured: the shim matches the application's spelling; (): off
    tier: str | None = None  # the tier whose base holds the run's write-back area; None: the first tier
    room: int = 0  # bytes the pending files may take in that tier (0 when room_share is set)...
    room_share: float | None = 0.5  # ...or this share of the tier's capacity
    keep: int = 0  # bytes of published files kept on the node for the next runs (0 when keep_share is set)...
    keep_share: float | None = 1.0  # ...or this share of the room (0 bytes, None: none kept)
    fsync: str = "auto"  # pfs | partner | local | auto (partner on a cluster, pfs on one node): docs/consistency.md

    @property
    def enabled(self) -> bool:
        return bool(self.paths)


@dataclass(frozen=True)
class Config:
    source: str  # where it came from, for messages
    dataset: DatasetConfig
    run_base: str  # a base directory: the run's socket, counters and log go in monarch-<uid>/... inside
    tiers: tuple[TierConfig, ...]
    staging: StagingConfig
    peer: PeerConfig
    report: str | None = None  # JSON report path; default: the run's directory (monarch/layout.py)
    report_html: str | None = None  # HTML report path (monarch run); None: none
    memory_margin: int = 0  # bytes of available memory memory-backed tiers leave to the node...
    memory_margin_share: float | None = 0.10  # ...or this share of its total memory
    filesystem_reserve: int = 0  # bytes of its filesystem every tier leaves free for the application...
    filesystem_reserve_share: float | None = 0.25  # ...or this share of the filesystem's size (0 bytes, None: none)
    peer_given: bool = False  # the file itself has a peer section (the shipped defaults' does not count)
    writeback: WritebackConfig = WritebackConfig()  # the job's writes drained to the PFS (monarch/writeback/)

    def bases(self) -> list[tuple[str, str]]:
        """(key, path) of every base directory configured: Monarch works in monarch-<uid> inside."""
        return ([("run_base", self.run_base)] + [(f"tiers[{i}].path", t.path) for i, t in enumerate(self.tiers)]
                + [("peer.path", self.peer.path)])

    def writeback_tier(self) -> TierConfig:
        """The tier whose base holds the write-back area (its name is checked at load)."""
        name = self.writeback.tier or self.tiers[0].name
        return next(t for t in self.tiers if t.name == name)
