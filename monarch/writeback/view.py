"""The job's view of its write-back paths on one node (docs/consistency.md, "Write-back", W1):
the PFS's directories with the node's pending files and operations applied, and the journal
that records each change in the order the job made it.

Each path the job changed and the drain has not yet applied has an entry:

- ``Local``: a file the job created or truncated; its bytes are the area's ``data/<seq>`` (being
  written until its close is journaled, ``closed`` after);
- ``Moved``: a PFS file or directory the job renamed here, still at its old PFS path until the
  rename is applied (a path below a moved directory is found through it);
- ``Gone``: a name the job removed or renamed away, still on the PFS until that is applied.

A path with no entry (nor a moved or removed directory above it) is the PFS's own. An entry is
dropped once the drain applied the last record that names it, so the view holds only what the
PFS does not show yet. The daemon's socket calls these methods; a lock keeps them in the order
the requests arrive.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import contextlib
import dataclasses
from dataclasses import dataclass

from monarch.writeback.area import Area
from monarch.writeback.journal import Journal
from monarch.writeback.known import ABSENT, DIR, KnownPfs
from monarch.writeback.marks import MarkedDirs, MarkedEntries, Marks


@dataclass
class Local:
    seq: int
    mode: int
    over: bool               # it replaced a file the view had at its path (removed if it is never closed)
    closed: bool = False     # its close is journaled: it is published in journal order
    last_record: int = 0     # the last journal record naming it
    after: tuple = ()        # ((node, record), ...): other nodes' operations it is published after (W4)
    through: str | None = None  # larger than the room: its bytes are at this PFS path, not in the area (W6)
    close_record: int = 0    # its close's record (published at the path that record names)
    synced: bool = False     # an fsync put its bytes so far on the PFS at its path (a sync record) ...
    unchanged: bool = False  # ... and nothing was written since (each closing process said so)

    def order(self) -> dict:
        """What its close or sync record adds: ``after`` (W4), ``through`` (W6)."""
        return {**({"after": [list(p) for p in self.after]} if self.after else {}),
                **({"through": self.through} if self.through else {})}

    def close_args(self) -> dict:
        """What its close record adds: ``synced``, when its last fsync's copy on the PFS is the file."""
        return {**self.order(), **({"synced": True} if self.synced and self.unchanged and not self.through else {})}


@dataclass
class Moved:
    pfs_path: str
    last_record: int


@dataclass
class Gone:
    last_record: int


def _error(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


def _temporaries(directory: str) -> str:
    """A name no job uses in ``directory``, marked while a temporary of the drain's may be there:
    the shim asks the daemon for its listing (the drain's names are not the job's)."""
    return os.path.join(directory, ".monarch-temporaries")


def _under(path: str, directory: str) -> bool:
    return path.startswith(directory + "/")


# what a call may need to know of the PFS (os.listdir's names are filtered by _listing)
_LOOKS = {"isdir": os.path.isdir, "lstat": os.lstat, "listdir": os.listdir}
_ATTEMPTS = 8  # a call retried this often (the drain changing the PFS meanwhile) then looks under the lock


class _Look(Exception):
    """A fact of the PFS a call needs and has not: looked at outside the view's lock, then the call runs again."""

    def __init__(self, kind: str, path: str):
        self.kind, self.path = kind, path


class View:
    """The view of one run's write-back paths on a node, and its journal."""

    def __init__(self, paths: tuple[str, ...], area: Area, journal: Journal, marks: Marks | None = None):
        self.paths = tuple(p.rstrip("/") or "/" for p in paths)
        self.area, self.journal = area, journal
        self._lock = threading.RLock()
        self._facts: dict | None = None  # the PFS as _looking saw it, for the call holding the lock
        self._pfs_changes = 0            # the drain's changes of the PFS (facts older than one are looked at again)
        self._known = KnownPfs()          # what the job's applied changes made of the PFS: no call to ask it
        # each path in either is marked for the shim while it is (marks.py): it asks for those alone
        self._entries: dict[str, Local | Moved | Gone] = MarkedEntries(marks)
        self._dirs = MarkedDirs(marks)  # made by the job, not yet on the PFS
        self._seq = max(area.pending_data(), default=0)
        # file -> the directory it was created in, marked: the drain's temporary may be there (drain.py)
        self._made_in: dict[int, str] = {}
        self._marks = marks

    def covers(self, path: str) -> bool:
        return any(path == p or _under(path, p) for p in self.paths)

    # -- what a path is in the job's view ---------------------------------------------------
    def resolve(self, path: str) -> tuple[str, str | None]:
        """``("local", data path)``, ``("pfs", the PFS path that holds it now)`` or ``("gone", None)``."""
        with self._lock:
            return self._resolve(path)

    def _resolve(self, path: str) -> tuple[str, str | None]:
        e = self._entries.get(path)
        if isinstance(e, Local):
            return "local", e.through or self.area.data_path(e.seq)
        if isinstance(e, Moved):
            return "pfs", e.pfs_path
        if isinstance(e, Gone):
            return "gone", None
        above = os.path.dirname(path)
        while above and above != "/":  # a directory above it moved or removed by the job
            e = self._entries.get(above)
            if isinstance(e, Moved):
                return "pfs", e.pfs_path + path[len(above):]
            if isinstance(e, (Gone, Local)):  # removed, or a file now: nothing below it
                return "gone", None
            above = os.path.dirname(above)
        return "pfs", path

    # -- the PFS, looked at outside the lock ------------------------------------------------------
    def _looking(self, call, *args):
        """``call(*args)`` under the lock, with what it needs of the PFS looked at outside it: each
        PFS call under the lock (a stat of a slow PFS) would hold every other call of the job. A
        fact the call lacks ends the attempt (the calls check before they change anything) and is
        looked at; the facts hold until the drain changes the PFS."""
        facts: dict = {}
        for _ in range(_ATTEMPTS):
            with self._lock:
                if facts.get("changes", self._pfs_changes) != self._pfs_changes:
                    facts = {}
                self._facts = facts
                try:
                    return call(*args)
                except _Look as e:
                    need, facts["changes"] = e, self._pfs_changes
                finally:
                    self._facts = None
            try:
                facts[need.kind, need.path] = (_LOOKS[need.kind](need.path), None)
            except OSError as e:
                facts[need.kind, need.path] = (None, e)
        with self._lock:
            return call(*args)

    def _pfs(self, kind: str, path: str):
        """What ``os.<kind>(path)`` says, as _looking saw it (or now, for a caller outside _looking)."""
        if self._facts is None:
            return _LOOKS[kind](path)
        try:
            value, error = self._facts[kind, path]
        except KeyError:
            raise _Look(kind, path) from None
        if error is not None:
            raise error
        return value

    def _lstat(self, where: str) -> os.stat_result | None:
        try:
            return self._pfs("lstat", where)
        except OSError:
            return None

    def _pfs_exists(self, where: str) -> bool:
        known = self._known.kind(where)
        if known is not None:
            return known != ABSENT
        return self._lstat(where) is not None

    def _pfs_isdir(self, where: str) -> bool:
        """Is ``where`` a directory on the PFS? Known (from the job's own changes, or seen before: the
        PFS's own directories do not come and go under a job, but by its changes), or one lstat (as
        much as _exists's)."""
        known = self._known.kind(where)
        if known is not None:
            return known == DIR
        st = self._lstat(where)
        if st is not None and stat.S_ISLNK(st.st_mode):
            return self._pfs("isdir", where)  # (a link to a directory is one to the job, as to os.path.isdir)
        if st is not None and stat.S_ISDIR(st.st_mode):
            self._known.seen_dir(where)
            return True
        return False

    def _exists(self, path: str) -> bool:
        kind, where = self._resolve(path)
        return path in self._dirs or kind == "local" or (kind == "pfs" and self._pfs_exists(where))

    def _is_dir(self, path: str) -> bool:
        kind, where = self._resolve(path)
        return path in self._dirs or (kind == "pfs" and self._pfs_isdir(where))

    def _missing(self, path: str) -> OSError:
        """Why ``path`` is not there, as the kernel says it: a file where a directory should be
        above it (ENOTDIR), or nothing (ENOENT)."""
        above = os.path.dirname(path)
        kind, where = self._resolve(above)
        if kind == "pfs" and self._known.kind(where) is None and above not in self._dirs:
            try:  # the PFS's own answer for the directory says which (ENOENT: nothing above is a file)
                self._pfs("lstat", where)
            except (FileNotFoundError, NotADirectoryError) as e:
                return _error(e.errno, path)
            except OSError:
                pass
        while above and above != "/":
            if self._exists(above):  # (the nearest that is there: all above it are directories)
                return _error(errno.ENOENT if self._is_dir(above) else errno.ENOTDIR, path)
            above = os.path.dirname(above)
        return _error(errno.ENOENT, path)

    def listing(self, directory: str) -> list[str]:
        """The names in ``directory`` as the job sees them (sorted)."""
        return self._looking(self._listing, directory)

    def _listing(self, directory: str) -> list[str]:
        kind, where = self._resolve(directory)
        names = set()
        if kind == "pfs" and directory not in self._dirs:  # a directory the job made holds only its own
            try:  # the drain's temporary names are its own, not the job's (drain.temporary_name)
                known = self._known.names(where)
                names = set(known) if known is not None else \
                    {n for n in self._pfs("listdir", where) if not (n.startswith(".") and ".monarch-" in n)}
            except (FileNotFoundError, NotADirectoryError):
                pass
        for path, e in self._entries.items():
            if os.path.dirname(path) == directory:
                (names.discard if isinstance(e, Gone) else names.add)(os.path.basename(path))
        names |= {os.path.basename(d) for d in self._dirs if os.path.dirname(d) == directory}
        return sorted(names)

    # -- the job's changes --------------------------------------------------------------------
    def create(self, path: str, mode: int, exclusive: bool = False, after: tuple = (),
               ahead: bool = False) -> tuple[int, str]:
        """A file created or truncated for writing: its sequence number and where its bytes go.
        ``mode``: the app's, under its umask (what a direct create would give the file);
        ``after``: the other nodes' operations recorded before this open (W4); ``ahead``: its open
        journaled, for the drain to make its temporary on the PFS now (drain.py)."""
        return self._looking(self._create, path, mode, exclusive, after, ahead)

    def _create(self, path: str, mode: int, exclusive: bool = False, after: tuple = (),
                ahead: bool = False) -> tuple[int, str]:
        if not self._is_dir(os.path.dirname(path)):
            raise self._missing(path)
        if self._is_dir(path):
            raise _error(errno.EISDIR, path)
        exists = self._exists(path)
        if exclusive and exists:
            raise _error(errno.EEXIST, path)
        e = self._entries.get(path)
        if isinstance(e, Local) and not e.closed:
            return e.seq, e.through or self.area.data_path(e.seq)  # the same open file, truncated by its opener
        self._seq += 1
        fd = os.open(self.area.data_path(self._seq), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        self._entries[path] = Local(self._seq, stat.S_IMODE(mode), over=exists, after=tuple(after))
        if ahead:
            self.journal.append("open", seq=self._seq, path=path, mode=stat.S_IMODE(mode))
            self._made_in[self._seq] = os.path.dirname(path)
            if self._marks is not None:
                self._marks.add(_temporaries(os.path.dirname(path)))
        return self._seq, self.area.data_path(self._seq)

    def close(self, seq: int) -> int | None:
        """File ``seq`` closed by the job (no process holds it open): its close journaled, at the
        path it has now; the record's number (None: the job removed it, nothing to publish)."""
        with self._lock:
            for path, entry in self._entries.items():
                if isinstance(entry, Local) and entry.seq == seq and not entry.closed:
                    st = os.stat(entry.through or self.area.data_path(seq))
                    entry.closed = True
                    # (its time: a partner's copy of it takes it, so that its copy is seen to be the PFS file's)
                    entry.last_record = self.journal.append("close", seq=seq, path=path, mode=entry.mode,
                                                            size=st.st_size, mtime=st.st_mtime_ns,
                                                            **entry.close_args())
                    entry.close_record = entry.last_record
                    return entry.last_record
            return None

    def sync(self, seq: int, waited: bool = False) -> int | None:
        """The job asked for file ``seq``'s bytes so far on the PFS (fsync): a ``sync`` record at
        its path now, whose number to wait for (None: not a file being written); ``waited``: the
        fsync waits for the PFS (``fsync: pfs``), which then holds them under its name, as a direct
        fsync leaves them (docs/consistency.md, W2)."""
        with self._lock:
            for path, entry in self._entries.items():
                if isinstance(entry, Local) and entry.seq == seq and not entry.closed:
                    size = os.stat(entry.through or self.area.data_path(seq)).st_size
                    # the PFS holds a file at its path from here: a rename or removal before its
                    # close is made there too, in order
                    entry.over = entry.synced = entry.unchanged = True
                    return self.journal.append("sync", seq=seq, path=path, mode=entry.mode, size=size,
                                               **entry.order(), **({"waited": True} if waited else {}))
            return None

    def closing(self, seq: int, synced: bool) -> None:
        """A process closes a descriptor of file ``seq``: ``synced`` when it wrote nothing to it since
        its last fsync (else the fsync's copy on the PFS may not be the file any more)."""
        with self._lock:
            for entry in self._entries.values():
                if isinstance(entry, Local) and entry.seq == seq and not entry.closed and not synced:
                    entry.unchanged = False

    def touches(self, path: str) -> bool:
        """Has the job changed ``path`` or a directory above it in a way the PFS does not show yet?"""
        with self._lock:
            above = path
            while above and above != "/":
                if above in self._entries or above in self._dirs:
                    return True
                above = os.path.dirname(above)
            return False

    def being_written(self, seq: int) -> tuple[str, Local] | None:
        """File ``seq``'s path and entry while it is being written (None: not such a file)."""
        with self._lock:
            for path, entry in self._entries.items():
                if isinstance(entry, Local) and entry.seq == seq and not entry.closed:
                    return path, entry
            return None

    def where(self, seq: int) -> str:
        """Where file ``seq``'s bytes are: its area copy, or the PFS path it is written through to."""
        found = self.being_written(seq)
        return (found[1].through if found else None) or self.area.data_path(seq)

    def written_through(self, seq: int, tmp: str) -> None:
        """File ``seq``, larger than the room, is written at ``tmp`` on the PFS from now on."""
        with self._lock:
            for entry in self._entries.values():
                if isinstance(entry, Local) and entry.seq == seq and not entry.closed:
                    entry.through = tmp

    def set_mode(self, seq: int, mode: int) -> bool:
        """chmod of file ``seq``, being written: the mode it is published with."""
        with self._lock:
            for entry in self._entries.values():
                if isinstance(entry, Local) and entry.seq == seq and not entry.closed:
                    entry.mode = stat.S_IMODE(mode)
                    return True
            return False

    def is_dir(self, path: str) -> bool:
        return self._looking(self._is_dir, path)

    def exists(self, path: str) -> bool:
        """Is there anything at ``path`` as the job sees it (known, or one lstat outside the lock)?"""
        return self._looking(self._exists, path)

    def outside(self, *paths: str) -> None:
        """The kernel makes a call at these paths itself (a link, a symlink): what is known of them is not."""
        with self._lock:
            for p in paths:
                if p:
                    self._known.forget(self._resolve(p)[1] or p)

    def made_dir(self, path: str) -> bool:
        """A directory the job made that the drain had not made on the PFS when last applied (no PFS call; a
        rename of it before its mkdir was applied moves it here: the PFS may hold it at its old name)."""
        with self._lock:
            return path in self._dirs

    def pending_in(self, directory: str) -> bool:
        """Has the job changed anything directly in ``directory`` that the PFS does not show yet?"""
        with self._lock:
            return any(os.path.dirname(p) == directory for p in (*self._entries, *self._dirs)) \
                or directory in self._made_in.values()

    def entry(self, path: str) -> Local | Moved | Gone | None:
        with self._lock:
            return self._entries.get(path)

    def open_seqs(self) -> list[int]:
        """The files being written (not closed)."""
        with self._lock:
            return [e.seq for e in self._entries.values() if isinstance(e, Local) and not e.closed]

    def rename(self, src: str, dst: str, noreplace: bool = False) -> None:
        """``noreplace``: renameat2's RENAME_NOREPLACE (EEXIST where ``dst`` is there)."""
        return self._looking(self._rename, src, dst, noreplace)

    def _rename(self, src: str, dst: str, noreplace: bool = False) -> None:
        for path in (src, dst):  # both directories looked up first, as the kernel does
            if not self._is_dir(os.path.dirname(path)):
                raise self._missing(path)
        if not self._exists(src):
            raise self._missing(src)
        if noreplace and self._exists(dst):
            raise _error(errno.EEXIST, dst)
        if src == dst:
            return
        if _under(src, dst):
            raise _error(errno.ENOTEMPTY, dst)  # the kernel's answer for a directory above the source
        if self._is_dir(src):
            self._rename_dir(src, dst)
            return
        if self._is_dir(dst):
            raise _error(errno.EISDIR, dst)
        e = self._entries.get(src)
        replaced = self._exists(dst)
        if isinstance(e, Local) and not e.closed and e.synced:  # being written, its fsync's copy on the PFS
            n = self.journal.append("rename", src=src, dst=dst)  # moves there too: one name, as directly
            self._entries[dst] = dataclasses.replace(e, over=True)
            self._entries[src] = Gone(n)
            return
        if isinstance(e, Local) and not e.closed:  # still being written: its close names its new path
            self._entries[dst] = dataclasses.replace(e, over=e.over or replaced)
            self._forget(src, e.over)
            return
        n = self.journal.append("rename", src=src, dst=dst)
        kind, where = self._resolve(src)
        if isinstance(e, Local):
            entry = e
            entry.last_record = n
            self._entries[dst] = entry
        else:
            self._entries[dst] = Moved(where, n)
        self._entries[src] = Gone(n)

    def _rename_dir(self, src: str, dst: str) -> None:
        if _under(dst, src):
            raise _error(errno.EINVAL, dst)
        if self._exists(dst) and (not self._is_dir(dst) or self._listing(dst)):
            raise _error(errno.ENOTEMPTY if self._is_dir(dst) else errno.ENOTDIR, dst)
        n = self.journal.append("rename", src=src, dst=dst)
        kind, where = self._resolve(src)
        if src in self._dirs:  # made by the job (over a name it removed): at its own path once made on the PFS
            where = src
        for path in [p for p in self._entries if _under(p, src)]:  # what was found through src, through dst now
            self._entries[dst + path[len(src):]] = self._entries.pop(path)
        self._dirs.keep_only(dst + d[len(src):] if d == src or _under(d, src) else d for d in self._dirs)
        self._entries[dst] = Moved(where, n)
        self._entries[src] = Gone(n)

    def _forget(self, path: str, over: bool) -> None:
        """A name that held a file being written, now gone from the view: removed on the PFS too
        (in journal order) if it replaced a file there; else it never reached the PFS."""
        if over:
            self._entries[path] = Gone(self.journal.append("unlink", path=path))
        else:
            self._entries.pop(path, None)

    def unlink(self, path: str) -> None:
        return self._looking(self._unlink, path)

    def _unlink(self, path: str) -> None:
        if not self._exists(path):
            raise self._missing(path)
        if self._is_dir(path):
            raise _error(errno.EISDIR, path)
        e = self._entries.get(path)
        if isinstance(e, Local) and not e.closed:  # never closed, now nameless: never published
            self.journal.append("drop", seq=e.seq, **({"through": e.through} if e.through else {}))
            self._forget(path, e.over)
            return
        self._entries[path] = Gone(self.journal.append("unlink", path=path))

    def mkdir(self, path: str, mode: int) -> None:
        return self._looking(self._mkdir, path, mode)

    def _mkdir(self, path: str, mode: int) -> None:
        if not self._is_dir(os.path.dirname(path)):  # (first: makedirs tries the deepest first)
            raise self._missing(path)
        if self._exists(path):
            raise _error(errno.EEXIST, path)
        self.journal.append("mkdir", path=path, mode=stat.S_IMODE(mode))
        if self._resolve(path) == ("pfs", path):  # where the PFS has nothing: all it will hold is the job's
            self._known.making(path)
        self._dirs.add(path)  # a Gone entry here stays: what the PFS still holds below it is not the job's

    def rmdir(self, path: str) -> None:
        return self._looking(self._rmdir, path)

    def _rmdir(self, path: str) -> None:
        if not self._is_dir(path):
            raise _error(errno.ENOTDIR, path) if self._exists(path) else self._missing(path)
        if self._listing(path):
            raise _error(errno.ENOTEMPTY, path)
        self._entries[path] = Gone(self.journal.append("rmdir", path=path))
        self._dirs.discard(path)

    # -- the drain's progress -------------------------------------------------------------------
    @contextlib.contextmanager
    def applying(self, rec):
        """Held while the drain makes record ``rec``'s change on the PFS: the view changes with it
        (no call sees the PFS changed and the view not, or the reverse)."""
        with self._lock:
            self._pfs_changes += 1
            yield
            self._known.applied(rec.op, rec.args)  # (made: a refused change stops the drain, and is not known)
            n = rec.n
            if rec.op == "close":  # published: a closed file renamed since is at its close's path now
                for key, e in list(self._entries.items()):
                    if isinstance(e, Local) and e.closed and e.close_record == n and e.last_record > n:
                        self._entries[key] = Moved(rec["path"], e.last_record)
            elif rec.op == "rename":  # what was found at the source is at the destination now
                src, dst = rec["src"], rec["dst"]
                for key, e in list(self._entries.items()):
                    if isinstance(e, Moved) and e.last_record > n and (e.pfs_path == src or _under(e.pfs_path, src)):
                        self._entries[key] = Moved(dst + e.pfs_path[len(src):], e.last_record)
            for path in [p for p, e in self._entries.items() if e.last_record and e.last_record <= n
                         and (not isinstance(e, Local) or e.closed)]:
                del self._entries[path]
            if rec.op == "mkdir":
                self._dirs.discard(rec["path"])

    def applied(self, upto: int) -> None:
        """Records up to ``upto`` are on the PFS: what they alone named is the PFS's own now."""
        with self._lock:
            for path in [p for p, e in self._entries.items() if e.last_record and e.last_record <= upto
                         and (not isinstance(e, Local) or e.closed)]:
                del self._entries[path]
            self._dirs.keep_only([d for d in self._dirs if not os.path.isdir(d)])
            if upto >= self.journal.last_op:  # (every temporary of a file the job no longer writes is gone: drain.py)
                open_seqs = {e.seq for e in self._entries.values() if isinstance(e, Local)}
                for seq in [seq for seq in self._made_in if seq not in open_seqs]:
                    directory = self._made_in.pop(seq)
                    if self._marks is not None:
                        self._marks.remove(_temporaries(directory))

    def pending(self) -> bool:
        """Is anything of the job's not on the PFS yet?"""
        with self._lock:
            return bool(self._entries or self._dirs)
