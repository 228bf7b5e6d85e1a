"""The daemon's write-back (docs/consistency.md, "Write-back"): the shim's calls under the
write-back paths answered from the job's view (monarch/writeback/view.py), and a thread that
drains the journal to the PFS as records come, in order.

A file is closed when a process of the job closed a descriptor of it (or left normally with it
open: the shim tells at its exit) and no descriptor or mapping of it is left anywhere: the daemon
then takes a write lease on it, which the kernel grants only to the file's sole opener. A
descriptor the kernel closed because its process was killed is not a close the job made: such a
file is kept, not published. What a call waits for (room under ``room``, an fsync's bytes on the
PFS, a pending file settled before an open for update) it waits for on a request thread of the
server, the shim hearing heartbeats meanwhile.

In a cluster (``order_by``) a file opened here is published only after what every other node
had recorded at its open is on the PFS (W4: ``monarch/cluster/order.py``).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

from monarch import protocol
from monarch.cluster.order import OrderFailed
from monarch.node.kept_reads import KeptReads
from monarch.node.tiers.resources import is_memory_backed
from monarch.protocol import ProtocolError
from monarch.secure import open_private_file
from monarch.writeback import wire
from monarch.writeback.across import HEARD, write_heard
from monarch.writeback.area import Area, sole_opener
from monarch.writeback.drain import Following, Outcome, copy_file, drain, temporary_name
from monarch.writeback.journal import Journal, Tail
from monarch.writeback.kept import KeptWrites
from monarch.writeback.listing import Listings
from monarch.writeback.marks import Marks
from monarch.writeback.view import Local, View

log = logging.getLogger(__name__)

def _errno_answer(e: OSError) -> bytes:
    return protocol.encode_answer(wire.WB_ERRNO + (e.errno or errno.EIO))


def _pfs(path: str) -> bytes:
    return protocol.encode_answer(wire.WB_ANSWER_PFS, os.fsencode(path))


class WritebackRoom:
    """One run's write-back on this node: its area, view, journal and drain."""

    def __init__(self, paths: tuple[str, ...], base: str, run_id: str, node: int, durable: bool, room: int,
                 fsync: str = "auto", keep: int = 0, linger: float = 0.0):
        self.paths, self.run_id, self.room, self.fsync_asked = tuple(paths), run_id, room, fsync
        # what an fsync waits for: the PFS, the local flush, or the partner's copy (order_by: a cluster)
        self.fsync = "local" if fsync == "local" else "pfs"
        self.partners = None          # partner.Partners under fsync: partner (a cluster)
        self.area = Area.create(base, run_id, node)
        self.journal = Journal(self.area.journal_path, durable=durable)
        self._following = Following(Tail(self.area.journal_path))  # the drain's reading of it, and what it did
        self.marks = Marks.made(self.area.path)
        self.view = View(self.paths, self.area, self.journal, self.marks)
        self.listings = Listings(self.view, self.area.path)
        self.kept = KeptWrites.made(base, keep, linger, self._following.rate)  # published files kept for the next runs
        if self.kept is not None and self.marks is not None:
            self.kept.mark_in(self.marks)
        self.kept_reads = KeptReads(self.kept, self.marks) if self.kept is not None else None  # and theirs read
        self._cond = threading.Condition()
        self._upto = 0                # every record up to here is on the PFS (the last drain's)
        self._moving = 0              # the same, as the drain goes (what other nodes wait for)
        self._released = 0            # the last fsync's record whose bytes are on the PFS (its times may follow)
        self.order = None             # the cluster's WriteOrder (W4); None: a single node
        self._outcome = Outcome()     # the last drain's
        self._closing: set[int] = set()  # files a process closed while another still held them
        self._reserved: dict[int, int] = {}  # file -> room its writers reserved ahead (WB_ROOM)
        self._spilling: dict[int, str] = {}  # file -> its PFS copy, until its writer moved to it
        self._held_outcomes: dict[int, Outcome] = {}  # lost node -> the drain of its copies held here
        self._sent: dict[int, tuple[int, int]] = {}   # file -> (size, mtime) of its last copy on the partner
        self._heard: dict[int, int] = {}  # node -> the last of its operations heard on the PFS (kept in the area)
        self._heard_fd = -1
        self._heard_lock = threading.Lock()  # (its own: the engine thread writes it, holding the order's lock)
        self._stop = False
        self.figures = {"bytes_written": 0, "files_closed": 0, "files_published": 0, "bytes_published": 0, "bytes_copied": 0,
                        "peak_pending_bytes": 0, "drain_seconds": 0.0, "waited_for_room": 0, "syncs": 0, "ordered_files": 0,
                        "order_wait_seconds": 0.0, "files_written_through": 0, "opened_through": 0, "app_write_seconds": 0.0,
                        "app_close_seconds": 0.0, "held_for_lost_published": 0, "app_sync_seconds": 0.0,
                        "job_ended_after_s": None, "drained_after_s": None}
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._drain_loop, name="monarch-writeback", daemon=True)
        self._thread.start()

    def order_by(self, order, partners=None, peers=None) -> None:
        """Publish in the order of the cluster's nodes (W4): ``order`` is its ``WriteOrder``; with
        ``partners`` (fsync ``partner``, or ``auto`` on two or more nodes) each file and record is held
        by the partner node too before the call that made it returns (docs/consistency.md, "What survives");
        ``peers`` (the cluster) serve each other the copies they keep (node/kept_reads.py)."""
        self.order = order
        self._heard_fd = open_private_file(os.path.join(self.area.path, HEARD), os.O_RDWR | os.O_TRUNC)
        order.serve(lambda: self.journal.last_op, lambda: (self._moving, self._outcome.failed is not None),
                    remember=self._remember)
        if partners is not None and partners.nodes > 1 and self.fsync_asked in ("auto", "partner"):
            self.partners, self.fsync = partners, "partner"
            order.use_partners(partners)
            partners.serve(self.area.path, self._drain_held, remember=self._remember,
                           published=self.kept_reads and self.kept_reads.partner_published)
            self.journal.mirror_to(partners.send_record)
        elif self.fsync_asked == "partner":
            log.warning("write-back: fsync: partner on a single node has no partner: an fsync waits for the PFS")
        if peers is not None and self.kept_reads is not None:
            self.kept_reads.across(peers)

    def _remember(self, node: int, applied: int) -> None:
        """Another node's operations up to ``applied`` heard on the PFS: kept for a drain after a kill (across.py)."""
        with self._heard_lock:
            if applied <= self._heard.get(node, 0) or self._heard_fd < 0:
                return
            self._heard[node] = applied
            try:
                write_heard(self._heard_fd, self._heard)
            except OSError as e:  # a full tier: a later drain knows less, and keeps more
                log.warning("write-back: cannot keep what the other nodes published (%s)", e)

    def client_env(self, door: str | None) -> dict[str, str]:
        """What the shim needs: the paths, their marks, and ``door``, the socket of its calls (None: the main one)."""
        env = {protocol.ENV_WRITEBACK: ":".join(self.paths), protocol.ENV_WRITEBACK_MARKS: self.marks and self.marks.path,
               protocol.ENV_WRITEBACK_SOCKET: door}
        return {k: v for k, v in env.items() if v}

    # -- the shim's calls (on the server's request threads) ------------------------------------
    def call(self, body: bytes) -> bytes:
        """One write-back call's answer frame (a bug here fails the call with EIO, said: never
        a wrong answer)."""
        try:
            return self._call(body)
        except Exception:
            log.exception("write-back: a call failed")
            return protocol.encode_answer(wire.WB_ERRNO + errno.EIO)

    def _call(self, body: bytes) -> bytes:
        try:
            c = wire.decode_call(body)
        except ProtocolError as e:
            log.warning("write-back: a malformed call refused: %s", e)
            return protocol.encode_answer(wire.WB_ERRNO + errno.EINVAL)
        for p in (c.path, c.path2):
            if p and not self.view.covers(p):
                return protocol.encode_answer(wire.WB_ERRNO + errno.EXDEV)  # across the write-back's edge
        try:
            if c.op == wire.WB_OPEN:
                return self._open(c.path, c.n1, c.n2)
            if c.op in (wire.WB_CLOSE, wire.WB_CLOSE_SYNCED):
                started = time.monotonic()
                self.view.closing(c.n1, synced=c.op == wire.WB_CLOSE_SYNCED)
                self._closed(c.n1)
                with self._cond:
                    self.figures["app_write_seconds"] += max(0, c.n2) / 1e9  # the closing process's writes
                    self.figures["app_close_seconds"] += time.monotonic() - started
                return protocol.encode_answer(0)
            if c.op == wire.WB_ROOM:
                return self._room(c.n1, c.n2)
            if c.op == wire.WB_SPILLED:
                self._spilled(c.n1, bool(c.n2))
                return protocol.encode_answer(0)
            if c.op == wire.WB_RESOLVE:
                kind, where = self.view.resolve(c.path)
                if kind == "gone":
                    return protocol.encode_answer(wire.WB_ERRNO + errno.ENOENT)
                if c.n1 == wire.RESOLVE_TO_READ and kind == "pfs" and where == c.path and self.kept is not None:
                    kept = self.kept_reads.open(c.path)  # an earlier run's published file, unchanged: here, or a peer's
                    if kept is not None:
                        return _pfs(kept)
                if self.view.made_dir(c.path) and not os.path.isdir(where):  # made by the job, not on the PFS yet
                    return _pfs(self.listings.directory(c.path))
                entry = self.view.entry(c.path)
                if kind == "local" and isinstance(entry, Local):  # its copy's mode is 0600; the job's is this
                    return protocol.encode_answer(wire.WB_ANSWER_LOCAL + entry.mode, os.fsencode(where))
                return _pfs(where)
            if c.op == wire.WB_LIST:
                return _pfs(self.listings.directory(c.path))
            if c.op == wire.WB_SYNC:
                return self._sync(c.n1)
            if c.op == wire.WB_SETTLE:
                return self._settle(c.path, c.path2, c.n1, c.n2)
            if c.op == wire.WB_FMODE:
                return protocol.encode_answer(wire.WB_ANSWER_DONE if self.view.set_mode(c.n1, c.n2)
                                              else wire.WB_ERRNO + errno.EBADF)
            {wire.WB_RENAME: lambda: self.view.rename(c.path, c.path2, noreplace=bool(c.n1)), wire.WB_UNLINK: lambda: self.view.unlink(c.path),
             wire.WB_MKDIR: lambda: self.view.mkdir(c.path, c.n1), wire.WB_RMDIR: lambda: self.view.rmdir(c.path),
             }[c.op]()
            self._kick()
            return protocol.encode_answer(0)
        except OSError as e:
            return _errno_answer(e)

    def _open(self, path: str, flags: int, mode: int) -> bytes:
        """An open for writing: a file created or truncated lands here (status: its seq); an open
        for update of a file the PFS holds (or will, once drained) writes through to the PFS."""
        entry = self.view.entry(path)
        exclusive = bool(flags & os.O_CREAT and flags & os.O_EXCL)
        if isinstance(entry, Local) and not entry.closed and not exclusive:  # the same file, open here already
            return protocol.encode_answer(entry.seq, os.fsencode(entry.through or self.area.data_path(entry.seq)))
        kind, where = self.view.resolve(path)
        # (whether it exists matters to an open that may create it: the view knows, or asks once)
        if flags & os.O_TRUNC or exclusive or (flags & os.O_CREAT and not self.view.exists(path)):
            self._wait_for_room()
            after = tuple(sorted(self.order.counts().items())) if self.order is not None else ()
            seq, local = self.view.create(path, mode, exclusive=exclusive, after=tuple(p for p in after if p[1]),
                                          ahead=self.fsync == "pfs")  # (its temporary made now: drain.py)
            self._kick()
            return protocol.encode_answer(seq, os.fsencode(local))
        if kind == "gone":
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if entry is not None or where != path or self.view.made_dir(path):  # pending: the PFS holds it once drained
            self._wait_for(self.journal.last_op)
            if self._outcome.failed:
                raise OSError(errno.EIO, "the write-back could not publish what this file depends on", path)
        with self._cond:
            self.figures["opened_through"] += 1
        return _pfs(path)  # written through (docs/consistency.md, W6)

    def _settle(self, path: str, path2: str, kind: int, mode: int) -> bytes:
        """truncate, chmod, chown, utime, link, symlink or mknod of a path under the write-back
        paths: a file being written is truncated (its local copy: the answer) or given its mode
        here; else what the job changed at those paths reaches the PFS first, then the kernel
        makes the call there, after everything before it and before anything after (W1, W3)."""
        entry = self.view.entry(path) if path else None
        if isinstance(entry, Local) and not entry.closed:
            if kind == wire.SETTLE_TRUNCATE:
                self.view.closing(entry.seq, synced=False)  # its bytes change: its fsync's copy is not the file
            if kind == wire.SETTLE_CHMOD:
                self.view.set_mode(entry.seq, mode)
                return protocol.encode_answer(wire.WB_ANSWER_DONE)
            if path2:  # a link to a file not on the PFS yet: as across filesystems
                raise OSError(errno.EXDEV, "a file being written under a write-back path has no PFS name yet", path)
            return _pfs(entry.through or self.area.data_path(entry.seq))  # its times (kept by the publish), its size
        if any(p and self.view.touches(p) for p in (path, path2)):
            self._wait_for(self.journal.last_op)
            if self._outcome.failed:
                raise OSError(errno.EIO, "the write-back could not publish what this call depends on", path or path2)
        self.view.outside(path, path2)
        return _pfs(path)

    def _closed(self, seq: int) -> None:
        """A descriptor of file ``seq`` was closed by the job: journaled once no process holds it."""
        if not sole_opener(self.view.where(seq)):
            self._closing.add(seq)  # another process holds it still: its close will tell
            return
        self._closing.discard(seq)
        where = self.view.where(seq)
        self._to_partner(seq, where, closing=True)
        self._sent.pop(seq, None)
        n = self.view.close(seq)
        if n is not None:
            size = os.stat(where).st_size
            with self._cond:
                self._reserved.pop(seq, None)
                self.figures["bytes_written"] += size
                self.figures["files_closed"] += 1
            self._kick()

    def _to_partner(self, seq: int, where: str, closing: bool = False) -> None:
        """File ``seq``'s bytes so far held by the partner node (its record follows, by the journal's
        mirror): a file written through is the PFS's already, and a file closed with nothing written
        since its fsync's copy went there (the close said so) is held already."""
        found = self.view.being_written(seq)
        if self.partners is None or found is None or found[1].through:
            return
        try:
            st = os.stat(where)
            if closing and found[1].synced and found[1].unchanged and self._sent.get(seq) == (st.st_size, st.st_mtime_ns):
                return
            if self.partners.send_file(seq, where, st.st_size):
                self._sent[seq] = (st.st_size, st.st_mtime_ns)
        except OSError as e:
            log.error("write-back: file %d not copied to the partner node: %s", seq, e)

    def _sync(self, seq: int) -> bytes:
        if self.fsync == "local":
            return protocol.encode_answer(0)
        started = time.monotonic()
        if self.fsync == "partner":  # the bytes so far on two nodes; the drain publishes them after
            self._to_partner(seq, self.view.where(seq))
            self.view.sync(seq)
            self._kick()
            with self._cond:
                self.figures["syncs"] += 1
                self.figures["app_sync_seconds"] += time.monotonic() - started
            return protocol.encode_answer(0)
        n = self.view.sync(seq, waited=True)
        if n is not None:
            self._kick()
            self._wait_for(n, released=True)
            with self._cond:
                self.figures["syncs"] += 1
                self.figures["app_sync_seconds"] += time.monotonic() - started
        if self._outcome.failed:
            return protocol.encode_answer(wire.WB_ERRNO + errno.EIO)
        return protocol.encode_answer(0)

    # -- room and waiting --------------------------------------------------------------------------
    def pending_bytes(self, but: int = 0, reserved: bool = True) -> int:
        """The bytes the area holds, or its writers reserved (``reserved``: what the room counts;
        else what the node holds, the report's figure); ``but``: not counting that file's."""
        total = 0
        with self._cond:
            ahead = dict(self._reserved) if reserved else {}
        for seq in self.area.pending_data():
            if seq == but:
                continue
            try:
                total += max(os.stat(self.area.data_path(seq)).st_size, ahead.get(seq, 0))
            except OSError:
                pass
        return total

    def _room(self, seq: int, need: int) -> bytes:
        """Room for file ``seq``'s writes up to ``need`` bytes (W6), and some ahead (the answer's
        body: the bytes granted): granted once the other files' bytes leave the room (they drain
        meanwhile); a file larger than the room, or one that would wait for nothing (the rest
        cannot drain: open files), is written through to the PFS instead."""
        found = self.view.being_written(seq)
        if found is None or found[1].through:
            return protocol.encode_answer(wire.WB_ANSWER_DONE, str(wire.GRANT_ALL).encode())
        waited = False
        held = self.pending_bytes(reserved=False)
        with self._cond:
            self.figures["peak_pending_bytes"] = max(self.figures["peak_pending_bytes"], held)
        while need <= self.room:
            pending = self.pending_bytes(but=seq)
            with self._cond:
                if pending + need <= self.room:
                    grant = min(need + min(wire.GRANT_AHEAD, self.room // 8), self.room - pending)
                    self._reserved[seq] = max(self._reserved.get(seq, 0), grant)
                    self.figures["waited_for_room"] += waited
                    return protocol.encode_answer(wire.WB_ANSWER_DONE, str(grant).encode())
                if self._outcome.failed or self._outcome.upto >= self.journal.last_op or self._stop:
                    break  # nothing more will drain (its pass over: what it published has left the room)
                waited = True
                self._cond.wait(0.05)
        with self._cond:
            self.figures["waited_for_room"] += waited
        return self._spill(seq)

    def _spill(self, seq: int) -> bytes:
        """File ``seq``'s bytes so far copied to its temporary name on the PFS (its directory there
        first), for its writer to go on there: answered SPILL with the path; EIO (the writer goes
        on in the area) when the PFS refuses."""
        path, entry = self.view.being_written(seq) or (None, None)
        if entry is None:
            return protocol.encode_answer(wire.WB_ANSWER_DONE)
        if self.view.touches(os.path.dirname(path)) or self.fsync == "pfs":  # (pfs: its temporary made at its open)
            self._wait_for(self.journal.last_op)
        self._following.ahead.hand_over(seq)  # (no descriptor of the drain's holds it: sole_opener)
        tmp = temporary_name(path, self.run_id, seq)
        try:
            copy_file(self.area.data_path(seq), tmp)
        except OSError as e:
            log.error("write-back: %s is larger than the room but cannot be written through (%s): it stays on "
                      "the node", path, e)
            return protocol.encode_answer(wire.WB_ERRNO + (e.errno or errno.EIO))
        with self._cond:
            self._spilling[seq] = tmp
        return protocol.encode_answer(wire.WB_ANSWER_SPILL, os.fsencode(tmp))

    def _spilled(self, seq: int, moved: bool) -> None:
        """The writer of file ``seq`` writes at its PFS copy now (``moved``), or could not."""
        with self._cond:
            tmp = self._spilling.pop(seq, None)
            self._reserved.pop(seq, None)
        if tmp is None:
            return
        if not moved:
            log.error("write-back: a writer could not move to %s: the file stays on the node", tmp)
            os.unlink(tmp)
            return
        self.view.written_through(seq, tmp)
        os.unlink(self.area.data_path(seq))
        with self._cond:
            self.figures["files_written_through"] += 1
        log.info("write-back: %s is larger than the room (%d bytes): written through to the PFS", tmp, self.room)

    def _wait_for_room(self) -> None:
        """A new file waits while the bytes pending fill the room (they drain meanwhile)."""
        waited = False
        if self.kept is not None:  # the job's own writes first: the oldest kept copies leave the room
            self.kept.make_room(self.room - self.pending_bytes())
        while True:
            pending = self.pending_bytes()
            held = self.pending_bytes(reserved=False)
            with self._cond:
                self.figures["peak_pending_bytes"] = max(self.figures["peak_pending_bytes"], held)
                if pending < self.room or self._outcome.failed or self._outcome.upto >= self.journal.last_op:
                    break  # room, or nothing more will drain: never a deadlock on one file larger than the room
                waited = True
                self._cond.wait(0.05)
        if waited:
            with self._cond:
                self.figures["waited_for_room"] += 1

    def _wait_for(self, n: int, passed: bool = False, released: bool = False) -> None:
        """Until record ``n`` is on the PFS (``passed``: and the drain's pass that applied it is over,
        its outcome and figures taken; ``released``: or, an fsync's, its bytes are), or the drain stopped."""
        with self._cond:
            while (self._outcome.upto if passed else max(self._upto, self._released if released else 0)) < n \
                    and not self._outcome.failed and not self._stop:
                self._cond.wait(0.25)

    def _release(self, rec) -> None:
        with self._cond:  # (the drain applies in order: every record before it is on the PFS)
            self._released = max(self._released, rec.n)
            self._cond.notify_all()

    def _kick(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the drain ---------------------------------------------------------------------------------
    def _drain_loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (self._upto >= self.journal.last_op or self._outcome.failed):
                    self._cond.wait(0.5)
                if self._stop and (self._upto >= self.journal.last_op or self._outcome.failed):
                    return self._following.ahead.close()  # (the temporaries of files never closed)
            started = time.monotonic()
            pending = self.pending_bytes(reserved=False)
            try:
                out = drain(self.area, self.run_id, journal=self.journal, step=self._step, before=self._after_others,
                            commit=self.view.applying, following=self._following, released=self._release)
            except Exception as e:  # a bug must not lose what is pending: kept, said, reported
                log.exception("write-back: the drain failed")
                out = Outcome(upto=self._upto, failed=f"the drain failed: {e}")
            self.view.applied(out.upto)
            with self._cond:
                self.figures["drain_seconds"] += time.monotonic() - started
                self.figures["files_published"] += len(out.published)
                self.figures["bytes_published"] += out.published_bytes
                self.figures["bytes_copied"] += out.copied_bytes
                self.figures["peak_pending_bytes"] = max(self.figures["peak_pending_bytes"], pending)
                self._upto, self._outcome = out.upto, out
                self._cond.notify_all()

    def _step(self, phase: str, rec) -> None:
        if phase == "applied":
            self._moving = rec.n
            with self._cond:  # an fsync waiting for this record returns now, not after the drain's pass
                self._upto = max(self._upto, rec.n)
                self._cond.notify_all()
            if self.kept is not None:  # (before the drain lets a published file's local copy go)
                self.kept.follow(rec, self.area.data_path(rec["seq"]) if rec.op == "close" else "")
            if rec.op == "sync" and rec["seq"] in self._closing:  # the job's close came while this copy held it
                self._closed(rec["seq"])
            if self.order is not None:
                self.order.moved()

    def _after_others(self, rec) -> None:
        """Hold ``rec``'s publish until the other nodes' operations it is ordered after are on the
        PFS (W4); refused (OSError) when a node's drain stopped short of them."""
        if self.order is None:
            return
        started = time.monotonic()
        try:
            self.order.wait_applied({k: n for k, n in rec["after"]}, stop=lambda: self._stop)
        except OrderFailed as e:
            raise OSError(errno.EIO, str(e)) from None
        with self._cond:
            self.figures["ordered_files"] += 1
            self.figures["order_wait_seconds"] += time.monotonic() - started

    def _drain_held(self, held: str, node: int, progress) -> tuple[int, bool]:
        """Lost ``node``'s journal and files held here (its partner): drained as its own drain would
        have, after what each file is ordered after (W4); ``progress(applied, failed)`` after each."""
        area = Area(held, -1)  # (not held by a lock: this daemon alone writes there)

        def step(phase, rec):
            if phase == "applied":
                progress(rec.n, False)
        out = drain(area, self.run_id, step=step, before=self._after_others)
        with self._cond:
            self.figures["held_for_lost_published"] += len(out.published)
            self._held_outcomes[node] = out
        if out.failed or out.unpublished:
            log.error("write-back: node %d's held copies: %s; not published: %s", node, out.failed or "not all",
                      ", ".join(out.unpublished) or "-")
        else:
            log.warning("write-back: node %d's held copies: %d files published for it", node, len(out.published))
        return out.upto, bool(out.failed or out.damaged)

    def finish(self) -> Outcome:
        """Everything the job closed on the PFS (or a refusal): a file still held by a process
        that is gone is closed now if some process of the job closed it (others kept it open
        to the end); then the drain is waited for. (The figures note when the job ended and when
        its drain did: what of the drain overlapped the job.)"""
        with self._cond:
            if self.figures["job_ended_after_s"] is None:
                self.figures["job_ended_after_s"] = time.monotonic() - self._started
        while True:  # (a close the drain's own copy of the file held off is journaled once that copy ends)
            for seq in sorted(self._closing):
                self._closed(seq)
            held = set(self._closing)
            self._wait_for(self.journal.last_op, passed=True)
            if not held - self._closing or self._outcome.failed:
                break
        if self.partners is not None:
            self.partners.finish()  # a lost node's files, published here, before the run says it is done
        if self.kept is not None:
            self.kept.followed(drained=True)  # (what it kept, in the figures)
            self.kept_reads.followed()
        with self._cond:
            self.figures["drained_after_s"] = time.monotonic() - self._started
            out = self._outcome
            for node, held in self._held_outcomes.items():  # what a lost node could not have published: said here
                if held.failed or held.unpublished:
                    out = Outcome(applied=out.applied, upto=out.upto, published=out.published,
                                  published_bytes=out.published_bytes, copied_bytes=out.copied_bytes,
                                  failed=out.failed or f"node {node} was lost and its held copies could not all be "
                                                       f"published: {held.failed or 'files kept'}",
                                  unpublished={**out.unpublished, **held.unpublished}, damaged=out.damaged)
            return out

    def stats(self) -> dict:
        """The figures, and what is left: ``pending_bytes`` (the area's, files still written
        included), ``publishing_files``/``publishing_bytes`` (closed, not on the PFS yet: what
        the drain has left to copy; the launcher's line while it waits, W7)."""
        with self._cond:
            out = self._outcome
            open_seqs = self.view.open_seqs()
            publishing = [seq for seq in self.area.pending_data() if seq not in open_seqs]
            publishing_bytes = 0
            for seq in publishing:
                try:
                    publishing_bytes += os.stat(self.area.data_path(seq)).st_size
                except OSError:  # published meanwhile
                    pass
            partner = dict(self.partners.figures) if self.partners is not None else {}
            kept = {**self.kept.figures, **self.kept_reads.figures} if self.kept is not None else {}
            return {**self.figures, **partner, **kept, "fsync": self.fsync, "paths": list(self.paths), "area": self.area.path,
                    "pending_bytes": self.pending_bytes(), "records": self.journal.last_op, "applied": self._upto,
                    "failed": out.failed, "unpublished": dict(out.unpublished),
                    "not_closed": len(open_seqs), "publishing_files": len(publishing),
                    "publishing_bytes": publishing_bytes}

    def close(self) -> dict:
        """The end of the run: drained, then the area removed if nothing is left in it (else kept
        for `monarch drain`); the final figures."""
        out = self.finish()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5)
        for tmp in self._spilling.values():  # a writer killed before it moved there: its bytes stay in the area
            try:
                os.unlink(tmp)
            except OSError:
                pass
        figures = self.stats()
        if out.failed is not None:
            figures["failed"], figures["unpublished"] = out.failed, dict(out.unpublished)
        self.journal.close()
        with self._heard_lock:
            fd, self._heard_fd = self._heard_fd, -1
        if fd >= 0:
            os.close(fd)
        self.listings.remove()
        if self.kept is not None:
            self.kept_reads.close()
            self.kept.close()
        if out.failed is None and not self.area.pending_data():  # (in a cluster: what a later drain may need, left)
            self.area.remove(done={"applied": self._upto, "heard": self._heard} if self.order is not None else None)
        else:
            log.error("write-back: %s; kept in %s for `monarch drain`", out.failed or "files not closed by the job",
                      self.area.path)
            self.area.release()
        return figures


def make_writeback(config, tiers: list, run_id: str, node: int) -> WritebackRoom | None:
    """The run's write-back on this node (None: not configured, or no tier to hold it, said: then
    the job's writes go to the PFS as without Monarch)."""
    wb = getattr(config, "writeback", None)
    if wb is None or not wb.paths:
        return None
    cfg = next((t for t in config.tiers if t.name == (wb.tier or config.tiers[0].name)), None)
    tier = next((t for t in tiers if cfg is not None and t.name == cfg.name), None)
    if tier is None:
        log.error("write-back: tier %s is not available on this node: the job's writes go to the PFS directly",
                  wb.tier or "(the first)")
        return None
    room = wb.room if wb.room_share is None else int(tier.capacity * wb.room_share)
    keep = wb.keep if wb.keep_share is None else int(room * wb.keep_share)
    try:
        return WritebackRoom(tuple(wb.paths), cfg.path, run_id, node, durable=not is_memory_backed(cfg.path),
                             room=room, fsync=wb.fsync, keep=keep, linger=config.staging.linger)
    except OSError as e:
        log.error("write-back: cannot make its area under %s (%s): the job's writes go to the PFS directly",
                  cfg.path, e)
        return None
