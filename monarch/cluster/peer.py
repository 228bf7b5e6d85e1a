"""``Cluster``: the peer layer the node daemon calls (one instance per daemon, one daemon per node).

Threads: the caller's threads (``fetch`` from many at once, ``share``/``finish``/``close``
from one), one MPI engine thread that makes every MPI call, and a small pool that runs
``provide`` for peers. See docs/cluster.md for the protocol and the failure model.

``Cluster`` is the façade; each part lives in a room of its own:

  collective.py  ``share``, ``allgather_ints`` and ``allgather_bytes`` (node 0's snapshot, the capacities, the
                 kept copies)
  fetch.py       ``fetch``: copying a file from its owner
  provide.py     answering the peers' requests (``Provider``, calling ``provide``)
  liveness.py    heartbeats, pings, nodes down and lost (``on_loss``)
  shutdown.py    ``finish`` and the goodbye before ``close``
  control.py     the control messages' verbs and their verb -> handler table
  counters.py    the transfer counters (``counters``)
  order.py       the write-back's order across the nodes (``write_order``)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..errors import FailureReason, PeerError
from . import placement as rendezvous
from . import ranges
from . import world
from .collective import Collectives
from .control import ControlTable
from .counters import PeerCounters
from .datapath import DataPath
from .engine import Engine
from .fetch import Fetcher
from .holdings import Holdings
from .liveness import LossListener, Liveness
from .order import WriteOrder
from .partner import Partners
from .placement import Placement
from .provide import Provide, Provider, ProvideRange
from .shutdown import Shutdown
from .tuning import HEARTBEAT_TIMEOUT

log = logging.getLogger(__name__)


class Cluster:
    """One node of the job. ``node`` is this node's rank, ``nodes`` the node count."""

    collective = True        # its nodes run collectives: capacities exchanged, node 0's walk streamed
    chunk_size = 4 << 20     # bytes per MPI message of a file
    window = 4               # chunk messages in flight per transfer, each direction
    finish_timeout = 600.0   # cap on finish() waiting for live but slow nodes
    close_timeout = 30.0     # close() after finish(): wait this long for node 0's goodbye

    def __init__(self, MPI: Any, comm: Any, peer_timeout: float = 10.0, datapath: DataPath | None = None,
                 writeback_comm: Any = None):
        self.MPI = MPI
        self.comm = comm
        self.node: int = comm.Get_rank()
        self.nodes: int = comm.Get_size()
        self.peer_timeout = peer_timeout            # a fetch waits this long for a slow owner
        self.heartbeat_timeout = HEARTBEAT_TIMEOUT  # a silent owner is down after this (slow ones answer pings)
        self.placement: Placement | None = None     # once use_placement(): owner() asks it, not rendezvous hashing
        self._closed = False
        self._engine = Engine(MPI, comm, self._on_ctrl, self._on_mpi_error)
        self._liveness = Liveness(MPI, comm, self._engine, self)
        self._lost = self._liveness.lost            # node -> {"node", "at", "why"} (the liveness part's own map)
        self._counters = PeerCounters(self._lost)
        self._collectives = Collectives(MPI, comm, self._engine, self._liveness)
        self.datapath = datapath                   # the C data path (from_world), when every node has it
        self._datapath_at_loss: dict[str, int] | None = None
        self._fetcher = Fetcher(self._engine, comm.Get_attr(MPI.TAG_UB) or 32767, self._liveness, self._counters,
                                self, self._reowned, datapath)
        self._provider = Provider(self._engine, self._counters, self)
        self._shutdown = Shutdown(self._engine, self._liveness, self._provider, self)
        self.write_order = WriteOrder(self._engine, self.node, self.nodes, self._liveness.is_lost)
        self.partners = Partners(self._engine, self.node, self.nodes, self._liveness.is_lost, writeback_comm)
        self.holdings = Holdings(self._engine, self.node, self.nodes, self._liveness.is_lost)
        self._control = ControlTable(self._liveness.heard, self._provider.handlers(), self._liveness.handlers(),
                                     self._shutdown.handlers(), self.write_order.handlers(), self.partners.handlers(),
                                     self.holdings.handlers())
        self._liveness.on_loss(self.partners.lost, "partner copies")  # (before the order's waits hear of it)
        self._liveness.on_loss(self.write_order.lost, "write order")
        # a lost node: the fetches waiting on it fail, the transfers to it stop, then the others hear of it
        self._liveness.on_loss(self._fetcher.on_lost, "fetches")
        self._liveness.on_loss(self._provider.on_lost, "serving")
        if datapath is not None:  # a lost node ends its fetches on the data path too
            self._liveness.on_loss(self._datapath_lost, "the data path")

    @classmethod
    def from_world(cls, peer_timeout: float = 10.0) -> Cluster:
        """The cluster of every rank of MPI_COMM_WORLD (collective: every rank must call it)."""
        MPI = world.load_mpi()
        comm = MPI.COMM_WORLD.Dup()      # our own tag space
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        # small staged files cross through the C data path first (collective: before any thread of ours runs)
        datapath = DataPath.start(MPI, comm)
        writeback = comm.Dup()           # the partner copies' bytes: a tag space of their own (partner.py)
        writeback.Set_errhandler(MPI.ERRORS_RETURN)
        return cls(MPI, comm, peer_timeout, datapath, writeback)

    def _datapath_lost(self, node: int, why: str) -> None:
        self.datapath.lost(node)
        if self._datapath_at_loss is None:  # what it moved after the first loss counts there too
            self._datapath_at_loss = self.datapath.counts()

    def on_loss(self, callback: LossListener) -> None:
        """Call ``callback(node, why)`` on the engine thread when a node is lost (for the rest
        of the job); several may listen, each is told in the order it registered."""
        self._liveness.on_loss(callback)

    # -- placement ---------------------------------------------------------------------
    def use_placement(self, placement: Placement) -> None:
        """From now on ``owner()`` asks ``placement`` (the same on every node: capacity.plan)."""
        self.placement = placement

    def owner(self, key: str) -> int:
        """The node that owns ``key``: the same answer on every node, nothing negotiated. Once
        nodes are lost, the next live node of the key's preference list (only the lost
        nodes' keys move)."""
        lost = self._lost
        if self.placement is not None:
            return self.placement.owner(key, lost) if lost else self.placement.owner(key)
        if not lost:
            return rendezvous.owner(key, self.nodes)
        live = [n for n in range(self.nodes) if n not in lost] or [self.node]
        return max(live, key=lambda n: (rendezvous.weight(key, n), -n))

    def ring(self) -> tuple[list[int], list[int]] | None:
        """The placement's ring (``Placement.ring``), from which ``owner`` answers while no node
        is lost; None when there is no placement or a node is lost."""
        return self.placement.ring() if self.placement is not None and not self._lost else None

    def range_owner(self, key: str, size: int, r: int) -> int:
        """The node that owns range ``r`` of large file ``key`` (``ranges.py``): its first owner,
        else, once that node is lost, a survivor (only the lost node's ranges move)."""
        return ranges.range_owner(key, size, r, self.nodes, self._lost)

    def first_owner(self, key: str) -> int:
        """The node that owns ``key`` while no node is lost."""
        return self.placement.owner(key) if self.placement is not None else rendezvous.owner(key, self.nodes)

    def _reowned(self, key: str) -> bool:
        """Was ``key``'s owner lost (so that a survivor owns it now)?"""
        return self.first_owner(key) in self._lost

    # -- collectives -------------------------------------------------------------------
    def share(self, take: Callable, timeout: float | None = None,
              on_files: Callable[[dict], None] | None = None) -> Any:
        """Collective: node 0 returns and broadcasts ``take()``; every node returns it.

        Waiting nodes poll (MPICH's blocking broadcast would spin a core for as long as
        node 0 walks the PFS). If ``take`` raises on node 0 it re-raises there and every
        other node raises PeerError. ``timeout`` (None: wait forever) bounds the wait.

        Streamed (``on_files`` given): node 0 calls ``take(publish)``, where ``publish(files)``
        (a dict key -> info, from the walking thread) sends the files walked so far to every
        node, at most every STREAM_EVERY seconds; each node's ``on_files(files)`` sees every
        file once, in walk order, before ``share`` returns, so staging starts with the walk.
        """
        return self._collectives.share(take, timeout, on_files)

    def bcast_bytes(self, payload: bytes | None, deadline: float | None) -> bytearray:
        """Collective: node 0's ``payload`` (bytes) on every node (a length, then the bytes)."""
        return self._collectives.bcast_bytes(payload, deadline)

    def bcast_into(self, buf: memoryview, deadline: float | None) -> None:
        """Collective: node 0's ``buf`` written into every other node's ``buf`` (the same length):
        node 0's index into the file each node maps, no copy in between. Polled like ``share``."""
        self._collectives.bcast_into(buf, deadline)

    def allgather_ints(self, values: list[int], timeout: float | None = None) -> list[list[int]]:
        """Collective: every node's ``values`` (the same count of 64-bit integers on each), indexed
        by node. Polled like ``share`` (no spinning core); PeerError after ``timeout``."""
        return self._collectives.allgather_ints(values, timeout)

    def allgather_bytes(self, payload: bytes, timeout: float | None = None) -> list[bytes]:
        """Collective: every node's ``payload`` (any length), indexed by node. PeerError after ``timeout``."""
        return self._collectives.allgather_bytes(payload, timeout)

    def is_lost(self, node: int) -> bool:
        return self._liveness.is_lost(node)

    # -- serving -----------------------------------------------------------------------
    def start(self, provide: Provide | None, serve_threads: int = 8,
              provide_range: ProvideRange | None = None) -> None:
        """Serve peers in the background, ``serve_threads`` ``provide`` calls at once;
        ``provide(key) -> local path | None``, ``provide_range(key, offset, length) -> path of
        a copy holding those bytes | None`` (see provide.py)."""
        if self._engine.running or self._closed:
            raise PeerError("Cluster.start(): already started or closed", FailureReason.FAILED)
        self._provider.start(provide, serve_threads, provide_range)
        world.track_engine(self._engine)
        self._engine.start()
        self._liveness.start()

    # -- fetching ----------------------------------------------------------------------
    def fetch(self, owner: int, key: str, dest: str | int, size: int | None = None) -> int:
        """Copy ``key`` from node ``owner`` into ``dest`` (a path, or a descriptor open for writing); return its size.
        ``size`` (the snapshot's) lets a small file take the C data path, when there is one.

        Raises PeerError (its ``reason`` a FailureReason) when the owner refuses, does not
        answer the header within ``peer_timeout`` (this includes the owner staging the
        file), stalls for ``peer_timeout`` between chunks, or is known to be down (then at once).
        """
        return self._fetcher.fetch(owner, key, dest, size)

    def fetch_range(self, owner: int, key: str, offset: int, length: int, fd: int,
                    timeout: float | None = None, version: tuple[int, int] | None = None) -> int:
        """Copy bytes [offset, offset + length) of large file ``key`` from node ``owner``'s staged
        blocks into descriptor ``fd`` at the same offset (the owner stages them first if need
        be); return the bytes written. PeerError as ``fetch`` (``timeout``: peer_timeout if None).
        ``version``: the file's (size, mtime_ns) in this node's snapshot: blocks the owner has
        staged of that version cross the C data path."""
        return self._fetcher.fetch_range(owner, key, offset, length, fd,
                                         self.peer_timeout if timeout is None else timeout, version)

    def range_bytes_served_in_c(self) -> int:
        """Bytes of large files' spans the C data path sent from here."""
        return self.datapath.counts()["served_range_bytes"] if self.datapath is not None else 0

    def offer_blocks(self, key: str, slot: int) -> None:
        """Large file ``key`` is staged by blocks in tier ``slot`` here (-1: no longer): the C data
        path answers spans of its staged blocks itself."""
        if self.datapath is not None:
            self.datapath.offer_blocks(key, slot)

    def counters(self) -> dict[str, Any]:
        """A copy of the transfer counters (failures by reason)."""
        out = self._counters.snapshot()
        if self.datapath is not None:  # what crossed through the C data path, each way
            dp = out["datapath"] = self.datapath.counts()
            at_loss = self._datapath_at_loss
            for way, files, nbytes in (("sent", "served_files", "served_bytes"),
                                       ("received", "fetched_files", "fetched_bytes")):
                out[f"files_{way}"] += dp[files]
                out[f"bytes_{way}"] += dp[nbytes]
                out[f"wire_bytes_{way}"] += dp[nbytes]
                if at_loss is not None:
                    out["after_loss"][f"files_{way}"] += dp[files] - at_loss[files]
                    out["after_loss"][f"bytes_{way}"] += dp[nbytes] - at_loss[nbytes]
            for way, spans, nbytes in (("sent", "served_ranges", "served_range_bytes"),
                                       ("received", "fetched_ranges", "fetched_range_bytes")):
                out[f"ranges_{way}"] += dp[spans]  # (their bytes in bytes_*, as Python's spans')
                out[f"bytes_{way}"] += dp[nbytes]
                out[f"wire_bytes_{way}"] += dp[nbytes]
        out["peers_down"] = sorted(self._liveness.down)
        out["lost"] = self.lost()
        return out

    def lost(self) -> list[dict]:
        """The nodes lost so far, each ``{"node", "at" (time.time()), "why"}``, by node."""
        return self._liveness.lost_list()

    # -- engine thread -------------------------------------------------------------------
    def _on_ctrl(self, src: int, msg: tuple) -> None:
        self._control.dispatch(src, msg)

    def _on_mpi_error(self, exc: Exception) -> None:
        self._liveness.on_mpi_error(exc)

    def _check_failed(self) -> None:
        """Lose every node MPI knows has failed (see liveness.py)."""
        self._liveness.check_failed()

    # -- shutdown ----------------------------------------------------------------------
    def finish(self, local_stats: Any, timeout: float | None = None) -> list[dict | None] | None:
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
        return self._shutdown.finish(local_stats, timeout)

    def close(self) -> None:
        """Stop serving and stop the MPI engine. MPI itself is finalised at exit (if no peer failed)."""
        if self._closed:
            return
        self._closed = True
        self._fetcher.close()
        self._shutdown.say_goodbye()
        if self._liveness.down:
            world.note_failure(f"nodes {sorted(self._liveness.down)} were not answering")
        self._provider.shutdown()
        if self.datapath is not None:
            self.datapath.stop()
        self._engine.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
