"""monarch/routes.py is the route table; the wire header's MONARCH_ROUTES X-macro is its C half,
read by the shim and the door. The two lists must be the same rows (name, value, sizes) in the
same order; route_of must pick the route each layer served before the table (a small file: the
door, else a whole copy; a large one: blocks, on every node of a cluster, a whole copy beside a
store; another node's: the peer lane or Python's fetch; a write-back create: the shim's area, before
all); a route added is one row in each language, its rule, and one case per layer
(``test_a_route_is_added_as_a_row_and_a_rule``)."""

from __future__ import annotations

import enum
import re
import subprocess
from pathlib import Path

import pytest

from monarch import protocol, routes
from monarch.routes import (BLOCKS_MIN, INLINE_MAX, RANGES_MIN, ROWS, FileFacts, NodeFacts, Route, Row, published,
                            route_of, size_steps)

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
    assert [name for name, *_ in c][:5] == ["WRITEBACK", "PROBE", "PEER_LANE", "BLOCKS", "PEER"]
    assert len(c) == len(Route) == 9
    assert disagreements(c, py_rows()) == []
    # the table's order is the values' order but for WRITEBACK: tried first, valued after the
    # routes the index already published (their bits never renumbered)
    assert [r.route for r in ROWS.values()] == [Route.WRITEBACK] + sorted(set(Route) - {Route.WRITEBACK})
    assert max(Route) + 1 <= protocol.INDEX_ROUTE_MASK >> protocol.INDEX_ROUTE_SHIFT  # every value fits the bits


@pytest.mark.parametrize("change", [
    ("X(MONARCH_ROUTE_DOOR, 6, 0, MONARCH_INLINE_MAX)", "X(MONARCH_ROUTE_DOOR, 6, 0, MONARCH_BLOCKS_MIN)"),  # a size
    ("X(MONARCH_ROUTE_BLOCKS, 2,", "X(MONARCH_ROUTE_BLOCKS, 9,"),                                             # a value
    ("X(MONARCH_ROUTE_STORE, 5,", "X(MONARCH_ROUTE_STOR, 5,"),                                                # a name
    ("    X(MONARCH_ROUTE_PFS, 4, 0, MONARCH_SIZE_ANY)", ""),                                                   # a row gone
    ("X(MONARCH_ROUTE_WRITEBACK, 8,", "X(MONARCH_ROUTE_WRITEBACK, 0,"),                                       # renumbered
])
def test_a_header_out_of_step_is_found(change):
    text = WIRE.read_text()
    assert change[0] in text
    assert disagreements(c_rows(text.replace(*change)), py_rows()) != []


def test_a_python_table_out_of_step_is_found():
    c = c_rows(WIRE.read_text())
    swapped = dict(ROWS)
    swapped[Route.DOOR] = Row(Route.DOOR, 0, RANGES_MIN, "a wider door")
    assert disagreements(c, py_rows(swapped)) == ["row 7: header ('DOOR', 6, 0, 262144), Python ('DOOR', 6, 0, 33554432)"]
    assert disagreements(c, py_rows({r: ROWS[r] for r in list(ROWS)[:-1]})) == ["rows: 9 in the header, 8 in Python"]
    moved = {r: ROWS[r] for r in [*list(ROWS)[1:], Route.WRITEBACK]}  # WRITEBACK tried last: out of order
    assert disagreements(c, py_rows(moved))[0] == "row 0: header ('WRITEBACK', 8, 0, 18446744073709551615), " \
                                                  "Python ('PROBE', 0, 0, 18446744073709551615)"


def test_a_route_past_the_index_bits_does_not_compile(tmp_path):
    """Each row's value + 1 must fit an index entry's route bits: the header asserts it per row."""
    def compiles(text: str) -> bool:
        (tmp_path / "wire.h").write_text(text)
        (tmp_path / "main.c").write_text('#include "wire.h"\nint main(void) { return 0; }\n')
        return subprocess.run(["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-c", str(tmp_path / "main.c"),
                               "-o", str(tmp_path / "main.o")], capture_output=True).returncode == 0
    text = WIRE.read_text()
    assert compiles(text)
    assert not compiles(text.replace("X(MONARCH_ROUTE_WRITEBACK, 8,", "X(MONARCH_ROUTE_WRITEBACK, 15,"))


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
    (FileFacts(size=10, writeback=True), ALONE_DOOR, Route.WRITEBACK),        # a write-back create: not the door's
    (FileFacts(size=BLOCKS_MIN, writeback=True), ALONE, Route.WRITEBACK),     # nor by blocks
    (FileFacts(size=10, writeback=True, elsewhere=True), SHARDED_C, Route.WRITEBACK),  # nor another node's
    (FileFacts(size=10, writeback=True), NodeFacts(copies_misses=False), Route.WRITEBACK),  # policy off: still
])
def test_route_of_picks_the_route_each_layer_served_before(file, node, route):
    assert route_of(file, node) is route


NODES = [NodeFacts(**kw) for kw in ({}, {"door": True}, {"copies_misses": False}, {"stores": True},
                                    {"raw_tier": False}, {"door": True, "c_data_path": True, "cluster": True})]


@pytest.mark.parametrize("node", NODES)
def test_the_steps_published_are_those_of_the_table_without_writeback(node):
    """WRITEBACK is a fact of the open: the steps (what the index publishes, what the stager's
    books read) are the table's without its row, and never name it."""
    rows = {r: row for r, row in ROWS.items() if r is not Route.WRITEBACK}
    for kw in ({}, {"store": True}, {"elsewhere": True}):
        steps = size_steps(node, **kw)
        assert Route.WRITEBACK not in [r for _, r in steps]
        assert [r for _, r in steps] == [route_of(FileFacts(size=s, **kw), node, rows=rows) for s, _ in steps]
    assert published(node, 2, {1}) == (size_steps(node), size_steps(node, store=True))
    assert {r for steps in published(node, 1, elsewhere=True) for _, r in steps} <= set(Route) - {Route.WRITEBACK}


def test_the_size_decisions_are_their_rows():
    """The named size decisions the layers make (the door's and the asker's inline copy, blocks,
    ranges) answer as the rows and thresholds they name, at every edge."""
    for size in (0, 1, INLINE_MAX, INLINE_MAX + 1, BLOCKS_MIN - 1, BLOCKS_MIN, RANGES_MIN - 1, RANGES_MIN, 1 << 40):
        assert routes.copied_inline(size) is ROWS[Route.DOOR].fits(size) is ROWS[Route.PEER_LANE].fits(size)
        assert routes.staged_by_blocks(size) is ROWS[Route.BLOCKS].fits(size)
        assert routes.read_in_ranges(size) is (size >= RANGES_MIN)
    assert routes.copied_inline(INLINE_MAX) and not routes.copied_inline(INLINE_MAX + 1)
    assert routes.staged_by_blocks(BLOCKS_MIN) and not routes.staged_by_blocks(BLOCKS_MIN - 1)
    assert routes.read_in_ranges(RANGES_MIN) and not routes.read_in_ranges(RANGES_MIN - 1)


def test_a_route_is_added_as_a_row_and_a_rule():
    """A store's large value staged by ranged reads (the store's blocks) as the next route would
    be: one X line in the header, one row and one rule here, in the order it is tried; route_of
    needs no change, and the lists stay equal only with both lines."""
    header_line = "    X(MONARCH_ROUTE_STORE_BLOCKS, 9, MONARCH_BLOCKS_MIN, MONARCH_SIZE_ANY) /* a store's, by ranges */ \\\n"
    text = WIRE.read_text()
    anchor = "    X(MONARCH_ROUTE_STORE, 5,"
    added_c = text.replace(anchor, header_line + anchor)
    Added = enum.IntEnum("Route", [(r.name, int(r)) for r in Route] + [("STORE_BLOCKS", 9)])
    rows = {Added(int(r)): Row(Added(int(r)), row.min_size, row.max_size, row.serves) for r, row in ROWS.items()}
    rules = {Added(int(r)): rule for r, rule in routes._RULES.items()}
    order = list(rows)
    order.insert(order.index(Added.STORE), Added.STORE_BLOCKS)  # tried before STORE: it narrows it
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
