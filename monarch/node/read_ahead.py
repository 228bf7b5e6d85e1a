"""This node's read-ahead: its facts, the row of the table they pick
(``monarch/node/stage/read_ahead_modes.py``), and its lanes started once the snapshot is ready.

Alone on a node, the front door's C lane copies the small files and the stager the large
ones (or the stager all, when the door cannot copy). In a sharded cluster with the C data
path, the peer lane starts it: the door copies this node's own files, and learns which they
are from that lane. Elsewhere in a cluster, the stager reads this node's own files first.
Nothing here can make the snapshot fail: a failure only costs the read-ahead (files are then
staged as they are opened).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from monarch.node.doorkeeper.door_link import DoorKeeper
from monarch.node.doorkeeper.entry_owners import EntryOwners
from monarch.node.doorkeeper.peer_door_link import PeerDoorLink
from monarch.node.notices import JobNotices
from monarch.node.peer.cluster_role import ClusterRole
from monarch.node.snapshot.key_order import in_order, spread_over
from monarch.node.stage.current import Current
from monarch.node.stage.read_ahead_modes import Lanes, Order, Where, decide
from monarch.node.tiers import shared_tier
from monarch.node.tiers.tiers import Tier

log = logging.getLogger(__name__)


class ReadAhead:
    """Who reads ahead on this node, asked of the table with the node's facts as they are now
    (the layout is decided once the walk ends; the door may start after it), and the lanes
    it names started. ``door()``: the front door's keeper (None without a door); ``open_door``
    lets it answer (once the index is written); ``absorb`` books what it copied."""

    def __init__(self, policy: str, current: Current, tiers: list[Tier], role: ClusterRole | None, stores: bool,
                 notices: JobNotices, counters_path: str, door: Callable[[], DoorKeeper | None],
                 open_door: Callable[[], None], absorb: Callable[[], None]):
        self._policy = policy
        self._current = current
        self._tiers = tiers
        self._role = role
        self._stores = stores
        self._notices = notices
        self._counters_path = counters_path
        self._door = door
        self._open_door = open_door
        self._absorb = absorb
        if self.lanes().codec_sample:  # the read-ahead names the codecs' sample (_sample_for_codecs)
            for tier in tiers:
                if tier.codec is not None:
                    tier.codec.defer_sample()

    def lanes(self, where: Where | None = None) -> Lanes:
        """The table's answer for this node now (``where``: as it stands, unless given: the
        walk's questions are asked as ``WALKING``)."""
        role = self._role
        if where is None:
            where = Where.ALONE if role is None else role.where()
        return decide(self._policy, where, c_data_path=role is not None and role.cluster.datapath is not None,
                      collective=role is not None and role.cluster.collective, door=self._door() is not None,
                      stores=self._stores, kept=any(t.keep for t in self._tiers),
                      compressed=any(t.codec is not None for t in self._tiers))

    def streams(self) -> bool:
        """May the read-ahead start on the walk's files as it finds them? (Its copies are not
        served before the index exists: the shim waits for it.)"""
        return self.lanes(Where.ALONE if self._role is None else Where.WALKING).streams

    def walk_to_door(self) -> bool:
        """Does the shared walk leave the small files of its first seconds to the door's lane?"""
        return self.lanes(Where.WALKING).walk_to_door

    def describes_as_it_copies(self) -> bool:
        """Does the front door's lane read ahead here, describing each file from the descriptor it
        copies from (on a sharded node too, where the peer lane starts it: the other nodes' files are
        described from their owners)? Else the stager does, and a listing walk's files are described
        in one pass first (8 threads in C: the stager would stat them one at a time, under its lock)."""
        lanes = self.lanes()
        return lanes.reads_ahead and lanes.door_lane and not lanes.codec_sample and self.door_may_copy()

    def door_may_copy(self) -> bool:
        """May the door copy files from the PFS (asked by the door at each link)? As the table
        says, and with shared tiers only while this job is alone there."""
        return self.lanes().door_copies and shared_tier.door_may_copy(self._tiers, self._door)

    # -- started ---------------------------------------------------------------------------------
    def start(self) -> None:
        """The snapshot is ready: serve peers, then read ahead in the lanes the table names."""
        lanes = self.lanes()
        opened = False
        if self._role is not None:
            self._role.start()
            opened = self._open_peer_lane(lanes)
        if lanes.reads_ahead and not (opened and lanes.after_peer_lane):  # else the lane's thread starts it
            if not (self._door_lane_here(lanes) and self._in_door(lanes)):
                self._in_stager(lanes)

    def door_started(self) -> None:
        """A door started after the snapshot was ready: its lane takes the small files the
        stager has not taken yet (where the door's lane is started here, not by a peer lane)."""
        if self._current.ready and self._door_lane_here(lanes := self.lanes()):
            self._in_door(lanes)

    @staticmethod
    def _door_lane_here(lanes: Lanes) -> bool:
        """Is the door's lane started here? Not where the peer lane starts it: without that
        lane the door does not know which files are this node's (the stager reads ahead)."""
        return lanes.door_lane and not lanes.after_peer_lane

    def _open_peer_lane(self, lanes: Lanes) -> bool:
        """Sharded with the C data path: the front door fetches other nodes' files itself, and
        copies this node's own, once it knows who owns each (a pass over the snapshot, off this
        thread); then, where the table says so, the read-ahead starts (the door's lane copies
        the own small files). False if there is no such lane (the caller starts the read-ahead)."""
        role, keeper, snap = self._role, self._door(), self._current.snapshot
        if keeper is None or role.peer_cache is None or role.peer_area is None or role.cluster.datapath is None:
            return False

        def link() -> None:
            try:
                dp, owners = role.cluster.datapath, EntryOwners.of(snap.files, role.cluster, role.node)
                keeper.use_peer_link(lane := PeerDoorLink(keeper.front_door, role.peer_cache, dp, owners, role.node,
                                                          role.cluster.heartbeat_timeout, snap.files,
                                                          self._counters_path),
                                     lambda: self._notices.take_told(lane.told))
                linked = self._notices.attach_peer(lane.hint)  # hinted orders' other nodes' files fetched ahead too
            except Exception:
                log.exception("the front door's peer lane did not start: other nodes' files come through Python")
                linked = False
            try:
                if lanes.after_peer_lane and not (linked and lanes.door_lane and self._in_door(lanes)):
                    self._in_stager(lanes)
            except Exception:
                log.exception("starting the read-ahead failed; files are staged as they are opened")
        threading.Thread(target=link, name="monarch-peer-lane", daemon=True).start()
        return True


    def _in_door(self, lanes: Lanes) -> bool:
        """A raw first tier the door copies into: the front door's C lane copies the small files
        (a sharded node's own), the stager the large ones (DoorKeeper.read_ahead), then the
        second copies (peer.replicas: 2). False if the stager reads ahead alone."""
        keeper = self._door()
        if keeper is None:
            return False
        self._open_door()  # the index is written and the gate ready (the server opens it too, a moment later)
        sample = self._sample_for_codecs if lanes.codec_sample else None
        gate = self._current.gate
        files = self._current.snapshot.files
        if not keeper.read_ahead(files, self._current.stager, sample, lambda: gate.closing,
                                 self._absorb, iter if lanes.stager is Order.ALL else self._role.read_ahead_order):
            return False
        if lanes.stager is not Order.ALL:
            self._role.keep_replicas(self._current.stager, lambda: in_order(files))
        return True

    def _in_stager(self, lanes: Lanes) -> None:
        """The stager reads ahead alone: every file (a cluster node's own first, or only), then
        the second copies (peer.replicas: 2)."""
        keys = in_order(self._current.snapshot.files)
        if lanes.codec_sample:
            self._sample_for_codecs()
        if lanes.stager is Order.ALL:
            self._current.stager.read_ahead(keys)
        else:
            self._current.stager.read_ahead(self._role.read_ahead_order(keys))
            self._role.keep_replicas(self._current.stager, lambda: keys)

    def _sample_for_codecs(self) -> None:
        """Compressing tiers choose their level on files spread over this node's share of the
        dataset, staged ahead of the rest of the read-ahead: the walk's first files are one
        directory's, which may compress unlike the others (docs/compression.md)."""
        codecs = [t.codec for t in self._tiers if t.codec is not None]
        if not codecs:
            return
        stager, files = self._current.stager, self._current.snapshot.files
        busy = stager.busy_keys()
        owns = self._role.owns if self._role is not None else (lambda key: True)
        sample = spread_over(files, codecs[0].sample_files,
                             lambda k: owns(k) and k not in busy and files[k].size > 0)
        for codec in codecs:
            codec.sample_from(sample)
        stager.read_ahead_first(sample)
