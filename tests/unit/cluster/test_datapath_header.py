"""monarch/native/datapath.h is the C side of the peer data path's contract with Python;
monarch/cluster/datapath.py is Python's. What a fetch answers, the limits, the counters' record
and every function Python calls (its ctypes prototype) must agree, and the built library must
export exactly what the header declares (as test_front_door_header.py holds the front door's).
A counter moved in the struct would mislabel the report silently: here it fails."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from monarch import routes
from monarch.cluster import datapath

HEADER = Path(datapath.__file__).parent.parent / "native" / "datapath.h"

_p = ctypes.POINTER
# the C types of the header's prototypes, as ctypes declares them
CTYPES = {
    "void": None, "int": ctypes.c_int, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "intptr_t": ctypes.c_ssize_t, "const char *": ctypes.c_char_p, "char *": ctypes.c_char_p,
    "int *": _p(ctypes.c_int), "const int *": _p(ctypes.c_int), "const char * const *": _p(ctypes.c_char_p),
    "const uint64_t *": _p(ctypes.c_uint64), "int64_t *": _p(ctypes.c_int64), "const int64_t *": _p(ctypes.c_int64),
    "uint32_t *": _p(ctypes.c_uint32), "const unsigned char *": ctypes.c_void_p,  # the index lent (dp_index)
    "struct dp_counts *": _p(datapath.Counts),
    # pointers Python passes as addresses: the path, a posted request, a callback and its argument
    "struct dp *": ctypes.c_void_p, "struct dp_request *": ctypes.c_void_p, "dp_reply_fn *": ctypes.c_void_p,
    "struct monarch_index_entry *": ctypes.c_void_p,  # an INDEX_ENTRY's bytes (a buffer of protocol.INDEX_ENTRY.size)
    "void *": ctypes.c_void_p,
}
FIELD_TYPES = {"uint64_t": ctypes.c_uint64}


def _ctype(decl: str, where: str, named: bool = True):
    """The ctypes type of a C declaration (``named``: a parameter, its name last)."""
    words = decl.replace("*", " * ").split()
    typ = " ".join(words[:-1] if named else words)
    assert typ in CTYPES, f"{where}: no ctypes type known for {decl!r}"
    return CTYPES[typ]


def _signature(ret: str, name: str, args: str) -> tuple:
    argtypes = [] if args.strip() in ("", "void") else [_ctype(a, name) for a in args.split(",")]
    return _ctype(ret, name, named=False), argtypes


def _value(text: str, where: str) -> int:
    """An X-macro's value: an integer, a shift of integers (``4 << 20``), or a threshold of the
    route table (``MONARCH_ONE_MESSAGE_MAX``: the wire header's, held by tests/unit/test_wire.py)."""
    text = re.sub(r"MONARCH_(\w+)", lambda m: str(getattr(routes, m.group(1))), text)
    assert re.fullmatch(r"[-\d\s<()]+", text), f"{where}: not a plain number: {text!r}"
    return int(eval(text, {"__builtins__": {}}))  # digits, '-', '<<' and parentheses only


def parse(text: str) -> dict:
    """What the header declares: answers, limits, the counters' fields, the prototypes (those
    spelled out, and those declared by a function type: ``EXPORT dp_fetch_fn dp_fetch;``)."""
    body = re.sub(r"/\*.*?\*/", "", text, flags=re.S).replace("\\\n", " ")

    def xmacro(name: str) -> list[tuple[str, str]]:
        m = re.search(rf"#define {name}\(X\)(.*?)(?=\n#|\n\n|\Z)", body, re.S)
        assert m, f"no X-macro {name}"
        return re.findall(r"X\((\w+),\s*([^)]*)\)", m.group(1))

    types = {name: _signature(ret, name, args)
             for ret, name, args in re.findall(r"typedef\s+([\w\s\*]+?)\s*\b(\w+_fn)\s*\(([^)]*)\)\s*;", body)}
    protos = {name: _signature(ret, name, args)
              for ret, name, args in re.findall(r"EXPORT\s+([\w\s\*]+?)\s*\b(\w+)\s*\(([^)]*)\)\s*;", body)}
    for typ, name in re.findall(r"EXPORT\s+(\w+_fn)\s+(\w+)\s*;", body):
        assert typ in types, f"{name}: no function type {typ}"
        protos[name] = types[typ]
    counts = re.search(r"struct dp_counts \{(.*?)\};", body, re.S).group(1)
    fields = [(n.strip(), FIELD_TYPES.get(typ)) for typ, names in re.findall(r"(\w+)\s+([\w\s,]+);", counts)
              for n in names.split(",")]
    return {
        "answers": [(n, _value(v, n)) for n, v in xmacro("DATAPATH_ANSWERS")],
        "limits": [(n, _value(v, n)) for n, v in xmacro("DATAPATH_LIMITS")],
        "counts": fields,
        "prototypes": protos,
        "types": types,
    }


def disagreements(c: dict, py=datapath) -> list[str]:
    """Where the header (parsed) and the Python module disagree; [] when they agree."""
    out = []
    for what in ("answers", "limits"):
        for name, value in c[what]:
            mine = getattr(py, name.removeprefix("DP_"), None)
            if mine != value:
                out.append(f"{what[:-1]} {name}: header {value}, Python {name.removeprefix('DP_')}={mine}")
    if c["counts"] != list(py.Counts._fields_):
        out.append(f"counters: header {c['counts']}, Python {py.Counts._fields_}")
    for name in sorted(set(c["prototypes"]) | set(py._PROTOTYPES)):
        if c["prototypes"].get(name) != py._PROTOTYPES.get(name):
            out.append(f"prototype {name}: header {c['prototypes'].get(name)}, Python {py._PROTOTYPES.get(name)}")
    return out


def test_python_agrees_with_the_datapath_header():
    c = parse(HEADER.read_text())
    assert [n for n, _ in c["answers"]][:2] == ["DP_HANDED_BACK", "DP_TIMEOUT"] and len(c["answers"]) == 8
    assert {"dp_fetch", "dp_post", "dp_take", "dp_counts", "dp_start"} <= set(c["prototypes"])
    assert len(c["counts"]) == 15
    assert disagreements(c) == []
    assert ctypes.sizeof(datapath.Counts) == 8 * 15  # the header's _Static_assert says the same of the struct


@pytest.mark.parametrize("change", [
    ("X(DP_TIMEOUT, -2)", "X(DP_TIMEOUT, -8)"),                                         # an answer's number
    ("X(DP_LOST, -7)", "X(DP_LOST, -7) X(DP_GONE, -8)"),                                # an answer Python lacks
    ("X(DP_BATCH_FILES_MAX, 64)", "X(DP_BATCH_FILES_MAX, 128)"),                        # a limit
    ("X(DP_ONE_MESSAGE_MAX, MONARCH_ONE_MESSAGE_MAX)", "X(DP_ONE_MESSAGE_MAX, 8 << 20)"),  # a limit not the table's
    ("uint64_t offered;", "uint64_t offers;"),                                          # a counter's name
    ("uint64_t mpi_errors;", "uint32_t mpi_errors;"),                                   # a counter's type
    ("uint64_t served_files, served_bytes;", "uint64_t served_bytes, served_files;"),   # counters' order
    ("uint64_t waits, idle_sleeps;", "uint64_t waits, idle_sleeps, kept;"),             # a counter Python lacks
    ("EXPORT void dp_lost(struct dp *d, int node);", "EXPORT void dp_lost(struct dp *d, int64_t node);"),
    ("EXPORT void dp_stop(struct dp *d);", ""),                                         # a function gone
    ("typedef int dp_test_fn(struct dp *d, struct dp_request *r);",
     "typedef int64_t dp_test_fn(struct dp *d, struct dp_request *r);"),                # a function type
    ("EXPORT dp_post_fn dp_post;", "EXPORT dp_fetch_fn dp_post;"),                      # a function's type
])
def test_a_disagreement_is_found(change):
    text = HEADER.read_text()
    assert change[0] in text
    assert disagreements(parse(text.replace(change[0], change[1]))) != []


def test_a_python_side_out_of_step_is_found():
    """The other way round: the header as it is, Python's side changed."""
    c = parse(HEADER.read_text())

    class Stale:
        pass
    for name in dir(datapath):
        setattr(Stale, name, getattr(datapath, name))
    Stale.HANDED_BACK = -8
    assert any("DP_HANDED_BACK" in d for d in disagreements(c, Stale))
    Stale.HANDED_BACK = datapath.HANDED_BACK

    class Swapped(ctypes.Structure):
        _fields_ = [datapath.Counts._fields_[1], datapath.Counts._fields_[0], *datapath.Counts._fields_[2:]]
    Stale.Counts = Swapped
    assert any("counters" in d for d in disagreements(c, Stale))


def test_the_door_uses_the_datapath_types():
    """The front door calls the functions Python hands it through the header's types (no cast
    from ``void *``), and its batches keep to the path's limits."""
    door = Path(datapath.__file__).parents[1] / "frontdoor"
    text = "".join(p.read_text() for p in sorted(door.glob("*.[ch]")))
    assert '#include "../native/datapath.h"' in (door / "front_door.h").read_text()
    assert re.search(r"\(\s*dp_\w+_fn\s*\*\s*\)", text) is None  # no cast to a function type
    assert re.search(r"typedef[^;]*\(\s*\*\s*peer_\w+_fn\)", text) is None  # no copy of the types
    peers = re.search(r"EXPORT int front_door_peers\(([^)]*)\)", (door / "front_door.h").read_text()).group(1)
    assert "void *" not in peers
    ahead = (door / "door_peer_ahead.h").read_text()  # the lane's limits, declared in its header
    assert re.search(r"#define PA_BATCH DP_BATCH_FILES_MAX\b", ahead) and "DP_BATCH_BYTES_MAX" in ahead


def _exports() -> set[str] | None:
    """The functions the built library exports, or None if it cannot be built here (no MPI)."""
    nm = shutil.which("nm")
    code = ("from mpi4py import MPI\nfrom monarch.cluster import datapath\n"
            "lib = datapath.library()\nprint(lib._name if lib else '')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    name = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
    if not nm or not name:
        return None
    out = subprocess.run([nm, "-D", "--defined-only", name], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}


def test_the_library_exports_exactly_what_the_header_declares():
    exported = _exports()
    if exported is None:
        pytest.skip("the data path cannot be built here (no MPI, no compiler or no nm)")
    assert exported == set(parse(HEADER.read_text())["prototypes"])
