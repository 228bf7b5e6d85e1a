"""The contract between the C shim, the node daemon and the launcher.

Everything both sides must agree on lives here (and is mirrored by hand in
``monarch/shim/monarch_shim.c``; ``tests/unit/test_protocol.py`` checks the two agree).

Environment (set by ``monarch run`` for the application's process tree):
  MONARCH_ROOTS     dataset roots, absolute and canonical, separated by ':'.
                    Root k's files have the *key* ``"<k>/<path relative to root k>"``.
  MONARCH_PROBE     staged-copy directories the shim probes, fastest first, as
                    ``<slot>=<dir>`` pairs separated by ':'. A key is staged at ``<dir>/<key>``.
  MONARCH_SOCKET    the node daemon's Unix socket.
  MONARCH_COUNTERS  the job's shared counters file (see below).
  MONARCH_DISABLE=1 the shim passes everything through.
  MONARCH_SHIM_DEBUG=1..3  debug lines on stderr.
  MONARCH_SHIM_TIMEOUT_MS  how long the shim waits for the daemon (default below).

Socket protocol (one request per connection, text lines, UTF-8):
  shim -> daemon   ``OPEN <key>\\n``
  daemon -> shim   ``<slot> <path>\\n``   open <path>, count it under <slot>
                   ``0 \\n``              read the PFS original (slot 0)
  launcher: ``ATTACH\\n`` keeps the connection open for the life of one ``monarch run``
  (the daemon answers ``OK\\n``); ``REPORT\\n`` answers one JSON line; ``STOP\\n`` answers
  ``OK\\n`` and shuts the daemon down.

Counters file: little-endian uint64 words, written by the shim with atomic adds,
so counts survive forked workers that leave with ``_exit`` and processes that are killed.
  word 0: COUNTERS_MAGIC, word 1: COUNTERS_VERSION, word 2: MAX_SLOTS,
  then per slot: opens, bytes (bytes read through read/pread/readv/preadv).
Slots: 0 = pfs, 1 = peer area, 2.. = tiers in configuration order.
"""

from __future__ import annotations

import mmap
import os
import struct

COUNTERS_MAGIC = 0x4D4F4E4152434801  # "MONARCH" + 0x01
COUNTERS_VERSION = 1
MAX_SLOTS = 16
HEADER_WORDS = 3
COUNTERS_SIZE = 8 * (HEADER_WORDS + 2 * MAX_SLOTS)

SLOT_PFS = 0
SLOT_PEER = 1
FIRST_TIER_SLOT = 2
MAX_TIERS = MAX_SLOTS - FIRST_TIER_SLOT

SHIM_TIMEOUT_MS_DEFAULT = 60_000

ENV_ROOTS = "MONARCH_ROOTS"
ENV_PROBE = "MONARCH_PROBE"
ENV_SOCKET = "MONARCH_SOCKET"
ENV_COUNTERS = "MONARCH_COUNTERS"
ENV_DISABLE = "MONARCH_DISABLE"


def tier_slot(index: int) -> int:
    return FIRST_TIER_SLOT + index


def format_answer(slot: int, path: str = "") -> bytes:
    return f"{slot} {path}\n".encode()


def parse_answer(line: bytes) -> tuple[int, str]:
    slot, _, path = line.decode().rstrip("\n").partition(" ")
    return int(slot), path


def create_counters(path: str) -> None:
    """Create a zeroed counters file (atomically: the shim may map it at any time)."""
    tmp = f"{path}.tmp{os.getpid()}"
    header = struct.pack("<3Q", COUNTERS_MAGIC, COUNTERS_VERSION, MAX_SLOTS)
    with open(tmp, "wb") as f:
        f.write(header + b"\0" * (COUNTERS_SIZE - len(header)))
    os.replace(tmp, path)


def read_counters(path: str) -> list[tuple[int, int]]:
    """(opens, bytes) per slot, as the shim has counted them so far."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), COUNTERS_SIZE, access=mmap.ACCESS_READ) as m:
        words = struct.unpack(f"<{COUNTERS_SIZE // 8}Q", m[:COUNTERS_SIZE])
    if words[0] != COUNTERS_MAGIC or words[1] != COUNTERS_VERSION:
        raise ValueError(f"{path}: not a Monarch counters file of version {COUNTERS_VERSION}")
    body = words[HEADER_WORDS:]
    return [(body[2 * i], body[2 * i + 1]) for i in range(MAX_SLOTS)]


def slot_names(tier_names, with_peer: bool) -> dict[int, str]:
    """The report's name of each slot in use: ``pfs``, ``peer`` (clusters), then the tiers."""
    names = {SLOT_PFS: "pfs"}
    if with_peer:
        names[SLOT_PEER] = "peer"
    names.update({tier_slot(i): name for i, name in enumerate(tier_names)})
    return names


def read_sources(path: str, names: dict[int, str]) -> dict[str, dict[str, int]]:
    """Opens and bytes per named source; zeros when the counters file is gone or foreign."""
    try:
        counters = read_counters(path)
    except (OSError, ValueError):
        counters = [(0, 0)] * MAX_SLOTS
    return {name: {"opens": counters[slot][0], "bytes": counters[slot][1]} for slot, name in sorted(names.items())}
