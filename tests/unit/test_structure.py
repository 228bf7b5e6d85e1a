"""The house's shape, held: no import circle in monarch/ (any import, in a function or under
TYPE_CHECKING included: each is an arrow a reader follows; and none through a package's
``__init__``), monarch/'s rooms in their floors (``monarch.FLOORS``: each imports only its own
floor and those below it), no module of monarch/node/ imports one that imports it, node/'s
rooms in their order, no Python module over 600 lines; the C files' ``#include``s in the same floors, and
the parts of a C library (one translation unit) each declaring in its own header what it gives the others. ``python3 tests/support/import_graph.py [DIR]`` prints a tree's figures."""

import ast
import collections
import os
import posixpath
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from monarch import FLOORS
from support.import_graph import (PACKAGE, circles, floor_of, import_graph, imported_back, imported_upward, layers,
                                  modules, without_floor)

MAX_LINES = 600


def test_the_import_graph_finds_a_circle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert layers(graph) == {"a": 1, "b": 1, "c": 1, "d": 2}


def test_a_module_imported_back_is_found_directly_and_through_others():
    graph = {"p.a": {"p.b"}, "p.b": {"q.c"}, "q.c": {"p.a"}, "p.d": {"p.a"}, "q.e": {"q.c"}, "q.f": {"q.e"}}
    assert imported_back(graph, "p") == [("p.a", "p.b")]  # q.c is outside p: its arrow is not p's
    assert imported_back({"p.a": {"p.b"}, "p.b": {"p.a"}}, "p") == [("p.a", "p.b"), ("p.b", "p.a")]


def test_the_import_graph_of_monarch_has_no_circle():
    graph = import_graph()
    assert "monarch.node.resolver" in graph and "monarch.node.snapshot.snapshot" in graph["monarch.node.daemon"]
    assert circles(graph) == []


def test_no_circle_runs_through_a_package_init():
    """Importing ``monarch.cluster.placement`` runs ``monarch/cluster/__init__.py`` first."""
    graph = import_graph(packages=True)
    assert "monarch.cluster" in graph["monarch.node.peer.cluster_role"]
    assert circles(graph) == []


def test_a_lower_room_importing_a_higher_one_is_found_in_a_function_too(tmp_path):
    """A package written here: ``low`` imports ``high`` inside a function, a floor up."""
    pkg = tmp_path / "pkg"
    (pkg / "high").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("")
    (pkg / "low.py").write_text("from pkg import base\n\n\ndef f():\n    from pkg.high.top import g\n    return g\n")
    (pkg / "high" / "__init__.py").write_text("")
    (pkg / "high" / "top.py").write_text("from pkg.low import f\n\n\ndef g():\n    return f\n")
    (pkg / "tool.py").write_text("import pkg.high.top\n")
    floors = (("base",), ("low",), ("high",))
    graph = import_graph(pkg, packages=True)
    assert imported_upward(graph, floors, "pkg") == [("pkg.low", "pkg.high"), ("pkg.low", "pkg.high.top")]
    assert without_floor(graph, floors, "pkg") == ["pkg.tool"]
    assert imported_upward(graph, (("base",), ("high", "low")), "pkg") == []  # one floor: both ways allowed
    assert floor_of("pkg", floors, "pkg") is None and floor_of("other.low", floors, "pkg") is None


def test_monarch_rooms_import_only_their_own_floor_and_the_floors_below():
    graph = import_graph(packages=True)
    named = [room for floor in FLOORS for room in floor]
    rooms = {m.split(".")[1] for m in graph if m != "monarch"}
    assert sorted(named) == sorted(rooms)  # each room on one floor, and no floor names a room that is not there
    assert without_floor(graph, FLOORS, "monarch") == []
    assert imported_upward(graph, FLOORS, "monarch") == []
    assert graph["monarch"] == set()  # the package's map imports nothing
    # the test can fail: the report reading the node's statistics from the node would be an arrow up
    graph["monarch.report.build"].add("monarch.node.stats")
    assert imported_upward(graph, FLOORS, "monarch") == [("monarch.report.build", "monarch.node.stats")]


def test_no_module_of_node_imports_one_that_imports_it():
    graph = import_graph(packages=True)
    assert imported_back(graph, "monarch.node") == []


# monarch/node/'s floors, from the bottom: a room (a subpackage) or a module at node/'s top. A module
# of a floor imports modules of node/ only from its own floor and those below it.
NODE_FLOORS = (
    ("snapshot",),                       # the dataset as walked: files, index, PFS metadata, its gate
    ("tiers",),                          # where copies are kept, and their room
    ("stage",),                          # copying into the tiers, from the PFS, a peer or a store
    ("outcomes", "stats"),               # records every room above may use: OPEN's answers, statistics
    ("peer",),                           # this node's part in a cluster
    ("doorkeeper",),                     # the front door's keeper: its life, its table kept with the Python books
    ("instance", "resolver", "notices", "read_ahead", "kept_reads", "writeback", "writeback_door", "daemon",
     "server"),  # the daemon, assembled, and its sockets
)
NODE_TOP_MAX = 12  # modules directly in monarch/node/ (its __init__ included)


def test_node_rooms_import_only_themselves_and_the_rooms_below():
    graph = import_graph(packages=True)
    assert without_floor(graph, NODE_FLOORS, "monarch.node") == []  # every room and module of node/ has its floor
    assert imported_upward(graph, NODE_FLOORS, "monarch.node") == []
    # the test can fail: the stager asking the daemon would be an arrow up
    graph["monarch.node.stage.stager"].add("monarch.node.daemon")
    assert imported_upward(graph, NODE_FLOORS, "monarch.node") == [("monarch.node.stage.stager", "monarch.node.daemon")]


def test_node_holds_at_most_12_modules_directly_and_rooms_are_mapped():
    top = sorted(p.name for p in (PACKAGE / "node").glob("*.py"))
    assert "daemon.py" in top and len(top) <= NODE_TOP_MAX, top
    for init in (PACKAGE / "node").glob("*/__init__.py"):  # each room's __init__ is its map
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        named = {p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py"}
        assert {m for m in named if f"``{m}``" not in doc} == set(), init
        # and only a map: importing a room runs nothing (no circle through an __init__)
        assert [n for n in ast.parse(init.read_text()).body if not isinstance(n, ast.Expr)] == [], init


def test_no_python_module_is_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
    assert len(modules()) > 50 and PACKAGE.name == "monarch"


def _assigned_attributes(path) -> list[tuple[str, str]]:
    """(object, field) of each ``object.field = ...`` in a file whose object is not ``self``/``cls``
    itself: a field set from outside the object's own methods."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")):
                    out.append((ast.unparse(t.value), t.attr))
    return out


# Objects whose fields are set from outside their class, each reviewed: records a function or a
# class fills or updates as its own state (not a collaborator's wiring), library settings.
RECORDS = {
    "launch/logs.py": {"record": "a logging record, rewritten by the log lines' filter"},
    "writeback/view.py": {"entry": "a Local entry of the view's own table, under its lock"},
    "cluster/datapath.py": {"fn": "ctypes function prototypes"},
    "node/snapshot/pfsmeta.py": {"fn": "ctypes function prototypes", "_buffers": "a threading.local of its own"},
    "cluster/provide.py": {"out": "the provider's record of one outgoing transfer"},
    "cluster/world.py": {"_state": "the module's own state", "mpi4py.rc": "mpi4py's settings before MPI_Init",
                         "sys": "the excepthook that aborts the communicator", "threading": "the same, for threads"},
    "launch/run.py": {"end": "run()'s own record of how the run ends (_Ending)"},
    "node/tiers/codecs.py": {"choice": "the Choice record the selection fills", "local": "a threading.local of its own"},
    "records/filetable.py": {"table": "the unpickled table, rebuilt in its own module"},
    "node/server.py": {"conn": "the server's record of one connection"},
    "node/stage/stager.py": {"flight": "a Flight record of the stager's books"},
    "node/stage/blocks.py": {"bf": "a BlockFile record of the block stager's books",
                             "books": "the stager's ledger: bytes and files staged"},
    "node/peer/peer_cache.py": {"flight": "a Flight record of the cache's books",
                           # StagerBooks: "the shared state of one stager", its parts' ledger, updated under its
                           # lock; ``eviction`` would rather be a constructor keyword of StagerBooks
                           "self.books": "the cache's own StagerBooks: closed, and its eviction policy"},
    "node/stage/stager_copy.py": {"self.books": "the stager's ledger: bytes and files staged"},
    "node/stage/stager_recode.py": {"books": "the stager's ledger: files that did not fit"},
    "node/stage/stager_schedule.py": {"order": "the schedule's record of one hinted order",
                                "books": "the stager's ledger: files dropped"},
    "node/tiers/tiers.py": {"tier": "set in Tier's own factory (a classmethod)"},
    "node/stage/store_source.py": {"mount": "the store set's own record of one root (Mount)"},
    "native/build.py": {"fn": "ctypes function prototypes (OptionalLibrary)"},
    "tools/slowpfs.py": {"config_3": "libfuse's fuse_config, filled in its init callback",
                   "fi": "libfuse's fuse_file_info of one open, filled by the open callback"},
}


def test_no_collaborator_field_is_set_from_outside_its_class():
    """``cluster.on_lost = ...``, ``stager.concurrency.limit = ...``: a part wired from outside
    after construction (afcb5ea had nine). A collaborator is given what it needs when it is
    built, or told through a method of its own."""
    found = {}
    for name, path in modules().items():
        rel = str(path.relative_to(PACKAGE))
        allowed = RECORDS.get(rel, {})
        for obj, field in _assigned_attributes(path):
            if obj not in allowed:
                found.setdefault(rel, []).append(f"{obj}.{field}")
    assert found == {}


# hasattr in monarch/, each reviewed: a check of a value's kind, never of a collaborator being a test double
HASATTR = {
    ("index_layout.py", "st", "st_size"): "an os.stat_result or a snapshot FileInfo",
    ("cluster/liveness.py", "exc", "Get_error_class"): "an MPI exception or another one",
    ("cluster/provide.py", "path", "read"): "provide's answer: a path or a decompressed file object",
    ("hints.py", "self.sampler", "set_epoch"): "the user's sampler (torch's DistributedSampler has set_epoch)",
}


def test_no_module_checks_for_test_doubles():
    """afcb5ea had ``hasattr(self.cluster, "allgather_ints")`` three times in the daemon."""
    found = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr":
                what = node.args[1].value if isinstance(node.args[1], ast.Constant) else ast.unparse(node.args[1])
                found.add((str(path.relative_to(PACKAGE)), ast.unparse(node.args[0]), what))
    assert found == set(HASATTR)



MAX_C_LINES = 850


def _c_files() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.[ch]"))}


def test_no_c_file_is_over_850_lines():
    long = {name: n for name, text in _c_files().items() if (n := len(text.splitlines())) > MAX_C_LINES}
    assert long == {}
    assert "frontdoor/front_door.c" in _c_files()


def test_shared_native_code_is_defined_once():
    """CRC-32's table, the index's probe and the export marker live in monarch/native/ alone: the
    shim, the front door, the walker, the remover and the data path include them."""
    files = _c_files()
    shared = "native/monarch_native.h"
    for what, pattern in (("CRC-32", "0xEDB88320"), ("the export marker", 'visibility("default")'),
                          ("the index look-up's probe", "buckets_off + 4"), ("the clock", "CLOCK_MONOTONIC, &ts")):
        assert [name for name, text in files.items() if pattern in text] == [shared], what
    includers = {name for name, text in files.items() if "monarch_native.h\"" in text}
    assert {"shim/monarch_shim.h", "frontdoor/front_door.c", "node/snapshot/walker.c", "node/tiers/remover.c",
            "cluster/datapath.c"} <= includers  # the shim's through the header its parts share


# the C files' rooms, as FLOORS names them: wire/ holds the C half of ``protocol`` (the wire header)
C_ROOM_OF = {"wire": "protocol"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def c_includes_upward(files: dict[str, str], floors=FLOORS) -> list[tuple[str, str]]:
    """(file, included) of each ``#include "..."`` of a C file of monarch/ that reaches a room on a
    higher floor than the file's own (the floors hold for ``#include`` as for ``import``)."""
    def floor(rel: str) -> int:
        room = C_ROOM_OF.get(rel.split("/")[0], rel.split("/")[0])
        found = [i for i, names in enumerate(floors) if room in names]
        assert found, f"{rel}: its room {room!r} is on no floor of monarch.FLOORS"
        return found[0]
    out = []
    for rel, text in files.items():
        for inc in INCLUDE.findall(text):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), inc))
            assert not target.startswith(".."), f"{rel} includes {inc}, outside monarch/"
            if floor(target) > floor(rel):
                out.append((rel, target))
    return out


def test_no_c_file_includes_a_header_of_a_higher_floor():
    files = _c_files()
    assert c_includes_upward(files) == []
    # the test can fail: the door's header reaching up into cluster/ for the data path's types
    # (as it did before the data path's contract moved down to native/)
    files["frontdoor/front_door.h"] += '#include "../cluster/datapath.h"\n'
    assert c_includes_upward(files) == [("frontdoor/front_door.h", "cluster/datapath.h")]
    # and an include on the same floor, or below, is not one
    assert c_includes_upward({"shim/a.c": '#include "../frontdoor/front_door.h"\n#include "../wire/monarch_wire.h"\n',
                              "native/b.h": '#include "../wire/monarch_wire.h"\n'}) == []
    assert c_includes_upward({"native/x.h": '#include "../shim/shim_open.c"\n'}) == [("native/x.h", "shim/shim_open.c")]


# -- the C parts declare their interfaces ----------------------------------------------------------
# A library of several C files is one translation unit: its main file includes its parts (the
# ``*.c`` beside it). Each part declares in its own header (``<part>.h``; the main file's: OWN_HEADER)
# what it gives the others: every function another file of the library calls, with the types, macros
# and shared state those need. The main file includes every header before its first part, so the
# parts call each other whatever the order they are included in.
UNITS = ("shim/monarch_shim.c", "frontdoor/front_door.c")
OWN_HEADER = {"frontdoor/front_door.c": "frontdoor/door.h"}  # front_door.h is the contract with Python
CONTRACT = {"frontdoor/front_door.c": "frontdoor/front_door.h"}  # where an EXPORT function may be declared instead
PART = re.compile(r'^#\s*include\s+"([a-z_]+\.c)"', re.M)
_DEFINED = re.compile(r"^(?:__attribute__\(\([^)]*\)\)\s*)?(static|EXPORT)\b[^;{}=#]*?\b([a-z_]\w*)\s*\([^;{}]*?\)\s*\{",
                      re.M | re.S)


def _code(text: str) -> str:
    """``text`` without its comments and string literals."""
    return re.sub(r'"(\\.|[^"\\\n])*"', '""', re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def undeclared_calls(files: dict[str, str], unit: str) -> list[tuple[str, str, str]]:
    """(function, the file defining it, a file calling it) of each function a file of ``unit``'s
    library defines and another of its files calls, that the defining file's header does not declare."""
    folder = posixpath.dirname(unit)
    parts = [unit] + [posixpath.join(folder, p) for p in PART.findall(files[unit])]
    out = []
    for home in parts:
        header = OWN_HEADER.get(home, home[:-2] + ".h")
        declared = _code(files.get(header, "")) + (_code(files.get(CONTRACT.get(unit, ""), "")))
        for kind, fn in _DEFINED.findall(_code(files[home])):
            if kind == "EXPORT" and unit not in CONTRACT:
                continue  # a library's exports are the dynamic linker's, not its parts'
            for user in parts:
                if user != home and re.search(r"\b%s\b" % fn, _code(files[user])) and \
                        not re.search(r"^(?:static|EXPORT)[^;{}]*\b%s\s*\([^;{}]*\);" % fn, declared, re.M):
                    out.append((fn, home, user))
                    break
    return out


def headers_after_a_part(files: dict[str, str], unit: str) -> list[str]:
    """The parts' headers (and ``unit``'s own) that ``unit`` does not include, directly or through
    another header, before its first part."""
    folder = posixpath.dirname(unit)
    text = files[unit]
    seen: set[str] = set()

    def reach(source: str) -> None:
        for inc in INCLUDE.findall(source):
            path = posixpath.normpath(posixpath.join(folder, inc))
            if path.endswith(".h") and path in files and path not in seen:
                seen.add(path)
                reach(files[path])
    reach(text[:PART.search(text).start()])
    wanted = [p[:-2] + ".h" for p in PART.findall(text)] + [posixpath.basename(OWN_HEADER.get(unit, unit[:-2] + ".h"))]
    return [h for h in wanted if posixpath.join(folder, h) in files and posixpath.join(folder, h) not in seen] + \
        [h for h in wanted[-1:] if posixpath.join(folder, h) not in files]


@pytest.mark.parametrize("unit", UNITS)
def test_every_function_a_part_gives_another_is_declared_in_its_header(unit):
    files = _c_files()
    assert undeclared_calls(files, unit) == []
    assert headers_after_a_part(files, unit) == []
    # the test can fail: a declaration taken out of its part's header, a header included late
    if unit == "frontdoor/front_door.c":
        files["frontdoor/door_keys.h"] = files["frontdoor/door_keys.h"].replace(
            "static int reserve_keys(struct door *d, size_t keys);", "")
        assert undeclared_calls(files, unit) == [("reserve_keys", "frontdoor/door_keys.c", "frontdoor/door_api.c")]
        files[unit] = files[unit].replace('#include "door_peer_ahead.h"', "") + '#include "door_peer_ahead.h"\n'
        files["frontdoor/door.h"] = files["frontdoor/door.h"].replace('#include "door_loop.h"', "")
        assert headers_after_a_part(files, unit) == ["door_peer_ahead.h", "door_loop.h"]
    else:
        files["shim/shim_paths.h"] = files["shim/shim_paths.h"].replace("static int monarch_has_dotdot(", "int x(")
        assert undeclared_calls(files, unit) == [("monarch_has_dotdot", "shim/shim_paths.c", "shim/shim_daemon.c")]
        files[unit] = files[unit].replace('#include "shim_open.h"\n', "")
        assert headers_after_a_part(files, unit) == ["shim_open.h"]


@pytest.mark.parametrize("unit", UNITS)
def test_the_parts_compile_in_any_order(unit, tmp_path):
    """The library built with its parts included in the reverse order: nothing rests on the order."""
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    for path in PACKAGE.rglob("*.[ch]"):  # the C of monarch/, copied: its includes are relative
        copy = tmp_path / "monarch" / path.relative_to(PACKAGE)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(path.read_bytes())
    main = tmp_path / "monarch" / unit
    text = main.read_text()
    parts = PART.findall(text)
    block = "".join(f'#include "{p}"\n' for p in parts)
    assert len(parts) > 5 and block in text  # the parts are included together, one a line
    main.write_text(text.replace(block, "".join(f'#include "{p}"\n' for p in reversed(parts))))

    def build() -> subprocess.CompletedProcess:
        return subprocess.run([cc, "-std=gnu11", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
                               "-O0", "-o", str(tmp_path / "lib.so"), str(main), "-ldl", "-lpthread"],
                              capture_output=True, text=True, timeout=120)
    r = build()
    assert r.returncode == 0, r.stderr[-3000:]
    # the test can fail: without the loop's (the open decision's) header, a part calls what is not declared yet
    holder, header = ("frontdoor/door.h", "door_loop.h") if unit.startswith("frontdoor") else (unit, "shim_open.h")
    held = tmp_path / "monarch" / holder
    held.write_text(held.read_text().replace(f'#include "{header}"', ""))
    assert build().returncode != 0


def test_no_two_test_modules_outside_a_package_share_a_name():
    """pytest imports a test module outside a package by its base name: two of one name stop the
    whole suite at collection ("import file mismatch")."""
    tests = Path(__file__).resolve().parents[1]
    loose = [p for p in tests.rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    names = collections.Counter(p.name for p in loose)
    assert [n for n, k in names.items() if k > 1] == []
    assert len(loose) > 50
