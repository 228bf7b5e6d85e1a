"""The drains of every node of a job at once (``monarch drain`` under srun or mpiexec, one rank a
node): each rank drains its node's areas and tells the others how far each journal got, so that a
file ordered after another node's (W4) waits for that node's drain, not only its own node's order
(monarch/writeback/across.py decides what waits for what; this carries the messages over MPI).

Messages, on a communicator of their own, tag ``TAG``: ``("p", (run, node), applied, failed, done)``
a journal's progress; ``("bye",)`` this rank's drains ended (a rank returns from ``finish`` once it
has every other rank's); ``close`` returns once every rank has said its results.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from monarch.writeback.across import Exchange, Key

from .world import load_mpi

TAG = 7
POLL = 0.005  # seconds between looks for a message: a drain moves at the PFS's pace, milliseconds a file


class MpiExchange(Exchange):
    """The other ranks of MPI_COMM_WORLD, each draining its own node."""

    def __init__(self) -> None:
        MPI = load_mpi()
        self._MPI = MPI
        self._comm = MPI.COMM_WORLD.Dup()
        self.rank, self.size = self._comm.Get_rank(), self._comm.Get_size()
        self._sends: list = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def allgather(self, obj: Any) -> list[Any]:
        return self._comm.allgather(obj)

    def start(self, heard: Callable[[Key, int, bool, bool], None]) -> None:
        self._thread = threading.Thread(target=self._receive, args=(heard,), name="monarch-drain-exchange",
                                        daemon=True)
        self._thread.start()

    def _receive(self, heard: Callable[[Key, int, bool, bool], None]) -> None:
        byes, status = 0, self._MPI.Status()
        while byes < self.size - 1:
            if not self._comm.Iprobe(source=self._MPI.ANY_SOURCE, tag=TAG, status=status):
                time.sleep(POLL)
                continue
            msg = self._comm.recv(source=status.Get_source(), tag=TAG)
            if msg[0] == "bye":
                byes += 1
            else:
                _, key, applied, failed, done = msg
                heard(tuple(key), applied, failed, done)

    def _send_all(self, msg: tuple) -> None:
        with self._lock:
            self._sends += [self._comm.isend(msg, r, TAG) for r in range(self.size) if r != self.rank]

    def tell(self, key: Key, applied: int, failed: bool, done: bool) -> None:
        self._send_all(("p", key, applied, failed, done))

    def finish(self) -> None:
        self._send_all(("bye",))
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._MPI.Request.Waitall(self._sends)
            self._sends = []

    def close(self) -> None:
        self._comm.Barrier()
        self._comm.Free()
