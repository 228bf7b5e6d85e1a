"""What the job tells its node's daemon besides OPEN: its writes (INVALIDATE) and its read order (HINT).

Both may come while the snapshot is still being walked: the gate keeps them, and the daemon
hands them back, in order, once the snapshot and stager are ready (``drop_copies`` for the
writes, ``apply_hint`` for the hints); later ones act at once, on what serves now.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from array import array
from typing import Any, Callable, Iterable

from monarch import protocol
from monarch.node.stage.current import Current
from monarch.node.outcomes import Outcome
from monarch.node.snapshot.snapshot import Snapshot
from monarch.node.stage.stager import Stager

log = logging.getLogger(__name__)


class JobNotices:
    """``owns(key)``: is the key this node's (hints name only this node's files to its
    stager); ``count(outcome)``: each notice is counted beside the answers."""

    def __init__(self, current: Current, owns: Callable[[str], bool], count: Callable[[Outcome], None],
                 peer: bool = False):
        """``peer``: a cluster's node that fetches ahead (``peer.fetch_ahead``), whose hints also
        go to ``attach_peer`` once it comes."""
        self._peer = peer
        self._current = current
        self._owns = owns
        self._count = count
        self._lock = threading.Lock()
        self._meta_off_logged: set[str] = set()
        self._link_targets: dict[str, list[str]] | None = None  # see _links_into
        # a sharded node's peer read-ahead (the daemon's: the whole order, other nodes' files
        # fetched ahead by the front door's lane), or None: hints steer only the stager
        self.peer_hint: Callable[[int, int, Any], None] | None = None
        self._peer_pending: list[tuple] | None = [] if peer else None  # until it comes: the last order on
        # per stream: its order's length so far, and the positions in it of this node's own keys
        # (the stager's order holds only those: a reader's progress counts the whole order's)
        self._order_len: dict[int, int] = {}
        self._own_at: dict[int, array] = {}
        # an order and a progress the door answered itself (take_told) reach the stager one at a
        # time: a progress of the last order taken before a new one is never applied after it
        self._order_lock = threading.Lock()
        self._told_counted = 0  # progress requests the door answered itself, counted so far

    def attach_peer(self, hint: Callable[[int, int, Any], None]) -> bool:
        """From now on the whole order of each hint also goes to ``hint`` (after those so far), on a
        node that fetches ahead (else nothing). Returns True."""
        if not self._peer:
            return True
        with self._lock:
            pending, self._peer_pending = self._peer_pending or [], None
            self.peer_hint = hint
        for op, stream, keys in pending:
            try:
                hint(op, stream, keys)
            except Exception:  # fail open: the opens fetch as they come
                log.exception("the peer read-ahead did not take a hint")
        return True

    def invalidate(self, key: str) -> None:
        """The job writes to ``key`` (file or directory): its copies on this node go now. The
        shim has already turned the metadata of its root off (EXTRA_META_OFF): say so once.
        During the walk nothing is served yet: the key is dropped when the stager is made,
        before any copy of it could be served (the daemon's ``_prepare``)."""
        root = key.partition("/")[0]
        with self._lock:
            first = root not in self._meta_off_logged
            self._meta_off_logged.add(root)
        if first:
            log.info("root %s: stat and listings go to the PFS from now on (the job changed %s)", root, key)
        if not self._current.gate.hold_write(key):
            with self._current.gate.lock:
                stager, snap = self._current.stager, self._current.snapshot
            self.drop_copies(stager, snap, key)
        self._count(Outcome.INVALIDATED)

    def drop_copies(self, stager: Stager, snap: Snapshot, key: str) -> None:
        """``key``'s copies go, and those of the links into it (they hold its old bytes)."""
        stager.invalidate(key)
        for link in self._links_into(snap, key):
            stager.invalidate(link)

    def _links_into(self, snap: Snapshot, key: str) -> list[str]:
        """The keys of symlinked files whose target is ``key`` or lies under it (a link is
        staged under its own name with its target's bytes). The targets are resolved once,
        at the job's first write under a root."""
        if self._link_targets is None:
            targets: dict[str, list[str]] = {}
            for k, info in snap.files.items():
                if info.link:
                    targets.setdefault(os.path.realpath(snap.source_path(k)), []).append(k)
            self._link_targets = targets
        if not self._link_targets:
            return []
        path = os.path.realpath(snap.source_path(key))
        return [k for target, keys in self._link_targets.items()
                if target == path or target.startswith(path + "/") for k in keys]

    def hint(self, body: bytes) -> None:
        """An order hint from ``monarch.hints`` (protocol.py, HINT); ProtocolError if malformed.
        During the walk it is kept, and applied in order once the snapshot is ready."""
        hint = protocol.decode_hint(body)
        if not self._current.gate.hold_hint(hint):
            self.apply_hint(*hint)
        self._count(Outcome.HINTS)

    def apply_hint(self, op: int, stream: int, keys: Iterable[str] | int) -> None:
        """This node's own files go to its stager; the whole order to ``peer_hint`` (the
        other nodes' files fetched ahead of the reader), if there is one."""
        if keys is not None and not isinstance(keys, int):
            keys = list(keys)
        if op == protocol.HINT_PROGRESS:
            self._apply_hint(op, stream, keys)
            return
        with self._order_lock:
            self._apply_hint(op, stream, keys)

    def take_told(self, take: Callable[[], tuple[tuple[int, int] | None, int]]) -> int:
        """The last progress the reader told the front door itself (``take``: the peer link's
        ``told``; the lane has it already) to the stager. Returns how many progress requests the
        door answered since the last call."""
        with self._order_lock:
            told, frames = take()
            if told is not None:
                stream, consumed = told
                self._current.stager.hint_progress(stream, self._own_consumed(stream, consumed))
            new, self._told_counted = frames - self._told_counted, frames
        return new

    def _apply_hint(self, op: int, stream: int, keys) -> None:
        with self._lock:
            peer_hint, pending = self.peer_hint, self._peer_pending
            if pending is not None:  # kept for the lane: the last order (its stream's hints) on
                if op == protocol.HINT_ORDER:
                    pending.clear()
                if op == protocol.HINT_PROGRESS and pending and pending[-1][:2] == (op, stream):
                    pending[-1] = (op, stream, keys)  # the last progress is all that counts
                else:
                    pending.append((op, stream, keys))
        if peer_hint is not None:
            try:
                peer_hint(op, stream, keys)
            except Exception:  # fail open: the opens fetch as they come
                log.exception("the peer read-ahead did not take a hint")
        if op == protocol.HINT_ORDER or op == protocol.HINT_MORE:
            self._current.stager.hint_order(stream, self._own_keys(op, stream, keys), begin=op == protocol.HINT_ORDER)
        elif op == protocol.HINT_PROGRESS:
            self._current.stager.hint_progress(stream, self._own_consumed(stream, keys))
        else:
            with self._lock:
                self._order_len.pop(stream, None)
                self._own_at.pop(stream, None)
            self._current.stager.hint_end(stream)

    def _own_keys(self, op: int, stream: int, keys: list[str]) -> list[str]:
        """This node's keys of an order (or of more of it), their positions in it kept."""
        owns = self._owns
        with self._lock:
            if op == protocol.HINT_ORDER or stream not in self._own_at:
                self._order_len[stream], self._own_at[stream] = 0, array("I")
            base, at = self._order_len[stream], self._own_at[stream]
            own = []
            for i, k in enumerate(keys):
                if owns(k):
                    own.append(k)
                    at.append(base + i)
            self._order_len[stream] = base + len(keys)
        return own

    def _own_consumed(self, stream: int, consumed: int) -> int:
        """The reader is done with ``consumed`` positions of its whole order: how many of them
        are this node's own keys (positions in the stager's order)."""
        with self._lock:
            at = self._own_at.get(stream)
            return consumed if at is None else bisect.bisect_left(at, consumed)
