"""The drain: a journal's operations applied to the PFS strictly in order, each after every one
before it (docs/consistency.md, "Write-back", W2 and W3).

A closed file is published by writing its bytes to ``.<name>.monarch-<run>-<seq>`` in its
directory, flushing them, and renaming that over its name: the name never shows a short file
(under ``fsync: pfs`` that temporary is made at the file's open: ahead.py). After each operation an ``applied`` record is appended, so a drain resumed after a crash starts
at the first operation not applied. An operation cut short by the crash is applied again, and
each is safe to apply twice: a publish writes the same bytes to the same temporary name and
renames them again; a rename whose source is gone and whose destination is there, an unlink of
a name already gone, a ``mkdir`` of a directory there, are done. A file's local bytes are removed
only after its publish is recorded.

A refused operation (``ENOSPC``, ``EDQUOT``, ``EACCES``, ``EIO`` ...) stops the drain there:
nothing after it is applied (it may depend on it), nothing unpublished is removed, and the
outcome names every file not published and where its bytes are.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import stat
import time
from dataclasses import dataclass, field
from contextlib import nullcontext
from typing import Callable, ContextManager

from monarch.writeback.ahead import Ahead, Aheads, Dirs
from monarch.writeback.area import Area
from monarch.writeback.journal import Journal, Record, Tail, read

log = logging.getLogger(__name__)

# Made on the PFS before the view changes, not while it holds its lock (the job's calls go on):
# until it changes, the view answers these paths from its own entries (a directory made, a name
# removed), never from the PFS. A rename is made under the lock: the view answers a renamed path
# with the PFS path its bytes are at, which the rename changes.
OUTSIDE_COMMIT = ("mkdir", "rmdir", "unlink")
COPY_CHUNK = 1 << 20  # bytes per write to the PFS: a parallel filesystem's (and FUSE's) own request size


@dataclass
class Outcome:
    applied: int = 0                  # operations applied by this drain
    upto: int = 0                     # every record up to this one is on the PFS
    published: list[str] = field(default_factory=list)  # the PFS paths published, in order
    published_bytes: int = 0
    copied_bytes: int = 0             # of those, copied by the drain (not written through by the job)
    failed: str | None = None         # the operation that was refused, and why
    unpublished: dict[str, str] = field(default_factory=dict)  # PFS path -> where its bytes are kept
    damaged: str | None = None        # why the journal's reading stopped early

    @property
    def complete(self) -> bool:
        return self.failed is None and not self.unpublished and self.damaged is None


@dataclass
class Following:
    """A run's drains of the journal it appends to, one after another: the journal as they read it
    (each only what was appended since) and what the last one did."""
    tail: Tail
    upto: int = 0  # every record up to here is applied
    # file -> the copy its last fsync left under its name: (PFS path, size, mtime_ns, mode, written in place)
    synced: dict[int, tuple[str, int, int, int, bool]] = field(default_factory=dict)
    copied: list[float] = field(default_factory=lambda: [0, 0.0])  # bytes its publishes wrote, and their seconds
    ahead: Aheads = field(default_factory=Aheads)  # the temporaries made at their files' open, the directories kept

    def rate(self) -> float | None:
        """The PFS's bytes a second as its publishes met them (None: none timed yet)."""
        nbytes, seconds = self.copied
        return nbytes / seconds if nbytes and seconds > 0 else None

    def applied(self, upto: int) -> None:
        """Every record up to ``upto`` is applied: the next drain starts after it (and no longer reads them)."""
        self.upto = upto
        self.tail.forget(upto)


def temporary_name(path: str, run_id: str, seq: int) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.monarch-{run_id}-{seq}")


def copy_bytes(src_fd: int, dst_fd: int, size: int) -> None:
    """``size`` bytes in writes of COPY_CHUNK (copy_file_range and sendfile between a tmpfs and a
    network filesystem go through a pipe: 64 KiB requests, measured 16x the PFS's requests)."""
    buf = mmap.mmap(-1, COPY_CHUNK)  # page-aligned: FUSE splits a write from an unaligned buffer in two
    view = memoryview(buf)
    done = 0
    while done < size:
        n = os.readv(src_fd, [view[:min(COPY_CHUNK, size - done)]])
        if n == 0:
            raise OSError(errno.EIO, f"the local copy ended at {done} of its {size} bytes")
        written = 0
        while written < n:
            written += os.write(dst_fd, view[written:n])
        done += n
    view.release()
    buf.close()


def copy_file(src_path: str, dst_path: str) -> None:
    """The whole of ``src_path`` (as it is now) written to ``dst_path``, made or cut, private."""
    src = os.open(src_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            copy_bytes(src, dst, os.fstat(src).st_size)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def publish(area: Area, rec: Record, run_id: str, commit: ContextManager = nullcontext(),
            following: Following | None = None, released: Callable[[], None] | None = None) -> None:
    """File ``rec['seq']``'s bytes to its PFS path, complete under its name or not at all; a
    ``sync`` (its first ``size`` bytes, the file still being written) that the job waits on
    (``waited``) in place, as a direct write and fsync leave a file; the change under ``commit``."""
    path, size = rec["path"], rec["size"]
    through = rec.args.get("through")  # written through: its bytes are at that PFS path already (W6)
    ahead = following.ahead.take(rec["seq"]) if following is not None else None
    made = following.synced.pop(rec["seq"], None) if following is not None else None
    before = made if made is not None and made[0] == path and made[4] else None
    if ahead is not None and (through or not ahead.usable(path, before)):
        ahead.let_go(remove=through != os.path.join(os.path.dirname(ahead.path), ahead.name))  # (a spill's: its own)
        ahead = None
    if through and rec.op == "close":
        if not os.path.lexists(through) and os.path.lexists(path):
            return  # renamed before a crash: published
        os.chmod(through, stat.S_IMODE(rec["mode"]))
        with commit:
            os.rename(through, path)
        return
    if rec.op == "close" and rec.args.get("synced"):
        mode = _its_sync(area, rec, made)
        if mode is not None:  # its fsync's copy, under its name already, times and all
            if ahead is not None:
                ahead.let_go()
            if mode != stat.S_IMODE(rec["mode"]):
                with commit:  # (a chmod of the open file since)
                    os.chmod(path, stat.S_IMODE(rec["mode"]))
            return
    kept = False
    try:
        kept = _copy(area, rec, run_id, commit, following, ahead, before, released)
    finally:
        if ahead is not None and not kept:  # (closed; a temporary no copy took removed)
            ahead.let_go()


def _copy(area: Area, rec: Record, run_id: str, commit: ContextManager, following: Following | None,
          ahead: Ahead | None, before: tuple | None, released: Callable[[], None] | None = None) -> bool:
    """``publish``'s copy of file ``rec['seq']``'s bytes: into the temporary made at its open
    (``ahead``), in place (``before``: its last fsync's copy is there; or the fsync the job waits
    on), or into a temporary made now. ``released()``: the job's fsync may return (its bytes are
    flushed under its name; the times are set after). True: the file's descriptor is kept (in
    ``following``), for the next copy in place."""
    path, size = rec["path"], rec["size"]
    through = rec.args.get("through")
    dirs = following.ahead.dirs if following is not None else None
    waited = rec.op == "sync" and bool(rec.args.get("waited"))
    # the bytes of an fsync the job waits on go under the file's name, as a direct fsync leaves
    # them; so do a close's after such an fsync (as a direct job's writes after it land there)
    in_place = not through and (waited or before is not None)
    src = os.open(through or area.data_path(rec["seq"]), os.O_RDONLY | os.O_CLOEXEC)
    try:
        have = os.fstat(src).st_size
        if have != size and not (rec.op == "sync" and have > size):
            raise OSError(errno.EIO, f"the copy {through or area.data_path(rec['seq'])} is not its {size} bytes")
        if ahead is None and in_place:
            ahead = _open_in_place(rec, before, dirs)
            in_place = ahead is not None
        if ahead is not None:  # its temporary, renamed over its name once filled; or the file itself
            mode = stat.S_IMODE(rec["mode"])
            if ahead.placed:
                os.lseek(ahead.fd, 0, os.SEEK_SET)
            cut = ahead.placed and before is not None and before[1] > size
            later = waited and released is not None  # (the times after the job's fsync returned)
            try:
                _fill(src, ahead.fd, rec, cut=cut, set_mode=ahead.mode != mode, times=not later)
                with commit:  # (the view's answers: the PFS's from here; until here its own, the entry's)
                    if not ahead.placed:
                        os.rename(ahead.name, os.path.basename(path), src_dir_fd=ahead.dirfd, dst_dir_fd=ahead.dirfd)
                ahead.place(path, mode)
                if later:
                    released()
                    _times(src, ahead.fd)
            except BaseException:
                ahead.let_go()
                raise
            if not (rec.op == "sync" and following is not None and in_place):
                ahead.let_go()
        else:
            in_place = False
            dirfd, name = dirs.at(path) if dirs is not None else (None, path)
            tmp = os.path.basename(temporary_name(path, run_id, rec["seq"])) if dirs is not None \
                else temporary_name(path, run_id, rec["seq"])
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
            try:
                _fill(src, dst, rec, cut=False, set_mode=True)  # (a new file: O_TRUNC)
            finally:
                os.close(dst)
            with commit:
                os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        if rec.op == "sync" and following is not None:
            following.synced[rec["seq"]] = (path, size, os.fstat(src).st_mtime_ns, stat.S_IMODE(rec["mode"]), in_place)
            if ahead is not None and in_place:  # (the close's copy, or the next fsync's, goes to it)
                return following.ahead.keep(rec["seq"], ahead)
        return False
    finally:
        os.close(src)


def _fill(src: int, dst: int, rec: Record, cut: bool, set_mode: bool, times: bool = True) -> None:
    """``rec``'s bytes copied (the file cut there: ``cut``), its mode set (``set_mode``: else it was
    made with it) and its last write's time (not the drain's; ``times``: else by the caller), flushed."""
    copy_bytes(src, dst, rec["size"])
    if cut:
        os.ftruncate(dst, rec["size"])
    if set_mode:
        os.fchmod(dst, stat.S_IMODE(rec["mode"]))  # the app's mode under its umask, as it asked
    if times:
        _times(src, dst)
    os.fsync(dst)


def _times(src: int, dst: int) -> None:
    local = os.fstat(src)
    os.utime(dst, ns=(local.st_atime_ns, local.st_mtime_ns))


def _open_in_place(rec: Record, before: tuple | None, dirs: Dirs | None) -> Ahead | None:
    """File ``rec``'s own name on the PFS, open for its bytes: no temporary, no rename (a path walk
    fewer on the PFS's metadata service). ``before``: the copy this run's last fsync of it left
    there (path, size, time, mode), None where there is none. None where the name cannot be opened
    as a file of the job's (a symlink, a directory, a file it may not write): the temporary and
    the rename then."""
    path, mode = rec["path"], stat.S_IMODE(rec["mode"])
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dirfd, name = dirs.at(path) if dirs is not None else (None, path)
        if before is None:  # a new name, mostly: made with its mode, where the daemon's umask keeps it
            try:
                dst = os.open(name, flags | os.O_CREAT | os.O_EXCL, mode, dir_fd=dirfd)
                made = mode & 0o777 & ~_umask()
            except FileExistsError:
                dst, made = os.open(name, flags | os.O_TRUNC, dir_fd=dirfd), -1
        else:  # its earlier copy: written over, cut where it was longer
            dst, made = os.open(name, flags | os.O_CREAT, 0o600, dir_fd=dirfd), before[3]
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.EACCES, errno.EPERM, errno.ETXTBSY, errno.EROFS):
            return None
        raise
    return Ahead(path, os.dup(dirfd) if dirfd is not None else -1, dst, name, made, placed=True)


def _its_sync(area: Area, rec: Record, made: tuple | None) -> int | None:
    """The mode of the PFS file at a closed file's path, where it is the copy its last fsync made
    (the job wrote nothing since, its close said); None (copied whole) otherwise. Known without
    asking the PFS where this run's drain made that copy at this path of the local file as it is
    now (``made``: path, size, time, mode; a rename since is a record before the close, and names
    another path); else checked on the PFS by its size and its time, which the copy took from the
    local file's last write."""
    local = os.stat(area.data_path(rec["seq"]))
    if local.st_size != rec["size"]:
        return None
    if made is not None and made[:3] == (rec["path"], local.st_size, local.st_mtime_ns):
        return made[3]
    try:
        pfs = os.lstat(rec["path"])
    except FileNotFoundError:
        return None
    if stat.S_ISREG(pfs.st_mode) and pfs.st_size == local.st_size and pfs.st_mtime_ns == local.st_mtime_ns:
        return stat.S_IMODE(pfs.st_mode)
    return None


def apply(area: Area, rec: Record, run_id: str, commit: ContextManager = nullcontext(),
          following: Following | None = None, released: Callable[[], None] | None = None) -> None:
    """One operation on the PFS; safe to apply again after a crash cut it short. ``commit``: held
    while the PFS changes (a publish's copy before it), so that the job's view changes with it."""
    op = rec.op
    if following is not None:
        following.ahead.dirs.trim()
    if op in ("close", "sync"):
        started = time.monotonic()
        publish(area, rec, run_id, commit, following, released)
        if following is not None and not (rec.args.get("through") or rec.args.get("synced")):  # (a whole copy)
            following.copied[0] += rec["size"]
            following.copied[1] += time.monotonic() - started
    elif op == "open":
        if following is not None:  # (else a drain resumed after a crash: left_ahead removes what was made)
            following.ahead.make(rec["seq"], rec["path"], os.path.basename(temporary_name(rec["path"], run_id, rec["seq"])),
                                 rec.args.get("mode", 0o600), _umask())
    else:
        dirs = None
        if following is not None:
            following.ahead.follow(op, rec.args)
            dirs = following.ahead.dirs
        if op in OUTSIDE_COMMIT:
            _namespace(rec, dirs)
            with commit:
                pass
        else:
            with commit:
                _namespace(rec, dirs)


def _namespace(rec: Record, dirs: Dirs | None = None) -> None:
    """A namespace record applied; by ``dirs`` (the drain's directories kept open: a lookup of a
    name in one, not a walk of its path) where given."""
    op = rec.op
    at = dirs.at if dirs is not None else (lambda p: (None, p))
    if op == "rename":
        try:
            (sfd, src), (dfd, dst) = at(rec["src"]), at(rec["dst"])
            os.rename(src, dst, src_dir_fd=sfd, dst_dir_fd=dfd)
        except FileNotFoundError:
            if not os.path.lexists(rec["dst"]):
                raise
    elif op == "unlink":
        try:
            fd, name = at(rec["path"])
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
    elif op == "mkdir":
        mode = stat.S_IMODE(rec["mode"])
        fd, name = at(rec["path"])
        try:
            os.mkdir(name, mode, dir_fd=fd)
        except FileExistsError:
            os.chmod(name, mode, dir_fd=fd)
        else:
            if mode & (_umask() | 0o7000):  # the daemon's umask took bits the job's mkdir gave
                os.chmod(name, mode, dir_fd=fd)
    elif op == "rmdir":
        try:
            fd, name = at(rec["path"])
            os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
            pass
    elif op == "chmod":
        fd, name = at(rec["path"])
        os.chmod(name, stat.S_IMODE(rec["mode"]), dir_fd=fd)
    elif op == "utime":
        fd, name = at(rec["path"])
        os.utime(name, ns=(rec["atime_ns"], rec["mtime_ns"]), dir_fd=fd)
    elif op == "drop" and rec.args.get("through"):
        try:  # removed by the job before it was published: what was written through goes too
            os.unlink(rec["through"])
        except FileNotFoundError:
            pass


def drain(area: Area, run_id: str, journal: Journal | None = None,
          step: Callable[[str, Record], None] | None = None,
          before: Callable[[Record], None] | None = None,
          commit: Callable[[Record], ContextManager] | None = None, start: int = 0,
          following: Following | None = None, released: Callable[[Record], None] | None = None) -> Outcome:
    """Apply every operation of ``area``'s journal not yet applied, in order; ``journal``: the one
    the run appends to (else one is opened to record progress). ``step(phase, record)`` is called
    before and after each operation (``"apply"``, ``"applied"``): the tests crash the drain there.
    ``before(record)``: called before a publish that is ordered after other nodes' operations
    (its ``after``, W4): it returns once they are on the PFS, or raises OSError (refused).
    ``commit(record)``: a context held while the PFS changes (the job's view applies it there).
    ``start``: every record up to it is known on the PFS already (applied from another copy of the journal).
    ``following``: the run's own drains of the journal it appends to, one after another (else the
    journal is read whole, and every local copy of a file already published is removed).
    ``released(record)``: an fsync the job waits on may return (its bytes flushed under its name)."""
    records, damaged = following.tail.read() if following is not None else read(area.journal_path)
    if following is not None:
        last = max(start, following.upto)
    else:
        last = max([start, *(r["upto"] for r in records if r.op == "applied")])
    base = following.tail.base if following is not None else 0  # (record n is records[n - 1 - base])
    first = last - base if following is not None else 0  # where this pass's records start
    applied, published, failed = 0, [], None
    own = journal is None
    journal = journal or Journal(area.journal_path, durable=True)
    try:
        for i in range(last - base, len(records)):
            rec = records[i]
            if rec.op == "applied":
                continue
            if step:
                step("apply", rec)
            try:
                if not (rec.op == "close" and _removed_later(records, i)):
                    if before is not None and rec.args.get("after"):
                        before(rec)
                    if rec.op == "open" and _published_soon(records, i):
                        pass  # (its fsync's copy is next: made in place, not a temporary then a rename)
                    else:
                        apply(area, rec, run_id, commit(rec) if commit else nullcontext(), following,
                              (lambda r=rec: released(r)) if released is not None else None)
                else:  # never published: what was written through goes
                    if following is not None:
                        following.synced.pop(rec["seq"], None)  # (its fsync's copy: named by no close now)
                        following.ahead.let_go(rec["seq"])
                    if rec.args.get("through"):
                        apply(area, Record(rec.n, "drop", {"seq": rec["seq"], "through": rec["through"]}), run_id)
            except OSError as e:
                failed = f"{rec.op} {rec.args}: {e.strerror or e}"
                log.error("write-back: %s (nothing after it is applied; the pending bytes stay in %s)",
                          failed, area.path)
                break
            journal.append("applied", upto=rec.n)
            last, applied = rec.n, applied + 1
            if step:
                step("applied", rec)
            if rec.op in ("close", "drop"):
                _remove_data(area, rec["seq"])
            if rec.op == "close" and not _removed_later(records, i):
                published.append(rec)
    finally:
        if own:
            journal.close()
    if following is not None:
        following.applied(last)
    else:
        _left_ahead(records, run_id)
    unpublished = {}
    for rec in records[first:]:
        if rec.op == "close" and rec.n <= last:
            _remove_data(area, rec["seq"])  # published: what a crash left after its record
        elif rec.op == "close":  # still only here (or at its temporary PFS path), and where
            unpublished[rec["path"]] = rec.args.get("through") or area.data_path(rec["seq"])
    return Outcome(applied=applied, upto=last, published=[r["path"] for r in published],
                   published_bytes=sum(r["size"] for r in published),
                   copied_bytes=sum(r["size"] for r in published if not r.args.get("through")),
                   failed=failed, unpublished=unpublished,
                   damaged=damaged)


def _umask() -> int:
    """This process's umask, read without setting it (another thread may be creating a file);
    all bits (always chmod) where the kernel does not say."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o777


def _removed_later(records: list[Record], i: int) -> bool:
    """Does the job remove record ``i``'s file (a close) before anything else names its path? Then
    it is never written: no one could rely on a file its job removed unseen."""
    path = records[i]["path"]
    for rec in records[i + 1:]:
        if rec.op == "unlink" and rec["path"] == path:
            return True
        if rec.op not in ("applied", "open") and path in (rec.args.get("path"), rec.args.get("src"), rec.args.get("dst")):
            return False
    return False


def _left_ahead(records: list[Record], run_id: str) -> None:
    """The temporaries a killed run's drain made at its files' opens, removed: each a close at the
    same path did not take (a file never closed, or closed elsewhere)."""
    taken = {(r["seq"], r["path"]) for r in records if r.op == "close"}
    for r in records:
        if r.op == "open" and (r["seq"], r["path"]) not in taken:
            try:
                os.unlink(temporary_name(r["path"], run_id, r["seq"]))
            except OSError:
                pass


def _published_soon(records: list[Record], i: int, ahead: int = 32) -> bool:
    """Is open record ``i``'s file fsynced or closed in the next ``ahead`` records, read already?"""
    seq = records[i]["seq"]
    return any(r.op in ("sync", "close") and r.args.get("seq") == seq for r in records[i + 1:i + 1 + ahead])


def _remove_data(area: Area, seq: int) -> None:
    try:
        os.unlink(area.data_path(seq))
    except FileNotFoundError:
        pass
