"""The shim's question, answered: where to open a key (a tier's copy, a decoded or inflated
copy, or the PFS), staging it first when it must, never blocking the event loop."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from typing import TYPE_CHECKING, Callable

from monarch import protocol
from monarch.config.model import StagingConfig
from monarch.node.tiers.codecs import sealed_memfd
from monarch.node.stage.current import Current
from monarch.node.snapshot.gate import SnapshotState
from monarch.node.outcomes import Outcome, already, copied
from monarch.node.tiers.tiers import Tier
from monarch.routes import Route

if TYPE_CHECKING:
    from monarch.node.peer.cluster_role import ClusterRole

log = logging.getLogger(__name__)

PFS = (protocol.SLOT_PFS, "")
Done = Callable[[tuple[int, object], Outcome], None]


def _already(tier: Tier) -> Outcome:
    return already(tier.slot == protocol.SLOT_PEER)


def _tier_of(key: str, future: concurrent.futures.Future) -> tuple[Tier | None, Outcome]:
    """The tier and outcome of a finished staging future (None: read the PFS)."""
    if future.cancelled():
        return None, Outcome.PFS_SHUTTING_DOWN
    try:
        tier = future.result()
    except Exception:  # a bug must not fail the app: it reads the PFS
        log.exception("staging %s", key)
        return None, Outcome.PFS_ERROR
    if tier is None:
        return None, Outcome.PFS_NOT_STAGED
    return tier, copied(tier.slot == protocol.SLOT_PEER)


INFLATE_THREADS = 4  # opens of compressed copies decompressed at once (zstd releases the GIL)


class Resolver:
    """Answers OPEN from what serves now (``current``: the snapshot and stager, which the
    daemon swaps when the walk ends, so they are read through it at every call); in a
    sharded cluster, other nodes' files through the cluster role's peer cache. Each answer's
    outcome is counted by ``count``."""

    def __init__(self, current: Current, staging: StagingConfig, count: Callable[[Outcome], None],
                 cluster: "ClusterRole | None" = None, *, copies_misses: bool):
        """``copies_misses``: a miss is staged at once, else answered PFS (the read-ahead's
        table: ``monarch/node/stage/read_ahead_modes.py``)."""
        self._current = current
        self._staging = staging
        self._copies_misses = copies_misses
        self._count = count
        self._cluster = cluster
        self._lock = threading.Lock()
        self._validated: set[str] = set()  # staging.validate: open — keys checked against the PFS
        self._checks = None  # staging.validate: open — a few threads stat the PFS off the event loop
        self._inflater = None  # threads that decompress compressed copies into memfds
        self.inflated_bytes = 0

    def _no_snapshot(self) -> Outcome | None:
        """Why no copy can be served for lack of a snapshot (the server holds OPENs during the
        walk, so WALKING is seen here only by a caller that did not wait), or None when ready."""
        state = self._current.gate.state
        if state is SnapshotState.READY:
            return None
        return Outcome.PFS_NO_SNAPSHOT if state is SnapshotState.FAILED else Outcome.PFS_SNAPSHOT_NOT_READY

    def resolve_now(self, key: str) -> tuple[int, str] | None:
        """The answer when it needs no waiting (the event loop answers these itself), else None."""
        if (why := self._no_snapshot()) is not None:
            answer, outcome = PFS, why
        elif key not in self._current.snapshot.files:  # a membership test: no record built
            answer, outcome = PFS, Outcome.PFS_NOT_IN_SNAPSHOT
        elif self._staging.validate == "open" and key not in self._validated:
            return None
        elif (tier := self._current.stager.where(key)) is None:
            return None
        elif not tier.is_compressed(key):
            answer, outcome = (tier.slot, tier.path_for(key)), _already(tier)
        elif tier.decoded is not None and (path := tier.decoded.answer(key)) is not None:
            # decoded before and kept as <tier>/<key>: the shim opens it (it asked without probing)
            answer, outcome = (tier.slot, path), _already(tier).served("decoded")
        else:
            return None
        self._count(outcome)
        return answer

    def resolve_async(self, key: str, done: Done) -> None:
        """Find where the shim should open ``key`` without blocking the caller:
        ``done(answer, outcome)`` is called once, on this thread if the answer is known,
        else on a staging thread. The caller counts the outcome when it uses it."""
        info = self._current.snapshot.get(key)
        if (why := self._no_snapshot()) is not None:
            done(PFS, why)
        elif info is None:  # named by the walk's listing and no longer a file when described: changed since
            done(PFS, Outcome.PFS_CHANGED_SINCE_SNAPSHOT if key in self._current.snapshot.files
                 else Outcome.PFS_NOT_IN_SNAPSHOT)
        elif self._staging.validate == "open" and key not in self._validated:
            if self._checks is None:
                with self._lock:
                    if self._checks is None:
                        self._checks = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="monarch-check")
            self._checks.submit(self._checked_then_resolve, key, info, done)
        else:
            self._resolve_staged(key, done)

    def _checked_then_resolve(self, key: str, info, done) -> None:
        if self._still_same(key, info):
            self._resolve_staged(key, done)
        else:
            done(PFS, Outcome.PFS_CHANGED_SINCE_SNAPSHOT)

    def _resolve_staged(self, key: str, done: Done) -> None:
        if self._cluster is not None and (remote := self._cluster.remote(key)) is not None:
            remote.resolve(key, done)  # sharded: from its owner, never the PFS here
            return
        stager = self._current.stager
        tier = stager.where(key)
        if tier is not None:
            self._answer_from(key, tier, _already(tier), done)
        elif not self._copies_misses:
            done(PFS, Outcome.PFS_POLICY_OFF)
        elif stager.route(key, self._current.snapshot.get(key)) is Route.BLOCKS \
                and not stager.blocks.closed and (answer := stager.blocks.answer(key)):
            done(answer, Outcome.BY_BLOCKS)  # at once: the shim reads the PFS until its blocks are here
        else:
            stager.ensure(key, inline=True).add_done_callback(lambda f: self._answer_from(key, *_tier_of(key, f), done))

    def _answer_from(self, key: str, tier: Tier | None, outcome: Outcome, done: Done) -> None:
        """Answer with ``tier``'s copy: its path; for a compressed copy the path of its kept
        decoded file, else a sealed memfd (decompressed on the inflate threads, never on
        the event loop); PFS if none."""
        if tier is None:
            done(PFS, outcome)
        elif not tier.is_compressed(key):
            done((tier.slot, tier.path_for(key)), outcome)
        elif tier.decoded is not None and (path := tier.decoded.answer(key)) is not None:
            done((tier.slot, path), outcome.served("decoded"))
        else:
            if self._inflater is None:
                with self._lock:
                    if self._inflater is None:
                        self._inflater = concurrent.futures.ThreadPoolExecutor(
                            INFLATE_THREADS, thread_name_prefix="monarch-inflate")
            try:
                self._inflater.submit(self._inflate, key, tier, outcome, done)
            except RuntimeError:  # shutting down
                done(PFS, Outcome.PFS_SHUTTING_DOWN)

    def _inflate(self, key: str, tier: Tier, outcome: Outcome, done: Done) -> None:
        """Decode ``key``'s compressed copy, answer with a sealed memfd of it, then keep the
        decoded bytes as ``<tier>/<key>`` (``Tier.decoded``, within its budget) so that the
        next open of the key, in any process, is the shim's native tier hit."""
        kept = tier.decoded
        if kept is not None and (path := kept.answer(key)) is not None:  # decoded meanwhile
            done((tier.slot, path), outcome.served("decoded"))
            return
        token = kept.token() if kept is not None else 0  # before the frame is read: see DecodedFiles.drop
        if self._current.stager.where(key) is not tier:  # dropped before the token was taken (never decode old bytes)
            done(PFS, Outcome.PFS_DROPPED)
            return
        info = self._current.snapshot.files[key]
        try:
            data = tier.codec.decode(tier.compressed_path_for(key), info.size)
            fd = sealed_memfd(data, os.path.basename(key))
        except Exception as e:  # a lost or corrupt copy must not fail the app: it reads the PFS
            log.warning("decompressing the copy of %s in tier %s failed: %s; the application reads the PFS",
                        key, tier.name, e)
            done(PFS, Outcome.PFS_INFLATE_ERROR)
            return
        with self._lock:
            self.inflated_bytes += info.size
        done((tier.slot | protocol.ANSWER_FD, fd), outcome.served("inflated"))
        if kept is not None:
            kept.put(key, data, info, token)

    def _still_same(self, key: str, info) -> bool:
        """staging.validate: open — the first open of a file in the job compares the PFS's
        size and mtime with the snapshot; a changed file is never served from a copy."""
        try:
            same = info.same_content_as(os.stat(self._current.snapshot.source_path(key)))
        except OSError:
            same = False
        if same:
            with self._lock:
                self._validated.add(key)
        else:
            self._current.stager.mark_changed(key)
        return same

    def close(self) -> None:
        if self._checks is not None:
            self._checks.shutdown(wait=False, cancel_futures=True)
        if self._inflater is not None:
            self._inflater.shutdown(wait=True, cancel_futures=True)
