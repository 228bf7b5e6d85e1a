"""How an open is served: one table of routes, the size thresholds that pick them, and the one
function (``route_of``) that decides a file's route from the file's facts and the node's.

The twin of ``node/stage/read_ahead_modes.py`` (who reads ahead, by mode): that table says which
lanes run on a node; this one says which of them serves one file. Its C half is the wire
header's ``MONARCH_ROUTES`` X-macro and its ``MONARCH_*_MIN``/``_MAX`` thresholds
(``wire/monarch_wire.h``): the shim and the door read the same rows, and
``tests/unit/test_routes.py`` holds the two equal (rows, values, sizes, thresholds).

A row is a route, in the order ``route_of`` tries them (the first whose rule holds serves):

=============  =========================================================================  ===========
route          who serves it                                                             sizes
=============  =========================================================================  ===========
``WRITEBACK``  a file under a write-back path opened to create or truncate it for            any
               writing: made in the run's write-back area by the shim
               (``shim/shim_writeback.c``), drained to the PFS by ``node/writeback.py``
               (docs/consistency.md, "Write-back"). A fact of the open (its flags), never
               published
``PROBE``      a staged copy in a tier: the shim opens it itself (every layer looks          any
               here before the rows below: whether a copy is staged is the one fact
               that changes by the open)
``PEER_LANE``  another node's small file, fetched by the door through the C data path        <= INLINE_MAX
``BLOCKS``     staged by blocks (``stage/blocks.py``); the shim reads the PFS meanwhile      >= BLOCKS_MIN
               (``shim/shim_blocks.c``). In a cluster on every node: each block's range has
               an owner (``cluster/ranges.py``) that reads it from the PFS, the others fetch
               it from that owner
``PEER``       another node's file, fetched by Python (``cluster/fetch.py``: the C data      any
               path up to ONE_MESSAGE_MAX, the chunked protocol above)
``PFS``        the original, opened by the application: nothing copies it (policy off)       any
``STORE``      a key-value store's value, copied whole by the stager                         any
``DOOR``       copied by the C door: inline by the worker that read the OPEN (a fast         <= INLINE_MAX
               source) or by its copiers (a slow one: the measured latency picks, at the
               open)
``COPY``       copied whole by the Python stager (by the asker itself up to INLINE_MAX       any
               from a fast source; in ranges, by several threads, from RANGES_MIN)
=============  =========================================================================  ===========

Each layer switches on the route: the shim (a write-back create asks the daemon before any
probe: ``shim/shim_wrappers.c``' open body, ``monarch_wb_open``), the resolver (answer by
blocks, or stage), the stager's copy (blocks, a peer, the PFS), the door (its copy:
``frontdoor/door_loop.c``, from the route the index publishes; its peer lane: ``door_peer.c``,
the row's size through ``monarch_route_fits`` and the owners), the shim (a file's staged blocks
read only where the index routes it to ``BLOCKS``: ``shim/shim_open.c``). Only dynamic facts
stay with the layers: a copy staged, an owner, room, leases, claims, a source's measured latency.
The size decisions beside a route are named here too (``copied_inline``, ``staged_by_blocks``,
``read_in_ranges``): no layer compares a file's size with a threshold itself.

Decided once per file, read by every layer (``WRITEBACK`` aside: a fact of the open, not of the
file, so ``size_steps`` never meets it and the index never publishes it). The stager's books
(``node/stage/stager_books.py``) decide each root's routes by size once, when the stager is made,
on the node's facts (``published``: each root's ``size_steps``, ``route_of`` at every size where
a row begins or ends); from then on a file's route is ``stepped`` (its root's steps at its size),
a table look-up:

- the daemon publishes those same steps in the snapshot index, in each file's entry's flags
  (``protocol.INDEX_ROUTE_MASK``: ``node/snapshot/index_writer.py``, or C's ``walker.c`` for an
  index made before); the shim (``shim/shim_open.c``) and the door (``frontdoor/door_loop.c``)
  read the entry's bits;
- the resolver (``node/resolver.py``: answer by blocks), the stager (``stager.py``: copy inline;
  ``stager_copy.py``: blocks, a peer, the PFS; ``stager_schedule.py``: a copy from the owner) and
  the block stager (``stage/blocks.py``) read the same steps through ``StagerBooks.route``.

The owner is never published: on a sharded cluster the owners arrive after the index is written,
so ``PEER`` and ``PEER_LANE`` are decided where the owners are, over the published local route:
the door's ``peer_owner_locked`` (the row's size through ``monarch_route_fits``), the stager's
``peers`` (``owns_elsewhere``, then the steps of another node's file, decided once beside the
node's own).

A new route is a row here and in the header's X-macro, its rule in ``_RULES``, and one case in
each layer that serves it (``tests/unit/test_routes.py`` adds one, to show the diff).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

__all__ = ["Route", "Row", "ROWS", "FileFacts", "NodeFacts", "route_of", "size_steps", "stepped", "published",
           "copied_inline", "staged_by_blocks", "read_in_ranges", "INLINE_MAX", "BLOCKS_MIN", "RANGES_MIN",
           "ONE_MESSAGE_MAX", "SIZE_ANY"]

# the size thresholds that pick a route, declared once (the header's MONARCH_* of the same names)
INLINE_MAX = 256 << 10       # a file this small is copied by the door or by its asker: no thread hand-off
BLOCKS_MIN = 16 << 20        # a file this large is staged by blocks: a whole copy of one would keep an open waiting
RANGES_MIN = 32 << 20        # a whole copy of a file this large is read in ranges, by several threads
ONE_MESSAGE_MAX = 4 << 20    # another node's file this small crosses the C data path in one message
SIZE_ANY = (1 << 64) - 1     # no upper bound


class Route(enum.IntEnum):
    """The routes, valued as the header's ``enum monarch_route``."""

    PROBE = 0
    PEER_LANE = 1
    BLOCKS = 2
    PEER = 3
    PFS = 4
    STORE = 5
    DOOR = 6
    COPY = 7
    WRITEBACK = 8  # tried first, valued last: the values above are the index's bits (never renumbered)


@dataclass(frozen=True)
class FileFacts:
    """What a route depends on of one file (all in the snapshot, or in the placement)."""

    size: int
    regular: bool = True     # a regular file (the snapshot's mode)
    elsewhere: bool = False  # another node owns it (sharded, or a replicating node's other files)
    store: bool = False      # under a root that is a key-value store (no PFS path behind it)
    writeback: bool = False  # under a write-back path, opened to create or truncate it for writing


@dataclass(frozen=True)
class NodeFacts:
    """What a route depends on of the node (fixed for a stager's life)."""

    copies_misses: bool = True  # the policy stages a miss (not ``off``: read_ahead_modes' copies_misses)
    door: bool = False          # the front door copies this node's misses (read_ahead_modes' door_copies)
    c_data_path: bool = False   # the door's peer lane fetches through the C data path
    cluster: bool = False       # one of a cluster's daemons
    stores: bool = False        # a root of the dataset is a key-value store (its values are copied whole)
    raw_tier: bool = True       # a tier keeps raw copies (blocks are written into one)


@dataclass(frozen=True)
class Row:
    """One route: what it is, the sizes it takes (inclusive), who serves it."""

    route: Route
    min_size: int
    max_size: int
    serves: str

    def fits(self, size: int) -> bool:
        return self.min_size <= size <= self.max_size


ROWS: dict[Route, Row] = {row.route: row for row in (
    #   route            smallest     largest      who serves it
    Row(Route.WRITEBACK, 0,           SIZE_ANY,    "the shim, in the run's write-back area (drained by the daemon)"),
    Row(Route.PROBE,     0,           SIZE_ANY,    "the shim, from a staged copy"),
    Row(Route.PEER_LANE, 0,           INLINE_MAX,  "the door, through the C data path"),
    Row(Route.BLOCKS,    BLOCKS_MIN,  SIZE_ANY,    "the block stager (a range's owner from the PFS, the others from it)"),
    Row(Route.PEER,      0,           SIZE_ANY,    "Python's fetch from the owner"),
    Row(Route.PFS,       0,           SIZE_ANY,    "the application's own open of the original"),
    Row(Route.STORE,     0,           SIZE_ANY,    "the stager, from the store"),
    Row(Route.DOOR,      0,           INLINE_MAX,  "the door: inline, or its copiers"),
    Row(Route.COPY,      0,           SIZE_ANY,    "the stager, a whole copy"),
)}

# each route's rule beside its size: does it serve this file on this node? (PROBE: a copy is
# staged, which only the layers know at the open: never chosen here)
_RULES: dict[Route, Callable[[FileFacts, NodeFacts], bool]] = {
    # first: the open replaces the file's bytes, so no staged copy of the old ones is probed, and
    # whoever owns the old file (PEER), the read policy (PFS) or its size (BLOCKS) does not matter
    Route.WRITEBACK: lambda f, n: f.writeback,
    Route.PROBE: lambda f, n: False,
    Route.PEER_LANE: lambda f, n: f.elsewhere and f.regular and n.door and n.c_data_path,
    # a large file is every node's, by ranges: not another node's (PEER), wherever it is hashed
    Route.BLOCKS: lambda f, n: f.regular and n.copies_misses and not (f.store or n.stores) and n.raw_tier,
    Route.PEER: lambda f, n: f.elsewhere,
    Route.PFS: lambda f, n: not n.copies_misses,
    Route.STORE: lambda f, n: f.store,
    Route.DOOR: lambda f, n: f.regular and n.door,
    Route.COPY: lambda f, n: True,
}


def allows(route: Route, node: NodeFacts) -> bool:
    """Can ``route`` serve any file on ``node``? (The stager makes a block stager only if so.)"""
    return _RULES[route](FileFacts(size=ROWS[route].min_size, elsewhere=route in (Route.PEER, Route.PEER_LANE),
                                   store=route is Route.STORE, writeback=route is Route.WRITEBACK), node)


# the size decisions the layers make beside the route, named (``test_routes.py`` holds each
# to its row): a comparison, not a look-up, as some are asked per file of a million
def copied_inline(size: int) -> bool:
    """Is a file of ``size`` small enough to be copied inline (by the door's worker that read the
    OPEN, or by the stager's asker): no thread hand-off? The ``DOOR`` row's sizes."""
    return size <= INLINE_MAX


def staged_by_blocks(size: int) -> bool:
    """Is a file of ``size`` large enough to be staged by blocks, its ranges owned across a
    cluster's nodes, where ``BLOCKS``' rule holds? The ``BLOCKS`` row's sizes."""
    return size >= BLOCKS_MIN


def read_in_ranges(size: int) -> bool:
    """Is a whole copy (``COPY``) of a file of ``size`` read in ranges, by several threads?"""
    return size >= RANGES_MIN


def route_of(file: FileFacts, node: NodeFacts, *, rows: dict | None = None, rules: dict | None = None):
    """The route that serves ``file`` on ``node`` when no copy of it is staged: the first row, in
    the table's order, whose size takes the file and whose rule holds. (``rows``, ``rules``: a
    table of another shape, as a test adds a route; the module's own by default.)"""
    rows, rules = rows or ROWS, rules or _RULES
    for route, row in rows.items():
        if row.fits(file.size) and rules[route](file, node):
            return route
    return Route.COPY  # COPY's rule always holds: not reached


def size_steps(node: NodeFacts, *, store: bool = False, elsewhere: bool = False) -> tuple[tuple[int, Route], ...]:
    """The route of a regular file of this node (another's with ``elsewhere``; a store's with
    ``store``) by its size, as steps ``(smallest size, route)``, each holding up to the next's
    smallest: ``route_of`` at every size where a row's sizes begin or end (between those it cannot
    change). What the snapshot index publishes per file (``protocol.INDEX_ROUTE_MASK``)."""
    edges = {0} | {r.min_size for r in ROWS.values()} | {r.max_size + 1 for r in ROWS.values() if r.max_size < SIZE_ANY}
    steps: list[tuple[int, Route]] = []
    for size in sorted(edges):
        route = route_of(FileFacts(size=size, store=store, elsewhere=elsewhere), node)
        if not steps or steps[-1][1] is not route:
            steps.append((size, route))
    return tuple(steps)


def stepped(size: int, steps: tuple[tuple[int, Route], ...]) -> Route:
    """The route of a file of ``size`` bytes by ``size_steps``' steps."""
    for smallest, route in reversed(steps):  # a loop: asked per open, a generator costs it 4x
        if size >= smallest:
            return route
    raise ValueError("size steps begin at 0")


def published(node: NodeFacts, roots: int, stores=frozenset(), *, elsewhere: bool = False) -> tuple:
    """What the snapshot index publishes on ``node`` for its ``roots`` roots (``stores``: the
    indices of a store's): each root's ``size_steps`` (``index_writer.index_parts``' ``routes``).
    ``elsewhere``: the same of the files another node owns (never published: the owners are a
    dynamic fact; the stager's books keep both)."""
    return tuple(size_steps(node, store=k in stores, elsewhere=elsewhere) for k in range(roots))
