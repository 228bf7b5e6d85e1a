"""A write-back call on the daemon's socket (``protocol.VERB_WB``), the C half of which is
``wire/monarch_wire.h`` (held equal by tests/unit/test_wire.py).

Body: ``u8 op``, then four NUL-ended fields: a path, a second path (rename's destination), two
decimal numbers. Answer status: ``WB_ANSWER_PFS`` (0: use the path in the body, the PFS's), a
file's ``seq`` (> 0, for OPEN: its bytes go to the local path in the body), or ``WB_ERRNO + errno``
(the call fails with that errno, as the kernel would have failed it).
"""

from __future__ import annotations

from dataclasses import dataclass

from monarch.protocol import ProtocolError

(WB_OPEN, WB_CLOSE, WB_RESOLVE, WB_RENAME, WB_UNLINK, WB_MKDIR, WB_RMDIR, WB_SYNC, WB_LIST, WB_SETTLE, WB_FMODE,
 WB_ROOM, WB_SPILLED, WB_CLOSE_SYNCED) = range(1, 15)
WB_ANSWER_PFS = 0
WB_ANSWER_DONE = 1   # SETTLE, FMODE: made in the view; the kernel is not asked. ROOM: granted
WB_ANSWER_SPILL = 2  # ROOM: larger than the room: written through to the PFS path in the body
WB_ANSWER_LOCAL = 4096  # RESOLVE, + mode: a pending file's copy at the path in the body, with this mode
GRANT_AHEAD = 16 << 20  # ROOM: room reserved ahead of a file's writes (at most an eighth of the room)
GRANT_ALL = (1 << 63) - 1  # ROOM: no more to ask (the body of DONE: the bytes granted)
SETTLE_OTHER, SETTLE_TRUNCATE, SETTLE_CHMOD = 0, 1, 2  # SETTLE's n1: what the call is
RESOLVE_TO_READ = 1  # RESOLVE's n1: a read-only open (a kept copy of the unchanged PFS file will do), not a stat
WB_ERRNO = 65536


@dataclass(frozen=True)
class Call:
    op: int
    path: str
    path2: str
    n1: int
    n2: int


def encode_call(op: int, path: str = "", path2: str = "", n1: int = 0, n2: int = 0) -> bytes:
    return bytes([op]) + b"\0".join(f.encode("utf-8", "surrogateescape")
                                    for f in (path, path2, str(n1), str(n2))) + b"\0"


def decode_call(body: bytes) -> Call:
    """The call in a WB request's body; ProtocolError when it is not one."""
    if len(body) < 2 or not WB_OPEN <= body[0] <= WB_CLOSE_SYNCED or not body.endswith(b"\0"):
        raise ProtocolError("a write-back call is an op and four NUL-ended fields")
    fields = body[1:-1].split(b"\0")
    if len(fields) != 4:
        raise ProtocolError(f"a write-back call has 4 fields, not {len(fields)}")
    path, path2 = (f.decode("utf-8", "surrogateescape") for f in fields[:2])
    try:
        n1, n2 = int(fields[2]), int(fields[3])
    except ValueError:
        raise ProtocolError("a write-back call's numbers are decimal") from None
    for p in (path, path2):
        if p and (not p.startswith("/") or "/../" in p + "/" or "/./" in p + "/"):
            raise ProtocolError(f"a write-back path is absolute and normal: {p!r}")
    return Call(body[0], path, path2, n1, n2)
