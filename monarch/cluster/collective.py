"""The few collectives of a job: node 0's snapshot to every node (``share``), every node's
capacities to every node (``allgather_ints``), node 0's index into every node's file
(``bcast_into``), and what each node keeps of earlier runs' writes
(``allgather_bytes``).

Each is a nonblocking MPI collective, polled (MPICH's blocking ones spin a core for as
long as node 0 walks the PFS), with a deadline, and given up on at once when a node is
lost (ULFM: the collective can then never complete; the caller fails open).
"""

from __future__ import annotations

import array
import pickle
import time
from typing import Any, Callable

from ..errors import FailureReason, PeerError
from .engine import Engine
from .liveness import Liveness
from .streamed import StreamedShare

BCAST_PIECE = 1 << 30  # bytes a broadcast sends at once (bcast_into)


class Collectives:
    """The collectives of one node (every node must make the same calls, in the same order)."""

    def __init__(self, MPI: Any, comm: Any, engine: Engine, liveness: Liveness):
        self.MPI = MPI
        self.comm = comm
        self.node = comm.Get_rank()
        self.nodes = comm.Get_size()
        self._engine = engine
        self._liveness = liveness

    def share(self, take: Callable, timeout: float | None = None,
              on_files: Callable[[dict], None] | None = None) -> Any:
        """See ``Cluster.share``."""
        if on_files is None:
            return self._share_whole(take, timeout)
        return StreamedShare(self, on_files, timeout).run(take)

    def _share_whole(self, take: Callable[[], Any], timeout: float | None) -> Any:
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
            raise PeerError(f"node 0 could not take the dataset snapshot: {value}", FailureReason.FAILED)
        return value

    def bcast_bytes(self, payload: bytes | None, deadline: float | None) -> bytearray:
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

    def bcast_into(self, buf: memoryview, deadline: float | None) -> None:
        """Collective: node 0's ``buf`` into every node's (each the same length, writable off node 0), in
        pieces of at most BCAST_PIECE bytes (an MPI count is an int)."""
        view = memoryview(buf).cast("B")
        for at in range(0, len(view), BCAST_PIECE):
            self._bcast(view[at:at + BCAST_PIECE], deadline)

    def allgather_ints(self, values: list[int], timeout: float | None = None) -> list[list[int]]:
        """See ``Cluster.allgather_ints``."""
        mine = array.array("q", values)
        out = array.array("q", bytes(8 * len(mine) * self.nodes))
        MPI, comm = self.MPI, self.comm
        req = self._engine.run(lambda: comm.Iallgather([mine, MPI.INT64_T], [out, MPI.INT64_T]))
        deadline = None if timeout is None else time.monotonic() + timeout
        self._poll(req, deadline, "allgather_ints(): not every node answered in time")
        n = len(mine)
        return [list(out[k * n:(k + 1) * n]) for k in range(self.nodes)]

    def allgather_bytes(self, payload: bytes, timeout: float | None = None) -> list[bytes]:
        """See ``Cluster.allgather_bytes``: the lengths, then the bytes (one Iallgatherv)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        sizes = [row[0] for row in self.allgather_ints([len(payload)], timeout)]
        offsets = [sum(sizes[:k]) for k in range(self.nodes)]
        out = bytearray(sum(sizes))
        MPI, comm, mine = self.MPI, self.comm, bytearray(payload)
        req = self._engine.run(lambda: comm.Iallgatherv([mine, MPI.BYTE], [out, sizes, offsets, MPI.BYTE]))
        self._poll(req, deadline, "allgather_bytes(): not every node answered in time")
        return [bytes(out[o:o + n]) for o, n in zip(offsets, sizes)]

    def _bcast(self, buf: bytearray | memoryview, deadline: float | None) -> None:
        MPI, comm = self.MPI, self.comm
        req = self._engine.run(lambda: comm.Ibcast([buf, MPI.BYTE], root=0))
        self._poll(req, deadline, "share(): node 0 did not send the dataset snapshot in time")

    def _poll(self, req: Any, deadline: float | None, late: str) -> None:
        """Wait for a nonblocking collective by polling; PeerError(``late``) past ``deadline``,
        or at once when a node is lost."""
        live = self._liveness
        pause = 1e-4
        check_at = time.monotonic() + 0.25
        what = late.partition(":")[0]
        while True:
            try:
                if self._engine.run(req.Test):
                    return
            except self.MPI.Exception as exc:
                self._engine.run(live.check_failed)
                raise PeerError(f"{what}: a node failed ({exc}); lost: {sorted(live.lost)}",
                                FailureReason.PEER_LOST) from exc
            now = time.monotonic()
            if now >= check_at:
                self._engine.run(live.check_failed)
                check_at = now + 0.25
                if live.lost:
                    raise PeerError(f"{what}: nodes {sorted(live.lost)} lost before every node took part",
                                    FailureReason.PEER_LOST)
            if deadline is not None and now > deadline:
                raise PeerError(late, FailureReason.TIMEOUT)
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
