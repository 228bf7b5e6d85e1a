"""The contract between the C shim, the node daemon and the launcher.

Everything both sides must agree on lives here (and is mirrored by hand in
``monarch/shim/monarch_shim.c``; ``tests/unit/test_protocol.py`` checks the two agree).

Keys: a managed file's key is ``b"<k>/<path relative to root k>"`` as raw bytes (any byte
but NUL; newlines and non-UTF-8 bytes included). Python holds keys as ``str`` decoded with
``os.fsdecode`` (surrogateescape), so every name the filesystem allows round-trips.

Environment (set by ``monarch run`` for the application's process tree; the launcher
exports these keys only, never anything else a daemon says):
  MONARCH_ROOTS     dataset roots as ``<k>=<absolute dir>`` entries separated by ':'. Root k
                    may appear more than once: its canonical path (symlinks resolved) and
                    the spelling the configuration used (``/scratch`` -> ``/lustre/scratch``).
  MONARCH_PROBE     staged-copy directories the shim probes, fastest first, as
                    ``<slot>=<dir>`` pairs separated by ':'. A key is staged at ``<dir>/<key>``.
                    An OPEN answer must name a path inside one of these directories.
  MONARCH_SOCKET    the node daemon's Unix socket.
  MONARCH_COUNTERS  the job's shared counters file (see below).
  MONARCH_INDEX     the snapshot index (see below): what ``fstat`` of a staged copy reports.
  MONARCH_ASK_FIRST=1  every managed open asks the daemon before it probes a tier
                    (``staging.validate: open``: the daemon checks the PFS at a file's first open).
  MONARCH_DISABLE=1 the shim passes everything through.
  MONARCH_SHIM_DEBUG=1..3  debug lines on stderr.
  MONARCH_SHIM_TIMEOUT_MS  the longest the shim waits for one answer (default below); a
                    daemon that sends nothing for HEARTBEAT_TIMEOUT_MS is given up sooner.

Socket protocol: frames, little-endian, one request per connection for the shim.
  request  = u8 verb, u8 flags (0), u16 reserved (0), u32 length, then ``length`` bytes
             (length <= MAX_REQUEST; a key for OPEN and INVALIDATE, empty otherwise)
  answer   = i32 status, u32 length, then ``length`` bytes (length <= MAX_ANSWER)
  OPEN key        -> status = slot: SLOT_PFS (0, empty body: read the original) or a
                     staged slot with the path to open as body; while the daemon stages
                     it sends STATUS_PENDING frames (empty) every HEARTBEAT_MS, so a
                     stalled daemon is told from a slow copy.
                     A compressed copy (a tier with ``compression``, docs/compression.md) is
                     answered ANSWER_FD | slot with an empty body and one descriptor passed
                     with the frame (SCM_RIGHTS, on the frame's bytes): a sealed memfd holding
                     the file's bytes (F_SEAL_WRITE, F_SEAL_GROW, F_SEAL_SHRINK, F_SEAL_SEAL),
                     positioned at 0, for the application to use as its descriptor. The shim
                     accepts it only if it is a regular file, sealed so, of the index's size;
                     it closes any other descriptor that arrives and reads the PFS instead.
                     A shim that does not know ANSWER_FD sees a status beyond the slots and
                     reads the PFS (fail open).
  INVALIDATE key  -> status 0 once the node's copies of the key (or of everything under
                     it, for a directory) are gone and will not be served again this job:
                     the shim sends it before a write-open, rename, unlink or truncate.
  ATTACH          -> status 0, body JSON {"env": {...}, "run": {...}}; the connection is
                     the launcher's session: REPORT frames on it are answered, and the
                     daemon counts it until it closes.
  REPORT          -> status 0, body JSON statistics.
  STOP            -> status 0, then the daemon shuts down.
  HINT body       -> status 0: an order hint from ``monarch.hints`` (the shim never sends
                     it). body = u8 op, u64 stream (the reader's id, any number it chose),
                     then by op:
                       HINT_ORDER (1)    keys, each u16 length + bytes: the first keys of the
                                         stream's next epoch, in the order it will read them
                       HINT_MORE (2)     keys as above: the order continues with these
                       HINT_PROGRESS (3) u64 n: the reader is done with the first n keys
                       HINT_END (4)      nothing: the reader has gone
                     A connection may send several HINT frames, each answered; it is
                     closed after REQUEST idle seconds without one (the client reconnects).
  Any malformed or oversized request is answered STATUS_ERROR (body: a reason) and closed.
  Both sides check the peer's uid (SO_PEERCRED): only the daemon's own user is served,
  and the shim and launcher talk only to a daemon of their own uid.

Counters file: little-endian uint64 words, written by the shim with atomic adds,
so counts survive forked workers that leave with ``_exit`` and processes that are killed.
  word 0: COUNTERS_MAGIC, word 1: COUNTERS_VERSION, word 2: MAX_SLOTS,
  then per slot SLOT_WORDS: opens, bytes (bytes read through read/pread/readv/preadv),
  opens_uncounted (opens whose bytes the shim cannot see: a FILE opened with fopen, read
  by stdio's internal reads, or a descriptor mapped with mmap; counted once per open),
  then EXTRA_WORDS of named counters (EXTRA_*).
Slots: 0 = pfs, 1 = peer area, 2.. = tiers in configuration order.

Snapshot index (written once by the daemon, atomically, read-only mmap in the shim):
  header  INDEX_HEADER: u64 magic, u32 version, u32 entries, u32 buckets (a power of 2),
          u32 reserved, u64 offset of the buckets, u64 offset of the entries,
          u64 offset of the key bytes, u64 size of the key bytes
  buckets u32[buckets]: entry number + 1, or 0 for empty; open addressing, linear probing,
          starting at ``key_hash(key) & (buckets - 1)``
  entries INDEX_ENTRY each: u32 hash, u32 key length, u64 key offset, u64 size,
          i64 mtime_ns, i64 atime_ns, i64 ctime_ns, u64 ino, u64 dev, u32 mode, u32 uid,
          u32 gid, u32 nlink: the source's own ``stat`` as the snapshot saw it (a symlink's
          target's), then u32 flags (INDEX_FLAG_SYMLINK: the name itself is a symlink, so an
          ``O_NOFOLLOW`` open of it fails and is left to the kernel), u32 reserved (0)
  keys    the key bytes, not NUL-terminated
  key_hash is CRC-32 (zlib's, polynomial 0xEDB88320) of the key bytes.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import zlib
from typing import Iterable

COUNTERS_MAGIC = 0x4D4F4E4152434801  # "MONARCH" + 0x01
COUNTERS_VERSION = 2
MAX_SLOTS = 16
HEADER_WORDS = 3
SLOT_WORDS = 3
EXTRA_WORDS = 8
EXTRA_META_LOCAL = 0  # metadata calls answered from the snapshot
EXTRA_META_PFS = 1    # metadata calls on managed paths sent to the PFS
COUNTERS_SIZE = 8 * (HEADER_WORDS + SLOT_WORDS * MAX_SLOTS + EXTRA_WORDS)

SLOT_PFS = 0
SLOT_PEER = 1
FIRST_TIER_SLOT = 2
MAX_TIERS = MAX_SLOTS - FIRST_TIER_SLOT

SHIM_TIMEOUT_MS_DEFAULT = 60_000
HEARTBEAT_MS = 250
HEARTBEAT_TIMEOUT_MS = 1500

ENV_ROOTS = "MONARCH_ROOTS"
ENV_PROBE = "MONARCH_PROBE"
ENV_SOCKET = "MONARCH_SOCKET"
ENV_COUNTERS = "MONARCH_COUNTERS"
ENV_INDEX = "MONARCH_INDEX"
ENV_ASK_FIRST = "MONARCH_ASK_FIRST"
ENV_DISABLE = "MONARCH_DISABLE"
# what a launcher takes from a daemon's ATTACH answer; anything else is refused
CLIENT_ENV_KEYS = (ENV_ROOTS, ENV_PROBE, ENV_SOCKET, ENV_COUNTERS, ENV_INDEX, ENV_ASK_FIRST)

# -- socket frames --------------------------------------------------------------------
VERB_OPEN = 1
VERB_INVALIDATE = 2
VERB_ATTACH = 3
VERB_REPORT = 4
VERB_STOP = 5
VERB_HINT = 6
VERBS = {VERB_OPEN: "OPEN", VERB_INVALIDATE: "INVALIDATE", VERB_ATTACH: "ATTACH",
         VERB_REPORT: "REPORT", VERB_STOP: "STOP", VERB_HINT: "HINT"}

HINT_ORDER = 1
HINT_MORE = 2
HINT_PROGRESS = 3
HINT_END = 4
HINT_HEADER = struct.Struct("<BQ")
HINT_KEY = struct.Struct("<H")

STATUS_PENDING = -2
STATUS_ERROR = -1
ANSWER_FD = 0x100           # OPEN answer flag: the copy comes as a descriptor (SCM_RIGHTS)
MEMFD_SEALS = 0x1 | 0x2 | 0x4 | 0x8  # F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE

MAX_REQUEST = 8192          # a key: root index, '/', a path of up to PATH_MAX (4096)
MAX_ANSWER = 1 << 20        # REPORT and ATTACH bodies; an OPEN answer's path is < PATH_MAX
REQUEST_HEADER = struct.Struct("<BBHI")
ANSWER_HEADER = struct.Struct("<iI")


class ProtocolError(ValueError):
    """A frame that breaks the contract (wrong verb, too long, truncated)."""


def encode_request(verb: int, body: bytes = b"") -> bytes:
    if len(body) > MAX_REQUEST:
        raise ProtocolError(f"request body of {len(body)} bytes exceeds {MAX_REQUEST}")
    return REQUEST_HEADER.pack(verb, 0, 0, len(body)) + body


def decode_request_header(header: bytes) -> tuple[int, int]:
    """(verb, body length) of an 8-byte request header; ProtocolError if it is not one."""
    verb, flags, reserved, length = REQUEST_HEADER.unpack(header)
    if verb not in VERBS or flags or reserved:
        raise ProtocolError(f"unknown request (verb {verb}, flags {flags}, reserved {reserved})")
    if length > MAX_REQUEST:
        raise ProtocolError(f"request body of {length} bytes exceeds {MAX_REQUEST}")
    return verb, length


def encode_hints(op: int, stream: int, keys: Iterable[bytes] = (), consumed: int = 0) -> list[bytes]:
    """The HINT request frames for one hint: a long order is split over several frames
    (HINT_ORDER, then HINT_MORE), each within MAX_REQUEST."""
    head = HINT_HEADER.pack(op, stream)
    if op == HINT_PROGRESS:
        return [encode_request(VERB_HINT, head + struct.pack("<Q", consumed))]
    if op == HINT_END:
        return [encode_request(VERB_HINT, head)]
    frames, parts, size = [], [head], len(head)
    for raw in keys:
        item = HINT_KEY.pack(len(raw)) + raw
        if len(head) + len(item) > MAX_REQUEST:
            raise ProtocolError(f"a key of {len(raw)} bytes does not fit a HINT frame")
        if size + len(item) > MAX_REQUEST:
            frames.append(encode_request(VERB_HINT, b"".join(parts)))
            head = HINT_HEADER.pack(HINT_MORE, stream)
            parts, size = [head], len(head)
        parts.append(item)
        size += len(item)
    frames.append(encode_request(VERB_HINT, b"".join(parts)))
    return frames


def decode_hint(body: bytes) -> tuple[int, int, list[str] | int | None]:
    """(op, stream, keys | consumed | None) of a HINT body; ProtocolError if malformed."""
    if len(body) < HINT_HEADER.size:
        raise ProtocolError("HINT body shorter than its header")
    op, stream = HINT_HEADER.unpack_from(body)
    pos = HINT_HEADER.size
    if op == HINT_PROGRESS:
        if len(body) != pos + 8:
            raise ProtocolError("HINT progress takes one u64")
        return op, stream, struct.unpack_from("<Q", body, pos)[0]
    if op == HINT_END:
        if len(body) != pos:
            raise ProtocolError("HINT end takes no body")
        return op, stream, None
    if op not in (HINT_ORDER, HINT_MORE):
        raise ProtocolError(f"unknown HINT op {op}")
    keys = []
    while pos < len(body):
        if pos + HINT_KEY.size > len(body):
            raise ProtocolError("HINT key length truncated")
        (n,) = HINT_KEY.unpack_from(body, pos)
        pos += HINT_KEY.size
        if n == 0 or pos + n > len(body):
            raise ProtocolError("HINT key empty or truncated")
        keys.append(key_str(body[pos:pos + n]))
        pos += n
    return op, stream, keys


def encode_answer(status: int, body: bytes = b"") -> bytes:
    return ANSWER_HEADER.pack(status, len(body)) + body


def key_bytes(key: str) -> bytes:
    return os.fsencode(key)


def key_str(raw: bytes) -> str:
    return os.fsdecode(raw)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes (the socket's own timeout applies); ProtocolError on early close."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ProtocolError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_answer(sock: socket.socket, limit: int = MAX_ANSWER) -> tuple[int, bytes]:
    """The next answer that is not a heartbeat: (status, body)."""
    while True:
        status, length = ANSWER_HEADER.unpack(recv_exact(sock, ANSWER_HEADER.size))
        if length > limit:
            raise ProtocolError(f"answer body of {length} bytes exceeds {limit}")
        body = recv_exact(sock, length) if length else b""
        if status != STATUS_PENDING:
            return status, body


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def tier_slot(index: int) -> int:
    return FIRST_TIER_SLOT + index


def format_roots(roots: Iterable[tuple[int, str]]) -> str:
    return ":".join(f"{k}={path}" for k, path in roots)


def format_probe(probe: Iterable[tuple[int, str]]) -> str:
    return ":".join(f"{slot}={path}" for slot, path in probe)


# -- counters ---------------------------------------------------------------------------
def create_counters(path: str) -> None:
    """Create a zeroed counters file (atomically: the shim may map it at any time)."""
    from monarch.secure import write_file_atomically
    header = struct.pack("<3Q", COUNTERS_MAGIC, COUNTERS_VERSION, MAX_SLOTS)
    write_file_atomically(path, header + b"\0" * (COUNTERS_SIZE - len(header)))


def read_counters(path: str) -> list[tuple[int, int, int]]:
    """(opens, bytes, opens_uncounted) per slot, as the shim has counted them so far."""
    words = _counter_words(path)
    body = words[HEADER_WORDS:]
    return [tuple(body[SLOT_WORDS * i: SLOT_WORDS * (i + 1)]) for i in range(MAX_SLOTS)]


def read_extra_counters(path: str) -> tuple[int, ...]:
    """The EXTRA_WORDS named counters (EXTRA_*)."""
    return _counter_words(path)[HEADER_WORDS + SLOT_WORDS * MAX_SLOTS:]


def _counter_words(path: str) -> tuple[int, ...]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), COUNTERS_SIZE, access=mmap.ACCESS_READ) as m:
        words = struct.unpack(f"<{COUNTERS_SIZE // 8}Q", m[:COUNTERS_SIZE])
    if words[0] != COUNTERS_MAGIC or words[1] != COUNTERS_VERSION:
        raise ValueError(f"{path}: not a Monarch counters file of version {COUNTERS_VERSION}")
    return words


def slot_names(tier_names, with_peer: bool) -> dict[int, str]:
    """The report's name of each slot in use: ``pfs``, ``peer`` (clusters), then the tiers."""
    names = {SLOT_PFS: "pfs"}
    if with_peer:
        names[SLOT_PEER] = "peer"
    names.update({tier_slot(i): name for i, name in enumerate(tier_names)})
    return names


def read_sources(path: str, names: dict[int, str]) -> dict[str, dict[str, int]]:
    """Opens, bytes and opens whose bytes are unknown, per named source; zeros when the
    counters file is gone or foreign."""
    try:
        counters = read_counters(path)
    except (OSError, ValueError):
        counters = [(0, 0, 0)] * MAX_SLOTS
    return {name: {"opens": counters[slot][0], "bytes": counters[slot][1], "opens_uncounted": counters[slot][2]}
            for slot, name in sorted(names.items())}


# -- snapshot index -------------------------------------------------------------------------
INDEX_MAGIC = 0x58444E4948434E4D  # "MNCHINDX"
INDEX_VERSION = 2
INDEX_HEADER = struct.Struct("<QIIIIQQQQ")
INDEX_ENTRY = struct.Struct("<IIQQqqqQQIIIIII")
INDEX_FLAG_SYMLINK = 1


def key_hash(raw: bytes) -> int:
    return zlib.crc32(raw) & 0xFFFFFFFF


def _stat_fields(st, flags: int) -> tuple:
    """(size, mtime, atime, ctime, ino, dev, mode, uid, gid, nlink, flags, 0) of an
    os.stat_result or a snapshot FileInfo."""
    if hasattr(st, "st_size"):
        return (st.st_size, st.st_mtime_ns, st.st_atime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                st.st_mode, st.st_uid, st.st_gid, st.st_nlink, flags, 0)
    flags |= INDEX_FLAG_SYMLINK if getattr(st, "link", False) else 0
    return (st.size, st.mtime_ns, st.atime_ns, st.ctime_ns, st.ino, st.dev, st.mode, st.uid, st.gid, st.nlink,
            flags, 0)


def build_index(entries: Iterable[tuple]) -> bytes:
    """The index file's bytes for (key, source stat[, flags]) entries (see the module doc); a
    stat is an os.stat_result or a snapshot FileInfo (which knows whether it is a symlink)."""
    items = list(entries)
    nbuckets = 16
    while nbuckets < 2 * len(items):
        nbuckets *= 2
    mask = nbuckets - 1
    buckets = [0] * nbuckets
    packed, keys, key_off = [], [], 0
    for number, (raw, st, *flags) in enumerate(items):
        h = key_hash(raw)
        b = h & mask
        while buckets[b]:
            b = (b + 1) & mask
        buckets[b] = number + 1
        packed.append(INDEX_ENTRY.pack(h, len(raw), key_off, *_stat_fields(st, flags[0] if flags else 0)))
        keys.append(raw)
        key_off += len(raw)
    buckets_off = INDEX_HEADER.size
    entries_off = buckets_off + 4 * nbuckets
    keys_off = entries_off + INDEX_ENTRY.size * len(items)
    header = INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, len(items), nbuckets, 0,
                               buckets_off, entries_off, keys_off, key_off)
    return b"".join([header, struct.pack(f"<{nbuckets}I", *buckets), *packed, *keys])


def index_lookup(data: bytes, raw: bytes) -> tuple | None:
    """The entry of ``raw`` in an index (the shim's lookup, in Python for tests): a tuple in
    INDEX_ENTRY order after the key fields (size, mtime_ns, atime_ns, ctime_ns, ino, dev,
    mode, uid, gid, nlink, flags, reserved), or None."""
    magic, version, n, nbuckets, _, buckets_off, entries_off, keys_off, _ = INDEX_HEADER.unpack_from(data)
    if magic != INDEX_MAGIC or version != INDEX_VERSION:
        raise ValueError("not a Monarch index")
    h = key_hash(raw)
    b = h & (nbuckets - 1)
    while True:
        number = struct.unpack_from("<I", data, buckets_off + 4 * b)[0]
        if not number:
            return None
        fields = INDEX_ENTRY.unpack_from(data, entries_off + INDEX_ENTRY.size * (number - 1))
        if fields[0] == h and data[keys_off + fields[2]: keys_off + fields[2] + fields[1]] == raw:
            return fields[3:]
        b = (b + 1) & (nbuckets - 1)
