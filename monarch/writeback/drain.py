"""The drain: a journal's operations applied to the PFS strictly in order, each after every one
before it (docs/consistency.md, "Write-back", W2 and W3).

A closed file is published by writing its bytes to ``.<name>.monarch-<run>-<seq>`` in its
directory, flushing them, and renaming that over its name: the name never shows a short file.
After each operation an ``applied`` record is appended, so a drain resumed after a crash starts
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
from dataclasses import dataclass, field
from contextlib import nullcontext
from typing import Callable, ContextManager

from monarch.writeback.area import Area
from monarch.writeback.journal import Journal, Record, read

log = logging.getLogger(__name__)

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


def publish(area: Area, rec: Record, run_id: str, commit: ContextManager = nullcontext()) -> None:
    """File ``rec['seq']``'s bytes to its PFS path, complete under its name or not at all (a
    ``sync``: its first ``size`` bytes, the file still being written); the rename under ``commit``."""
    path, size = rec["path"], rec["size"]
    tmp = temporary_name(path, run_id, rec["seq"])
    through = rec.args.get("through")  # written through: its bytes are at that PFS path already (W6)
    if through and rec.op == "close":
        if not os.path.lexists(through) and os.path.lexists(path):
            return  # renamed before a crash: published
        os.chmod(through, stat.S_IMODE(rec["mode"]))
        with commit:
            os.rename(through, path)
        return
    if rec.op == "close" and rec.args.get("synced") and _is_its_sync(area, rec):
        local = os.stat(area.data_path(rec["seq"]))
        with commit:  # its fsync's copy, under its name already: its mode and times as the job left them
            os.chmod(path, stat.S_IMODE(rec["mode"]))
            os.utime(path, ns=(local.st_atime_ns, local.st_mtime_ns))
        return
    src = os.open(through or area.data_path(rec["seq"]), os.O_RDONLY | os.O_CLOEXEC)
    try:
        have = os.fstat(src).st_size
        if have != size and not (rec.op == "sync" and have > size):
            raise OSError(errno.EIO, f"the copy {through or area.data_path(rec['seq'])} is not its {size} bytes")
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            copy_bytes(src, dst, size)
            os.fchmod(dst, stat.S_IMODE(rec["mode"]))  # the app's mode under its umask, as it asked
            local = os.fstat(src)
            os.utime(dst, ns=(local.st_atime_ns, local.st_mtime_ns))  # its last write's time (or utime's), not the drain's
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    with commit:
        os.rename(tmp, path)


def _is_its_sync(area: Area, rec: Record) -> bool:
    """Is the file at a closed file's PFS path the copy its last fsync made (the job wrote nothing
    since, its close said)? Checked again here: its size, and its time, which the copy took from
    the local file's last write; anything else is copied whole."""
    try:
        pfs, local = os.lstat(rec["path"]), os.stat(area.data_path(rec["seq"]))
    except FileNotFoundError:
        return False
    return (stat.S_ISREG(pfs.st_mode) and pfs.st_size == local.st_size == rec["size"]
            and pfs.st_mtime_ns == local.st_mtime_ns)


def apply(area: Area, rec: Record, run_id: str, commit: ContextManager = nullcontext()) -> None:
    """One operation on the PFS; safe to apply again after a crash cut it short. ``commit``: held
    while the PFS changes (a publish's copy before it), so that the job's view changes with it."""
    op = rec.op
    if op in ("close", "sync"):
        publish(area, rec, run_id, commit)
    else:
        with commit:
            _namespace(rec)


def _namespace(rec: Record) -> None:
    op = rec.op
    if op == "rename":
        try:
            os.rename(rec["src"], rec["dst"])
        except FileNotFoundError:
            if not os.path.lexists(rec["dst"]):
                raise
    elif op == "unlink":
        try:
            os.unlink(rec["path"])
        except FileNotFoundError:
            pass
    elif op == "mkdir":
        try:
            os.mkdir(rec["path"], 0o700)
        except FileExistsError:
            pass
        os.chmod(rec["path"], stat.S_IMODE(rec["mode"]))
    elif op == "rmdir":
        try:
            os.rmdir(rec["path"])
        except FileNotFoundError:
            pass
    elif op == "chmod":
        os.chmod(rec["path"], stat.S_IMODE(rec["mode"]))
    elif op == "utime":
        os.utime(rec["path"], ns=(rec["atime_ns"], rec["mtime_ns"]))
    elif op == "drop" and rec.args.get("through"):
        try:  # removed by the job before it was published: what was written through goes too
            os.unlink(rec["through"])
        except FileNotFoundError:
            pass


def drain(area: Area, run_id: str, journal: Journal | None = None,
          step: Callable[[str, Record], None] | None = None,
          before: Callable[[Record], None] | None = None,
          commit: Callable[[Record], ContextManager] | None = None, start: int = 0) -> Outcome:
    """Apply every operation of ``area``'s journal not yet applied, in order; ``journal``: the one
    the run appends to (else one is opened to record progress). ``step(phase, record)`` is called
    before and after each operation (``"apply"``, ``"applied"``): the tests crash the drain there.
    ``before(record)``: called before a publish that is ordered after other nodes' operations
    (its ``after``, W4): it returns once they are on the PFS, or raises OSError (refused).
    ``commit(record)``: a context held while the PFS changes (the job's view applies it there).
    ``start``: every record up to it is known on the PFS already (applied from another copy of the journal)."""
    records, damaged = read(area.journal_path)
    last = max([start, *(r["upto"] for r in records if r.op == "applied")])
    applied, published, failed = 0, [], None
    own = journal is None
    journal = journal or Journal(area.journal_path, durable=True)
    try:
        for i, rec in enumerate(records):
            if rec.op == "applied" or rec.n <= last:
                continue
            if step:
                step("apply", rec)
            try:
                if not (rec.op == "close" and _removed_later(records, i)):
                    if before is not None and rec.args.get("after"):
                        before(rec)
                    apply(area, rec, run_id, commit(rec) if commit else nullcontext())
                elif rec.args.get("through"):  # never published: what was written through goes
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
    unpublished = {}
    for rec in records:
        if rec.op == "close" and rec.n <= last:
            _remove_data(area, rec["seq"])  # published: what a crash left after its record
        elif rec.op == "close":  # still only here (or at its temporary PFS path), and where
            unpublished[rec["path"]] = rec.args.get("through") or area.data_path(rec["seq"])
    return Outcome(applied=applied, upto=last, published=[r["path"] for r in published],
                   published_bytes=sum(r["size"] for r in published),
                   copied_bytes=sum(r["size"] for r in published if not r.args.get("through")),
                   failed=failed, unpublished=unpublished,
                   damaged=damaged)


def _removed_later(records: list[Record], i: int) -> bool:
    """Does the job remove record ``i``'s file (a close) before anything else names its path? Then
    it is never written: no one could rely on a file its job removed unseen."""
    path = records[i]["path"]
    for rec in records[i + 1:]:
        if rec.op == "unlink" and rec["path"] == path:
            return True
        if rec.op != "applied" and path in (rec.args.get("path"), rec.args.get("src"), rec.args.get("dst")):
            return False
    return False


def _remove_data(area: Area, seq: int) -> None:
    try:
        os.unlink(area.data_path(seq))
    except FileNotFoundError:
        pass
