"""The daemon's front door: its socket's hot path in C (``front_door.c`` and its ``door_*.c``
parts, one translation unit; each part's ``door_*.h`` says what it gives the others, ``door.h``
the state they share), driven from here.

The door is a few threads of its own (one per core), outside the interpreter's lock: they
accept every connection, check its peer and answer OPENs of staged files, and of small
files, which they copy themselves (a slow source's on copier threads of the door's, as many
in flight as its measured latency wants: ``inflight.c``, the rule Python's stager follows too,
through ``Flow`` below). Whatever it does not answer it hands over to the
Python server (``NodeServer``), and what it copied it reports as events (``events``), which
the daemon's ``DoorLink`` (``monarch/node/doorkeeper/door_link.py``) books in the stager's. This module
knows no stager. The policy stays in Python; see the C file's header for the states a key
goes through.

The contract with the C side is ``front_door.h``: the functions called here (``_PROTOTYPES``),
the events (``EV_*``), whose books (``BOOKS``), why a connection was handed over
(``HANDED_OVER_BECAUSE``, R_* in order), why the lane ended (``AHEAD_ENDED_BECAUSE``, A_*),
the phases of the in-flight rule (``PHASES``), the event record (``_EVENT``) and the
counters' and states' records, read by name (``DoorCounts``, ``ReadAheadState``, ``PeerTold``,
``PeerAheadState``, ``InflightState``, ``DoorInflight``);
``tests/unit/frontdoor/test_front_door_header.py`` holds this module to it.

The door's peer lanes (``door_peer.c``, ``door_peer_ahead.c``, ``door_peer_lane.c``: other
nodes' files fetched through the C data path) are pieces of the peer plane, whose map is
``monarch/cluster/__init__.py``.

Without a C compiler, with ``staging.validate: open`` (every open checked in Python) or with
``MONARCH_FRONT_DOOR=0``, there is no door: the Python server accepts and answers
everything itself, as fast as the interpreter allows.
"""

from __future__ import annotations

import ctypes
import os
import struct
from array import array
from pathlib import Path
from typing import NamedTuple

from monarch import protocol
from monarch.native.build import OptionalLibrary

SOURCE = Path(__file__).with_name("front_door.c")
LIBRARY_NAME = "libmonarch_front_door.so"
ENV_FRONT_DOOR = "MONARCH_FRONT_DOOR"

# front_door.h is the one definition of each list below (FRONT_DOOR_EVENTS, _BOOKS, _HANDED_OVER, _AHEAD_ENDED)
EV_STAGED, EV_FAILED, EV_AHEAD, EV_TRANSIENT = 1, 2, 4, 5  # 3 (a slow source) and 6 (a peer read-ahead copy) are no more
# whose books an event or lent room is (front_door.h: FRONT_DOOR_BOOKS): the stager's copies, the peer cache's fetches
BOOKS, PEER_BOOKS = 0, 1
# EV_AHEAD: staged by the read-ahead lane; EV_TRANSIENT: another node's file answered as a memfd
# why the read-ahead lane ended before its list did (front_door.h: FRONT_DOOR_AHEAD_ENDED)
AHEAD_ENDED_BECAUSE = ("", "not_copying", "no_room", "stopped")
_EVENT = struct.Struct("<IIQQqII")  # front_door_events' record head (FRONT_DOOR_EVENT_FORMAT); the key follows
# why a connection was handed over (front_door.h: FRONT_DOOR_HANDED_OVER)
HANDED_OVER_BECAUSE = ("other_request", "snapshot_not_ready", "python_owns_key", "not_copying", "not_small_file",
                       "no_room_lent", "copy_failed")


def _words(*names: str) -> list[tuple[str, type]]:
    return [(name, ctypes.c_uint64) for name in names]


class DoorCounts(ctypes.Structure):
    """front_door_counts' record (struct front_door_counts), by name."""
    _fields_ = [("hits", ctypes.c_uint64 * protocol.MAX_SLOTS),
                *_words("copies", "handed", "failures", "bytes_read"),
                ("handed_because", ctypes.c_uint64 * len(HANDED_OVER_BECAUSE)),
                *_words("closed_too_many", "peer_fetches", "peer_failures", "peer_transient", "accepted", "reused",
                        "peer_batches", "peer_batched", "peer_keep_all", "peer_reuse_permille", "peer_waits")]


class ReadAheadState(ctypes.Structure):
    """front_door_read_ahead_state's record (struct front_door_read_ahead_state)."""
    _fields_ = _words("running", "through", "copies", "ended_because", "key_bytes")


class PeerTold(ctypes.Structure):
    """front_door_peer_told's record (struct front_door_peer_told)."""
    _fields_ = _words("stream", "consumed", "answered")


class PeerAheadState(ctypes.Structure):
    """front_door_peer_ahead_state's record (struct front_door_peer_ahead_state); the names are
    those of ``FrontDoor.peer_ahead_state``."""
    _fields_ = _words("orders", "fetched", "fetched_bytes", "batches", "failed", "skipped", "room_waits", "order",
                      "next", "consumed", "waited", "copies", "room", "unlinked", "kept", "reused",
                      "progress_answered", "written_mapped")


class InflightState(ctypes.Structure):
    """inflight_state's record (struct inflight_state): one lane's copies in flight, by name."""
    _fields_ = [*_words("limit", "peak", "windows_judged", "phase"),
                ("mean_copy_seconds", ctypes.c_double), ("last_rate", ctypes.c_double)]


class DoorInflight(ctypes.Structure):
    """front_door_inflight's record (struct front_door_inflight): the door's own lane."""
    _fields_ = [("flow", InflightState), *_words("copiers", "in_flight")]


class DoorEvent(NamedTuple):
    kind: int        # EV_STAGED, EV_FAILED, EV_AHEAD or EV_TRANSIENT
    slot: int        # where it was staged (EV_STAGED)
    size: int        # the file's size
    bytes_read: int  # bytes the door read from the PFS for it
    seconds: float   # how long the copy took
    key: str
    entry: int = 0   # the key's entry in the door's index, from 1 (0: none): its books need no look-up


_vp, _i, _cp, _i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64
_PROTOTYPES = {
    "front_door_start": (_vp, [_i, _cp, _i, _cp, _i, _i, _i]),
    "front_door_wake_fd": (_i, [_vp]),
    "front_door_take": (_i, [_vp, ctypes.POINTER(_i), ctypes.c_char_p, _i]),
    "front_door_events": (_i, [_vp, _i, ctypes.c_char_p, _i]),
    "front_door_open": (_i, [_vp, _cp]),
    "front_door_open_memory": (_i, [_vp, _vp, ctypes.c_uint64]),
    "front_door_settle": (None, [_vp]),
    "front_door_describe_with": (None, [_vp, _vp, _vp, _vp, _i]),
    "front_door_claim": (_i, [_vp, _cp, _i]),
    "front_door_staged": (None, [_vp, _cp, _i, _i]),
    "front_door_forget": (None, [_vp, _cp, _i]),
    "front_door_copying": (None, [_vp, _i]),
    "front_door_keep_sources": (None, [_vp]),
    "front_door_disable": (None, [_vp]),
    "front_door_grant": (None, [_vp, _i, _i64]),
    "front_door_reclaim": (_i64, [_vp, _i]),
    "front_door_lease": (_i64, [_vp, _i]),
    "front_door_counts": (None, [_vp, ctypes.POINTER(DoorCounts)]),
    "front_door_peers": (_i, [_vp, _vp, _vp, _vp, _vp, ctypes.c_uint32, _i, _i, _i, _i64, _vp, _vp, _vp, _vp]),
    "front_door_ring": (_i64, [_vp, _vp, ctypes.c_uint64, _vp, _vp, ctypes.c_uint32, ctypes.c_uint64, _i,
                            ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint32]),
    "front_door_pages": (_i, [_vp, _vp, _vp, _i, _i]),
    "front_door_own_only": (None, [_vp, _i]),
    "front_door_peer_describe": (None, [_vp, _vp, _vp]),
    "front_door_copy_to": (_i64, [_vp, _i, _i64]),
    "front_door_peer_copying": (None, [_vp, _i]),
    "front_door_peer_reuse": (_i, [_vp, _cp, ctypes.c_uint64]),
    "front_door_evict": (_i, [_vp, _cp, _i, _i64]),
    "front_door_read_ahead": (_i, [_vp, ctypes.c_uint32, ctypes.c_uint32, _i, _i]),
    "front_door_read_ahead_state": (None, [_vp, ctypes.POINTER(ReadAheadState)]),
    "front_door_inflight": (None, [_vp, ctypes.POINTER(DoorInflight)]),
    "inflight_new": (_vp, [_i, _i, _i, _i]),
    "inflight_free": (None, [_vp]),
    "inflight_copy_ended": (None, [_vp, ctypes.c_double, ctypes.c_double]),
    "inflight_nothing_to_copy": (None, [_vp]),
    "inflight_limit": (_i, [_vp]),
    "inflight_state": (None, [_vp, ctypes.POINTER(InflightState)]),
    "front_door_stop": (None, [_vp]),
    "front_door_free": (None, [_vp]),
    # the peer read-ahead lane (door_peer_ahead.c)
    "front_door_peer_ahead": (_i, [_vp, _vp, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64]),
    "front_door_peer_progress": (None, [_vp, ctypes.c_uint32]),
    "front_door_peer_told": (_i, [_vp, ctypes.POINTER(PeerTold)]),
    "front_door_peer_gone": (None, [_vp, _cp, _i]),
    "front_door_peer_ahead_state": (None, [_vp, ctypes.POINTER(PeerAheadState)]),
}
_LIBRARY = OptionalLibrary(SOURCE, Path(__file__).with_name(LIBRARY_NAME), "the daemon's C front door",
                           "the Python server answers every request", _PROTOTYPES)


def library() -> ctypes.CDLL | None:
    """The door's library: built by ``pip install``, or from this checkout on first use
    (None, once logged, if it cannot be: the Python server then does everything)."""
    return _LIBRARY.get()


def wanted() -> bool:
    return os.environ.get(ENV_FRONT_DOOR, "1") not in ("0", "no", "off", "false")


class FrontDoor:
    """One daemon socket's door: started on the listening socket, stopped with the server."""

    def __init__(self, listen_fd: int, roots: list[str], tier_dirs: dict[int, str], copy_slot: int, workers: int = 0):
        lib = library()
        if lib is None:
            raise OSError("the front door library is not available")
        self._lib = lib
        nslots = max([copy_slot, *tier_dirs]) + 1
        tiers = b"".join(os.fsencode(tier_dirs.get(s, "")) + b"\0" for s in range(nslots))
        blob = b"".join(os.fsencode(r) + b"\0" for r in roots)
        self._door = lib.front_door_start(listen_fd, blob, len(roots), tiers, nslots, copy_slot, workers)
        self._stopped = False
        if not self._door:
            err = ctypes.get_errno() or 22
            raise OSError(err, f"starting the front door: {os.strerror(err)}")
        self.wake_fd = lib.front_door_wake_fd(self._door)
        self.copy_slot = copy_slot
        self.index: bytearray | None = None  # the daemon's index bytes the door reads in place (open)
        self._buf = ctypes.create_string_buffer(protocol.REQUEST_HEADER.size + protocol.MAX_REQUEST)
        self._events = ctypes.create_string_buffer(1 << 20)

    # -- the server's side -------------------------------------------------------------
    def take(self) -> list[tuple[int, bytes]]:
        """Connections handed over: (descriptor, now the caller's; the bytes read of its request)."""
        out = []
        fd = ctypes.c_int()
        while not self._stopped:
            n = self._lib.front_door_take(self._door, ctypes.byref(fd), self._buf, len(self._buf))
            if n == -2:  # more than a request's worth: never, but never lose it either
                self._buf = ctypes.create_string_buffer(fd.value)
                continue
            if n < 0:
                break
            out.append((fd.value, ctypes.string_at(self._buf, n)))
        return out

    def events(self, books: int = BOOKS) -> list[DoorEvent]:
        """What the door did for ``books`` (BOOKS: copies, PEER_BOOKS: the peer lane's fetches)
        since the last call (and re-arms its wake-up once both are drained)."""
        out = []
        while n := self._lib.front_door_events(self._door, books, self._events, len(self._events)):
            raw = ctypes.string_at(self._events, n)  # not .raw: that copies the whole 1 MiB buffer first
            at = 0
            while at < n:
                kind, slot, size, nread, ns, klen, entry = _EVENT.unpack_from(raw, at)
                at += _EVENT.size
                out.append(DoorEvent(kind, slot, size, nread, ns / 1e9, protocol.key_str(raw[at:at + klen]), entry))
                at += klen
        return out

    def open(self, index_path: str, index: bytearray | None = None) -> bool:
        """The snapshot is ready (its index written): answer from now on. ``index``: the index's
        bytes the daemon holds (the door reads them in place, and keeps them alive), else the
        door maps the file."""
        if index is None:
            return self._lib.front_door_open(self._door, os.fsencode(index_path)) == 0
        self._index = (ctypes.c_char * len(index)).from_buffer(index)  # held: the bytes stay where they are
        if self._lib.front_door_open_memory(self._door, ctypes.addressof(self._index), len(index)) != 0:
            return False
        self.index = index
        return True

    def keep_sources(self) -> None:
        """The door copies misses from the PFS: from its first, it opens the index's directories
        beside the job and keeps them (a miss then costs the PFS its name's look-up and its open)."""
        self._lib.front_door_keep_sources(self._door)

    def describe_with(self, tables: tuple) -> None:
        """A file a listing-mode walk left undescribed is described by the door at its miss, its route
        by ``tables`` (index_writer.route_tables), where the index is lent by ``open(..., index)``."""
        self._tables = tables  # held while the door may read them (it copies them: for tidiness)
        smallest, route, counts = tables
        self._lib.front_door_describe_with(self._door, ctypes.addressof(smallest), ctypes.addressof(route),
                                           ctypes.addressof(counts), len(counts))

    def settle(self) -> None:
        """The snapshot is ready or failed: INDEX polls go to the Python server from now on
        (until then the door answers them INDEX_WALKING itself, whatever Python is doing)."""
        self._lib.front_door_settle(self._door)

    def counts(self) -> dict:
        c = DoorCounts()
        self._lib.front_door_counts(self._door, ctypes.byref(c))
        return {"hits_by_slot": {s: n for s, n in enumerate(c.hits) if n}, "copies": c.copies, "handed_over": c.handed,
                "failed_copies": c.failures, "pfs_bytes_read": c.bytes_read,
                "handed_over_because": {why: n for why, n in zip(HANDED_OVER_BECAUSE, c.handed_because) if n},
                # closed at once while the Python server had HANDED_MAX waiting (a flood), or
                # with no descriptor left to accept them
                "closed_too_many": c.closed_too_many,
                # the peer lane: other nodes' files fetched through the C data path into the
                # peer area, those that failed, and those answered as a memfd (no room lent)
                "peer_fetches": c.peer_fetches, "peer_fetch_failures": c.peer_failures,
                "peer_transient": c.peer_transient,
                # connections accepted, and OPENs read on a connection kept after an answer
                # (the shim's REQUEST_KEEP): a shim's thread connects once, not once per open
                "accepted": c.accepted, "reused": c.reused,
                # the peer lane's requests to owners and the files in them (a request gathers the
                # opens of one owner that wait for it)
                "peer_batches": c.peer_batches, "peer_batched": c.peer_batched,
                # its memfd rule now (a state, not a count: a run's report shows it as it is):
                # whether every fetch goes into the peer area (the measured reuse of the area's
                # copies, later opens per copy, is above the break-even), else 1 in 8
                "peer_area_rule": {"keep_all": bool(c.peer_keep_all), "reuse": c.peer_reuse_permille / 1000},
                # the waits of the workers that fetch for an answer (each a look, serving their
                # own connections meanwhile)
                "peer_waits": c.peer_waits}

    def stop(self) -> None:
        """Stop answering (connections not answered yet are closed: their shims read the
        PFS). What it copied can still be drained (``events``)."""
        if not self._stopped:
            self._stopped = True
            self._lib.front_door_stop(self._door)

    def __del__(self):
        if getattr(self, "_door", None):
            if not self._stopped:
                self._lib.front_door_stop(self._door)
            self._lib.front_door_free(self._door)
            self._door = None

    # -- the read-ahead lane -----------------------------------------------------------
    def read_ahead(self, files: int, fixed: int = 0, start: int = 0, most: int | None = None) -> bool:
        """Copy the small files among the index's first ``files`` entries (the snapshot's
        files, in its order) ahead of the reader on the door's copiers, as misses would be
        copied (events EV_AHEAD): as many at once as the door's measure of its source allows
        (from ``start``, or ``fixed`` of them: staging.threads). ``most``: how many its tiers
        can hold (its table's room is made for that many). False if it could not start."""
        most = files if most is None else min(files, most)
        return self._lib.front_door_read_ahead(self._door, files, most, fixed, start) == 0

    def read_ahead_state(self) -> dict:
        """The lane: ``running`` copies in flight (at least 1 until its list is through),
        ``through`` entries gone through, ``copies`` made, ``ended_because`` ("" unless it
        stopped before its list ended), ``key_bytes`` (the door's records of the keys it heard of)."""
        s = ReadAheadState()
        self._lib.front_door_read_ahead_state(self._door, ctypes.byref(s))
        why = s.ended_because
        return {"running": s.running, "through": s.through, "copies": s.copies,
                "ended_because": AHEAD_ENDED_BECAUSE[why] if why < len(AHEAD_ENDED_BECAUSE) else str(why),
                "key_bytes": s.key_bytes}

    def inflight(self) -> dict:
        """The door's copies in flight toward its source: the limit its measure settled on,
        the highest it reached, its copier threads, the copies under way now."""
        s = DoorInflight()
        self._lib.front_door_inflight(self._door, ctypes.byref(s))
        return flow_figures(s.flow) | {"copiers": s.copiers, "in_flight": s.in_flight}

    # -- the stager's side -------------------------------------------------------------
    def claim(self, key: str) -> bool:
        """The stager copies ``key`` itself from now on; True if the door already has."""
        raw = protocol.key_bytes(key)
        return bool(self._lib.front_door_claim(self._door, raw, len(raw)))

    def staged(self, key: str, slot: int) -> None:
        raw = protocol.key_bytes(key)
        self._lib.front_door_staged(self._door, raw, len(raw), slot)

    def forget(self, key: str) -> None:
        raw = protocol.key_bytes(key)
        self._lib.front_door_forget(self._door, raw, len(raw))

    def peers(self, fetch: int | None, offer: int | None, datapath: int | None, owners, self_node: int,
              peer_slot: int, timeout: float, unit: int = 1, fetch_many: int | None = None,
              flight: tuple[int, int, int] | None = None) -> bool:
        """The peer lane: misses of the files ``owners`` (an ``array('h')`` by index entry, -1:
        this node's; None: the ring given by ``ring``) gives to another node fetched with the C function ``fetch`` (datapath.c's dp_fetch,
        on ``datapath``) into the tier of ``peer_slot``, each paying its size rounded up to
        ``unit`` (the tier's allocation) out of the peer area's lease; the door's own copies
        offered with ``offer`` (dp_staged); ``fetch_many`` (dp_fetch_many) fetches many of one
        owner's files in one request, ``flight`` (dp_post, dp_test, dp_take) keeps many such
        requests in flight at once from the read-ahead lane's thread (without it, one at a time);
        ``fetch`` None turns it off. False if the door has no such tier."""
        if fetch is None:
            return self._lib.front_door_peers(self._door, None, None, None, None, 0, self_node, peer_slot, 0, 1,
                                              None, None, None, None) == 0
        address, n = owners.buffer_info() if owners is not None else (None, 0)
        ok = self._lib.front_door_peers(self._door, fetch, offer, datapath, address, n, self_node, peer_slot,
                                        max(1, int(timeout * 1000)), unit, fetch_many, *(flight or (None,) * 3)) == 0
        if ok:
            self._owners = owners  # the door reads it: kept alive with the door
        return ok

    def ring(self, index, starts: list[int], nodes: list[int], seed: int, self_node: int,
             entries: int) -> tuple[memoryview, int] | None:
        """Whose file each of the first ``entries`` entries of ``index`` (the bytes of the index the
        door answers from, or will once ``open``) is, by the placement's ring (part i: hashes from
        ``starts[i]`` on, ``nodes[i]``'s; a key's hash XXH64 with ``seed``): the door hashes every
        key once and keeps a bit an entry, set where it is ``self_node``'s, until the next ``ring``
        or ``peers`` with a table. Returns (those bits, as 64-bit words by entry - 1, and how many
        are set), or None: not an index, or a bad ring."""
        starts_a, nodes_a = array("Q", starts), array("h", nodes)
        bits = array("Q", bytes(8 * max(1, (entries + 63) // 64)))
        try:
            view = (ctypes.c_char * len(index)).from_buffer(index)
        except (TypeError, ValueError):  # read-only bytes: not the daemon's own index
            return None
        own = self._lib.front_door_ring(self._door, ctypes.addressof(view), len(index), starts_a.buffer_info()[0],
                                        nodes_a.buffer_info()[0], len(starts_a), seed, self_node,
                                        (ctypes.c_uint64 * len(bits)).from_buffer(bits), entries)
        del view  # (the door keeps no pointer into ``index``: an mmap may close later)
        if own < 0:
            return None
        self._ring = (starts_a, nodes_a, bits)  # the door reads them: kept alive with the door
        return memoryview(bits), own

    def pages(self, fetch_pages: int | None, datapath: int | None, self_node: int, timeout: float) -> bool:
        """A cluster's: a shim's PAGES (a guarded fault's pages of another owner's block) fetched with
        the C function ``fetch_pages`` (datapath.c's dp_fetch_pages, on ``datapath``) from that
        owner, waiting ``timeout`` at most; None: refused (the shim reads the PFS)."""
        return self._lib.front_door_pages(self._door, fetch_pages, datapath, self_node,
                                           max(1, int(timeout * 1000))) == 0

    def own_only(self, on: bool) -> None:
        """A sharded node's door: it copies this node's own files only (none before ``peers``
        says who owns which)."""
        self._lib.front_door_own_only(self._door, int(on))

    def peer_describe(self, describe: int | None, take_wanted: int | None = None) -> None:
        """A sharded node's door: another node's file the listing left undescribed is described from
        its owner's index with the C function ``describe`` (datapath.c's dp_describe), not on the PFS;
        its read-ahead lane copies first this node's such files that peers open (``take_wanted``:
        dp_take_wanted), describing them as it does."""
        self._lib.front_door_peer_describe(self._door, describe, take_wanted)

    def peer_copying(self, on: bool) -> None:
        self._lib.front_door_peer_copying(self._door, int(on))

    def peer_reuse(self, counters_path: str | None) -> bool:
        """Decide which remote files go into the peer area by how often its copies are opened
        again, read from the shim's counters at ``counters_path`` (the rest are answered as
        sealed memfds); None: every one into the area while it has room. False if the file
        cannot be read."""
        offset = 8 * (protocol.HEADER_WORDS + protocol.SLOT_WORDS * protocol.SLOT_PEER)  # the peer slot's opens
        path = os.fsencode(counters_path) if counters_path is not None else None
        return self._lib.front_door_peer_reuse(self._door, path, offset) == 0

    def evict(self, key: str, grace: float) -> bool:
        """An evicting cache would drop ``key``'s copy: True and handed over from now on, or
        False (kept) if the door answered it less than ``grace`` seconds ago."""
        raw = protocol.key_bytes(key)
        return bool(self._lib.front_door_evict(self._door, raw, len(raw), int(grace * 1e9)))

    def copying(self, on: bool) -> None:
        self._lib.front_door_copying(self._door, int(on))

    def disable(self) -> None:
        self._lib.front_door_disable(self._door)

    def copy_to(self, slot: int, nbytes: int) -> int:
        """Copy into the tier of ``slot`` from now on, ``nbytes`` lent there (once the copies
        under way have ended). Returns what was left of the old lease (-1: no such tier)."""
        left = self._lib.front_door_copy_to(self._door, slot, nbytes)
        if left >= 0:
            self.copy_slot = slot
        return left

    def grant(self, nbytes: int, books: int = BOOKS) -> None:
        """Room the door may fill for ``books`` (reserved by the caller in that tier)."""
        self._lib.front_door_grant(self._door, books, nbytes)

    def reclaim(self, books: int = BOOKS) -> int:
        """What is left of ``books``' grants (the caller releases it)."""
        return self._lib.front_door_reclaim(self._door, books)

    def lease(self, books: int = BOOKS) -> int:
        return self._lib.front_door_lease(self._door, books)

    # -- the peer read-ahead lane (door_peer_ahead.c: a hinted order's other nodes' files) --
    def peer_ahead(self, entries, window: int, stream: int = 0) -> bool:
        """The reader's order as index entries (an ``array('I')``, from 1): the door fetches
        the other nodes' files among them ahead of the progress (``peer_progress``, or the
        HINT PROGRESS requests of hint stream ``stream``, which the door answers itself), at
        most ``window`` positions ahead, in batches per owner, into the peer area (within its
        lease). An empty order stops the lane (its batch under way ends first)."""
        address, n = entries.buffer_info() if len(entries) else (None, 0)  # copied by the door
        return self._lib.front_door_peer_ahead(self._door, address, n, max(1, window), stream) == 0

    def peer_progress(self, consumed: int) -> None:
        self._lib.front_door_peer_progress(self._door, max(0, min(consumed, 0xFFFFFFFF)))

    def peer_told(self) -> tuple[tuple[int, int] | None, int]:
        """The last progress the door answered itself and Python has not taken, as (stream,
        positions consumed), or None; and how many progress requests the door answered so far."""
        t = PeerTold()
        fresh = self._lib.front_door_peer_told(self._door, ctypes.byref(t))
        return ((t.stream, t.consumed) if fresh else None), t.answered

    def peer_gone(self, key: str) -> None:
        """``key``'s copy left the peer area (evicted): the read-ahead lane may fetch it again."""
        raw = protocol.key_bytes(key)
        self._lib.front_door_peer_gone(self._door, raw, len(raw))

    def peer_ahead_state(self) -> dict:
        s = PeerAheadState()
        self._lib.front_door_peer_ahead_state(self._door, ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in PeerAheadState._fields_}


# -- how many copies in flight: the rule of inflight.c, for Python's lanes -------------------
# the rule's phases, in order (front_door.h: INFLIGHT_PHASES)
PHASES = ("slow_start", "measure", "up", "down", "settled")


def flow_figures(s: InflightState) -> dict:
    """inflight_state's figures, as the report shows them."""
    return {"limit": s.limit, "peak": s.peak, "windows_judged": s.windows_judged,
            "phase": PHASES[s.phase] if s.phase < len(PHASES) else str(s.phase),
            "mean_copy_seconds": s.mean_copy_seconds if s.mean_copy_seconds >= 0 else None,
            "last_rate": s.last_rate}


class Flow:
    """One lane's copies in flight toward its source, decided by the door's rule (inflight.c:
    slow start while the latency stays flat, then rounds that keep a doubling only if it
    pays). ``fixed``: that many, always. Python's stager and the store's pipelines hold one
    each; the door's own lane has its own inside the door."""

    def __init__(self, lib: ctypes.CDLL, fixed: int | None, start: int, low: int, high: int):
        self._lib = lib
        self._c = lib.inflight_new(fixed or 0, start, low, high)
        if not self._c:
            raise MemoryError("inflight_new")

    def completed(self, seconds: float, now: float) -> None:
        self._lib.inflight_copy_ended(self._c, seconds, now)

    def starved(self) -> None:
        self._lib.inflight_nothing_to_copy(self._c)

    @property
    def limit(self) -> int:
        return self._lib.inflight_limit(self._c)

    def state(self) -> dict:
        s = InflightState()
        self._lib.inflight_state(self._c, ctypes.byref(s))
        return flow_figures(s)

    def __del__(self):
        if getattr(self, "_c", None):
            self._lib.inflight_free(self._c)
            self._c = None

