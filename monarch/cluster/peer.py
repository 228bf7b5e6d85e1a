"""``Cluster``: the peer layer the node daemon calls (one instance per daemon, one daemon per node).

Threads: the caller's threads (``fetch`` from many at once, ``share``/``finish``/``close``
from one), one MPI engine thread that makes every MPI call, and a small pool that runs
``provide`` for peers. See docs/cluster.md for the protocol and the failure model.
"""

import logging
import pickle
import queue
import threading
import time

import zstandard

from ..errors import PeerError
from . import placement, transfer, world
from .engine import TAG_CTRL, Engine
from .serve import Server
from .transfer import FIRST_REPLY_TAG, Incoming
from .streamed import StreamedShare

log = logging.getLogger(__name__)

FAILURE_REASONS = ("refused", "timeout", "peer_down", "peer_lost", "no_heartbeat", "aborted", "local_io",
                   "not_running")
HEARTBEAT = 0.25          # seconds of silence from an owner we wait on before pinging it
HEARTBEAT_TIMEOUT = 1.0   # seconds of silence (no pong either) after which it is down, not slow
REOWNED_WAIT = 1.5        # seconds a re-owned key's new owner may take to stage it before the PFS is read here
# why a node is lost, in the report: MPI told us (ULFM), it stopped answering, or it left finish()
PROC_FAILED, NO_HEARTBEAT, NO_FINISH = "proc failed", "no heartbeat", "did not finish"


class Cluster:
    """One node of the job. ``node`` is this node's rank, ``nodes`` the node count."""

    chunk_size = 4 << 20     # bytes per MPI message of a file
    window = 4               # chunk messages in flight per transfer, each direction
    serve_threads = 8        # concurrent provide() calls for peers
    finish_timeout = 600.0   # cap on finish() waiting for live but slow nodes
    close_timeout = 30.0     # close() after finish(): wait this long for node 0's goodbye

    def __init__(self, MPI, comm):
        self.MPI = MPI
        self.comm = comm
        self.node = comm.Get_rank()
        self.nodes = comm.Get_size()
        self.peer_timeout = 10.0
        self.heartbeat_timeout = HEARTBEAT_TIMEOUT  # a silent owner is down after this (slow ones answer pings)
        self.on_lost = None      # called (engine thread) with (node, why) when a node is lost, e.g. by the daemon
        self.placement = None    # a placement.Placement, once set: owner() asks it instead of rendezvous hashing
        self._engine = Engine(MPI, comm, self._on_ctrl, self._on_mpi_error)
        self._server = None
        self._lock = threading.Lock()
        # bytes_*: the files' bytes; wire_bytes_*: what crossed the network (compressed copies as stored)
        self._counters = {"bytes_sent": 0, "bytes_received": 0, "wire_bytes_sent": 0, "wire_bytes_received": 0,
                          "files_sent": 0, "files_received": 0, "fetch_failures": {}, "serve_failures": {},
                          "slow_fetches": 0,  # the owner answered pings but took over heartbeat_timeout: slow, not dead
                          "after_loss": {"files_sent": 0, "bytes_sent": 0, "files_received": 0, "bytes_received": 0}}
        self._lost = {}          # node -> {"node", "at" (time.time()), "why"}: dead for the rest of the job
        # engine-thread state (read from other threads only as atomic dict look-ups)
        self._tags = {}
        self._next_tag = FIRST_REPLY_TAG
        self._tag_ub = comm.Get_attr(MPI.TAG_UB) or 32767
        self._down = {}          # node -> monotonic time it stopped answering
        self._heard = {}         # node -> monotonic time of its last message
        self._pinging = set()
        self._done = {}          # finish(), node 0: nodes that called finish
        self._stats = {}         # finish(), node 0: node -> its stats
        self._released = threading.Event()
        self._bye = threading.Event()
        self._finished = None    # finish(): the nodes given up on
        self._coord = 0          # finish(): the node that gathered the stats
        self._closed = False

    @classmethod
    def from_world(cls):
        """The cluster of every rank of MPI_COMM_WORLD (collective: every rank must call it)."""
        MPI = world.load_mpi()
        comm = MPI.COMM_WORLD.Dup()      # our own tag space
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        return cls(MPI, comm)

    # -- placement ---------------------------------------------------------------------
    def owner(self, key):
        """The node that owns ``key``: the same answer on every node, nothing negotiated. Once
        nodes are lost, the next live node of the key's preference list (only the lost
        nodes' keys move)."""
        lost = getattr(self, "_lost", None)  # (a bare instance in the placement's tests has none)
        if self.placement is not None:
            return self.placement.owner(key, lost) if lost else self.placement.owner(key)
        if not lost:
            return placement.owner(key, self.nodes)
        live = [n for n in range(self.nodes) if n not in lost] or [self.node]
        return max(live, key=lambda n: (placement.weight(key, n), -n))

    # -- snapshot ----------------------------------------------------------------------
    def share(self, take, timeout=None, on_files=None):
        """Collective: node 0 returns and broadcasts ``take()``; every node returns it.

        Waiting nodes poll (MPICH's blocking broadcast would spin a core for as long as
        node 0 walks the PFS). If ``take`` raises on node 0 it re-raises there and every
        other node raises PeerError. ``timeout`` (None: wait forever) bounds the wait.

        Streamed (``on_files`` given): node 0 calls ``take(publish)``, where ``publish(files)``
        (a dict key -> info, from the walking thread) sends the files walked so far to every
        node, at most every STREAM_EVERY seconds; each node's ``on_files(files)`` sees every
        file once, in walk order, before ``share`` returns, so staging starts with the walk.
        """
        if on_files is None:
            return self._share_whole(take, timeout)
        return StreamedShare(self, on_files, timeout).run(take)

    def _share_whole(self, take, timeout):
        error = None
        if self.node == 0:
            try:
                payload = pickle.dumps(("ok", take()), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                error = exc
                payload = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
        else:
            payload = None
        deadline = None if timeout is None else time.monotonic() + timeout
        payload = self.bcast_bytes(payload, deadline)
        if error is not None:
            raise error
        status, value = pickle.loads(payload)
        if status != "ok":
            raise PeerError(f"node 0 could not take the dataset snapshot: {value}")
        return value

    def bcast_bytes(self, payload, deadline):
        """Collective: node 0's ``payload`` (bytes) on every node (a length, then the bytes)."""
        if self.node == 0:
            payload = bytearray(payload)
            head = bytearray(len(payload).to_bytes(8, "little"))
        else:
            head = bytearray(8)
        self._bcast(head, deadline)
        if self.node != 0:
            payload = bytearray(int.from_bytes(head, "little"))
        self._bcast(payload, deadline)
        return payload

    def allgather_ints(self, values, timeout=None):
        """Collective: every node's ``values`` (the same count of 64-bit integers on each), indexed
        by node. Polled like ``share`` (no spinning core); PeerError after ``timeout``."""
        import array
        mine = array.array("q", values)
        out = array.array("q", bytes(8 * len(mine) * self.nodes))
        MPI, comm = self.MPI, self.comm
        req = self._engine.run(lambda: comm.Iallgather([mine, MPI.INT64_T], [out, MPI.INT64_T]))
        deadline = None if timeout is None else time.monotonic() + timeout
        self._poll(req, deadline, "allgather_ints(): not every node answered in time")
        n = len(mine)
        return [list(out[k * n:(k + 1) * n]) for k in range(self.nodes)]

    def _bcast(self, buf, deadline):
        MPI, comm = self.MPI, self.comm
        req = self._engine.run(lambda: comm.Ibcast([buf, MPI.BYTE], root=0))
        self._poll(req, deadline, "share(): node 0 did not send the dataset snapshot in time")

    def _poll(self, req, deadline, late: str) -> None:
        """Wait for a nonblocking collective by polling (MPICH's blocking ones spin a core);
        PeerError(``late``) past ``deadline``, or at once when a node is lost (ULFM: the
        collective can then never complete; the caller fails open)."""
        pause = 1e-4
        check_at = time.monotonic() + 0.25
        what = late.partition(":")[0]
        while True:
            try:
                if self._engine.run(req.Test):
                    return
            except self.MPI.Exception as exc:
                self._engine.run(self._check_failed)
                raise PeerError(f"{what}: a node failed ({exc}); lost: {sorted(self._lost)}") from exc
            now = time.monotonic()
            if now >= check_at:
                self._engine.run(self._check_failed)
                check_at = now + 0.25
                if self._lost:
                    raise PeerError(f"{what}: nodes {sorted(self._lost)} lost before every node took part")
            if deadline is not None and now > deadline:
                raise PeerError(late)
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    # -- serving -----------------------------------------------------------------------
    def start(self, provide):
        """Serve peers in the background; ``provide(key) -> local path | None`` (see module doc)."""
        if self._engine.running or self._closed:
            raise PeerError("Cluster.start(): already started or closed")
        self._server = Server(self._engine, provide, self, self.serve_threads)
        world.track_engine(self._engine)
        self._engine.start()
        self._engine.call(self._tick)

    def _tick(self):
        # Engine thread, periodic: re-ping peers that stopped answering; with MPICH (no failure
        # notice) a node silent for peer_timeout after hydra signalled a death is lost.
        self._check_failed()
        now = time.monotonic()
        for node, since in list(self._down.items()):
            if node in self._lost:
                continue
            if world.failure_seen() and now - max(since, self._heard.get(node, 0.0)) > self.peer_timeout:
                self._lose(node, NO_HEARTBEAT)
            else:
                self._ping(node)
        self._engine.after(max(0.25, min(1.0, self.peer_timeout / 2)), self._tick)

    # -- fetching ----------------------------------------------------------------------
    def fetch(self, owner, key, dest):
        """Copy ``key`` from node ``owner`` into ``dest`` (a path, or a descriptor open for writing); return its size.

        Raises PeerError when the owner refuses, does not answer the header within
        ``peer_timeout`` (this includes the owner staging the file), stalls for
        ``peer_timeout`` between chunks, or is known to be down (then at once).
        """
        if not (0 <= owner < self.nodes) or owner == self.node:
            raise PeerError(f"fetch {key!r}: node {owner} is not a peer of node {self.node} of {self.nodes}")
        if not self._engine.running or self._closed:
            raise self._failure("not_running", f"fetch {key!r}: the peer layer is not running")
        if owner in self._lost:
            raise self._failure("peer_lost", f"fetch {key!r}: node {owner} is lost ({self._lost[owner]['why']})")
        if owner in self._down:
            raise self._failure("peer_down", f"fetch {key!r}: node {owner} is not answering")
        timeout = self.peer_timeout
        if self._lost and self._reowned(key):  # its new owner stages it now, behind its own share: do not wait long
            timeout = min(timeout, REOWNED_WAIT)
        xfer = Incoming(self._engine, owner, key, None, self.chunk_size, self.window,
                        self._release_tag, self._on_heard)
        asked = time.monotonic()
        self._engine.call(lambda: self._begin(xfer))
        try:
            kind, *rest = self._next_event(xfer, timeout, "the file header")
            if time.monotonic() - asked > self.heartbeat_timeout:
                with self._lock:
                    self._counters["slow_fetches"] += 1
            if kind == "refused":
                raise self._failure("refused", f"fetch {key!r}: node {owner} refused: {rest[0]}")
            size, file_size, encoding = rest
            written = self._receive(xfer, size, dest, timeout, file_size, encoding)
        except BaseException:
            self._engine.call(xfer.abandon)
            raise
        with self._lock:
            self._counters["bytes_received"] += written
            self._counters["wire_bytes_received"] += size
            self._counters["files_received"] += 1
            if self._lost:
                self._counters["after_loss"]["bytes_received"] += written
                self._counters["after_loss"]["files_received"] += 1
        return written

    def _receive(self, xfer, size, dest, timeout, file_size, encoding):
        """Write the file's chunks into ``dest`` (a compressed file decompressed as it comes,
        never beyond the size its header announced); the file's bytes written."""
        if encoding not in (transfer.RAW, transfer.ZSTD):
            raise self._failure("corrupt", f"fetch {xfer.key!r}: node {xfer.owner} sent encoding {encoding}")
        inflate = zstandard.ZstdDecompressor().decompressobj() if encoding == transfer.ZSTD else None
        written = received = 0
        try:
            with open(dest, "wb", closefd=not isinstance(dest, int)) as f:
                for _ in range(xfer.nchunks if size else 0):
                    kind, idx, buf, count = self._next_event(xfer, timeout, "the next chunk")
                    if count != len(buf):
                        raise self._failure("aborted", f"fetch {xfer.key!r}: node {xfer.owner} "
                                            f"aborted the transfer at {received} of {size} bytes")
                    received += count
                    data = buf if inflate is None else inflate.decompress(buf)
                    if written + len(data) > file_size:
                        raise self._failure("corrupt", f"fetch {xfer.key!r}: node {xfer.owner} sent more "
                                            f"than the {file_size} bytes it announced")
                    f.write(data)
                    written += len(data)
                    if xfer.next_idx < xfer.nchunks:  # (set on the engine thread; a stale read only credits once too often)
                        self._engine.call(xfer.credit)  # room for the next receive
        except zstandard.ZstdError as exc:
            raise self._failure("corrupt", f"fetch {xfer.key!r}: node {xfer.owner}'s frame: {exc}") from exc
        except OSError as exc:
            raise self._failure("local_io", f"fetch {xfer.key!r}: writing fd {dest}: {exc}") from exc
        if written != file_size:
            raise self._failure("corrupt", f"fetch {xfer.key!r}: node {xfer.owner} sent {written} of the "
                                f"{file_size} bytes it announced")
        return written

    def _next_event(self, xfer, timeout, what):
        """The transfer's next event. Waits at most ``timeout`` for a slow owner (one that
        answers pings), ``heartbeat_timeout`` for a silent one, not at all for a lost one."""
        started = time.monotonic()
        deadline = started + timeout
        owner = xfer.owner
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                if now - self._heard.get(owner, 0.0) > self.heartbeat_timeout:
                    self._suspect(owner)  # silent too: down; one that answers pings is only slow
                raise self._failure("timeout", f"fetch {xfer.key!r}: node {owner} did not send "
                                    f"{what} within {timeout:g}s")
            silent = now - max(self._heard.get(owner, 0.0), started)
            if silent > self.heartbeat_timeout:
                self._suspect(owner)
                raise self._failure("no_heartbeat", f"fetch {xfer.key!r}: node {owner} answered nothing, not even "
                                    f"a ping, for {silent:.1f}s (waiting for {what})")
            if silent > HEARTBEAT:
                self._engine.call(lambda: self._ping(owner))
            try:
                event = xfer.events.get(timeout=min(left, HEARTBEAT / 2))
            except queue.Empty:
                if owner in self._lost:
                    raise self._failure("peer_lost", f"fetch {xfer.key!r}: node {owner} is lost "
                                        f"({self._lost[owner]['why']})") from None
                if not self._engine.running:
                    raise self._failure("not_running", f"fetch {xfer.key!r}: the MPI engine stopped")
                continue
            if event[0] == "lost":
                raise self._failure("peer_lost", f"fetch {xfer.key!r}: node {owner} is lost ({event[1]})")
            return event

    def _failure(self, reason, message):
        with self._lock:
            failures = self._counters["fetch_failures"]
            failures[reason] = failures.get(reason, 0) + 1
        return PeerError(message)

    def _count_serve_failure(self, reason):
        with self._lock:
            failures = self._counters["serve_failures"]
            failures[reason] = failures.get(reason, 0) + 1

    def _count_sent(self, size, wire_size=None):
        with self._lock:
            self._counters["bytes_sent"] += size
            self._counters["wire_bytes_sent"] += size if wire_size is None else wire_size
            self._counters["files_sent"] += 1
            if self._lost:
                self._counters["after_loss"]["bytes_sent"] += size
                self._counters["after_loss"]["files_sent"] += 1

    def counters(self):
        """A copy of the transfer counters (failures by reason)."""
        with self._lock:
            out = dict(self._counters)
            out["fetch_failures"] = dict(out["fetch_failures"])
            out["serve_failures"] = dict(out["serve_failures"])
            out["after_loss"] = dict(out["after_loss"])
        out["peers_down"] = sorted(self._down)
        out["lost"] = self.lost()
        return out

    def first_owner(self, key):
        """The node that owns ``key`` while no node is lost."""
        return self.placement.owner(key) if self.placement is not None else placement.owner(key, self.nodes)

    def _reowned(self, key):
        """Was ``key``'s owner lost (so that a survivor owns it now)?"""
        return self.first_owner(key) in self._lost

    def lost(self):
        """The nodes lost so far, each ``{"node", "at" (time.time()), "why"}``, by node."""
        return [dict(v) for _, v in sorted(self._lost.items())]

    # -- engine thread: tags, control messages, liveness --------------------------------
    def _begin(self, xfer):
        tag = self._next_tag
        while tag in self._tags:
            tag = tag + 1 if tag < self._tag_ub else FIRST_REPLY_TAG
        self._next_tag = tag + 1 if tag < self._tag_ub else FIRST_REPLY_TAG
        self._tags[tag] = xfer
        xfer.tag = tag
        xfer.begin()

    def _release_tag(self, xfer):
        self._tags.pop(xfer.tag, None)

    def _on_ctrl(self, src, msg):
        self._on_heard(src)
        kind = msg[0]
        if kind == "req":
            if self._server is None:
                return
            self._server.on_request(src, msg[1], msg[2])
        elif kind == "cancel":
            if self._server is not None:
                self._server.on_cancel(src, msg[1])
        elif kind == "ping":
            self._engine.send_obj(("pong",), src)
        elif kind == "done":
            self._done[src] = True
        elif kind == "stats":
            self._stats[src] = msg[1]
        elif kind == "release":
            self._released.set()
        elif kind == "bye":
            self._bye.set()
        elif kind != "pong":
            log.warning("unknown control message %r from node %d", kind, src)

    def _on_heard(self, node):
        self._heard[node] = time.monotonic()
        if node not in self._lost and self._down.pop(node, None) is not None:
            log.info("node %d answers again", node)

    # -- engine thread: lost nodes (issue 21; docs/cluster.md, "A node dies") --------------
    def _on_mpi_error(self, exc):
        """An MPI call failed: with ULFM a peer died (MPI_ERR_PROC_FAILED). Acknowledge the
        failures (wildcard receives work again) and lose the nodes MPI names."""
        MPI = self.MPI
        cls = exc.Get_error_class() if hasattr(exc, "Get_error_class") else None
        ft = {getattr(MPI, n, None) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")} - {None}
        if cls not in ft:
            log.warning("MPI error on the peer layer: %s", exc)
        self._check_failed()

    _failure_notices = True  # does this MPI name failed ranks (MPI_Comm_get_failed)?

    def _check_failed(self):
        """Lose every node MPI knows has failed (ULFM's Get_failed; MPICH 5 answers an empty
        group). An MPI or mpi4py without these calls is asked once: the heartbeats then
        detect a lost node alone."""
        if not self._failure_notices:
            return
        comm, MPI = self.comm, self.MPI
        try:
            comm.Ack_failed()
            group = comm.Get_failed()
            try:
                ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), comm.Get_group())
            finally:
                group.Free()
        except (NotImplementedError, AttributeError) as exc:  # an MPI library without them (mpi4py raises), mpi4py < 4
            self._failure_notices = False
            log.info("this MPI does not name failed ranks (%s): lost nodes are found by heartbeats", exc)
            return
        except MPI.Exception as exc:  # e.g. MPI_ERR_UNSUPPORTED_OPERATION: the same, once said
            if exc.Get_error_class() == getattr(MPI, "ERR_UNSUPPORTED_OPERATION", None):
                self._failure_notices = False
                log.info("this MPI does not name failed ranks (%s): lost nodes are found by heartbeats", exc)
            return
        for node in ranks:
            if node not in (None, MPI.UNDEFINED, self.node):
                self._lose(node, PROC_FAILED)

    def _lose(self, node, why):
        """``node`` is gone for the rest of the job: fail what waits on it, re-own its keys."""
        if node in self._lost or node == self.node:
            return
        self._lost[node] = {"node": node, "at": round(time.time(), 3), "why": why}
        self._down.setdefault(node, time.monotonic())
        log.warning("node %d is lost (%s): its files are owned by the survivors from now on", node, why)
        world.note_failure(f"node {node} lost: {why}")
        for xfer in [x for x in self._tags.values() if x.owner == node]:
            xfer.lost(why)
        if self._server is not None:
            self._server.on_lost(node)
        if self.on_lost is not None:
            try:
                self.on_lost(node, why)
            except Exception:
                log.exception("on_lost(%d) failed", node)

    def _suspect(self, node):
        # Any thread: later fetches from ``node`` fail at once until it answers a ping.
        if node not in self._down:
            log.warning("node %d did not answer in time: using the PFS instead until it does", node)
            self._down[node] = time.monotonic()
        self._engine.call(lambda: self._ping(node))

    def _ping(self, node):
        if node in self._pinging or node in self._lost:  # the last ping has not even left: do not pile up
            return
        self._pinging.add(node)
        req = self.comm.isend(("ping",), node, TAG_CTRL)
        self._engine.post(req, lambda st: self._pinging.discard(node))

    # -- shutdown ----------------------------------------------------------------------
    def finish(self, local_stats, timeout=None):
        """Collective at shutdown: see docs/cluster.md.

        The coordinator is node 0, or the lowest node not lost (it writes the report).
        1. Every node tells the coordinator it is done and keeps serving; the coordinator waits
           for all of them -- a lost node is not waited for; one that answers no ping for
           ``peer_timeout`` or that ``timeout`` (default ``finish_timeout``) runs out on is
           given up on -- then releases the others. A node whose coordinator is lost meanwhile
           tells the next one (which may be itself).
        2. Released, a node stops taking requests, lets the transfers under way end, and
           sends its stats: ``local_stats``, or ``local_stats()`` if it is callable (so
           the files it served while waiting are counted).
        Returns on the coordinator the stats of every node indexed by node, with
        ``{"node": k, "missing": True, "reason": ..., "lost": {...} or None}`` for a node that
        never reported; None on the other nodes.
        """
        if not self._engine.running:
            self.start(None)
        limit = self.finish_timeout if timeout is None else timeout
        started = time.monotonic()
        while True:
            coord = self._coordinator()
            if coord == self.node:
                self._done[self.node] = True
                missing = self._await(started, limit, lambda: [k for k in self._live() if k not in self._done])
                alive = [k for k in self._live() if k != self.node and k not in missing]
                self._send_wait([(("release",), k) for k in alive])
                break
            self._send_wait([(("done",), coord)])
            missing = self._await(started, limit, lambda c=coord: [] if self._released.is_set()
                                  or self._coordinator() != c else [c])
            if self._released.is_set() or self._coordinator() == coord:
                break
            log.warning("finish(): coordinator node %d is lost; telling node %d", coord, self._coordinator())
        self._server.stop_accepting()
        if not self._server.wait_idle(self.peer_timeout):
            log.warning("finish(): transfers to peers still running after %gs", self.peer_timeout)
        stats = local_stats() if callable(local_stats) else local_stats
        result = None
        if coord == self.node:
            self._stats[self.node] = stats
            missing.update(self._await(time.monotonic(), limit,
                                       lambda: [k for k in alive if k not in self._stats and k not in self._lost]))
            result = [self._stats.get(k) for k in range(self.nodes)]
            missing.update({k: self._lost[k]["why"] for k in self._lost if result[k] is None})
            for k, reason in missing.items():
                result[k] = {"node": k, "missing": True, "reason": reason, "lost": self._lost.get(k)}
        elif not missing:
            self._send_wait([(("stats", stats), coord)])
        if missing:
            world.note_failure(f"finish(): nodes {sorted(missing)} did not finish")
        self._finished = missing
        self._coord = coord
        return result

    def _coordinator(self):
        """The node that gathers the stats and writes the report: the lowest node not lost."""
        return min(k for k in range(self.nodes) if k not in self._lost or k == self.node)

    def _live(self):
        return [k for k in range(self.nodes) if k not in self._lost]

    def _send_wait(self, messages):
        """Send control messages and wait (at most peer_timeout) until they have left."""
        sent = []
        for obj, dest in messages:
            if dest in self._lost:
                continue
            done = threading.Event()
            sent.append((dest, done))
            self._engine.call(lambda obj=obj, dest=dest, done=done: self._engine.send_obj(obj, dest, on_sent=done.set))
        deadline = time.monotonic() + self.peer_timeout
        ok = True
        for dest, done in sent:
            while not done.wait(0.1):
                if dest in self._lost or time.monotonic() > deadline:  # a send to a lost node may never complete
                    ok = False
                    break
        return ok

    def _await(self, started, limit, waiting_for):
        """Wait until ``waiting_for()`` is empty; return {node: reason} for nodes given up on."""
        ping_every = max(0.1, min(1.0, self.peer_timeout / 4))
        next_ping = 0.0
        while True:
            pending = waiting_for()
            if not pending:
                return {}
            now = time.monotonic()
            silent = [k for k in pending if now - max(self._heard.get(k, 0.0), started) > self.peer_timeout]
            if len(silent) == len(pending):
                return {k: f"no answer for {self.peer_timeout:g}s" for k in pending}
            if now - started > limit:
                return {k: ("no answer" if k in silent else f"did not finish within {limit:g}s")
                        for k in pending}
            if now >= next_ping:
                self._engine.call(lambda p=pending: [self._ping(k) for k in p])
                next_ping = now + ping_every
            time.sleep(0.02)

    def close(self):
        """Stop serving and stop the MPI engine. MPI itself is finalised at exit (if no peer failed)."""
        if self._closed:
            return
        self._closed = True
        if self._finished is not None and self._engine.running:
            # After a peer failure hydra kills every survivor as soon as one exits: the
            # coordinator (which writes the report between finish() and close()) says when to go.
            coord = self._coord
            if coord == self.node:
                self._send_wait([(("bye",), k) for k in range(self.nodes) if k != self.node
                                 and k not in self._finished and k not in self._lost])
            elif coord not in self._finished:
                deadline = time.monotonic() + self.close_timeout
                while not self._bye.wait(0.1):
                    if coord in self._lost or time.monotonic() > deadline:
                        log.warning("close(): node %d did not say goodbye (%s)", coord,
                                    "lost" if coord in self._lost else f"{self.close_timeout:g}s")
                        break
        if self._down:
            world.note_failure(f"nodes {sorted(self._down)} were not answering")
        if self._server is not None:
            self._server.shutdown()
        self._engine.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
