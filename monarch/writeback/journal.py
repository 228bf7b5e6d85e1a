"""The write-back journal of one run on one node: the job's operations under the write-back
paths, in the order its processes made them.

One record a line, ``<crc32 hex8> <json>``, appended with one ``write`` (``O_APPEND``): a
record is either whole in the file or, after a crash mid-append, a torn last line that reading
drops. A line whose checksum does not match in the middle of the file ends the reading there
(what follows it cannot be trusted); the reader says so. On a disk tier each record is flushed
(``fsync``) before the operation it records is acknowledged, so a rebooted node finds every
operation the job was told had happened; on a RAM tier the records last as long as the node.

Records (``n`` is the record's number, from 1):

- ``open   seq path mode``: file ``seq`` was created for writing at ``path`` (``fsync: pfs``): the drain
  makes its temporary on the PFS now (drain.py); not flushed (its loss costs a temporary left
  on the PFS, where the node itself was lost);
- ``close  seq path mode size``: file ``seq``'s bytes (the area's ``data/<seq>``) are final, to be
  published at ``path`` with ``mode`` (the app's, under its umask);
- ``rename src dst``, ``unlink path``, ``mkdir path mode``, ``rmdir path``, ``chmod path mode``,
  ``utime path atime_ns mtime_ns``: namespace operations, replayed as the job made them;
- ``sync   seq path mode size [waited]``: the job asked for file ``seq``'s bytes so far on the PFS
  (fsync): published as they are, the file still being written (its close publishes it again,
  whole); ``waited``: the fsync waits for them (``fsync: pfs``): written under its name;
- ``drop   seq``: file ``seq`` was removed by the job before it was published (never written);
- ``applied upto``: every record up to ``upto`` is on the PFS (the drain's progress).
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from monarch.errors import MonarchError
from monarch.secure import open_private_file

OPS = ("open", "close", "sync", "rename", "unlink", "mkdir", "rmdir", "chmod", "utime", "drop", "applied")
NEEDS = {"open": ("seq", "path", "mode"), "close": ("seq", "path", "mode", "size"), "sync": ("seq", "path", "mode", "size"),
         "rename": ("src", "dst"), "unlink": ("path",),
         "mkdir": ("path", "mode"), "rmdir": ("path",), "chmod": ("path", "mode"),
         "utime": ("path", "atime_ns", "mtime_ns"), "drop": ("seq",), "applied": ("upto",)}


class JournalError(MonarchError):
    """A journal that cannot be written or read."""


@dataclass(frozen=True)
class Record:
    n: int
    op: str
    args: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.args[key]


def encode(n: int, op: str, args: dict[str, Any]) -> bytes:
    if op not in OPS or any(k not in args for k in NEEDS[op]):
        raise JournalError(f"journal: a {op!r} record needs {', '.join(NEEDS.get(op, ()))}; got {sorted(args)}")
    body = json.dumps({"n": n, "op": op, **args}, separators=(",", ":"), ensure_ascii=True).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode(line: bytes) -> Record | None:
    """The record of one line; None when it is not a whole, checked record."""
    if not line.endswith(b"\n") or len(line) < 11 or line[8:9] != b" ":
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        d = json.loads(body)
        n, op = d.pop("n"), d.pop("op")
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(n, int) or op not in OPS or any(k not in d for k in NEEDS[op]):
        return None
    return Record(n, op, d)


def read(path: str) -> tuple[list[Record], str | None]:
    """The records of the journal at ``path``, in order, and why the reading stopped early (None:
    it read to the end, a torn last line dropped)."""
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    records: list[Record] = []
    for i, line in enumerate(lines):
        rec = decode(line)
        if rec is None:
            if i == len(lines) - 1 and not line.endswith(b"\n"):
                break  # torn by a crash mid-append: the operation was never acknowledged
            return records, f"{path}: record {i + 1} is damaged; the {len(lines) - i} record(s) from there are not used"
        if rec.n != len(records) + 1:
            return records, f"{path}: record {i + 1} is numbered {rec.n}; the records from there are not used"
        records.append(rec)
    return records, None


class Tail:
    """A journal read as it grows, by the run that appends to it: each ``read`` decodes only the
    lines appended since the last (a line still being appended is left for the next); the records
    up to ``base`` are let go once applied (``forget``): a long job's journal is not held whole."""

    def __init__(self, path: str):
        self.path = path
        self.records: list[Record] = []  # records base+1, base+2, ...
        self.base = 0
        self._offset = 0
        self._damaged: str | None = None

    def read(self) -> tuple[list[Record], str | None]:
        """Every record after ``base`` so far, in order, and why the reading stopped early (as ``read``)."""
        if self._damaged is None:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
            for line in data[:data.rfind(b"\n") + 1].splitlines(keepends=True):
                rec = decode(line)
                if rec is None or rec.n != self.base + len(self.records) + 1:
                    self._damaged = (f"{self.path}: record {self.base + len(self.records) + 1} is damaged or misnumbered; "
                                     f"the records from there are not used")
                    break
                self.records.append(rec)
                self._offset += len(line)
        return self.records, self._damaged

    def forget(self, upto: int) -> None:
        """The records up to ``upto`` are applied: not needed again."""
        if upto > self.base:
            del self.records[:upto - self.base]
            self.base = upto


class Journal:
    """Appends records to one journal file (made if missing, private); thread-safe."""

    def __init__(self, path: str, durable: bool):
        self.path, self.durable = path, durable
        self._lock = threading.Lock()
        existing, why = read(path) if os.path.exists(path) else ([], None)
        if why:
            raise JournalError(f"{why}: drain or move it aside before this run appends to it")
        self._next = len(existing) + 1
        self._last_op = max((r.n for r in existing if r.op != "applied"), default=0)
        self._fd = open_private_file(path, os.O_WRONLY | os.O_APPEND)
        # each record's line, also handed here in order before append returns (a partner node's copy)
        self.mirror: Callable[[bytes], Any] | None = None

    def mirror_to(self, mirror: Callable[[bytes], Any]) -> None:
        """Hand every record appended from now on to ``mirror`` too, in order, before ``append`` returns."""
        self.mirror = mirror

    def append(self, op: str, **args: Any) -> int:
        """Record one operation; its number. On a durable journal it is on disk when this returns
        (and held by ``mirror``, when there is one)."""
        with self._lock:
            line = encode(self._next, op, args)
            if os.write(self._fd, line) != len(line):
                raise JournalError(f"{self.path}: a short write of a journal record (the tier is full?)")
            if self.durable and op != "open":  # (an open is a hint: flushed by the next record, lost with the node only)
                os.fsync(self._fd)
            if self.mirror is not None:
                self.mirror(line)
            self._next += 1
            if op != "applied":
                self._last_op = self._next - 1
            return self._next - 1

    @property
    def last_op(self) -> int:
        """The number of the last operation recorded (not the drain's progress; 0: none). Read
        without the lock: the MPI engine thread asks it while an append waits for the partner's
        answer, which that thread delivers (an int is read whole)."""
        return self._last_op

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
