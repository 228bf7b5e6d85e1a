"""The import graph of a Python package, read from its source with ``ast`` (nothing is run).

An arrow A -> B: module A imports module B somewhere in its file (at the top, in a function or
under TYPE_CHECKING: each is an arrow a reader follows). ``from pkg import name`` is an arrow to
``pkg.name`` when that is a module, else to ``pkg``. With ``packages=True`` an import of
``pkg.sub.mod`` also draws the arrows Python runs: to ``pkg.sub`` and ``pkg`` (their
``__init__``), so a circle through a package's ``__init__`` is seen too.

Run as a script it prints the figures of a tree's graph::

    python3 tests/support/import_graph.py [PACKAGE_DIR]     # default: this checkout's monarch/
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "monarch"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str], packages: bool = False) -> set[str]:
    """The modules of ``known`` that module ``name`` (its source at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import mod`` imports the module pkg.mod when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
            while packages and target:  # Python runs each enclosing package's __init__ first
                target = target.rpartition(".")[0]
                if target in known and not name.startswith(target + "."):  # not the module's own package
                    out.add(target)
    return out


def import_graph(package: Path = PACKAGE, packages: bool = False) -> dict[str, set[str]]:
    found = modules(package)
    known = set(found)
    return {name: imports(name, path, known, packages) for name, path in found.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(graph.get(v, ()))
    return seen


def imported_back(graph: dict[str, set[str]], prefix: str) -> list[tuple[str, str]]:
    """Pairs (a, b) of modules under ``prefix`` where a imports b and b imports a, directly
    or through any other modules."""
    inside = sorted(m for m in graph if m == prefix or m.startswith(prefix + "."))
    reach = {m: reaches(graph, m) for m in inside}
    return [(a, b) for a in inside for b in sorted(graph[a]) if b in reach and a in reach[b]]


def floor_of(module: str, floors: tuple[tuple[str, ...], ...], package: str) -> int | None:
    """Which of ``floors`` (lowest first, each the names of rooms: a subpackage or a module at
    ``package``'s top) holds ``module``; None for a module outside ``package`` (or ``package``
    itself), or in a room no floor names."""
    if not module.startswith(package + "."):
        return None
    room = module[len(package) + 1:].split(".")[0]
    return next((i for i, floor in enumerate(floors) if room in floor), None)


def without_floor(graph: dict[str, set[str]], floors: tuple[tuple[str, ...], ...], package: str) -> list[str]:
    """The modules of ``package`` in a room no floor names."""
    return [m for m in sorted(graph) if m.startswith(package + ".") and floor_of(m, floors, package) is None]


def imported_upward(graph: dict[str, set[str]], floors: tuple[tuple[str, ...], ...], package: str) -> list[tuple[str, str]]:
    """Arrows (a, b) between modules of ``package`` where a's floor is below b's: a lower room
    importing a higher one."""
    out = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            low, high = floor_of(a, floors, package), floor_of(b, floors, package)
            if low is not None and high is not None and high > low:
                out.append((a, b))
    return out


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor: 1 for one that imports no module of the graph, else one above the
    highest it imports (the modules of a circle share one floor)."""
    component = {m: m for m in graph}
    for c in circles(graph):
        for m in c:
            component[m] = c[0]
    floor: dict[str, int] = {}

    def visit(c: str) -> int:
        if c not in floor:
            below = {component[w] for m in graph if component[m] == c for w in graph[m]} - {c}
            floor[c] = 1 + max((visit(w) for w in below), default=0)
        return floor[c]

    return {m: visit(component[m]) for m in graph}


def summary(package: Path = PACKAGE) -> str:
    graph = import_graph(package)
    runtime = import_graph(package, packages=True)
    floors = layers(graph)
    lines = {m: len(p.read_text().splitlines()) for m, p in modules(package).items()}
    over = {m: n for m, n in lines.items() if n > 600}
    out = [f"package {package}",
           f"modules {len(graph)}, arrows {sum(map(len, graph.values()))}, layers {max(floors.values(), default=0)}",
           f"circles {len(circles(graph))}" + "".join(f"\n  {' <-> '.join(c)}" for c in circles(graph)),
           f"circles counting packages' __init__ {len(circles(runtime))}"
           + "".join(f"\n  {' <-> '.join(c)}" for c in circles(runtime)),
           f"modules over 600 lines {len(over)}" + "".join(f"\n  {m} {n}" for m, n in sorted(over.items())),
           f"largest module {max(lines, key=lines.get)} {max(lines.values())} lines"]
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else PACKAGE))
