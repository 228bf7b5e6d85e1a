"""The order of a job's write-back across its nodes (docs/consistency.md, "Write-back", W4).

Each node's journal numbers its write-back operations; ``made`` is the number of the last one
recorded, ``applied`` the last one on the PFS. When a process opens a write-back file on node B,
B asks every other node for its ``made`` (``counts``): the file is published only once every
node has applied up to those numbers (``wait_applied``). A file closed before the open (on any
node: the job ordered the two with a barrier) is then on the PFS before it. Waits only point at
operations recorded before the open, which come before the waiting file's own close: no cycle.

Control messages (control.py):

  ``("wb-ask", tag)``                        what have you made and applied? (any thread asks)
  ``("wb-told", tag, made, applied, failed)``  the answer
  ``("wb-applied", applied, failed)``        my drain moved (to every node, as it moves)

``failed``: the node's drain stopped at a refused operation: what waits on operations past its
``applied`` waits in vain, and is told so. So does what waits on a lost node's operations past the
last ``applied`` it was heard to have: a file ordered after a file the PFS may never get is kept,
not published (never torn: a commit file never names a shard that is not there), said by the
waiting node's run (exit 3, the files named) and its report.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable, Mapping

from monarch.writeback.across import UNKNOWN  # a lost node's count, unanswered: whatever it had made

from .control import Handler, Verb, message
from .engine import Engine

log = logging.getLogger(__name__)

ASK_TIMEOUT = 60.0  # a node that neither answers nor is lost by then: the open goes on, said


class OrderFailed(Exception):
    """A node's drain was refused before an operation this file waits for."""


class WriteOrder:
    """This node's part in the write-back's order across the nodes."""

    def __init__(self, engine: Engine, node: int, nodes: int, is_lost: Callable[[int], bool]):
        self.engine, self.node, self.nodes, self._is_lost = engine, node, nodes, is_lost
        self._made: Callable[[], int] = lambda: 0      # this node's journal (0: no write-back here)
        self._applied: Callable[[], tuple[int, bool]] = lambda: (0, False)
        self._remember: Callable[[int, int], None] = lambda node, applied: None
        self._cond = threading.Condition()
        self._tags = itertools.count(1)
        self._answers: dict[int, dict[int, int]] = {}       # tag -> node -> made
        self._progress: dict[int, tuple[int, bool]] = {}    # node -> (applied, failed), the latest heard
        self._lost_said: set[int] = set()
        self.partners = None  # partner.Partners, under fsync: partner: a lost node's files come from its partner

    def handlers(self) -> Mapping[Verb, Handler]:
        return {Verb.WB_ASK: self._on_ask, Verb.WB_TOLD: self._on_told, Verb.WB_APPLIED: self._on_applied}

    def use_partners(self, partners) -> None:
        """Under fsync ``partner``: a lost node's operations are waited for from its partner (partner.py)."""
        self.partners = partners

    def serve(self, made: Callable[[], int], applied: Callable[[], tuple[int, bool]],
              remember: Callable[[int, int], None] | None = None) -> None:
        """This node's write-back: its journal's ``made()`` and its drain's ``applied()``;
        ``remember(node, applied)``: another node's progress heard, kept where a later drain finds it."""
        self._made, self._applied = made, applied
        self._remember = remember or self._remember

    def _others(self) -> list[int]:
        return [k for k in range(self.nodes) if k != self.node and not self._is_lost(k)]

    # -- any thread ----------------------------------------------------------------------------
    def counts(self, timeout: float = ASK_TIMEOUT) -> dict[int, int]:
        """Every other node's ``made`` now (a round trip to each): what a file opened now waits
        for. A lost node's is UNKNOWN (it may have closed a file the job ordered before this one,
        and the PFS may never get it: such a file is kept, wait_applied). A live node that does not
        answer in ``timeout`` is left out, said."""
        lost = {k: UNKNOWN for k in range(self.nodes) if k != self.node and self._is_lost(k)}
        others = self._others()
        if not others:
            return lost
        tag = next(self._tags)
        with self._cond:
            self._answers[tag] = {}
        self.engine.call(lambda: [self.engine.send_obj(message(Verb.WB_ASK, tag), k) for k in others])
        deadline = time.monotonic() + timeout
        with self._cond:
            try:
                while True:
                    got = self._answers[tag]
                    missing = [k for k in others if k not in got and not self._is_lost(k)]
                    if not missing:
                        return {**lost, **{k: UNKNOWN for k in others if k not in got}, **got}
                    left = deadline - time.monotonic()
                    if left <= 0:
                        log.warning("write-back: nodes %s did not say what they had written within %gs: a file "
                                    "opened now is not ordered after theirs", missing, timeout)
                        return {**lost, **{k: UNKNOWN for k in others if k not in got and self._is_lost(k)}, **got}
                    self._cond.wait(min(left, 0.25))
            finally:
                del self._answers[tag]

    def wait_applied(self, needs: Mapping[int, int], stop: Callable[[], bool] = lambda: False) -> None:
        """Return once every node in ``needs`` applied up to its number (or is lost); raise
        OrderFailed when one's drain stopped short of it. Asks again now and then: a progress
        message that crossed a restart is not waited for forever."""
        asked = 0.0
        while True:
            waiting = []
            with self._cond:
                for k, n in needs.items():
                    applied, failed = self._applied() if k == self.node else self._progress.get(k, (0, False))
                    if applied >= n:
                        continue
                    if self._is_lost(k) and self.partners is not None and self.partners.partner_alive(k):
                        held = self.partners.replayed(k)  # its partner publishes what it held of k's
                        if held is None or not (held[0] >= n or held[1] or held[2]):
                            waiting.append(k)
                            continue
                        if held[0] >= n or (n >= UNKNOWN and held[2] and not held[1]):
                            continue
                        raise OrderFailed(f"node {k} was lost, and its partner could not publish its write-back "
                                          f"operation {'(any)' if n >= UNKNOWN else n} (it stopped at {held[0]}); "
                                          f"this file, ordered after it, is kept unpublished")
                    if self._is_lost(k):
                        if k not in self._lost_said:
                            self._lost_said.add(k)
                            log.error("write-back: node %d is lost before publishing all it had written: files "
                                      "ordered after it are kept, not published", k)
                        what = "what it had written" if n >= UNKNOWN else f"its write-back operation {n}"
                        raise OrderFailed(f"node {k} was lost before {what} reached the PFS (it had published up "
                                          f"to {applied}); this file, ordered after it, is kept unpublished so that "
                                          f"the PFS never holds it without what came before it")
                    if failed:
                        raise OrderFailed(f"node {k} could not publish its write-back operation {n} "
                                          f"(it stopped at {applied}), which this file is ordered after")
                    waiting.append(k)
                if not waiting:
                    return
                if stop():
                    return
                if time.monotonic() - asked < 1.0:
                    self._cond.wait(0.25)
                    continue
            asked = time.monotonic()
            self.engine.call(lambda w=tuple(k for k in waiting if not self._is_lost(k)):
                             [self.engine.send_obj(message(Verb.WB_ASK, 0), k) for k in w])

    def moved(self) -> None:
        """This node's drain moved: every other node hears its ``applied`` (the waits elsewhere)."""
        applied, failed = self._applied()
        others = self._others()
        with self._cond:
            self._cond.notify_all()  # (a wait on this node's own operations: a lost node's, published here)
        self.engine.call(lambda: [self.engine.send_obj(message(Verb.WB_APPLIED, applied, failed), k)
                                  for k in others])

    # -- engine thread -------------------------------------------------------------------------
    def _on_ask(self, src: int, tag: int) -> None:
        applied, failed = self._applied()
        self.engine.send_obj(message(Verb.WB_TOLD, tag, self._made(), applied, failed), src)

    def _on_told(self, src: int, tag: int, made: int, applied: int, failed: bool) -> None:
        with self._cond:
            if tag in self._answers:
                self._answers[tag][src] = made
            self._heard_progress(src, applied, failed)
            self._cond.notify_all()

    def _on_applied(self, src: int, applied: int, failed: bool) -> None:
        with self._cond:
            self._heard_progress(src, applied, failed)
            self._cond.notify_all()

    def _heard_progress(self, src: int, applied: int, failed: bool) -> None:
        old, _ = self._progress.get(src, (0, False))
        self._progress[src] = (max(old, applied), failed)
        if applied > old:
            self._remember(src, applied)

    def lost(self, node: int, why: str) -> None:
        """A node was lost (engine thread): nothing waits on it any more."""
        with self._cond:
            self._cond.notify_all()

