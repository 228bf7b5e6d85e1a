"""Copies of the files a run published, kept on the node for the same user's next runs: a restart
reads its checkpoint from the node's tier, not back from the PFS (docs/consistency.md, "Kept
copies").

When the drain has published a file (its bytes under its name on the PFS), its local copy is
hard-linked here before the area lets it go (``.in-<pid>-<n>``, a name no index names yet), and
the store's own thread records it with the PFS file's identity as it stands after the publish:
size, mtime, ctime, inode and device, taken once the renames the drain applied meanwhile are
followed (the drain, and a checkpoint's fsync waiting on it, do not wait for these PFS calls). The
job's later renames and removals of it, applied on the PFS, follow it here. A later run's
read-only open of that PFS path (under its write-back paths) is answered with the kept copy only
while the PFS file still has that identity: a file written, replaced, renamed over or touched on
the PFS since (its ctime moves with any change) is read from the PFS, and its kept copy dropped.
Never old bytes.

The store is ``<write-back tier base>/monarch-<uid>/kept-writes/``: ``data/<name>`` and
``index.json`` ({PFS path: record}), changed under ``lock`` (flock: two runs of the user on the node
share it) and replaced whole. It holds at most ``room`` bytes, the newest published first; the
oldest go when it is over, or when the job's own pending writes need the room (``make_room``).
A live run holds ``lease`` shared; once none does, the store lingers ``linger`` seconds from its
last run's end (the index's time), as shared copies do, and ``monarch cache drop --expired`` frees
it after that (``drop``).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import stat
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator

from monarch.errors import MonarchError
from monarch.secure import private_dir, user_dir

log = logging.getLogger(__name__)

STORE, DATA, INDEX, LOCK, LEASE, LINGER = "kept-writes", "data", "index.json", "lock", "lease", "linger"
IDENTITY = ("size", "mtime_ns", "ctime_ns", "ino", "dev")
INCOMING = ".in-"  # a published copy linked here, not yet recorded
_LINKS = itertools.count(1)  # their numbers in this process (a node's own store and its partner's copies: two stores)
SAME_FILE = ("size", "mtime_ns", "ctime_ns", "ino")  # a PFS file's identity as every node sees it (not its device)


def pfs_identity(path: str) -> dict | None:
    """A regular file's identity on the PFS (None: not a regular file there)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev}


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


class _Op:
    """A change as the drain's record names it (``keep``, ``moved``, ``dropped`` called directly)."""

    def __init__(self, op: str, args: dict):
        self.op, self.args = op, args

    def __getitem__(self, key: str):
        return self.args[key]


def _under(path: str, top: str) -> bool:
    return path.startswith(top.rstrip("/") + "/")


def _forget(data: str, entry, linked: bool) -> None:
    """A file no longer kept: its link gone (``linked``: one of this run's, not recorded yet; a
    recorded one goes with the index's next write)."""
    if linked:
        try:
            os.unlink(os.path.join(data, entry[0]))
        except FileNotFoundError:
            pass


def _incoming_of_a_live_run(name: str) -> bool:
    """A copy linked by a run's drain, not recorded yet (``.in-<pid>-<n>``), whose daemon still runs."""
    if not name.startswith(INCOMING):
        return False
    try:
        os.kill(int(name[len(INCOMING):].split("-")[0]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def store_path(base: str) -> str:
    """Where a user's kept copies are under a tier base."""
    return os.path.join(user_dir(base), STORE)


class KeptWrites:
    """The user's kept copies on this node under one tier base, at most ``room`` bytes."""

    def __init__(self, base: str, room: int, linger: float = 0.0, rate: Callable[[], float | None] = lambda: None):
        """``rate()``: the PFS's bytes a second as the drain meets them now (kept with each copy: what a
        later read of it from here saves is said at that rate)."""
        self.base, self.rate = base, rate
        self.path = private_dir(store_path(base))
        self.data = private_dir(os.path.join(self.path, DATA))
        self.room, self.linger = room, linger
        self._mu = threading.Lock()
        self._lease = os.open(os.path.join(self.path, LEASE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lease, fcntl.LOCK_SH)  # in use: `monarch cache drop` leaves it
        self._write_linger()  # (a run killed before its end leaves a store that still expires)
        self._seen = (0, 0)  # the index's (inode, mtime) when this store last read or wrote it
        self.figures = {"kept_files": 0, "kept_bytes": 0, "served_files": 0, "served_bytes": 0, "stale": 0}
        self._reload()
        self.marks, self._marked = None, set()
        self._queue: list[tuple] = []  # what the drain applied, not followed here yet: (record, op, ...)
        self._queued = threading.Condition()
        self._busy = False
        self._told = 0       # every record up to this one the drain applied is in the queue (or was)
        self._waiting: dict[str, tuple] = {}  # published files not found as published yet: looked at again
        self._thread: threading.Thread | None = None
        self._tell: Callable[[list], None] | None = None

    @classmethod
    def made(cls, base: str, room: int, linger: float,
             rate: Callable[[], float | None] = lambda: None) -> "KeptWrites | None":
        """The store for a run keeping ``room`` bytes (None: 0, or it cannot be made, said: the run
        writes back all the same and its next run reads the PFS)."""
        if room <= 0:
            return None
        try:
            found = describe(base)
            if found is not None and found[3] is not None and found[3] <= time.time() and not found[4]:
                drop(base)  # its linger is over: what it held is for no one (as a shared set's)
            return cls(base, room, linger, rate)
        except (OSError, MonarchError) as e:
            log.error("write-back: no kept copies under %s (%s): the next run reads its files from the PFS", base, e)
            return None

    def follow(self, rec, local: str) -> None:
        """What the drain applied (every record, in order): a published file kept (its local copy at
        ``local``, linked here at once), a rename or a removal followed, by the store's thread; never
        a failure of the drain's (said, and the copy not kept)."""
        n = getattr(rec, "n", None)  # (None: a change told directly, not by a drain that goes on)
        try:
            if rec.op == "close":
                st = os.stat(local)
                if self.room <= 0 or st.st_size > self.room:
                    item: tuple | None = None
                else:
                    name = f"{INCOMING}{os.getpid()}-{next(_LINKS)}"
                    os.link(local, os.path.join(self.data, name))
                    item = ("keep", rec["path"], name, st.st_size, st.st_mtime_ns)
            elif rec.op == "rename":
                item = ("moved", rec["src"], rec["dst"])
            elif rec.op in ("unlink", "rmdir"):
                item = ("dropped", rec["path"])
            else:
                item = None
        except FileNotFoundError:  # no local copy to keep (written through to the PFS, or never held here)
            item = None
        except Exception:
            log.exception("kept copies: %s not followed", rec.op)
            item = None
        with self._queued:
            self._told = max(self._told, n or 0)
            if item is None:
                return
            self._queue.append((n, *item))
            if self._thread is None:
                self._thread = threading.Thread(target=self._follow_loop, name="monarch-kept", daemon=True)
                self._thread.start()
            self._queued.notify_all()

    def followed(self, drained: bool = False) -> None:
        """Returns once everything the drain told is followed here (``drained``: it told all it will,
        so a published file still not found as published is not kept)."""
        with self._queued:
            while self._queue or self._busy:
                self._queued.wait()
            if not (drained and self._waiting):
                return
            self._busy = True
        try:
            self._apply([], told=sys.maxsize)
        finally:
            with self._queued:
                self._busy = False
                self._queued.notify_all()

    def _follow_loop(self) -> None:
        while True:
            with self._queued:
                while not self._queue:
                    self._queued.wait()
                batch, self._queue, self._busy, told = self._queue, [], True, self._told
            try:
                self._apply(batch, told)
            except Exception:
                log.exception("kept copies: %d changes not followed", len(batch))
            finally:
                with self._queued:
                    self._busy = False
                    self._queued.notify_all()

    def _apply(self, batch: list[tuple], told: int) -> None:
        """The drain's changes, in its order, made to the index at once: each kept file's identity
        taken where the batch leaves it (one PFS call a file), a rename's files checked there. A
        file not found as published is looked at again with the next changes (the drain may have
        renamed or removed it on the PFS before this looked, and told it after), until every record
        the drain could have applied when it was looked at is told (``told``: all up to there)."""
        with self._changing() as files:
            new, self._waiting = self._waiting, {}  # PFS path -> (link, size, mtime, told when looked at)
            recheck: set[str] = set()    # kept paths a rename moved
            kept: list[list] = []        # what is kept from here, for the other nodes (``tell_kept_to``)
            for n, op, *args in batch:
                if op == "keep":
                    path, link, size, mtime = args
                    new[path] = (link, size, mtime, None if n is None else -1)
                    files.pop(path, None)
                elif op == "moved":
                    src, dst = args
                    for table in (files, new):
                        for path in [p for p in table if p == dst or _under(p, dst)]:
                            _forget(self.data, table.pop(path), table is new)
                        for path in [p for p in table if p == src or _under(p, src)]:
                            table[dst + path[len(src):]] = table.pop(path)
                            if table is files:
                                recheck.add(dst + path[len(src):])
                else:
                    for table in (files, new):
                        for path in [p for p in table if p == args[0] or _under(p, args[0])]:
                            _forget(self.data, table.pop(path), table is new)
            for path, (link, size, mtime, looked) in new.items():
                pfs = pfs_identity(path)
                if pfs is not None and (pfs["size"], pfs["mtime_ns"]) == (size, mtime):
                    name = uuid.uuid4().hex
                    os.rename(os.path.join(self.data, link), os.path.join(self.data, name))
                    files[path] = {**pfs, "name": name, "kept": time.time(), "rate": self.rate()}
                    kept.append([path, *(pfs[k] for k in SAME_FILE), files[path]["rate"]])
                    self.figures["kept_files"] += 1
                    self.figures["kept_bytes"] += size
                elif looked is not None and (looked < 0 or told <= looked):  # a change may be untold yet
                    with self._queued:
                        self._waiting[path] = (link, size, mtime, self._told)
                else:  # not what the PFS holds there: nothing kept
                    _forget(self.data, (link,), True)
            for path in recheck & set(files) - set(new):
                now = pfs_identity(path)  # (its inode may change: a FUSE filesystem numbers its names)
                if now is not None and (now["size"], now["mtime_ns"]) == (files[path]["size"], files[path]["mtime_ns"]):
                    files[path] = {**files[path], **now}
                else:
                    del files[path]
                    continue
                kept.append([path, *(files[path][k] for k in SAME_FILE), files[path].get("rate")])
            self._evict(files, self.room)
        if self._tell is not None and (kept := [k for k in kept if k[0] in self._files]):
            self._tell(kept)

    # -- the index -------------------------------------------------------------------------------
    def _read(self) -> dict[str, dict]:
        try:
            with open(os.path.join(self.path, INDEX), encoding="utf-8") as f:
                st = os.fstat(f.fileno())
                self._read_seen = (st.st_ino, st.st_mtime_ns)
                doc = json.load(f)
            if not isinstance(doc, dict) or not all(isinstance(r, dict) and isinstance(r.get("name"), str)
                                                    and all(isinstance(r.get(k), int) for k in IDENTITY)
                                                    and (r.get("rate") is None or _positive(r["rate"]))
                                                    for r in doc.values()):
                raise ValueError("not an index of kept copies")
            return doc
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:  # damaged: nothing trusted, every copy read from the PFS again
            log.warning("kept copies: %s is unreadable (%s): starting empty", os.path.join(self.path, INDEX), e)
            return {}

    def _write(self) -> None:
        tmp = os.path.join(self.path, f".{INDEX}.{os.getpid()}")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w",
                  encoding="utf-8") as f:
            json.dump(self._files, f)
        os.replace(tmp, os.path.join(self.path, INDEX))
        st = os.stat(os.path.join(self.path, INDEX))
        self._seen = (st.st_ino, st.st_mtime_ns)

    def _reload(self) -> None:
        self._read_seen = (0, 0)
        self._files = self._read()
        self._seen = self._read_seen

    @contextmanager
    def _changing(self) -> Iterator[dict[str, dict]]:
        """The index as it is now (another run may have changed it), changed and written back."""
        with self._mu:
            fd = os.open(os.path.join(self.path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._reload()
                yield self._files
                self._drop_unreferenced()
                self._write()
            finally:
                os.close(fd)
                self._remark()

    def tell_kept_to(self, tell: Callable[[list], None]) -> None:
        """``tell(entries)`` from now on with what is kept here ([path, size, mtime_ns, ctime_ns, ino, rate]
        each: a copy recorded, or one a rename moved), after the index says so."""
        self._tell = tell

    def mark_in(self, marks) -> None:
        """Its paths marked for the shim (marks.py): a read-only open of one asks for its kept copy."""
        with self._mu:
            self.marks = marks
            self._remark()

    def _remark(self) -> None:
        """(under _mu) The marks made what the index names now."""
        if self.marks is None:
            return
        now = set(self._files)
        for p in now - self._marked:
            self.marks.add(p)
        for p in self._marked - now:
            self.marks.remove(p)
        self._marked = now

    def _drop_unreferenced(self) -> None:
        names = {r["name"] for r in self._files.values()}
        for name in os.listdir(self.data):
            if name not in names and not _incoming_of_a_live_run(name):
                try:
                    os.unlink(os.path.join(self.data, name))
                except OSError:
                    pass

    def _evict(self, files: dict[str, dict], room: int) -> None:
        """The oldest kept copies dropped until the rest fit in ``room`` bytes."""
        total = sum(r["size"] for r in files.values())
        for path, rec in sorted(files.items(), key=lambda kv: kv[1].get("kept", 0)):
            if total <= room:
                break
            del files[path]
            total -= rec["size"]

    # -- what the drain tells ----------------------------------------------------------------------
    def keep(self, pfs_path: str, local: str) -> None:
        """``local``'s bytes were published at ``pfs_path``: kept, if they fit (and they are what the PFS
        holds there: the same size and time; else nothing is kept)."""
        self._now(_Op("close", {"path": pfs_path}), local)

    def moved(self, src: str, dst: str) -> None:
        """The job's rename of ``src`` to ``dst`` applied on the PFS: what was kept under ``src`` (a
        file, or everything under a directory) follows, with its identity there now."""
        self._now(_Op("rename", {"src": src, "dst": dst}), "")

    def dropped(self, path: str) -> None:
        """The job's removal of ``path`` applied on the PFS."""
        self._now(_Op("unlink", {"path": path}), "")

    def _now(self, rec, local: str) -> None:
        self.follow(rec, local)
        self.followed()

    def make_room(self, free: int) -> None:
        """The write-back room has ``free`` bytes the job's pending files do not take: the kept copies
        fit in them, the oldest going first (the job's own writes before an earlier run's files)."""
        limit = max(0, min(self.room, free))
        if sum(r["size"] for r in self._files.values()) <= limit:
            return
        with self._changing() as files:
            self._evict(files, limit)

    # -- a later run's open --------------------------------------------------------------------------
    def lookup(self, pfs_path: str, now: dict | None | bool = False) -> str | None:
        """The kept copy of ``pfs_path`` if the PFS file is still the one published (None: read the PFS);
        ``now``: its identity on the PFS, taken by the caller (else taken here)."""
        rec = self._record(pfs_path)
        if rec is None:
            return None
        if now is False:
            now = pfs_identity(pfs_path)
        local = os.path.join(self.data, rec["name"])
        if now is None or any(now[k] != rec[k] for k in IDENTITY) or not os.path.exists(local):
            self.figures["stale"] += 1
            try:
                with self._changing() as files:
                    if files.get(pfs_path, {}).get("name") == rec["name"]:
                        del files[pfs_path]
            except OSError as e:
                log.warning("kept copies: %s could not be dropped: %s", pfs_path, e)
            return None
        self.figures["served_files"] += 1
        self.figures["served_bytes"] += rec["size"]
        return local

    def _record(self, pfs_path: str) -> dict | None:
        """``pfs_path``'s record, the index read again if another store of this process changed it (a
        partner's copies)."""
        try:
            st = os.stat(os.path.join(self.path, INDEX))
            changed = (st.st_ino, st.st_mtime_ns) != self._seen
        except OSError:
            changed = False
        if changed:
            with self._mu:
                self._reload()
        return self._files.get(pfs_path)

    def holds(self, pfs_path: str) -> bool:
        """Is a copy of ``pfs_path`` kept here (whatever the PFS holds there now)?"""
        return self._record(pfs_path) is not None

    def rates(self) -> dict[str, float | None]:
        return {p: r.get("rate") for p, r in self._files.items()}

    def rate_of(self, pfs_path: str) -> float | None:
        """The PFS's rate (bytes a second) the drain met when ``pfs_path``'s copy was kept (None: not known)."""
        rec = self._files.get(pfs_path)
        return rec.get("rate") if rec is not None else None

    def holdings(self) -> list[tuple]:
        """(PFS path, size, mtime_ns, ctime_ns, ino) of every copy kept here: what the other nodes may
        ask this one for (``answer``)."""
        return [(p, *(r[k] for k in SAME_FILE)) for p, r in self._read().items()]

    def answer(self, pfs_path: str, same: tuple) -> str | None:
        """The kept copy of ``pfs_path`` for another node, if it was kept with the PFS identity ``same``
        (size, mtime_ns, ctime_ns, ino: what that node's PFS shows now); None: not (any more)."""
        rec = self._files.get(pfs_path) or self._read().get(pfs_path)
        if rec is None or tuple(rec[k] for k in SAME_FILE) != tuple(same):
            return None
        local = os.path.join(self.data, rec["name"])
        return local if os.path.exists(local) else None

    def adopt(self, pfs_path: str, identity: dict, fill: Callable[[int], int], rate: float | None) -> str | None:
        """A copy of ``pfs_path`` made here by ``fill(fd)`` (from another node's kept copy), kept with
        the PFS identity the caller saw at its open (``identity``, its device this node's), as this
        node's own; its path, or None when ``fill`` wrote another size (nothing kept) or it does not fit."""
        if identity["size"] > self.room:
            return None
        link = f"{INCOMING}{os.getpid()}-{next(_LINKS)}"
        fd = os.open(os.path.join(self.data, link), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            written = fill(fd)
        except BaseException:
            os.close(fd)
            _forget(self.data, (link,), True)
            raise
        os.close(fd)
        if written != identity["size"]:
            _forget(self.data, (link,), True)
            return None
        name = uuid.uuid4().hex
        os.rename(os.path.join(self.data, link), os.path.join(self.data, name))
        with self._changing() as files:
            files[pfs_path] = {**{k: identity[k] for k in IDENTITY}, "name": name, "kept": time.time(), "rate": rate}
            self._evict(files, self.room)
        return os.path.join(self.data, name) if files.get(pfs_path, {}).get("name") == name else None

    def _write_linger(self) -> None:
        with open(os.open(os.path.join(self.path, LINGER), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                          0o600), "w") as f:
            f.write(str(self.linger))

    def close(self) -> None:
        """The run's end: what the drain told followed, the store lingers from now (its index
        written), the lease given back."""
        self.followed(drained=True)
        try:
            with self._changing():
                self._write_linger()
        except OSError as e:
            log.warning("kept copies: %s: %s", self.path, e)
        os.close(self._lease)
        if not self._files:  # nothing kept: nothing left behind (unless another run holds it)
            drop(os.path.dirname(os.path.dirname(self.path)))

    def listing(self) -> list[tuple[str, int, float]]:
        """(PFS path, bytes, when kept) of every kept copy, newest first."""
        return sorted(((p, r["size"], r.get("kept", 0.0)) for p, r in self._read().items()), key=lambda t: -t[2])


def describe(base: str) -> tuple[str, int, int, float | None, bool] | None:
    """A user's kept copies under ``base``: (store, files, bytes, lingering until (None: not yet
    known), in use by a live run); None when there is no store."""
    path = store_path(base)
    if not os.path.isdir(path):
        return None
    try:
        with open(os.path.join(path, INDEX), encoding="utf-8") as f:
            files = json.load(f)
        used = os.stat(os.path.join(path, INDEX)).st_mtime
    except (OSError, ValueError):
        files, used = {}, None
    try:
        with open(os.path.join(path, LINGER), encoding="utf-8") as f:
            until = used + float(f.read()) if used is not None else None
    except (OSError, ValueError):
        until = None
    return path, len(files), sum(r.get("size", 0) for r in files.values() if isinstance(r, dict)), until, _leased(path)


def _leased(path: str) -> bool:
    try:
        fd = os.open(os.path.join(path, LEASE), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def drop(base: str) -> str | None:
    """Remove the user's kept copies under ``base``: None, or why they stay (a live run uses them)."""
    import shutil
    path = store_path(base)
    try:
        fd = os.open(os.path.join(path, LEASE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:  # no store (gone already)
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "in use by a running job"
        shutil.rmtree(path)
        return None
    finally:
        os.close(fd)
