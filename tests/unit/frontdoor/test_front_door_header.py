"""monarch/frontdoor/front_door.h is the C side of the front door's contract with Python;
monarch/frontdoor/__init__.py is Python's. Every function Python calls (its ctypes prototype),
every event, hand-over reason, lane ending and in-flight phase, the event record and the
counters' and states' records (read by name: ctypes Structures) must agree, and the built
library must export exactly what the header declares (as tests/unit/test_wire.py holds the
wire). A reordered R_* or counter would mislabel the report silently: here it fails."""

from __future__ import annotations

import ctypes
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from monarch import frontdoor, protocol

HEADER = Path(frontdoor.__file__).with_name("front_door.h")

# the C types of the header's prototypes, as ctypes declares them
CTYPES = {
    "void": None, "int": ctypes.c_int, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "uint32_t": ctypes.c_uint32, "double": ctypes.c_double,
    "const char *": ctypes.c_char_p, "char *": ctypes.c_char_p,
    "int *": ctypes.POINTER(ctypes.c_int), "uint64_t *": ctypes.POINTER(ctypes.c_uint64),
    "double *": ctypes.POINTER(ctypes.c_double),
    # pointers Python passes as addresses: the door, a measure, its own arrays and callbacks
    "struct door *": ctypes.c_void_p, "struct inflight *": ctypes.c_void_p,
    "const struct inflight *": ctypes.c_void_p, "void *": ctypes.c_void_p,
    "const unsigned char *": ctypes.c_void_p, "const int16_t *": ctypes.c_void_p,
    "const uint32_t *": ctypes.c_void_p, "const uint64_t *": ctypes.c_void_p, "const uint8_t *": ctypes.c_void_p,
    "const int *": ctypes.c_void_p,
    # the counters' records, read by name
    "struct front_door_counts *": ctypes.POINTER(frontdoor.DoorCounts),
    "struct front_door_read_ahead_state *": ctypes.POINTER(frontdoor.ReadAheadState),
    "struct front_door_peer_told *": ctypes.POINTER(frontdoor.PeerTold),
    "struct front_door_peer_ahead_state *": ctypes.POINTER(frontdoor.PeerAheadState),
    "struct inflight_state *": ctypes.POINTER(frontdoor.InflightState),
    "struct front_door_inflight *": ctypes.POINTER(frontdoor.DoorInflight),
    # the peer data path's functions and its handle (monarch/native/datapath.h), as addresses
    "struct dp *": ctypes.c_void_p, "dp_fetch_fn *": ctypes.c_void_p, "dp_staged_fn *": ctypes.c_void_p,
    "dp_fetch_many_fn *": ctypes.c_void_p, "dp_fetch_pages_fn *": ctypes.c_void_p, "dp_describe_fn *": ctypes.c_void_p, "dp_take_wanted_fn *": ctypes.c_void_p, "dp_post_fn *": ctypes.c_void_p, "dp_test_fn *": ctypes.c_void_p,
    "dp_take_fn *": ctypes.c_void_p,
}
FORMAT_OF = {"uint32_t": "I", "int32_t": "i", "uint64_t": "Q", "int64_t": "q"}
FIELD_TYPES = {"uint64_t": ctypes.c_uint64, "double": ctypes.c_double,
               "struct inflight_state": frontdoor.InflightState}  # a record inside another
# the counters' records: the header's struct, Python's Structure
RECORDS = {"front_door_counts": "DoorCounts", "front_door_read_ahead_state": "ReadAheadState",
           "front_door_peer_told": "PeerTold", "front_door_peer_ahead_state": "PeerAheadState",
           "inflight_state": "InflightState", "front_door_inflight": "DoorInflight"}


def _ctype(decl: str, where: str, named: bool = True):
    """The ctypes type of a C declaration (``named``: a parameter, its name last)."""
    words = decl.replace("*", " * ").split()
    typ = " ".join(words[:-1] if named else words)
    assert typ in CTYPES, f"{where}: no ctypes type known for {decl!r}"
    return CTYPES[typ]


def parse(text: str) -> dict:
    """What the header declares: prototypes, events, books, reasons, lane endings, the record."""
    body = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    body = body.replace("\\\n", " ")
    protos = {}
    for ret, name, args in re.findall(r"EXPORT\s+([\w\s\*]+?)\s*\b(\w+)\s*\(([^)]*)\)\s*;", body):
        argtypes = [] if args.strip() in ("", "void") else [_ctype(a, name) for a in args.split(",")]
        protos[name] = (_ctype(ret, name, named=False), argtypes)

    def xmacro(name: str) -> list[tuple[str, str]]:
        m = re.search(rf"#define {name}\(X\)(.*?)(?=\n#|\Z)", body, re.S)
        assert m, f"no X-macro {name}"
        return re.findall(r"X\((\w+),\s*([^)]*)\)", m.group(1))

    head = re.search(r"struct front_door_event_head \{(.*?)\};", body, re.S).group(1)
    fields = [(typ, n.strip()) for typ, names in re.findall(r"(\w+)\s+([\w\s,]+);", head) for n in names.split(",")]
    handed_over = [(n, v.strip().strip('"')) for n, v in xmacro("FRONT_DOOR_HANDED_OVER")]
    dims = {"MONARCH_MAX_SLOTS": protocol.MAX_SLOTS, "R_REASONS": len(handed_over)}  # test_wire holds MAX_SLOTS

    def record(name: str) -> list[tuple[str, type]]:
        """A struct of the header as ctypes fields: (name, type), an array's type for ``a[N]``."""
        m = re.search(rf"struct {name} \{{(.*?)\}};", body, re.S)
        assert m, f"no struct {name}"
        out = []
        for typ, names in re.findall(r"((?:struct\s+)?\w+)\s+([\w\s,\[\]]+);", m.group(1)):
            for n in names.split(","):
                field, dim = re.fullmatch(r"\s*(\w+)\s*(?:\[(\w+)\])?\s*", n).groups()
                t = FIELD_TYPES.get(typ)
                out.append((field, t * dims[dim] if dim and t else t))
        return out

    return {
        "prototypes": protos,
        "events": {n: int(v) for n, v in xmacro("FRONT_DOOR_EVENTS")},
        "books": [(n, int(v)) for n, v in xmacro("FRONT_DOOR_BOOKS")],
        "handed_over": handed_over,
        "ahead_ended": [(n, v.strip().strip('"')) for n, v in xmacro("FRONT_DOOR_AHEAD_ENDED")],
        "phases": [(n, v.strip().strip('"')) for n, v in xmacro("INFLIGHT_PHASES")],
        "event_format": re.search(r'#define FRONT_DOOR_EVENT_FORMAT "([^"]+)"', body).group(1),
        "event_fields": "<" + "".join(FORMAT_OF[typ] for typ, _ in fields),
        "records": {name: record(name) for name in RECORDS},
    }


def disagreements(c: dict, py=frontdoor) -> list[str]:
    """Where the header (parsed) and the Python module disagree; [] when they agree."""
    out = []
    for name in sorted(set(c["prototypes"]) | set(py._PROTOTYPES)):
        if c["prototypes"].get(name) != py._PROTOTYPES.get(name):
            out.append(f"prototype {name}: header {c['prototypes'].get(name)}, Python {py._PROTOTYPES.get(name)}")
    for name, value in c["events"].items():
        if getattr(py, name, None) != value:
            out.append(f"event {name}: header {value}, Python {getattr(py, name, None)}")
    if [v for _, v in c["books"]] != [py.BOOKS, py.PEER_BOOKS] or [n for n, _ in c["books"]] != ["Q_BOOKS", "Q_PEER"]:
        out.append(f"books: header {c['books']}, Python BOOKS={py.BOOKS}, PEER_BOOKS={py.PEER_BOOKS}")
    if tuple(text for _, text in c["handed_over"]) != py.HANDED_OVER_BECAUSE:
        out.append(f"hand-over reasons: header {c['handed_over']}, Python {py.HANDED_OVER_BECAUSE}")
    if tuple(text for _, text in c["ahead_ended"]) != py.AHEAD_ENDED_BECAUSE:
        out.append(f"lane endings: header {c['ahead_ended']}, Python {py.AHEAD_ENDED_BECAUSE}")
    if tuple(text for _, text in c["phases"]) != py.PHASES:
        out.append(f"in-flight phases: header {c['phases']}, Python {py.PHASES}")
    if not (c["event_format"] == c["event_fields"] == py._EVENT.format):
        out.append(f"event record: header {c['event_format']} (its struct {c['event_fields']}), Python {py._EVENT.format}")
    for name, fields in c["records"].items():
        mine = list(getattr(py, RECORDS[name])._fields_)
        if fields != mine:
            out.append(f"record {name}: header {fields}, Python {RECORDS[name]} {mine}")
    return out


def test_python_agrees_with_the_front_door_header():
    c = parse(HEADER.read_text())
    assert len(c["prototypes"]) >= 30 and c["events"]["EV_STAGED"] == 1
    assert [n for n, _ in c["handed_over"]][:2] == ["R_OTHER", "R_CLOSED_GATE"]
    assert disagreements(c) == []
    assert struct.calcsize(c["event_format"]) == 40  # the header's _Static_assert says the same of the struct
    assert [n for n, _ in c["records"]["front_door_counts"]][:2] == ["hits", "copies"]
    assert c["records"]["front_door_inflight"][0] == ("flow", frontdoor.InflightState)
    assert [n for n, _ in c["phases"]][0] == "P_START"
    # each record's size, as the header's _Static_asserts say: whole words
    counts = protocol.MAX_SLOTS + len(frontdoor.HANDED_OVER_BECAUSE) + 15
    sizes = {"DoorCounts": counts, "ReadAheadState": 5, "PeerTold": 3, "PeerAheadState": 18, "InflightState": 6,
             "DoorInflight": 8}
    assert {name: ctypes.sizeof(getattr(frontdoor, name)) // 8 for name in sizes} == sizes


@pytest.mark.parametrize("change", [
    ("X(R_CLOSED_GATE, \"snapshot_not_ready\")", "X(R_CLOSED_GATE, \"snapshot_not_ready_\")"),  # a name
    ("X(EV_AHEAD, 4)", "X(EV_AHEAD, 3)"),                                                       # an event's number
    ("X(A_NO_ROOM, \"no_room\")", "X(A_NO_ROOM, \"full\")"),                                    # a lane ending
    ("int64_t ns;", "uint64_t ns;"),                                                            # the record
    ("EXPORT int front_door_claim(struct door *d, const char *key, int len);",
     "EXPORT int front_door_claim(struct door *d, const char *key, int64_t len);"),            # a prototype
    ("EXPORT void front_door_settle(struct door *d);", ""),                                     # a function gone
    ("uint64_t accepted, reused;", "uint64_t reused, accepted;"),                               # counters' order
    ("uint64_t peer_waits;", "uint64_t peer_waits, peer_looks;"),                               # a counter Python lacks
    ("uint64_t hits[MONARCH_MAX_SLOTS];", "uint64_t hits[R_REASONS];"),                         # an array's length
    ("uint64_t bytes_read;", "int64_t bytes_read;"),                                            # a counter's type
    ("uint64_t stream, consumed;", "uint64_t consumed, stream;"),                               # the progress told
    ("uint64_t progress_answered;", "uint64_t answered;"),                                      # the lane's state
    ("uint64_t through, copies;", "uint64_t through, copied;"),                                 # the read-ahead's
    ("EXPORT void front_door_counts(struct door *d, struct front_door_counts *out);",
     "EXPORT void front_door_counts(struct door *d, uint64_t *out);"),                         # positions again
    ("EXPORT void front_door_inflight(struct door *d, struct front_door_inflight *out);",
     "EXPORT void front_door_inflight(struct door *d, double *out);"),                         # the door's flow
    ("EXPORT void inflight_state(const struct inflight *c, struct inflight_state *out);",
     "EXPORT void inflight_state(const struct inflight *c, double *out);"),                    # a lane's flow
    ("uint64_t limit, peak;", "uint64_t peak, limit;"),                                         # its figures' order
    ("double last_rate;", "uint64_t last_rate;"),                                               # a figure's type
    ("struct inflight_state flow;", "uint64_t flow;"),                                          # the record inside
    ("uint64_t copiers, in_flight;", "uint64_t in_flight, copiers;"),                           # the door's own
    ('X(P_UP, "up")', 'X(P_UP, "climb")'),                                                      # a phase's name
])
def test_a_disagreement_is_found(change):
    text = HEADER.read_text()
    assert change[0] in text
    assert disagreements(parse(text.replace(change[0], change[1]))) != []


def test_reordered_phases_are_found():
    text = HEADER.read_text()
    a, b = 'X(P_UP, "up")', 'X(P_DOWN, "down")'
    assert a in text and b in text
    swapped = text.replace(a, "@@").replace(b, a).replace("@@", b)
    assert any("phases" in d for d in disagreements(parse(swapped)))


def test_reordered_reasons_are_found():
    text = HEADER.read_text()
    a, b = '    X(R_NO_ROOM, "no_room_lent")', '    X(R_COPY_FAILED, "copy_failed")'
    assert a in text and b in text
    swapped = text.replace(a, "@@").replace(b, a).replace("@@", b)
    assert any("hand-over" in d for d in disagreements(parse(swapped)))


@pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")
def test_the_library_exports_exactly_what_the_header_declares():
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm not installed")
    lib = frontdoor.library()
    out = subprocess.run([nm, "-D", "--defined-only", lib._name], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
    assert exported == set(parse(HEADER.read_text())["prototypes"])


@pytest.mark.skipif(frontdoor.library() is None, reason="the front door cannot be built here")
def test_a_lanes_state_is_read_by_name_from_the_library():
    """The C rule's state as Python reads it: a fresh measure, one generation later, a fixed one."""
    lib = frontdoor.library()
    flow = frontdoor.Flow(lib, None, 8, 4, 64)
    assert flow.state() == {"limit": 8, "peak": 8, "windows_judged": 0, "phase": "slow_start",
                            "mean_copy_seconds": None, "last_rate": 0.0}
    for i in range(8):  # one generation at a flat latency: the slow start doubles
        flow.completed(0.25, 1.0 + i / 100)
    assert flow.state() == {"limit": 16, "peak": 16, "windows_judged": 0, "phase": "slow_start",
                            "mean_copy_seconds": 0.25, "last_rate": 0.0}
    assert frontdoor.Flow(lib, 5, 8, 4, 64).state()["phase"] == "settled"


def test_the_door_is_one_translation_unit_of_parts_under_850_lines():
    here = HEADER.parent
    text = (here / "front_door.c").read_text()
    parts = re.findall(r'^#include "((?:door_\w+|inflight)\.c)"', text, re.M)
    assert sorted(parts) == sorted(p.name for p in here.glob("*.c") if p.name != "front_door.c")
    assert '#include "front_door.h"' in text


def test_a_python_record_out_of_step_is_found():
    """The other way round: the header as it is, a Structure of Python's changed."""
    c = parse(HEADER.read_text())
    fields = frontdoor.DoorCounts._fields_

    class Swapped(ctypes.Structure):
        _fields_ = [fields[0], fields[2], fields[1], *fields[3:]]
    stale = type("Stale", (), {**vars(frontdoor), "DoorCounts": Swapped})
    assert [d for d in disagreements(c, stale) if d.startswith("record front_door_counts")]
