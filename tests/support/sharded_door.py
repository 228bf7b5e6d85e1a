"""A sharded node's front door alone on a socket, for the tests of its peer lane: its files,
its owners array (the odd index entries are node 1's), the ctypes shapes of the data path's
calls the tests stand in for (dp_fetch, dp_fetch_many, dp_post, dp_test, dp_take), and the
requests the tests make of it (an OPEN, one handed over to Python, the read-ahead lane's end)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from array import array
from types import SimpleNamespace

from monarch import protocol
from monarch.cluster import datapath
from monarch.node.snapshot.index_writer import positions
from monarch.node.snapshot.snapshot import take_snapshot
from monarch.routes import NodeFacts, published
from support.harness import door_on_socket
from support.harness import unix_connect as connect

FILES = 60


def _shape(name: str):
    """The ctypes function type of the data path's ``name``, from its prototype (held against datapath.h)."""
    restype, argtypes = datapath._PROTOTYPES[name]
    return ctypes.CFUNCTYPE(restype, *argtypes)


FETCH, OFFER, FETCH_MANY = _shape("dp_fetch"), _shape("dp_staged"), _shape("dp_fetch_many")
POST, TEST, TAKE = _shape("dp_post"), _shape("dp_test"), _shape("dp_take")
GOT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int64))


def make_sharded_door(short_tmp: str, workers: int, dirs: int = 3, files: int = FILES, size=lambda i: 2048 + i,
                      area_in_ram: bool = False, name=lambda i: f"f{i}"):
    """A door over ``files`` small files (file i ``size(i)`` bytes, named ``name(i)``) in ``dirs`` directories, its
    index open, copying allowed with room lent, as a sharded node's (own_only), with ``workers``
    threads, its peer area under ``short_tmp`` (or /dev/shm, ``area_in_ram``). Yields its
    namespace: the door, its socket, the peer area, the files' sums, the keys it owns
    (``mine``), the owners array, and a fetch that says "ask Python" (what it was asked in
    ``fetched``, of which owner in ``asked``) with an offer that records."""
    root = os.path.join(short_tmp, "pfs")
    sums = {}
    for i in range(files):
        os.makedirs(os.path.join(root, f"d{i % dirs}"), exist_ok=True)
        data = os.urandom(size(i))
        with open(os.path.join(root, f"d{i % dirs}", name(i)), "wb") as f:
            f.write(data)
        sums[f"0/d{i % dirs}/{name(i)}"] = hashlib.md5(data).hexdigest()
    tier = os.path.join(short_tmp, "tier")
    area = os.path.join(f"/dev/shm{short_tmp}" if area_in_ram else short_tmp, "area")
    os.mkdir(tier)
    os.makedirs(area)  # /dev/shm<short_tmp> goes with short_tmp (conftest)
    path = os.path.join(short_tmp, "door.sock")
    slot = protocol.tier_slot(0)
    with door_on_socket(path, [root], {slot: tier, protocol.SLOT_PEER: area}, slot, workers) as door:
        door.own_only(True)
        snap = take_snapshot((root,))
        # each file's route published as a cluster's daemon publishes it (the owners are the door's)
        assert door.open("unused", bytearray(snap.index_bytes(published(NodeFacts(door=True, cluster=True), 1))))
        door.grant(1 << 20)
        door.copying(True)
        row = positions(snap.files)
        owners = array("h", [-1]) * len(snap.files)
        for key in snap.files:
            if row(key) % 2:
                owners[row(key)] = 1
        fetched, offered, asked = [], [], []

        def fetch(dp, owner, key, length, size, fd, timeout_ms):  # the data path says: ask Python
            fetched.append(key[:length].decode("utf-8", "surrogateescape"))
            asked.append(owner)
            return -1

        def offer(dp, key, length, slot_):
            offered.append((key[:length].decode(), slot_))

        callbacks = FETCH(fetch), OFFER(offer)  # kept alive while the door may call them
        mine = {k for k in snap.files if owners[row(k)] < 0}
        yield SimpleNamespace(front_door=door, socket=path, root=root, tier=tier, area=area, slot=slot, sums=sums,
                              mine=mine, owners=owners, snap=snap, row=row,
                              callbacks=callbacks, fetched=fetched, offered=offered, asked=asked,
                              link=lambda: door.peers(*[ctypes.cast(c, ctypes.c_void_p).value for c in callbacks], None,
                                                      owners, 0, protocol.SLOT_PEER, 5.0))


def link_flight(d, root: str, at_once: bool = False) -> SimpleNamespace:
    """The door's peer lane linked to requests in flight in the shape of dp_post, dp_test and
    dp_take: each post recorded (``posted``: by handle, from 1, its keys), answered once its handle
    is in ``replied`` (or at once), with the files' bytes from the PFS (``root``); copying allowed."""
    posted: dict[int, list[str]] = {}
    replied: set[int] = set()

    def post(dp, owner, n, keys, lens, sizes, waited, timeout_ms, why):
        posted[len(posted) + 1] = [keys[i][:lens[i]].decode() for i in range(n)]
        why[0] = 0
        return len(posted)

    def take(dp, handle, sizes, results, got, arg):
        data = []
        for i, key in enumerate(posted[handle]):
            with open(os.path.join(root, key.split("/", 1)[1]), "rb") as f:
                data.append(f.read())
            results[i] = len(data[-1])
        GOT(got)(arg, (ctypes.c_char_p * len(data))(*data), results)

    callbacks = (d.callbacks[0], d.callbacks[1], FETCH_MANY(lambda *a: -1), POST(post),
                 TEST(lambda dp, handle: int(at_once or handle in replied)), TAKE(take))
    address = [ctypes.cast(c, ctypes.c_void_p).value for c in callbacks]
    assert d.front_door.peers(address[0], address[1], None, d.owners, 0, protocol.SLOT_PEER, 5.0, 1, address[2],
                        tuple(address[3:]))
    d.front_door.peer_copying(True)
    return SimpleNamespace(posted=posted, replied=replied, callbacks=callbacks)


def ask_open(path: str, key: str) -> tuple[int, bytes]:
    with connect(path) as s:
        s.sendall(protocol.encode_request(protocol.VERB_OPEN, protocol.key_bytes(key)))
        return protocol.recv_answer(s)


def handed_over(d, key: str, timeout: float = 10) -> bool:
    """Ask for ``key`` on a thread and wait until the door hands the connection to Python."""
    def ask() -> None:
        try:
            ask_open(d.socket, key)
        except (OSError, EOFError, ValueError):
            pass  # closed unanswered: as the shim sees it, read the PFS
    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        taken = d.front_door.take()
        for fd, _ in taken:
            os.close(fd)  # the asker's shim would read the PFS
        if taken:
            asker.join(5)
            return True
        time.sleep(0.01)
    return False


def wait_lane(door, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while (state := door.read_ahead_state())["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    return state
