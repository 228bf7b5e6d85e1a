"""A copy of each node's write-back on its partner node, so that a lost node loses nothing it closed
or fsynced (docs/consistency.md, "What survives"; SCR's PARTNER scheme is the model).

Under ``writeback.fsync: partner`` (the default on a cluster) node k's partner is node k+1 (mod the
nodes). Before k's daemon answers a write-back close or fsync, the partner holds the file's bytes and
k's journal record of it; every other record of k's journal (a rename, an unlink, the drain's
``applied`` progress) is held there too, in k's order, before k answers the call that made it. The
partner keeps them in ``held/node<k>/`` of its own area, laid out as an area (``data/<seq>`` and a
journal), and drops a file's bytes once k's drain has published it.

When k is lost, its partner drains what it holds of k's journal past k's last ``applied``, in k's
order and after the other nodes' operations each file is ordered after, exactly as k's own drain
would have (monarch/writeback/drain.py), and tells every node how far it got: a file another node
ordered after k's waits for that, not for k (order.py). When the partner is lost too (two nodes),
or was lost first, what waits on k's operations is kept, not published: never torn.

Control messages (control.py), all between a node and its partner but ``wb-replayed``:

  ``("wb-data", tag, seq, offset, length, data, last)``  bytes [offset, offset + length) of k's file
                                                 ``seq``: ``data`` the tag of the message that carries
                                                 them on the data communicator (mapped on both sides:
                                                 no copy in Python), or the bytes (``last``: answer held)
  ``("wb-record", tag, line)``                   one record of k's journal, as its journal holds it
  ``("wb-held", tag, ok)``                       the partner wrote them (False: it holds no copies)
  ``("wb-replayed", node, applied, failed, done)``  the partner's drain of lost ``node``'s journal
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import time
from typing import Callable, Mapping

from monarch.writeback.across import HELD

from .control import Handler, Verb, message
from .engine import Engine

log = logging.getLogger(__name__)

SPAN = 1 << 30           # bytes one data message carries (MPI counts are ints): a file is mapped and sent whole
CHUNK = 4 << 20          # ... or, without a data communicator, bytes a pickled control message carries
HELD_TIMEOUT = 120.0     # a partner that neither answers nor is lost by then: the call goes on, said


def _close_mapping(m: mmap.mmap | None) -> None:
    """Unmapped now, or with its last reference where MPI still holds one (a request on a lost node)."""
    try:
        if m is not None:
            m.close()
    except BufferError:
        pass


class Partners:
    """This node's part in the partner copies: sending its own write-back to its partner, holding
    its partner-of's, and draining those when that node is lost."""

    def __init__(self, engine: Engine, node: int, nodes: int, is_lost: Callable[[int], bool], data_comm=None):
        self.engine, self.node, self.nodes, self._is_lost = engine, node, nodes, is_lost
        self._data_comm = data_comm  # the files' bytes, apart from the control messages (None: pickled)
        self._data_tags = itertools.count(1)
        self._receiving: dict[tuple[int, int], list] = {}  # (node, seq) -> [ranges under way, last seen, tag]
        self._cond = threading.Condition()
        self._tags = itertools.count(1)
        self._held: dict[int, bool] = {}                 # tag -> the partner held it (False: it could not)
        self._folder: str | None = None                  # this node's area: held/node<k>/ in it
        self._fds: dict[tuple[int, int], int] = {}       # (node, seq) -> the held file being written
        self._closes: dict[int, dict[int, int]] = {}     # node -> record n -> seq of its close
        self._changes: dict[int, list] = {}              # node -> its closes, renames, removals not applied yet
        self._replayed: dict[int, tuple[int, bool, bool]] = {}  # lost node -> (applied, failed, done)
        self._replays: list[threading.Thread] = []
        self._drain: Callable[[str, int], tuple[int, bool]] | None = None
        self._remember: Callable[[int, int], None] = lambda node, applied: None
        self._published: Callable[[int, object, str], None] | None = None
        self._lost_said = False
        self.figures = {"partner_bytes_sent": 0, "partner_seconds": 0.0, "partner_records": 0}

    def handlers(self) -> Mapping[Verb, Handler]:
        return {Verb.WB_DATA: self._on_data, Verb.WB_RECORD: self._on_record, Verb.WB_HELD: self._on_held,
                Verb.WB_REPLAYED: self._on_replayed}

    def serve(self, folder: str, drain: Callable[[str, int, Callable[[int, bool], None]], tuple[int, bool]],
              remember: Callable[[int, int], None] | None = None,
              published: Callable[[int, object, str], None] | None = None) -> None:
        """Hold partners' copies under ``folder``; ``drain(held, node, progress)`` drains a lost node's
        held journal (the write-back's own drain, its order kept), calling ``progress(applied, failed)``;
        ``remember(node, applied)``: a lost node's operations published for it (here or by its partner);
        ``published(node, record, held)``: each of its closes (``held``: the copy held here, to be let
        go after the call), renames and removals once its own drain applied them, in its order (the
        copies kept for a later run: writeback/kept.py)."""
        self._folder, self._drain = folder, drain
        self._remember = remember or self._remember
        self._published = published

    def partner(self) -> int | None:
        """This node's partner now (None: a single node, or the partner is lost)."""
        p = (self.node + 1) % self.nodes
        return None if self.nodes < 2 or self._is_lost(p) else p

    @staticmethod
    def partner_of(node: int, nodes: int) -> int:
        return (node + 1) % nodes

    # -- the sender (a request thread) -------------------------------------------------------------
    def send_file(self, seq: int, path: str, size: int) -> bool:
        """The first ``size`` bytes of file ``seq`` (at ``path``) held by the partner when this returns
        True; False: no partner to hold them (lost: said once)."""
        p = self.partner()
        if p is None:
            return self._no_partner()
        started, tag = time.monotonic(), next(self._tags)
        if self._data_comm is not None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                buf = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
            finally:
                os.close(fd)
            spans = [(off, min(SPAN, size - off)) for off in range(0, size, SPAN)] or [(0, 0)]
            tags = [next(self._data_tags) % (1 << 20) for _ in spans]
            MPI, last = self.engine.MPI, len(spans) - 1
            sent = threading.Semaphore(0)  # each span's send completed (MPI let go of its pages)

            def send() -> None:
                for i, ((off, n), t) in enumerate(zip(spans, tags)):
                    self.engine.send_obj(message(Verb.WB_DATA, tag, seq, off, n, t, i == last), p)
                    if n:
                        self.engine.post(self._data_comm.Isend([memoryview(buf)[off:off + n], MPI.BYTE], p, t),
                                         lambda st: sent.release())
            self.engine.call(send)
            ok = self._wait_held(tag, p)
            # unmapped before the call returns: a mapping left would keep the job's close of the file
            # from being seen (the daemon's lease needs it to be the file's only holder)
            for n in (n for _, n in spans if n):
                if not sent.acquire(timeout=HELD_TIMEOUT if ok else 1.0):
                    break
            _close_mapping(buf)
        else:
            with open(path, "rb") as f:
                chunks = [(off, os.pread(f.fileno(), min(CHUNK, size - off), off)) for off in range(0, size, CHUNK)] \
                    or [(0, b"")]
            last = len(chunks) - 1
            self.engine.call(lambda: [self.engine.send_obj(message(Verb.WB_DATA, tag, seq, off, len(data), data,
                                                                   i == last), p)
                                      for i, (off, data) in enumerate(chunks)])
            ok = self._wait_held(tag, p)
        with self._cond:
            self.figures["partner_bytes_sent"] += size
            self.figures["partner_seconds"] += time.monotonic() - started
        return ok

    def send_record(self, line: bytes) -> bool:
        """One record of this node's journal (its encoded line) held by the partner when this returns True."""
        p = self.partner()
        if p is None:
            return self._no_partner()
        started, tag = time.monotonic(), next(self._tags)
        self.engine.call(lambda: self.engine.send_obj(message(Verb.WB_RECORD, tag, line), p))
        ok = self._wait_held(tag, p)
        with self._cond:
            self.figures["partner_records"] += 1
            self.figures["partner_seconds"] += time.monotonic() - started
        return ok

    def _wait_held(self, tag: int, p: int) -> bool:
        deadline = time.monotonic() + HELD_TIMEOUT
        with self._cond:
            while tag not in self._held:
                if self._is_lost(p):
                    return self._no_partner()
                if time.monotonic() > deadline:
                    log.error("write-back: partner node %d did not say it held a copy within %gs", p, HELD_TIMEOUT)
                    return False
                self._cond.wait(0.25)
            if not self._held.pop(tag):
                return self._no_partner(f"partner node {p} holds no copies (its daemon has no writeback.paths: give "
                                        f"every node's `monarch serve` the same configuration)")
            return True

    def _no_partner(self, why: str | None = None) -> bool:
        if not self._lost_said and self.nodes > 1:
            self._lost_said = True
            log.error("write-back: %s: this node's files are not copied to another node (a loss of this node would "
                      "lose what it has not published)", why or f"partner node {(self.node + 1) % self.nodes} is lost")
        return False

    # -- the holder (engine thread) ---------------------------------------------------------------------
    def _held_dir(self, node: int) -> str:
        d = os.path.join(self._folder or "", HELD, f"node{node}")
        os.makedirs(os.path.join(d, "data"), mode=0o700, exist_ok=True)
        return d

    def _on_data(self, src: int, tag: int, seq: int, offset: int, length: int, data, last: bool) -> None:
        if self._folder is None:  # no write-back here (a configuration that differs between nodes): said
            if last:
                self.engine.send_obj(message(Verb.WB_HELD, tag, False), src)
            return
        key = (src, seq)
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = os.open(os.path.join(self._held_dir(src), "data", str(int(seq))),
                                          os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            self._receiving[key] = [0, False, tag]
        state = self._receiving[key]
        state[1] = state[1] or last
        if isinstance(data, bytes):
            os.pwrite(fd, data, offset)
        elif length:  # its bytes on the data communicator, received straight into the held file's pages
            os.ftruncate(fd, max(os.fstat(fd).st_size, offset + length))
            pages = mmap.mmap(fd, length, offset=offset)
            state[0] += 1
            req = self._data_comm.Irecv([pages, self.engine.MPI.BYTE], src, data)
            self.engine.post(req, lambda st, k=key, m=pages: self._received(k, m, src))
        self._done_if_whole(key, src)

    def _received(self, key: tuple[int, int], pages: mmap.mmap, src: int) -> None:
        _close_mapping(pages)
        self._receiving[key][0] -= 1
        self._done_if_whole(key, src)

    def _done_if_whole(self, key: tuple[int, int], src: int) -> None:
        under_way, last, tag = self._receiving[key]
        if last and not under_way:
            del self._receiving[key]
            os.close(self._fds.pop(key))
            self.engine.send_obj(message(Verb.WB_HELD, tag, True), src)

    def _on_record(self, src: int, tag: int, line: bytes) -> None:
        if self._folder is None:
            self.engine.send_obj(message(Verb.WB_HELD, tag, False), src)
            return
        from monarch.writeback.journal import decode  # (the record's floor: writeback/)
        rec = decode(line)
        with open(os.path.join(self._held_dir(src), "journal"), "ab") as f:
            f.write(line)
        if rec is not None:
            if rec.op == "close":
                self._closes.setdefault(src, {})[rec.n] = rec["seq"]
                self._hold_time(src, rec)
            elif rec.op == "drop":
                self._forget(src, rec["seq"])
            elif rec.op == "applied":  # published by the node itself: its bytes are not needed here
                self._applied(src, rec["upto"])
                closes = self._closes.get(src, {})
                for n in [n for n in closes if n <= rec["upto"]]:
                    self._forget(src, closes.pop(n))
            if self._published is not None and rec.op in ("close", "rename", "unlink", "rmdir"):
                self._changes.setdefault(src, []).append(rec)
        self.engine.send_obj(message(Verb.WB_HELD, tag, True), src)

    def _hold_time(self, node: int, rec) -> None:
        """A closed file's copy here takes the time its node's copy had (the drain gives it to the PFS
        file): a copy kept for a later run is seen to be the PFS file's by its size and time."""
        mtime = rec.args.get("mtime")
        if isinstance(mtime, int):
            try:
                os.utime(os.path.join(self._held_dir(node), "data", str(int(rec["seq"]))), ns=(mtime, mtime))
            except OSError:
                pass

    def _applied(self, node: int, upto: int) -> None:
        """``node``'s drain applied its records up to ``upto``: its changes told to ``published``."""
        changes = self._changes.get(node)
        if not changes:
            return
        told = [rec for rec in changes if rec.n <= upto]
        self._changes[node] = [rec for rec in changes if rec.n > upto]
        for rec in told:
            held = os.path.join(self._held_dir(node), "data", str(int(rec["seq"]))) if rec.op == "close" else ""
            try:
                self._published(node, rec, held)
            except Exception:  # a copy not kept is a later run's read of the PFS, never this one's failure
                log.exception("write-back: node %d's published %s not followed here", node, rec.op)

    def _forget(self, node: int, seq: int) -> None:
        try:
            os.unlink(os.path.join(self._held_dir(node), "data", str(int(seq))))
        except FileNotFoundError:
            pass

    def _on_held(self, src: int, tag: int, ok: bool) -> None:
        with self._cond:
            self._held[tag] = ok
            self._cond.notify_all()

    # -- a lost node ------------------------------------------------------------------------------------
    def lost(self, node: int, why: str) -> None:
        """Engine thread: ``node`` is lost; if this node held its copies, drain them (a thread)."""
        with self._cond:
            self._cond.notify_all()
        if self._drain is None or self.partner_of(node, self.nodes) != self.node:
            return
        held = os.path.join(self._folder or "", HELD, f"node{node}")
        if not os.path.exists(os.path.join(held, "journal")):
            self._progress(node, 0, False, True)  # it had recorded nothing: nothing of its is waited for
            return
        log.warning("write-back: node %d is lost (%s): publishing the copies of its files held here, in its order",
                    node, why)
        t = threading.Thread(target=self._replay, args=(node, held), name=f"monarch-held-node{node}", daemon=True)
        self._replays.append(t)
        t.start()

    def _replay(self, node: int, held: str) -> None:
        try:
            applied, failed = self._drain(held, node, lambda a, f: self._progress(node, a, f, False))
        except Exception:  # a bug must not hang the other nodes: they are told it failed
            log.exception("write-back: publishing node %d's held copies failed", node)
            applied, failed = self._replayed.get(node, (0, True, True))[0], True
        self._progress(node, applied, failed, True)

    def _progress(self, node: int, applied: int, failed: bool, done: bool) -> None:
        with self._cond:
            self._replayed[node] = (applied, failed, done)
            self._cond.notify_all()
        self._remember(node, applied)
        others = [k for k in range(self.nodes) if k not in (self.node, node) and not self._is_lost(k)]
        self.engine.call(lambda: [self.engine.send_obj(message(Verb.WB_REPLAYED, node, applied, failed, done), k)
                                  for k in others])

    def _on_replayed(self, src: int, node: int, applied: int, failed: bool, done: bool) -> None:
        with self._cond:
            self._replayed[node] = (applied, failed, done)
            self._cond.notify_all()
        self._remember(node, applied)

    def replayed(self, node: int) -> tuple[int, bool, bool] | None:
        """How far lost ``node``'s partner published its held copies: (applied, failed, done), None when
        nothing is heard yet (or its partner is lost too: then never)."""
        with self._cond:
            return self._replayed.get(node)

    def partner_alive(self, node: int) -> bool:
        return self.nodes > 1 and not self._is_lost(self.partner_of(node, self.nodes))

    def finish(self, timeout: float | None = None) -> None:
        """The drains of lost nodes' held copies ended."""
        for t in self._replays:
            t.join(timeout)
