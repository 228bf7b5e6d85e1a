"""monarch/routes.py is the route table; the wire header's MONARCH_ROUTES X-macro is its C half,
read by the shim and the door. The two lists must be the same rows (name, value, sizes) in the
same order; route_of must pick the route each layer served before the table (a small file: the
door, else a whole copy; a large one: blocks, on every node of a cluster, a whole copy beside a
store; another node's: the peer lane or Python's fetch); a route added is one row in each language, its
rule, and one case per layer (``test_a_route_is_added_as_a_row_and_a_rule``)."""

from __future__ import annotations

import enum
import re
import subprocess
from pathlib import Path

import pytest

from monarch import protocol, routes
from monarch.routes import BLOCKS_MIN, INLINE_MAX, RANGES_MIN, ROWS, FileFacts, NodeFacts, Route, Row, route_of

WIRE = Path(protocol.__file__).parent / "wire" / "monarch_wire.h"
THRESHOLDS = {f"MONARCH_{n}": getattr(routes, n) for n in ("INLINE_MAX", "BLOCKS_MIN", "SIZE_ANY")}


def c_rows(text: str) -> list[tuple[str, int, int, int]]:
    """The header's MONARCH_ROUTES rows: (name without MONARCH_ROUTE_, value, smallest, largest)."""
    body = re.sub(r"/\*.*?\*/", "", text, flags=re.S).replace("\\\n", " ")
    m = re.search(r"#define MONARCH_ROUTES\(X\)(.*?)(?=\n#|\Z)", body, re.S)
    assert m, "no X-macro MONARCH_ROUTES in the wire header"

    def size(expr: str) -> int:
        expr = expr.strip()
        assert expr in THRESHOLDS or re.fullmatch(r"\d+", expr), f"a row's size is a threshold or a number: {expr!r}"
        return THRESHOLDS[expr] if expr in THRESHOLDS else int(expr)
    return [(name, int(value), size(lo), size(hi))
            for name, value, lo, hi in re.findall(r"X\(MONARCH_ROUTE_(\w+),\s*(\d+),\s*([^,]+),\s*([^)]+)\)", m.group(1))]


def py_rows(rows=ROWS) -> list[tuple[str, int, int, int]]:
    return [(r.route.name, int(r.route), r.min_size, r.max_size) for r in rows.values()]


def disagreements(c: list, py: list) -> list[str]:
    """Where the header's rows and Python's disagree; [] when they agree."""
    out = [f"row {i}: header {a}, Python {b}" for i, (a, b) in enumerate(zip(c, py)) if a != b]
    if len(c) != len(py):
        out.append(f"rows: {len(c)} in the header, {len(py)} in Python")
    return out


def test_the_header_and_python_declare_the_same_routes_in_the_same_order():
    c = c_rows(WIRE.read_text())
    assert [name for name, *_ in c][:4] == ["PROBE", "PEER_LANE", "BLOCKS", "PEER"] and len(c) == len(Route) == 8
    assert disagreements(c, py_rows()) == []
    assert [r.route for r in ROWS.values()] == sorted(Route)  # the table's order is the values' order


@pytest.mark.parametrize("change", [
    ("X(MONARCH_ROUTE_DOOR, 6, 0, MONARCH_INLINE_MAX)", "X(MONARCH_ROUTE_DOOR, 6, 0, MONARCH_BLOCKS_MIN)"),  # a size
    ("X(MONARCH_ROUTE_BLOCKS, 2,", "X(MONARCH_ROUTE_BLOCKS, 9,"),                                             # a value
    ("X(MONARCH_ROUTE_STORE, 5,", "X(MONARCH_ROUTE_STOR, 5,"),                                                # a name
    ("    X(MONARCH_ROUTE_PFS, 4, 0, MONARCH_SIZE_ANY)", ""),                                                   # a row gone
])
def test_a_header_out_of_step_is_found(change):
    text = WIRE.read_text()
    assert change[0] in text
    assert disagreements(c_rows(text.replace(*change)), py_rows()) != []


def test_a_python_table_out_of_step_is_found():
    c = c_rows(WIRE.read_text())
    swapped = dict(ROWS)
    swapped[Route.DOOR] = Row(Route.DOOR, 0, RANGES_MIN, "a wider door")
    assert disagreements(c, py_rows(swapped)) == ["row 6: header ('DOOR', 6, 0, 262144), Python ('DOOR', 6, 0, 33554432)"]
    assert disagreements(c, py_rows({r: ROWS[r] for r in list(ROWS)[:-1]})) == ["rows: 8 in the header, 7 in Python"]


def test_the_c_rows_fit_the_sizes_pythons_fit(tmp_path):
    """The header's ``monarch_route_fits`` (the door's size test) answers as ``Row.fits`` does."""
    sizes = [0, 1, INLINE_MAX, INLINE_MAX + 1, BLOCKS_MIN - 1, BLOCKS_MIN, 1 << 40]
    checks = "".join(f"    printf(\"%d\", monarch_route_fits({int(r)}, {s}ULL));\n" for r in Route for s in sizes)
    src = tmp_path / "fits.c"
    src.write_text(f'#include <stdio.h>\n#include "{WIRE}"\nint main(void) {{\n{checks}    return 0;\n}}\n')
    exe = tmp_path / "fits"
    r = subprocess.run(["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    want = "".join(str(int(ROWS[route].fits(s))) for route in Route for s in sizes)
    assert subprocess.run([str(exe)], capture_output=True, text=True).stdout == want


ALONE = NodeFacts()
ALONE_DOOR = NodeFacts(door=True)
SHARDED_C = NodeFacts(door=True, c_data_path=True, cluster=True)
small, large, huge = FileFacts(size=100 << 10), FileFacts(size=4 << 20), FileFacts(size=BLOCKS_MIN)


@pytest.mark.parametrize("file, node, route", [
    (small, ALONE_DOOR, Route.DOOR),                                          # the door copies it, in C
    (FileFacts(size=INLINE_MAX), ALONE_DOOR, Route.DOOR),                     # the threshold is the door's
    (FileFacts(size=INLINE_MAX + 1), ALONE_DOOR, Route.COPY),                 # one byte more: the stager's
    (small, ALONE, Route.COPY),                                               # no door: the stager
    (large, ALONE_DOOR, Route.COPY),
    (FileFacts(size=BLOCKS_MIN - 1), ALONE, Route.COPY),
    (huge, ALONE, Route.BLOCKS),                                              # staged by blocks
    (huge, NodeFacts(cluster=True), Route.BLOCKS),                            # a cluster's daemons: by blocks too
    (FileFacts(size=BLOCKS_MIN, elsewhere=True), SHARDED_C, Route.BLOCKS),    # hashed elsewhere: by ranges
    (huge, NodeFacts(copies_misses=False), Route.PFS),                        # policy off: nothing staged
    (huge, NodeFacts(stores=True), Route.COPY),                               # beside a store: whole
    (huge, NodeFacts(raw_tier=False), Route.COPY),                            # no raw tier to write blocks in
    (FileFacts(size=BLOCKS_MIN, regular=False), ALONE, Route.COPY),           # not a regular file
    (FileFacts(size=10, regular=False), ALONE_DOOR, Route.COPY),              # nor for the door
    (FileFacts(size=10, elsewhere=True), SHARDED_C, Route.PEER_LANE),         # another node's, small: the lane
    (FileFacts(size=INLINE_MAX + 1, elsewhere=True), SHARDED_C, Route.PEER),  # larger: Python's fetch
    (FileFacts(size=10, elsewhere=True), NodeFacts(cluster=True), Route.PEER),  # no C data path
    (FileFacts(size=10, elsewhere=True), NodeFacts(copies_misses=False), Route.PEER),  # owned elsewhere first
    (small, NodeFacts(copies_misses=False, door=True), Route.PFS),            # policy off
    (FileFacts(size=10, store=True), ALONE_DOOR, Route.STORE),                # a store's value
])
def test_route_of_picks_the_route_each_layer_served_before(file, node, route):
    assert route_of(file, node) is route


def test_a_route_is_added_as_a_row_and_a_rule():
    """A store's large value staged by ranged reads (the store's blocks) as the next route would
    be: one X line in the header, one row and one rule here, in the order it is tried; route_of
    needs no change, and the lists stay equal only with both lines."""
    header_line = "    X(MONARCH_ROUTE_STORE_BLOCKS, 8, MONARCH_BLOCKS_MIN, MONARCH_SIZE_ANY) /* a store's, by ranges */ \\\n"
    text = WIRE.read_text()
    anchor = "    X(MONARCH_ROUTE_STORE, 5,"
    added_c = text.replace(anchor, header_line + anchor)
    Added = enum.IntEnum("Route", [(r.name, int(r)) for r in Route] + [("STORE_BLOCKS", 8)])
    rows = {Added(int(r)): Row(Added(int(r)), row.min_size, row.max_size, row.serves) for r, row in ROWS.items()}
    rules = {Added(int(r)): rule for r, rule in routes._RULES.items()}
    order = [r for r in rows if int(r) < int(Added.STORE)] + [Added.STORE_BLOCKS] + \
        [r for r in rows if int(r) >= int(Added.STORE)]
    rows[Added.STORE_BLOCKS] = Row(Added.STORE_BLOCKS, BLOCKS_MIN, routes.SIZE_ANY, "a store's value, by ranges")
    rules[Added.STORE_BLOCKS] = lambda f, n: f.store and f.regular
    rows = {r: rows[r] for r in order}

    assert disagreements(c_rows(added_c), py_rows(rows)) == []                 # both lines: equal
    assert disagreements(c_rows(added_c), py_rows()) != []                     # the header's alone: found
    assert disagreements(c_rows(text), py_rows(rows)) != []                    # Python's alone: found
    large_value, node = FileFacts(size=BLOCKS_MIN, store=True), NodeFacts(stores=True)
    assert route_of(large_value, node, rows=rows, rules=rules) is Added.STORE_BLOCKS
    assert route_of(large_value, node) is Route.STORE                          # before the row: copied whole
    assert route_of(FileFacts(size=10, store=True), node, rows=rows, rules=rules) is Added.STORE


class Owner:
    """A cluster's owners as the stager's ``peers`` see them: another node owns ``elsewhere``."""

    def __init__(self, elsewhere):
        self.elsewhere = set(elsewhere)

    def owns_elsewhere(self, key):
        return key in self.elsewhere


@pytest.mark.parametrize("facts", [{}, {"door": True}, {"copies_misses": False}, {"door": True, "cluster": True}])
def test_the_stager_reads_the_route_the_index_publishes(tmp_path, facts):
    """Decided once per file: the stager's books answer, for every file, the route the index the
    daemon writes from them publishes (the shim's and the door's); only the owner is decided after."""
    from monarch.config import TierConfig
    from monarch.node.snapshot.indextable import IndexTable
    from monarch.node.snapshot.snapshot import take_snapshot
    from monarch.node.stage.stager import Stager
    from monarch.node.tiers.tiers import Tier

    sizes = {"tiny": 10, "inline": INLINE_MAX, "past_inline": INLINE_MAX + 1, "below_blocks": BLOCKS_MIN - 1,
             "blocks": BLOCKS_MIN}
    for root in ("a", "b"):
        (tmp_path / root).mkdir()
        for name, size in sizes.items():
            with open(tmp_path / root / name, "wb") as f:
                f.truncate(size)  # sparse: the size is what routes
    (tmp_path / "t").mkdir()
    tier = Tier.from_config(TierConfig("ram", str(tmp_path / "t"), 1 << 30), 2, "r1", 0, ())
    snap = take_snapshot((str(tmp_path / "a"), str(tmp_path / "b")))
    stager = Stager(snap, [tier], 1, **facts)
    try:
        table = IndexTable(bytearray(snap.index_bytes(stager.routes)), len(snap.files))
        published = {table.key(n): table.route(n) for n in range(table.nfiles)}
        assert published == {key: stager.route(key, info) for key, info in snap.files.items()}
        assert published["0/tiny"] is (Route.PFS if facts.get("copies_misses") is False else
                                       Route.DOOR if facts.get("door") else Route.COPY)
        assert published["1/blocks"] is (Route.PFS if facts.get("copies_misses") is False else Route.BLOCKS)
        stager.peers = Owner({"0/tiny", "0/blocks"})  # the owners, known after the index
        assert stager.route("0/tiny", snap.get("0/tiny")) is Route.PEER
        assert stager.route("0/blocks", snap.get("0/blocks")) is \
            (Route.BLOCKS if published["0/blocks"] is Route.BLOCKS else Route.PEER)  # by blocks: every node's
        assert stager.route("1/tiny", snap.get("1/tiny")) is published["1/tiny"]
    finally:
        stager.peers = None
        stager.shutdown()
