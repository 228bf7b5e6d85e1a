"""Node-local storage tiers: a private directory with a capacity, and the accounts for it.

Space is reserved before a copy starts and released if it fails, so concurrent
stagers never overfill a tier. Nothing is ever evicted (pin, don't thrash). A compressing
tier also keeps a bounded decoded working set (``DecodedFiles``): decoded copies of its
compressed copies, at the path the shim probes, so a re-opened file is opened natively. A tier whose
filesystem runs out of space (ENOSPC, EDQUOT) is marked full and not tried again; a tier in
memory (tmpfs) refuses a copy that would cross the node's memory margin, and any tier one that
would leave its filesystem less free than the application's reserve (``filesystem_reserve``:
its capacity is also at most the filesystem's size less that reserve). Every refusal is
counted by its reason (``REFUSED_*``), for the report.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import threading
from typing import Callable

from monarch.node.tiers import remover
from monarch.node.tiers.codecs import DICT_DIR, Codec, make_codec
from monarch.config import TierConfig
from monarch.layout import MARKER, KEEP_LOCK, StorageDir
from monarch.node.tiers.resources import (FilesystemGuard, MemoryGuard, allocated_size, allocation_unit,
                                          filesystem_size, is_memory_backed, reserve_bytes, share_of_node)
from monarch.secure import create_exclusive, owner_only
from monarch.sizes import human
from monarch.node.snapshot.snapshot import FileInfo

log = logging.getLogger(__name__)

TMP_PREFIX = ".monarch-tmp-"
COMPRESSED_DIR = ".z"  # compressed copies: <tier>/.z/<key>, where the shim's probe of <tier>/<key> does not look
BLOCKS_DIR = ".blocks"      # a large file staged by blocks (node/stage/blocks.py): <tier>/.blocks/<key>,
BLOCKMAP_DIR = ".blockmap"  # and its map <tier>/.blockmap/<key>; a whole one is linked at <tier>/<key>
# The map's format is node/stage/block_map.py's; these are what a shared set's ledger reads of it
# (shared_set.py): a map of this format says the room of the ledger its copy holds
BLOCKMAP_MAGIC = 0x50414D4B434F4C42  # "BLOCKMAP"
BLOCKMAP_VERSION = 10
BLOCKMAP_ROOM_OFFSET = 112
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
REFUSED_FULL = "full"                        # its capacity would be exceeded
REFUSED_MEMORY_MARGIN = "memory_margin"      # the node's available memory would drop below the margin
REFUSED_FILESYSTEM_FULL = "filesystem_full"  # its filesystem said ENOSPC/EDQUOT once
REFUSED_FILESYSTEM_RESERVE = "filesystem_reserve"  # its filesystem would keep less free than the application's reserve


class Tier:
    """Capacity is accounted in what the filesystem allocates for the copies: each copy's
    stored size rounded up to the tier's allocation ``unit`` (``allocated``: blocks on a
    disk, pages on tmpfs, where a 1 KiB file takes 4 KiB of the node's memory), so that a
    tier in RAM never takes more of the node than its capacity. ``stored`` counts the bytes
    of the copies, ``logical`` the bytes they hold for the application (a compressed copy
    stores fewer), ``allocated_bytes`` what the copies take.

    ``room`` is what is taken out of the capacity, and decides whether a copy fits: the
    copies' allocation and ``reserved``, room taken that holds no copy yet (reserved for
    copies being written, lent ahead to the front door: ``reserve(counted=False)``).
    ``stored`` is the bytes of the copies the tier holds, what the report and its timeline
    call the tier's ``used`` (bytes in the tier: docs/report.md); ``used`` adds the
    room reserved. ``reserve`` and ``release`` take room (callers round a file's size with
    ``allocated``); ``committed``, ``forget`` and ``shrunk`` take the copies' bytes and
    round them here."""

    def __init__(self, name: str, storage: StorageDir, capacity: int, slot: int,
                 memory: MemoryGuard | None = None, codec: Codec | None = None, unit: int | None = None,
                 filesystem: FilesystemGuard | None = None):
        self.name, self.storage, self.capacity, self.slot = name, storage, capacity, slot
        self.path = storage.path
        # learnt once: what the filesystem allocates at a time (resources.allocated_size says what is left out)
        self.unit = unit if unit is not None else allocation_unit(self.path)
        self.memory = memory  # set for a tier in RAM: it keeps the node's memory margin
        self.filesystem = filesystem  # set with a filesystem_reserve: it keeps the application's room free
        self.at_capacity = REFUSED_FULL  # why a copy past the capacity is refused: the reserve, where it cut it
        self.capacity_note = ""  # how a capacity given as a share, or cut to the reserve, was resolved
        self.codec = codec
        self.decoded: DecodedFiles | None = None  # decoded copies of compressed ones (set_decoded_cache)
        self._room = 0
        self._lock = threading.Lock()
        self.files = 0
        self.logical = 0
        self.stored = 0
        self.allocated_bytes = 0  # what the copies take on the filesystem: each stored size rounded up to ``unit``
        self._compressed: set[str] = set()  # keys whose copy is a zstd frame under COMPRESSED_DIR
        self.full_reason: str | None = None  # set once the filesystem refused a copy
        self.refused: collections.Counter[str] = collections.Counter()
        self.last_refusal: str | None = None

    @classmethod
    def from_config(cls, cfg: TierConfig, slot: int, run_id: str, node: int, roots: tuple[str, ...],
                    memory_margin: int | None = None, pfs_rate=lambda: None, dataset_bytes=lambda: 0,
                    filesystem_reserve: tuple[int, float | None] | None = None) -> "Tier":
        """The tier of ``cfg``; in memory (tmpfs, ramfs) it keeps ``memory_margin`` bytes free;
        on any filesystem, ``filesystem_reserve`` (bytes, or a share of its size; None or 0: none)."""
        storage = StorageDir.create(cfg.path, run_id, node, keep_name=cfg.name if cfg.keep else None, roots=roots)
        try:
            return cls._on(storage, cfg, slot, memory_margin, pfs_rate, dataset_bytes, filesystem_reserve)
        except BaseException:  # the tier is not used: its directory does not stay
            storage.remove()
            raise

    @classmethod
    def _on(cls, storage: StorageDir, cfg: TierConfig, slot: int, memory_margin: int | None, pfs_rate,
            dataset_bytes, filesystem_reserve: tuple[int, float | None] | None = None) -> "Tier":
        in_memory = is_memory_backed(storage.path)
        capacity, note = cfg.capacity, ""
        if cfg.capacity_share is not None:
            capacity, whole = share_of_node(storage.path, cfg.capacity_share)
            note = f"{cfg.capacity_share:.0%} of {whole}"
            log.info("tier %s: capacity %d bytes (%s)", cfg.name, capacity, note)
        guard = MemoryGuard(memory_margin) if in_memory and memory_margin is not None else None
        kept_free, at_capacity = None, REFUSED_FULL
        if filesystem_reserve is not None and (filesystem_reserve[0] > 0 or filesystem_reserve[1] is not None):
            keep, whence = reserve_bytes(storage.path, *filesystem_reserve)
            kept_free = FilesystemGuard(storage.path, keep, whence)
            kept_free.read_at_start(cfg.name)  # no room beyond the reserve: said now, by the launcher, in the report
            # the configured capacity is an upper bound: never more than the filesystem holds beside the reserve
            most = max(0, filesystem_size(storage.path) - keep)
            if capacity > most:
                capacity, at_capacity = most, REFUSED_FILESYSTEM_RESERVE
                note = (f"{note or human(cfg.capacity) + ' configured'}, cut to its filesystem's size less the "
                        f"reserve, {whence}")
                log.info("tier %s: capacity %d bytes (%s)", cfg.name, capacity, note)
        # the codec's level: the fastest whose ratio fits the dataset (dataset_bytes, once known) in the tier
        needed = lambda: dataset_bytes() / capacity if capacity > 0 and dataset_bytes() else None  # noqa: E731
        codec = make_codec(cfg.compression, pfs_rate, needed, os.path.join(storage.path, COMPRESSED_DIR, DICT_DIR))
        tier = cls(cfg.name, storage, capacity, slot, memory=guard, codec=codec, filesystem=kept_free)
        tier.capacity_note, tier.at_capacity = note, at_capacity
        if tier.codec is not None and cfg.decoded_cache != 0:
            tier.set_decoded_cache(cfg.decoded_cache)
        return tier

    def set_decoded_cache(self, budget: int) -> None:
        """Keep decoded copies of this tier's compressed copies for re-opens (``DecodedFiles``):
        ``budget`` bytes (beyond the capacity), or -1: the tier's free room (capacity less the
        room taken; the decoded set shrinks as copies fill the tier). A tier in RAM also
        keeps the node's memory margin, and every tier its filesystem's reserve."""
        room = (lambda: max(0, self.capacity - self._room)) if budget < 0 else (lambda: budget)
        self.decoded = DecodedFiles(self.path, room, lambda size: self._guards_refuse(size) is None, self.allocated)

    def _guards_refuse(self, size: int) -> str | None:
        """None if the memory margin and the filesystem's reserve allow ``size`` more bytes
        (then taken from both), else the reason of the one that refuses."""
        if self.memory is not None and not self.memory.allows(size):
            return REFUSED_MEMORY_MARGIN
        if self.filesystem is not None and not self.filesystem.allows(size):
            if self.memory is not None:
                self.memory.not_taken(size)
            return REFUSED_FILESYSTEM_RESERVE
        return None

    def _headroom(self, default: int) -> int:
        """What the filesystem's reserve leaves to take now (``default`` without one). A cached
        reading: no system call per file."""
        return self.filesystem.headroom() if self.filesystem is not None else default

    @property
    def keep(self) -> bool:
        return self.storage.kept

    @property
    def room(self) -> int:
        """Room taken out of the capacity: ``allocated_bytes`` and ``reserved``."""
        return self._room

    @property
    def used(self) -> int:
        """The bytes of the copies (``stored``) and the room reserved or lent that holds no copy yet."""
        return self.stored + self.reserved

    @property
    def reserved(self) -> int:
        """Room taken that holds no copy (yet): copies being written, room lent to the front door."""
        return self._room - self.allocated_bytes

    def allocated(self, size: int) -> int:
        """The room a copy of ``size`` stored bytes takes in this tier (its allocation)."""
        return allocated_size(size, self.unit)

    def path_for(self, key: str) -> str:
        """Where a raw copy of ``key`` is (the path the shim probes)."""
        return os.path.join(self.path, key)

    def compressed_path_for(self, key: str) -> str:
        return os.path.join(self.path, COMPRESSED_DIR, key)

    def is_compressed(self, key: str) -> bool:
        return key in self._compressed

    def copy_path(self, key: str) -> str:
        """Where the copy of ``key`` this tier holds is, compressed or raw."""
        return self.compressed_path_for(key) if key in self._compressed else self.path_for(key)

    def fits(self, size: int) -> bool:
        """Could a file of ``size`` logical bytes fit now (compressed tiers: as expected from
        the ratio so far)?"""
        need = self.codec.estimate(size) if self.codec is not None and self.codec.wants(size) else size
        return self.has_room(self.allocated(need))

    def has_room(self, room: int) -> bool:
        """Could ``room`` (an allocation: ``allocated``) be reserved now?"""
        return self.full_reason is None and self._room + room <= self.capacity and room <= self._headroom(room)

    def free_room(self) -> int:
        """The most room ``has_room`` would say yes to now."""
        left = max(0, self.capacity - self._room)
        return min(left, self._headroom(left)) if self.full_reason is None else 0

    def reserve(self, size: int, counted: bool = True, written: bool = False) -> bool:
        """Room for ``size`` bytes of allocation (a copy's: ``allocated(stored size)``), taken
        now (False: none; a refusal is counted and said once per reason, unless ``counted``
        is False: room lent ahead, not a file). ``written``: for bytes already on the tier's
        filesystem (a copy someone else made), so only the capacity can refuse: a filesystem
        full since, the memory margin or the filesystem's reserve would only lose a copy that
        costs nothing more."""
        with self._lock:
            guarded = None  # a refusal by the node's memory or the filesystem's free space, read now
            if self.full_reason is not None and not written:
                reason = REFUSED_FILESYSTEM_FULL
            elif self._room + size > self.capacity:
                reason = self.at_capacity
            elif not written and (guarded := self._guards_refuse(size)) is not None:
                reason = guarded
            else:
                self._room += size
                if self.decoded is not None:  # the room a "room" budget gives decoded copies shrank
                    self.decoded.trim()
                return True
            if reason == REFUSED_MEMORY_MARGIN and self.last_refusal != reason:
                log.warning("tier %s: stops taking files at %d bytes: the node's available memory would drop "
                            "below the margin of %d bytes (memory_margin in the configuration)",
                            self.name, self._room, self.memory.margin)
            elif reason == REFUSED_FILESYSTEM_RESERVE and self.last_refusal != reason and self.filesystem is not None:
                log.warning("tier %s: stops taking files at %d bytes: its filesystem would keep less free than the "
                            "application's reserve of %d bytes, %s", self.name, self._room, self.filesystem.reserve,
                            self.filesystem.whence)
            if counted:
                self.refused[reason] += 1
                self.last_refusal = reason
            elif guarded is not None:
                # the node's memory or the application's room, whoever asked: room the front door was
                # to be lent is refused once for the many files it then copies into the next tier
                self.last_refusal = reason
            return False

    def release(self, size: int) -> None:
        with self._lock:
            self._room -= size

    def mark_full(self, reason: str) -> None:
        with self._lock:
            self.full_reason = reason
            self.last_refusal = REFUSED_FILESYSTEM_FULL  # it takes no more: said even if no copy is offered after

    def committed(self, logical: int = 0, stored: int = 0, key: str | None = None, compressed: bool = False) -> None:
        """A copy of ``logical`` bytes, taking ``stored`` bytes (``allocated(stored)`` of the
        room reserved for it), was published (under the stager's lock when ``key`` is given:
        ``is_compressed`` must agree with the file)."""
        with self._lock:
            self.files += 1
            self.logical += logical
            self.stored += stored
            self.allocated_bytes += self.allocated(stored)
            if compressed and key is not None:
                self._compressed.add(key)

    def committed_many(self, files: int, nbytes: int, allocated: int) -> None:
        """``committed(size, size)`` for ``files`` raw copies of ``nbytes`` in all, taking
        ``allocated`` (the sum of each one's ``allocated(size)``)."""
        with self._lock:
            self.files += files
            self.logical += nbytes
            self.stored += nbytes
            self.allocated_bytes += allocated

    def shrunk(self, saved: int, old: int | None = None) -> None:
        """A copy of ``old`` stored bytes was rewritten ``saved`` bytes smaller (re-encoded at
        the chosen level); the room its allocation no longer takes is released. ``old``
        unknown: ``saved`` rounded down to the unit, never more than was freed (a copy
        ``k`` units smaller takes at least ``k`` units less), so the account never falls
        below what the filesystem holds."""
        freed = (self.allocated(old) - self.allocated(old - saved) if old is not None
                 else saved // self.unit * self.unit)
        with self._lock:
            self._room -= freed
            self.allocated_bytes -= freed
            self.stored -= saved

    def forget(self, key: str, logical: int, stored: int) -> None:
        """The copy of ``key`` was deleted (its room, ``allocated(stored)``, is released separately)."""
        with self._lock:
            self.files -= 1
            self.logical -= logical
            self.stored -= stored
            self.allocated_bytes -= self.allocated(stored)
            self._compressed.discard(key)

    def adopt_existing(self, files: dict[str, FileInfo]) -> list[str]:
        """Count the copies a kept tier holds from a previous run on this dataset; remove
        the ones that no longer match the snapshot (size and mtime), partial ones, and
        whatever is not a regular file (a symlink, a FIFO). One listing per directory and one
        lstat per regular file (scandir's types): a kept tier of a million copies is a
        million of them, where os.walk with lstat, isfile and islink took three stats and
        ~35 us of CPU per copy (10 us now)."""
        adopted = []
        pending = [("", self.path)]
        while pending:
            prefix, directory = pending.pop()
            try:
                listing = os.scandir(directory)
            except OSError:
                continue
            with listing:
                for entry in listing:
                    name = entry.name
                    if not prefix and name in (MARKER, KEEP_LOCK):
                        continue
                    key = prefix + name
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append((key + "/", entry.path))
                            continue
                        info = files.get(key)
                        fresh = (info is not None and entry.is_file(follow_symlinks=False)
                                 and not name.startswith(TMP_PREFIX)
                                 and info.same_content_as(entry.stat(follow_symlinks=False)))
                        # (its bytes are on the filesystem already: only the capacity may refuse it)
                        if fresh and self.reserve(self.allocated(info.size), written=True):
                            self.committed(info.size, info.size)
                            adopted.append(key)
                        else:
                            os.unlink(entry.path)
                    except OSError:
                        continue
        return adopted

    def remove(self) -> None:
        """Delete this run's copies (a kept tier stays for the next run of the dataset, its
        decoded copies do not: they are not accounted as copies of the tier)."""
        if self.decoded is not None:
            self.decoded.close()
        if not self.storage.kept:
            remover.remove_tree(self.storage.path)  # many at once, in C; whatever is left, below
        self.storage.remove()

    def describe(self) -> dict:
        """For the report: ``used`` is the bytes of the copies held (``stored``, as the timeline
        samples it); ``allocated_bytes`` what the filesystem allocates for them (blocks,
        tmpfs pages of ``allocation_unit`` bytes: what the capacity is counted in);
        ``reserved``: room taken beyond that, for copies under way or lent to the front
        door; ``refused`` counts the copies it did not take, by reason; ``stopped`` is the
        reason of the latest refusal (None: it took every file offered); bytes held
        (logical) and taken (stored: fewer when compressed)."""
        with self._lock:
            out = {"name": self.name, "path": self.path, "capacity": self.capacity, "kept": self.keep,
                   "used": self.stored, "allocated_bytes": self.allocated_bytes, "allocation_unit": self.unit,
                   "reserved": self._room - self.allocated_bytes, "files": self.files,
                   "full": self.full_reason,
                   "refused": dict(self.refused), "stopped": self.last_refusal,
                   "in_memory": self.memory is not None,
                   "logical_bytes": self.logical, "stored_bytes": self.stored,
                   "ratio": round(self.logical / self.stored, 3) if self.stored else 1.0,
                   "compressed_files": len(self._compressed)}
        out["compression"] = self.codec.describe() if self.codec is not None else {"mode": "off"}
        if self.decoded is not None:
            out["decoded_cache"] = self.decoded.describe()
        if self.capacity_note:
            out["capacity_from"] = self.capacity_note
        if self.memory is not None:
            out["memory_margin"] = self.memory.margin
        if self.filesystem is not None:
            out["filesystem_reserve"] = self.filesystem.reserve
            out["filesystem_reserve_from"] = self.filesystem.whence
            out["filesystem_free_at_start"] = self.filesystem.at_start  # kept_nothing_words (report/text.py)
        return out


class _NotKept(Exception):
    """A decoded copy was not published (invalidated meanwhile, or no room any more)."""


class DecodedFiles:
    """The decoded working set of a compressing tier: for a compressed copy
    (``<tier>/.z/<key>``) opened by the application, its decoded bytes kept as an ordinary
    file at ``<tier>/<key>``, where the shim's tier probe finds it, so that the next open of
    that key, in any process, is native (no daemon round trip, no decompression).

    Bounded by ``budget()``, counted in what the files take on the tier's filesystem
    (``allocated(size)``, as the tier counts its copies; the budget may shrink as the tier
    fills: ``trim`` unlinks the least recently decoded files down to it) and by
    ``allow(allocation)`` (the node's memory
    margin, for a tier in RAM), asked once per file kept. A file that does not fit is not
    kept (served from a memfd, as with no budget); nothing is evicted to make room for it:
    epochs read in shuffled order, where evicting for every new file keeps a few percent of
    re-opens native instead of budget / decoded dataset (pin, don't thrash: DESIGN.md).

    The files hold the source's bytes (its mtime, its mode masked to the owner, like raw
    copies); they are not copies the tier accounts for (its capacity is in stored bytes)
    and are unlinked when the daemon closes, so a kept tier never carries them over.

    Correct bytes first: ``drop(key)`` (the copy was invalidated or removed) unlinks the
    file of ``key`` (of every key under it, for a directory) and refuses every ``put``
    begun before it (``token``), so a decode racing an invalidation never publishes stale
    bytes. An open descriptor of an unlinked file keeps reading (the inode lives on)."""

    def __init__(self, root: str, budget: Callable[[], int], allow: Callable[[int], bool] = lambda size: True,
                 allocated: Callable[[int], int] = lambda size: size):
        self.root = root
        self._budget, self._allow, self._allocated = budget, allow, allocated
        self._lock = threading.Lock()
        self._files: "collections.OrderedDict[str, int]" = collections.OrderedDict()  # key -> size, oldest first
        self._gen = 0
        self.bytes = 0
        self.allocated_bytes = 0  # what the files take on the filesystem (what the budget counts)
        self.kept = 0       # files decoded and kept
        self.evicted = 0    # unlinked because the budget shrank
        self.refused = 0    # decoded but not kept: no room in the budget (or the memory margin)
        self.answered = 0   # opens the daemon answered with a kept file (the shim asked without probing)

    def token(self) -> int:
        return self._gen

    def path_for(self, key: str) -> str:
        return os.path.join(self.root, key)

    def holds(self, key: str) -> bool:
        return key in self._files

    def answer(self, key: str) -> str | None:
        """The path of ``key``'s decoded file, for an open the daemon answers, or None."""
        with self._lock:
            if key not in self._files:
                return None
            self.answered += 1
        return self.path_for(key)

    def _admits_locked(self, key: str, size: int, token: int) -> bool:
        """No drop since ``token``, not kept already (another open's decode), and room."""
        if token != self._gen or key in self._files:
            return False
        if self.allocated_bytes + self._allocated(size) > self._budget():
            self.refused += 1
            return False
        return True

    def put(self, key: str, data, info: FileInfo, token: int) -> bool:
        """Keep ``data`` (the decoded bytes of ``key``, whose source is ``info``) as
        ``<tier>/<key>`` if the budget has room and no ``drop`` came since ``token`` was
        taken; True if it was published."""
        size = len(data)
        with self._lock:
            if not self._admits_locked(key, size, token):
                return False
            if not self._allow(self._allocated(size)):
                self.refused += 1
                return False
        try:
            write_atomically(self.path_for(key), lambda fd: write_all(fd, data), info.mtime_ns, owner_only(info.mode),
                             publish=lambda tmp, dest: self._publish(key, size, token, tmp, dest), root=self.root)
        except _NotKept:
            return False
        except OSError as e:  # a full filesystem, say: the file is served from a memfd
            log.debug("decoded copy of %s not kept: %s", key, e)
            with self._lock:
                self.refused += 1
            return False
        return True

    def _publish(self, key: str, size: int, token: int, tmp: str, dest: str) -> None:
        with self._lock:  # drop() holds it too: a file is never published after a drop
            if not self._admits_locked(key, size, token):
                raise _NotKept(key)
            os.replace(tmp, dest)
            self._files[key] = size
            self.bytes += size
            self.allocated_bytes += self._allocated(size)
            self.kept += 1

    def drop(self, key: str) -> None:
        """``key`` (a file, or a directory and all under it) changed or its copy went: its
        decoded files go, and no decode begun before now is kept."""
        prefix = key.rstrip("/") + "/"
        with self._lock:
            self._gen += 1
            for k in [k for k in self._files if k == key or k.startswith(prefix)]:
                self._unlink_locked(k)

    def trim(self) -> None:
        """The budget may have shrunk: unlink the least recently decoded files down to it."""
        with self._lock:
            limit = self._budget()
            while self._files and self.allocated_bytes > limit:
                self._unlink_locked(next(iter(self._files)))
                self.evicted += 1

    def _unlink_locked(self, key: str) -> None:
        size = self._files.pop(key)
        self.bytes -= size
        self.allocated_bytes -= self._allocated(size)
        try:
            os.unlink(self.path_for(key))
        except FileNotFoundError:  # the shim's own invalidation removed it first
            pass
        except OSError as e:
            log.warning("removing the decoded copy %s failed: %s", self.path_for(key), e)

    def close(self) -> None:
        """Unlink every decoded file (the daemon is closing)."""
        with self._lock:
            self._gen += 1
            while self._files:
                self._unlink_locked(next(iter(self._files)))

    def describe(self) -> dict:
        """For the report: what is held now (``bytes``, ``files``), against ``budget``. Opens
        of these files are the shim's native tier hits (counted under the tier's slot)."""
        with self._lock:
            return {"bytes": self.bytes, "files": len(self._files), "budget": self._budget(), "kept": self.kept,
                    "evicted": self.evicted, "refused": self.refused, "answered": self.answered}


def write_all(fd: int, data) -> int:
    """Write all of ``data`` (a bytes-like object) to ``fd``; the bytes written."""
    view, done = memoryview(data), 0
    while done < len(view):
        done += os.write(fd, view[done:])
    return done


def make_dirs_below(root: str, directory: str) -> None:
    """Create ``directory`` and its missing parents (0700), but never ``root`` (a tier's
    directory) or anything above it: after a tier is torn down, a copy still under way
    finds no ``root`` (FileNotFoundError) and re-creates nothing."""
    rel = os.path.relpath(directory, root)
    if rel == "." or rel.startswith(".." + os.sep) or rel == ".." or os.path.isabs(rel):
        raise FileNotFoundError(errno.ENOENT, "not below the tier's directory", directory)
    path = root
    for part in rel.split(os.sep):
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def write_atomically(dest: str, fill: Callable[[int], int], mtime_ns: int, mode: int = 0o600,
                     publish: Callable[[str, str], None] = os.replace, *, root: str, size: int = 0) -> int:
    """Create ``dest`` through a fresh temporary name in its directory, then rename it in place.

    ``fill(fd)`` writes the temporary file and returns the bytes written. The copy gets
    the source's mtime (a kept tier is checked against the next snapshot by it) and
    ``mode``. A reader sees the whole file or none of it; the temporary name is short, so a
    255-byte name still fits NAME_MAX. ``publish(tmp, dest)`` renames it into place (the
    stager's checks that the key is still wanted go there). Missing directories are made
    below ``root``, the tier's directory, never ``root`` itself (``make_dirs_below``).
    ``size``, when known, is allocated before ``fill`` reads a byte: a filesystem too full
    for the copy says ENOSPC before its source is read, so the next tier takes the file
    without a second read of the PFS or the store.
    """
    directory = os.path.dirname(dest)
    tmp = os.path.join(directory, f"{TMP_PREFIX}{os.urandom(8).hex()}")
    try:
        fd = create_exclusive(tmp, mode)
    except FileNotFoundError:
        make_dirs_below(root, directory)
        fd = create_exclusive(tmp, mode)
    try:
        try:
            if size > 0:
                preallocate(fd, size)
            n = fill(fd)
            if n < size:  # the source turned out shorter: no allocated tail is left as bytes
                os.ftruncate(fd, n)
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)
        publish(tmp, dest)
        return n
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def preallocate(fd: int, size: int) -> None:
    """Give ``fd`` its ``size`` bytes of blocks now (ENOSPC, EDQUOT raised here); a filesystem
    that cannot preallocate is left to say so when written."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in NO_SPACE:
            raise
