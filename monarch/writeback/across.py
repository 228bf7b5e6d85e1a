"""What killed daemons left of a job's write-back, drained in the job's order across its nodes
(docs/consistency.md, "Write-back", W4 and W8).

A file whose close record says it is ordered after other nodes' operations (its ``after``: a
``.metadata`` opened after every rank's shard closed) is published only once those operations
are known to be on the PFS: drained by another node's drain of the same moment (an ``Exchange``
carries each drain's progress to the others: monarch/cluster/drains.py over MPI), or heard
published by the daemon before it died (its area's ``heard`` file, which the daemon keeps up to
date), or recorded applied in a partner's held copy. What cannot be shown on the PFS keeps the
file unpublished, named, its bytes kept: never a commit file before its shards.

What one node holds of a run (a ``Piece``): its own area's journal, and, under ``fsync: partner``,
a copy of its partner-of's journal and files (``held/node<k>/`` in its area, monarch/cluster/
partner.py). A node's own area drains it; a held copy is drained only in a drain of every node at
once where no node has that node's own area (lost with its tier), from what is known published.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from monarch.writeback.area import JOURNAL, Area, run_and_node
from monarch.writeback.drain import Outcome, drain
from monarch.writeback.journal import JournalError, read

log = logging.getLogger(__name__)

HEARD = "heard"  # in an area: {node: applied} its daemon heard from the other nodes' drains
HELD = "held"    # in an area: held/node<k>/, a partner's copy of node k's journal and files

Key = tuple[str, int]  # (run, node)
UNKNOWN = 1 << 62  # a count of a node lost before a file's open: whatever it had made (cluster/order.py)


def write_heard(fd: int, heard: dict[int, int]) -> None:
    """The daemon's side: what it heard, in place (one line; whatever a crash leaves after it is ignored)."""
    line = json.dumps({str(k): v for k, v in sorted(heard.items())}, separators=(",", ":")).encode() + b"\n"
    os.pwrite(fd, line, 0)
    os.ftruncate(fd, len(line))


def read_heard(area_path: str) -> dict[int, int]:
    """What an area's daemon heard published of the other nodes' operations ({} when nothing, or unreadable:
    a drain then knows less, and keeps more)."""
    try:
        with open(os.path.join(area_path, HEARD), "rb") as f:
            line = f.readline()
        return {int(k): int(v) for k, v in json.loads(line).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


@dataclass(frozen=True)
class Piece:
    """What one node holds of one node's journal of a run: its own area, or a partner's held copy."""
    run: str
    node: int
    held: bool
    path: str
    applied: int  # the journal's last record known on the PFS
    last: int     # its last operation


def _journal_state(path: str) -> tuple[int, int]:
    records, _ = read(os.path.join(path, JOURNAL))
    applied = max((r["upto"] for r in records if r.op == "applied"), default=0)
    return applied, max((r.n for r in records if r.op != "applied"), default=0)


def pieces_of(area: Area) -> list[Piece]:
    """The pieces an area holds: its own journal (if it has one), then its held copies."""
    run, node = run_and_node(os.path.basename(area.path))
    if not run:
        return []
    found = []
    if os.path.exists(area.journal_path):
        found.append(Piece(run, int(node), False, area.path, *_journal_state(area.path)))
    held = os.path.join(area.path, HELD)
    for name in sorted(os.listdir(held)) if os.path.isdir(held) else ():
        k = name.removeprefix("node")
        if k.isdigit() and os.path.exists(os.path.join(held, name, JOURNAL)):
            found.append(Piece(run, int(k), True, os.path.join(held, name), *_journal_state(os.path.join(held, name))))
    return found


class Exchange:
    """The drains of this moment on other nodes (none here: a drain of this node alone). Over MPI:
    monarch/cluster/drains.py."""
    rank, size = 0, 1

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def start(self, heard: Callable[[Key, int, bool, bool], None]) -> None:
        """Deliver each other drain's progress to ``heard(key, applied, failed, done)`` from now on."""

    def tell(self, key: Key, applied: int, failed: bool, done: bool) -> None:
        """Every other drain hears this drain's progress on ``key``."""

    def finish(self) -> None:
        """This node's drains ended; return once every other node's have (nothing waits on them then)."""

    def close(self) -> None:
        """Return once every node has said what its drains did (none may end the others' before)."""


@dataclass
class Drained:
    """One area's drain: what it published, and what became of the area."""
    path: str
    outcome: Outcome | None = None  # None: nothing recorded (its daemon died before the job wrote anything)
    error: str | None = None        # it could not be drained at all: kept
    never_closed: int = 0           # files its job never closed: kept (not a file the job finished), not published
    removed: bool = False
    held: dict[int, Outcome] = field(default_factory=dict)  # lost nodes' files published from copies held here

    @property
    def complete(self) -> bool:
        """Everything its job closed is on the PFS (files it never closed may be kept)."""
        held = all(o.complete for o in self.held.values())
        return self.error is None and (self.outcome is None or self.outcome.complete) and held


class _Progress:
    """How far each (run, node)'s journal is known on the PFS, as this drain and the others move."""

    def __init__(self, known: dict[Key, int], lasts: dict[Key, int], draining: set[Key], alone: bool):
        self._cond = threading.Condition()
        self._applied = dict(known)
        self._lasts = lasts              # each journal's last operation: what a node had made, all of it
        self._open = set(draining)       # keys some drain of this moment is still moving
        self._failed: set[Key] = set()
        self._alone = alone

    def heard(self, key: Key, applied: int, failed: bool, done: bool) -> None:
        with self._cond:
            self._applied[key] = max(self._applied.get(key, 0), applied)
            if failed:
                self._failed.add(key)
            if done:
                self._open.discard(key)
            self._cond.notify_all()

    def wait(self, run: str, after: list) -> None:
        """Return once each (node, n) of ``after`` is on the PFS; OSError when it never will be here."""
        with self._cond:
            for k, n in after:
                key = (run, int(k))
                # (a node lost before the open is waited for whole: its count is unknown, beyond its last)
                n = min(n, self._lasts.get(key, n))
                while self._applied.get(key, 0) < n and key in self._open and key not in self._failed:
                    self._cond.wait(1.0)
                if self._applied.get(key, 0) >= n:
                    continue
                op = "what it had written before it was lost" if n >= UNKNOWN else f"its write-back operation {n}"
                if key in self._failed:
                    raise OSError(errno.EIO, f"node {k}'s drain stopped before {op}, which this file is ordered "
                                             f"after: kept unpublished")
                where = ("no other node drains with this one: run `monarch drain` on every node at once "
                         "(docs/cluster.md, the drain line)" if self._alone else
                         "no node of this drain holds its area (removed, or lost with its tier) and none heard it "
                         "published")
                raise OSError(errno.EIO, f"ordered after node {k}'s {op.removeprefix('its ')}, not known on the PFS "
                                         f"({where}): kept unpublished, so that the PFS never holds it without what "
                                         f"came before it")


def drain_in_order(areas: list[Area], exchange: Exchange | None = None,
                   finished: dict[Key, dict] | None = None) -> list[Drained]:
    """Drain the areas this process holds (their runs gone), each file after what it is ordered
    after on every node (``exchange``: the drains of the other nodes at this moment); then remove
    each area that holds nothing unpublished, else release it, kept. ``finished``: what runs that
    finished here left beside their areas (orphans.finished). Collective over ``exchange``."""
    exchange = exchange or Exchange()
    mine: list[tuple[Area, list[Piece]]] = []
    errors: dict[str, str] = {}
    heard: dict[Key, int] = {}
    for area in areas:
        try:
            pieces = pieces_of(area)
        except (OSError, JournalError) as e:
            errors[area.path] = str(e)
            pieces = []
        mine.append((area, pieces))
        run, _ = run_and_node(os.path.basename(area.path))
        if not run:
            errors[area.path] = "not the name of an area Monarch makes (writeback-<run>-node<N>)"
        for k, applied in read_heard(area.path).items():
            heard[(run, k)] = max(heard.get((run, k), 0), applied)
    facts = exchange.allgather(([(p.run, p.node, p.held, p.applied, p.last) for _, ps in mine for p in ps],
                                sorted(heard.items()), sorted((finished or {}).items())))
    known: dict[Key, int] = {}
    lasts: dict[Key, int] = {}
    owner: dict[Key, tuple[bool, int]] = {}  # who drains a (run, node): its own area first, else the lowest rank's copy
    for rank, (pieces, told, _) in enumerate(facts):
        for key, applied in told:
            key = tuple(key)
            known[key] = max(known.get(key, 0), applied)
        for run, node, held, applied, last in pieces:
            known[(run, node)] = max(known.get((run, node), 0), applied)
            lasts[(run, node)] = max(lasts.get((run, node), 0), last)
            owner[(run, node)] = min(owner.get((run, node), (True, 1 << 30)), (held, rank))
    for _, _, done in facts:  # a node's run that finished: all it made is on the PFS, and what it heard
        for key, d in done:
            key = tuple(key)
            if owner.get(key, (True,))[0]:  # (an area of that run and node is left: a run of the same name since)
                known[key] = max(known.get(key, 0), d["applied"])
                for k, applied in d["heard"].items():
                    known[(key[0], k)] = max(known.get((key[0], k), 0), applied)
    if exchange.size == 1:  # alone: a copy held here is never drained (its node may be draining its own area now)
        owner = {key: o for key, o in owner.items() if not o[0]}
    progress = _Progress(known, lasts, set(owner), alone=exchange.size == 1)
    exchange.start(progress.heard)
    results: dict[str, Outcome | str] = {}
    todo = [p for _, ps in mine for p in ps if owner.get((p.run, p.node)) == (p.held, exchange.rank)]
    threads = [threading.Thread(target=_drain_piece, args=(p, known[(p.run, p.node)], progress, exchange, results),
                                name=f"monarch-drain-node{p.node}", daemon=True) for p in todo]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    drained = [_settle(area, pieces, errors.get(area.path), results) for area, pieces in mine]
    exchange.finish()  # (after every area here is removed or released: a launcher may end the others once one exits)
    return drained


def _drain_piece(p: Piece, start: int, progress: _Progress, exchange: Exchange, results: dict) -> None:
    key = (p.run, p.node)

    def step(phase, rec):
        if phase == "applied":
            progress.heard(key, rec.n, False, False)
            exchange.tell(key, rec.n, False, False)
    try:
        out = drain(Area(p.path, -1), p.run, start=start, step=step,
                    before=lambda rec: progress.wait(p.run, rec["after"]))
        results[p.path] = out
        done = (out.upto, bool(out.failed or out.damaged))
    except (OSError, JournalError) as e:
        results[p.path] = str(e)
        done = (start, True)
    except Exception as e:  # a bug must not hang the other nodes' drains: they are told, the area kept
        log.exception("monarch drain: %s", p.path)
        results[p.path] = f"the drain failed: {e}"
        done = (start, True)
    progress.heard(key, *done, True)
    exchange.tell(key, *done, True)


def _settle(area: Area, pieces: list[Piece], error: str | None, results: dict) -> Drained:
    own = next((p for p in pieces if not p.held), None)
    got = results.get(own.path) if own else None
    outcome = got if isinstance(got, Outcome) else None
    if isinstance(got, str):
        error = got
    elif own is not None and got is None:  # its node's journal drained from another copy: this one's own were not
        error = "its files were drained from another copy; this area's own were not"
    elif own is None and (os.path.exists(area.journal_path) or area.pending_data()):
        error = error or "its journal cannot be read"
    held = {p.node: results[p.path] if isinstance(results[p.path], Outcome) else Outcome(failed=results[p.path])
            for p in pieces if p.held and p.path in results}
    d = Drained(area.path, outcome, error, held=held)
    if not d.complete:
        area.release()
        return d
    left = area.pending_data()
    if left:  # files the job never closed: not published (it did not finish them), nor deleted
        area.release()
        return Drained(area.path, outcome, error, never_closed=len(left), held=held)
    cluster = os.path.exists(os.path.join(area.path, HEARD))  # (a cluster run's: a drain elsewhere may need it)
    area.remove(done={"applied": outcome.upto, "heard": read_heard(area.path)} if cluster and outcome else None)
    return Drained(area.path, outcome, error, removed=True, held=held)
