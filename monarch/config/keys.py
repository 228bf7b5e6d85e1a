"""Every configuration key, declared once: its kind, default, one-line doc and check.

One ``Key`` per setting, like UnifyFS's ``UNIFYFS_CFG(section, key, type, default, doc, check)``.
From this list come the defaults (``default_tree``, which ``defaults.yaml`` and
``configs/local.yaml`` are tested against), validation (``load.py`` runs each key's check),
``monarch check-config``'s listing and docs/configuration.md's table (``docs.py``). A new key is one
line here plus its dataclass field (``model.py``, tested) and its line in the YAML files.

A check is ``check(reader, raw_value, where) -> value``: it raises ConfigError saying what is
wrong and how to fix it; the reader (``load._Reader``) does the typed reading and expansion.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from monarch.protocol import ENV_WRITEBACK  # replaces writeback.paths (load.py); the daemon gives the shim its own

POLICIES = ("read-ahead", "on-access", "off")
RENAMED_POLICIES = {"prestage": "read-ahead"}  # older names still accepted, with a warning
RENAMED_KEYS = {"run_dir": "run_base"}  # older top-level key names still accepted, with a warning
VALIDATE_MODES = ("none", "open")
COMPRESSION_MODES = ("off", "zstd", "auto")
FSYNC_MODES = ("auto", "pfs", "partner", "local")
MAX_WRITEBACK_PATHS = 8  # the shim's table of them (MONARCH_MAX_WB, monarch/shim/shim_writeback.h; tested)
REQUIRED = "(required)"  # the default of a tier key every tier must give
TIER_SHARE = "the node (of available memory for a tier on tmpfs/ramfs, else of free space)"
PEER_SHARE = "the node (of available memory for a peer area on tmpfs/ramfs, else of free space)"

Check = Callable[[Any, Any, str], Any]


@dataclass(frozen=True)
class Key:
    path: str  # "staging.policy"; "tiers[].name" for a key of each tier
    kind: str  # what a value looks like, for people: "size", "path", "one of ..."
    default: Any  # as written in defaults.yaml; tiers[]: a tier's value when it leaves the key out
    doc: str  # one line (Markdown) for docs/configuration.md's table
    check: Check
    shipped: tuple = ()  # tiers[] keys: the value of each shipped tier (else ``default`` for each)
    fields: tuple[str, ...] = field(default=())  # dataclass fields the value fills (default: the key's name)
    show: Callable[[Any], str] | None = None  # a checked value as people write it (default: by kind, docs.py)

    def __post_init__(self) -> None:
        if not self.fields:
            object.__setattr__(self, "fields", (self.name,))

    @property
    def section(self) -> str:
        """"" for a top-level key, else the mapping (or ``tiers``) it sits in."""
        return self.path.rsplit(".", 1)[0].removesuffix("[]") if "." in self.path else ""

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def per_tier(self) -> bool:
        return self.section == "tiers"

    def spread(self, value: Any) -> dict[str, Any]:
        """The dataclass fields of a checked value (an amount fills two: bytes and share)."""
        return dict(zip(self.fields, value)) if len(self.fields) > 1 else {self.fields[0]: value}


# -- checks that are more than one reader call ------------------------------------------------

def _policy(r: Any, value: Any, where: str) -> str:
    """An older name is taken as its new one, with a warning that says so."""
    if isinstance(value, str) and value in RENAMED_POLICIES:
        new = RENAMED_POLICIES[value]
        r.warn(where, f"{value!r} is the older name of {new!r}; write {new}")
        return new
    return r.choice(value, where, POLICIES)


def _threads(r: Any, value: Any, where: str) -> int:
    """``auto`` (0: adapted to what the sources give) or a whole number of copies in flight."""
    if value == "auto":
        return 0
    if isinstance(value, str):
        raise r.fail(where, f'expected "auto" or a whole number of copies in flight, got {value!r}')
    return r.number(value, where, int, 1)


def _replicas(r: Any, value: Any, where: str) -> int:
    if isinstance(value, bool) or value not in (1, 2):
        raise r.fail(where, "expected 1 (each file kept by its owner only) or 2 (a second copy on the "
                            f"node that takes the file over when its owner is lost), got {value!r}")
    return int(value)


def _tier_name(r: Any, value: Any, where: str) -> str:
    name = r.string(value, where)
    if name in ("pfs", "peer") or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise r.fail(where, f"{name!r} is not allowed: use letters, digits, '-' or '_', "
                            "and not 'pfs' or 'peer' (report sources)")
    return name


def _decoded_cache(r: Any, value: Any, where: str) -> int:
    """Bytes of decoded files; ``room`` (-1): the tier's free room; ``off`` (or false, 0): none."""
    if value is False or value == "off":
        return 0
    if value == "room":
        return -1
    return r.size(value, where)


_INDEX_MAGIC = b"MNCHINDX"  # an index's first bytes (protocol.INDEX_MAGIC, little-endian)


def _manifest(r: Any, value: Any, where: str) -> str:
    """A file ``monarch index`` wrote ("" for none): it must be there and readable now."""
    text = r.string(value, where) if value not in (None, "") else ""
    if not text:
        return ""
    path = r.path(text, where)
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise r.fail(where, f"{path} is not a readable file; make it with `monarch index ROOT... -o {path}`, "
                            f"or leave dataset.manifest empty (the job walks the dataset)")
    with open(path, "rb") as f:
        if f.read(len(_INDEX_MAGIC)) != _INDEX_MAGIC:  # a list of paths given as it is, say
            raise r.fail(where, f"{path} is no manifest `monarch index` wrote; a list of the files becomes one "
                                f"with `monarch index ROOT -o FILE --from-list {path}`")
    return path


def _stores(r: Any, value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """``{root: store URL}``: roots served from a key-value store (monarch/node/stage/store_source.py)."""
    if value is None or value == {}:
        return ()
    from monarch.store.client import parse_url
    from monarch.store.url import StoreError
    out = []
    for root, url in r.mapping(value, where).items():
        path = r.path(root, f"{where}[{root!r}]")
        text = r.string(url, f"{where}[{root!r}]")
        try:
            parse_url(text)
        except StoreError as e:
            raise r.fail(f"{where}[{root!r}]", str(e)) from None
        out.append((path, text))
    return tuple(out)


def _optional_path(r: Any, value: Any, where: str) -> str | None:
    return None if value is None else r.path(value, where)


def _writeback_paths(r: Any, value: Any, where: str) -> tuple[str, ...]:
    """Existing directories, listed once, none inside another nor overlapping a dataset root (its copies
    would go stale); an entry that expands to nothing (``${CKPT:-}``) is left out. Each problem is
    recorded (``r.get``), so that every wrong entry is said at once."""
    origin = f" (from {ENV_WRITEBACK})" if r.writeback_origin else ""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise r.fail(where + origin, f"expected a list of directories, got {value!r}")
    texts = [(i, r.get(r.string, v, f"{where}[{i}]{origin}")) for i, v in enumerate(value)]
    given = [(i, text) for i, text in texts if text]
    if len(given) > MAX_WRITEBACK_PATHS:
        raise r.fail(where + origin, f"at most {MAX_WRITEBACK_PATHS} directories, got {len(given)}; "
                                     "write back their common parent instead")
    out: list[str] = []
    seen: list[tuple[str, str, str]] = []  # (real path, key, path) of the entries taken so far
    for i, text in given:
        key = f"{where}[{i}]{origin}"
        path = r.get(_writeback_dir, r, value[i], text, key)
        if path is None:
            continue
        real = os.path.realpath(path)
        for root in r.dataset_roots or ():
            if real == root or real.startswith(root + os.sep) or root.startswith(real + os.sep):
                r.error(key, f"{path} overlaps the dataset root {root}: Monarch's copies of the dataset would go "
                             "stale under the job's writes; write back a directory outside the dataset roots")
        for other_real, other_key, other in seen:
            if real == other_real:
                r.error(key, f"{path} is {other_key} again; list each directory once")
            elif real.startswith(other_real + os.sep):
                r.error(key, f"{path} is inside {other_key} ({other}), which covers it already; list only {other}")
            elif other_real.startswith(real + os.sep):
                r.error(key, f"{path} holds {other_key} ({other}), which it covers already; list only {path}")
        seen.append((real, f"{where}[{i}]", path))
        out.append(path)
    return tuple(out)


def _writeback_dir(r: Any, value: Any, text: str, key: str) -> str:
    """The directory ``value`` (``text`` expanded) the job's files are published to: it must exist,
    and be writable by this user, when the job starts (not checked where no job starts: ``check_roots``
    false)."""
    path = r.path(value, key)
    if not r.check_roots:
        return path
    fix = f"check {ENV_WRITEBACK}" if r.writeback_origin else "check the path"
    if not os.path.exists(path):
        shown = path if os.path.isabs(os.path.expanduser(text)) else \
            f"{text} (relative, so taken from the current directory as {path})"
        raise r.fail(key, f"{shown} does not exist; create it before the job starts (mkdir -p {path}) or {fix}")
    if not os.path.isdir(path):
        raise r.fail(key, f"{path} is not a directory; a write-back path is the directory the job writes its "
                          f"files under; {fix}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise r.fail(key, f"{path} is not writable by you (the job's files are published there); fix its "
                          "permissions or choose another directory")
    return path


def _writeback_room(r: Any, value: Any, where: str) -> tuple[int, float | None]:
    room = r.amount(value, where, "the write-back tier's capacity")
    if room == (0, None):
        raise r.fail(where, "0 leaves no room, so every file would be written through to the PFS; give a size or a "
                            "share, or leave writeback.paths empty for no write-back")
    return room


# -- the declarations, in the order of defaults.yaml ------------------------------------------

KEYS: tuple[Key, ...] = (
    Key("dataset.roots", "list of directories", ["${MONARCH_DATASET:-}"],
        "directories whose files Monarch manages; each must exist and be readable "
        "(`monarch run --dataset` replaces them)",
        lambda r, v, k: r.roots(v, k)),
    Key("dataset.stores", "mapping of root to store URL", {},
        "roots served from a key-value store, `{root: redis://host:port/db?prefix=P}` (also `rediss://`, "
        "`unix:///path.sock?db=N`), or from an S3 bucket, `{root: s3://BUCKET/PREFIX}`: such a root needs no "
        "directory; its files come from the store's manifest (`monarch store put`) or the bucket's listing; "
        "see docs/store.md",
        _stores, show=lambda v: ", ".join(f"{root}: {url}" for root, url in v) or "{}"),
    Key("dataset.manifest", "path, or empty", "",
        "the dataset's namespace written once by `monarch index ROOT... -o FILE` (listed as find lists; or from a "
        "list of yours, `--from-list LIST`: a path a line, a TAB and its size optional): a job's "
        "snapshot is read from it instead of a walk, checked against the PFS by one stat per directory: after the "
        "job starts where no tier keeps copies (its metadata the PFS's until then; a directory changed since: for "
        "the whole job), else before (changed: the job walks); never trusted for bytes (docs/consistency.md, 9)",
        lambda r, v, k: _manifest(r, v, k), show=lambda v: v or '"" (walked)'),
    Key("run_base", "path (base directory)", "${TMPDIR:-/tmp}",
        "base directory of the run's own files on this node: socket, counters, daemon log, report "
        "(the 20 newest finished runs are kept, even in a base shared with a tier); a run and a fast-exiting "
        "run leave nothing else in it, in `/dev/shm` or in the tier bases, but what `keep: true` keeps; "
        "a killed run's copies go when its launcher sees the daemon die, or with the next run "
        "(its older name `run_dir` is still read, with a warning)",
        lambda r, v, k: r.path(v, k)),
    Key("tiers[].name", "name", REQUIRED, "the tier's name in the report (not `pfs` or `peer`)",
        _tier_name, shipped=("ram", "ssd")),
    Key("tiers[].path", "path (base directory)", REQUIRED,
        "base directory of its copies; Monarch's directory inside must not overlap a root",
        lambda r, v, k: r.base(v, k), shipped=("/dev/shm", "${MONARCH_SSD:-${TMPDIR:-/tmp}}")),
    Key("tiers[].capacity", "size or share", REQUIRED,
        "bytes Monarch may put there (`B`, `KiB`…`TiB`, `KB`…`TB`), or a share of the node read when the "
        "daemon starts: `50%` of the available memory for a tier on tmpfs/ramfs (`/dev/shm`; of its free space "
        "where that is less), of the free space of its filesystem for a disk tier; an upper bound, never a "
        "promise (`filesystem_reserve`)",
        lambda r, v, k: r.amount(v, k, TIER_SHARE), shipped=("4GiB", "32GiB"),
        fields=("capacity", "capacity_share")),
    Key("tiers[].keep", "true or false", False,
        "keep the copies after the job; the next job adopts the ones still matching the dataset",
        lambda r, v, k: r.boolean(v, k)),
    Key("tiers[].compression", "one of " + ", ".join(COMPRESSION_MODES), "off",
        "`off`, `zstd` (files that shrink by 1.1× or more are stored compressed) or `auto` (as `zstd`, "
        "off when the sample does not shrink); see docs/compression.md",
        lambda r, v, k: r.choice(v, k, COMPRESSION_MODES)),
    Key("tiers[].decoded_cache", "size, room or off", "room",
        "compressing tiers: decoded bytes kept for re-opens at native speed: `room` (the tier's free room), "
        "a size beyond the capacity, or `off`",
        _decoded_cache, show=lambda v: {-1: "room", 0: "off"}.get(v) or f"{v} bytes"),
    Key("staging.policy", "one of " + ", ".join(POLICIES), "read-ahead",
        "`read-ahead` (the dataset in the background from the start, what fits, pinned; demanded files "
        "first; its older name `prestage` is still read, with a warning), `on-access` (a file is staged at "
        "its first open) or `off`",
        _policy),
    Key("staging.threads", "auto or a whole number", "auto",
        "copies in flight toward the PFS, by the front door's read-ahead lane and misses and by the "
        "stager alike: `auto` follows the PFS's measured latency between 4 and 256 (doubling while it "
        "stays flat: 128 in flight 0.2 s into a 50 ms PFS), or a fixed number",
        _threads, show=lambda v: "auto" if v == 0 else str(v)),
    Key("staging.resolve_timeout", "seconds", 30,
        "seconds an open waits for its file to be staged before reading the PFS",
        lambda r, v, k: r.number(v, k, float, 0.1)),
    Key("staging.validate", "one of " + ", ".join(VALIDATE_MODES), "none",
        "`none` (the dataset is assumed unchanged during the job) or `open` (at a file's first open in a "
        "job, compare size and mtime with the PFS; serve the copy only if they match)",
        lambda r, v, k: r.choice(v, k, VALIDATE_MODES)),
    Key("staging.share", "true or false", True,
        "jobs of this user on this node whose datasets are the same share one set of copies per tier: "
        "each file is read from the PFS once for all of them, the tiers hold one copy, and each copy is "
        "served only when it is the file the job's snapshot saw; `false`: this job stages privately "
        "(docs/sharing.md)",
        lambda r, v, k: r.boolean(v, k)),
    Key("staging.linger", "seconds", 600,
        "shared copies stay this long after the last job using them ends, for the next job of a chain "
        "(`0`: removed when the last job ends); `monarch cache drop --expired` removes those past it",
        lambda r, v, k: r.number(v, k, float, 0)),
    Key("memory_margin", "size or share", "10%",
        "a tier on tmpfs/ramfs never takes a file that would leave the node less available memory than "
        "this (a size, or a share of total memory); the file goes to the next tier, and the report counts "
        "it as the tier's `refused.memory_margin`",
        lambda r, v, k: r.amount(v, k, "the node's total memory"),
        fields=("memory_margin", "memory_margin_share")),
    Key("filesystem_reserve", "size or share", "25%",
        "every tier (and the peer area) leaves at least this much of its filesystem free for the application "
        "(a size, or a share of that filesystem's size; `0`: none): a copy that would leave less goes to the next "
        "tier, counted as the tier's `refused.filesystem_reserve`, and a capacity beyond the filesystem's size less "
        "the reserve is cut to it; a container's 64 MiB `/dev/shm` keeps room for the application's semaphores "
        "and shared memory",
        lambda r, v, k: r.amount(v, k, "the tier's filesystem's size"),
        fields=("filesystem_reserve", "filesystem_reserve_share")),
    Key("writeback.paths", "list of directories", [],
        "directories under which a file the job creates or truncates lands in the write-back tier and drains to the "
        "PFS, published whole and in the job's order (docs/consistency.md, \"Write-back\"); each must exist and be "
        "writable when the job starts, outside the dataset roots, listed once and none inside another (an entry "
        f"that expands to nothing is left out); `{ENV_WRITEBACK}=DIR[:DIR]` replaces them; `[]`: no write-back",
        _writeback_paths, show=lambda v: ", ".join(v) or "[] (no write-back)"),
    Key("writeback.tier", "tier name or null", None,
        "the tier whose base holds the run's pending files and their journal (`null`: the first tier); a RAM tier "
        "loses them if the node reboots, a disk tier keeps them for `monarch drain`",
        lambda r, v, k: None if v is None else r.string(v, k),
        show=lambda v: "null (the first tier)" if v is None else v),
    Key("writeback.room", "size or share", "50%",
        "bytes the files pending write-back may take in that tier, or a share of its capacity: a writer waits for "
        "the drain when it is full, and a larger file is written through to the PFS",
        _writeback_room, fields=("room", "room_share")),
    Key("writeback.keep", "size or share", "100%",
        "bytes of the files the job published kept on the node after the run as checked copies of the PFS files, "
        "the newest first, or a share of `writeback.room` (they leave it first when the job's own writes need it): "
        "the same user's next run reads them from here while the PFS file is unchanged (a restart's checkpoint: "
        "docs/consistency.md, \"Kept copies\"); on a cluster the partner keeps its copies too, and the nodes read "
        "each other's; `0`: none kept; `monarch cache ls` and `drop` show and free them",
        lambda r, v, k: r.amount(v, k, "writeback.room"), fields=("keep", "keep_share")),
    Key("writeback.fsync", "one of " + ", ".join(FSYNC_MODES), "auto",
        "`pfs`: an fsync of a write-back file returns once its bytes so far are on the PFS; `partner`: once its "
        "local copy is flushed and another node's daemon holds them too (each closed file as well), so that a lost "
        "node loses nothing it closed or fsynced; `local`: once its local copy is flushed; `auto`: `partner` on a "
        "cluster of two or more nodes, `pfs` on one (docs/consistency.md, \"What survives\")",
        lambda r, v, k: r.choice(v, k, FSYNC_MODES)),
    Key("peer.path", "path (base directory)", "${MONARCH_SSD:-${TMPDIR:-/tmp}}",
        "cluster only: the base directory for files fetched from peers",
        lambda r, v, k: r.base(v, k)),
    Key("peer.capacity", "size or share", "32GiB",
        "cluster only: bytes of files fetched from peers kept there, or a share of the node as for a tier",
        lambda r, v, k: r.amount(v, k, PEER_SHARE), fields=("capacity", "capacity_share")),
    Key("peer.timeout", "seconds", 10, "cluster only: how long to wait for a peer",
        lambda r, v, k: r.number(v, k, float, 0.1)),
    Key("peer.replicas", "1 or 2", 1,
        "cluster only, sharded: `2` keeps a second copy of each owned file, in the tiers' room its own share "
        "leaves, on the node that takes it over when its owner is lost (`monarch plan` shows the cost)",
        _replicas),
    Key("peer.fetch_ahead", "true or false", True,
        "cluster only, sharded: with order hints (`monarch.hints`), the front door also fetches the other "
        "nodes' files of the coming order ahead of the reader into the peer area, many per request, so that "
        "the reader's opens of them are local hits; `false`: hints steer only this node's own files "
        "(docs/cluster.md, \"The readers' order\")",
        lambda r, v, k: r.boolean(v, k)),
    Key("report", "path or null", None,
        "JSON report path (`null`: the run's directory, `<run_base>/monarch-<uid>/<run>-node<N>/report.json`)",
        _optional_path),
    Key("report_html", "path or null", None,
        "also write the report as an HTML page there (`monarch run --report-html` overrides)",
        _optional_path),
)

TIER_KEYS = tuple(k for k in KEYS if k.per_tier)
SHIPPED_TIERS = max(len(k.shipped) for k in TIER_KEYS)


def section_keys(section: str) -> tuple[Key, ...]:
    return tuple(k for k in KEYS if k.section == section)


def shipped_tiers() -> list[dict[str, Any]]:
    """The shipped tiers as written in defaults.yaml."""
    return [{k.name: copy.deepcopy(k.shipped[i] if k.shipped else k.default) for k in TIER_KEYS}
            for i in range(SHIPPED_TIERS)]


def default_tree() -> dict[str, Any]:
    """The defaults as the YAML mapping that ``defaults.yaml`` holds (a fresh copy)."""
    tree: dict[str, Any] = {}
    for key in KEYS:
        if key.per_tier:
            tree.setdefault("tiers", shipped_tiers())
            continue
        *parents, name = key.path.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = copy.deepcopy(key.default)
    return tree
