"""A tier whose copies are this user's shared set (``shared_set.py``): what a job changes in a tier to share it.

- Room comes from the set's ledger: the capacity bounds the set, whichever job staged what.
  A job that configured another capacity joins with the set's, and its report says so.
- Copies another job staged are booked as found (``adopt_existing``, ``found``): never
  removed, since another live job's snapshot may be older or newer than this one's.
- ``claim_for_copy``: the stager's copy of a key takes the key's claim first; a copy
  another job published meanwhile is booked instead of read again (``COPY``: copy it).
  A copy of another version of the file (it changed since the set's copy), whole or by
  blocks, is removed under the claim and its room given back to the ledger: the job stages
  the file anew, once, and the next job finds it (``remove_copies``; blocks.py for large files).
  Blocks of this version a gone job left unfinished are staged on, not read again (``resumed``).
- The directory is not removed by the job: leaving the set does (the last job out, with
  no linger).

Why a tier is not shared is said in one line (``refusal``), and the job stages privately.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import time

from monarch import protocol
from monarch.config import TierConfig
from monarch.layout import StorageDir
from monarch.node.tiers.shared_set import CONTROL, SharedSet, drop_expired, held_room, set_dir
from monarch.node.tiers.tiers import REFUSED_FULL, TMP_PREFIX, Tier
from monarch.secure import user_dir

log = logging.getLogger(__name__)

__all__ = ["SharedTier", "PrivateTier", "SharedStorage", "make", "client_env", "door_may_copy", "refusal",
           "private_per_job", "claim_for_copy", "COPY"]

COPY = object()  # claim_for_copy: this job copies the key
DOOR_DRAIN_SECONDS = 30.0  # the longest a lone job's door is waited for to publish its copies under way


def _slurm_conf_says_tmpfs(env) -> bool:
    """Slurm's ``job_container/tmpfs`` gives each job its own /tmp and /dev/shm."""
    conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        with open(conf, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return False
    return re.search(r"(?im)^\s*JobContainerType\s*=\s*job_container/tmpfs\b", text) is not None


def _mount_of(path: str) -> tuple[str, str] | None:
    """(mount point, root within its filesystem) of the mount holding ``path``."""
    best = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 5:
                    continue
                root, point = fields[3], fields[4].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and (
                        best is None or len(point) >= len(best[0])):
                    best = (point, root)
    except OSError:
        return None
    return best


def private_per_job(base: str, env=os.environ) -> bool:
    """Does the scheduler give each job its own ``base`` (Slurm's job_container/tmpfs: a
    per-job directory bind-mounted on /tmp, a tmpfs of its own on /dev/shm)?"""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return False
    real = os.path.realpath(base)
    if real in ("/tmp", "/dev/shm") or real.startswith(("/tmp/", "/dev/shm/")):
        if _slurm_conf_says_tmpfs(env):
            return True
    mount = _mount_of(real)
    return mount is not None and re.search(rf"(^|/)\.?{re.escape(job)}(/|$)", mount[1]) is not None


def refusal(cfg: TierConfig, *, share: bool, stores: bool, cluster: bool, env=os.environ) -> str | None:
    """Why tier ``cfg`` is not shared with this user's other jobs (None: it is)."""
    if not share:
        return "staging.share is false"
    if cluster:
        return "a cluster's daemon (monarch serve) stages its own share"
    if stores:
        return "a store's roots are not shared yet"
    if cfg.keep:
        return "keep: true keeps the copies for one run at a time"
    if cfg.compression != "off":
        return "a compressing tier is not shared yet"
    if private_per_job(cfg.path, env):
        return (f"{cfg.path} is private to each job on this node (Slurm's job_container/tmpfs): "
                "jobs cannot share copies there")
    return None


class SharedStorage(StorageDir):
    """The set's directory as this job's tier directory: kept (the job does not remove it);
    releasing it leaves the set."""

    def __init__(self, shared: SharedSet):
        super().__init__(shared.path, kept=True)
        self.shared = shared

    def release(self) -> None:
        left = self.shared.leave()
        if left is not None:
            log.info("left shared copies (%d bytes) in %s until %s; `monarch cache drop` frees them now",
                     left["bytes"], left["path"], time.ctime(left["until"]))


class SharedTier(Tier):
    """A tier on a shared set: room from the set's ledger, copies of other jobs booked as found."""

    def __init__(self, name: str, shared: SharedSet, slot: int, base: Tier):
        """``base``: the tier this job's configuration makes (its capacity, unit, memory guard)."""
        super().__init__(name, SharedStorage(shared), shared.capacity, slot, memory=base.memory, unit=base.unit,
                         filesystem=base.filesystem)
        self.capacity_note = base.capacity_note
        self.at_capacity = base.at_capacity if shared.capacity <= base.capacity else REFUSED_FULL
        self.shared = shared
        self.configured_capacity = base.capacity
        self.from_others_files = self.from_others_bytes = 0  # copies another job staged, booked here
        self.restaged_files = self.restaged_bytes = 0  # stale copies (the file changed) this job replaced
        self.resumed_files = self.resumed_bytes = self.resumed_of_bytes = 0  # block copies a gone job left unfinished

    @classmethod
    def from_config(cls, cfg: TierConfig, slot: int, run_id: str, node: int, roots: tuple[str, ...],
                    memory_margin: int | None = None, pfs_rate=lambda: None, dataset_bytes=lambda: 0, *,
                    linger: float = 0.0, wait: float = 30.0,
                    filesystem_reserve: tuple[int, float | None] | None = None) -> "SharedTier":
        parent = user_dir(cfg.path)
        # the user's other sets whose linger is over go with this run's start; this dataset's is
        # joined instead, its copies still checked against this job's snapshot
        drop_expired(parent, skip=set_dir(cfg.path, roots))
        probe = StorageDir(parent, kept=True)  # the allocation unit and share of the base's filesystem
        base = Tier._on(probe, cfg, slot, memory_margin, pfs_rate, dataset_bytes, filesystem_reserve)
        shared = SharedSet.join(cfg.path, roots, run_id, base.capacity, linger, wait, base.allocated)
        if shared.capacity != base.capacity and not base.capacity_note:
            log.warning("tier %s: joins the shared copies in %s with their capacity, %d bytes (this job's "
                        "configuration says %d)", cfg.name, shared.path, shared.capacity, base.capacity)
        return cls(cfg.name, shared, slot, base)

    # -- room: the set's ledger ----------------------------------------------------------------
    def has_room(self, room: int) -> bool:
        return self.full_reason is None and self.shared.taken() + room <= self.capacity and room <= self._headroom(room)

    def free_room(self) -> int:
        left = max(0, self.capacity - self.shared.taken())
        return min(left, self._headroom(left)) if self.full_reason is None else 0

    def reserve(self, size: int, counted: bool = True, written: bool = False) -> bool:
        ledger = self.full_reason is None or written  # (a full filesystem refuses a new copy before the ledger)
        if ledger and not self.shared.take(size):
            if counted:
                with self._lock:
                    self.refused[self.at_capacity] += 1
                    self.last_refusal = self.at_capacity
            return False
        if super().reserve(size, counted, written):
            return True
        if ledger:
            self.shared.give(size)
        return False

    def release(self, size: int) -> None:
        super().release(size)
        self.shared.give(size)

    # -- copies other jobs staged --------------------------------------------------------------
    def found(self, size: int) -> None:
        """A copy of ``size`` bytes another job staged, booked here (its room is the set's already)."""
        room = self.allocated(size)
        with self._lock:
            self._room += room
            self.from_others_files += 1
            self.from_others_bytes += size
        self.committed(size, size)

    def matching(self, key: str, info) -> bool | None:
        """Is the set's copy of ``key`` the file ``info`` describes (size, mtime)? None: no copy."""
        try:
            st = os.lstat(self.path_for(key))
        except OSError:
            return None
        return stat.S_ISREG(st.st_mode) and info.same_content_as(st)

    def discard_stale(self, key: str, size: int) -> None:
        """Remove the set's copy of ``key`` that is not this job's file (the caller holds its
        claim): this job stages the file anew (``size``: its snapshot's), said as re-staged."""
        if self.remove_copies(self.path_for(key)):
            self.restaged(size)

    def restaged(self, size: int) -> None:
        with self._lock:
            self.restaged_files += 1
            self.restaged_bytes += size

    def resumed(self, size: int, staged: int) -> None:
        """A large file of ``size`` bytes whose copy by blocks a gone job left with ``staged``
        bytes in it: this job stages the rest (blocks.py)."""
        with self._lock:
            self.resumed_files += 1
            self.resumed_bytes += staged
            self.resumed_of_bytes += size

    def remove_copies(self, *paths: str) -> bool:
        """Remove the set's files ``paths`` of one key (its copy, its block copy; the caller holds
        the key's claim) and give the ledger back the room of each copy among them, once per
        file (a copy published from its blocks is one file under two names). True if one was there."""
        seen, room = set(), 0
        for path in paths:
            try:
                st = os.lstat(path)
                held = self.room_of(path, st)  # (before it goes: a copy by blocks' map says its room)
                os.unlink(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                room += held
        if room:
            self.shared.give(room)
        return bool(seen)

    def room_of(self, path: str, st: os.stat_result) -> int:
        """The room of the set's ledger its file ``path`` holds, as the ledger counts it (a copy
        by blocks published whole: the whole copy's, at its key: ``shared_set._sweep``)."""
        if st.st_nlink > 1:
            return self.allocated(st.st_size)
        return held_room(self.path, path, st.st_size, self.allocated)

    def adopt_existing(self, files) -> list[str]:
        """Book the set's copies that match this job's snapshot; leave every other file alone
        (another live job may be writing or serving it)."""
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
                    if not prefix and entry.name == CONTROL:
                        continue
                    key = prefix + entry.name
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append((key + "/", entry.path))
                            continue
                        info = files.get(key)
                        if (info is not None and entry.is_file(follow_symlinks=False)
                                and not entry.name.startswith(TMP_PREFIX)
                                and info.same_content_as(entry.stat(follow_symlinks=False))):
                            self.found(info.size)
                            adopted.append(key)
                    except OSError:
                        continue
        return adopted

    def remove(self) -> None:
        if self.decoded is not None:
            self.decoded.close()
        self.storage.remove()  # kept: leaves the set (the last job out, with no linger, removes it)

    def describe(self) -> dict:
        out = super().describe()
        shared = self.shared
        out["shared"] = {"path": shared.path, "capacity": self.capacity,
                         "configured_capacity": self.configured_capacity,
                         "jobs_at_join": shared.others_at_join, "jobs_now": shared.others_live(),
                         "from_others_files": self.from_others_files, "from_others_bytes": self.from_others_bytes,
                         "restaged_files": self.restaged_files, "restaged_bytes": self.restaged_bytes,
                         "resumed_files": self.resumed_files, "resumed_bytes": self.resumed_bytes,
                         "resumed_of_bytes": self.resumed_of_bytes,
                         "waited": shared.claims_waited, "wait_timed_out": shared.claims_timed_out,
                         "linger": shared.linger, "set_bytes": shared.taken()}
        if shared.linger > 0 and out["shared"]["jobs_now"] == 0 and out["shared"]["set_bytes"]:  # else removed
            out["shared"]["left_until"] = time.time() + shared.linger
        return out


@contextlib.contextmanager
def claim_for_copy(books, key: str, info):
    """Around the stager's copy of ``key``: ``COPY`` (this job copies it, holding its claim),
    a tier (a copy another job staged, now booked), or None (another job's copy did not come
    within the wait: this open reads the PFS). Without a shared tier: ``COPY`` at once."""
    shared = [t for t in books.tiers if isinstance(t, SharedTier)]
    if not shared:
        yield COPY
        return
    for tier in shared:
        tier.shared.hold_copies()
    with shared[0].shared.claim(key) as held:
        for tier in shared:
            same = tier.matching(key, info)
            if same:
                with books.lock:
                    if books.is_dirty(key) or books.closed:
                        break
                    if books.staged.get(key) is not tier:  # (booked already: a large file's, blocks.py)
                        tier.found(info.size)
                        books.staged_locked(key, tier)
                yield tier
                return
            if same is False and held:
                tier.discard_stale(key, info.size)
        if not held:
            with books.lock:
                books.failures["shared_wait_timeout"] += 1
            yield None
            return
        yield COPY


class PrivateTier(Tier):
    """A tier of a job that asked to share, private to it: why is said in the report."""

    not_shared = ""

    def private_because(self, why: str) -> None:
        self.not_shared = why

    def describe(self) -> dict:
        return super().describe() | {"not_shared": self.not_shared}


def make(cfg: TierConfig, slot: int, run_id: str, node: int, config, stores: bool, cluster: bool,
         memory_margin, pfs_rate, dataset_bytes) -> Tier:
    """The tier of ``cfg``: shared with this user's other jobs of the dataset, or private to
    this job (with ``staging.share`` on, the report says why)."""
    why = refusal(cfg, share=config.staging.share, stores=stores, cluster=cluster)
    reserve = (config.filesystem_reserve, config.filesystem_reserve_share)  # each tier's share of its own filesystem
    if why is None:
        try:
            return SharedTier.from_config(cfg, slot, run_id, node, tuple(config.dataset.roots),
                                          memory_margin=memory_margin, pfs_rate=pfs_rate, dataset_bytes=dataset_bytes,
                                          linger=config.staging.linger, wait=config.staging.resolve_timeout,
                                          filesystem_reserve=reserve)
        except OSError as e:  # UnsafePathError included: said, and the job stages privately
            why = f"the shared copies could not be used ({e}): this job stages privately"
    if "job_container" in why or "could not be used" in why:
        log.warning("tier %s: %s", cfg.name, why)
    asked = config.staging.share and not cluster
    tier = (PrivateTier if asked else Tier).from_config(cfg, slot, run_id, node, config.dataset.roots,
                                                        memory_margin=memory_margin, pfs_rate=pfs_rate,
                                                        dataset_bytes=dataset_bytes, filesystem_reserve=reserve)
    if asked:
        tier.private_because(why)
    return tier


def client_env(tiers: list[Tier]) -> dict[str, str]:
    """What the shim needs to know of the shared tiers: their slots, whose copies it checks."""
    shared = [str(t.slot) for t in tiers if isinstance(t, SharedTier)]
    return {protocol.ENV_SHARED_SLOTS: ",".join(shared)} if shared else {}


def door_may_copy(tiers: list[Tier], keeper) -> bool:
    """May the C front door copy from the PFS into ``tiers``? Its copies take no claims: with
    shared tiers, only while this job is alone on each set. When another job joins, the door
    stops copying for good (``keeper()``'s ``front_door`` disabled: it returns once its copies under
    way are published) and the stager copies, with claims, from then on."""
    shared = [t.shared for t in tiers if isinstance(t, SharedTier)]

    def stop() -> None:
        door_keeper = keeper()
        if door_keeper is None:
            return
        if door_keeper.link is not None:
            door_keeper.link.stop_copying()  # no new copy; the read-ahead lane ends, its rest goes to the stager
        deadline = time.monotonic() + DOOR_DRAIN_SECONDS
        while door_keeper.front_door.inflight()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.005)  # the copies under way publish (a disabled door would drop them: read twice)
        door_keeper.front_door.disable()
    return all([s.copy_alone(stop) for s in shared])  # each asked: a lock held is released by its watcher


def sharing(tiers: list[Tier]) -> dict[str, dict]:
    """Per tier, for the launcher at the start: shared (where, with how many jobs, the set's
    capacity against this job's) or why not."""
    out: dict[str, dict] = {}
    for t in tiers:
        if isinstance(t, SharedTier):
            # a capacity given as a share of the node differs from job to job: not worth a line
            out[t.name] = {"path": t.path, "jobs": t.shared.others_at_join, "capacity": t.capacity,
                           "configured_capacity": t.capacity if t.capacity_note else t.configured_capacity}
        elif isinstance(t, PrivateTier):
            out[t.name] = {"not_shared": t.not_shared}
    return out
